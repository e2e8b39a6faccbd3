#include "fastshard/packed.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "fastshard/clones.hpp"
#include "fastshard/mix.hpp"
#include "fastshard/parallel.hpp"

namespace fastshard {

namespace {

__extension__ typedef unsigned __int128 u128;  // __extension__: no -pedantic warning

constexpr std::uint64_t kScanBlock = 1 << 16;

// Best-fit decreasing over sizes given in decreasing order: each goes into the open row with the
// least room that still holds it (ties: the oldest row), else opens a row. place(i, row).
class BestFit {
  public:
    explicit BestFit(std::uint64_t seq_len) : seq_len_(seq_len) {}
    std::uint64_t add(std::uint64_t size) {
        const auto it = open_.lower_bound({size, 0});
        std::uint64_t row;
        std::uint64_t room;
        if (it == open_.end()) {
            row = rows_++;
            room = seq_len_ - size;
        } else {
            row = it->second;
            room = it->first - size;
            open_.erase(it);
        }
        if (room > 0) open_.insert({room, row});
        return row;
    }
    std::uint64_t rows() const noexcept { return rows_; }

  private:
    std::uint64_t seq_len_;
    std::uint64_t rows_ = 0;
    std::set<std::pair<std::uint64_t, std::uint64_t>> open_;
};

// The checksum's terms over a run, in a loop of their own (nothing else in it, so that it
// vectorises: two 64-bit multiplies per item, 1.4 ns an item scalar on this project's 2-core
// AMD EPYC, 0.3 ns with AVX-512's vpmullq; bench/RESULTS.md, "Packed rows").
template <class T>
inline std::uint64_t checksum_terms(const T* data, std::uint64_t first, std::uint64_t count) {
    std::uint64_t checksum = 0;
    for (std::uint64_t k = first; k < first + count; ++k)  // the value as a signed 64-bit word
        checksum += length_term(static_cast<std::uint64_t>(static_cast<std::int64_t>(data[k])), k);
    return checksum;
}

}  // namespace

// One version per instruction set (clones.hpp), one function per length type: external, since
// a clone's dispatch needs a symbol of its own.
#define FASTSHARD_CHECKSUM_RUN(T)                                                                \
    FASTSHARD_CLONES_MUL64 std::uint64_t checksum_run(const T* data, std::uint64_t first,      \
                                                      std::uint64_t count) {                    \
        return checksum_terms(data, first, count);                                               \
    }
FASTSHARD_CHECKSUM_RUN(std::int8_t)
FASTSHARD_CHECKSUM_RUN(std::int16_t)
FASTSHARD_CHECKSUM_RUN(std::int32_t)
FASTSHARD_CHECKSUM_RUN(std::int64_t)
FASTSHARD_CHECKSUM_RUN(std::uint8_t)
FASTSHARD_CHECKSUM_RUN(std::uint16_t)
FASTSHARD_CHECKSUM_RUN(std::uint32_t)
FASTSHARD_CHECKSUM_RUN(std::uint64_t)
#undef FASTSHARD_CHECKSUM_RUN

// A run's lengths of up to 32 bits: the sum of those > 0 (a run of < 2^32 of them sums in 64 bits)
// and the least. Compiled like checksum_run: the baseline (SSE2) has no unsigned 32-bit minimum;
// in concat's read of 10^8 uint32 lengths this loop took 4-5% of the samples in the baseline copy,
// 1% in the x86-64-v4 one (bench/RESULTS.md, "Concat's read: compress and clones").
template <class T>
struct SumLeast {
    std::uint64_t total;
    T least;
};
#define FASTSHARD_SUM_LEAST_RUN(T)                                                              \
    FASTSHARD_CLONES_MUL64 SumLeast<T> sum_least_run(const T* data, std::uint64_t first,       \
                                                     std::uint64_t count) {                    \
        std::uint64_t total = 0;                                                                 \
        T least = data[first];                                                                   \
        for (std::uint64_t k = first; k < first + count; ++k) {                                  \
            const T v = data[k];                                                                 \
            total += static_cast<std::uint64_t>(v > 0 ? v : 0);                                  \
            least = v < least ? v : least;                                                       \
        }                                                                                        \
        return {total, least};                                                                   \
    }
FASTSHARD_SUM_LEAST_RUN(std::int8_t)
FASTSHARD_SUM_LEAST_RUN(std::int16_t)
FASTSHARD_SUM_LEAST_RUN(std::int32_t)
FASTSHARD_SUM_LEAST_RUN(std::uint8_t)
FASTSHARD_SUM_LEAST_RUN(std::uint16_t)
FASTSHARD_SUM_LEAST_RUN(std::uint32_t)
#undef FASTSHARD_SUM_LEAST_RUN

namespace {

struct WindowCache {
    std::uint64_t window = ~std::uint64_t{0};
    std::vector<std::uint64_t> docs, starts;
    std::unique_ptr<Feistel> order;
    StratumItems stratum;  // the documents of the window's stratum
};

}  // namespace

PackedScan scan_packed(const Lengths& lengths, std::uint64_t seq_len, bool best_fit, bool split, unsigned threads,
                       bool with_checksum) {
    if (seq_len == 0) throw std::invalid_argument("seq_len must be >= 1");
    const std::uint64_t n = lengths.n;
    const std::uint64_t blocks = (n + kScanBlock - 1) / kScanBlock;
    struct Part {
        std::int64_t first = -1;
        u128 total = 0;
        std::uint64_t full = 0, truncated = 0, checksum = 0;
        std::vector<std::uint64_t> hist;
    };
    std::vector<Part> parts(threads == 0 ? default_threads() : threads);
    const unsigned used = with_type(lengths.type, [&](auto tag) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
        const T* data = static_cast<const T*>(lengths.data);
        return parallel_for(blocks, static_cast<unsigned>(parts.size()), 4,
                            [&](unsigned part, std::uint64_t b0, std::uint64_t count) {
                                Part p;
                                if (best_fit) p.hist.assign(static_cast<std::size_t>(seq_len) + 1, 0);
                                const std::uint64_t end = std::min(n, (b0 + count) * kScanBlock);
                                for (std::uint64_t k = b0 * kScanBlock; k < end; ++k) {
                                    if (with_checksum && k % kScanBlock == 0)  // the block's, while it is in cache
                                        p.checksum += checksum_run(data, k, std::min(end - k, kScanBlock));
                                    const T v = data[k];
                                    if (!(v > 0)) {
                                        if (p.first < 0) p.first = static_cast<std::int64_t>(k);
                                        continue;
                                    }
                                    const auto u = static_cast<std::uint64_t>(v);
                                    p.total += u;
                                    if (!best_fit) continue;
                                    if (u <= seq_len) {
                                        ++p.hist[static_cast<std::size_t>(u)];
                                    } else if (split) {
                                        const std::uint64_t full = (u - 1) / seq_len;
                                        p.full += full;
                                        ++p.hist[static_cast<std::size_t>(u - full * seq_len)];
                                    } else {
                                        p.truncated += u - seq_len;
                                        ++p.hist[static_cast<std::size_t>(seq_len)];
                                    }
                                }
                                parts[part] = std::move(p);
                            });
    });
    PackedScan s;
    u128 total = 0;
    std::uint64_t checksum = 0;
    if (best_fit) s.histogram.assign(static_cast<std::size_t>(seq_len) + 1, 0);
    for (unsigned i = 0; i < used; ++i) {
        const Part& p = parts[i];
        if (p.first >= 0 && (s.first_nonpositive < 0 || p.first < s.first_nonpositive)) s.first_nonpositive = p.first;
        total += p.total;
        checksum += p.checksum;
        s.full_pieces += p.full;
        s.truncated_tokens += p.truncated;
        for (std::size_t e = 0; e < p.hist.size(); ++e) s.histogram[e] += p.hist[e];
    }
    s.total_overflow = total > static_cast<u128>(~std::uint64_t{0});
    s.total = s.total_overflow ? ~std::uint64_t{0} : static_cast<std::uint64_t>(total);
    if (with_checksum) s.checksum = length_checksum(checksum, n);
    return s;
}

