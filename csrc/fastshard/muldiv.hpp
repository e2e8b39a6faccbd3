// Exact 64x64/64 arithmetic shared by the mixtures' window and count computations.
#pragma once

#include <cstdint>

#include "fastshard/mix.hpp"

namespace fastshard {

struct QuotRem {
    std::uint64_t quot;
    std::uint64_t rem;
};

// floor(a b / d) and (a b) mod d, exact, for d > 0 and a quotient below 2^64.
inline QuotRem muldiv(std::uint64_t a, std::uint64_t b, std::uint64_t d) noexcept {
#if defined(__SIZEOF_INT128__)
    __extension__ typedef unsigned __int128 u128;  // __extension__: no -pedantic warning
    const u128 p = static_cast<u128>(a) * b;
    return {static_cast<std::uint64_t>(p / d), static_cast<std::uint64_t>(p % d)};
#else
    // The 128-bit product, then long division one bit at a time (high word < d by the
    // precondition on the quotient).
    const std::uint64_t hi = mulhi64(a, b);
    const std::uint64_t lo = a * b;
    std::uint64_t q = 0;
    std::uint64_t r = hi;
    for (int i = 63; i >= 0; --i) {
        const bool carry = (r >> 63) != 0;
        r = (r << 1) | ((lo >> i) & 1U);
        q <<= 1;
        if (carry || r >= d) {
            r -= d;
            q |= 1U;
        }
    }
    return {q, r};
#endif
}

}  // namespace fastshard
