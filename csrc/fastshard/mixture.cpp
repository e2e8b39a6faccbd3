#include "fastshard/mixture.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>

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
    if (windows_ >= 2 && draws / windows_ < min_window_)
        throw std::invalid_argument(
            "period=" + std::to_string(period) + " is too short for the smallest weight: its "
            "windows of " + std::to_string(draws / windows_) + " draws give that dataset a "
            "target below one draw per window, which rounding cannot keep monotone; use "
            "period >= " + std::to_string(min_window_ > kMaxLength / 2 ? kMaxLength : 2 * min_window_) +
            " (or leave period=None)");
    per_epoch_.assign(k, 0);
    std::vector<std::uint64_t> scratch;
    cumulative(draws_, per_epoch_.data(), scratch);
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
        for (std::size_t c = 0; c < k; ++c) {
            pass_keys_[c] = derive_key(kMixPassDomain, c, seed, epoch);
            cycle_keys_[c] = derive_key(kMixCycleDomain, c, seed, 0);  // a cycle spans epochs
        }
    }

  protected:
    void fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const override;

  private:
    std::shared_ptr<const MixtureSpec> spec_;
    std::uint64_t seed_;
    std::uint64_t epoch_;
    std::vector<std::uint64_t> pass_keys_;
    std::vector<std::uint64_t> cycle_keys_;
};

constexpr std::size_t kChunk = 512;
constexpr std::size_t kLanes = 64;

// Per-call working state of a fill: the current window and the datasets' permutations.
// Local to one fill_range call, so threads never share it.
struct MixtureCursor {
    std::vector<std::uint64_t> lo, hi, prefix, scratch;
    std::uint64_t window = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t begin = 0, end = 0;  // the window's draws [begin, end)
    std::optional<Feistel> slots;
    std::vector<std::optional<Feistel>> inner;
    std::vector<std::uint64_t> inner_key;
    std::vector<std::uint32_t> bucket;  // counting sort of a chunk by dataset
};

}  // namespace

void MixtureShard::fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const {
    if (count == 0) return;
    const MixtureSpec& s = *spec_;
    const Plan& p = plan();
    const std::size_t k = s.k();
    const std::uint64_t n = s.draws();
    const std::uint64_t w = p.num_replicas;
    const auto& sizes = s.sizes();
    const auto& offsets = s.offsets();
    const auto& per_epoch = s.per_epoch();

    MixtureCursor cur;
    cur.lo.resize(k);
    cur.hi.resize(k);
    cur.prefix.resize(k + 1);
    cur.inner.resize(k);
    cur.inner_key.assign(k, 0);
    cur.bucket.resize(k + 1);

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
        for (std::size_t c = 0; c < k; ++c) cur.prefix[c + 1] = cur.prefix[c] + (cur.hi[c] - cur.lo[c]);
        cur.slots.emplace(cur.end - cur.begin, derive_key(kMixWindowDomain, m, seed_, epoch_),
                          kMixWindowTableMax);
        cur.window = m;
    };

    std::uint64_t x[kChunk];
    std::uint32_t tag[kChunk];
    std::uint32_t order[kChunk];
    std::uint64_t lane[kLanes];
    std::uint32_t home[kLanes];

    std::uint64_t done = 0;
    while (done < count) {
        const std::uint64_t pos = p.position(k0 + done);
        const std::uint64_t j = pos < n ? pos : pos % n;  // padding wraps to the epoch's start
        const std::uint64_t m = s.window_of(j);
        if (m != cur.window) load_window(m);
        const std::uint64_t in_window = (cur.end - j - 1) / w + 1;
        const std::size_t len = static_cast<std::size_t>(
            std::min<std::uint64_t>({in_window, count - done, kChunk}));

        // Window offsets -> slots -> (dataset, the dataset's ordinal in the epoch).
        for (std::size_t i = 0; i < len; ++i) x[i] = j - cur.begin + i * w;
        cur.slots->apply(x, len);
        std::fill(cur.bucket.begin(), cur.bucket.end(), 0U);
        for (std::size_t i = 0; i < len; ++i) {
            const std::uint64_t slot = x[i];
            const auto c = static_cast<std::size_t>(
                std::upper_bound(cur.prefix.begin() + 1, cur.prefix.end(), slot) - (cur.prefix.begin() + 1));
            tag[i] = static_cast<std::uint32_t>(c);
            x[i] = cur.lo[c] + (slot - cur.prefix[c]);
            ++cur.bucket[c + 1];
        }
        // Group the chunk by dataset (stable), so each dataset's permutation runs on full lanes.
        for (std::size_t c = 0; c < k; ++c) cur.bucket[c + 1] += cur.bucket[c];
        for (std::size_t i = 0; i < len; ++i) order[cur.bucket[tag[i]]++] = static_cast<std::uint32_t>(i);

        std::int64_t* dst = out + done;
        std::size_t g = 0;
        while (g < len) {
            const std::size_t c = tag[order[g]];
            const std::uint64_t size = sizes[c];
            const std::uint64_t d = per_epoch[c];
            const std::uint64_t full = d / size * size;  // draws in whole passes
            std::size_t lanes = 0;
            std::uint64_t key = 0;
            auto flush = [&] {
                if (lanes == 0) return;
                if (!cur.inner[c] || cur.inner_key[c] != key) {
                    cur.inner[c].emplace(size, key);
                    cur.inner_key[c] = key;
                }
                cur.inner[c]->apply(lane, lanes);
                for (std::size_t i = 0; i < lanes; ++i)
                    dst[home[i]] = static_cast<std::int64_t>(offsets[c] + lane[i]);
                lanes = 0;
            };
            // The permutation's counter: a pass (< 2^63) or, for the partial pass, the cycle
            // with the top bit set; its key is derived only when it changes.
            constexpr std::uint64_t kCycleBit = std::uint64_t{1} << 63;
            std::uint64_t counter = 0;
            bool keyed = false;
            for (; g < len && tag[order[g]] == c; ++g) {
                const std::uint32_t i = order[g];
                const std::uint64_t o = x[i];
                std::uint64_t pos_in = 0;
                std::uint64_t this_counter = 0;
                if (o < full) {
                    const std::uint64_t pass = o / size;
                    pos_in = o - pass * size;
                    this_counter = pass;
                } else {
                    const std::uint64_t r = d - full;  // 0 < r < size here
                    const std::uint64_t cycle_len = size / r;
                    pos_in = (epoch_ % cycle_len) * r + (o - full);
                    this_counter = kCycleBit;
                }
                if (!keyed || this_counter != counter) {
                    if (lanes != 0) flush();
                    counter = this_counter;
                    keyed = true;
                    if (counter == kCycleBit) {
                        key = sub_key(cycle_keys_[c], epoch_ / (size / (d - full)));
                    } else {
                        key = sub_key(pass_keys_[c], counter);
                    }
                } else if (lanes == kLanes) {
                    flush();
                }
                lane[lanes] = pos_in;
                home[lanes] = i;
                ++lanes;
            }
            flush();
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
