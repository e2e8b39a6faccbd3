// An unsigned 128-bit integer: the compiler's where it has one (GCC, Clang), else a pair of
// 64-bit words with the operators the exact mixture schedules use (MSVC). Defining
// FASTSHARD_PORTABLE_U128 selects the portable one on any compiler, so that GCC builds can
// run the schedule tests against it (the CMake option FASTSHARD_PORTABLE_U128).
#pragma once

#include <cstdint>
#include <type_traits>

#include "fastshard/mix.hpp"

namespace fastshard {

#if defined(__SIZEOF_INT128__) && !defined(FASTSHARD_PORTABLE_U128)

__extension__ typedef unsigned __int128 u128;  // __extension__: no -pedantic warning

#else

class u128 {
  public:
    constexpr u128() noexcept = default;
    // Implicit from any built-in integer (non-negative where used), as the built-in type.
    template <class T, class = std::enable_if_t<std::is_integral<T>::value>>
    constexpr u128(T v) noexcept : lo_(static_cast<std::uint64_t>(v)) {}  // NOLINT
    constexpr u128(std::uint64_t hi, std::uint64_t lo, int) noexcept : hi_(hi), lo_(lo) {}

    explicit constexpr operator std::uint64_t() const noexcept { return lo_; }
    explicit constexpr operator bool() const noexcept { return (hi_ | lo_) != 0; }

    friend constexpr bool operator==(u128 a, u128 b) noexcept { return a.hi_ == b.hi_ && a.lo_ == b.lo_; }
    friend constexpr bool operator!=(u128 a, u128 b) noexcept { return !(a == b); }
    friend constexpr bool operator<(u128 a, u128 b) noexcept {
        return a.hi_ != b.hi_ ? a.hi_ < b.hi_ : a.lo_ < b.lo_;
    }
    friend constexpr bool operator>(u128 a, u128 b) noexcept { return b < a; }
    friend constexpr bool operator<=(u128 a, u128 b) noexcept { return !(b < a); }
    friend constexpr bool operator>=(u128 a, u128 b) noexcept { return !(a < b); }

    friend constexpr u128 operator+(u128 a, u128 b) noexcept {
        const std::uint64_t lo = a.lo_ + b.lo_;
        return {a.hi_ + b.hi_ + (lo < a.lo_ ? 1U : 0U), lo, 0};
    }
    friend constexpr u128 operator-(u128 a, u128 b) noexcept {
        return {a.hi_ - b.hi_ - (a.lo_ < b.lo_ ? 1U : 0U), a.lo_ - b.lo_, 0};
    }
    friend u128 operator*(u128 a, u128 b) noexcept {  // mod 2^128, as the built-in type
        return {mulhi64(a.lo_, b.lo_) + a.hi_ * b.lo_ + a.lo_ * b.hi_, a.lo_ * b.lo_, 0};
    }
    friend constexpr u128 operator<<(u128 a, unsigned s) noexcept {
        if (s == 0) return a;
        if (s >= 64) return {a.lo_ << (s - 64), 0, 0};
        return {(a.hi_ << s) | (a.lo_ >> (64 - s)), a.lo_ << s, 0};
    }
    friend constexpr u128 operator>>(u128 a, unsigned s) noexcept {
        if (s == 0) return a;
        if (s >= 64) return {0, a.hi_ >> (s - 64), 0};
        return {a.hi_ >> s, (a.lo_ >> s) | (a.hi_ << (64 - s)), 0};
    }
    friend u128 operator/(u128 a, u128 b) noexcept {
        u128 q, r;
        divmod(a, b, q, r);
        return q;
    }
    friend u128 operator%(u128 a, u128 b) noexcept {
        u128 q, r;
        divmod(a, b, q, r);
        return r;
    }

    u128& operator+=(u128 b) noexcept { return *this = *this + b; }
    u128& operator-=(u128 b) noexcept { return *this = *this - b; }
    u128& operator*=(u128 b) noexcept { return *this = *this * b; }

  private:
    // Shift-and-subtract long division, b > 0 (as the built-in type, b = 0 is undefined).
    static void divmod(u128 a, u128 b, u128& q, u128& r) noexcept {
        q = u128();
        r = u128();
        if (a.hi_ == 0 && b.hi_ == 0) {
            q.lo_ = a.lo_ / b.lo_;
            r.lo_ = a.lo_ % b.lo_;
            return;
        }
        for (int i = 127; i >= 0; --i) {
            const bool carry = (r.hi_ >> 63) != 0;  // r << 1 would pass 2^128: then r >= b
            r = r << 1;
            r.lo_ |= (i >= 64 ? a.hi_ >> (i - 64) : a.lo_ >> i) & 1U;
            if (carry || r >= b) {
                r -= b;
                if (i >= 64) q.hi_ |= std::uint64_t{1} << (i - 64);
                else q.lo_ |= std::uint64_t{1} << i;
            }
        }
    }

    std::uint64_t hi_ = 0, lo_ = 0;
};

#endif

}  // namespace fastshard
