#include "fastshard/feistel.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "fastshard/clones.hpp"
#include "fastshard/mix.hpp"

#ifdef FASTSHARD_MULTIVERSION
#include <cpuid.h>
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#endif

namespace fastshard {

namespace {

constexpr std::uint32_t low_mask(unsigned bits) noexcept {
    return bits >= 32 ? 0xffffffffU : (std::uint32_t{1} << bits) - 1U;
}

// Lanes per block: enough independent work for the compiler to vectorise the rounds. 128
// rather than 64 halves the loop overheads per lane and the cycle walk's flushes; Shard::fill
// at n = 1e7 took 4.1-4.4 ns an item against 4.7-4.9 with 64 (bench/fill_speed.cpp, issue 30).
constexpr std::size_t kBlock = 128;

}  // namespace

Feistel::Feistel(std::uint64_t n, std::uint64_t key, std::uint64_t table_max, int rounds)
    : n_(n), rounds_(rounds) {
    if (rounds < 1 || rounds > kMaxRounds) throw std::invalid_argument("rounds must be in [1, 32]");
    SplitMix64 stream(key);
    if (n <= 1 || n <= table_max) {
        table_.resize(static_cast<std::size_t>(n));
        std::iota(table_.begin(), table_.end(), std::uint32_t{0});
        for (std::size_t i = table_.size(); i > 1; --i) {
            const std::size_t j = stream.below(static_cast<std::uint32_t>(i));
            std::swap(table_[i - 1], table_[j]);
        }
        inverse_.resize(table_.size());
        for (std::size_t i = 0; i < table_.size(); ++i) inverse_[table_[i]] = static_cast<std::uint32_t>(i);
        return;
    }
    const unsigned k = std::max(bit_width(n - 1), 2U);  // >= 11 with the default table
    hi_bits_ = k - k / 2;
    lo_bits_ = k / 2;
    for (int r = 0; r < rounds_; ++r) {
        const std::uint64_t w = stream.next();
        xor_keys_[r] = static_cast<std::uint32_t>(w);
        add_keys_[r] = static_cast<std::uint32_t>(w >> 32);
    }
}

namespace {

#if defined(_MSC_VER)
#define FASTSHARD_INLINE __forceinline
#else
#define FASTSHARD_INLINE __attribute__((always_inline)) inline
#endif

// The network on count <= kBlock lanes, in place. Always inlined, so that a caller passing the
// constant kRounds gets code specialised for it.
//
// Narrow (both halves of at most 16 bits, n <= 2^32): hash32 of a round's input h ^ kx, h < 2^16,
// begins x ^= x >> 16, and (h ^ kx) >> 16 = kx >> 16, so the key, that first step and the half's
// mask are one operation, (h & mask) ^ (kx ^ kx >> 16) (one vpternlogd where AVX-512 has it). The
// halves are then carried unmasked between rounds: a round's addition or subtraction is the same
// mod 2^width with or without the bits above, which the next hash input and the output mask
// away. 9 vector operations a round instead of 12; the same network, bit for bit (tests/
// test_core.py pins both forms to a reference in Python integers on either side of 2^32).
template <bool Narrow>
FASTSHARD_INLINE void encrypt_lanes(std::uint64_t* x, std::size_t count, int rounds, unsigned hi_bits,
                                    unsigned lo_bits, const std::uint32_t* xor_keys,
                                    const std::uint32_t* add_keys) {
    // Structure of arrays over the lanes, rounds outside: each round is one vectorisable loop.
    std::uint32_t a[kBlock];
    std::uint32_t b[kBlock];
    const std::uint32_t lo_mask = low_mask(lo_bits);
    for (std::size_t i = 0; i < count; ++i) {
        a[i] = static_cast<std::uint32_t>(x[i] >> lo_bits);
        b[i] = static_cast<std::uint32_t>(x[i]) & lo_mask;
    }
    std::uint32_t mask_a = low_mask(hi_bits);
    std::uint32_t mask_b = lo_mask;
    for (int r = 0; r < rounds; ++r) {
        const std::uint32_t kx = xor_keys[r];
        const std::uint32_t ka = add_keys[r];
        if constexpr (Narrow) {
            const std::uint32_t k16 = kx ^ (kx >> 16);
            for (std::size_t i = 0; i < count; ++i) {
                const std::uint32_t f = hash32_tail((b[i] & mask_b) ^ k16) + ka;
                const std::uint32_t next_b = a[i] + f;
                a[i] = b[i];
                b[i] = next_b;
            }
        } else {
            for (std::size_t i = 0; i < count; ++i) {
                const std::uint32_t f = hash32(b[i] ^ kx) + ka;
                const std::uint32_t next_b = (a[i] + f) & mask_a;
                a[i] = b[i];
                b[i] = next_b;
            }
        }
        std::swap(mask_a, mask_b);
    }
    // After an odd number of rounds the halves have traded widths: b is the wider one.
    const unsigned b_bits = rounds % 2 == 0 ? lo_bits : hi_bits;
    for (std::size_t i = 0; i < count; ++i) x[i] = (std::uint64_t{a[i] & mask_a} << b_bits) | (b[i] & mask_b);
}

// The inverse of encrypt_lanes: the rounds in reverse, each subtracting what it added.
template <bool Narrow>
FASTSHARD_INLINE void decrypt_lanes(std::uint64_t* x, std::size_t count, int rounds, unsigned hi_bits,
                                    unsigned lo_bits, const std::uint32_t* xor_keys,
                                    const std::uint32_t* add_keys) {
    std::uint32_t a[kBlock];
    std::uint32_t b[kBlock];
    const unsigned b_bits = rounds % 2 == 0 ? lo_bits : hi_bits;
    const std::uint32_t b_mask = low_mask(b_bits);
    for (std::size_t i = 0; i < count; ++i) {
        a[i] = static_cast<std::uint32_t>(x[i] >> b_bits);
        b[i] = static_cast<std::uint32_t>(x[i]) & b_mask;
    }
    for (int r = rounds - 1; r >= 0; --r) {
        const std::uint32_t kx = xor_keys[r];
        const std::uint32_t ka = add_keys[r];
        const std::uint32_t mask_a = low_mask(r % 2 == 0 ? hi_bits : lo_bits);  // round r's a
        if constexpr (Narrow) {
            const std::uint32_t k16 = kx ^ (kx >> 16);
            const std::uint32_t mask_old = low_mask(r % 2 == 0 ? lo_bits : hi_bits);  // a's coming in
            for (std::size_t i = 0; i < count; ++i) {
                const std::uint32_t old_b = a[i];
                const std::uint32_t f = hash32_tail((old_b & mask_old) ^ k16) + ka;
                a[i] = b[i] - f;
                b[i] = old_b;
            }
        } else {
            for (std::size_t i = 0; i < count; ++i) {
                const std::uint32_t old_b = a[i];
                const std::uint32_t f = hash32(old_b ^ kx) + ka;
                a[i] = (b[i] - f) & mask_a;
                b[i] = old_b;
            }
        }
    }
    const std::uint32_t hi_mask = low_mask(hi_bits), lo_mask = low_mask(lo_bits);
    for (std::size_t i = 0; i < count; ++i) x[i] = (std::uint64_t{a[i] & hi_mask} << lo_bits) | (b[i] & lo_mask);
}

// A Gather: appends the index first + i of each lane i of values[0, m) that is >= n to the pool
// of homes (`pooled` in it, at most kBlock), in lane order, until the lanes run out or the pool
// is full; returns the lanes taken. Only the homes are pooled: a walk reads the values from x.
using Home = std::uint32_t;  // an index into the current chunk of x (walk_cycles)
using Gather = std::size_t (*)(const std::uint64_t* values, std::size_t m, std::uint64_t n, Home first, Home* home,
                               std::size_t& pooled) noexcept;

std::size_t gather_scalar(const std::uint64_t* values, std::size_t m, std::uint64_t n, Home first, Home* home,
                          std::size_t& pooled) noexcept {
    std::size_t p = pooled, i = 0;
    for (; i < m && p < kBlock; ++i) {  // branch-free: the test is a coin flip near n = 2^k / 2
        home[p] = static_cast<Home>(first + i);
        p += values[i] >= n ? 1 : 0;
    }
    pooled = p;
    return i;
}

#ifdef FASTSHARD_MULTIVERSION
// Sixteen lanes at a time: two compares into one mask, then the lanes' 32-bit homes moved down
// by one compress. Compresses are the cost here (on this project's AMD EPYC most of the
// function's samples): one per 16 lanes, where values and 64-bit homes took two per 8
// (bench/RESULTS.md, "Concat's read: narrow rounds").
FASTSHARD_TARGET_AVX512F std::size_t gather_avx512f(const std::uint64_t* values, std::size_t m, std::uint64_t n,
                                                    Home first, Home* home, std::size_t& pooled) noexcept {
    static_assert(sizeof(Home) == 4, "homes are compressed as 32-bit lanes");
    const __m512i limit = _mm512_set1_epi64(static_cast<long long>(n));
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512i index = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first)),
                                     _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    std::size_t p = pooled, i = 0;
    for (; i + 16 <= m && p + 16 <= kBlock; i += 16) {
        const __mmask8 low = _mm512_cmpge_epu64_mask(_mm512_loadu_si512(values + i), limit);
        const __mmask8 high = _mm512_cmpge_epu64_mask(_mm512_loadu_si512(values + i + 8), limit);
        const __mmask16 out = _mm512_kunpackb(high, low);
        _mm512_storeu_si512(home + p, _mm512_maskz_compress_epi32(out, index));
        p += static_cast<std::size_t>(__builtin_popcount(static_cast<unsigned>(out)));
        index = _mm512_add_epi32(index, sixteen);
    }
    std::size_t rest = p;
    const std::size_t taken =
        i + gather_scalar(values + i, m - i, n, static_cast<Home>(first + i), home, rest);
    pooled = rest;
    return taken;
}
#endif

