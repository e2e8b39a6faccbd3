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
// the number of positive weights, and a position-sensitive 64-bit checksum of their bits.
struct WeightsSummary {
    std::int64_t first_invalid = -1;
    double sum = 0.0;
    std::uint64_t positive = 0;
    std::uint64_t checksum = 0;
};
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

    // `segment`: a positive multiple of kSweepBlock; other values than the default are for tests.
    AliasTable(const double* w, std::uint64_t n, double sum, std::uint64_t segment = kSweepSegment);

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
