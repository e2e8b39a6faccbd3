#include "fastshard/weighted.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "fastshard/mix.hpp"
#include "fastshard/parallel.hpp"
#include "fastshard/shard.hpp"

#if defined(_MSC_VER) && !defined(__clang__) && (defined(_M_X64) || defined(_M_ARM64))
#include <intrin.h>  // _BitScanForward64
#endif
#if defined(_MSC_VER) && !defined(__clang__) && (defined(_M_X64) || defined(_M_IX86))
#include <xmmintrin.h>  // _mm_prefetch
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

constexpr std::uint64_t kFull = 0xffffffffULL;  // threshold of a bucket that keeps its item

std::uint64_t to_threshold(double q) noexcept {
    // q in [0, 1): P(keep) = threshold / 2^32, rounded down; never reaches a full bucket.
    const double t = std::floor(q * 4294967296.0);
    return t <= 0.0 ? 0 : (t >= 4294967295.0 ? kFull - 1 : static_cast<std::uint64_t>(t));
}

}  // namespace

WeightsSummary summarize_weights(const double* w, std::uint64_t n, unsigned threads) {
    struct Part {
        std::int64_t first_invalid = -1;
        double sum = 0.0;
        std::uint64_t positive = 0;
        std::uint64_t checksum = 0;
    };
    std::vector<Part> parts(threads == 0 ? default_threads() : threads);
    parallel_for(n, static_cast<unsigned>(parts.size()), std::uint64_t{1} << 18,
                 [&](unsigned part, std::uint64_t begin, std::uint64_t len) {
                     Part p;
                     double block_sum = 0.0;
                     for (std::uint64_t i = begin; i < begin + len; ++i) {
                         const double v = w[i];
                         if (!(v >= 0.0) || !std::isfinite(v)) {
                             p.first_invalid = static_cast<std::int64_t>(i);
                             break;
                         }
                         block_sum += v;
                         if ((i & 4095) == 4095) {  // blocks keep the rounding error small
                             p.sum += block_sum;
                             block_sum = 0.0;
                         }
                         p.positive += v > 0.0 ? 1 : 0;
                         std::uint64_t bits;
                         std::memcpy(&bits, &v, sizeof bits);
                         p.checksum += mix64(bits + i * kGolden);
                     }
                     p.sum += block_sum;
                     parts[part] = p;
                 });
    WeightsSummary s;
    for (const Part& p : parts) {
        if (s.first_invalid < 0 && p.first_invalid >= 0) s.first_invalid = p.first_invalid;
        s.sum += p.sum;
        s.positive += p.positive;
        s.checksum += p.checksum;
    }
    s.checksum = mix64(s.checksum ^ n);
    return s;
}

