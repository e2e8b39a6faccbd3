#include "fastshard/block.hpp"

#include <algorithm>
#include <stdexcept>

#include "fastshard/mix.hpp"

namespace fastshard {

namespace {

constexpr std::uint64_t kMaxLength = 0x7fffffffffffffffULL;

// Unbiased draw from [0, bound), 1 <= bound (Lemire's multiply-shift with rejection).
std::uint64_t draw_below(SplitMix64& stream, std::uint64_t bound) noexcept {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        const std::uint64_t x = stream.next();
        if (x * bound >= threshold) return mulhi64(x, bound);
    }
}

std::uint64_t layout_key(std::uint64_t key, std::uint64_t block) noexcept {
    return mix64(key ^ mix64(block ^ 0x243f6a8885a308d3ULL));
}

Feistel block_permutation(std::uint64_t n, std::uint64_t block, bool shuffle, std::uint64_t key) {
    if (!shuffle) return Feistel(0, 0);
    SplitMix64 stream(layout_key(key, block));
    return Feistel(n / block, stream.next());
}

// The chunk order of the latest chunk this thread read: a run of reads stays in one chunk, so
// its permutation (a table of up to 1024 words) is built once per chunk, not once per read.
const Feistel& window_perm(std::uint64_t len, std::uint64_t key) {
    struct Cache {
        std::uint64_t len = 0;
        std::uint64_t key = 0;
        std::unique_ptr<Feistel> perm;
    };
    thread_local Cache cache;
    if (!cache.perm || cache.len != len || cache.key != key) {
        cache.perm = std::make_unique<Feistel>(len, key);
        cache.len = len;
        cache.key = key;
    }
    return *cache.perm;
}

struct Tails {
    std::uint64_t hi = 0;     // tail length of chunks i < rem
    std::uint64_t lo = 0;     // of chunks i >= rem
    std::uint64_t total = 0;  // |T|
    std::uint64_t end = 0;    // G position after the round
};

// Requires a round that check_block_resume accepted (no overflow).
Tails tails_of(const BlockResume& r) noexcept {
    const BlockRound& d = r.round;
    Tails t;
    t.hi = d.size + 1 > d.offset ? d.size + 1 - d.offset : 0;
    t.lo = d.size > d.offset ? d.size - d.offset : 0;
    t.total = d.rem * t.hi + (d.chunks - d.rem) * t.lo;
    t.end = r.cursor + d.chunks * d.size + d.rem;
    return t;
}

}  // namespace

void check_block_resume(std::uint64_t n, std::uint64_t chunk, const BlockResume& r) {
    if (r.cursor > kMaxLength) throw std::invalid_argument("cursor must be in [0, 2**63 - 1]");
    const BlockRound& d = r.round;
    if (d.chunks == 0) return;
    if (d.rem >= d.chunks) throw std::invalid_argument("round rem must be < chunks");
    if (d.size + (d.rem > 0 ? 1 : 0) > chunk)
        throw std::invalid_argument("round chunks must be at most block_size * window long");
    if (r.cursor > n) throw std::invalid_argument("a round must start at a cursor <= n");
    const std::uint64_t room = n - r.cursor;
    if (d.size != 0 && d.chunks > room / d.size)
        throw std::invalid_argument("the round does not fit in the epoch");
    if (d.rem > room - d.chunks * d.size) throw std::invalid_argument("the round does not fit in the epoch");
    if (d.offset > d.size + 1) throw std::invalid_argument("round offset must be <= size + 1");
    if (d.taken > tails_of(r).total)
        throw std::invalid_argument("round taken must be <= the items the round has left");
}

BlockResume normalize_block_resume(std::uint64_t n, BlockResume r) noexcept {
    if (r.round.chunks == 0) return BlockResume{r.cursor, BlockRound{}};
    const Tails t = tails_of(r);
    if (r.round.taken >= t.total) {
        // Everything of the round is consumed, and `extra` positions of G after it.
        const std::uint64_t extra = r.round.taken - t.total;
        const std::uint64_t left = n > t.end ? n - t.end : 0;
        return BlockResume{extra >= left ? std::max(n, t.end) : t.end + extra, BlockRound{}};
    }
    if (r.round.offset == 0 && r.round.taken == 0) return BlockResume{r.cursor, BlockRound{}};
    return r;
}

