#include "fastshard/torch_order.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <xmmintrin.h>
#endif

namespace fastshard {

namespace {

// A hint that *p will soon be read and written. Prefetches never fault, so stale or
// out-of-range hints cost nothing but a wasted memory access.
template <class T>
inline void prefetch_for_write(const T* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p, 1, 3);
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
#else
    (void)p;
#endif
}

// The standard 32-bit Mersenne Twister (as std::mt19937 and torch's at::mt19937), producing
// its outputs in bulk: the whole 624-word state is regenerated in three branch-free loops
// and tempered into the caller's buffer, which compilers vectorise; std::mt19937 hands out
// one word per call with a branch on the state index.
class Mt19937 {
  public:
    explicit Mt19937(std::uint32_t seed) noexcept {
        state_[0] = seed;
        for (std::uint32_t i = 1; i < kN; ++i)
            state_[i] = 1812433253U * (state_[i - 1] ^ (state_[i - 1] >> 30)) + i;
        index_ = kN;
    }

    void generate(std::uint32_t* out, std::size_t count) noexcept {
        while (count > 0) {
            if (index_ == kN) twist();
            const std::size_t m = std::min<std::size_t>(count, kN - index_);
            const std::uint32_t* s = state_ + index_;
            for (std::size_t i = 0; i < m; ++i) out[i] = temper(s[i]);
            index_ += static_cast<std::uint32_t>(m);
            out += m;
            count -= m;
        }
    }

  private:
    static constexpr std::uint32_t kN = 624;
    static constexpr std::uint32_t kM = 397;

    static std::uint32_t step(std::uint32_t a, std::uint32_t b, std::uint32_t c) noexcept {
        const std::uint32_t y = (a & 0x80000000U) | (b & 0x7fffffffU);
        return c ^ (y >> 1) ^ ((0U - (y & 1U)) & 0x9908b0dfU);
    }

    static std::uint32_t temper(std::uint32_t y) noexcept {
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c5680U;
        y ^= (y << 15) & 0xefc60000U;
        y ^= y >> 18;
        return y;
    }

    void twist() noexcept {
        std::uint32_t* s = state_;
        std::uint32_t i = 0;
        for (; i < kN - kM; ++i) s[i] = step(s[i], s[i + 1], s[i + kM]);
        for (; i < kN - 1; ++i) s[i] = step(s[i], s[i + 1], s[i + kM - kN]);
        s[kN - 1] = step(s[kN - 1], s[0], s[kM - 1]);
        index_ = 0;
    }