AliasTable::AliasTable(const double* w, std::uint64_t n, double sum) : n_(n) {
    if (n == 0 || !(sum > 0.0) || !std::isfinite(sum))
        throw std::invalid_argument("weights must be non-empty with a positive, finite sum");
    const double scale = static_cast<double>(n) / sum;
    if (n <= (std::uint64_t{1} << 32)) {
        build(small_, w, scale);
    } else {
        build(large_, w, scale);
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

// One bit per item: set for the light ones (below the mean). Finding the next light or heavy
// item is then a scan of words with count-trailing-zeros instead of one unpredictable branch
// per item.
class LightBits {
  public:
    LightBits(const double* w, std::uint64_t n, double scale) : n_(n), words_((n + 63) / 64, 0) {
        for (std::uint64_t base = 0; base < n; base += 64) {
            const std::uint64_t m = std::min<std::uint64_t>(64, n - base);
            std::uint64_t word = 0;
            for (std::uint64_t b = 0; b < m; ++b) word |= std::uint64_t{w[base + b] * scale < 1.0} << b;
            words_[base / 64] = word;
        }
    }
    std::uint64_t next_light(std::uint64_t i) const noexcept { return next(i, 0); }
    std::uint64_t next_heavy(std::uint64_t i) const noexcept { return next(i, ~std::uint64_t{0}); }

  private:
    // First i' >= i whose bit, xor-ed with `flip`, is set; n if none.
    std::uint64_t next(std::uint64_t i, std::uint64_t flip) const noexcept {
        if (i >= n_) return n_;
        std::uint64_t w = i / 64;
        std::uint64_t word = (words_[w] ^ flip) & (~std::uint64_t{0} << (i % 64));
        while (word == 0) {
            if (++w == words_.size()) return n_;
            word = words_[w] ^ flip;
        }
        const std::uint64_t found = w * 64 + static_cast<std::uint64_t>(count_trailing_zeros(word));
        return found < n_ ? found : n_;
    }

    std::uint64_t n_;
    std::vector<std::uint64_t> words_;
};

}  // namespace

template <class Bucket>
void AliasTable::build(HugeArray<Bucket>& table, const double* w, double scale) {
    const std::uint64_t n = n_;
    // Uninitialised: every bucket is written below, so no pass to zero them first.
    table = make_huge_array<Bucket>(static_cast<std::size_t>(n));
    const LightBits bits(w, n, scale);
    auto q = [&](std::uint64_t i) { return w[i] * scale; };
    auto set = [&](std::uint64_t b, double keep, std::uint64_t alias) {
        table[b].threshold = static_cast<decltype(table[b].threshold)>(to_threshold(keep));
        table[b].alias = static_cast<decltype(table[b].alias)>(alias);
    };
    auto set_full = [&](std::uint64_t b) {
        table[b].threshold = static_cast<decltype(table[b].threshold)>(kFull);
        table[b].alias = static_cast<decltype(table[b].alias)>(b);
    };
    std::uint64_t i = bits.next_light(0);
    std::uint64_t j = bits.next_heavy(0);
    if (j == n) {  // only by rounding: every item is (just) below the mean
        for (std::uint64_t b = 0; b < n; ++b) set_full(b);
        return;
    }
    double rest = q(j);  // what heavy item j still has to give or keep
    for (;;) {
        if (rest < 1.0) {
            // j has given away its excess: its own bucket keeps `rest`, the next heavy item
            // fills the remainder.
            const std::uint64_t next = bits.next_heavy(j + 1);
            if (next == n) break;
            set(j, rest, next);
            rest += q(next) - 1.0;
            j = next;
        } else if (i < n) {
            set(i, q(i), j);
            rest += q(i) - 1.0;
            i = bits.next_light(i + 1);
        } else {
            break;
        }
    }
    // What is left is (up to rounding) exactly full buckets: j, items of weight exactly the
    // mean after it, and lights left over by rounding.
    set_full(j);
    for (; i < n; i = bits.next_light(i + 1)) set_full(i);
    for (std::uint64_t h = bits.next_heavy(j + 1); h < n; h = bits.next_heavy(h + 1)) set_full(h);
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
    // a weighted random order without replacement (the first item has P = w_i / sum w).
    std::vector<std::pair<double, std::uint64_t>> keys;
    keys.reserve(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i) {
        if (!(w[i] > 0.0)) continue;
        const double u = static_cast<double>((mix64(i ^ key) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
        keys.emplace_back(-std::log(u) / w[i], i);
    }
    if (count > keys.size()) throw std::invalid_argument("more draws than positive weights");
    const auto mid = keys.begin() + static_cast<std::ptrdiff_t>(count);
    if (mid != keys.end()) std::nth_element(keys.begin(), mid, keys.end());
    std::sort(keys.begin(), mid);
    if (n <= static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
        OrderTable<std::uint32_t> order;
        order.items.reserve(static_cast<std::size_t>(count));
        for (auto it = keys.begin(); it != mid; ++it) order.items.push_back(static_cast<std::uint32_t>(it->second));
        std::vector<std::pair<double, std::uint64_t>>().swap(keys);
        return std::make_shared<PermutationShard<OrderTable<std::uint32_t>>>(plan, std::move(order));
    }
    OrderTable<std::uint64_t> order;
    order.items.reserve(static_cast<std::size_t>(count));
    for (auto it = keys.begin(); it != mid; ++it) order.items.push_back(it->second);
    std::vector<std::pair<double, std::uint64_t>>().swap(keys);
    return std::make_shared<PermutationShard<OrderTable<std::uint64_t>>>(plan, std::move(order));
}

}  // namespace fastshard