// -- the layout -------------------------------------------------------------------------------
BlockLayout::BlockLayout(std::uint64_t n, std::uint64_t block, bool shuffle, std::uint64_t key)
    : n_(n),
      block_(block),
      full_(n / block),
      short_len_(n % block),
      short_start_(full_ * block),
      shuffle_(shuffle),
      perm_(block_permutation(n, block, shuffle, key)) {
    if (shuffle_ && short_len_ != 0) {
        // The short block's slot among the full_ + 1: drawn after the permutation's key.
        SplitMix64 stream(layout_key(key, block));
        stream.next();
        short_start_ = draw_below(stream, full_ + 1) * block_;
    }
}

void BlockLayout::items(std::uint64_t* x, std::size_t count) const noexcept {
    if (!shuffle_) return;  // blocks in order: position p holds item p
    constexpr std::size_t kPart = 256;
    std::uint64_t offset[kPart];
    bool in_short[kPart];
    const std::uint64_t short_end = short_start_ + short_len_;
    for (std::size_t start = 0; start < count; start += kPart) {
        const std::size_t m = std::min(kPart, count - start);
        std::uint64_t* slot = x + start;
        for (std::size_t i = 0; i < m; ++i) {
            std::uint64_t p = slot[i];
            in_short[i] = p >= short_start_ && p < short_end;
            if (in_short[i]) {
                offset[i] = p - short_start_;
                slot[i] = 0;
                continue;
            }
            if (p >= short_end) p -= short_len_;  // full blocks after the short one
            slot[i] = p / block_;
            offset[i] = p % block_;
        }
        if (full_ != 0) perm_.apply(slot, m);  // no full blocks: every position is in the short one
        for (std::size_t i = 0; i < m; ++i)
            slot[i] = in_short[i] ? full_ * block_ + offset[i] : slot[i] * block_ + offset[i];
    }
}

// -- the shard --------------------------------------------------------------------------------
BlockShard::Geometry BlockShard::geometry(std::uint64_t n, std::uint64_t num_replicas,
                                          std::uint64_t rank, bool drop_last, bool pad,
                                          std::uint64_t chunk, const BlockResume& resume) {
    check_world(num_replicas, rank);
    if (chunk == 0) throw std::invalid_argument("block_size and window must be >= 1");
    check_block_resume(n, chunk, resume);
    Geometry g;
    g.n = n;
    g.num_replicas = num_replicas;
    g.rank = rank;
    g.chunk = chunk;
    g.drop_last = drop_last;
    g.pad = pad && !drop_last;
    g.resume = normalize_block_resume(n, resume);
    const std::uint64_t w = num_replicas;
    const BlockRound& d = g.resume.round;
    if (d.chunks != 0) {
        const Tails t = tails_of(g.resume);
        g.tail_hi = t.hi;
        g.tail_lo = t.lo;
        g.tails = t.total;
        g.round_end = t.end;
        g.own = d.chunks == w && d.taken == 0;
    } else {
        g.round_end = std::min(g.resume.cursor, n);
    }
    const std::uint64_t suffix = n - g.round_end;
    bool chunks_follow = true;
    if (g.own) {
        // Rank r finishes chunk r of the round; lengths as the round's plan had them.
        const std::uint64_t real = rank < d.rem ? g.tail_hi : g.tail_lo;
        if (g.drop_last) {
            g.head = g.tail_lo;
        } else if (g.pad) {
            g.head = d.rem > 0 ? g.tail_hi : g.tail_lo;
        } else {
            g.head = real;
        }
        g.rest = g.tails + suffix;
        g.start = g.round_end;
    } else {
        g.dealt_tails = g.tails - d.taken;
        g.rest = g.dealt_tails + suffix;
        g.steps = g.dealt_tails / w + (g.dealt_tails % w != 0 ? 1 : 0);
        if (g.steps * w >= g.rest) {
            // The stride-1 re-deal reaches the end: torch's plan over the rest.
            chunks_follow = false;
            if (g.drop_last) {
                g.head = g.rest / w;
            } else if (g.pad) {
                g.head = g.rest / w + (g.rest % w != 0 ? 1 : 0);
            } else {
                g.head = g.rest > rank ? (g.rest - rank - 1) / w + 1 : 0;
            }
            g.start = n;
        } else {
            g.head = g.steps;
            g.start = g.round_end + (g.steps * w - g.dealt_tails);
        }
    }
    const std::uint64_t left = chunks_follow && n > g.start ? n - g.start : 0;
    g.rounds = w > left / chunk ? 0 : left / (w * chunk);
    const std::uint64_t last = left - g.rounds * w * chunk;
    g.last_start = g.start + g.rounds * w * chunk;
    g.last_size = last / w;
    g.last_rem = g.drop_last ? 0 : last % w;
    if (g.drop_last) {
        g.last_len = g.last_size;
    } else if (g.pad) {
        g.last_len = g.last_size + (g.last_rem > 0 ? 1 : 0);
    } else {
        g.last_len = g.last_size + (rank < g.last_rem ? 1 : 0);
    }
    g.length = g.head + g.rounds * chunk + g.last_len;
    return g;
}

