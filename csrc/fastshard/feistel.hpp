// The "feistel" order: a keyed bijection of [0, n), evaluated per position in O(1).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastshard {

// P(i) for i in [0, n), n in [0, 2^63).
//
// n > kTableMax: an alternating unbalanced Feistel network over [0, 2^k), k = bit width of
// n - 1, followed by cycle walking (re-encrypting until the value falls in [0, n)). Since
// 2^(k-1) < n, the expected number of walks is below 2. The two halves have ceil(k/2) and
// floor(k/2) bits and trade places every round; each round adds (mod 2^width) a keyed hash
// of one half to the other. Addition rather than xor matters: a xor-Feistel over a
// power-of-two domain only ever produces even permutations, while an addition by an odd
// constant is an odd permutation, so parities are balanced.
//
// n <= kTableMax: the domain is too small for a Feistel network to reach every permutation
// with near-uniform probability in a handful of rounds, so the permutation is drawn by
// Fisher-Yates from a keyed SplitMix64 stream and kept as a table of at most kTableMax words.
class Feistel {
  public:
    static constexpr int kRounds = 8;
    static constexpr int kMaxRounds = 32;
    static constexpr std::uint64_t kTableMax = 1024;

    // `table_max` and `rounds` other than the defaults exist to study the bare network (small
    // domains, fewer rounds); the public order always uses kTableMax and kRounds. The keys of
    // round r do not depend on the number of rounds, so a network of r rounds is the first r
    // rounds of a longer one.
    Feistel(std::uint64_t n, std::uint64_t key, std::uint64_t table_max = kTableMax,
            int rounds = kRounds);

    std::uint64_t size() const noexcept { return n_; }

    // Maps each x[i] (all < n) to P(x[i]) in place.
    void apply(std::uint64_t* x, std::size_t count) const noexcept;

    // Maps each x[i] (all < n) to P^-1(x[i]) in place: the network decrypted, cycle walking the
    // other way round the same cycles. Lets a scan read items in index order and find each
    // one's position, instead of reading items at random positions.
    void invert(std::uint64_t* x, std::size_t count) const noexcept;

    std::uint64_t operator()(std::uint64_t i) const noexcept {
        apply(&i, 1);
        return i;
    }

  private:
    // One pass of the network over [0, 2^k), no cycle walking, on count <= 128 values (a block).
    void encrypt_block(std::uint64_t* x, std::size_t count) const noexcept;
    void decrypt_block(std::uint64_t* x, std::size_t count) const noexcept;
    // The network's domain [0, 2^k), k = hi_bits_ + lo_bits_.
    std::uint64_t domain() const noexcept { return std::uint64_t{1} << (hi_bits_ + lo_bits_); }

    std::uint64_t n_;
    unsigned hi_bits_ = 0;  // width of the high half at the start (ceil(k/2))
    unsigned lo_bits_ = 0;  // width of the low half at the start (floor(k/2))
    int rounds_ = kRounds;
    std::array<std::uint32_t, kMaxRounds> xor_keys_{};
    std::array<std::uint32_t, kMaxRounds> add_keys_{};
    std::vector<std::uint32_t> table_, inverse_;
};

}  // namespace fastshard
