#include "fastshard/weighted.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "fastshard/clones.hpp"
#include "fastshard/mix.hpp"
#include "fastshard/parallel.hpp"
#include "fastshard/shard.hpp"

#if defined(_MSC_VER) && !defined(__clang__) && (defined(_M_X64) || defined(_M_ARM64))
#include <intrin.h>  // _BitScanForward64
#endif
#if defined(_MSC_VER) && !defined(__clang__) && (defined(_M_X64) || defined(_M_IX86))
#include <xmmintrin.h>  // _mm_prefetch
#endif

// SSE2 is part of x86-64: the light bits' pass uses it without a runtime check.
#if !defined(FASTSHARD_NO_SSE2) && (defined(__SSE2__) || defined(_M_X64))
#define FASTSHARD_SSE2 1
#include <emmintrin.h>
#else
#define FASTSHARD_SSE2 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define FASTSHARD_PREFETCH(p) __builtin_prefetch(p)
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#define FASTSHARD_PREFETCH(p) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0)
#else
#define FASTSHARD_PREFETCH(p) ((void)0)
#endif

namespace fastshard {

namespace {

constexpr std::uint64_t kFull = AliasTable::kFull;  // threshold of a bucket that keeps its item

std::uint64_t to_threshold(double q) noexcept {
    // q in [0, 1): P(keep) = threshold / 2^32, rounded down; never reaches a full bucket.
    // Truncation is the floor for t > 0 (and needs no SSE4.1 round instruction).
    // Clamped without a branch (max and min instructions): t <= 0 (and NaN) gives 0, and every
    // t >= 2^32 - 2 gives 2^32 - 2, what truncating or capping it gave.
    const double t = q * 4294967296.0;
#if FASTSHARD_SSE2
    // maxsd and minsd are these two selections exactly (NaN t gives the second operand, 0).
    const __m128d low = _mm_max_sd(_mm_set_sd(t), _mm_setzero_pd());
    const double clamped = _mm_cvtsd_f64(_mm_min_sd(low, _mm_set_sd(4294967294.0)));
#else
    const double low = t > 0.0 ? t : 0.0;
    const double clamped = low < 4294967294.0 ? low : 4294967294.0;
#endif
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(clamped));
}

// What a run of blocks contributes to a WeightsSummary besides the blocks' sums.
struct Partial {
    std::int64_t first_invalid = -1;
    std::uint64_t positive = 0;
    std::uint64_t checksum = 0;  // sum of the items' hashes, mod 2^64 (order-free)
    double max = 0.0;
    double min_positive = std::numeric_limits<double>::infinity();

    void merge(const Partial& o) noexcept {
        if (o.first_invalid >= 0 && (first_invalid < 0 || o.first_invalid < first_invalid))
            first_invalid = o.first_invalid;
        positive += o.positive;
        checksum += o.checksum;
        max = std::max(max, o.max);
        min_positive = std::min(min_positive, o.min_positive);
    }
};

inline std::uint64_t to_bits(double v) noexcept {
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits;
}
inline double from_bits(std::uint64_t bits) noexcept {
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}

inline bool valid_weight(double v) noexcept { return v >= 0.0 && v <= std::numeric_limits<double>::max(); }

// Blocks summed side by side: each block's sum is still its items added left to right (the
// rounding the sum is defined by), but kSideBySide blocks' chains of additions are independent
// and overlap, where one block alone waits about 4 cycles on each addition.
constexpr std::uint64_t kSideBySide = 8;

}  // namespace

// The fields of a WeightsSummary other than the sum over the items [first, first + len), in
// a loop without the sum's chain of additions so that it vectorises: the checksum's two 64-bit
// multiplies per item take vpmullq (AVX-512DQ) where the CPU has it (clones.hpp; 1.4 ns an item
// scalar against about 0.3 for the lengths' checksum). Every field is exact, so the lanes give
// what one item after the other gave. External: a clone's dispatch needs a symbol of its own.
struct WeightTerms {
    std::uint64_t checksum = 0, positive = 0;
    double max = 0.0, min_positive = 0.0;
    bool bad = false;
};
FASTSHARD_CLONES_MUL64 void weight_terms(const double* w, std::uint64_t first, std::uint64_t len,
                                         WeightTerms& t) noexcept {
    // On the bits, so that every reduction is an integer one the compiler vectorises: positive
    // doubles (+inf included) are the words 1 ... kInf, ordered as their values. The largest
    // positive weight is the max of the words up to kInf (others count as 0), the smallest the
    // min of word - 1 (zero wraps to the top; negative and NaN words are kInf or more).
    constexpr std::uint64_t kInf = 0x7ff0000000000000ULL, kMaxFinite = 0x7fefffffffffffffULL;
    constexpr std::uint64_t kMinusZero = 0x8000000000000000ULL;
    std::uint64_t checksum = 0, positive = 0, bad = 0;
    std::uint64_t max = to_bits(t.max), min_less_1 = to_bits(t.min_positive) - 1;
    for (std::uint64_t k = first; k < first + len; ++k) {
        const std::uint64_t bits = to_bits(w[k]);
        bad |= (bits > kMaxFinite) & (bits != kMinusZero);  // negative, NaN or infinite
        positive += bits - 1 < kInf;
        max = std::max(max, bits & (std::uint64_t{0} - std::uint64_t{bits <= kInf}));
        min_less_1 = std::min(min_less_1, bits - 1);
        checksum += mix64(bits + k * kGolden);
    }
    t.checksum += checksum;
    t.positive += positive;
    t.bad |= bad != 0;
    t.max = from_bits(max);
    t.min_positive = from_bits(min_less_1 + 1);
}