namespace {

Plan block_plan(std::uint64_t rest, std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank,
                bool drop_last, bool pad, std::uint64_t cursor, std::uint64_t length) {
    // Lengths are torch's for the `rest` items left: the same len() on every rank.
    Plan p = Plan::make(rest, num_replicas, rank, drop_last, pad, 0);
    if (p.num_samples != length) throw std::logic_error("block plan: length differs from torch's plan");
    p.n = n;
    p.cursor = cursor;
    return p;
}

// Chunk i of `size` positions, the first `rem` chunks one longer, from `base` on.
struct Piece {
    std::uint64_t start, len;
};
Piece piece(std::uint64_t base, std::uint64_t size, std::uint64_t rem, std::uint64_t i) noexcept {
    return {base + i * size + std::min(i, rem), size + (i < rem ? 1 : 0)};
}

}  // namespace

BlockShard::BlockShard(std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
                       bool pad, const BlockSpec& spec, const BlockResume& resume, std::uint64_t seed,
                       std::uint64_t epoch)
    : BlockShard(geometry(n, num_replicas, rank, drop_last, pad, spec.block * spec.window, resume), spec,
                 derive_key(kBlockDomain, n, seed, epoch)) {}

BlockShard::BlockShard(const Geometry& geo, const BlockSpec& spec, std::uint64_t key)
    : Shard(block_plan(geo.rest, geo.n, geo.num_replicas, geo.rank, geo.drop_last, geo.pad,
                       geo.resume.cursor, geo.length)),
      geo_(geo),
      spec_(spec),
      key_(key),
      layout_(geo.n, spec.block, spec.shuffle, key) {}

std::uint64_t BlockShard::window_key(std::uint64_t start, std::uint64_t len) const noexcept {
    return mix64(mix64(key_ ^ start) ^ (len * kGolden));
}

void BlockShard::window_positions(std::uint64_t start, std::uint64_t len, std::uint64_t u0,
                                  std::uint64_t count, std::uint64_t* x) const {
    for (std::uint64_t i = 0; i < count; ++i) x[i] = u0 + i;
    if (spec_.shuffle && len >= 2) window_perm(len, window_key(start, len)).apply(x, static_cast<std::size_t>(count));
    for (std::uint64_t i = 0; i < count; ++i) x[i] += start;
}

void BlockShard::chunk_positions(std::uint64_t start, std::uint64_t len, std::uint64_t u0,
                                 std::uint64_t count, std::uint64_t wrap, std::uint64_t* x) const {
    const std::uint64_t real = u0 < len ? std::min(count, len - u0) : 0;
    if (real != 0) window_positions(start, len, u0, real, x);
    if (real == count) return;
    // Padding: the plan repeats the chunk's first item, so the rank stays in its blocks; an
    // empty chunk wraps to the layout's start.
    std::uint64_t pad = 0;
    if (len != 0) {
        window_positions(start, len, 0, 1, &pad);
    } else {
        pad = wrap % geo_.n;
    }
    std::fill(x + real, x + count, pad);
}