Gather gather_kernel() noexcept;

// Cycle walking: values that leave [0, n) go through `block` again until they return. The
// cycle of each value under the network contains it (in range), so this ends, after < 2
// passes on average. Lanes still walking wait in one pool across blocks, which is passed
// whenever it is full: the walks too run on full, vectorised blocks; this CPU's Gather puts the
// homes of a block's lanes that left [0, n) in the pool. When n is the network's whole domain (a
// power of two), no value ever leaves it: the blocks alone, without the pooling.
template <class Block>
void walk_cycles(std::uint64_t* x, std::size_t count, std::uint64_t n, std::uint64_t domain, Block&& block) {
    if (n == domain) {
        for (std::size_t start = 0; start < count; start += kBlock) block(x + start, std::min(kBlock, count - start));
        return;
    }
    // Homes are 32-bit: x in chunks of at most 2^31 values, each walked to its end.
    constexpr std::size_t kChunk = std::size_t{1} << 31;
    if (count > kChunk) {
        for (std::size_t start = 0; start < count; start += kChunk)
            walk_cycles(x + start, std::min(kChunk, count - start), n, domain, block);
        return;
    }
    const Gather gather = gather_kernel();
    std::uint64_t pool[kBlock];
    Home home[kBlock];  // where in x each pooled value belongs
    std::size_t pooled = 0;
    auto walk = [&] {  // one pass of the pool; the lanes that return leave it
        for (std::size_t i = 0; i < pooled; ++i) pool[i] = x[home[i]];
        block(pool, pooled);
        std::size_t still = 0;
        for (std::size_t i = 0; i < pooled; ++i) {
            const std::uint64_t v = pool[i];
            x[home[i]] = v;  // final once v < n; walked again otherwise
            home[still] = home[i];
            still += v >= n ? 1 : 0;
        }
        pooled = still;
    };
    for (std::size_t start = 0; start < count; start += kBlock) {
        const std::size_t m = std::min(kBlock, count - start);
        std::uint64_t* values = x + start;
        block(values, m);
        for (std::size_t i = 0; i < m;) {
            i += gather(values + i, m - i, n, static_cast<Home>(start + i), home, pooled);
            if (i < m) {  // the pool is full
                do walk();
                while (pooled == kBlock);
            }
        }
    }
    while (pooled != 0) walk();
}