namespace {

// Sums of the blocks [b0, b0 + count) of kSumBlock items (the last may be shorter: n ends it).
void block_sums(const double* w, std::uint64_t n, std::uint64_t b0, std::uint64_t count, double* sums) noexcept {
    std::uint64_t b = b0;
    for (; b + kSideBySide <= b0 + count && (b + kSideBySide) * kSumBlock <= n; b += kSideBySide) {
        const double* base = w + b * kSumBlock;
        double s[kSideBySide] = {};
        for (std::uint64_t k = 0; k < kSumBlock; ++k)
            for (std::uint64_t g = 0; g < kSideBySide; ++g) s[g] += base[g * kSumBlock + k];
        for (std::uint64_t g = 0; g < kSideBySide; ++g) sums[b + g] = s[g];
    }
    for (; b < b0 + count; ++b) {
        double sum = 0.0;
        const std::uint64_t end = std::min(n, (b + 1) * kSumBlock);
        for (std::uint64_t k = b * kSumBlock; k < end; ++k) sum += w[k];
        sums[b] = sum;
    }
}

}  // namespace

WeightsSummary summarize_weights(const double* w, std::uint64_t n, unsigned threads) {
    // Fixed blocks, whatever the number of threads: which thread sums a block changes nothing.
    const std::uint64_t blocks = (n + kSumBlock - 1) / kSumBlock;
    std::vector<double> sums(static_cast<std::size_t>(blocks));
    std::vector<Partial> parts(threads == 0 ? default_threads() : threads);
    parallel_for(blocks, static_cast<unsigned>(parts.size()), 64,
                 [&](unsigned part, std::uint64_t b0, std::uint64_t count) {
                     Partial p;
                     // A group of blocks at a time (256 KiB: the sums read it again from L2).
                     for (std::uint64_t g = b0; g < b0 + count; g += kSideBySide) {
                         const std::uint64_t m = std::min(kSideBySide, b0 + count - g);
                         const std::uint64_t first = g * kSumBlock, len = std::min(n, (g + m) * kSumBlock) - first;
                         WeightTerms t;
                         t.max = p.max;
                         t.min_positive = p.min_positive;
                         weight_terms(w, first, len, t);
                         block_sums(w, n, g, m, sums.data());
                         p.positive += t.positive;
                         p.checksum += t.checksum;
                         p.max = t.max;
                         p.min_positive = t.min_positive;
                         if (t.bad && p.first_invalid < 0) {  // rare: find the group's first invalid item
                             for (std::uint64_t k = first; k < first + len; ++k) {
                                 if (!valid_weight(w[k])) {
                                     p.first_invalid = static_cast<std::int64_t>(k);
                                     break;
                                 }
                             }
                         }
                     }
                     parts[part] = p;
                 });
    Partial all;
    for (const Partial& p : parts) all.merge(p);
    WeightsSummary s;
    for (const double b : sums) s.sum += b;  // in block order: the same sum on every machine
    s.first_invalid = all.first_invalid;
    s.positive = all.positive;
    s.checksum = mix64(all.checksum ^ n);
    s.max = all.max;
    s.min_positive = all.positive > 0 ? all.min_positive : 0.0;
    return s;
}

AliasTable::AliasTable(const double* w, std::uint64_t n, const WeightsSummary& summary,
                       std::uint64_t segment)
    : n_(n) {
    if (n == 0 || summary.first_invalid >= 0 || summary.positive == 0 || !(summary.max > 0.0))
        throw std::invalid_argument("weights must be non-empty, finite and >= 0, and one must be positive");
    if (segment == 0 || segment % kSweepBlock != 0)
        throw std::invalid_argument("the sweep's segment must be a positive multiple of 4096 items");
    constexpr double kMinNormal = std::numeric_limits<double>::min();
    const int k = -std::ilogb(summary.max);  // max * 2^k in [1, 2)
    const double scale = static_cast<double>(n) / summary.sum;
    // The weights as they are give the normalised table exactly when every value involved
    // stays normal in both scales: multiplying by 2^k then rounds nothing, so every partial
    // sum, the sum and n / sum are exact images of the normalised ones, and the products
    // w * scale are the same real numbers, rounded the same way.
    const bool as_is = summary.min_positive >= kMinNormal &&
                       std::ldexp(summary.min_positive, k) >= kMinNormal && std::isfinite(summary.sum) &&
                       scale >= kMinNormal && scale <= std::numeric_limits<double>::max();
    HugeArray<double> normal;
    const double* data = w;
    double q_scale = scale;
    if (!as_is) {
        normal = make_huge_array<double>(static_cast<std::size_t>(n));
        double* out = normal.get();
        parallel_for(n, 0, std::uint64_t{1} << 16, [&](unsigned, std::uint64_t begin, std::uint64_t len) {
            for (std::uint64_t i = begin; i < begin + len; ++i) out[i] = std::ldexp(w[i], k);  // one rounding
        });
        data = out;
        q_scale = static_cast<double>(n) / summarize_weights(out, n, 0).sum;  // sum in [1, 2n)
    }
    if (n <= (std::uint64_t{1} << 32)) {
        build(small_, data, q_scale, segment);
    } else {
        build(large_, data, q_scale, segment);
    }
}

