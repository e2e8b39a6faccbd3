#include "fastshard/mixture.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "fastshard/feistel.hpp"
#include "fastshard/mix.hpp"
#include "fastshard/shard.hpp"

namespace fastshard {

namespace {

constexpr std::uint64_t kMaxLength = 0x7fffffffffffffffULL;

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

std::string item(const char* name, std::size_t c) {
    return std::string(name) + "[" + std::to_string(c) + "]";
}

// The default period: 1024, unless the smallest share needs longer windows for monotone
// counts. Windows are at least period / 2 long once there are two of them, so twice the
// minimum always works.
constexpr std::uint64_t kDefaultPeriod = 1024;

}  // namespace

MixtureSpec::MixtureSpec(std::vector<std::uint64_t> sizes, std::vector<std::uint64_t> units,
                         std::uint64_t draws, std::uint64_t period)
    : sizes_(std::move(sizes)), units_(std::move(units)), draws_(draws) {
    const std::size_t k = sizes_.size();
    if (k == 0) throw std::invalid_argument("sizes must not be empty");
    if (units_.size() != k)
        throw std::invalid_argument("weights must have one entry per dataset: " +
                                    std::to_string(units_.size()) + " weights for " +
                                    std::to_string(k) + " sizes");
    offsets_.assign(k + 1, 0);
    std::uint64_t total = 0;
    std::uint64_t smallest = 0;
    for (std::size_t c = 0; c < k; ++c) {
        if (sizes_[c] > kMaxLength - offsets_[c])
            throw std::invalid_argument("sizes must add up to less than 2**63");
        offsets_[c + 1] = offsets_[c] + sizes_[c];
        if (units_[c] > std::numeric_limits<std::uint64_t>::max() - total)
            throw std::invalid_argument("weights' integer units must add up to less than 2**64");
        total += units_[c];
        if (units_[c] != 0 && sizes_[c] == 0)
            throw std::invalid_argument(item("weights", c) + " is positive but dataset " +
                                        std::to_string(c) + " is empty (sizes[" +
                                        std::to_string(c) + "] = 0)");
        if (units_[c] != 0 && (smallest == 0 || units_[c] < smallest)) smallest = units_[c];
    }
    if (total == 0) throw std::invalid_argument("weights are all zero; one must be positive");
    unit_total_ = total;
    if (draws == 0 || draws > kMaxLength)
        throw std::invalid_argument("num_samples must be in [1, 2**63 - 1]");
    min_window_ = total / smallest + (total % smallest != 0 ? 1 : 0);
    if (period == 0) {
        period = min_window_ <= kDefaultPeriod / 2 ? kDefaultPeriod
                 : min_window_ > kMaxLength / 2   ? kMaxLength
                                                  : 2 * min_window_;
    }
    period_ = period;
    windows_ = draws / period + (draws % period != 0 ? 1 : 0);
    if (!period_fits(period)) {
        // Whether a period fits is monotone in the period (fewer, longer windows), so the
        // smallest one that fits is found by bisection; `draws` itself (one window) fits.
        std::uint64_t lo = period + 1, hi = draws;
        while (lo < hi) {
            const std::uint64_t mid = lo + (hi - lo) / 2;
            if (period_fits(mid)) hi = mid; else lo = mid + 1;
        }
        throw std::invalid_argument(
            "period=" + std::to_string(period) + " is too short for the smallest weight: its "
            "windows of " + std::to_string(draws / windows_) + " draws give that dataset a "
            "target below one draw per window, which rounding cannot keep monotone; the "
            "smallest period that works for these weights and num_samples is " +
            std::to_string(lo) + " (or leave period=None)");
    }
    per_epoch_.assign(k, 0);
    std::vector<std::uint64_t> scratch;
    cumulative(draws_, per_epoch_.data(), scratch);
}

bool MixtureSpec::period_fits(std::uint64_t period) const noexcept {
    const std::uint64_t windows = draws_ / period + (draws_ % period != 0 ? 1 : 0);
    return windows < 2 || draws_ / windows >= min_window_;
}

std::uint64_t MixtureSpec::boundary(std::uint64_t m) const noexcept {
    return muldiv(m, draws_, windows_).quot;
}

std::uint64_t MixtureSpec::window_of(std::uint64_t j) const noexcept {
    // The largest m with floor(m N / M) <= j, i.e. m N < (j + 1) M.
    const QuotRem t = muldiv(j + 1, windows_, draws_);
    return t.rem == 0 ? t.quot - 1 : t.quot;
}

void MixtureSpec::cumulative(std::uint64_t t, std::uint64_t* out,
                             std::vector<std::uint64_t>& scratch) const {
    const std::size_t k = sizes_.size();
    scratch.resize(2 * k);
    std::uint64_t* rem = scratch.data();
    std::uint64_t* order = scratch.data() + k;
    std::uint64_t assigned = 0;
    for (std::size_t c = 0; c < k; ++c) {
        const QuotRem x = muldiv(t, units_[c], unit_total_);
        out[c] = x.quot;
        rem[c] = x.rem;
        assigned += x.quot;
    }
    // 0 <= R < k: the remainders add up to R U and each is below U.
    const std::uint64_t extra = t - assigned;
    if (extra == 0) return;
    std::iota(order, order + k, std::uint64_t{0});
    auto larger = [rem](std::uint64_t a, std::uint64_t b) {
        return rem[a] != rem[b] ? rem[a] > rem[b] : a < b;
    };
    std::nth_element(order, order + extra, order + k, larger);
    for (std::uint64_t i = 0; i < extra; ++i) ++out[order[i]];
}

namespace {

// A keyed permutation per (seed, epoch, window, pass or cycle): one more full mix of a
// base key with the counter.
constexpr std::uint64_t sub_key(std::uint64_t base, std::uint64_t v) noexcept {
    return mix64(base ^ mix64(v + kGolden));
}

class MixtureShard final : public Shard {
  public:
    MixtureShard(const Plan& plan, std::shared_ptr<const MixtureSpec> spec, std::uint64_t seed,
                 std::uint64_t epoch)
        : Shard(plan), spec_(std::move(spec)), seed_(seed), epoch_(epoch) {
        const std::size_t k = spec_->k();
        pass_keys_.resize(k);
        cycle_keys_.resize(k);
        full_.resize(k);
        for (std::size_t c = 0; c < k; ++c) {
            const std::uint64_t size = spec_->sizes()[c];
            full_[c] = size == 0 ? 0 : spec_->per_epoch()[c] / size * size;
            pass_keys_[c] = derive_key(kMixPassDomain, c, seed, epoch);
            cycle_keys_[c] = derive_key(kMixCycleDomain, c, seed, 0);  // a cycle spans epochs
        }
    }