// The network on one block, specialised for the public round count and for narrow halves. Always
// inlined into one copy per instruction set below.
template <bool Narrow>
FASTSHARD_INLINE void encrypt_rounds(std::uint64_t* x, std::size_t count, int rounds, unsigned hi_bits,
                                     unsigned lo_bits, const std::uint32_t* xor_keys,
                                     const std::uint32_t* add_keys) {
    if (rounds == Feistel::kRounds) {  // the public order
        encrypt_lanes<Narrow>(x, count, Feistel::kRounds, hi_bits, lo_bits, xor_keys, add_keys);
    } else {  // networks studied with other round counts
        encrypt_lanes<Narrow>(x, count, rounds, hi_bits, lo_bits, xor_keys, add_keys);
    }
}

template <bool Narrow>
FASTSHARD_INLINE void decrypt_rounds(std::uint64_t* x, std::size_t count, int rounds, unsigned hi_bits,
                                     unsigned lo_bits, const std::uint32_t* xor_keys,
                                     const std::uint32_t* add_keys) {
    if (rounds == Feistel::kRounds) {
        decrypt_lanes<Narrow>(x, count, Feistel::kRounds, hi_bits, lo_bits, xor_keys, add_keys);
    } else {
        decrypt_lanes<Narrow>(x, count, rounds, hi_bits, lo_bits, xor_keys, add_keys);
    }
}