AliasTable::AliasTable(std::uint64_t n, const void* bytes, std::size_t size) : n_(n) {
    auto restore = [&](auto& table) {
        using Bucket = typename std::remove_reference_t<decltype(table)>::element_type;
        if (n == 0 || size / sizeof(Bucket) != n || size % sizeof(Bucket) != 0)
            throw std::invalid_argument("an alias table's bytes do not match its number of items");
        table = make_huge_array<Bucket>(static_cast<std::size_t>(n));
        std::memcpy(table.get(), bytes, size);
        for (std::uint64_t b = 0; b < n; ++b)
            if (static_cast<std::uint64_t>(table[b].alias) >= n ||
                static_cast<std::uint64_t>(table[b].threshold) > kFull)
                throw std::invalid_argument("an alias table's bytes hold a bucket out of range");
    };
    if (n <= (std::uint64_t{1} << 32)) {
        restore(small_);
    } else {
        restore(large_);
    }
}

namespace {

int count_trailing_zeros(std::uint64_t v) noexcept {  // v != 0
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(v);
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_ARM64))
    unsigned long index;
    _BitScanForward64(&index, v);
    return static_cast<int>(index);
#else
    int c = 0;
    while ((v & 1) == 0) {
        v >>= 1;
        ++c;
    }
    return c;
#endif
}

// The sweep in segments. The sequential sweep is a merge of two sequences: light i (in index
// order) starts at deficit mass D(i-1), the sum of 1 - q over the lights before it, and is
// filled by the first heavy j whose cumulative excess E(j), the sum of q - 1 over the heavies
// up to j, reaches that start; heavy j is emptied (its own bucket written) once the lights'
// deficits pass E(j). So the state of the sweep at the first light of any index range follows
// from two prefix sums: a = D(lights before it), the current heavy is the first with E(j) >= a,
// and it still holds 1 + E(j) - a. Per-block sums of deficits and excesses, computed in
// parallel with the light bits, give that state at the start of every segment; the segments
// then sweep independently, each writing its own lights and the heavies from its start heavy
// up to the next segment's. The segments depend on n and the segment size only, never on the
// number of threads, so the table is the same on every machine; for n <= segment it is the
// sequential sweep. Rounding in the prefix sums moves at most a boundary heavy's mass by about
// 1e-12 of a bucket, far below the table's 2^-32 resolution.
constexpr std::uint64_t kBlock = AliasTable::kSweepBlock;  // items per block sum

// Word w of the light bits xor-ed with `flip` (0: lights, ~0: heavies), the bits past item n
// cleared.
inline std::uint64_t kind_word(const std::uint64_t* words, std::size_t count, std::uint64_t n, std::uint64_t flip,
                               std::uint64_t w) noexcept {
    std::uint64_t bits = words[w] ^ flip;
    if (w + 1 == count && n % 64 != 0) bits &= (std::uint64_t{1} << (n % 64)) - 1;
    return bits;
}

// The first item i' >= i of one kind, found in the words with count-trailing-zeros; n if none
// (LightBits::next_light and next_heavy).
inline std::uint64_t next_of_kind(const std::vector<std::uint64_t>& words, std::uint64_t n, std::uint64_t flip,
                                  std::uint64_t i) noexcept {
    if (i >= n) return n;
    std::uint64_t w = i / 64;
    std::uint64_t bits = kind_word(words.data(), words.size(), n, flip, w) & (~std::uint64_t{0} << (i % 64));
    while (bits == 0) {
        if (++w >= words.size()) return n;
        bits = kind_word(words.data(), words.size(), n, flip, w);
    }
    return w * 64 + static_cast<std::uint64_t>(count_trailing_zeros(bits));
}

// One bit per item, set for the light ones (below the mean): finding the next light or heavy
// item is a scan of words with count-trailing-zeros instead of one unpredictable branch per
// item. Filled together with each block's deficit and excess sums.
class LightBits {
  public:
    LightBits(const double* w, std::uint64_t n, double scale)
        : n_(n), words_((n + 63) / 64, 0), blocks_((n + kBlock - 1) / kBlock) {
        deficit_.assign(static_cast<std::size_t>(blocks_) + 1, 0.0);
        excess_.assign(static_cast<std::size_t>(blocks_) + 1, 0.0);
        parallel_for(blocks_, 0, 64, [&](unsigned, std::uint64_t b0, std::uint64_t count) {
            for (std::uint64_t b = b0; b < b0 + count; ++b) fill_block(w, scale, b);
        });
        // Prefix sums: deficit_[b] is then the deficit of the lights before block b.
        double d = 0.0, e = 0.0;
        for (std::uint64_t b = 0; b <= blocks_; ++b) {
            const double bd = deficit_[b], be = excess_[b];
            deficit_[b] = d;
            excess_[b] = e;
            d += bd;
            e += be;
        }
    }
    std::uint64_t next_light(std::uint64_t i) const noexcept { return next_of_kind(words_, n_, 0, i); }
    std::uint64_t next_heavy(std::uint64_t i) const noexcept { return next_of_kind(words_, n_, ~std::uint64_t{0}, i); }
    const std::vector<std::uint64_t>& words() const noexcept { return words_; }