// -- per-window sums over the order -----------------------------------------------------------

OrderSums::OrderSums(const Lengths& lengths, const Feistel& perm, std::uint64_t window, std::uint64_t seq_len,
                     Weight weight, unsigned threads)
    : lengths_(&lengths), perm_(&perm), window_(window), seq_len_(seq_len), kind_(weight) {
    if (window == 0) throw std::invalid_argument("window must be >= 1");
    prefix_ = window_weight_sums(lengths, perm, window, threads,
                                 [this](std::uint64_t v) { return this->weight(v); });
    for (std::size_t w = 1; w < prefix_.size(); ++w) prefix_[w] += prefix_[w - 1];
}

OrderSums::OrderSums(const Lengths& lengths, const Feistel& perm, std::uint64_t window, std::uint64_t seq_len,
                     Weight weight, std::vector<std::uint64_t> window_weights)
    : lengths_(&lengths), perm_(&perm), window_(window), seq_len_(seq_len), kind_(weight) {
    if (window == 0) throw std::invalid_argument("window must be >= 1");
    const std::uint64_t windows = lengths.n == 0 ? 0 : (lengths.n - 1) / window + 1;
    if (window_weights.size() != windows + 1) throw std::logic_error("OrderSums: one weight per window expected");
    prefix_ = std::move(window_weights);
    for (std::size_t w = 1; w < prefix_.size(); ++w) prefix_[w] += prefix_[w - 1];
}

