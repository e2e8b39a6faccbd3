// Packed rows: the unit of the epoch's global sequence G is a row of seq_len tokens, described
// as (document, start, stop) token segments.
//
// concat (pretraining): the documents in the epoch's feistel order, concatenated, cut into rows
// of seq_len tokens (seq_len + 1 with `overlap`: consecutive rows share one token, Megatron's
// layout); the last partial row is dropped. The number of rows is a function of the total token
// count alone, so it is the same every epoch. The rows are permuted by a keyed bijection over the
// row count. A row is found from its first token offset: one uint64 per window of the order
// holds the tokens before that window (one threaded scan per epoch), a binary search names the
// window, and a walk inside it names the documents.
//
// best_fit (SFT): whole documents packed into rows of at most seq_len tokens, best-fit
// decreasing, within windows of the epoch's order. The number of rows is fixed by stratified
// windows (the scheme of LengthGroupedBatchSampler's token budget, branch length-count): a
// document's packing length e (min(length, seq_len) with truncation; the last piece's length with
// splitting) falls in a length class (exact lengths, merged upwards until each class holds enough
// documents); windows are grouped into strata (stratify.hpp: enough windows to a stratum that
// the classes stay at most 10^-4 of n at any n), stratum t gets the fixed quota floor(c_b
// s_{t+1} / n) - floor(c_b s_t / n) of each class b, its class-b documents of class rank in that
// range of the epoch's order, dealt round-robin to its windows; a window is packed on the class
// bounds, so its row count depends on the quotas alone. The real documents
// (each no longer than its class bound) take the slots. With splitting, the full seq_len pieces
// of longer documents are rows of their own, found as concat finds rows (per-window sums of the
// full piece count over the order), and interleaved evenly with the packed rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "fastshard/feistel.hpp"
#include "fastshard/length.hpp"
#include "fastshard/plan.hpp"
#include "fastshard/stratify.hpp"

namespace fastshard {

// Domain separator of the packed keys: +0 the document order, +1 the concat row order, +2 the
// row order inside a best_fit window.
constexpr std::uint64_t kPackedDomain = 0x5041434b;  // "PACK"

// Segments of a row: (document, start, stop) triples, flat.
using Segments = std::vector<std::uint64_t>;

// One threaded pass over the lengths: the first index of a length <= 0 (-1 if none), the total
// token count (saturated at 2^64 - 1), with `checksum` the lengths checksum (scan_lengths's), and,
// for best_fit, the histogram of packing lengths (index e in [1, seq_len]) and the number of full
// pieces of split documents.
struct PackedScan {
    std::int64_t first_nonpositive = -1;
    std::uint64_t total = 0;
    bool total_overflow = false;
    std::uint64_t checksum = 0;            // with_checksum only
    std::vector<std::uint64_t> histogram;  // best_fit only: seq_len + 1 counts
    std::uint64_t full_pieces = 0;         // best_fit with split only
    std::uint64_t truncated_tokens = 0;    // best_fit with truncation only
};
PackedScan scan_packed(const Lengths& lengths, std::uint64_t seq_len, bool best_fit, bool split, unsigned threads,
                       bool with_checksum = false);

// Per-window sums of a per-document weight over an epoch's order: where the u-th unit of the
// concatenated weights lies. Memory: one uint64 per window.
class OrderSums {
  public:
    enum class Weight { tokens, full_pieces };
    OrderSums(const Lengths& lengths, const Feistel& perm, std::uint64_t window, std::uint64_t seq_len, Weight weight,
              unsigned threads);
    // From window_sums's per-window weights of this order, computed by the caller.
    OrderSums(const Lengths& lengths, const Feistel& perm, std::uint64_t window, std::uint64_t seq_len, Weight weight,
              std::vector<std::uint64_t> window_weights);
    std::uint64_t total() const noexcept { return prefix_.back(); }
    // Calls f(document, first unit of it, its weight) for the documents of the order, from the
    // one holding unit u on, while f returns true.
    template <class F>
    void walk_from(std::uint64_t u, F&& f) const;

  private:
    std::uint64_t weight(std::uint64_t length) const noexcept;
    const Lengths* lengths_;
    const Feistel* perm_;
    std::uint64_t window_, seq_len_;
    Weight kind_;
    std::vector<std::uint64_t> prefix_;  // windows + 1
};

// The rows of one epoch, in G's order (before the plan).
class RowSource {
  public:
    virtual ~RowSource() = default;
    virtual std::uint64_t num_rows() const noexcept = 0;
    // Appends the segments of row g of G. `cache` is the reader's (one per shard).
    virtual void row(std::uint64_t g, Segments& out, std::shared_ptr<void>& cache) const = 0;
};

class ConcatEpoch final : public RowSource {
  public:
    ConcatEpoch(const Lengths& lengths, std::uint64_t seq_len, bool overlap, std::uint64_t window, std::uint64_t seed,
                std::uint64_t epoch, unsigned threads);
    // From the epoch's per-window token counts (window_sums over the order of seed and epoch).
    ConcatEpoch(const Lengths& lengths, std::uint64_t seq_len, bool overlap, std::uint64_t window, std::uint64_t seed,
                std::uint64_t epoch, std::vector<std::uint64_t> window_tokens);
    std::uint64_t num_rows() const noexcept override { return rows_; }
    std::uint64_t total_tokens() const noexcept { return sums_.total(); }
    void row(std::uint64_t g, Segments& out, std::shared_ptr<void>& cache) const override;

  private:
    void set_rows(std::uint64_t seed, std::uint64_t epoch);

