// The fill loop shared by the two maps of a mixture (fixed weights per epoch, and the streams
// of a schedule): a rank's draws staged by window, each window's slots through its keyed
// interleave and each draw appended to its dataset's group, then each dataset's draws through
// its permutations on long arrays and scattered to their places.
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
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "fastshard/feistel.hpp"
#include "fastshard/mixture.hpp"
#include "fastshard/plan.hpp"

namespace fastshard {
namespace detail {

// Draws staged per round of a fill, at most: several windows' worth when a rank takes few
// draws of each, so that each dataset's permutation runs on long arrays. At 6:3:1 the
// datasets' networks took 46 instructions a draw in rounds of 1024, 41 in rounds of 4096;
// longer rounds save little more and their groups outgrow L2 (bench/RESULTS.md, issue 30).
constexpr std::size_t kChunk = 4096;
// Each dataset has room for a whole round (k rounds of words in all); with many datasets the
// rounds shrink to keep that near this many words, down to kMinRound draws.
constexpr std::size_t kGroupWords = 16384;
constexpr std::size_t kMinRound = 64;
// Up to this many datasets, a slot's dataset is found by counting (see dataset_of).
constexpr std::size_t kLinearK = 8;
// A round's buffers up to this many words live in the cursor (on the stack): short fills
// (random access, small slices) allocate nothing for them.
constexpr std::size_t kLocalWords = 512;

// The grouping's per-draw step, inlined at each of its three calls: GCC otherwise kept the
// tail's call out of line (and with it the loop's codegen changed: +1 instruction a draw).
#if defined(__GNUC__)
#define FASTSHARD_FILL_INLINE __attribute__((always_inline))
#else
#define FASTSHARD_FILL_INLINE
#endif

// Per-call working state of a fill: the current window, the datasets' permutations, and the
// round's draws grouped by dataset. Local to one fill call, so threads never share it.
struct MixtureCursor {
    MixtureCursor(std::size_t k, std::size_t round)
        : lo(k), hi(k), prefix(k + 1), base(k), shift(k), key(k), delta(k), one_order(k), inner(k),
          inner_key(k, 0), round(round), next(k), run_start(k), run_key(k, 0) {
        // slots (round words) and pos (k rounds) in one block, at (k rounds) in another.
        std::uint64_t* words = local_words;
        at = local_at;
        if (round + k * round > kLocalWords) {
            heap_words.reset(new std::uint64_t[round + k * round]);  // not value-initialised:
            heap_at.reset(new std::uint32_t[k * round]);             // written before read
            words = heap_words.get();
            at = heap_at.get();
        }
        slots = words;
        pos = words + round;
        for (std::size_t c = 0; c < k; ++c) next[c] = run_start[c] = c * round;
    }
    MixtureCursor(const MixtureCursor&) = delete;
    MixtureCursor& operator=(const MixtureCursor&) = delete;

    std::vector<std::uint64_t> lo, hi, prefix;  // ordinals at the window's ends, window prefix
    std::uint64_t window = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t begin = 0, end = 0;    // the window's draws [begin, end)
    std::optional<Feistel> interleave;   // the window's keyed permutation of its slots
    // Per dataset in the window: ordinal = slot + base; and when all its ordinals here walk
    // one permutation (one_order), position = ordinal - shift = slot + delta in the
    // permutation of `key`.
    std::vector<std::uint64_t> base, shift, key, delta;  // delta = base - shift
    std::vector<char> one_order;
    bool all_one_order = false;
    // Per dataset: the latest permutation built, and its key.
    std::vector<std::optional<Feistel>> inner;
    std::vector<std::uint64_t> inner_key;
    // The round: a segment's slots, then each dataset's draws in pos[c * round, next[c])
    // (positions in its permutations) and at[...] (their places in the round). The draws
    // [run_start[c], next[c]) still wait for the permutation of run_key[c]; those before
    // it are permuted already.
    std::size_t round;
    std::uint64_t* slots;
    std::uint64_t* pos;
    std::uint32_t* at;
    std::vector<std::size_t> next, run_start;
    std::vector<std::uint64_t> run_key;
    std::uint64_t local_words[kLocalWords];
    std::uint32_t local_at[kLocalWords];
    std::unique_ptr<std::uint64_t[]> heap_words;
    std::unique_ptr<std::uint32_t[]> heap_at;
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

