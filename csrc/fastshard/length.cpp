#include "fastshard/length.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "fastshard/mix.hpp"
#include "fastshard/parallel.hpp"

namespace fastshard {

namespace {

constexpr std::uint64_t kScanBlock = 4096;

struct ScanPart {
    std::int64_t first_negative = -1;
    std::uint64_t max = 0;
    std::uint64_t checksum = 0;
};

template <class T>
void scan_block(const T* data, std::uint64_t first, std::uint64_t len, ScanPart& p, double& sum) {
    std::uint64_t max = p.max, checksum = 0;
    double s = 0.0;
    bool negative = false;
    for (std::uint64_t k = first; k < first + len; ++k) {
        const T v = data[k];
        negative |= v < 0;
        // The value as a signed 64-bit word: the same bits for the same value in any type.
        const auto bits = static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
        const auto u = static_cast<std::uint64_t>(v);
        max = u > max ? u : max;
        s += static_cast<double>(u);
        checksum += length_term(bits, k);
    }
    p.max = max;
    p.checksum += checksum;
    sum = s;
    if (negative && p.first_negative < 0) {
        for (std::uint64_t k = first; k < first + len; ++k) {
            if (data[k] < 0) {
                p.first_negative = static_cast<std::int64_t>(k);
                break;
            }
        }
    }
}

// LSD radix sort of a[0, m) on its low `bits` bits (11 per pass, stable). `tmp` has room for
// m words; the result is in a.
void radix_sort(std::uint64_t* a, std::uint64_t* tmp, std::size_t m, unsigned bits) {
    constexpr unsigned kDigit = 11;
    constexpr std::size_t kBuckets = std::size_t{1} << kDigit;
    std::vector<std::size_t> count(kBuckets);
    std::uint64_t* src = a;
    std::uint64_t* dst = tmp;
    for (unsigned shift = 0; shift < bits; shift += kDigit) {
        std::fill(count.begin(), count.end(), 0);
        for (std::size_t i = 0; i < m; ++i) ++count[(src[i] >> shift) & (kBuckets - 1)];
        std::size_t total = 0;
        for (auto& c : count) {
            const std::size_t here = c;
            c = total;
            total += here;
        }
        for (std::size_t i = 0; i < m; ++i) dst[count[(src[i] >> shift) & (kBuckets - 1)]++] = src[i];
        std::swap(src, dst);
    }
    if (src != a) std::copy(src, src + m, a);
}

// Where the batches of a sorted window start: every batch_size items, or greedily by the
// token budget on the rule lengths `lens` (nondecreasing). Calls start(i) for each batch's
// first item; returns the number of batches.
template <class Start>
std::uint64_t cut(const std::uint64_t* lens, std::uint64_t m, const BatchRule& rule, Start&& start) {
    std::uint64_t batches = 0;
    if (rule.batch_size != 0) {
        for (std::uint64_t i = 0; i < m; i += rule.batch_size, ++batches) start(i);
        return batches;
    }
    std::uint64_t open = 0;  // items in the open batch (0: none open)
    for (std::uint64_t i = 0; i < m; ++i) {
        // Sorted ascending: the new item is the open batch's longest.
        if (open == 0 || open + 1 > rule.capacity(lens[i])) {
            start(i);
            ++batches;
            open = 0;
        }
        ++open;
    }
    return batches;
}

// The greedy cut of a sorted window from its class counts alone (what cut() yields on the
// window's rule lengths): one run of a class at a time, items go into the open batch while it
// holds fewer than capacity(upper), then fill whole batches of capacity(upper), the last of
// them left open.
std::uint64_t cut_count(const std::uint64_t* counts, const std::uint64_t* uppers, std::size_t classes,
                        const BatchRule& rule) {
    std::uint64_t batches = 0, open = 0;
    for (std::size_t b = 0; b < classes; ++b) {
        std::uint64_t c = counts[b];
        if (c == 0) continue;
        const std::uint64_t cap = rule.capacity(uppers[b]);
        if (open > 0 && open < cap) {
            const std::uint64_t take = std::min(c, cap - open);
            open += take;
            c -= take;
        }
        if (c > 0) {
            batches += (c - 1) / cap + 1;
            open = c % cap == 0 ? cap : c % cap;
        }
    }
    return batches;
}

// Sorts (lens, items) by (length, index): one radix sort of (length - lo, index) packed in a
// word where they fit, else comparisons.
void sort_by_length(std::vector<std::uint64_t>& lens, std::vector<std::uint64_t>& items) {
    const std::size_t m = items.size();
    if (m == 0) return;
    const auto [lo_it, hi_it] = std::minmax_element(lens.begin(), lens.end());
    const std::uint64_t lo = *lo_it, hi = *hi_it;
    const unsigned range_bits = bit_width(hi - lo);
    const unsigned index_bits = bit_width(m - 1);
    if (range_bits + index_bits <= 64) {
        std::vector<std::uint64_t> keys(m), tmp(m);
        for (std::size_t i = 0; i < m; ++i) keys[i] = ((lens[i] - lo) << index_bits) | i;
        radix_sort(keys.data(), tmp.data(), m, range_bits + index_bits);
        const std::uint64_t mask = index_bits == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << index_bits) - 1;
        for (std::size_t i = 0; i < m; ++i) {
            const std::uint64_t pos = index_bits == 0 ? 0 : keys[i] & mask;
            tmp[i] = items[pos];
            keys[i] = lens[pos];
        }
        items.swap(tmp);
        lens.swap(keys);
        return;
    }
    // Lengths too far apart to pack with the index: the same order, by comparisons.
    std::vector<std::uint64_t> order(m);
    std::iota(order.begin(), order.end(), std::uint64_t{0});
    std::sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
        return lens[a] != lens[b] ? lens[a] < lens[b] : a < b;
    });
    std::vector<std::uint64_t> sorted_items(m), sorted_lens(m);
    for (std::size_t i = 0; i < m; ++i) {
        sorted_items[i] = items[order[i]];
        sorted_lens[i] = lens[order[i]];
    }
    items.swap(sorted_items);
    lens.swap(sorted_lens);
}

}  // namespace