std::uint64_t OrderSums::weight(std::uint64_t length) const noexcept {
    if (kind_ == Weight::tokens) return length;
    return length > seq_len_ ? (length - 1) / seq_len_ : 0;
}

template <class F>
void OrderSums::walk_from(std::uint64_t u, F&& f) const {
    // The window holding unit u: prefix[w] <= u < prefix[w + 1] (windows of weight 0 skipped).
    const auto it = std::upper_bound(prefix_.begin(), prefix_.end(), u);
    const auto w = static_cast<std::uint64_t>(it - prefix_.begin()) - 1;
    std::uint64_t c = prefix_[static_cast<std::size_t>(w)];
    walk_order(*lengths_, *perm_, w * window_, lengths_->n, [&](std::uint64_t, std::uint64_t doc, std::uint64_t v) {
        const std::uint64_t wt = weight(v);
        const std::uint64_t first = c;
        c += wt;
        if (c <= u) return true;  // before unit u (or of weight 0)
        return static_cast<bool>(f(doc, first, wt));
    });
}

// -- concat -----------------------------------------------------------------------------------

ConcatEpoch::ConcatEpoch(const Lengths& lengths, std::uint64_t seq_len, bool overlap, std::uint64_t window,
                         std::uint64_t seed, std::uint64_t epoch, unsigned threads)
    : lengths_(lengths),
      seq_len_(seq_len),
      overlap_(overlap),
      perm_(lengths.n == 0 ? 1 : lengths.n, derive_key(kPackedDomain, lengths.n, seed, epoch)),
      sums_(lengths_, perm_, window, seq_len, OrderSums::Weight::tokens, threads),
      rows_(0),
      row_perm_(1, 0) {
    set_rows(seed, epoch);
}

ConcatEpoch::ConcatEpoch(const Lengths& lengths, std::uint64_t seq_len, bool overlap, std::uint64_t window,
                         std::uint64_t seed, std::uint64_t epoch, std::vector<std::uint64_t> window_tokens)
    : lengths_(lengths),
      seq_len_(seq_len),
      overlap_(overlap),
      perm_(lengths.n == 0 ? 1 : lengths.n, derive_key(kPackedDomain, lengths.n, seed, epoch)),
      sums_(lengths_, perm_, window, seq_len, OrderSums::Weight::tokens, std::move(window_tokens)),
      rows_(0),
      row_perm_(1, 0) {
    set_rows(seed, epoch);
}

void ConcatEpoch::set_rows(std::uint64_t seed, std::uint64_t epoch) {
    if (lengths_.n == 0) throw std::invalid_argument("lengths must not be empty");
    if (seq_len_ == 0) throw std::invalid_argument("seq_len must be >= 1");
    const std::uint64_t t = sums_.total();
    rows_ = overlap_ ? (t > seq_len_ ? (t - 1) / seq_len_ : 0) : t / seq_len_;
    if (rows_ == 0) throw std::invalid_argument("the documents hold fewer tokens than one row");
    row_perm_ = Feistel(rows_, derive_key(kPackedDomain + 1, rows_, seed, epoch));
}