    // Deficit of the lights before item `begin` (a multiple of kBlock).
    double deficit_before(std::uint64_t begin) const noexcept {
        return deficit_[static_cast<std::size_t>(begin / kBlock)];
    }
    // The first heavy whose cumulative excess reaches `a` and what it still holds there
    // (1 + E(j) - a); {n, 0} if no heavy does (possible only by rounding at the very end).
    std::pair<std::uint64_t, double> heavy_at(const double* w, double scale, double a) const {
        // The last block whose preceding excess is below a holds the crossing, or a later one.
        const auto it = std::lower_bound(excess_.begin(), excess_.end() - 1, a);
        std::uint64_t b = static_cast<std::uint64_t>(it - excess_.begin());
        b = b == 0 ? 0 : b - 1;
        double e = excess_[static_cast<std::size_t>(b)];
        for (std::uint64_t j = next_heavy(b * kBlock); j < n_; j = next_heavy(j + 1)) {
            e += w[j] * scale - 1.0;
            if (e >= a) return {j, 1.0 + (e - a)};
        }
        return {n_, 0.0};
    }

  private:
    void fill_block(const double* w, double scale, std::uint64_t b) {
        const std::uint64_t begin = b * kBlock, end = std::min(n_, begin + kBlock);
        // Four fixed lanes (item k of a word adds to lane k % 4) break the chain of dependent
        // additions and keep the sums independent of threads and of the code path: the SSE2
        // path below adds the same numbers in the same order as the portable one.
        double d[4] = {0.0, 0.0, 0.0, 0.0}, e[4] = {0.0, 0.0, 0.0, 0.0};
        for (std::uint64_t base = begin; base < end; base += 64) {
            const std::uint64_t m = std::min<std::uint64_t>(64, end - base);
            std::uint64_t word = 0;
            std::uint64_t k = 0;
#if FASTSHARD_SSE2
            const __m128d s = _mm_set1_pd(scale), one = _mm_set1_pd(1.0);
            __m128d d01 = _mm_loadu_pd(d), d23 = _mm_loadu_pd(d + 2);
            __m128d e01 = _mm_loadu_pd(e), e23 = _mm_loadu_pd(e + 2);
            for (; k + 4 <= m; k += 4) {
                const __m128d q01 = _mm_mul_pd(_mm_loadu_pd(w + base + k), s);
                const __m128d q23 = _mm_mul_pd(_mm_loadu_pd(w + base + k + 2), s);
                const __m128d l01 = _mm_cmplt_pd(q01, one), l23 = _mm_cmplt_pd(q23, one);
                word |= static_cast<std::uint64_t>(_mm_movemask_pd(l01) | (_mm_movemask_pd(l23) << 2)) << k;
                d01 = _mm_add_pd(d01, _mm_and_pd(l01, _mm_sub_pd(one, q01)));
                d23 = _mm_add_pd(d23, _mm_and_pd(l23, _mm_sub_pd(one, q23)));
                e01 = _mm_add_pd(e01, _mm_andnot_pd(l01, _mm_sub_pd(q01, one)));
                e23 = _mm_add_pd(e23, _mm_andnot_pd(l23, _mm_sub_pd(q23, one)));
            }
            _mm_storeu_pd(d, d01);
            _mm_storeu_pd(d + 2, d23);
            _mm_storeu_pd(e, e01);
            _mm_storeu_pd(e + 2, e23);
#endif
            for (; k < m; ++k) {
                const double q = w[base + k] * scale;
                const bool light = q < 1.0;
                word |= std::uint64_t{light} << k;
                // One of the two is 0 (selected by value, not by a branch).
                d[k % 4] += light ? 1.0 - q : 0.0;
                e[k % 4] += light ? 0.0 : q - 1.0;
            }
            words_[static_cast<std::size_t>(base / 64)] = word;
        }
        deficit_[static_cast<std::size_t>(b)] = (d[0] + d[1]) + (d[2] + d[3]);
        excess_[static_cast<std::size_t>(b)] = (e[0] + e[1]) + (e[2] + e[3]);
    }


    std::uint64_t n_;
    std::vector<std::uint64_t> words_;
    std::uint64_t blocks_;
    std::vector<double> deficit_;  // per block, then prefix sums
    std::vector<double> excess_;
};

// The items of one kind (flip as for kind_word) from a position on, below `bound`, in index
// order, with their q, in a small buffer filled ahead in runs: the sweep's step then reads its
// next candidates from the buffer instead of scanning bits and loading a weight on its chain
// of dependent instructions, and the stream that does not move costs nothing. Past the last
// item the buffer holds `bound` (whose q is never read).
class Buffered {
  public:
    static constexpr std::size_t kCap = 128;
    static constexpr std::size_t kBatch = 64;  // steps between two checks for a refill