    const std::size_t round = static_cast<std::size_t>(
        std::min<std::uint64_t>(count, std::min(kChunk, std::max(kMinRound, kGroupWords / k))));
    MixtureCursor cur(k, round);
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
        cur.interleave.emplace(cur.end - cur.begin, s.window_key(m), kMixWindowTableMax);
        cur.window = m;
    };

    // Dataset c's draws waiting for the permutation of run_key[c] go through it.
    auto flush = [&](std::size_t c) {
        const std::size_t a = cur.run_start[c], b = cur.next[c];
        if (a == b) return;
        const std::uint64_t key = cur.run_key[c];
        if (!cur.inner[c] || cur.inner_key[c] != key) {
            cur.inner[c].emplace(sizes[c], key);
            cur.inner_key[c] = key;
        }
        cur.inner[c]->apply(cur.pos + a, b - a);
        cur.run_start[c] = b;
    };
    // Dataset c's next draws walk the permutation of `key`.
    auto use_key = [&](std::size_t c, std::uint64_t key) {
        if (key == cur.run_key[c]) return;
        flush(c);
        cur.run_key[c] = key;
    };

    // A segment's draws (their slots in cur.slots[0, seg)) appended to their datasets' groups,
    // the first at place `at0` of the round. The dataset of a slot is the number of the
    // window's dataset boundaries at or below it: counted without branches for a few datasets
    // (the datasets of neighbouring slots are random, so a search mispredicts), searched for
    // more. K > 0: exactly K datasets, their boundaries in registers; K = 0: up to kLinearK;
    // K = kLinearK + 1: any number.
    auto group = [&](std::size_t seg, std::uint32_t at0, auto dataset_count) {
        constexpr std::size_t K = decltype(dataset_count)::value;
        std::uint64_t bound[kLinearK + 1];
        static_cast<void>(bound);  // unused when searching
        if constexpr (K <= kLinearK) {
            for (std::size_t b = 1; b < k; ++b) bound[b] = cur.prefix[b];
        }
        auto dataset_of = [&](std::uint64_t slot) -> std::size_t {
            std::size_t c = 0;
            if constexpr (K <= kLinearK) {
                const std::size_t datasets = K == 0 ? k : K;  // a constant but for K = 0
                for (std::size_t b = 1; b < datasets; ++b) c += slot >= bound[b] ? 1U : 0U;
            } else {
                const auto first = cur.prefix.begin() + 1;
                c = static_cast<std::size_t>(std::upper_bound(first, cur.prefix.end(), slot) - first);
            }
            return c;  // K = 1: always 0
        };
        const std::uint64_t* slots = cur.slots;
        std::uint64_t* pos = cur.pos;
        std::uint32_t* at = cur.at;
        std::size_t* next = cur.next.data();
        const std::uint64_t* delta = cur.delta.data();
        if (cur.all_one_order) {  // the common case, without a branch per draw
            auto put = [&](std::size_t i) FASTSHARD_FILL_INLINE {
                const std::uint64_t slot = slots[i];
                const std::size_t c = dataset_of(slot);
                const std::size_t g = next[c]++;
                pos[g] = slot + delta[c];
                at[g] = at0 + static_cast<std::uint32_t>(i);
            };
            std::size_t i = 0;
            for (; i + 2 <= seg; i += 2) {  // unrolled: count, compare and jump were 3 of 17
                put(i);
                put(i + 1);
            }
            if (i < seg) put(i);
            return;
        }
        for (std::size_t i = 0; i < seg; ++i) {
            const std::uint64_t slot = slots[i];
            const std::size_t c = dataset_of(slot);
            std::uint64_t position = slot + cur.delta[c];
            if (!cur.one_order[c]) {
                std::uint64_t key = 0;
                s.locate(c, slot + cur.base[c], position, key);
                use_key(c, key);
            }
            const std::size_t g = next[c]++;
            pos[g] = position;
            at[g] = at0 + static_cast<std::uint32_t>(i);
        }
    };