  protected:
    void fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const override;

  private:
    void locate(std::size_t c, std::uint64_t o, std::uint64_t& pos, std::uint64_t& key) const noexcept;

    std::shared_ptr<const MixtureSpec> spec_;
    std::uint64_t seed_;
    std::uint64_t epoch_;
    std::vector<std::uint64_t> pass_keys_;
    std::vector<std::uint64_t> cycle_keys_;
    std::vector<std::uint64_t> full_;  // per dataset: the epoch's draws in whole passes
};

// Draws staged per round of a fill: several windows' worth when a rank takes few draws of
// each, so that each dataset's permutation runs on long arrays.
constexpr std::size_t kChunk = 1024;
// Up to this many datasets, a slot's dataset is found by counting (see dataset_of).
constexpr std::size_t kLinearK = 8;
// Up to this many datasets, a chunk is grouped by one scan per dataset; above, by a counting sort.
constexpr std::size_t kScanK = 4;

// Per-call working state of a fill: the current window and the datasets' permutations.
// Local to one fill_range call, so threads never share it.
struct MixtureCursor {
    explicit MixtureCursor(std::size_t k)
        : lo(k), hi(k), prefix(k + 1), base(k), shift(k), key(k), delta(k), one_order(k), inner(k),
          inner_key(k, 0), bucket(k + 1), mixed(k), chunk_key_set(k), chunk_key(k) {}

