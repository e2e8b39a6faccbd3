// Sharded streams: an epoch's global item sequence over shard files that are read front to back.
//
// The items are the rows of S shards (sizes s_0 .. s_{S-1}, N rows in all), read through a
// user function that yields rows [start, stop) of one shard in order. An epoch's sequence is
// built in three steps, none of which depends on the number of ranks or of DataLoader workers:
//
//   1. Chunks and their order. Each shard is cut into chunks of at most `chunk_rows` rows (0:
//      one chunk per non-empty shard); the chunks are put in a keyed order (a Feistel
//      permutation of the chunk indices, per seed and epoch) and concatenated: the epoch's
//      *stream*, N rows long.
//   2. Lanes. The stream is cut into L contiguous stretches, one per lane: lane l has
//      floor(N/L) rows, one more for l < N mod L, and is the sigma(l)-th stretch of the stream,
//      sigma a keyed permutation of [0, L) per seed and epoch (a Feistel network; the identity
//      when not shuffled). Lane l is the stream range [start(l), start(l) + length(l)). The
//      global sequence interleaves the lanes round robin: position p is row q = p div L of lane
//      p mod L. A reader that owns a lane reads it front to back, so the lanes are the job's
//      concurrent sequential reads. Because of sigma, consecutive lanes (the lanes of one
//      global batch) lie anywhere in the stream rather than in one stretch of it, so a batch
//      holds about as many shards as a global shuffle would give it, with whole shards as
//      chunks.
//   3. Windows. Each lane's rows are taken in windows of `window` consecutive rows, and inside
//      a window in a keyed order: lane row q is stream row start(l) + w*window + pi(q mod window)
//      with w = q div window and pi a permutation of the window drawn per (seed, epoch, lane, w).
//      A reader holds one window per lane: the local shuffle.
//
// Memory: one 64-bit word per chunk (the stream end of each chunk in the epoch's order), one per
// shard (its first chunk) and one per long lane (below N mod L); the chunks of a shard are
// computed, not stored. Time: O(chunks + L log L) per epoch to build, O(log chunks) per segment
// lookup, O(log L) per lane start.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fastshard/feistel.hpp"

namespace fastshard {

constexpr std::uint64_t kStreamDomain = 0x5354524d;  // "STRM"

// What does not depend on the epoch: the shards and their chunks (immutable).
class StreamLayout {
  public:
    // sizes: rows per shard (each < 2^63, summing to < 2^63); chunk_rows 0: whole shards.
    // std::invalid_argument when the sum overflows.
    StreamLayout(const std::int64_t* sizes, std::uint64_t shards, std::uint64_t chunk_rows);

    std::uint64_t rows() const noexcept { return rows_; }
    std::uint64_t shards() const noexcept { return sizes_.size(); }
    std::uint64_t chunks() const noexcept { return chunk_first_.back(); }
    std::uint64_t chunk_rows() const noexcept { return chunk_rows_; }
    std::uint64_t shard_size(std::uint64_t s) const noexcept { return sizes_[s]; }

    struct Chunk {
        std::uint64_t shard, row_lo, row_hi;
    };
    // Chunk c < chunks(): its shard and row range.
    Chunk chunk(std::uint64_t c) const noexcept;

    // Calls f(size) for every chunk in index order (a sequential walk, no lookups).
    template <class F>
    void each_chunk_size(F&& f) const {
        for (std::uint64_t s = 0; s < sizes_.size(); ++s) {
            const std::uint64_t n = sizes_[s];
            if (chunk_rows_ == 0) {
                if (n > 0) f(n);
                continue;
            }
            for (std::uint64_t lo = 0; lo < n; lo += chunk_rows_) f(n - lo < chunk_rows_ ? n - lo : chunk_rows_);
        }
    }

  private:
    std::vector<std::uint64_t> sizes_;
    std::vector<std::uint64_t> chunk_first_;  // shards + 1 entries: chunks before shard s
    std::uint64_t chunk_rows_;
    std::uint64_t rows_ = 0;
};

// A read of one shard: rows [row_lo, row_hi).
struct StreamSegment {
    std::uint64_t shard, row_lo, row_hi;
};

// One epoch's stream, lanes and windows (immutable, safe to share between threads).
class StreamEpoch {
  public:
    // lanes >= 1, window >= 1. shuffle=false: chunks in shard order and no window shuffle.
    StreamEpoch(std::shared_ptr<const StreamLayout> layout, std::uint64_t seed, std::uint64_t epoch,
                bool shuffle, std::uint64_t lanes, std::uint64_t window);

    std::uint64_t rows() const noexcept { return layout_->rows(); }
    std::uint64_t lanes() const noexcept { return lanes_; }
    std::uint64_t window() const noexcept { return window_; }

    // Lane l < lanes(): its first stream row and its length.
    std::uint64_t lane_start(std::uint64_t l) const;
    std::uint64_t lane_length(std::uint64_t l) const noexcept;

    // The reads that cover stream rows [lo, hi) (hi <= rows()), in stream order; appended.
    void segments(std::uint64_t lo, std::uint64_t hi, std::vector<StreamSegment>& out) const;

    // Window w of lane l: out[u] = the window offset of the lane's row w*window + u, for u below
    // the window's length (window, or what is left of the lane). Appended.
    void window_order(std::uint64_t l, std::uint64_t w, std::vector<std::uint64_t>& out) const;

    // Where position p < rows() of the global sequence is read: lane p mod lanes, and in it
    // window w and the window's u-th row in lane order (lane row q = p div lanes = w*window + u).
    struct Place {
        std::uint64_t lane, window, u;
    };
    Place place(std::uint64_t p) const noexcept {
        const std::uint64_t q = p / lanes_;
        return {p % lanes_, q / window_, q % window_};
    }

    // Position p < rows() of the global sequence: its stream row, shard and row in the shard.
    struct Item {
        std::uint64_t stream_row, shard, row;
    };
    Item locate(std::uint64_t p) const;

  private:
    std::shared_ptr<const StreamLayout> layout_;
    Feistel order_;       // stream index -> chunk index (identity when not shuffled)
    Feistel lane_order_;  // sigma: lane -> its stretch of the stream (identity when not shuffled)
    bool shuffle_;
    std::uint64_t lanes_, window_, window_key_;
    std::vector<std::uint64_t> ends_;   // ends_[i]: stream end of the i-th chunk of the order
    std::vector<std::uint64_t> longs_;  // sorted sigma(l) of the long lanes (l < N mod L)
};

}  // namespace fastshard
