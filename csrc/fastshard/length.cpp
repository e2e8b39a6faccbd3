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

// Calls f with a null pointer of the lengths' element type.
template <class F>
decltype(auto) with_type(LengthType type, F&& f) {
    switch (type) {
        case LengthType::i8: return f(static_cast<const std::int8_t*>(nullptr));
        case LengthType::i16: return f(static_cast<const std::int16_t*>(nullptr));
        case LengthType::i32: return f(static_cast<const std::int32_t*>(nullptr));
        case LengthType::i64: return f(static_cast<const std::int64_t*>(nullptr));
        case LengthType::u8: return f(static_cast<const std::uint8_t*>(nullptr));
        case LengthType::u16: return f(static_cast<const std::uint16_t*>(nullptr));
        case LengthType::u32: return f(static_cast<const std::uint32_t*>(nullptr));
        case LengthType::u64: break;
    }
    return f(static_cast<const std::uint64_t*>(nullptr));
}

constexpr std::uint64_t kScanBlock = 4096;

struct ScanPart {
    std::int64_t first_negative = -1;
    std::uint64_t max = 0;
    std::uint64_t checksum = 0;
};

template <class T>
void scan_block(const T* data, std::uint64_t first, std::uint64_t len, ScanPart& p, double& sum) {
    std::uint64_t max = p.max, checksum = 0;
    std::uint64_t position_hash = first * kGolden;
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
        checksum += mix64(bits + position_hash);
        position_hash += kGolden;
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
// token budget. Calls start(i) for each batch's first item; returns the number of batches.
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
    s.checksum = mix64(checksum ^ n);
    return s;
}

LengthEpoch::LengthEpoch(const Lengths& lengths, const BatchRule& rule, std::uint64_t window,
                         std::uint64_t seed, std::uint64_t epoch, unsigned threads)
    : lengths_(lengths),
      rule_(rule),
      window_(window),
      seed_(seed),
      epoch_(epoch),
      perm_(lengths.n == 0 ? 1 : lengths.n, derive_key(kLengthDomain, lengths.n, seed, epoch)) {
    if (lengths.n == 0) throw std::invalid_argument("lengths must not be empty");
    if (window == 0) throw std::invalid_argument("sort_window must be >= 1");
    if ((rule.batch_size == 0) == (rule.max_tokens == 0))
        throw std::invalid_argument("exactly one of batch_size and max_tokens must be > 0");
    const std::uint64_t n = lengths.n;
    const std::uint64_t windows = (n - 1) / window + 1;
    offsets_.assign(static_cast<std::size_t>(windows) + 1, 0);
    const auto size_of = [&](std::uint64_t w) { return std::min(window, n - w * window); };
    if (rule.batch_size != 0) {
        // A fixed count: every window's number of batches is known without reading a length.
        for (std::uint64_t w = 0; w < windows; ++w)
            offsets_[w + 1] = offsets_[w] + (size_of(w) + rule.batch_size - 1) / rule.batch_size;
        return;
    }
    // A token budget: each window is sorted once to count its batches, windows in parallel.
    parallel_for(windows, threads, 1, [&](unsigned, std::uint64_t w0, std::uint64_t count) {
        std::vector<std::uint64_t> lens, scratch;
        for (std::uint64_t w = w0; w < w0 + count; ++w) offsets_[w + 1] = count_window(w, lens, scratch);
    });
    for (std::uint64_t w = 0; w < windows; ++w) offsets_[w + 1] += offsets_[w];
}

std::uint64_t LengthEpoch::window_of(std::uint64_t g) const noexcept {
    // The last window whose offset is <= g (every window has at least one batch).
    const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), g);
    return static_cast<std::uint64_t>(it - offsets_.begin()) - 1;
}

std::pair<std::uint64_t, std::uint64_t> LengthEpoch::gather_window(
    std::uint64_t w, std::vector<std::uint64_t>& items, std::vector<std::uint64_t>& lens) const {
    const std::uint64_t first = w * window_;
    const auto m = static_cast<std::size_t>(std::min(window_, lengths_.n - first));
    items.resize(m);
    lens.resize(m);
    std::iota(items.begin(), items.end(), first);
    perm_.apply(items.data(), m);  // positions -> the epoch's items
    std::uint64_t lo = ~std::uint64_t{0}, hi = 0;
    with_type(lengths_.type, [&](auto tag) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
        const T* data = static_cast<const T*>(lengths_.data);
        for (std::size_t i = 0; i < m; ++i) {
            const auto v = static_cast<std::uint64_t>(data[items[i]]);  // checked >= 0
            lens[i] = v;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
    });
    return {lo, hi};
}

