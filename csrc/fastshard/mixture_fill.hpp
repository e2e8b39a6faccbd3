// The fill loop shared by the two maps of a mixture (fixed weights per epoch, and the streams
// of a schedule): a rank's draws staged by window, each window's slots through its keyed
// interleave, then each dataset's draws through its permutations on long arrays.
//
// A source `Src` says what differs between the maps:
//   std::size_t k(); const std::vector<uint64>& sizes(), offsets(); uint64 draws();
//   uint64 wrap(uint64 pos): the epoch position that plan position pos >= draws() reads;
//   uint64 window_of(uint64 j);
//   void load_window(uint64 m, typename Src::Cache&, uint64& begin, uint64& end,
//                    std::vector<uint64>& lo, std::vector<uint64>& hi):
//       window m's draws [begin, end) of the epoch and each dataset's ordinal before and after it;
//   void locate(size_t c, uint64 o, uint64& pos, uint64& key): ordinal o of dataset c;
//   bool one_order(size_t c, uint64 lo, uint64 hi, uint64 shift): whether ordinals [lo, hi)
//       all walk the permutation of locate(c, lo) with position = ordinal - shift;
//   uint64 window_key(uint64 m).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "fastshard/feistel.hpp"
#include "fastshard/mixture.hpp"
#include "fastshard/plan.hpp"

namespace fastshard {
namespace detail {

// Draws staged per round of a fill: several windows' worth when a rank takes few draws of
// each, so that each dataset's permutation runs on long arrays.
constexpr std::size_t kChunk = 1024;
// Up to this many datasets, a slot's dataset is found by counting (see dataset_of).
constexpr std::size_t kLinearK = 8;
// Up to this many datasets, a chunk is grouped by one scan per dataset; above, by a counting sort.
constexpr std::size_t kScanK = 4;

// Per-call working state of a fill: the current window and the datasets' permutations.
// Local to one fill call, so threads never share it.
struct MixtureCursor {
    explicit MixtureCursor(std::size_t k)
        : lo(k), hi(k), prefix(k + 1), base(k), shift(k), key(k), delta(k), one_order(k), inner(k),
          inner_key(k, 0), bucket(k + 1), mixed(k), chunk_key_set(k), chunk_key(k) {}