namespace {

// scan_packed's checks and checksum (no best_fit) over one run of items, for concat_start. One
// cache line per thread's part: the parts are written after every run.
struct alignas(64) CheckPart {
    std::int64_t first = -1;
    u128 total = 0;
    std::uint64_t checksum = 0;
};

template <class T>
void check_run(const T* data, std::uint64_t first, std::uint64_t count, CheckPart& p) {
    p.checksum += checksum_run(data, first, count);
    const auto note_first = [&] {
        for (std::uint64_t k = first; k < first + count; ++k) {
            if (!(data[k] > 0)) {
                p.first = static_cast<std::int64_t>(k);
                return;
            }
        }
    };
    if constexpr (sizeof(T) <= 4) {
        if (count < (std::uint64_t{1} << 32)) {
            // A length <= 0 is looked for only where the run's smallest is one.
            const SumLeast<T> run = sum_least_run(data, first, count);
            p.total += run.total;
            if (!(run.least > 0) && p.first < 0) note_first();
            return;
        }
    }
    u128 total = 0;
    for (std::uint64_t k = first; k < first + count; ++k) {
        const T v = data[k];
        if (v > 0) total += static_cast<std::uint64_t>(v);
    }
    p.total += total;
    if (p.first < 0) {
        T least = data[first];
        for (std::uint64_t k = first; k < first + count; ++k) least = data[k] < least ? data[k] : least;
        if (!(least > 0)) note_first();
    }
}

}  // namespace

ConcatStart concat_start(const Lengths& lengths, std::uint64_t seq_len, bool overlap, std::uint64_t window,
                         std::uint64_t seed, std::uint64_t epoch, unsigned threads) {
    if (seq_len == 0) throw std::invalid_argument("seq_len must be >= 1");
    if (window == 0) throw std::invalid_argument("window must be >= 1");
    ConcatStart r;
    const std::uint64_t n = lengths.n;
    if (n == 0) {
        r.scan = scan_packed(lengths, seq_len, false, false, threads, true);
        return r;
    }
    if (threads == 0) threads = default_threads();
    const Feistel perm(n, derive_key(kPackedDomain, n, seed, epoch));  // ConcatEpoch's order
    std::vector<CheckPart> parts(threads);
    bool sequential = false;
    std::vector<std::uint64_t> tokens = window_weight_sums(
        lengths, perm, window, threads, [](std::uint64_t v) { return v; },
        [&parts](unsigned part, const auto* data, std::uint64_t first, std::uint64_t count) {
            check_run(data, first, count, parts[part]);
        },
        &sequential);
    if (sequential) {
        u128 total = 0;
        std::uint64_t checksum = 0;
        for (const CheckPart& p : parts) {  // each part's first bad item; the first of them
            if (p.first >= 0 && (r.scan.first_nonpositive < 0 || p.first < r.scan.first_nonpositive))
                r.scan.first_nonpositive = p.first;
            total += p.total;
            checksum += p.checksum;
        }
        r.scan.total_overflow = total > static_cast<u128>(~std::uint64_t{0});
        r.scan.total = r.scan.total_overflow ? ~std::uint64_t{0} : static_cast<std::uint64_t>(total);
        r.scan.checksum = length_checksum(checksum, n);
    } else {
        r.scan = scan_packed(lengths, seq_len, false, false, threads, true);
    }
    // The sums hold garbage where a length is <= 0 (its bits as a uint64): the rows only if not.
    const std::uint64_t t = r.scan.total;
    const bool valid = r.scan.first_nonpositive < 0 && !r.scan.total_overflow && t <= (~std::uint64_t{0} >> 1);
    const std::uint64_t rows = overlap ? (t > seq_len ? (t - 1) / seq_len : 0) : t / seq_len;
    if (valid && rows != 0)
        r.epoch = std::make_shared<const ConcatEpoch>(lengths, seq_len, overlap, window, seed, epoch, std::move(tokens));
    return r;
}

void ConcatEpoch::row(std::uint64_t g, Segments& out, std::shared_ptr<void>&) const {
    const std::uint64_t i = row_perm_(g);
    const std::uint64_t t0 = i * seq_len_;
    const std::uint64_t t1 = t0 + seq_len_ + (overlap_ ? 1 : 0);
    sums_.walk_from(t0, [&](std::uint64_t doc, std::uint64_t first, std::uint64_t len) {
        const std::uint64_t a = std::max(t0, first), b = std::min(t1, first + len);
        out.insert(out.end(), {doc, a - first, b - first});
        return first + len < t1;
    });
}

// -- best_fit ---------------------------------------------------------------------------------