    std::uint32_t state_[kN];
    std::uint32_t index_;
};

// Memory for a permutation: on Linux, large buffers are aligned to 2 MiB and marked for
// transparent huge pages, because the shuffle touches them at random and with 4 KiB pages
// almost every access would also miss the TLB.
struct FreeDeleter {
    void operator()(void* p) const noexcept { std::free(p); }
};

template <class T>
std::unique_ptr<T[], FreeDeleter> allocate(std::uint64_t count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_alloc();
    const std::size_t bytes =
        std::max<std::size_t>(static_cast<std::size_t>(count) * sizeof(T), 1);
    void* p = nullptr;
#if defined(__linux__)
    constexpr std::size_t kHuge = std::size_t{1} << 21;
    if (bytes >= kHuge) {
        const std::size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
        if (posix_memalign(&p, kHuge, rounded) != 0) throw std::bad_alloc();
        madvise(p, rounded, MADV_HUGEPAGE);  // a hint: failure only costs speed
        return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
    }
#endif
    p = std::malloc(bytes);
    if (p == nullptr) throw std::bad_alloc();
    return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
}

// Both shuffles draw their random numbers independently of the data, so they run as a
// pipeline over chunks of kChunk steps. While the swaps of one chunk run, the same loop
// computes the swap targets of the next chunk (its mt19937 outputs come from one bulk call
// before), so the divisions execute in the shadow of the swaps' memory stalls instead of
// adding to them; and each swap prefetches the cache line that the swap kAhead steps later
// touches, so the random accesses overlap in memory instead of each waiting for the last.
// CPU time on a 2-core Zen 5 VM, n = 1e8 (bench/RESULTS.md, "order=torch"): 3.0-3.8 s for
// the plain loop, ~0.85 s with prefetching, ~0.6 s with huge pages too, ~0.46 s with the
// targets computed inside the swap loop. 32 ahead left latency exposed; 128 was best.
constexpr std::uint64_t kChunk = 256;
constexpr std::uint64_t kRing = 2 * kChunk;  // the current chunk's targets and the next's
constexpr std::uint64_t kMask = kRing - 1;
constexpr std::uint64_t kAhead = 128;
static_assert(kAhead <= kChunk, "the prefetch distance must stay within the ring");

// For k in [0, steps): t_k = target(k, d_k), where d_k are the k-th kDraws outputs of
// mt19937(seed); then step(k, t_k), after prefetching r + t_{k + kAhead}.
template <unsigned kDraws, class T, class Target, class Step>
void pipelined(T* r, std::uint64_t steps, std::uint32_t seed, Target target, Step step) {
    if (steps == 0) return;
    Mt19937 engine(seed);
    T ring[kRing] = {};  // past the last target it holds stale ones: valid, harmless hints
    std::uint32_t draws[kDraws * kChunk];
    const std::uint64_t m0 = std::min(kChunk, steps);
    engine.generate(draws, static_cast<std::size_t>(kDraws * m0));
    for (std::uint64_t j = 0; j < m0; ++j) ring[j] = target(j, draws + kDraws * j);
    for (std::uint64_t i0 = 0; i0 < steps; i0 += kChunk) {
        const std::uint64_t m = std::min(kChunk, steps - i0);
        const std::uint64_t next0 = i0 + kChunk;
        const std::uint64_t m_next = next0 < steps ? std::min(kChunk, steps - next0) : 0;
        engine.generate(draws, static_cast<std::size_t>(kDraws * m_next));
        const T* t = ring + (i0 & kMask);
        T* t_next = ring + (next0 & kMask);
        std::uint64_t j = 0;
        for (; j < m_next; ++j) {  // m_next <= m
            t_next[j] = target(next0 + j, draws + kDraws * j);
            prefetch_for_write(r + ring[(i0 + j + kAhead) & kMask]);
            step(i0 + j, t[j]);
        }
        for (; j < m; ++j) {
            prefetch_for_write(r + ring[(i0 + j + kAhead) & kMask]);
            step(i0 + j, t[j]);
        }
    }
}

// r[i] = i, then for i in [0, n - 1): swap r[i], r[i + draw32() % (n - i)]. n < 2^32.
template <class T>
void fisher_yates(T* r, std::uint32_t n, std::uint32_t seed) {
    for (std::uint32_t i = 0; i < n; ++i) r[i] = static_cast<T>(i);
    if (n < 2) return;
    pipelined<1>(
        r, n - 1, seed,
        [n](std::uint64_t k, const std::uint32_t* d) {
            const auto i = static_cast<std::uint32_t>(k);
            return static_cast<T>(i + d[0] % (n - i));  // 32-bit division, as torch's values fit
        },
        [r](std::uint64_t i, T t) {
            const T a = r[i];
            r[i] = r[t];
            r[t] = a;
        });
}

// for i in [0, n): z = draw64() % (i + 1); r[i] = r[z]; r[z] = i.
template <class T>
void inside_out(T* r, std::uint64_t n, std::uint32_t seed) {
    pipelined<2>(
        r, n, seed,
        [](std::uint64_t k, const std::uint32_t* d) {
            const std::uint64_t draw = std::uint64_t{d[0]} << 32 | d[1];
            return static_cast<T>(draw % (k + 1));
        },
        [r](std::uint64_t i, T z) {
            r[i] = static_cast<T>(i);  // makes r[z] defined when z == i
            r[i] = r[z];
            r[z] = static_cast<T>(i);
        });
}

template <class T>
void randperm(T* out, std::uint64_t n, std::uint32_t seed, TorchAlgorithm algorithm) {
    if (algorithm == TorchAlgorithm::automatic)
        algorithm = n < kTorchInsideOutFrom ? TorchAlgorithm::fisher_yates
                                            : TorchAlgorithm::inside_out;
    if (sizeof(T) < sizeof(std::uint64_t) &&
        n > std::uint64_t{std::numeric_limits<T>::max()} + 1)
        throw std::invalid_argument("torch_randperm: n is too large for the item type");
    if (algorithm == TorchAlgorithm::fisher_yates) {
        if (n > std::numeric_limits<std::uint32_t>::max())
            throw std::invalid_argument(
                "torch_randperm: Fisher-Yates (torch <= 2.5 at any n) is implemented for n < 2^32 only");
        fisher_yates(out, static_cast<std::uint32_t>(n), seed);
    } else {
        inside_out(out, n, seed);
    }
}

constexpr std::uint64_t kMax32 = std::uint64_t{1} << 32;  // items < 2^32 fit in 32 bits

template <class T>
std::vector<T> keep_rank_items(const Plan& plan, std::uint32_t seed, TorchAlgorithm algorithm) {
    const std::uint64_t n = plan.n;
    std::vector<T> items(static_cast<std::size_t>(plan.num_samples));
    if (plan.num_samples == 0) return items;
    {
        auto perm = allocate<T>(n);
        randperm(perm.get(), n, seed, algorithm);
        const std::uint64_t step = plan.num_replicas % n;
        std::uint64_t j = plan.position(0) % n;
        for (std::uint64_t k = 0; k < plan.num_samples; ++k) {
            items[k] = perm[j];
            j += step;
            if (j >= n) j -= n;
        }
    }  // the permutation is freed here
    return items;
}

}  // namespace