    // `stop`: the item whose limit() is -inf (1 for the others).
    Buffered(const std::vector<std::uint64_t>& words, std::uint64_t n, std::uint64_t flip,
             std::uint64_t from, std::uint64_t bound, std::uint64_t stop, const double* w, double scale)
        : words_(words.data()), count_(words.size()), n_(n), flip_(flip), bound_(std::min(bound, n)),
          stop_(stop), word_(from / 64), w_(w), scale_(scale) {
        if (from >= bound_) {
            done_ = true;
        } else {
            bits_ = load(word_) & (~std::uint64_t{0} << (from % 64));
        }
        fill();
    }
    // Candidates k = 0, 1, ... from the current one (k < kBatch after refill_if_needed()).
    const std::uint64_t* items() const noexcept { return items_ + pos_; }
    const double* qs() const noexcept { return q_ + pos_; }
    const double* q_minus_1() const noexcept { return q_minus_1_ + pos_; }
    const double* limits() const noexcept { return limit_ + pos_; }
    std::uint64_t item() const noexcept { return items_[pos_]; }
    void advance(std::size_t by) noexcept { pos_ += by; }
    // Whether the next kBatch entries are all items (none is the bound).
    bool full_batch() const noexcept { return real_ >= pos_ + kBatch; }
    // More than kBatch entries ahead after this, so that item() stays in the buffer after a batch.
    void refill_if_needed() noexcept {
        if (pos_ + kBatch >= kCap) fill();
    }

  private:
    std::uint64_t load(std::uint64_t w) const noexcept { return kind_word(words_, count_, n_, flip_, w); }
    void fill() noexcept {
        const std::size_t live = kCap - pos_;
        std::memmove(items_, items_ + pos_, live * sizeof(std::uint64_t));
        std::memmove(q_, q_ + pos_, live * sizeof(double));
        std::memmove(q_minus_1_, q_minus_1_ + pos_, live * sizeof(double));
        std::memmove(limit_, limit_ + pos_, live * sizeof(double));
        real_ = real_ > pos_ ? real_ - pos_ : 0;  // only items were taken: pos_ <= real_ but at first
        pos_ = 0;
        std::size_t size = live;
        // In locals: stores into items_ could alias the members, which would then be reloaded
        // after every item (a chain through memory).
        std::uint64_t bits = bits_, word = word_;
        bool done = done_;
        const std::uint64_t bound = bound_, stop = stop_;
        const double* const w = w_;
        const double scale = scale_;
        while (size < kCap && !done) {
            while (bits == 0) {
                if (++word >= count_) {
                    done = true;
                    break;
                }
                bits = load(word);
            }
            if (done) break;
            const std::uint64_t i = word * 64 + static_cast<std::uint64_t>(count_trailing_zeros(bits));
            if (i >= bound) {
                done = true;
                break;
            }
            bits &= bits - 1;
            const double q = w[i] * scale;
            items_[size] = i;
            q_[size] = q;
            q_minus_1_[size] = q - 1.0;
            limit_[size] = i == stop ? -std::numeric_limits<double>::infinity() : 1.0;
            ++size;
        }
        bits_ = bits;
        word_ = word;
        done_ = done;
        if (size > live) real_ = size;
        for (; size < kCap; ++size) {
            items_[size] = bound_;
            q_[size] = q_minus_1_[size] = 0.0;
            limit_[size] = -std::numeric_limits<double>::infinity();
        }
    }

    const std::uint64_t* words_;
    std::uint64_t count_, n_, flip_, bound_, stop_, word_;
    std::uint64_t bits_ = 0;
    const double* w_;
    double scale_;
    bool done_ = false;
    std::size_t pos_ = kCap;  // the first fill moves nothing
    std::size_t real_ = 0;    // entries before real_ are items
    std::uint64_t items_[kCap];
    double q_[kCap], q_minus_1_[kCap], limit_[kCap];
};

template <class Bucket>
void write_bucket(Bucket& b, std::uint64_t threshold, std::uint64_t alias) noexcept {
    // Built whole, then stored: one 8-byte store for a small bucket instead of two.
    Bucket v;
    v.threshold = static_cast<decltype(v.threshold)>(threshold);
    v.alias = static_cast<decltype(v.alias)>(alias);
    b = v;
}

// a if c else b, without a branch. On x86-64 a conditional move in inline assembly: told
// that c is a coin flip (__builtin_expect_with_probability), GCC 12 still merged the sweep's
// selections on one condition into a branch, mispredicted on every other step.
inline std::uint64_t select(bool c, std::uint64_t a, std::uint64_t b) noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    std::uint64_t r = b;
    const std::uint64_t flag = c;
    __asm__("test %1, %1\n\tcmovnz %2, %0" : "+r"(r) : "r"(flag), "rm"(a) : "cc");
    return r;
#else
    const std::uint64_t mask = std::uint64_t{0} - std::uint64_t{c};
    return (a & mask) | (b & ~mask);
#endif
}
inline double select(bool c, double a, double b) noexcept {
    std::uint64_t ua, ub;
    std::memcpy(&ua, &a, sizeof ua);
    std::memcpy(&ub, &b, sizeof ub);
    const std::uint64_t r = select(c, ua, ub);
    double out;
    std::memcpy(&out, &r, sizeof out);
    return out;
}

