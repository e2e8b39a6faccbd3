// The "block" order: random blocks of consecutive items, dealt whole, read locally.
//
// The epoch's layout G is the items grouped in blocks of B consecutive indices (the last
// block may be short), laid out one block after another in a keyed random order. G does not
// depend on the number of ranks. Ranks take G in chunks ("windows") of C = K*B consecutive
// positions, dealt round-robin: in round q rank r takes the chunk at g + (q*W + r)*C. Within a
// chunk the positions are shuffled by a keyed bijection keyed by the chunk's place in G (its
// start and length), so a rank's K*B consecutive items come from at most two chunks, i.e.
// from at most 2K + 2 blocks. The last round splits what is left evenly: rank r takes
// m/W or m/W + 1 consecutive positions, so lengths are torch's (ceil(n/W), or n/W with
// drop_last) and padding repeats fewer than W items; with pad=False every item comes once and
// lengths differ by at most one.
//
// A resume point is the G position `cursor` before which everything is consumed, except for
// one interrupted round: P chunks starting at `cursor`, chunk i holding size + (i < rem)
// positions, of which every chunk's first `offset` (in its shuffled order) are consumed, and
// `taken` more of their concatenated tails T (consumed by a re-deal, see below). Everything
// from the round's end on is unconsumed. This is O(1) and describes every state any plan
// below can reach, so any rank's state restores every rank:
//   - resumed on W == P ranks with taken == 0, rank r finishes its own chunk r, then deals G
//     from the round's end: exactly the uninterrupted run;
//   - otherwise the rest R = T[taken:] ++ G[round end:] is re-dealt: first
//     A = ceil(|T[taken:]| / W) steps with stride 1 (rank r takes R[r + k*W], so at every step
//     the consumed part is a prefix of R: the state stays the same shape), then chunks of G
//     from where that ends. Every unconsumed item is dealt exactly once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fastshard/feistel.hpp"
#include "fastshard/plan.hpp"
#include "fastshard/shard.hpp"

namespace fastshard {

// Domain separator of the block order's keys (versioned with the order).
constexpr std::uint64_t kBlockDomain = 3;

struct BlockRound {
    std::uint64_t chunks = 0;  // P; 0: no interrupted round
    std::uint64_t size = 0;    // chunk i has size + (i < rem) positions
    std::uint64_t rem = 0;
    std::uint64_t offset = 0;  // items of each chunk consumed (in the chunk's shuffled order)
    std::uint64_t taken = 0;   // items of the tails' concatenation consumed after that
};

struct BlockResume {
    std::uint64_t cursor = 0;
    BlockRound round{};

    bool operator==(const BlockResume& o) const noexcept {
        return cursor == o.cursor && round.chunks == o.round.chunks && round.size == o.round.size &&
               round.rem == o.round.rem && round.offset == o.round.offset && round.taken == o.round.taken;
    }
};

// Throws std::invalid_argument unless `r` is a resume point of an epoch of n items with
// chunks of at most `chunk` positions.
void check_block_resume(std::uint64_t n, std::uint64_t chunk, const BlockResume& r);

// The canonical form of a valid resume point: a round with nothing consumed is dropped, one
// with everything consumed becomes the cursor after it. Same consumed set.
BlockResume normalize_block_resume(std::uint64_t n, BlockResume r) noexcept;

// Layout positions [0, n) -> items. Blocks are laid out in a keyed random order: the n / B
// full blocks permuted by the Feistel order, the short block (if any) inserted at a keyed
// uniform slot among them, which makes the order of all blocks uniform too and keeps every
// position computable in O(1). Unshuffled: the identity.
class BlockLayout {
  public:
    BlockLayout(std::uint64_t n, std::uint64_t block, bool shuffle, std::uint64_t key);

    std::uint64_t size() const noexcept { return n_; }
    // Maps each x[i] (a layout position < n) to its item, in place.
    void items(std::uint64_t* x, std::size_t count) const noexcept;

  private:
    std::uint64_t n_;
    std::uint64_t block_;
    std::uint64_t full_;         // blocks of B items
    std::uint64_t short_len_;    // items of the short block (0: none)
    std::uint64_t short_start_;  // its layout position
    bool shuffle_;
    Feistel perm_;  // of the full blocks
};

struct BlockSpec {
    std::uint64_t block = 1;   // B >= 1
    std::uint64_t window = 1;  // K >= 1, B*K < 2^63
    bool shuffle = true;
};

class BlockShard final : public Shard {
  public:
    // Requires n < 2^63, 1 <= num_replicas < 2^63, rank < num_replicas and a resume point that
    // check_block_resume accepts.
    BlockShard(std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
               bool pad, const BlockSpec& spec, const BlockResume& resume, std::uint64_t seed,
               std::uint64_t epoch);

    // The state after every rank consumed its first k items (k <= size()): the same on every
    // rank, except with pad=False once this rank's shorter shard ran out.
    BlockResume resume_after(std::uint64_t k) const;

    const BlockResume& resume() const noexcept { return geo_.resume; }

    // How this rank's items are laid out (for tests and benchmarks).
    std::uint64_t head_length() const noexcept { return geo_.head; }

  protected:
    void fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const override;

  private:
    struct Geometry {
        std::uint64_t n = 0, num_replicas = 1, rank = 0, chunk = 1;
        bool drop_last = false, pad = true;
        BlockResume resume{};
        // the interrupted round
        std::uint64_t tail_hi = 0, tail_lo = 0;  // tail lengths of chunks i < rem and i >= rem
        std::uint64_t tails = 0;                 // |T|
        std::uint64_t round_end = 0;             // G position after the round
        bool own = false;                        // each rank finishes its own chunk
        // the head: the rest of the round (own) or the stride-1 re-deal (not own)
        std::uint64_t dealt_tails = 0;  // |T| - taken
        std::uint64_t rest = 0;         // real items left in the epoch
        std::uint64_t steps = 0;        // A: steps of the stride-1 re-deal
        std::uint64_t head = 0;         // this rank's items before the chunks
        // the chunks: Q full rounds from `start`, then the last round
        std::uint64_t start = 0, rounds = 0;
        std::uint64_t last_start = 0, last_size = 0, last_rem = 0, last_len = 0;
        std::uint64_t length = 0;
    };
    static Geometry geometry(std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank,
                             bool drop_last, bool pad, std::uint64_t chunk, const BlockResume& resume);
    BlockShard(const Geometry& geo, const BlockSpec& spec, std::uint64_t key);

    std::uint64_t window_key(std::uint64_t start, std::uint64_t len) const noexcept;
    // x[i] = layout position of the chunk [start, start + len)'s shuffled position u0 + i
    // (u0 + count <= len).
    void window_positions(std::uint64_t start, std::uint64_t len, std::uint64_t u0, std::uint64_t count,
                          std::uint64_t* x) const;
    // window_positions for u0 + i < len; past the chunk's end (padding) its first position
    // again, or (wrap mod n) for an empty chunk.
    void chunk_positions(std::uint64_t start, std::uint64_t len, std::uint64_t u0, std::uint64_t count,
                         std::uint64_t wrap, std::uint64_t* x) const;
    // The layout position of the interrupted round's chunk i, shuffled position u.
    std::uint64_t round_position(std::uint64_t i, std::uint64_t u) const;
    void head_positions(std::uint64_t k0, std::uint64_t count, std::uint64_t* x) const;

    Geometry geo_;
    BlockSpec spec_;
    std::uint64_t key_;
    BlockLayout layout_;
};

}  // namespace fastshard