FASTSHARD_INLINE void encrypt_any(std::uint64_t* x, std::size_t count, int rounds, unsigned hi_bits,
                                  unsigned lo_bits, const std::uint32_t* xor_keys,
                                  const std::uint32_t* add_keys) {
    if (hi_bits <= 16) encrypt_rounds<true>(x, count, rounds, hi_bits, lo_bits, xor_keys, add_keys);
    else encrypt_rounds<false>(x, count, rounds, hi_bits, lo_bits, xor_keys, add_keys);
}

FASTSHARD_INLINE void decrypt_any(std::uint64_t* x, std::size_t count, int rounds, unsigned hi_bits,
                                  unsigned lo_bits, const std::uint32_t* xor_keys,
                                  const std::uint32_t* add_keys) {
    if (hi_bits <= 16) decrypt_rounds<true>(x, count, rounds, hi_bits, lo_bits, xor_keys, add_keys);
    else decrypt_rounds<false>(x, count, rounds, hi_bits, lo_bits, xor_keys, add_keys);
}

#define FASTSHARD_KERNEL_ARGS                                                                   \
    std::uint64_t *x, std::size_t count, int rounds, unsigned hi_bits, unsigned lo_bits,       \
        const std::uint32_t *xor_keys, const std::uint32_t *add_keys
#define FASTSHARD_KERNEL_PASS x, count, rounds, hi_bits, lo_bits, xor_keys, add_keys

void encrypt_baseline(FASTSHARD_KERNEL_ARGS) noexcept { encrypt_any(FASTSHARD_KERNEL_PASS); }
void decrypt_baseline(FASTSHARD_KERNEL_ARGS) noexcept { decrypt_any(FASTSHARD_KERNEL_PASS); }

#ifdef FASTSHARD_MULTIVERSION
FASTSHARD_TARGET_AVX512F void encrypt_avx512f(FASTSHARD_KERNEL_ARGS) noexcept {
    encrypt_any(FASTSHARD_KERNEL_PASS);
}
FASTSHARD_TARGET_AVX512F void decrypt_avx512f(FASTSHARD_KERNEL_ARGS) noexcept {
    decrypt_any(FASTSHARD_KERNEL_PASS);
}
FASTSHARD_TARGET_AVX2 void encrypt_avx2(FASTSHARD_KERNEL_ARGS) noexcept { encrypt_any(FASTSHARD_KERNEL_PASS); }
FASTSHARD_TARGET_AVX2 void decrypt_avx2(FASTSHARD_KERNEL_ARGS) noexcept { decrypt_any(FASTSHARD_KERNEL_PASS); }

