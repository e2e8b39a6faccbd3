#include "fastshard/schedule.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "fastshard/feistel.hpp"
#include "fastshard/mix.hpp"
#include "fastshard/mixture_fill.hpp"
#include "fastshard/muldiv.hpp"
#include "fastshard/shard.hpp"

namespace fastshard {

namespace {

constexpr std::uint64_t kMaxLength = 0x7fffffffffffffffULL;
constexpr std::uint64_t kNone = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint64_t kDefaultPeriod = 1024;
// Boundaries whose targets a sequential walk keeps: the two before, the boundary, two after.
constexpr std::size_t kRing = 8;

constexpr std::uint64_t sub_key(std::uint64_t base, std::uint64_t v) noexcept {
    return mix64(base ^ mix64(v + kGolden));
}

// (whole, num / den) += (w, r / den), r < den < 2^127.
inline void add_frac(std::uint64_t& whole, u128& num, std::uint64_t w, u128 r, u128 den) noexcept {
    whole += w;
    num += r;
    if (num >= den) {
        num -= den;
        ++whole;
    }
}

inline void sub_frac(std::uint64_t& whole, u128& num, std::uint64_t w, u128 r, u128 den) noexcept {
    whole -= w;
    if (num < r) {
        num += den - r;
        --whole;
    } else {
        num -= r;
    }
}

}  // namespace

MixtureSchedule::MixtureSchedule(std::vector<std::uint64_t> sizes,
                                 std::vector<std::uint64_t> point_draws,
                                 std::vector<std::uint64_t> units, std::uint64_t unit_total,
                                 std::uint64_t draws, std::uint64_t period, std::uint64_t seed,
                                 std::uint64_t anchor, std::vector<std::uint64_t> anchor_counts,
                                 std::vector<StreamStart> starts,
                                 std::vector<std::vector<HeldValue>> held)
    : sizes_(std::move(sizes)),
      point_draws_(std::move(point_draws)),
      units_(std::move(units)),
      unit_total_(unit_total),
      draws_(draws),
      seed_(seed),
      anchor_(anchor),
      anchor_counts_(std::move(anchor_counts)),
      starts_(std::move(starts)),
      held_(std::move(held)) {
    const std::size_t k = sizes_.size();
    if (k == 0) throw std::invalid_argument("sizes must not be empty");
    offsets_.assign(k + 1, 0);
    for (std::size_t c = 0; c < k; ++c) {
        if (sizes_[c] > kMaxLength - offsets_[c])
            throw std::invalid_argument("sizes must add up to less than 2**63");
        offsets_[c + 1] = offsets_[c] + sizes_[c];
    }
    const std::size_t points = point_draws_.size();
    if (points == 0) throw std::invalid_argument("the schedule must have at least one point");
    if (units_.size() != points * k)
        throw std::invalid_argument("the schedule needs one unit per dataset and point");
    if (unit_total_ == 0 || unit_total_ > (std::uint64_t{1} << 63))
        throw std::invalid_argument("the schedule's unit total must be in [1, 2**63]");
    if (point_draws_[0] != 0) throw std::invalid_argument("the schedule's first point must be at draw 0");
    std::uint64_t smallest = 0;
    for (std::size_t i = 0; i < points; ++i) {
        if (point_draws_[i] > kMaxLength) throw std::invalid_argument("schedule points must be below 2**63");
        if (i > 0 && point_draws_[i] < point_draws_[i - 1])
            throw std::invalid_argument("schedule points must not decrease");
        if (i > 1 && point_draws_[i] == point_draws_[i - 2])
            throw std::invalid_argument("at most two schedule points per draw (a step)");
        std::uint64_t sum = 0;
        for (std::size_t c = 0; c < k; ++c) {
            const std::uint64_t u = units_[i * k + c];
            if (u > unit_total_ - sum) throw std::invalid_argument("a schedule point's units exceed the total");
            sum += u;
            if (u != 0 && sizes_[c] == 0)
                throw std::invalid_argument("dataset " + std::to_string(c) + " is empty but has a positive weight");
            if (u != 0 && (smallest == 0 || u < smallest)) smallest = u;
        }
        if (sum != unit_total_) throw std::invalid_argument("every schedule point's units must add up to the total");
    }
    if (draws == 0 || draws > kMaxLength) throw std::invalid_argument("num_samples must be in [1, 2**63 - 1]");
    const std::uint64_t min_window = unit_total_ / smallest + (unit_total_ % smallest != 0 ? 1 : 0);
    if (period == 0) {
        period = min_window <= kDefaultPeriod / 2 ? kDefaultPeriod
                 : min_window > kMaxLength / 2   ? kMaxLength
                                                 : 2 * min_window;
    }
    period_ = period;
    windows_ = draws / period + (draws % period != 0 ? 1 : 0);
    if (windows_ >= 2 && draws / windows_ < min_window)
        throw std::invalid_argument(
            "period=" + std::to_string(period) + " is too short for the schedule's smallest positive "
            "weight: windows of " + std::to_string(draws / windows_) + " draws give it less than one "
            "draw per window; use a period of at least " + std::to_string(min_window) +
            " (or leave period=None)");
    if (anchor > kMaxLength) throw std::invalid_argument("the anchor must be below 2**63");
    if (anchor_counts_.size() != k || starts_.size() != k || held_.size() != k)
        throw std::invalid_argument("anchor counts, stream starts and held values need one entry per dataset");
    for (std::size_t c = 0; c < k; ++c) {
        for (std::size_t h = 1; h < held_[c].size(); ++h)
            if (held_[c][h].n <= held_[c][h - 1].n)
                throw std::invalid_argument("held values must be sorted by n");
        const StreamStart& st = starts_[c];
        if (st.len != 0 && (st.from > sizes_[c] || st.len > sizes_[c] - st.from))
            throw std::invalid_argument("a stream start lies outside its dataset");
    }
    // The anchor's point: the last point at or before it.
    anchor_point_ = static_cast<std::size_t>(
        std::upper_bound(point_draws_.begin(), point_draws_.end(), anchor) - point_draws_.begin() - 1);
    if (anchor_point_ + 1 < points && anchor > point_draws_[anchor_point_]) {
        const std::size_t i = anchor_point_;
        for (std::size_t c = 0; c < k; ++c)
            if (units_[i * k + c] != units_[(i + 1) * k + c])
                throw std::invalid_argument(
                    "draw " + std::to_string(anchor) + " lies inside a ramp of the schedule (between "
                    "draws " + std::to_string(point_draws_[i]) + " and " + std::to_string(point_draws_[i + 1]) +
                    "); a run can take new weights only where they do not ramp: add a point at that draw");
    }
    // The first boundary after the anchor.
    {
        const std::uint64_t e0 = anchor / draws_, j0 = anchor % draws_;
        first_boundary_ = e0 * windows_ + window_of(j0) + 1;
    }
    stream_keys_.resize(k);
    for (std::size_t c = 0; c < k; ++c) stream_keys_[c] = derive_key(kMixStreamDomain, c, seed_, 0);
    // Integrals from the anchor to every later point, over 2U.
    const u128 two_u = static_cast<u128>(unit_total_) * 2;
    pre_whole_.assign(points * k, 0);
    pre_rem_.assign(points * k, 0);
    for (std::size_t i = anchor_point_ + 1; i < points; ++i) {
        const std::size_t prev = i - 1;
        const std::uint64_t from = std::max(point_draws_[prev], anchor);
        const std::uint64_t length = point_draws_[i] - from;
        for (std::size_t c = 0; c < k; ++c) {
            std::uint64_t whole = i == anchor_point_ + 1 ? 0 : pre_whole_[prev * k + c];
            u128 rem = i == anchor_point_ + 1 ? 0 : pre_rem_[prev * k + c];
            // A whole ramp: length (u_prev + u_i) / 2U; from the anchor on a flat stretch: the same.
            const u128 area = static_cast<u128>(length) * (static_cast<u128>(units_[prev * k + c]) + units_[i * k + c]);
            add_frac(whole, rem, static_cast<std::uint64_t>(area / two_u), area % two_u, two_u);
            pre_whole_[i * k + c] = whole;
            pre_rem_[i * k + c] = rem;
        }
    }
}

std::uint64_t MixtureSchedule::boundary(std::uint64_t m) const noexcept {
    return muldiv(m, draws_, windows_).quot;
}

std::uint64_t MixtureSchedule::window_of(std::uint64_t j) const noexcept {
    const QuotRem t = muldiv(j + 1, windows_, draws_);
    return t.rem == 0 ? t.quot - 1 : t.quot;
}

std::uint64_t MixtureSchedule::boundary_draw(std::uint64_t i) const noexcept {
    const std::uint64_t e = i / windows_, m = i % windows_;
    return e * draws_ + boundary(m);
}

void MixtureSchedule::targets(std::uint64_t g, Targets& out) const {
    const std::size_t k = sizes_.size();
    out.whole.resize(k);
    out.num.resize(k);
    const std::size_t points = point_draws_.size();
    const std::size_t i = static_cast<std::size_t>(
        std::upper_bound(point_draws_.begin(), point_draws_.end(), g) - point_draws_.begin() - 1);
    const u128 U = unit_total_;
    // The stretch holding g: from the later of its point and the anchor, of length L (1 past
    // the last point, where nothing ramps), and the units at both ends.
    const bool last = i + 1 >= points;
    const std::uint64_t start = std::max(point_draws_[i], anchor_);
    const std::uint64_t s = g - start;
    const std::uint64_t ramp = last ? 1 : point_draws_[i + 1] - point_draws_[i];
    const std::uint64_t offset = start - point_draws_[i];  // > 0 only on a flat stretch
    const u128 den = 2 * static_cast<u128>(ramp) * U;
    out.den = den;
    for (std::size_t c = 0; c < k; ++c) {
        std::uint64_t whole = anchor_counts_[c];
        u128 num = 0;
        if (i > anchor_point_) {
            whole += pre_whole_[i * k + c];
            num = pre_rem_[i * k + c] * ramp;  // over 2U -> over 2 L U
        }
        const std::uint64_t u0 = units_[i * k + c];
        const std::uint64_t u1 = last ? u0 : units_[(i + 1) * k + c];
        // u0 s / U
        const u128 t1 = static_cast<u128>(u0) * s;
        add_frac(whole, num, static_cast<std::uint64_t>(t1 / U), (t1 % U) * 2 * ramp, den);
        if (u1 != u0) {
            // (u1 - u0) ((offset + s)^2 - offset^2) / 2 L U, offset = 0 here (an anchor is never
            // strictly inside a ramp), as q / 2U + r / 2LU with s^2 = q L + r.
            const u128 sq = static_cast<u128>(s) * s;
            const u128 q = sq / ramp, r = sq % ramp;
            const bool up = u1 > u0;
            const u128 delta = up ? u1 - u0 : u0 - u1;
            const u128 a = delta * q, b = delta * r;
            const u128 two_u = 2 * U;
            if (up) {
                add_frac(whole, num, static_cast<std::uint64_t>(a / two_u), (a % two_u) * ramp, den);
                add_frac(whole, num, static_cast<std::uint64_t>(b / den), b % den, den);
            } else {
                sub_frac(whole, num, static_cast<std::uint64_t>(a / two_u), (a % two_u) * ramp, den);
                sub_frac(whole, num, static_cast<std::uint64_t>(b / den), b % den, den);
            }
        }
        (void)offset;
        out.whole[c] = whole;
        out.num[c] = num;
    }
}

void MixtureSchedule::ensure(std::uint64_t from, std::uint64_t to, Cache& cache) const {
    // Targets of boundary index idx live in slot idx % kRing, tagged with idx: a walk forward
    // evaluates one new boundary per window and moves nothing.
    if (cache.ring.empty()) {
        cache.ring.resize(kRing);
        cache.tags.assign(kRing, kNone);
    }
    for (std::uint64_t idx = from; idx <= to; ++idx) {
        const std::size_t slot = static_cast<std::size_t>(idx % kRing);
        if (cache.tags[slot] != idx) {
            targets(boundary_draw(idx), cache.ring[slot]);
            cache.tags[slot] = idx;
        }
    }
}

std::uint64_t MixtureSchedule::held(std::size_t c, std::uint64_t n) const noexcept {
    const auto& list = held_[c];
    auto it = std::lower_bound(list.begin(), list.end(), n,
                               [](const HeldValue& h, std::uint64_t x) { return h.n < x; });
    return it != list.end() && it->n == n ? it->v : kNone;
}

std::uint64_t MixtureSchedule::interior_value(std::size_t c, const Targets& t) const noexcept {
    const std::uint64_t n = t.whole[c];
    if (t.num[c] == 0) return n;
    const std::uint64_t v = held(c, n);
    if (v != kNone) return v;
    return t.num[c] >= t.den - t.num[c] ? n + 1 : n;  // the nearest integer, halves up
}

void MixtureSchedule::boundary_counts(std::uint64_t i, Cache& cache, std::uint64_t* out) const {
    const std::size_t k = sizes_.size();
    const std::uint64_t first = first_boundary_;
    if (i + 1 == first) {
        std::copy(anchor_counts_.begin(), anchor_counts_.end(), out);
        return;
    }
    // Targets at i - 2 .. i + 2; the anchor stands for i - 1 when i is the first boundary
    // after it (its targets are integers, so it holds nothing back).
    const bool has_prev = i > first;
    const bool has_prev2 = i > first + 1;
    const std::uint64_t from = has_prev2 ? i - 2 : has_prev ? i - 1 : i;
    ensure(from, i + 2, cache);
    auto at = [&](std::uint64_t idx) -> const Targets& { return cache.ring[idx % kRing]; };
    const Targets& t0 = at(i);
    const Targets& tn = at(i + 1);
    const Targets& tnn = at(i + 2);
    const Targets* tp = has_prev ? &at(i - 1) : nullptr;
    const Targets* tpp = has_prev2 ? &at(i - 2) : nullptr;
    std::uint64_t total = boundary_draw(i) - anchor_;
    for (std::size_t c = 0; c < k; ++c) total += anchor_counts_[c];
    // Each dataset's range [lo, hi]; flexible ones are ranked by remainder.
    auto& lo = cache.scratch;
    lo.assign(2 * k, 0);
    std::uint64_t* hi = lo.data() + k;
    std::uint64_t base = 0;
    cache.order.clear();
    for (std::size_t c = 0; c < k; ++c) {
        const std::uint64_t n = t0.whole[c];
        std::uint64_t l = n, h = n;
        if (t0.num[c] != 0) {
            // The anchor counts as a previous boundary in [A_c, A_c + 1) with count A_c.
            const bool same_prev = has_prev ? tp->whole[c] == n : anchor_counts_[c] == n;
            const bool same_next = tn.whole[c] == n;
            if (!same_prev && !same_next) {
                h = n + 1;
            } else if (same_prev && same_next) {
                l = h = interior_value(c, t0);
            } else {
                // The interval's first boundary may go up to the value of the next, its last
                // down to the value of the one before: the interior value, or with no interior
                // boundary the held value (else the floor) that both ends meet at.
                const std::uint64_t v = held(c, n);
                const std::uint64_t pivot = v != kNone ? v : n;
                if (same_next) {
                    const bool next_interior = tnn.whole[c] == n;
                    l = n;
                    h = next_interior ? interior_value(c, tn) : pivot;
                } else {
                    const bool prev_interior =
                        has_prev && (has_prev2 ? tpp->whole[c] == n : anchor_counts_[c] == n);
                    l = prev_interior ? interior_value(c, *tp) : pivot;
                    h = n + 1;
                }
            }
        }
        lo[c] = l;
        hi[c] = h;
        base += l;
        if (h > l) cache.order.push_back(static_cast<std::uint32_t>(c));
    }
    if (base > total || total - base > cache.order.size())
        throw std::runtime_error(
            "fastshard.MixtureSampler: the schedule cannot be apportioned within one draw of every "
            "dataset's target at draw " + std::to_string(boundary_draw(i)) + ": the datasets held back "
            "there (paused, or drawn less than once per window) are off their targets by more than "
            "the others can make up. Use a longer period, or pause these datasets at one change "
            "point (see docs/mixtures.md, \"Weights that change\")");
    const std::uint64_t extra = total - base;
    for (std::size_t c = 0; c < k; ++c) out[c] = lo[c];
    if (extra == 0) return;
    auto larger = [&](std::uint32_t a, std::uint32_t b) {
        return t0.num[a] != t0.num[b] ? t0.num[a] > t0.num[b] : a < b;
    };
    std::nth_element(cache.order.begin(), cache.order.begin() + static_cast<std::ptrdiff_t>(extra) - 1,
                     cache.order.end(), larger);
    std::sort(cache.order.begin(), cache.order.begin() + static_cast<std::ptrdiff_t>(extra), larger);
    for (std::uint64_t r = 0; r < extra; ++r) ++out[cache.order[r]];
}

void MixtureSchedule::counts_at(std::uint64_t g, std::uint64_t* out) const {
    const std::size_t k = sizes_.size();
    if (g < anchor_) throw std::invalid_argument("counts before the anchor are not defined");
    const std::uint64_t e = g / draws_, j = g % draws_;
    const std::uint64_t m = window_of(j);
    const std::uint64_t i = e * windows_ + m;
    Cache cache;
    std::vector<std::uint64_t> lo(k), hi(k);
    const std::uint64_t begin = std::max(boundary_draw(i), anchor_);
    if (begin == anchor_) {
        std::copy(anchor_counts_.begin(), anchor_counts_.end(), lo.begin());
    } else {
        boundary_counts(i, cache, lo.data());
    }
    if (g == begin) {
        std::copy(lo.begin(), lo.end(), out);
        return;
    }
    boundary_counts(i + 1, cache, hi.data());
    const std::uint64_t end = boundary_draw(i + 1);
    std::vector<std::uint64_t> prefix(k + 1, 0);
    for (std::size_t c = 0; c < k; ++c) prefix[c + 1] = prefix[c] + (hi[c] - lo[c]);
    const Feistel slots(end - begin, window_key(e, m), kMixWindowTableMax);
    std::copy(lo.begin(), lo.end(), out);
    for (std::uint64_t r = 0; r < g - begin; ++r) {
        const std::uint64_t slot = slots(r);
        const std::size_t c = static_cast<std::size_t>(
            std::upper_bound(prefix.begin() + 1, prefix.end(), slot) - (prefix.begin() + 1));
        ++out[c];
    }
}

void MixtureSchedule::locate(std::size_t c, std::uint64_t x, std::uint64_t& pos,
                             std::uint64_t& key) const noexcept {
    const StreamStart& st = starts_[c];
    if (x < st.len) {
        pos = st.from + x;
        key = st.key;
        return;
    }
    const std::uint64_t size = sizes_[c];
    const std::uint64_t o = st.base + (x - st.len);
    const std::uint64_t pass = o / size;
    pos = o - pass * size;
    key = sub_key(stream_keys_[c], pass);
}

bool MixtureSchedule::one_order(std::size_t c, std::uint64_t lo, std::uint64_t hi) const noexcept {
    const StreamStart& st = starts_[c];
    if (hi <= st.len) return true;
    if (lo < st.len) return false;
    const std::uint64_t size = sizes_[c];
    return (st.base + (lo - st.len)) / size == (st.base + (hi - 1 - st.len)) / size;
}

std::uint64_t MixtureSchedule::window_key(std::uint64_t epoch, std::uint64_t m) const noexcept {
    return derive_key(kMixScheduleWindowDomain, m, seed_, epoch);
}

namespace {

// The schedule as a source of the shared fill loop, for one epoch.
struct ScheduleSource {
    const MixtureSchedule& s;
    std::uint64_t epoch;
    std::uint64_t first_j;  // the epoch's first draw at or after the anchor
    struct Cache {
        MixtureSchedule::Cache counts;
        std::uint64_t window = kNone;
        std::vector<std::uint64_t> scratch;
    };
    std::size_t k() const noexcept { return s.k(); }
    const std::vector<std::uint64_t>& sizes() const noexcept { return s.sizes(); }
    const std::vector<std::uint64_t>& offsets() const noexcept { return s.offsets(); }
    std::uint64_t draws() const noexcept { return s.draws(); }
    // Padding repeats the epoch's first draws after the anchor.
    std::uint64_t wrap(std::uint64_t pos) const noexcept {
        return first_j + (pos - s.draws()) % (s.draws() - first_j);
    }
    std::uint64_t window_of(std::uint64_t j) const noexcept { return s.window_of(j); }
    void load_window(std::uint64_t m, Cache& cache, std::uint64_t& begin, std::uint64_t& end,
                     std::vector<std::uint64_t>& lo, std::vector<std::uint64_t>& hi) const {
        const std::size_t k = s.k();
        const std::uint64_t i = epoch * s.windows() + m;
        if (cache.window != kNone && m == cache.window + 1) {
            std::swap(lo, hi);
            begin = end;
        } else {
            const std::uint64_t bm = s.boundary(m);
            if (first_j > bm) {  // the window holding the anchor starts there
                begin = first_j;
                std::copy(s.anchor_counts().begin(), s.anchor_counts().end(), lo.begin());
            } else {
                begin = bm;
                s.boundary_counts(i, cache.counts, lo.data());
            }
            for (std::size_t c = 0; c < k; ++c) lo[c] -= s.anchor_counts()[c];
        }
        end = s.boundary(m + 1);
        s.boundary_counts(i + 1, cache.counts, hi.data());
        for (std::size_t c = 0; c < k; ++c) hi[c] -= s.anchor_counts()[c];
        cache.window = m;
    }
    void locate(std::size_t c, std::uint64_t o, std::uint64_t& pos, std::uint64_t& key) const noexcept {
        s.locate(c, o, pos, key);
    }
    bool one_order(std::size_t c, std::uint64_t lo, std::uint64_t hi, std::uint64_t) const noexcept {
        return s.one_order(c, lo, hi);
    }
    std::uint64_t window_key(std::uint64_t m) const noexcept { return s.window_key(epoch, m); }
};

std::shared_ptr<const Shard> bridge_shard(const Plan& plan, const Bridge& bridge, std::uint64_t epoch) {
    if (bridge.spec) return make_mixture_shard(plan, bridge.spec, bridge.seed, epoch);
    return make_schedule_shard(plan, bridge.schedule, epoch, bridge.inner);
}

class ScheduleShard final : public Shard {
  public:
    ScheduleShard(const Plan& plan, std::shared_ptr<const MixtureSchedule> schedule, std::uint64_t epoch,
                  std::uint64_t first_j, std::shared_ptr<const Bridge> bridge, std::uint64_t bridge_j)
        : Shard(plan),
          schedule_(std::move(schedule)),
          epoch_(epoch),
          first_j_(first_j),
          bridge_(std::move(bridge)),
          bridge_j_(bridge_j) {}

