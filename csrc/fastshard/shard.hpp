// A rank's shard of one epoch: a Plan (positions) joined with an order (position -> item).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fastshard/feistel.hpp"
#include "fastshard/plan.hpp"

namespace fastshard {

class Shard {
  public:
    explicit Shard(const Plan& plan) : plan_(plan) {}
    virtual ~Shard() = default;
    Shard(const Shard&) = delete;
    Shard& operator=(const Shard&) = delete;

    const Plan& plan() const noexcept { return plan_; }
    std::uint64_t size() const noexcept { return plan_.num_samples; }

    // Writes items k0 .. k0 + count - 1 of this rank (k0 + count <= size()).
    void fill(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const {
        fill_range(k0, count, out);
    }
    // Same, split over up to `threads` threads when the range is large.
    void fill_parallel(std::uint64_t k0, std::uint64_t count, std::int64_t* out,
                       unsigned threads) const;

    std::int64_t at(std::uint64_t k) const {
        std::int64_t v = 0;
        fill_range(k, 1, &v);
        return v;
    }

  protected:
    virtual void fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const = 0;

  private:
    Plan plan_;
};

// The identity order (shuffle=False).
struct Identity {
    void apply(std::uint64_t*, std::size_t) const noexcept {}
};

// Any order that is a permutation P of [0, n) evaluated per position: G[j] = P(j mod n).
template <class Perm>
class PermutationShard final : public Shard {
  public:
    PermutationShard(const Plan& plan, Perm perm) : Shard(plan), perm_(std::move(perm)) {}

  protected:
    void fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const override {
        if (count == 0) return;
        const Plan& p = plan();
        const std::uint64_t n = p.n;
        const std::uint64_t step = p.num_replicas % n;
        std::uint64_t j = p.position(k0) % n;
        // int64 and uint64 may alias: positions are written in place, then permuted there.
        auto* x = reinterpret_cast<std::uint64_t*>(out);
        constexpr std::uint64_t kChunk = 1024;
        for (std::uint64_t start = 0; start < count; start += kChunk) {
            const std::uint64_t m = count - start < kChunk ? count - start : kChunk;
            // Runs of positions that do not wrap past n, each an arithmetic sequence the
            // compiler vectorises (a test per position to wrap it would keep the loop scalar).
            std::uint64_t i = 0;
            while (i < m) {
                const std::uint64_t before_wrap = step == 0 ? m - i : (n - j + step - 1) / step;
                const std::uint64_t run = before_wrap < m - i ? before_wrap : m - i;
                std::uint64_t* dst = x + start + i;
                for (std::uint64_t t = 0; t < run; ++t) dst[t] = j + t * step;
                j += run * step;  // < n + step <= 2n: one subtraction wraps it
                if (j >= n) j -= n;
                i += run;
            }
            perm_.apply(x + start, static_cast<std::size_t>(m));
        }
    }

  private:
    Perm perm_;
};

// Order names understood by make_shard. `torch` (torch_order.hpp) builds the whole epoch's
// permutation at construction: O(n) time and memory, unlike the others.
enum class Order { feistel, identity, torch };

// The shuffle of the torch order for n >= kTorchInsideOutFrom (torch_order.hpp), where torch
// changed its algorithm in 2.6: `automatic` is torch >= 2.6's choice by n.
enum class TorchAlgorithm {
    automatic,     // torch >= 2.6: Fisher-Yates below kTorchInsideOutFrom, inside-out from it
    fisher_yates,  // every n, as torch <= 2.5 (here for n <= 2^32)
    inside_out,    // every n
};

// Domain separator of the feistel order's key (versioned with the order).
constexpr std::uint64_t kFeistelDomain = 1;

// `torch_shuffle` (order torch only): the shuffle for n >= kTorchInsideOutFrom, which depends on
// the torch version being matched (torch_order.hpp).
std::shared_ptr<const Shard> make_shard(const Plan& plan, Order order, std::uint64_t seed,
                                        std::uint64_t epoch,
                                        TorchAlgorithm torch_shuffle = TorchAlgorithm::automatic);

}  // namespace fastshard
