// The shard plan: which positions of an epoch's global sequence G a rank takes.
//
// G[j] = P(j mod n) for the epoch's permutation P. Rank r of W takes positions
// cursor + r + k*W for k < num_samples. With cursor = 0 this is exactly the plan of
// torch.utils.data.DistributedSampler (padding wraps to the start of P, drop_last truncates).
// A cursor > 0 re-shards what remains of an epoch after `cursor` positions were consumed,
// over any W: the resume of a checkpoint, on the same or another number of ranks.
#pragma once

#include <cstdint>
#include <stdexcept>

namespace fastshard {

// num_replicas >= 1 and rank < num_replicas, else std::invalid_argument.
inline void check_world(std::uint64_t num_replicas, std::uint64_t rank) {
    if (num_replicas == 0) throw std::invalid_argument("num_replicas must be >= 1");
    if (rank >= num_replicas) throw std::invalid_argument("rank must be < num_replicas");
}

struct Plan {
    std::uint64_t n = 0;
    std::uint64_t num_replicas = 1;
    std::uint64_t rank = 0;
    std::uint64_t cursor = 0;
    bool drop_last = false;
    bool pad = true;
    std::uint64_t num_samples = 0;  // this rank's count
    std::uint64_t total_size = 0;   // positions after the cursor that all ranks together take

    // Requires n < 2^63, num_replicas >= 1, rank < num_replicas, cursor < 2^63.
    static Plan make(std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank,
                     bool drop_last, bool pad, std::uint64_t cursor = 0) {
        check_world(num_replicas, rank);
        Plan p;
        p.n = n;
        p.num_replicas = num_replicas;
        p.rank = rank;
        p.cursor = cursor;
        p.drop_last = drop_last;
        p.pad = pad;
        const std::uint64_t rest = n > cursor ? n - cursor : 0;
        const std::uint64_t w = num_replicas;
        if (drop_last) {
            p.num_samples = rest / w;
            p.total_size = p.num_samples * w;
        } else if (pad) {
            p.num_samples = rest / w + (rest % w != 0 ? 1 : 0);
            p.total_size = p.num_samples * w;
        } else {
            p.num_samples = rest > rank ? (rest - rank - 1) / w + 1 : 0;
            p.total_size = rest;
        }
        return p;
    }

    // Position in G of this rank's k-th index (k < num_samples); < cursor + total_size.
    std::uint64_t position(std::uint64_t k) const noexcept {
        return cursor + rank + k * num_replicas;
    }
};

}  // namespace fastshard