PackLayout::PackLayout(const Lengths& lengths, std::uint64_t seq_len, bool split, std::uint64_t window,
                       unsigned threads, std::uint64_t min_class_items)
    : lengths_(lengths), seq_len_(seq_len), split_(split), strata_(lengths.n, window, strata_per(lengths.n, window)) {
    if (lengths.n == 0) throw std::invalid_argument("lengths must not be empty");
    if (window == 0) throw std::invalid_argument("window must be >= 1");
    const PackedScan scan = scan_packed(lengths, seq_len, true, split, threads);
    if (scan.first_nonpositive >= 0) throw std::invalid_argument("lengths must be >= 1");
    full_rows_ = scan.full_pieces;
    truncated_tokens_ = scan.truncated_tokens;
    const std::uint64_t n = lengths.n;
    const std::uint64_t windows = (n - 1) / window + 1;
    // Classes: occupied packing lengths in increasing order, merged upwards (stratify.hpp); the
    // bound of a packing length is itself.
    std::vector<std::uint64_t> uppers(scan.histogram.size());
    std::iota(uppers.begin(), uppers.end(), std::uint64_t{0});
    for (std::size_t e = 1; e < scan.histogram.size(); ++e) packed_tokens_ += scan.histogram[e] * e;
    strata_.set_classes(
        LengthClasses(scan.histogram, uppers,
                      min_class_items != 0 ? min_class_items : class_min_items(n, strata_.num_strata())));
    // Each window's row count from its class quotas alone: the same in every epoch.
    offsets_.assign(static_cast<std::size_t>(windows) + 1, 0);
    const std::uint32_t classes = num_classes();
    const std::uint64_t per = strata_.per_stratum();
    parallel_for(strata_.num_strata(), threads, 1, [&](unsigned, std::uint64_t t0, std::uint64_t count) {
        std::vector<std::uint64_t> stratum, quota;
        for (std::uint64_t t = t0; t < t0 + count; ++t) {
            strata_.stratum_quotas(t, stratum);
            for (std::uint64_t j = 0; j < strata_.windows_in(t); ++j) {
                BestFit fit(seq_len);
                strata_.share(t, stratum, j, quota);
                for (std::uint32_t b = classes; b-- > 0;)
                    for (std::uint64_t k = 0; k < quota[b]; ++k) fit.add(class_upper(b));
                offsets_[static_cast<std::size_t>(t * per + j) + 1] = fit.rows();
            }
        }
    });
    for (std::size_t w = 1; w < offsets_.size(); ++w) offsets_[w] += offsets_[w - 1];
}

std::uint64_t PackLayout::window_of(std::uint64_t p) const noexcept {
    // The last window whose offset is <= p (a window of fewer documents may have no row at all).
    const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), p);
    return static_cast<std::uint64_t>(it - offsets_.begin()) - 1;
}

BestFitEpoch::BestFitEpoch(std::shared_ptr<const PackLayout> layout, std::uint64_t seed, std::uint64_t epoch,
                           unsigned threads)
    : layout_(std::move(layout)),
      seed_(seed),
      epoch_(epoch),
      perm_(layout_->lengths().n, derive_key(kPackedDomain, layout_->lengths().n, seed, epoch)) {
    const PackLayout& L = *layout_;
    prefix_ = ClassPrefix(L.strata(), L.lengths(), perm_, [&L](std::uint64_t v) { return L.class_of(v); }, threads);
    if (L.full_rows() != 0)
        full_ = std::make_unique<OrderSums>(L.lengths(), perm_, L.window_size(), L.seq_len(),
                                            OrderSums::Weight::full_pieces, threads);
}

void BestFitEpoch::gather(std::uint64_t w, std::vector<std::uint64_t>& docs, std::vector<std::uint32_t>& cls,
                          StratumItems& stratum) const {
    const PackLayout& L = *layout_;
    const std::uint64_t t = L.strata().stratum_of(w);
    if (stratum.stratum != t) {  // read the stratum's documents, kept for its other windows
        stratum.clear();
        WindowRanks ranks = prefix_.stratum_ranks(L.strata(), t);
        walk_order(L.lengths(), perm_, ranks.p0, ranks.p1, [&](std::uint64_t, std::uint64_t doc, std::uint64_t v) {
            const std::uint32_t b = L.class_of(v);
            if (ranks.take(b)) {
                stratum.items.push_back(doc);
                stratum.classes.push_back(b);
            }
        });
        stratum.stratum = t;
    }
    docs.clear();
    cls.clear();
    select_window(L.strata(), w, stratum.classes, [&](std::size_t i) {
        docs.push_back(stratum.items[i]);
        cls.push_back(stratum.classes[i]);
    });
}

