// Bit mixers and key derivation. Part of the public order contract: changing any
// constant here changes every "feistel" order and requires a new order name.
#pragma once

#include <cstdint>

#if defined(_MSC_VER) && !defined(__SIZEOF_INT128__) && (defined(_M_X64) || defined(_M_ARM64))
#include <intrin.h>  // __umulh
#endif

namespace fastshard {

// SplitMix64 finalizer (Stafford's Mix13): a bijection of 64-bit words with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

// hash32 after its first step (x ^= x >> 16).
constexpr std::uint32_t hash32_tail(std::uint32_t x) noexcept {
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// "lowbias32" (C. Wellons' hash-prospector): a bijection of 32-bit words with near-ideal
// avalanche using only 32-bit multiplies, so it vectorises on every SIMD level.
constexpr std::uint32_t hash32(std::uint32_t x) noexcept { return hash32_tail(x ^ (x >> 16)); }

// High 64 bits of the 128-bit product a*b: maps a uniform 64-bit word to [0, b).
inline std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) noexcept {
#if defined(__SIZEOF_INT128__)
    __extension__ typedef unsigned __int128 u128;  // __extension__: no -pedantic warning
    return static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_ARM64))
    return __umulh(a, b);  // MSVC has no 128-bit integer type, but has the instruction
#else
    const std::uint64_t a_lo = a & 0xffffffffULL, a_hi = a >> 32;
    const std::uint64_t b_lo = b & 0xffffffffULL, b_hi = b >> 32;
    const std::uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi;
    const std::uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xffffffffULL) + lo_hi;
    return a_hi * b_hi + (hi_lo >> 32) + (cross >> 32);
#endif
}

// The number of bits needed to write v (0 for 0).
constexpr unsigned bit_width(std::uint64_t v) noexcept {
    unsigned w = 0;
    while (v != 0) {
        ++w;
        v >>= 1;
    }
    return w;
}

constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// The lengths checksum (scan_lengths, PackedSampler's guard): the wrapping sum over items of
// length_term(the value as a signed 64-bit word, its index), finished by length_checksum. A sum,
// so any split of the items into parts gives the same checksum.
constexpr std::uint64_t length_term(std::uint64_t bits, std::uint64_t index) noexcept {
    return mix64(bits + index * kGolden);
}
constexpr std::uint64_t length_checksum(std::uint64_t sum, std::uint64_t n) noexcept { return mix64(sum ^ n); }

// A counter-based stream of 64-bit words from one key (SplitMix64).
class SplitMix64 {
  public:
    explicit constexpr SplitMix64(std::uint64_t key) noexcept : state_(key) {}
    constexpr std::uint64_t next() noexcept {
        state_ += kGolden;
        return mix64(state_);
    }
    // Unbiased draw from [0, bound) for 1 <= bound < 2^32: Lemire's multiply-shift with
    // rejection, on 32-bit halves so it needs no 128-bit integers.
    constexpr std::uint32_t below(std::uint32_t bound) noexcept {
        const std::uint64_t threshold = (std::uint64_t{1} << 32) % bound;
        for (;;) {
            const std::uint64_t m = (next() >> 32) * bound;
            if ((m & 0xffffffffULL) >= threshold) return static_cast<std::uint32_t>(m >> 32);
        }
    }

  private:
    std::uint64_t state_;
};

// Derives the key of one epoch's order. Each input passes through a full 64-bit mix, so
// neighbouring seeds, epochs and lengths give unrelated keys; `domain` separates the uses
// of one (seed, epoch) by different orders.
constexpr std::uint64_t derive_key(std::uint64_t domain, std::uint64_t n, std::uint64_t seed,
                                   std::uint64_t epoch) noexcept {
    std::uint64_t h = mix64(domain ^ 0x6a09e667f3bcc908ULL);
    h = mix64(h ^ seed);
    h = mix64(h ^ epoch);
    h = mix64(h ^ n);
    return h;
}

}  // namespace fastshard