    Lengths lengths_;
    std::uint64_t seq_len_;
    bool overlap_;
    Feistel perm_;
    OrderSums sums_;
    std::uint64_t rows_;
    Feistel row_perm_;
};

// A concat sampler's construction in one sequential read of the lengths: the checks and the
// checksum of scan_packed(with_checksum), and in the same read the token counts of the windows of
// one epoch's order, from which that epoch's rows are built, when the lengths hold rows (every
// length >= 1, the total below 2^63, at least one row); else `epoch` is null. Where window_sums
// walks positions instead of reading sequentially (windows so small that no table fits), the
// checks are a scan of their own.
struct ConcatStart {
    PackedScan scan;
    std::shared_ptr<const ConcatEpoch> epoch;
};
ConcatStart concat_start(const Lengths& lengths, std::uint64_t seq_len, bool overlap, std::uint64_t window,
                         std::uint64_t seed, std::uint64_t epoch, unsigned threads);

// What does not depend on the epoch in best_fit: the classes and every window's row count.
class PackLayout {
  public:
    // min_class_items: 0 for the default rule (packed.cpp).
    PackLayout(const Lengths& lengths, std::uint64_t seq_len, bool split, std::uint64_t window, unsigned threads,
               std::uint64_t min_class_items = 0);

    const Lengths& lengths() const noexcept { return lengths_; }
    std::uint64_t seq_len() const noexcept { return seq_len_; }
    bool split() const noexcept { return split_; }
    std::uint64_t window_size() const noexcept { return strata_.window_size(); }
    std::uint64_t num_windows() const noexcept { return offsets_.size() - 1; }
    std::uint64_t window_start(std::uint64_t w) const noexcept { return strata_.window_start(w); }
    std::uint64_t packed_rows() const noexcept { return offsets_.back(); }
    std::uint64_t full_rows() const noexcept { return full_rows_; }
    std::uint64_t num_rows() const noexcept { return packed_rows() + full_rows_; }
    std::uint64_t window_offset(std::uint64_t w) const noexcept { return offsets_[w]; }
    std::uint64_t window_of(std::uint64_t packed_row) const noexcept;
    std::uint64_t truncated_tokens() const noexcept { return truncated_tokens_; }
    // Token slots the packing reserves (class bounds) and real tokens placed in packed rows.
    std::uint64_t packed_tokens() const noexcept { return packed_tokens_; }

    // The packing length of a document of length v >= 1.
    std::uint64_t packing_length(std::uint64_t v) const noexcept {
        if (v <= seq_len_) return v;
        return split_ ? v - (v - 1) / seq_len_ * seq_len_ : seq_len_;
    }
    std::uint32_t num_classes() const noexcept { return strata_.num_classes(); }
    std::uint32_t class_of(std::uint64_t v) const noexcept {
        return strata_.classes().of_key(static_cast<std::size_t>(packing_length(v)));
    }
    std::uint64_t class_upper(std::uint32_t b) const noexcept { return strata_.classes().upper(b); }
    // The windows and the classes' quotas (stratify.hpp).
    const Strata& strata() const noexcept { return strata_; }

  private:
    Lengths lengths_;
    std::uint64_t seq_len_;
    bool split_;
    Strata strata_;
    std::uint64_t full_rows_ = 0, truncated_tokens_ = 0, packed_tokens_ = 0;
    std::vector<std::uint64_t> offsets_;  // num_windows + 1: packed rows before each window
};

class BestFitEpoch final : public RowSource {
  public:
    BestFitEpoch(std::shared_ptr<const PackLayout> layout, std::uint64_t seed, std::uint64_t epoch, unsigned threads);
    std::uint64_t num_rows() const noexcept override { return layout_->num_rows(); }
    void row(std::uint64_t g, Segments& out, std::shared_ptr<void>& cache) const override;
    // Window w's packed rows: docs in slot order, rows[b] = [starts[b], starts[b + 1]). `stratum`:
    // the reader's kept stratum (read afresh where null or another).
    void build(std::uint64_t w, std::vector<std::uint64_t>& docs, std::vector<std::uint64_t>& starts,
               StratumItems* stratum = nullptr) const;

  private:
    void gather(std::uint64_t w, std::vector<std::uint64_t>& docs, std::vector<std::uint32_t>& classes,
                StratumItems& stratum) const;
    void piece(std::uint64_t doc, std::uint64_t length, Segments& out) const;

    std::shared_ptr<const PackLayout> layout_;
    std::uint64_t seed_, epoch_;
    Feistel perm_;
    ClassPrefix prefix_;
    std::unique_ptr<OrderSums> full_;    // split only
};

// A rank's rows of an epoch through the shared Plan (plan.n = the number of rows).
class PackedShard {
  public:
    PackedShard(std::shared_ptr<const RowSource> rows, const Plan& plan) : rows_(std::move(rows)), plan_(plan) {}
    const Plan& plan() const noexcept { return plan_; }
    std::uint64_t size() const noexcept { return plan_.num_samples; }
    std::uint64_t global(std::uint64_t k) const noexcept { return plan_.position(k) % rows_->num_rows(); }
    void global_row(std::uint64_t g, Segments& out) const {
        std::lock_guard<std::mutex> lock(mutex_);
        rows_->row(g, out, cache_);
    }

  private:
    std::shared_ptr<const RowSource> rows_;
    Plan plan_;
    mutable std::mutex mutex_;
    mutable std::shared_ptr<void> cache_;
};

}  // namespace fastshard