LengthsSummary scan_lengths(const Lengths& lengths, unsigned threads) {
    const std::uint64_t n = lengths.n;
    const std::uint64_t blocks = (n + kScanBlock - 1) / kScanBlock;
    std::vector<double> sums(static_cast<std::size_t>(blocks));
    std::vector<ScanPart> parts(threads == 0 ? default_threads() : threads);
    with_type(lengths.type, [&](auto tag) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
        const T* data = static_cast<const T*>(lengths.data);
        parallel_for(blocks, static_cast<unsigned>(parts.size()), 16,
                     [&](unsigned part, std::uint64_t b0, std::uint64_t count) {
                         ScanPart p;
                         for (std::uint64_t b = b0; b < b0 + count; ++b) {
                             const std::uint64_t len = std::min(kScanBlock, n - b * kScanBlock);
                             scan_block(data, b * kScanBlock, len, p, sums[static_cast<std::size_t>(b)]);
                         }
                         parts[part] = p;
                     });
    });
    LengthsSummary s;
    std::uint64_t checksum = 0;
    for (const ScanPart& p : parts) {
        if (p.first_negative >= 0 && (s.first_negative < 0 || p.first_negative < s.first_negative))
            s.first_negative = p.first_negative;
        s.max = std::max(s.max, p.max);
        checksum += p.checksum;  // order-free: the same for any split into parts
    }
    for (const double b : sums) s.sum += b;  // in block order: the same on every machine
    s.checksum = length_checksum(checksum, n);
    return s;
}

