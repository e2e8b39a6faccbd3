// Weighted sampling: G[j] is a draw from the weights.
//
// With replacement, G[j] is an independent draw computed in O(1) from (key, j) by a
// counter-based generator and a Walker alias table, so a rank's shard, random access,
// bulk fills and resume work exactly as for a permutation. Without replacement, G is the
// prefix of a weighted random order (Efraimidis-Spirakis keys), materialised once per epoch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "fastshard/memory.hpp"
#include "fastshard/plan.hpp"

namespace fastshard {

class Shard;

// One pass over the weights: the first invalid (negative, NaN, infinite) index, the sum,
// the number of positive weights, a position-sensitive 64-bit checksum of their bits, and the
// largest and smallest positive weight (what the table's normalisation needs). Every field is
// independent of the number of threads: the sum adds each block of kSumBlock items left to
// right, then the blocks' sums in block order (the same rounding as one thread always had);
// the other fields are exact.
struct WeightsSummary {
    std::int64_t first_invalid = -1;
    double sum = 0.0;
    std::uint64_t positive = 0;
    std::uint64_t checksum = 0;
    double max = 0.0;           // 0 if none is positive
    double min_positive = 0.0;  // 0 if none is positive
};
constexpr std::uint64_t kSumBlock = 4096;
WeightsSummary summarize_weights(const double* w, std::uint64_t n, unsigned threads);

// Walker's alias table built by a sweep (Huebschle-Schneider & Sanders): two cursors walk
// the weights left to right, one over the light items (below the mean), one over the heavy
// ones, so the build reads memory in order and needs no worklist, only one bit per item.
// Segments of kSweepSegment items sweep in parallel from states given by prefix sums (see
// weighted.cpp); the table depends on the weights and the segment size only. Bucket i keeps
// item i with probability threshold/2^32, else its alias. Each bucket is 8 bytes for n <= 2^32.
class AliasTable {
  public:
    static constexpr std::uint64_t kSweepBlock = 4096;  // granularity of the prefix sums
    static constexpr std::uint64_t kSweepSegment = std::uint64_t{1} << 22;

    // `summary`: summarize_weights(w, n) (valid weights, at least one positive). `segment`: a
    // positive multiple of kSweepBlock; other values than the default are for tests.
    //
    // The table is that of the weights normalised by the power of two 2^k that brings the
    // largest into [1, 2): multiplying every weight by any 2^j (exactly) gives the same table.
    // Where that normalisation changes no rounding (every positive weight and w * 2^k normal,
    // n / sum normal), the weights are used as they are, with the identical result; otherwise
    // (subnormal weights, a mean below about 5.6e-309, a range wider than 2^1022) the build
    // works on a normalised copy (8 bytes per item while it runs).
    AliasTable(const double* w, std::uint64_t n, const WeightsSummary& summary,
               std::uint64_t segment = kSweepSegment);

    // A table restored from the bytes of data() (its n buckets, as bytes() of them): for
    // pickling. Throws std::invalid_argument when the size does not match n or a bucket's
    // alias is out of range.
    AliasTable(std::uint64_t n, const void* bytes, std::size_t size);
    // The buckets' storage, bytes() long.
    const void* data() const noexcept {
        return small_ ? static_cast<const void*>(small_.get()) : static_cast<const void*>(large_.get());
    }

    std::uint64_t size() const noexcept { return n_; }
    std::size_t bytes() const noexcept {
        return static_cast<std::size_t>(n_) * (small_ ? sizeof(Small) : sizeof(Large));
    }
    // Probability of item i as the table represents it (for tests and the docs' error bound).
    double probability(std::uint64_t i) const;
    // Every bucket's threshold (kFull = 2^32 - 1: keeps its item) and alias, n of each (for tests).
    void buckets(std::uint64_t* threshold, std::uint64_t* alias) const noexcept;
    static constexpr std::uint64_t kFull = 0xffffffffULL;

    // x[i] (a position) -> the item drawn at that position for the given key.
    void apply(std::uint64_t* x, std::size_t count, std::uint64_t key) const noexcept;

  private:
    struct Small {
        std::uint32_t threshold;
        std::uint32_t alias;
    };
    struct Large {
        std::uint64_t threshold;  // only the low 32 bits are used
        std::uint64_t alias;
    };
    template <class Bucket>
    void build(HugeArray<Bucket>& table, const double* w, double scale, std::uint64_t segment);
    template <class Bucket>
    void draw(const HugeArray<Bucket>& table, std::uint64_t* x, std::size_t count,
              std::uint64_t key) const noexcept;

    std::uint64_t n_;
    HugeArray<Small> small_;  // n <= 2^32
    HugeArray<Large> large_;  // otherwise
};

// Domain separator of the weighted draws' key.
constexpr std::uint64_t kWeightedDomain = 2;

// A rank's shard of weighted draws with replacement; plan.n is the epoch's number of draws.
std::shared_ptr<const Shard> make_weighted_shard(const Plan& plan,
                                                 std::shared_ptr<const AliasTable> table,
                                                 std::uint64_t seed, std::uint64_t epoch);

// Without replacement: the first `count` items of a weighted random order of the items with
// positive weight (count <= number of positive weights); plan.n must equal count.
std::shared_ptr<const Shard> make_weighted_order_shard(const Plan& plan, const double* w,
                                                       std::uint64_t n, std::uint64_t seed,
                                                       std::uint64_t epoch);

}  // namespace fastshard