  protected:
    void fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const override {
        const Plan& p = plan();
        const std::uint64_t n = schedule_->draws(), w = p.num_replicas;
        // Draws before first_j come from the bridge; padding repeats the pass's first draws
        // (from the bridge's start, or the anchor), one at a time (a rank pads at most once).
        const std::uint64_t lo = bridge_ ? bridge_j_ : first_j_;
        std::uint64_t k = k0;
        const std::uint64_t end = k0 + count;
        while (k < end) {
            const std::uint64_t pos = p.position(k);
            std::int64_t* dst = out + (k - k0);
            if (pos >= n) {
                const std::uint64_t j = lo + (pos - n) % (n - lo);
                range(j, 1, 1, dst);
                ++k;
                continue;
            }
            const std::uint64_t stop = pos < first_j_ ? first_j_ : n;
            const std::uint64_t cnt = std::min<std::uint64_t>((stop - pos - 1) / w + 1, end - k);
            range(pos, w, cnt, dst);
            k += cnt;
        }
    }

  private:
    // cnt draws at epoch positions j, j + w, ... (all on one side of first_j).
    void range(std::uint64_t j, std::uint64_t w, std::uint64_t cnt, std::int64_t* dst) const {
        const std::uint64_t n = schedule_->draws();
        const Plan strided = Plan::make(n, w, j % w, false, true, j - j % w);
        if (j < first_j_) {
            bridge_shard(strided, *bridge_, epoch_)->fill(0, cnt, dst);
        } else {
            detail::mixture_fill(ScheduleSource{*schedule_, epoch_, first_j_}, strided, 0, cnt, dst);
        }
    }

