// Length-grouped batches: the unit of the epoch's global sequence G is a batch.
//
// The epoch's items in the feistel order of (seed, epoch) are cut into windows of `window`
// consecutive positions. Each window is sorted by length (ties by position in the window, so
// the result is one well-defined order) and cut into batches: every `batch_size` items, or
// greedily by a padded-token budget (a batch takes the next item while
// (count + 1) * length <= max_tokens and count + 1 <= max_batch_size; an item longer than the
// budget alone is a batch of its own). The window's batches are then shuffled by a keyed
// permutation of their own. G is window 0's batches, then window 1's, ...: the same for every
// number of ranks. The shared Plan (plan.hpp) over the number of batches says which batches a
// rank takes, exactly as it says which items a rank takes for the other samplers.
//
// Memory beyond the lengths: one offset per window (the batch count before it), and per rank
// the one window it is reading (its items sorted, 8 bytes each, and its batch boundaries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "fastshard/feistel.hpp"
#include "fastshard/plan.hpp"

namespace fastshard {

// Domain separator of the length-grouped keys (the items' order and the batches' order).
constexpr std::uint64_t kLengthDomain = 0x4c454e47;  // "LENG"

// The integer types a lengths array may have.
enum class LengthType { i8, i16, i32, i64, u8, u16, u32, u64 };

// A read-only view of the caller's lengths; never copied. Signed values must have been
// checked non-negative (scan_lengths) before any other use.
struct Lengths {
    const void* data = nullptr;
    LengthType type = LengthType::i64;
    std::uint64_t n = 0;
};

// One pass over the lengths: the first negative index (-1 if none), the largest, the sum
// (as a double: only for estimates) and a position-sensitive 64-bit checksum of the values
// (equal values give equal checksums whatever the integer type). Independent of threads.
struct LengthsSummary {
    std::int64_t first_negative = -1;
    std::uint64_t max = 0;
    double sum = 0.0;
    std::uint64_t checksum = 0;
};
LengthsSummary scan_lengths(const Lengths& lengths, unsigned threads);

// How a sorted window is cut: batch_size > 0 (fixed count), or max_tokens > 0 with
// max_batch_size (0: no limit).
struct BatchRule {
    std::uint64_t batch_size = 0;
    std::uint64_t max_tokens = 0;
    std::uint64_t max_batch_size = 0;

    // Items a batch whose longest item has length v may hold (>= 1).
    std::uint64_t capacity(std::uint64_t v) const noexcept {
        std::uint64_t cap = v == 0 ? ~std::uint64_t{0} : max_tokens / v;
        if (max_batch_size != 0 && cap > max_batch_size) cap = max_batch_size;
        return cap == 0 ? 1 : cap;
    }
};

// One window, sorted and cut: its items in batch order and where each batch starts.
struct WindowBatches {
    std::uint64_t window = ~std::uint64_t{0};
    std::vector<std::uint64_t> items;    // the window's items sorted by (length, position)
    std::vector<std::uint64_t> starts;   // batch b is items[starts[b], starts[b + 1])
    std::unique_ptr<Feistel> order;      // batch position in G -> batch of the window
};

// An epoch's batch layout: how many batches each window has. With batch_size this is
// arithmetic; with max_tokens every window is sorted once (in parallel) to count them.
class LengthEpoch {
  public:
    LengthEpoch(const Lengths& lengths, const BatchRule& rule, std::uint64_t window,
                std::uint64_t seed, std::uint64_t epoch, unsigned threads);

    std::uint64_t num_items() const noexcept { return lengths_.n; }
    std::uint64_t num_batches() const noexcept { return offsets_.back(); }
    std::uint64_t num_windows() const noexcept { return offsets_.size() - 1; }
    std::uint64_t window_size() const noexcept { return window_; }
    // Batches of window w: offsets [w], [w + 1] in G.
    std::uint64_t window_offset(std::uint64_t w) const noexcept { return offsets_[w]; }
    // The window holding global batch g (< num_batches()).
    std::uint64_t window_of(std::uint64_t g) const noexcept;

    // Sorts and cuts window w into `out` (reusing its buffers).
    void build(std::uint64_t w, WindowBatches& out) const;

  private:
    // Window w's items (in the epoch's order) and their lengths; returns (min, max) length.
    std::pair<std::uint64_t, std::uint64_t> gather_window(std::uint64_t w, std::vector<std::uint64_t>& items,
                                                          std::vector<std::uint64_t>& lens) const;
    // The window's (length, item) pairs sorted by (length, position in the window).
    void sorted_window(std::uint64_t w, std::vector<std::uint64_t>& lens,
                       std::vector<std::uint64_t>& items) const;
    // The number of batches of window w (what build would cut), from its lengths alone.
    std::uint64_t count_window(std::uint64_t w, std::vector<std::uint64_t>& lens,
                               std::vector<std::uint64_t>& scratch) const;

    Lengths lengths_;
    BatchRule rule_;
    std::uint64_t window_;
    std::uint64_t seed_, epoch_;
    Feistel perm_;
    std::vector<std::uint64_t> offsets_;  // num_windows + 1
};

// A rank's share of an epoch's batches, through the shared Plan (plan.n = the number of
// batches). Reads build one window at a time and keep it while the rank stays inside it.
class LengthShard {
  public:
    LengthShard(std::shared_ptr<const LengthEpoch> epoch, const Plan& plan)
        : epoch_(std::move(epoch)), plan_(plan) {}

    const Plan& plan() const noexcept { return plan_; }
    std::uint64_t size() const noexcept { return plan_.num_samples; }
    // Global batch index (position in G, padding wrapped) of this rank's k-th batch.
    std::uint64_t global(std::uint64_t k) const noexcept {
        return plan_.position(k) % epoch_->num_batches();
    }
    // Items of global batch g, appended to out.
    void global_batch(std::uint64_t g, std::vector<std::uint64_t>& out) const;

  private:
    std::shared_ptr<const LengthEpoch> epoch_;
    Plan plan_;
    mutable std::mutex mutex_;
    mutable WindowBatches cache_;
};

}  // namespace fastshard