SimdLevel detect_simd_level() noexcept {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return SimdLevel::kBaseline;
    const bool osxsave = (ecx & (1U << 27)) != 0, avx = (ecx & (1U << 28)) != 0;
    if (!osxsave || !avx) return SimdLevel::kBaseline;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));  // no -mxsave needed
    if ((xcr0_lo & 0x6U) != 0x6U) return SimdLevel::kBaseline;  // the OS saves xmm and ymm
    if (__get_cpuid_max(0, nullptr) < 7) return SimdLevel::kBaseline;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    // AVX-512F (leaf 7 ebx bit 16) with opmask, zmm0-15 upper and zmm16-31 state saved.
    if ((ebx & (1U << 16)) != 0 && (xcr0_lo & 0xe0U) == 0xe0U) return SimdLevel::kAvx512f;
    if ((ebx & (1U << 5)) != 0) return SimdLevel::kAvx2;
    return SimdLevel::kBaseline;
}

// The detected level, capped by the environment variable FASTSHARD_SIMD ("baseline" or "avx2";
// anything else leaves it): the tests run every copy on one machine this way, and a user can rule
// a copy out when chasing a difference between machines.
SimdLevel capped_simd_level() noexcept {
    const SimdLevel level = detect_simd_level();
    const char* cap = std::getenv("FASTSHARD_SIMD");
    if (cap == nullptr) return level;
    if (std::strcmp(cap, "baseline") == 0) return SimdLevel::kBaseline;
    if (std::strcmp(cap, "avx2") == 0 && level == SimdLevel::kAvx512f) return SimdLevel::kAvx2;
    return level;
}
#endif

using Kernel = void (*)(FASTSHARD_KERNEL_ARGS) noexcept;

// The copy of a function for this CPU, by simd_level(); each caller keeps its pick in a static.
#ifdef FASTSHARD_MULTIVERSION
template <class F>
F pick(F avx512f, F avx2, F baseline) noexcept {
    const SimdLevel level = simd_level();
    return level == SimdLevel::kAvx512f ? avx512f : level == SimdLevel::kAvx2 ? avx2 : baseline;
}
#define FASTSHARD_PICK(avx512f, avx2, baseline) pick(avx512f, avx2, baseline)
#else
#define FASTSHARD_PICK(avx512f, avx2, baseline) baseline
#endif

Kernel encrypt_kernel() noexcept {
    static const Kernel kernel = FASTSHARD_PICK(encrypt_avx512f, encrypt_avx2, encrypt_baseline);
    return kernel;
}

Kernel decrypt_kernel() noexcept {
    static const Kernel kernel = FASTSHARD_PICK(decrypt_avx512f, decrypt_avx2, decrypt_baseline);
    return kernel;
}

Gather gather_kernel() noexcept {  // (no AVX2 copy: AVX2 has no compress)
    static const Gather gather = FASTSHARD_PICK(gather_avx512f, gather_scalar, gather_scalar);
    return gather;
}

}  // namespace

#ifdef FASTSHARD_MULTIVERSION
SimdLevel simd_level() noexcept {
    static const SimdLevel level = capped_simd_level();
    return level;
}
#endif

// One copy per instruction set where the toolchain can compile them (GCC/Clang on x86-64), picked
// once by cpuid: the portable wheel keeps the speed of AVX2/AVX-512.
void Feistel::encrypt_block(std::uint64_t* x, std::size_t count) const noexcept {
    encrypt_kernel()(x, count, rounds_, hi_bits_, lo_bits_, xor_keys_.data(), add_keys_.data());
}

void Feistel::decrypt_block(std::uint64_t* x, std::size_t count) const noexcept {
    decrypt_kernel()(x, count, rounds_, hi_bits_, lo_bits_, xor_keys_.data(), add_keys_.data());
}

void Feistel::apply(std::uint64_t* x, std::size_t count) const noexcept {
    if (!table_.empty()) {
        for (std::size_t i = 0; i < count; ++i) x[i] = table_[static_cast<std::size_t>(x[i])];
        return;
    }
    walk_cycles(x, count, n_, domain(), [this](std::uint64_t* v, std::size_t m) { encrypt_block(v, m); });
}

void Feistel::invert(std::uint64_t* x, std::size_t count) const noexcept {
    if (!inverse_.empty()) {
        for (std::size_t i = 0; i < count; ++i) x[i] = inverse_[static_cast<std::size_t>(x[i])];
        return;
    }
    walk_cycles(x, count, n_, domain(), [this](std::uint64_t* v, std::size_t m) { decrypt_block(v, m); });
}

}  // namespace fastshard
