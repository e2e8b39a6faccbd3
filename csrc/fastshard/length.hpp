// Length-grouped batches: the unit of the epoch's global sequence G is a batch.
//
// The epoch's items in the feistel order of (seed, epoch) are dealt into windows. Each window
// is sorted by length (ties by position in the order, so the result is one well-defined order)
// and cut into batches: every `batch_size` items, or greedily by a padded-token budget. The
// window's batches are then shuffled by a keyed permutation of their own. G is window 0's
// batches, then window 1's, ...: the same for every number of ranks. The shared Plan (plan.hpp)
// over the number of batches says which batches a rank takes, exactly as it says which items a
// rank takes for the other samplers.
//
// With batch_size, window w is positions [w * window, (w + 1) * window) of the order. With
// max_tokens the number of batches must not depend on the epoch (frameworks size an epoch once),
// so windows are stratified by length class instead:
// - a length class groups lengths (rule length max(v, 1): exact below 128, then 7 significant
//   bits, merged upwards until each class holds enough items, see LengthLayout); its bound
//   upper_b is the largest rule length of its items;
// - windows are grouped into strata (stratify.hpp: enough windows to a stratum that the classes
//   stay at most 10^-4 of n at any n); stratum t gets a fixed quota of each class, floor(c_b
//   s_{t+1} / n) - floor(c_b s_t / n) (s_t = min(t * stratum, n)): the class-b items of the
//   epoch's order of class rank in that range; they are dealt to its windows round-robin, class
//   after class (stratify.hpp), each window an equal share of every class;
// - the window, sorted by (length, position), is cut greedily with the budget applied to the
//   class bounds: a batch takes the next item while (count + 1) * upper_b <= max_tokens (and
//   count + 1 <= max_batch_size). Sorted by length is sorted by class, so the cut depends on the
//   class counts N_w. alone: every window's batch count is fixed by the lengths and the
//   configuration, the same in every epoch, and len(batch) * max(lengths) <= max_tokens holds
//   for every batch of more than one item.
// The epoch finds a window's items without a per-item index: one scan of the epoch's order keeps
// each class's count before every stratum boundary of the order (a prefix histogram), and the
// stratum reads the few ranges of the order that hold its class ranks (kept for its windows).
//
// Memory beyond the lengths: one offset per window; with max_tokens the class table and a
// (windows + 1) x classes prefix histogram per epoch; per rank the one window it is reading
// (its items sorted, 8 bytes each, and its batch boundaries) and, with max_tokens, the ranges
// of the order that window read (16 bytes per position, at most 2^22 positions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "fastshard/feistel.hpp"
#include "fastshard/mix.hpp"
#include "fastshard/plan.hpp"
#include "fastshard/stratify.hpp"

namespace fastshard {

// Domain separator of the length-grouped keys (the items' order and the batches' order).
constexpr std::uint64_t kLengthDomain = 0x4c454e47;  // "LENG"

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

    // Items a batch whose longest item has rule length v >= 1 may hold (>= 1). A zero length
    // counts as 1, so a batch never holds more than max_tokens items.
    std::uint64_t capacity(std::uint64_t v) const noexcept {
        std::uint64_t cap = max_tokens / (v == 0 ? 1 : v);
        if (max_batch_size != 0 && cap > max_batch_size) cap = max_batch_size;
        return cap == 0 ? 1 : cap;
    }
};

// Fine length buckets of a rule length v >= 1: exact below 128, then the top 7 significant
// bits (each bucket spans less than 1/64 of its lower end). 3776 buckets cover 64-bit lengths.
constexpr std::uint32_t kFineBuckets = 64 * 59;
inline std::uint32_t fine_bucket(std::uint64_t v) noexcept {
    if (v < 128) return static_cast<std::uint32_t>(v);
#if defined(__GNUC__) || defined(__clang__)
    const unsigned e = 64U - static_cast<unsigned>(__builtin_clzll(v)) - 7;  // v >= 128: no zero
#else
    const unsigned e = bit_width(v) - 7;
#endif
    return 64 * (e + 1) + static_cast<std::uint32_t>((v >> e) & 63);
}