std::uint64_t BlockShard::round_position(std::uint64_t i, std::uint64_t u) const {
    const BlockRound& d = geo_.resume.round;
    const Piece c = piece(geo_.resume.cursor, d.size, d.rem, i);
    std::uint64_t p = 0;
    window_positions(c.start, c.len, u, 1, &p);
    return p;
}

void BlockShard::head_positions(std::uint64_t k0, std::uint64_t count, std::uint64_t* x) const {
    const Geometry& g = geo_;
    const BlockRound& d = g.resume.round;
    if (g.own) {
        const Piece c = piece(g.resume.cursor, d.size, d.rem, g.rank);
        chunk_positions(c.start, c.len, d.offset + k0, count, g.rank - d.rem, x);
        return;
    }
    const std::uint64_t w = g.num_replicas;
    const std::uint64_t hi_total = d.rem * g.tail_hi;
    for (std::uint64_t k = 0; k < count; ++k) {
        const std::uint64_t at = g.rank + (k0 + k) * w;  // index in the rest R
        if (at < g.dealt_tails) {
            std::uint64_t j = d.taken + at;  // index in the tails T
            if (j < hi_total) {
                x[k] = round_position(j / g.tail_hi, d.offset + j % g.tail_hi);
            } else {
                j -= hi_total;
                x[k] = round_position(d.rem + j / g.tail_lo, d.offset + j % g.tail_lo);
            }
        } else if (at < g.rest) {
            x[k] = g.round_end + (at - g.dealt_tails);
        } else {
            x[k] = (at - g.rest) % g.n;  // padding wraps to the layout's start
        }
    }
}

void BlockShard::fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const {
    const Geometry& g = geo_;
    const std::uint64_t w = g.num_replicas;
    const std::uint64_t c = g.chunk;
    const std::uint64_t body_end = g.head + g.rounds * c;
    // int64 and uint64 may alias: layout positions are written in place, then mapped to
    // items there in one pass.
    auto* x = reinterpret_cast<std::uint64_t*>(out);
    std::uint64_t k = k0;
    const std::uint64_t end = k0 + count;
    while (k < end) {
        std::uint64_t m = 0;
        if (k < g.head) {
            m = std::min(end, g.head) - k;
            head_positions(k, m, x);
        } else if (k < body_end) {
            const std::uint64_t k2 = k - g.head;
            const std::uint64_t q = k2 / c;
            const std::uint64_t u = k2 % c;
            m = std::min(end - k, c - u);
            window_positions(g.start + (q * w + g.rank) * c, c, u, m, x);
        } else {
            // The last round's chunk; padded with pad=True on ranks >= last_rem.
            const Piece c = piece(g.last_start, g.last_size, g.last_rem, g.rank);
            m = end - k;
            chunk_positions(c.start, c.len, k - body_end, m, g.rank - g.last_rem, x);
        }
        k += m;
        x += m;
    }
    layout_.items(reinterpret_cast<std::uint64_t*>(out), static_cast<std::size_t>(count));
}

BlockResume BlockShard::resume_after(std::uint64_t k) const {
    const Geometry& g = geo_;
    if (k > g.length) throw std::out_of_range("k is past the shard's end");
    const std::uint64_t w = g.num_replicas;
    if (k <= g.head) {
        BlockResume r = g.resume;
        if (g.own) {
            r.round.offset += k;
        } else if (r.round.chunks != 0) {
            r.round.taken += k * w;
        }
        return normalize_block_resume(g.n, r);
    }
    const std::uint64_t k2 = k - g.head;
    BlockResume r;
    if (k2 < g.rounds * g.chunk) {
        r.cursor = g.start + (k2 / g.chunk) * w * g.chunk;
        r.round = BlockRound{w, g.chunk, 0, k2 % g.chunk, 0};
    } else {
        r.cursor = g.last_start;
        r.round = BlockRound{w, g.last_size, g.last_rem, k2 - g.rounds * g.chunk, 0};
    }
    return normalize_block_resume(g.n, r);
}

}  // namespace fastshard