void LengthEpoch::sorted_window(std::uint64_t w, std::vector<std::uint64_t>& lens,
                                std::vector<std::uint64_t>& items) const {
    const auto [lo, hi] = gather_window(w, items, lens);
    const std::size_t m = items.size();
    const unsigned range_bits = bit_width(hi - lo);
    const unsigned index_bits = bit_width(m - 1);
    if (range_bits + index_bits <= 64) {
        // (length - lo, position in window) packed in one word: one radix sort orders by
        // length, ties by position, with no comparisons.
        std::vector<std::uint64_t> keys(m), tmp(m);
        for (std::size_t i = 0; i < m; ++i) keys[i] = ((lens[i] - lo) << index_bits) | i;
        radix_sort(keys.data(), tmp.data(), m, range_bits + index_bits);
        const std::uint64_t mask = (std::uint64_t{1} << index_bits) - 1;
        for (std::size_t i = 0; i < m; ++i) {
            const std::uint64_t pos = index_bits == 0 ? 0 : keys[i] & mask;
            tmp[i] = items[pos];
            keys[i] = lens[pos];
        }
        items.swap(tmp);
        lens.swap(keys);
        return;
    }
    // Lengths too far apart to pack with the position: the same order, by comparisons.
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

std::uint64_t LengthEpoch::count_window(std::uint64_t w, std::vector<std::uint64_t>& lens,
                                        std::vector<std::uint64_t>& scratch) const {
    const auto [lo, hi] = gather_window(w, scratch, lens);
    const std::size_t m = lens.size();
    if (hi - lo >= 4 * static_cast<std::uint64_t>(m)) {
        // Lengths spread over many values: sort them alone (positions do not matter here).
        for (auto& v : lens) v -= lo;
        radix_sort(lens.data(), scratch.data(), m, bit_width(hi - lo));
        for (auto& v : lens) v += lo;
        return cut(lens.data(), m, rule_, [](std::uint64_t) {});
    }
    // Few distinct values: only how many items have each length matters, a histogram. The
    // greedy cut of the sorted window, one run of equal lengths v at a time: items go into
    // the open batch while it holds fewer than capacity(v), then fill whole batches of
    // capacity(v), the last of them left open.
    scratch.assign(static_cast<std::size_t>(hi - lo) + 1, 0);
    for (const auto v : lens) ++scratch[static_cast<std::size_t>(v - lo)];
    std::uint64_t batches = 0, open = 0;
    for (std::size_t i = 0; i < scratch.size(); ++i) {
        std::uint64_t c = scratch[i];
        if (c == 0) continue;
        const std::uint64_t cap = rule_.capacity(lo + i);
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

void LengthEpoch::build(std::uint64_t w, WindowBatches& out) const {
    std::vector<std::uint64_t> lens;
    sorted_window(w, lens, out.items);
    out.starts.clear();
    const std::uint64_t m = lens.size();
    const std::uint64_t batches = cut(lens.data(), m, rule_, [&](std::uint64_t i) { out.starts.push_back(i); });
    out.starts.push_back(m);
    if (batches != offsets_[w + 1] - offsets_[w])
        throw std::logic_error("length-grouped window: batch count differs from the epoch's count");
    out.order = std::make_unique<Feistel>(batches, derive_key(kLengthDomain + 1, w, seed_, epoch_));
    out.window = w;
}

void LengthShard::global_batch(std::uint64_t g, std::vector<std::uint64_t>& out) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t w = epoch_->window_of(g);
    if (cache_.window != w) {
        cache_.window = ~std::uint64_t{0};  // invalid until the build completes
        epoch_->build(w, cache_);
    }
    const std::uint64_t b = (*cache_.order)(g - epoch_->window_offset(w));
    const auto begin = cache_.items.begin() + static_cast<std::ptrdiff_t>(cache_.starts[b]);
    const auto end = cache_.items.begin() + static_cast<std::ptrdiff_t>(cache_.starts[b + 1]);
    out.insert(out.end(), begin, end);
}

}  // namespace fastshard