void torch_randperm(std::uint32_t* out, std::uint64_t n, std::uint32_t seed,
                    TorchAlgorithm algorithm) {
    randperm(out, n, seed, algorithm);
}

void torch_randperm(std::uint64_t* out, std::uint64_t n, std::uint32_t seed,
                    TorchAlgorithm algorithm) {
    randperm(out, n, seed, algorithm);
}

void torch_randperm(std::int64_t* out, std::uint64_t n, std::uint32_t seed,
                    TorchAlgorithm algorithm) {
    if (n <= kMax32) {
        // Shuffle 32-bit items in the first half of `out` (half the memory traffic of 64-bit
        // ones, and no scratch buffer), then widen in place from the end: item i moves from
        // bytes [4i, 4i + 4) to [8i, 8i + 8), which hold only items >= i, all read already.
        // memcpy, not typed accesses, because the two views of the bytes overlap.
        randperm(reinterpret_cast<std::uint32_t*>(out), n, seed, algorithm);
        auto* bytes = reinterpret_cast<unsigned char*>(out);
        for (std::uint64_t i = n; i-- > 0;) {
            std::uint32_t narrow;
            std::memcpy(&narrow, bytes + 4 * i, sizeof narrow);
            const std::int64_t wide = narrow;
            std::memcpy(bytes + 8 * i, &wide, sizeof wide);
        }
    } else {
        // uint64_t may alias int64_t, and every item < n < 2^63 reads back unchanged.
        randperm(reinterpret_cast<std::uint64_t*>(out), n, seed, algorithm);
    }
}

TorchShard::TorchShard(const Plan& plan, std::uint32_t seed, TorchAlgorithm algorithm)
    : Shard(plan) {
    // Refused before the O(n) allocation rather than after it.
    if (algorithm == TorchAlgorithm::fisher_yates && plan.n > std::numeric_limits<std::uint32_t>::max())
        throw std::invalid_argument(
            "order='torch' with torch <= 2.5 (Fisher-Yates at every n) is implemented for n < 2**32 only");
    if (plan.n <= kMax32)
        items32_ = keep_rank_items<std::uint32_t>(plan, seed, algorithm);
    else
        items64_ = keep_rank_items<std::uint64_t>(plan, seed, algorithm);
}

void TorchShard::fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const {
    if (plan().n <= kMax32) {
        const std::uint32_t* s = items32_.data() + k0;
        for (std::uint64_t i = 0; i < count; ++i) out[i] = static_cast<std::int64_t>(s[i]);
    } else {
        const std::uint64_t* s = items64_.data() + k0;
        for (std::uint64_t i = 0; i < count; ++i) out[i] = static_cast<std::int64_t>(s[i]);
    }
}

}  // namespace fastshard