    std::vector<std::uint64_t> lo, hi, prefix, scratch;  // C(begin), C(end), window prefix
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

}  // namespace

// Where ordinal o of dataset c lies: (position, key of the permutation).
inline void MixtureShard::locate(std::size_t c, std::uint64_t o, std::uint64_t& pos,
                                 std::uint64_t& key) const noexcept {
    const std::uint64_t size = spec_->sizes()[c];
    if (o < full_[c]) {
        const std::uint64_t pass = o / size;
        pos = o - pass * size;
        key = sub_key(pass_keys_[c], pass);
    } else {
        const std::uint64_t r = spec_->per_epoch()[c] - full_[c];  // 0 < r < size here
        const std::uint64_t cycle_len = size / r;
        pos = (epoch_ % cycle_len) * r + (o - full_[c]);
        key = sub_key(cycle_keys_[c], epoch_ / cycle_len);
    }
}

void MixtureShard::fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const {
    if (count == 0) return;
    const MixtureSpec& s = *spec_;
    const Plan& p = plan();
    const std::size_t k = s.k();
    const std::uint64_t n = s.draws();
    const std::uint64_t w = p.num_replicas;
    const auto& sizes = s.sizes();
    const auto& offsets = s.offsets();

    MixtureCursor cur(k);
    auto load_window = [&](std::uint64_t m) {
        if (cur.window != std::numeric_limits<std::uint64_t>::max() && m == cur.window + 1) {
            std::swap(cur.lo, cur.hi);
            cur.begin = cur.end;
        } else {
            cur.begin = s.boundary(m);
            s.cumulative(cur.begin, cur.lo.data(), cur.scratch);
        }
        cur.end = s.boundary(m + 1);
        s.cumulative(cur.end, cur.hi.data(), cur.scratch);
        cur.prefix[0] = 0;
        bool all_one_order = true;
        for (std::size_t c = 0; c < k; ++c) {
            const std::uint64_t lo = cur.lo[c], hi = cur.hi[c], size = sizes[c];
            cur.prefix[c + 1] = cur.prefix[c] + (hi - lo);
            cur.base[c] = lo - cur.prefix[c];  // mod 2^64
            // Whether all of c's ordinals here, [lo, hi), walk one permutation: the partial
            // pass always does (hi <= the epoch's draws); a whole pass when hi stays in it.
            // Then position = ordinal - shift, slot + delta.
            cur.one_order[c] = 0;
            if (hi == lo) continue;
            std::uint64_t pos = 0;
            locate(c, lo, pos, cur.key[c]);
            cur.shift[c] = lo - pos;  // mod 2^64
            cur.delta[c] = cur.base[c] - cur.shift[c];
            cur.one_order[c] = lo >= full_[c] || hi - cur.shift[c] <= size ? 1 : 0;
            all_one_order = all_one_order && cur.one_order[c] != 0;
        }
        cur.all_one_order = all_one_order;
        cur.slots.emplace(cur.end - cur.begin, derive_key(kMixWindowDomain, m, seed_, epoch_),
                          kMixWindowTableMax);
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
            const std::uint64_t j = pos < n ? pos : pos % n;  // padding wraps to the epoch's start
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
                        locate(c, xs[i] + cur.base[c], xs[i], keys[len + i]);
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

std::shared_ptr<const Shard> make_mixture_shard(const Plan& plan,
                                                std::shared_ptr<const MixtureSpec> spec,
                                                std::uint64_t seed, std::uint64_t epoch) {
    if (plan.n != spec->draws())
        throw std::invalid_argument("the plan's length must be the mixture's num_samples");
    return std::make_shared<MixtureShard>(plan, std::move(spec), seed, epoch);
}

}  // namespace fastshard