// The sweep's running rest and its selections in the floating-point registers where SSE2 has
// them: a compare gives a mask that selects by and/or in one or two cycles, where selecting a
// double through the integer registers costs two moves between the register files on the
// sweep's chain of dependent instructions. Either way a selection is exact.
#if FASTSHARD_SSE2
using Real = __m128d;
using RealMask = __m128d;
inline Real real(double v) noexcept { return _mm_set_sd(v); }
inline Real load_real(const double* p) noexcept { return _mm_load_sd(p); }
inline double value(Real a) noexcept { return _mm_cvtsd_f64(a); }
inline RealMask less(Real a, Real b) noexcept { return _mm_cmplt_sd(a, b); }
inline Real pick(RealMask m, Real a, Real b) noexcept { return _mm_or_pd(_mm_and_pd(m, a), _mm_andnot_pd(m, b)); }
inline Real add(Real a, Real b) noexcept { return _mm_add_sd(a, b); }
#else
using Real = double;
using RealMask = bool;
inline Real real(double v) noexcept { return v; }
inline Real load_real(const double* p) noexcept { return *p; }
inline double value(Real a) noexcept { return a; }
inline RealMask less(Real a, Real b) noexcept { return a < b; }
inline Real pick(RealMask m, Real a, Real b) noexcept { return select(m, a, b); }
inline Real add(Real a, Real b) noexcept { return a + b; }
#endif

}  // namespace

template <class Bucket>
void AliasTable::build(HugeArray<Bucket>& table, const double* w, double scale, std::uint64_t segment) {
    const std::uint64_t n = n_;
    // Uninitialised: every bucket is written below, so no pass to zero them first.
    table = make_huge_array<Bucket>(static_cast<std::size_t>(n));
    const LightBits bits(w, n, scale);
    auto q = [&](std::uint64_t i) { return w[i] * scale; };
    auto set = [&](std::uint64_t b, double keep, std::uint64_t alias) {
        write_bucket(table[b], to_threshold(keep), alias);
    };
    auto set_full = [&](std::uint64_t b) { write_bucket(table[b], kFull, b); };

    // Where each segment starts: its first item and its heavy cursor.
    const std::uint64_t segments = (n + segment - 1) / segment;
    struct Start {
        std::uint64_t heavy;
        double rest;
    };
    std::vector<Start> starts(static_cast<std::size_t>(segments) + 1);
    const std::uint64_t first_heavy = bits.next_heavy(0);
    starts[0] = {first_heavy, first_heavy < n ? q(first_heavy) : 0.0};
    for (std::uint64_t s = 1; s < segments; ++s) {
        const auto [heavy, rest] = bits.heavy_at(w, scale, bits.deficit_before(s * segment));
        // Rounding must not move a segment's start heavy before the previous one's.
        if (heavy < starts[s - 1].heavy) {
            starts[s] = starts[s - 1];
        } else {
            starts[s] = {heavy, rest};
        }
    }
    starts[segments] = {n, 0.0};

    // Segment s: the lights in [s * segment, ...) and the heavies from its start heavy up to
    // (not including) the next segment's, `stop`. Each step either empties heavy j (its
    // bucket keeps `rest`, the next heavy fills the remainder) or fills light i from j. Which
    // one is a coin flip for the branch predictor, so a step computes both and selects (with
    // conditional moves and floating-point masks), each stream's next items and their q come
    // from a buffer filled ahead (Buffered), and a thread sweeps two segments in one loop: a
    // step is a chain of dependent instructions, and two independent chains overlap.
    struct Sweep {
        std::uint64_t end_, stop, j;
        Real rest;   // what heavy j still has to give or keep
        Real limit;  // a step empties j when rest < limit: 1, or -inf once j is `stop`
        bool last;
        Buffered lights, heavies;

        // The state a step changes, copied into a local for a batch of at most
        // Buffered::kBatch steps (begin() and end()), so that it stays in registers: members of
        // the sweep live in memory, and reloading rest after each store costs the chain a
        // store-to-load forwarding.
        struct Hot {
            const std::uint64_t* li;
            const std::uint64_t* hi;
            const double* lq;
            const double* lq1;
            const double* hq1;
            const double* hlim;
            std::uint64_t j, stop, end;
            Real rest, limit;
            std::size_t l, k;  // lights, heavies taken in this batch

            // One step; false (and nothing done) once the main loop of this segment is over.
            // h = (rest < 1) & (j != stop), as a compare against j's limit. Unchecked: the
            // caller knows that both streams have an item for this step (`checked` false).
            bool step(Bucket* t, std::uint64_t n, bool checked = true) noexcept {
                const RealMask m = less(rest, limit);
                const bool h = value(rest) < value(limit);
                const std::uint64_t nj = hi[k], i = li[l];
                // Over once the stream the step needs is exhausted (each stops at its bound).
                if (checked && select(h, nj, i) >= select(h, n, end)) return false;
                const double keep = value(pick(m, rest, load_real(lq + l)));
                write_bucket(t[select(h, j, i)], to_threshold(keep), select(h, nj, j));
                rest = add(rest, pick(m, load_real(hq1 + k), load_real(lq1 + l)));
                limit = pick(m, load_real(hlim + k), limit);
                j = select(h, nj, j);
                k += h;
                l += !h;
                return true;
            }
        };
        // Whether a batch can run unchecked: kBatch items ahead in both streams.
        bool full_batch() const noexcept { return lights.full_batch() && heavies.full_batch(); }
        Hot begin() noexcept {
            lights.refill_if_needed();
            heavies.refill_if_needed();
            return Hot{lights.items(), heavies.items(), lights.qs(), lights.q_minus_1(), heavies.q_minus_1(),
                       heavies.limits(), j, stop, end_, rest, limit, 0, 0};
        }
        void end(const Hot& hot) noexcept {
            j = hot.j;
            rest = hot.rest;
            limit = hot.limit;
            lights.advance(hot.l);
            heavies.advance(hot.k);
        }
        // Steps alone to the end of the main loop.
        void run(Bucket* t, std::uint64_t n) noexcept {
            for (bool more = true; more;) {
                Hot hot = begin();
                for (std::size_t s = 0; s < Buffered::kBatch && (more = hot.step(t, n)); ++s) {}
                end(hot);
            }
        }
    };
    auto start = [&](std::uint64_t s) {
        const std::uint64_t begin = s * segment, end = std::min(n, begin + segment);
        const std::uint64_t j = starts[static_cast<std::size_t>(s)].heavy;
        const std::uint64_t stop = starts[static_cast<std::size_t>(s) + 1].heavy;
        return Sweep{end,
                     stop,
                     j,
                     real(starts[static_cast<std::size_t>(s)].rest),
                     real(j == stop ? -std::numeric_limits<double>::infinity() : 1.0),
                     s + 1 == segments,
                     Buffered(bits.words(), n, 0, begin, end, n, w, scale),
                     Buffered(bits.words(), n, ~std::uint64_t{0}, std::min(n, j + 1), n, stop, w, scale)};
    };
    // After the main loop: the buckets rounding left unwritten.
    auto finish = [&](const Sweep& sw) {
        std::uint64_t j = sw.j;
        if (j != n && !sw.last) {
            // Heavies this segment still owns are, but for rounding, exactly emptied.
            double rest = value(sw.rest);
            while (j < sw.stop) {
                const std::uint64_t next = bits.next_heavy(j + 1);
                if (next == n) {
                    set_full(j);
                    break;
                }
                set(j, rest, next);
                rest += q(next) - 1.0;
                j = next;
            }
        } else if (j != n) {
            // The last segment: what is left is (up to rounding) exactly full buckets, j and
            // the items of weight exactly the mean after it.
            for (; j < n; j = bits.next_heavy(j + 1)) set_full(j);
        }
        // Lights left over by rounding (all of the segment's if no heavy was left, j == n).
        for (std::uint64_t i = sw.lights.item(); i < sw.end_; i = std::min(sw.end_, bits.next_light(i + 1)))
            set_full(i);
    };
    Bucket* const t = table.get();
    std::atomic<std::uint64_t> next_pair{0};
    parallel_for((segments + 1) / 2, 0, 1, [&](unsigned, std::uint64_t, std::uint64_t) {
        for (std::uint64_t s; (s = 2 * next_pair.fetch_add(1)) < segments;) {
            Sweep a = start(s);
            if (s + 1 < segments) {
                Sweep b = start(s + 1);
                bool more_a = a.j != n, more_b = b.j != n;
                while (more_a && more_b) {
                    auto ha = a.begin();
                    auto hb = b.begin();
                    if (a.full_batch() && b.full_batch()) {  // all but the last few batches
                        for (std::size_t k = 0; k < Buffered::kBatch; ++k) {
                            ha.step(t, n, false);
                            hb.step(t, n, false);
                        }
                    } else {
                        for (std::size_t k = 0; k < Buffered::kBatch; ++k) {
                            more_a = ha.step(t, n);
                            more_b = hb.step(t, n);
                            if (!more_a || !more_b) break;
                        }
                    }
                    a.end(ha);
                    b.end(hb);
                }
                if (more_a) a.run(t, n);
                if (more_b) b.run(t, n);
                finish(b);
            } else if (a.j != n) {
                a.run(t, n);
            }
            finish(a);
        }
    });
}