// One window, sorted and cut: its items in batch order and where each batch starts.
struct WindowBatches {
    std::uint64_t window = ~std::uint64_t{0};
    std::vector<std::uint64_t> items;    // the window's items sorted by (length, position)
    std::vector<std::uint64_t> starts;   // batch b is items[starts[b], starts[b + 1])
    std::unique_ptr<Feistel> order;      // batch position in G -> batch of the window
    // With max_tokens: the (item, length) at positions [walked_first, walked_first + size) of
    // the order that the last window read, so that the next window (whose ranges overlap
    // them) does not read them again.
    std::uint64_t walked_first = 0;
    std::vector<std::uint64_t> walked_items, walked_lens;
    // With max_tokens: the items of the window's stratum, read from those ranges.
    StratumItems stratum;
};

// What does not depend on the epoch: the windows, the length classes and each window's number
// of batches. With max_tokens this takes one threaded pass over the lengths (a histogram).
class LengthLayout {
  public:
    // min_class_items: the fewest items per length class (0: the default rule, see length.cpp).
    LengthLayout(const Lengths& lengths, const BatchRule& rule, std::uint64_t window, unsigned threads,
                 std::uint64_t min_class_items = 0);

    const Lengths& lengths() const noexcept { return lengths_; }
    const BatchRule& rule() const noexcept { return rule_; }
    std::uint64_t num_items() const noexcept { return lengths_.n; }
    std::uint64_t num_batches() const noexcept { return offsets_.back(); }
    std::uint64_t num_windows() const noexcept { return offsets_.size() - 1; }
    std::uint64_t window_size() const noexcept { return strata_.window_size(); }
    // Batches of window w: offsets [w], [w + 1] in G.
    std::uint64_t window_offset(std::uint64_t w) const noexcept { return offsets_[w]; }
    // The window holding global batch g (< num_batches()).
    std::uint64_t window_of(std::uint64_t g) const noexcept;
    // First position of window w in the epoch's order (also the class quotas' s_w).
    std::uint64_t window_start(std::uint64_t w) const noexcept { return strata_.window_start(w); }

    // Length classes (max_tokens only; 0 classes with batch_size).
    bool stratified() const noexcept { return rule_.max_tokens != 0; }
    std::uint32_t num_classes() const noexcept { return strata_.num_classes(); }
    std::uint32_t class_of(std::uint64_t length) const noexcept {
        return strata_.classes().of_key(fine_bucket(length == 0 ? 1 : length));
    }
    std::uint64_t class_upper(std::uint32_t b) const noexcept { return strata_.classes().upper(b); }
    std::uint64_t class_count(std::uint32_t b) const noexcept { return strata_.classes().count(b); }
    // The windows and the classes' quotas (stratify.hpp).
    const Strata& strata() const noexcept { return strata_; }

  private:
    Lengths lengths_;
    BatchRule rule_;
    Strata strata_;
    std::vector<std::uint64_t> offsets_;  // num_windows + 1
};

// An epoch's batches: the layout's windows filled from the epoch's order.
class LengthEpoch {
  public:
    LengthEpoch(std::shared_ptr<const LengthLayout> layout, std::uint64_t seed, std::uint64_t epoch,
                unsigned threads);

    const LengthLayout& layout() const noexcept { return *layout_; }
    std::uint64_t num_batches() const noexcept { return layout_->num_batches(); }

    // Sorts and cuts window w into `out` (reusing its buffers).
    void build(std::uint64_t w, WindowBatches& out) const;

  private:
    // Window w's items (in the epoch's order) and their lengths.
    void gather_window(std::uint64_t w, WindowBatches& out, std::vector<std::uint64_t>& lens) const;
    void gather_stratified(std::uint64_t w, WindowBatches& out, std::vector<std::uint64_t>& lens) const;
    void read_stratum(std::uint64_t t, WindowBatches& out) const;

    std::shared_ptr<const LengthLayout> layout_;
    std::uint64_t seed_, epoch_;
    Feistel perm_;
    // With max_tokens: the epoch's prefix class histograms.
    ClassPrefix prefix_;
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