    std::vector<std::uint64_t> lo, hi, prefix;  // ordinals at the window's ends, window prefix
    std::uint64_t window = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t begin = 0, end = 0;  // the window's draws [begin, end)
    std::optional<Feistel> slots;      // the window's interleave
    // Per dataset in the window: ordinal = slot + base; and when all its ordinals here walk
    // one permutation (one_order), position = ordinal - shift = slot + delta in the
    // permutation of `key`.
    std::vector<std::uint64_t> base, shift, key, delta;  // delta = base - shift
    std::vector<char> one_order;
    bool all_one_order = false;
    // Per dataset: the latest permutation built, and its key.
    std::vector<std::optional<Feistel>> inner;
    std::vector<std::uint64_t> inner_key;
    std::vector<std::uint32_t> bucket;  // counting sort of a chunk by dataset
    // Per dataset in the current chunk: whether its draws need more than one permutation,
    // else the one key they share.
    std::vector<char> mixed, chunk_key_set;
    std::vector<std::uint64_t> chunk_key;
};

template <class Src>
void mixture_fill(const Src& s, const Plan& p, std::uint64_t k0, std::uint64_t count,
                  std::int64_t* out) {
    if (count == 0) return;
    const std::size_t k = s.k();
    const std::uint64_t n = s.draws();
    const std::uint64_t w = p.num_replicas;
    const auto& sizes = s.sizes();
    const auto& offsets = s.offsets();

    MixtureCursor cur(k);
    typename Src::Cache cache;
    auto load_window = [&](std::uint64_t m) {
        s.load_window(m, cache, cur.begin, cur.end, cur.lo, cur.hi);
        cur.prefix[0] = 0;
        bool all_one_order = true;
        for (std::size_t c = 0; c < k; ++c) {
            const std::uint64_t lo = cur.lo[c], hi = cur.hi[c];
            cur.prefix[c + 1] = cur.prefix[c] + (hi - lo);
            cur.base[c] = lo - cur.prefix[c];  // mod 2^64
            cur.one_order[c] = 0;
            if (hi == lo) continue;
            std::uint64_t pos = 0;
            s.locate(c, lo, pos, cur.key[c]);
            cur.shift[c] = lo - pos;  // mod 2^64
            cur.delta[c] = cur.base[c] - cur.shift[c];
            cur.one_order[c] = s.one_order(c, lo, hi, cur.shift[c]) ? 1 : 0;
            all_one_order = all_one_order && cur.one_order[c] != 0;
        }
        cur.all_one_order = all_one_order;
        cur.slots.emplace(cur.end - cur.begin, s.window_key(m), kMixWindowTableMax);
        cur.window = m;
    };

    // The dataset of a window's slot: the number of the window's dataset boundaries at or
    // below it. Counted without branches for a few datasets (the datasets of neighbouring
    // slots are random, so a search mispredicts); searched for more. `Linear` is decided
    // once per segment, outside the loops over its draws.
    auto dataset_of = [&](std::uint64_t slot, auto linear) -> std::uint32_t {
        if constexpr (decltype(linear)::value) {
            std::uint32_t c = 0;
            for (std::size_t b = 1; b < k; ++b) c += slot >= cur.prefix[b] ? 1U : 0U;
            return c;
        } else {
            return static_cast<std::uint32_t>(
                std::upper_bound(cur.prefix.begin() + 1, cur.prefix.end(), slot) - (cur.prefix.begin() + 1));
        }
    };

    std::uint64_t x[kChunk];     // window offset -> slot -> position in its permutation
    std::uint64_t keys[kChunk];  // the key of each draw's permutation
    std::uint32_t tag[kChunk];   // each draw's dataset
    std::uint32_t order[kChunk];
    std::uint64_t gathered[kChunk];

    // One dataset's draws of the chunk, listed in members[0, m) with their positions in
    // gathered[0, m): permuted run by run of equal keys (one run, unless a pass ends in the
    // chunk), then scattered to their places.
    auto permute = [&](std::size_t c, const std::uint32_t* members, std::uint64_t* positions,
                       std::size_t m, std::int64_t* dst) {
        std::size_t a = 0;
        while (a < m) {
            const std::uint64_t key = keys[members[a]];
            std::size_t b = a + 1;
            if (!cur.mixed[c]) {
                b = m;
            } else {
                while (b < m && keys[members[b]] == key) ++b;
            }
            if (!cur.inner[c] || cur.inner_key[c] != key) {
                cur.inner[c].emplace(sizes[c], key);
                cur.inner_key[c] = key;
            }
            cur.inner[c]->apply(positions + a, b - a);
            a = b;
        }
        const std::uint64_t offset = offsets[c];
        for (std::size_t g = 0; g < m; ++g) dst[members[g]] = static_cast<std::int64_t>(offset + positions[g]);
    };

    std::uint64_t done = 0;
    while (done < count) {
        // Stage the chunk window by window: each draw's dataset, position and key.
        std::size_t len = 0;
        std::fill(cur.mixed.begin(), cur.mixed.end(), 0);
        std::fill(cur.chunk_key_set.begin(), cur.chunk_key_set.end(), 0);
        while (len < kChunk && done + len < count) {
            const std::uint64_t pos = p.position(k0 + done + len);
            const std::uint64_t j = pos < n ? pos : s.wrap(pos);  // padding wraps
            if (!(cur.begin <= j && j < cur.end && cur.window != std::numeric_limits<std::uint64_t>::max()))
                load_window(s.window_of(j));
            const std::uint64_t in_window = (cur.end - j - 1) / w + 1;
            const std::size_t seg = static_cast<std::size_t>(
                std::min<std::uint64_t>({in_window, count - done - len, kChunk - len}));
            std::uint64_t* xs = x + len;
            for (std::size_t i = 0; i < seg; ++i) xs[i] = j - cur.begin + i * w;
            cur.slots->apply(xs, seg);
            // Each draw's dataset, and its position in the permutation of its key.
            auto place = [&](auto linear) {
                if (cur.all_one_order) {  // the common case, without a branch per draw
                    for (std::size_t i = 0; i < seg; ++i) {
                        const std::uint32_t c = dataset_of(xs[i], linear);
                        tag[len + i] = c;
                        xs[i] += cur.delta[c];
                        keys[len + i] = cur.key[c];
                    }
                    return;
                }
                for (std::size_t i = 0; i < seg; ++i) {
                    const std::uint32_t c = dataset_of(xs[i], linear);
                    tag[len + i] = c;
                    if (cur.one_order[c]) {
                        xs[i] += cur.delta[c];
                        keys[len + i] = cur.key[c];
                    } else {
                        s.locate(c, xs[i] + cur.base[c], xs[i], keys[len + i]);
                    }
                }
            };
            if (k <= kLinearK) {
                place(std::true_type{});
            } else {
                place(std::false_type{});
            }
            // A dataset whose draws in this chunk all walk one permutation needs no search
            // for runs of equal keys later.
            for (std::size_t c = 0; c < k; ++c) {
                if (cur.hi[c] == cur.lo[c]) continue;
                if (!cur.one_order[c] || (cur.chunk_key_set[c] && cur.chunk_key[c] != cur.key[c])) {
                    cur.mixed[c] = 1;
                } else if (!cur.chunk_key_set[c]) {
                    cur.chunk_key_set[c] = 1;
                    cur.chunk_key[c] = cur.key[c];
                }
            }
            len += seg;
        }

        // Each dataset's draws through its permutations, on long arrays.
        std::int64_t* dst = out + done;
        if (k <= kScanK) {
            // A few datasets: one scan per dataset gathers its draws without branches (a
            // counting sort's increments of one counter would wait on each other).
            for (std::size_t c = 0; c < k; ++c) {
                std::size_t m = 0;
                for (std::size_t i = 0; i < len; ++i) {
                    order[m] = static_cast<std::uint32_t>(i);
                    gathered[m] = x[i];
                    m += tag[i] == c ? 1 : 0;
                }
                if (m != 0) permute(c, order, gathered, m, dst);
            }
        } else {
            // Counting sort of the chunk by dataset (stable), positions moved along.
            std::fill(cur.bucket.begin(), cur.bucket.end(), 0U);
            for (std::size_t i = 0; i < len; ++i) ++cur.bucket[tag[i] + 1];
            for (std::size_t c = 0; c < k; ++c) cur.bucket[c + 1] += cur.bucket[c];
            for (std::size_t i = 0; i < len; ++i) {
                const std::uint32_t at = cur.bucket[tag[i]]++;
                order[at] = static_cast<std::uint32_t>(i);
                gathered[at] = x[i];
            }
            std::size_t g = 0;
            while (g < len) {
                const std::size_t c = tag[order[g]];
                const std::size_t e = cur.bucket[c];  // the end of c's run after the placement
                permute(c, order + g, gathered + g, e - g, dst);
                g = e;
            }
        }
        done += len;
    }
}

}  // namespace detail
}  // namespace fastshard
