#include "fastshard/stratify.hpp"

#include "fastshard/clones.hpp"

namespace fastshard {

FASTSHARD_CLONES_MUL64 void consecutive(std::uint64_t* x, std::uint64_t first, std::size_t count) noexcept {
    for (std::size_t k = 0; k < count; ++k) x[k] = first + k;
}

FASTSHARD_CLONES_MUL64 void shifted_rows(std::uint64_t* x, std::size_t count, unsigned shift) noexcept {
    for (std::size_t k = 0; k < count; ++k) x[k] = (x[k] >> shift) + 1;
}

std::uint64_t class_min_items(std::uint64_t n, std::uint64_t strata) {
    if (strata <= (std::uint64_t{1} << 24) / n) return 1;
    const std::uint64_t by_strata = strata > 0xffffffffULL ? ~std::uint64_t{0} : strata * strata / 32;
    return std::max<std::uint64_t>(1, std::min(by_strata, n / 32));
}

std::uint64_t strata_per(std::uint64_t n, std::uint64_t window) {
    if (n == 0 || window == 0) return 1;
    const std::uint64_t windows = (n - 1) / window + 1;
    std::uint64_t k = 1;
    // Grow while the classes would hold more than n / 10^4 items each, the stratum stays within
    // its bound and there are windows left to group.
    while (class_min_items(n, (windows - 1) / k + 1) > std::max<std::uint64_t>(1, n / 10000) && k < windows &&
           k * 2 <= kMaxStratumItems / window)
        k *= 2;
    return k;
}

LengthClasses::LengthClasses(const std::vector<std::uint64_t>& counts, const std::vector<std::uint64_t>& uppers,
                             std::uint64_t min_items) {
    key_to_class_.assign(counts.size(), 0);
    std::uint64_t open = 0;
    for (std::size_t k = 0; k < counts.size(); ++k) {
        if (counts[k] == 0) {
            key_to_class_[k] = size();  // the class above (clamped below)
            continue;
        }
        if (count_.empty() || open >= min_items) {
            count_.push_back(0);
            upper_.push_back(0);
        }
        key_to_class_[k] = size() - 1;
        count_.back() += counts[k];
        upper_.back() = uppers[k];
        open = count_.back();
    }
    if (count_.size() > 1 && count_.back() < min_items) {
        const std::uint32_t last = size() - 1;
        for (auto& c : key_to_class_)
            if (c >= last) c = last - 1;
        count_[last - 1] += count_[last];
        upper_[last - 1] = upper_[last];
        count_.pop_back();
        upper_.pop_back();
    }
    if (!count_.empty())
        for (auto& c : key_to_class_) c = std::min(c, size() - 1);
}

std::uint64_t Strata::stratum_quota_before(std::uint64_t t, std::uint32_t b) const noexcept {
    __extension__ typedef unsigned __int128 u128;  // __extension__: no -pedantic warning
    return static_cast<std::uint64_t>(static_cast<u128>(classes_.count(b)) * stratum_start(t) / n_);
}

void Strata::stratum_quotas(std::uint64_t t, std::vector<std::uint64_t>& stratum) const {
    stratum.resize(num_classes());
    for (std::uint32_t b = 0; b < num_classes(); ++b)
        stratum[b] = stratum_quota_before(t + 1, b) - stratum_quota_before(t, b);
}

void Strata::share(std::uint64_t t, const std::vector<std::uint64_t>& stratum, std::uint64_t j,
                   std::vector<std::uint64_t>& quota) const {
    const std::uint64_t k = windows_in(t);
    quota.resize(stratum.size());
    std::uint64_t c = 0;  // C_b mod k
    for (std::size_t b = 0; b < stratum.size(); ++b) {
        const std::uint64_t q = stratum[b];
        const std::uint64_t d = (j + k - c) % k;  // the first rank dealt to window j
        quota[b] = q > d ? (q - d - 1) / k + 1 : 0;
        c = (c + q % k) % k;
    }
}

void Strata::quotas(std::uint64_t w, std::vector<std::uint64_t>& quota) const {
    std::vector<std::uint64_t> stratum;
    const std::uint64_t t = stratum_of(w);
    stratum_quotas(t, stratum);
    share(t, stratum, w - t * per_, quota);
}

WindowRanks ClassPrefix::stratum_ranks(const Strata& strata, std::uint64_t t) const {
    const std::uint32_t classes = classes_;
    const std::uint64_t windows = strata_;  // ranges of the order: the strata
    // Class b's items of stratum t are those of class rank [lo[b], hi[b]) in the epoch's order.
    // The ranges of the order holding them: from the last range starting at a rank <= lo[b] to
    // the last starting at a rank <= hi[b] - 1 (binary searches down the prefix histogram).
    WindowRanks r;
    r.lo_.resize(classes);
    r.hi_.resize(classes);
    std::uint64_t first = windows, last = 0;  // ranges [first, last] of the order to read
    const auto range_of = [&](std::uint32_t b, std::uint64_t rank) {
        std::uint64_t a = 0, z = windows;  // the last k with prefix(k) <= rank: prefix(0) = 0
        while (a < z) {
            const std::uint64_t mid = a + (z - a + 1) / 2;
            if (prefix_[mid * classes + b] <= rank) a = mid;
            else z = mid - 1;
        }
        return a;
    };
    for (std::uint32_t b = 0; b < classes; ++b) {
        r.lo_[b] = strata.stratum_quota_before(t, b);
        r.hi_[b] = strata.stratum_quota_before(t + 1, b);
        if (r.hi_[b] == r.lo_[b]) continue;
        first = std::min(first, range_of(b, r.lo_[b]));
        last = std::max(last, range_of(b, r.hi_[b] - 1));
    }
    if (first > last) return r;  // nothing to read: p0 == p1
    r.p0 = strata.stratum_start(first);
    r.p1 = strata.stratum_start(last + 1);
    r.rank_.assign(prefix_.begin() + static_cast<std::ptrdiff_t>(first * classes),
                   prefix_.begin() + static_cast<std::ptrdiff_t>((first + 1) * classes));
    return r;
}

}  // namespace fastshard
