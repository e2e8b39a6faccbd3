// The "torch" order: bit-identical to torch.utils.data.distributed.DistributedSampler.
//
// torch shuffles with torch.randperm(n) drawn from a torch.Generator seeded by
// manual_seed(seed + epoch), whose engine is a standard 32-bit mt19937 seeded with the low
// 32 bits of that value. randperm on the CPU has two algorithms:
//   n <  kTorchInsideOutFrom: Fisher-Yates; r = 0..n-1, then for i in [0, n-1):
//                             swap r[i] and r[i + draw32() % (n - i)].
//   n >= kTorchInsideOutFrom: inside-out; for i in [0, n): z = draw64() % (i + 1),
//                             r[i] = r[z], r[z] = i, where draw64 = draw32() << 32 | draw32().
// Either way the whole permutation must be built, in O(n) time and memory; TorchShard then
// keeps only the items of one rank and frees the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fastshard/plan.hpp"
#include "fastshard/shard.hpp"

namespace fastshard {

// UINT32_MAX / 20: where torch.randperm switches to the inside-out algorithm.
constexpr std::uint64_t kTorchInsideOutFrom = 0xFFFFFFFFULL / 20;

// The mt19937 seed torch derives from manual_seed(seed + epoch). Callers pass seed and
// epoch reduced modulo 2^64; since 2^32 divides 2^64 the low 32 bits of the sum are those
// of the unreduced sum.
constexpr std::uint32_t torch_seed(std::uint64_t seed, std::uint64_t epoch) noexcept {
    return static_cast<std::uint32_t>(seed + epoch);
}

// TorchAlgorithm: shard.hpp.

// Writes torch.randperm(n) for a generator seeded with `seed` into out[0, n).
// uint32_t storage requires n <= 2^32.
void torch_randperm(std::uint32_t* out, std::uint64_t n, std::uint32_t seed,
                    TorchAlgorithm algorithm = TorchAlgorithm::automatic);
void torch_randperm(std::uint64_t* out, std::uint64_t n, std::uint32_t seed,
                    TorchAlgorithm algorithm = TorchAlgorithm::automatic);
// Same, as torch's int64 output (shuffled as 32-bit items in place while n <= 2^32).
void torch_randperm(std::int64_t* out, std::uint64_t n, std::uint32_t seed,
                    TorchAlgorithm algorithm = TorchAlgorithm::automatic);

// One rank's items of torch's order. The permutation is computed once, at construction
// (peak memory: 4 bytes per item of the dataset while n <= 2^32, 8 above, plus the rank's
// share); afterwards only the rank's num_samples items are kept.
class TorchShard final : public Shard {
  public:
    TorchShard(const Plan& plan, std::uint32_t seed,
               TorchAlgorithm algorithm = TorchAlgorithm::automatic);

  protected:
    void fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const override;

  private:
    // Exactly one is allocated: 32-bit items when n <= 2^32, else 64-bit.
    std::vector<std::uint32_t> items32_;
    std::vector<std::uint64_t> items64_;
};

}  // namespace fastshard