void AliasTable::buckets(std::uint64_t* threshold, std::uint64_t* alias) const noexcept {
    auto copy = [&](const auto& table) {
        for (std::uint64_t b = 0; b < n_; ++b) {
            threshold[b] = static_cast<std::uint64_t>(table[b].threshold);
            alias[b] = static_cast<std::uint64_t>(table[b].alias);
        }
    };
    if (small_) {
        copy(small_);
    } else {
        copy(large_);
    }
}

double AliasTable::probability(std::uint64_t item) const {
    auto prob = [&](const auto& table) {
        double mass = 0.0;
        for (std::uint64_t b = 0; b < n_; ++b) {
            const auto t = static_cast<std::uint64_t>(table[b].threshold);
            const double keep = t == kFull ? 4294967296.0 : static_cast<double>(t);
            if (b == item) mass += keep;
            if (static_cast<std::uint64_t>(table[b].alias) == item) mass += 4294967296.0 - keep;
        }
        return mass / 4294967296.0 / static_cast<double>(n_);
    };
    return small_ ? prob(small_) : prob(large_);
}

template <class Bucket>
void AliasTable::draw(const HugeArray<Bucket>& table, std::uint64_t* x, std::size_t count,
                      std::uint64_t key) const noexcept {
    const std::uint64_t key2 = mix64(key ^ 0x243f6a8885a308d3ULL);
    constexpr std::size_t kBlock = 64;
    std::uint64_t bucket[kBlock];
    std::uint32_t coin[kBlock];
    for (std::size_t start = 0; start < count; start += kBlock) {
        const std::size_t m = std::min(kBlock, count - start);
        std::uint64_t* out = x + start;
        // Every draw is a random access into the table: compute a block of buckets first
        // and prefetch them, so the cache misses overlap instead of queueing.
        for (std::size_t i = 0; i < m; ++i) {
            const std::uint64_t r = mix64(out[i] ^ key);
            bucket[i] = mulhi64(r, n_);
            coin[i] = static_cast<std::uint32_t>(mix64(r ^ key2) >> 32);
            FASTSHARD_PREFETCH(table.get() + bucket[i]);
        }
        for (std::size_t i = 0; i < m; ++i) {
            const Bucket& b = table[static_cast<std::size_t>(bucket[i])];
            const auto t = static_cast<std::uint64_t>(b.threshold);
            out[i] = (t == kFull || coin[i] < t) ? bucket[i] : static_cast<std::uint64_t>(b.alias);
        }
    }
}

