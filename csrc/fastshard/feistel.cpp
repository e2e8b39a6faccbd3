#include "fastshard/feistel.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "fastshard/mix.hpp"

namespace fastshard {

namespace {

constexpr std::uint32_t low_mask(unsigned bits) noexcept {
    return bits >= 32 ? 0xffffffffU : (std::uint32_t{1} << bits) - 1U;
}

unsigned bit_width(std::uint64_t v) noexcept {
    unsigned w = 0;
    while (v != 0) {
        ++w;
        v >>= 1;
    }
    return w;
}

#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(FASTSHARD_NO_CLONES) && !defined(__SANITIZE_ADDRESS__)
#define FASTSHARD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FASTSHARD_CLONES
#endif

// Lanes per block: enough independent work for the compiler to vectorise the rounds.
constexpr std::size_t kBlock = 64;

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

// The rounds over lanes held as halves a (the one that is added to) and b. Always inlined, so
// that a caller passing the constant kRounds gets a fully specialised loop.
FASTSHARD_INLINE void run_rounds(std::uint32_t* a, std::uint32_t* b, std::size_t count, int rounds,
                                 std::uint32_t mask_a, std::uint32_t mask_b,
                                 const std::uint32_t* xor_keys, const std::uint32_t* add_keys) {
    for (int r = 0; r < rounds; ++r) {
        const std::uint32_t kx = xor_keys[r];
        const std::uint32_t ka = add_keys[r];
        for (std::size_t i = 0; i < count; ++i) {
            const std::uint32_t f = hash32(b[i] ^ kx) + ka;
            const std::uint32_t next_b = (a[i] + f) & mask_a;
            a[i] = b[i];
            b[i] = next_b;
        }
        std::swap(mask_a, mask_b);
    }
}

}  // namespace

// Compiled for several instruction sets where the toolchain can pick one at load time
// (GCC/Clang ifuncs on x86-64 ELF): the portable wheel keeps the speed of AVX2/AVX-512.
FASTSHARD_CLONES void Feistel::encrypt_block(std::uint64_t* x, std::size_t count) const noexcept {
    // Structure of arrays over the lanes, rounds outside: each round is one vectorisable loop.
    std::uint32_t a[kBlock];
    std::uint32_t b[kBlock];
    const std::uint32_t lo_mask = low_mask(lo_bits_);
    for (std::size_t i = 0; i < count; ++i) {
        a[i] = static_cast<std::uint32_t>(x[i] >> lo_bits_);
        b[i] = static_cast<std::uint32_t>(x[i]) & lo_mask;
    }
    const std::uint32_t hi_mask = low_mask(hi_bits_);
    if (rounds_ == kRounds) {  // the public order: a loop specialised for the constant
        run_rounds(a, b, count, kRounds, hi_mask, lo_mask, xor_keys_.data(), add_keys_.data());
    } else {
        run_rounds(a, b, count, rounds_, hi_mask, lo_mask, xor_keys_.data(), add_keys_.data());
    }
    // After an odd number of rounds the halves have traded widths: b is the wider one.
    const unsigned b_bits = rounds_ % 2 == 0 ? lo_bits_ : hi_bits_;
    for (std::size_t i = 0; i < count; ++i) x[i] = (std::uint64_t{a[i]} << b_bits) | b[i];
}

void Feistel::apply(std::uint64_t* x, std::size_t count) const noexcept {
    if (!table_.empty()) {
        for (std::size_t i = 0; i < count; ++i) x[i] = table_[static_cast<std::size_t>(x[i])];
        return;
    }
    // Cycle walking: values that leave [0, n) are encrypted again until they return. The
    // cycle of each value under the network contains it (in range), so this ends, after < 2
    // steps on average. Out-of-range lanes are compacted and walked together, vectorised.
    std::uint64_t pending[kBlock];
    std::uint32_t lane[kBlock];
    for (std::size_t start = 0; start < count; start += kBlock) {
        const std::size_t m = std::min(kBlock, count - start);
        std::uint64_t* block = x + start;
        encrypt_block(block, m);
        std::size_t left = 0;
        for (std::size_t i = 0; i < m; ++i) {
            pending[left] = block[i];
            lane[left] = static_cast<std::uint32_t>(i);
            left += block[i] >= n_ ? 1 : 0;
        }
        while (left != 0) {
            encrypt_block(pending, left);
            std::size_t still = 0;
            for (std::size_t i = 0; i < left; ++i) {
                block[lane[i]] = pending[i];
                pending[still] = pending[i];
                lane[still] = lane[i];
                still += pending[i] >= n_ ? 1 : 0;
            }
            left = still;
        }
    }
}

}  // namespace fastshard
