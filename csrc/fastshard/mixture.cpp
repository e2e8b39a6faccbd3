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
#include "fastshard/mixture_fill.hpp"
#include "fastshard/muldiv.hpp"
#include "fastshard/schedule.hpp"
#include "fastshard/shard.hpp"

namespace fastshard {

namespace {

constexpr std::uint64_t kMaxLength = 0x7fffffffffffffffULL;

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
    split(t, out, scratch.data());
    round_up(t, out, scratch.data(), scratch.data() + k);
}

void MixtureSpec::split(std::uint64_t t, std::uint64_t* quot, std::uint64_t* rem) const noexcept {
    for (std::size_t c = 0; c < sizes_.size(); ++c) {
        const QuotRem x = muldiv(t, units_[c], unit_total_);
        quot[c] = x.quot;
        rem[c] = x.rem;
    }
}

void MixtureSpec::round_up(std::uint64_t t, std::uint64_t* counts, const std::uint64_t* rem,
                           std::uint64_t* order) const {
    const std::size_t k = sizes_.size();
    std::uint64_t assigned = 0;
    for (std::size_t c = 0; c < k; ++c) assigned += counts[c];
    // 0 <= R < k: the remainders add up to R U and each is below U.
    const std::uint64_t extra = t - assigned;
    if (extra == 0) return;
    std::iota(order, order + k, std::uint64_t{0});
    auto larger = [rem](std::uint64_t a, std::uint64_t b) {
        return rem[a] != rem[b] ? rem[a] > rem[b] : a < b;
    };
    std::nth_element(order, order + extra, order + k, larger);
    for (std::uint64_t i = 0; i < extra; ++i) ++counts[order[i]];
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

    void locate(std::size_t c, std::uint64_t o, std::uint64_t& pos, std::uint64_t& key) const noexcept;
    std::uint64_t full(std::size_t c) const noexcept { return full_[c]; }
    std::uint64_t seed() const noexcept { return seed_; }
    std::uint64_t epoch() const noexcept { return epoch_; }

  protected:
    void fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const override;

  private:

    std::shared_ptr<const MixtureSpec> spec_;
    std::uint64_t seed_;
    std::uint64_t epoch_;
    std::vector<std::uint64_t> pass_keys_;
    std::vector<std::uint64_t> cycle_keys_;
    std::vector<std::uint64_t> full_;  // per dataset: the epoch's draws in whole passes
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

namespace {

// The fixed-weight map as a source of the shared fill loop (mixture_fill.hpp).
struct LegacySource {
    const MixtureShard& shard;
    const MixtureSpec& s;
    // The window before, for the next one: its end boundary b = floor(m N / M) with
    // m N mod M, and the split of b (b u_c = quot U + rem). A window is floor(N / M) or
    // one more draws long, so the next boundary and split follow by additions, without the
    // 128-bit divisions of MixtureSpec::boundary and cumulative.
    struct Cache {
        std::uint64_t window = std::numeric_limits<std::uint64_t>::max();
        std::uint64_t bound_rem = 0;
        std::uint64_t step = 0, step_extra = 0;  // N = step M + step_extra
        // k words each, in one allocation (a fill of one draw pays for every one): quot, rem,
        // the selection's order, and the split of floor(N / M) in step_quot, step_rem.
        std::vector<std::uint64_t> words;
    };
    std::size_t k() const noexcept { return s.k(); }
    const std::vector<std::uint64_t>& sizes() const noexcept { return s.sizes(); }
    const std::vector<std::uint64_t>& offsets() const noexcept { return s.offsets(); }
    std::uint64_t draws() const noexcept { return s.draws(); }
    std::uint64_t wrap(std::uint64_t pos) const noexcept { return pos % s.draws(); }
    std::uint64_t window_of(std::uint64_t j) const noexcept { return s.window_of(j); }
    void load_window(std::uint64_t m, Cache& cache, std::uint64_t& begin, std::uint64_t& end,
                     std::vector<std::uint64_t>& lo, std::vector<std::uint64_t>& hi) const {
        const std::size_t k = s.k();
        const std::uint64_t n = s.draws(), windows = s.windows(), total = s.unit_total();
        const bool first = cache.words.empty();
        if (first) cache.words.resize(5 * k);
        std::uint64_t* quot = cache.words.data();
        std::uint64_t* rem = quot + k;
        std::uint64_t* order = rem + k;
        std::uint64_t* step_quot = order + k;
        std::uint64_t* step_rem = step_quot + k;
        if (first) {
            cache.step = n / windows;
            cache.step_extra = n % windows;
            s.split(cache.step, step_quot, step_rem);
        }
        if (cache.window != std::numeric_limits<std::uint64_t>::max() && m == cache.window + 1) {
            std::swap(lo, hi);
            begin = end;
        } else {
            const QuotRem b = muldiv(m, n, windows);
            begin = b.quot;
            cache.bound_rem = b.rem;
            s.split(begin, quot, rem);
            std::copy(quot, quot + k, lo.begin());
            s.round_up(begin, lo.data(), rem, order);
        }
        // (m + 1) N = m N + step M + step_extra, both remainders below M.
        const std::uint64_t r = cache.bound_rem + cache.step_extra;
        const bool carry = r >= windows;
        end = begin + cache.step + (carry ? 1 : 0);
        cache.bound_rem = carry ? r - windows : r;
        // The split of end from that of begin: + step u_c, then + u_c for a longer window;
        // each addend's remainder is below U (or is U: u_c = U), so one carry at most.
        auto add = [&](std::size_t c, std::uint64_t q, std::uint64_t rr) {
            if (rr >= total - rem[c]) {
                rem[c] -= total - rr;
                quot[c] += q + 1;
            } else {
                rem[c] += rr;
                quot[c] += q;
            }
        };
        for (std::size_t c = 0; c < k; ++c) add(c, step_quot[c], step_rem[c]);
        if (carry) {
            for (std::size_t c = 0; c < k; ++c) add(c, 0, s.units()[c]);
        }
        std::copy(quot, quot + k, hi.begin());
        s.round_up(end, hi.data(), rem, order);
        cache.window = m;
    }
    void locate(std::size_t c, std::uint64_t o, std::uint64_t& pos, std::uint64_t& key) const noexcept {
        shard.locate(c, o, pos, key);
    }
    // The partial pass always walks one permutation (hi <= the epoch's draws); a whole pass
    // when hi stays in it.
    bool one_order(std::size_t c, std::uint64_t lo, std::uint64_t hi, std::uint64_t shift) const noexcept {
        return lo >= shard.full(c) || hi - shift <= s.sizes()[c];
    }
    std::uint64_t window_key(std::uint64_t m) const noexcept {
        return derive_key(kMixWindowDomain, m, shard.seed(), shard.epoch());
    }
};

}  // namespace

void MixtureShard::fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const {
    detail::mixture_fill(LegacySource{*this, *spec_}, plan(), k0, count, out);
}

std::shared_ptr<const Shard> make_mixture_shard(const Plan& plan,
                                                std::shared_ptr<const MixtureSpec> spec,
                                                std::uint64_t seed, std::uint64_t epoch) {
    if (plan.n != spec->draws())
        throw std::invalid_argument("the plan's length must be the mixture's num_samples");
    return std::make_shared<MixtureShard>(plan, std::move(spec), seed, epoch);
}

void mixture_stand(std::shared_ptr<const MixtureSpec> spec, std::uint64_t seed, std::uint64_t epoch,
                   std::uint64_t j, std::vector<std::uint64_t>& counts, std::vector<StreamStart>& starts) {
    const MixtureSpec& s = *spec;
    const std::size_t k = s.k();
    const std::uint64_t n = s.draws();
    if (j > n) throw std::invalid_argument("position must be in [0, num_samples]");
    counts.assign(k, 0);
    starts.assign(k, StreamStart{});
    std::vector<std::uint64_t> scratch;
    if (j == n) {
        counts = s.per_epoch();
    } else {
        // The window's counts before j, then the first j - begin slots of its interleave.
        const std::uint64_t m = s.window_of(j);
        const std::uint64_t begin = s.boundary(m), end = s.boundary(m + 1);
        std::vector<std::uint64_t> hi(k), prefix(k + 1, 0);
        s.cumulative(begin, counts.data(), scratch);
        s.cumulative(end, hi.data(), scratch);
        for (std::size_t c = 0; c < k; ++c) prefix[c + 1] = prefix[c] + (hi[c] - counts[c]);
        const Feistel slots(end - begin, derive_key(kMixWindowDomain, m, seed, epoch), kMixWindowTableMax);
        for (std::uint64_t r = 0; r < j - begin; ++r) {
            const std::uint64_t slot = slots(r);
            ++counts[static_cast<std::size_t>(std::upper_bound(prefix.begin() + 1, prefix.end(), slot) -
                                              (prefix.begin() + 1))];
        }
    }
    const MixtureShard shard(Plan::make(n, 1, 0, false, true, 0), spec, seed, epoch);
    for (std::size_t c = 0; c < k; ++c) {
        const std::uint64_t size = s.sizes()[c];
        const std::uint64_t o = counts[c], d = s.per_epoch()[c];
        if (size == 0) continue;
        std::uint64_t pos = 0, key = 0;
        if (o < d) {
            shard.locate(c, o, pos, key);  // the pass (or the partial pass's cycle) it is in
        } else {
            // All of this epoch's draws made: whole passes ended; a partial pass stands after
            // this epoch's part of its cycle.
            const std::uint64_t r = d - shard.full(c);
            if (r == 0) continue;
            const std::uint64_t cycle_len = size / r;
            pos = (epoch % cycle_len) * r + r;
            key = sub_key(derive_key(kMixCycleDomain, c, seed, 0), epoch / cycle_len);
        }
        if (pos < size) starts[c] = StreamStart{key, pos, size - pos, 0};
    }
}

}  // namespace fastshard
