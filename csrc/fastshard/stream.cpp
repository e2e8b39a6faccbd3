#include "fastshard/stream.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "fastshard/mix.hpp"

namespace fastshard {

StreamLayout::StreamLayout(const std::int64_t* sizes, std::uint64_t shards, std::uint64_t chunk_rows)
    : chunk_rows_(chunk_rows) {
    constexpr std::uint64_t kMax = 0x7fffffffffffffffULL;
    sizes_.resize(shards);
    chunk_first_.resize(shards + 1);
    std::uint64_t chunks = 0;
    for (std::uint64_t s = 0; s < shards; ++s) {
        if (sizes[s] < 0) throw std::invalid_argument("shard sizes must be >= 0");
        const auto n = static_cast<std::uint64_t>(sizes[s]);
        if (n > kMax - rows_) throw std::invalid_argument("the shard sizes sum to more than 2**63 - 1");
        sizes_[s] = n;
        rows_ += n;
        chunk_first_[s] = chunks;
        chunks += chunk_rows == 0 ? (n > 0) : n / chunk_rows + (n % chunk_rows != 0);
    }
    chunk_first_[shards] = chunks;
}

StreamLayout::Chunk StreamLayout::chunk(std::uint64_t c) const noexcept {
    // The last shard whose first chunk is <= c: empty shards before it share its first chunk.
    const auto it = std::upper_bound(chunk_first_.begin(), chunk_first_.end() - 1, c);
    const auto s = static_cast<std::uint64_t>(it - chunk_first_.begin()) - 1;
    if (chunk_rows_ == 0) return {s, 0, sizes_[s]};
    const std::uint64_t lo = (c - chunk_first_[s]) * chunk_rows_;
    return {s, lo, std::min(sizes_[s], lo + chunk_rows_)};
}

StreamEpoch::StreamEpoch(std::shared_ptr<const StreamLayout> layout, std::uint64_t seed,
                         std::uint64_t epoch, bool shuffle, std::uint64_t lanes, std::uint64_t window)
    : layout_(std::move(layout)),
      order_(shuffle ? Feistel(layout_->chunks(), derive_key(kStreamDomain, layout_->chunks(), seed, epoch))
                     : Feistel(0, 0)),
      lane_order_(shuffle ? Feistel(lanes, derive_key(kStreamDomain + 2, lanes, seed, epoch)) : Feistel(0, 0)),
      shuffle_(shuffle),
      lanes_(lanes),
      window_(window),
      window_key_(derive_key(kStreamDomain + 1, layout_->rows(), seed, epoch)) {
    if (lanes == 0) throw std::invalid_argument("lanes must be >= 1");
    if (window == 0) throw std::invalid_argument("window must be >= 1");
    // Each chunk's size goes to its place in the order: walk the chunks in index order (no
    // lookups) and send each to its stream index through the inverse permutation, in blocks.
    const std::uint64_t chunks = layout_->chunks();
    ends_.assign(chunks, 0);
    constexpr std::size_t kBlock = 1024;
    std::uint64_t ids[kBlock], sizes[kBlock];
    std::size_t count = 0;
    std::uint64_t next = 0;
    auto flush = [&] {
        if (shuffle_) order_.invert(ids, count);
        for (std::size_t i = 0; i < count; ++i) ends_[ids[i]] = sizes[i];
        count = 0;
    };
    layout_->each_chunk_size([&](std::uint64_t size) {
        ids[count] = next++;
        sizes[count] = size;
        if (++count == kBlock) flush();
    });
    flush();
    std::uint64_t sum = 0;
    for (auto& e : ends_) e = sum += e;
    // The stretches of the long lanes, in stream order: a lane starts after the stretches that
    // precede its own, of which those of long lanes are one row longer.
    if (shuffle_) {
        longs_.resize(rows() % lanes_);
        for (std::uint64_t l = 0; l < longs_.size(); ++l) longs_[l] = l;
        lane_order_.apply(longs_.data(), longs_.size());
        std::sort(longs_.begin(), longs_.end());
    }
}

std::uint64_t StreamEpoch::lane_start(std::uint64_t l) const {
    const std::uint64_t m = rows() / lanes_;
    if (!shuffle_) return l * m + std::min(l, rows() % lanes_);
    const std::uint64_t j = lane_order_(l);
    return j * m + static_cast<std::uint64_t>(std::lower_bound(longs_.begin(), longs_.end(), j) - longs_.begin());
}

std::uint64_t StreamEpoch::lane_length(std::uint64_t l) const noexcept {
    const std::uint64_t n = rows();
    return n / lanes_ + (l < n % lanes_ ? 1 : 0);
}

void StreamEpoch::segments(std::uint64_t lo, std::uint64_t hi, std::vector<StreamSegment>& out) const {
    if (hi > rows() || lo > hi) throw std::out_of_range("stream range outside [0, rows)");
    // The first chunk of the order that ends after lo.
    auto i = static_cast<std::uint64_t>(std::upper_bound(ends_.begin(), ends_.end(), lo) - ends_.begin());
    std::uint64_t at = lo;
    while (at < hi) {
        const std::uint64_t begin = i == 0 ? 0 : ends_[i - 1];
        const std::uint64_t end = ends_[i];
        const std::uint64_t c = shuffle_ ? order_(i) : i;
        const StreamLayout::Chunk ch = layout_->chunk(c);
        const std::uint64_t stop = std::min(end, hi);
        out.push_back({ch.shard, ch.row_lo + (at - begin), ch.row_lo + (stop - begin)});
        at = stop;
        ++i;
    }
}

void StreamEpoch::window_order(std::uint64_t l, std::uint64_t w, std::vector<std::uint64_t>& out) const {
    const std::uint64_t length = lane_length(l);
    if (w * window_ >= length) throw std::out_of_range("window outside the lane");
    const std::uint64_t m = std::min(window_, length - w * window_);
    const std::size_t base = out.size();
    out.resize(base + m);
    for (std::uint64_t u = 0; u < m; ++u) out[base + u] = u;
    if (!shuffle_ || m < 2) return;
    const Feistel pi(m, mix64(mix64(window_key_ ^ l) + w * kGolden));
    pi.apply(out.data() + base, static_cast<std::size_t>(m));
}

StreamEpoch::Item StreamEpoch::locate(std::uint64_t p) const {
    if (p >= rows()) throw std::out_of_range("position outside [0, rows)");
    const Place at = place(p);
    std::vector<std::uint64_t> order;
    window_order(at.lane, at.window, order);
    const std::uint64_t row = lane_start(at.lane) + at.window * window_ + order[at.u];
    std::vector<StreamSegment> seg;
    segments(row, row + 1, seg);
    return {row, seg[0].shard, seg[0].row_lo};
}

}  // namespace fastshard