void AliasTable::apply(std::uint64_t* x, std::size_t count, std::uint64_t key) const noexcept {
    if (small_) {
        draw(small_, x, count, key);
    } else {
        draw(large_, x, count, key);
    }
}

namespace {

struct AliasDraw {
    std::shared_ptr<const AliasTable> table;
    std::uint64_t key;
    void apply(std::uint64_t* x, std::size_t count) const noexcept { table->apply(x, count, key); }
};

// e / w (e >= 0 finite, w > 0 finite, subnormal included) as a 64-bit word ordered as the
// value, with an exponent range no double has: 0 for e = 0, else bits 52-63 hold the binary
// exponent of e / w plus 2048 (e / w is in [2^-1077, 2^1079]) and bits 0-51 its 53-bit
// significand rounded once, as a double division would round it. So wherever the double
// e / w is normal (every key of weights in a normal range) the order, ties included, is that
// of the double keys, and elsewhere the key still never overflows or collapses into a tie. A
// weight's binary exponent only shifts every key's exponent field: scaling all weights by
// 2^j (exactly) changes no comparison.
std::uint64_t ratio_key(double e, double w) noexcept {
    if (!(e > 0.0)) return 0;
    int ew = 0, er = 0;
    const double mw = std::frexp(w, &ew);          // w = mw * 2^ew, mw in [0.5, 1), exact
    const double r = std::frexp(e / mw, &er);      // e / mw is normal: its rounding is e / w's
    std::uint64_t bits;
    std::memcpy(&bits, &r, sizeof bits);
    const auto exponent = static_cast<std::uint64_t>(er - ew + 2048);
    return (exponent << 52) | (bits & ((std::uint64_t{1} << 52) - 1));
}

template <class T>
struct OrderTable {
    std::vector<T> items;
    void apply(std::uint64_t* x, std::size_t count) const noexcept {
        for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<std::uint64_t>(items[static_cast<std::size_t>(x[i])]);
    }
};

}  // namespace

std::shared_ptr<const Shard> make_weighted_shard(const Plan& plan,
                                                 std::shared_ptr<const AliasTable> table,
                                                 std::uint64_t seed, std::uint64_t epoch) {
    const std::uint64_t key = derive_key(kWeightedDomain, table->size(), seed, epoch);
    return std::make_shared<PermutationShard<AliasDraw>>(plan, AliasDraw{std::move(table), key});
}

std::shared_ptr<const Shard> make_weighted_order_shard(const Plan& plan, const double* w,
                                                       std::uint64_t n, std::uint64_t seed,
                                                       std::uint64_t epoch) {
    const std::uint64_t count = plan.n;
    const std::uint64_t key = derive_key(kWeightedDomain + 1, n, seed, epoch);
    // Efraimidis-Spirakis: item i gets the key E_i / w_i with E_i ~ Exp(1); ascending keys are
    // a weighted random order without replacement (the first item has P = w_i / sum w). The
    // key is kept exact at every scale (see ratio_key), so tiny weights neither overflow to a
    // tie nor fall back to index order, and scaling all weights by 2^j changes no order.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> keys;
    keys.reserve(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i) {
        if (!(w[i] > 0.0)) continue;
        const double u = static_cast<double>((mix64(i ^ key) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
        keys.emplace_back(ratio_key(-std::log(u), w[i]), i);
    }
    if (count > keys.size()) throw std::invalid_argument("more draws than positive weights");
    const auto mid = keys.begin() + static_cast<std::ptrdiff_t>(count);
    if (mid != keys.end()) std::nth_element(keys.begin(), mid, keys.end());
    std::sort(keys.begin(), mid);
    if (n <= static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
        OrderTable<std::uint32_t> order;
        order.items.reserve(static_cast<std::size_t>(count));
        for (auto it = keys.begin(); it != mid; ++it) order.items.push_back(static_cast<std::uint32_t>(it->second));
        std::vector<std::pair<std::uint64_t, std::uint64_t>>().swap(keys);
        return std::make_shared<PermutationShard<OrderTable<std::uint32_t>>>(plan, std::move(order));
    }
    OrderTable<std::uint64_t> order;
    order.items.reserve(static_cast<std::size_t>(count));
    for (auto it = keys.begin(); it != mid; ++it) order.items.push_back(it->second);
    std::vector<std::pair<std::uint64_t, std::uint64_t>>().swap(keys);
    return std::make_shared<PermutationShard<OrderTable<std::uint64_t>>>(plan, std::move(order));
}

}  // namespace fastshard