void BestFitEpoch::build(std::uint64_t w, std::vector<std::uint64_t>& docs, std::vector<std::uint64_t>& starts,
                         StratumItems* stratum) const {
    const PackLayout& L = *layout_;
    std::vector<std::uint64_t> found;
    std::vector<std::uint32_t> cls;
    StratumItems own;
    gather(w, found, cls, stratum != nullptr ? *stratum : own);
    // Decreasing class bound, ties in the order's position order: what the layout counted.
    std::vector<std::uint32_t> idx(found.size());
    std::iota(idx.begin(), idx.end(), 0U);
    std::stable_sort(idx.begin(), idx.end(), [&](std::uint32_t a, std::uint32_t b) { return cls[a] > cls[b]; });
    BestFit fit(L.seq_len());
    std::vector<std::uint64_t> row_of(found.size());
    for (std::size_t k = 0; k < idx.size(); ++k) row_of[k] = fit.add(L.class_upper(cls[idx[k]]));
    const std::uint64_t rows = fit.rows();
    if (rows != L.window_offset(w + 1) - L.window_offset(w))
        throw std::logic_error(
            "best_fit window: row count differs from the layout's count (were the lengths modified while "
            "the sampler was in use?)");
    starts.assign(static_cast<std::size_t>(rows) + 1, 0);
    for (const auto r : row_of) ++starts[static_cast<std::size_t>(r) + 1];
    for (std::size_t r = 1; r < starts.size(); ++r) starts[r] += starts[r - 1];
    docs.assign(found.size(), 0);
    std::vector<std::uint64_t> fill(starts.begin(), starts.end() - 1);
    for (std::size_t k = 0; k < idx.size(); ++k) docs[static_cast<std::size_t>(fill[row_of[k]]++)] = found[idx[k]];
}

void BestFitEpoch::piece(std::uint64_t doc, std::uint64_t length, Segments& out) const {
    const std::uint64_t s = layout_->seq_len();
    if (length <= s) out.insert(out.end(), {doc, 0, length});
    else if (layout_->split()) out.insert(out.end(), {doc, (length - 1) / s * s, length});
    else out.insert(out.end(), {doc, 0, s});
}

void BestFitEpoch::row(std::uint64_t g, Segments& out, std::shared_ptr<void>& cache) const {
    const PackLayout& L = *layout_;
    const std::uint64_t total = L.num_rows(), full = L.full_rows();
    // Full pieces interleaved evenly: c(g) = floor(g F / R) of them lie before position g.
    const auto c = [&](std::uint64_t x) { return static_cast<std::uint64_t>(static_cast<u128>(x) * full / total); };
    const std::uint64_t before = c(g);
    if (full != 0 && c(g + 1) > before) {
        const std::uint64_t s = L.seq_len();
        full_->walk_from(before, [&](std::uint64_t doc, std::uint64_t first, std::uint64_t) {
            const std::uint64_t j = before - first;
            out.insert(out.end(), {doc, j * s, (j + 1) * s});
            return false;
        });
        return;
    }
    const std::uint64_t p = g - before;
    const std::uint64_t w = L.window_of(p);
    if (!cache) cache = std::make_shared<WindowCache>();
    auto& wc = *static_cast<WindowCache*>(cache.get());
    if (wc.window != w) {
        wc.window = ~std::uint64_t{0};  // invalid until the build completes
        build(w, wc.docs, wc.starts, &wc.stratum);
        const std::uint64_t rows = wc.starts.size() - 1;
        wc.order = std::make_unique<Feistel>(rows == 0 ? 1 : rows, derive_key(kPackedDomain + 2, w, seed_, epoch_));
        wc.window = w;
    }
    const std::uint64_t b = (*wc.order)(p - L.window_offset(w));
    for (std::uint64_t k = wc.starts[b]; k < wc.starts[b + 1]; ++k) {
        const std::uint64_t doc = wc.docs[static_cast<std::size_t>(k)];
        piece(doc, length_at(L.lengths(), doc), out);
    }
}

}  // namespace fastshard