    std::shared_ptr<const MixtureSchedule> schedule_;
    std::uint64_t epoch_;
    std::uint64_t first_j_;
    std::shared_ptr<const Bridge> bridge_;
    std::uint64_t bridge_j_;
};

}  // namespace

std::shared_ptr<const Shard> make_schedule_shard(const Plan& plan,
                                                 std::shared_ptr<const MixtureSchedule> schedule,
                                                 std::uint64_t epoch, std::shared_ptr<const Bridge> bridge) {
    const MixtureSchedule& s = *schedule;
    if (plan.n != s.draws()) throw std::invalid_argument("the plan's length must be the mixture's num_samples");
    const std::uint64_t n = s.draws();
    if (epoch > (kMaxLength / n) - 3)
        throw std::invalid_argument("epoch " + std::to_string(epoch) + " is too large: a schedule counts "
                                    "draws across epochs, and (epoch + 3) * num_samples must stay below 2**63");
    const std::uint64_t anchor = s.anchor();
    const std::uint64_t first_j = epoch * n >= anchor ? 0 : anchor - epoch * n;
    // A bridge covers [from, anchor) when both lie in this epoch.
    const bool bridged = bridge && first_j > 0 && bridge->from >= epoch * n && bridge->from <= anchor;
    const std::uint64_t start = bridged ? bridge->from - epoch * n : first_j;
    if (first_j > n)
        throw std::invalid_argument("epoch " + std::to_string(epoch) + " ends before draw " +
                                    std::to_string(anchor) + ", where this run's weights changed");
    if (plan.cursor < start)
        throw std::invalid_argument("the pass starts at position " + std::to_string(plan.cursor) + " of epoch " +
                                    std::to_string(epoch) + ", before draw " + std::to_string(epoch * n + start) +
                                    " where this run's weights changed");
    return std::make_shared<ScheduleShard>(plan, std::move(schedule), epoch, first_j,
                                           bridged ? std::move(bridge) : nullptr, start);
}

}  // namespace fastshard