LengthLayout::LengthLayout(const Lengths& lengths, const BatchRule& rule, std::uint64_t window, unsigned threads,
                           std::uint64_t min_class_items)
    : lengths_(lengths),
      rule_(rule),
      strata_(lengths.n, window, rule.max_tokens != 0 ? strata_per(lengths.n, window) : 1) {
    if (lengths.n == 0) throw std::invalid_argument("lengths must not be empty");
    if (window == 0) throw std::invalid_argument("sort_window must be >= 1");
    if ((rule.batch_size == 0) == (rule.max_tokens == 0))
        throw std::invalid_argument("exactly one of batch_size and max_tokens must be > 0");
    const std::uint64_t n = lengths.n;
    const std::uint64_t windows = (n - 1) / window + 1;
    offsets_.assign(static_cast<std::size_t>(windows) + 1, 0);
    if (rule.batch_size != 0) {
        // A fixed count: every window's number of batches is known without reading a length.
        for (std::uint64_t w = 0; w < windows; ++w) {
            const std::uint64_t size = std::min(window, n - w * window);
            offsets_[w + 1] = offsets_[w] + (size + rule.batch_size - 1) / rule.batch_size;
        }
        return;
    }
    // One pass over the lengths: items and the largest rule length per fine bucket.
    const std::uint64_t blocks = (n + kScanBlock - 1) / kScanBlock;
    std::vector<std::vector<std::uint64_t>> counts(threads == 0 ? default_threads() : threads),
        maxima(counts.size());
    const unsigned parts = with_type(lengths.type, [&](auto tag) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
        const T* data = static_cast<const T*>(lengths.data);
        return parallel_for(blocks, static_cast<unsigned>(counts.size()), 16,
                            [&](unsigned part, std::uint64_t b0, std::uint64_t count) {
                                std::vector<std::uint64_t> c(kFineBuckets), mx(kFineBuckets);
                                const std::uint64_t end = std::min(n, (b0 + count) * kScanBlock);
                                for (std::uint64_t k = b0 * kScanBlock; k < end; ++k) {
                                    const auto raw = static_cast<std::uint64_t>(data[k]);  // checked >= 0
                                    const std::uint64_t v = raw == 0 ? 1 : raw;
                                    const std::uint32_t f = fine_bucket(v);
                                    ++c[f];
                                    mx[f] = v > mx[f] ? v : mx[f];
                                }
                                counts[part] = std::move(c);
                                maxima[part] = std::move(mx);
                            });
    });
    std::vector<std::uint64_t> fine(kFineBuckets), fine_max(kFineBuckets);
    for (unsigned p = 0; p < parts; ++p)
        for (std::uint32_t f = 0; f < kFineBuckets; ++f) {
            fine[f] += counts[p][f];
            fine_max[f] = std::max(fine_max[f], maxima[p][f]);
        }
    // Classes: occupied fine buckets in length order, merged upwards (stratify.hpp).
    strata_.set_classes(LengthClasses(
        fine, fine_max, min_class_items != 0 ? min_class_items : class_min_items(n, strata_.num_strata())));
    const std::uint32_t classes = num_classes();
    // Each window's batch count from its class quotas: the same in every epoch.
    const std::uint64_t per = strata_.per_stratum();
    parallel_for(strata_.num_strata(), threads, 1 + 63 / per, [&](unsigned, std::uint64_t t0, std::uint64_t count) {
        std::vector<std::uint64_t> stratum, quota;
        for (std::uint64_t t = t0; t < t0 + count; ++t) {
            strata_.stratum_quotas(t, stratum);
            for (std::uint64_t j = 0; j < strata_.windows_in(t); ++j) {
                strata_.share(t, stratum, j, quota);
                offsets_[t * per + j + 1] =
                    cut_count(quota.data(), strata_.classes().uppers().data(), classes, rule_);
            }
        }
    });
    for (std::uint64_t w = 0; w < windows; ++w) offsets_[w + 1] += offsets_[w];
}

std::uint64_t LengthLayout::window_of(std::uint64_t g) const noexcept {
    // The last window whose offset is <= g (every window has at least one batch).
    const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), g);
    return static_cast<std::uint64_t>(it - offsets_.begin()) - 1;
}

LengthEpoch::LengthEpoch(std::shared_ptr<const LengthLayout> layout, std::uint64_t seed, std::uint64_t epoch,
                         unsigned threads)
    : layout_(std::move(layout)),
      seed_(seed),
      epoch_(epoch),
      perm_(layout_->num_items(), derive_key(kLengthDomain, layout_->num_items(), seed, epoch)) {
    if (!layout_->stratified()) return;
    const LengthLayout& L = *layout_;
    prefix_ = ClassPrefix(L.strata(), L.lengths(), perm_, [&L](std::uint64_t v) { return L.class_of(v); }, threads);
}

void LengthEpoch::gather_window(std::uint64_t w, WindowBatches& out, std::vector<std::uint64_t>& lens) const {
    out.items.clear();
    lens.clear();
    if (layout_->stratified()) {
        gather_stratified(w, out, lens);
        return;
    }
    walk_order(layout_->lengths(), perm_, layout_->window_start(w), layout_->window_start(w + 1),
               [&](std::uint64_t, std::uint64_t item, std::uint64_t v) {
                   out.items.push_back(item);
                   lens.push_back(v);
               });
}

namespace {

// The most positions a shard keeps read (16 bytes each): past this, a window's ranges are read
// afresh each time.
constexpr std::uint64_t kMaxWalked = std::uint64_t{1} << 22;

}  // namespace

void LengthEpoch::gather_stratified(std::uint64_t w, WindowBatches& out, std::vector<std::uint64_t>& lens) const {
    const LengthLayout& L = *layout_;
    StratumItems& st = out.stratum;
    const std::uint64_t t = L.strata().stratum_of(w);
    if (st.stratum != t) read_stratum(t, out);
    select_window(L.strata(), w, st.classes, [&](std::size_t i) {
        out.items.push_back(st.items[i]);
        lens.push_back(st.lens[i]);
    });
}