    std::uint64_t done = 0;
    while (done < count) {
        // Stage the round window by window: each draw's slot, then its dataset's group.
        std::size_t len = 0;
        while (len < round && done + len < count) {
            const std::uint64_t pos = p.position(k0 + done + len);
            const std::uint64_t j = pos < n ? pos : s.wrap(pos);  // padding wraps
            if (!(cur.begin <= j && j < cur.end && cur.window != std::numeric_limits<std::uint64_t>::max()))
                load_window(s.window_of(j));
            const std::uint64_t in_window = (cur.end - j - 1) / w + 1;
            const std::uint64_t wanted = std::min(in_window, count - done - len);
            // A window's draws go through its interleave in one call: the next round takes
            // them whole unless they fill a round by themselves.
            if (len != 0 && wanted > round - len) break;
            const auto seg = static_cast<std::size_t>(std::min<std::uint64_t>(wanted, round - len));
            std::uint64_t* xs = cur.slots;
            // An induction from a local (the stores cannot change it), which compilers vectorise.
            std::uint64_t offset = j - cur.begin;
            for (std::size_t i = 0; i < seg; ++i, offset += w) xs[i] = offset;
            cur.interleave->apply(xs, seg);
            for (std::size_t c = 0; c < k; ++c) {
                if (cur.hi[c] != cur.lo[c] && cur.one_order[c]) use_key(c, cur.key[c]);
            }
            const auto at0 = static_cast<std::uint32_t>(len);
            switch (k) {
                case 1: group(seg, at0, std::integral_constant<std::size_t, 1>{}); break;
                case 2: group(seg, at0, std::integral_constant<std::size_t, 2>{}); break;
                case 3: group(seg, at0, std::integral_constant<std::size_t, 3>{}); break;
                case 4: group(seg, at0, std::integral_constant<std::size_t, 4>{}); break;
                default:
                    if (k <= kLinearK) {
                        group(seg, at0, std::integral_constant<std::size_t, 0>{});
                    } else {
                        group(seg, at0, std::integral_constant<std::size_t, kLinearK + 1>{});
                    }
            }
            len += seg;
        }

        // Each dataset's draws through its permutations, on long arrays, then to their places.
        std::int64_t* dst = out + done;
        for (std::size_t c = 0; c < k; ++c) {
            const std::size_t a = c * round, b = cur.next[c];
            if (a == b) continue;
            flush(c);
            const std::uint64_t offset = offsets[c];
            const std::uint64_t* pos = cur.pos;
            const std::uint32_t* at = cur.at;
            std::size_t g = a;
            for (; g + 4 <= b; g += 4) {  // unrolled: count, compare and jump were 3 of 8
                dst[at[g]] = static_cast<std::int64_t>(offset + pos[g]);
                dst[at[g + 1]] = static_cast<std::int64_t>(offset + pos[g + 1]);
                dst[at[g + 2]] = static_cast<std::int64_t>(offset + pos[g + 2]);
                dst[at[g + 3]] = static_cast<std::int64_t>(offset + pos[g + 3]);
            }
            for (; g < b; ++g) dst[at[g]] = static_cast<std::int64_t>(offset + pos[g]);
            cur.next[c] = cur.run_start[c] = a;
        }
        done += len;
    }
}

}  // namespace detail
}  // namespace fastshard

#undef FASTSHARD_FILL_INLINE