void LengthEpoch::read_stratum(std::uint64_t t, WindowBatches& out) const {
    const LengthLayout& L = *layout_;
    StratumItems& st = out.stratum;
    st.clear();
    WindowRanks ranks = prefix_.stratum_ranks(L.strata(), t);
    const std::uint64_t p0 = ranks.p0, p1 = ranks.p1;
    const auto take = [&](std::uint64_t item, std::uint64_t v) {
        const std::uint32_t b = L.class_of(v);
        if (ranks.take(b)) {
            st.items.push_back(item);
            st.lens.push_back(v);
            st.classes.push_back(b);
        }
    };
    if (p0 == p1) {
        st.stratum = t;
        return;
    }
    if (p1 - p0 > kMaxWalked) {
        out.walked_items.clear();
        out.walked_lens.clear();
        walk_order(L.lengths(), perm_, p0, p1, [&](std::uint64_t, std::uint64_t item, std::uint64_t v) { take(item, v); });
        st.stratum = t;
        return;
    }
    // Strata read in order read overlapping ranges: keep what was read, read only the rest.
    const std::uint64_t c0 = out.walked_first, c1 = c0 + out.walked_items.size();
    std::vector<std::uint64_t> items(static_cast<std::size_t>(p1 - p0)), vals(items.size());
    const auto store = [&](std::uint64_t p, std::uint64_t item, std::uint64_t v) {
        items[static_cast<std::size_t>(p - p0)] = item;
        vals[static_cast<std::size_t>(p - p0)] = v;
    };
    const std::uint64_t k0 = std::max(p0, c0), k1 = std::min(p1, c1);  // kept: [k0, k1)
    if (k0 < k1) {
        walk_order(L.lengths(), perm_, p0, k0, store);
        std::copy(out.walked_items.begin() + static_cast<std::ptrdiff_t>(k0 - c0),
                  out.walked_items.begin() + static_cast<std::ptrdiff_t>(k1 - c0),
                  items.begin() + static_cast<std::ptrdiff_t>(k0 - p0));
        std::copy(out.walked_lens.begin() + static_cast<std::ptrdiff_t>(k0 - c0),
                  out.walked_lens.begin() + static_cast<std::ptrdiff_t>(k1 - c0),
                  vals.begin() + static_cast<std::ptrdiff_t>(k0 - p0));
        walk_order(L.lengths(), perm_, k1, p1, store);
    } else {
        walk_order(L.lengths(), perm_, p0, p1, store);
    }
    for (std::size_t i = 0; i < items.size(); ++i) take(items[i], vals[i]);
    out.walked_first = p0;
    out.walked_items.swap(items);
    out.walked_lens.swap(vals);
    st.stratum = t;
}

void LengthEpoch::build(std::uint64_t w, WindowBatches& out) const {
    const LengthLayout& L = *layout_;
    std::vector<std::uint64_t> lens;
    gather_window(w, out, lens);  // in the order's position order
    sort_by_length(lens, out.items);
    if (L.stratified())  // the budget applies to the class bounds
        for (auto& v : lens) v = L.class_upper(L.class_of(v));
    out.starts.clear();
    const std::uint64_t m = lens.size();
    const std::uint64_t batches = cut(lens.data(), m, L.rule(), [&](std::uint64_t i) { out.starts.push_back(i); });
    out.starts.push_back(m);
    if (batches != L.window_offset(w + 1) - L.window_offset(w))
        throw std::logic_error(
            "length-grouped window: batch count differs from the layout's count (were the lengths "
            "modified while the sampler was in use?)");
    out.order = std::make_unique<Feistel>(batches, derive_key(kLengthDomain + 1, w, seed_, epoch_));
    out.window = w;
}

void LengthShard::global_batch(std::uint64_t g, std::vector<std::uint64_t>& out) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const LengthLayout& layout = epoch_->layout();
    const std::uint64_t w = layout.window_of(g);
    if (cache_.window != w) {
        cache_.window = ~std::uint64_t{0};  // invalid until the build completes
        epoch_->build(w, cache_);
    }
    const std::uint64_t b = (*cache_.order)(g - layout.window_offset(w));
    const auto begin = cache_.items.begin() + static_cast<std::ptrdiff_t>(cache_.starts[b]);
    const auto end = cache_.items.begin() + static_cast<std::ptrdiff_t>(cache_.starts[b + 1]);
    out.insert(out.end(), begin, end);
}

}  // namespace fastshard
