// Stratified windows of an epoch's order: the machinery LengthGroupedBatchSampler's token budget
// (length.hpp) and PackedSampler's best_fit (packed.hpp) share, so that the index arithmetic
// lives once.
//
// - Lengths: the caller's integer array read in place, whatever its integer type.
// - LengthClasses: a histogram of keys (in increasing length order) merged upwards into classes
//   of at least min_items items; a class's bound is the largest rule length of its items.
// - Strata: windows of wsize positions of the epoch's order, grouped k to a stratum of k * wsize
//   positions; stratum t gets a fixed quota of each class b, the class-b items of class rank
//   [floor(c_b s_t / n), floor(c_b s_{t+1} / n)) in the order (s_t = min(t * k * wsize, n)); its
//   items are dealt to its k_t windows round-robin, class after class (the stratum's class-b
//   item of rank r to window (C_b + r) mod k_t, C_b its items of the classes before b), so that
//   each window holds an equal share of every class and of the stratum (to one item), and a
//   window's contents by class, and so everything counted from them, are the same in every
//   epoch.
// - ClassPrefix: one scan per epoch giving each class's count before every stratum boundary of
//   the order; a stratum's class ranks are then read from the few ranges of the order holding
//   them (WindowRanks), without a per-item index, and its windows taken from what was read
//   (StratumItems).
//
// Why strata: a class of c items sits, at a boundary, about sqrt(c) / 2 items from its quota, so
// reading a unit's quota from near its own range of the order needs classes of about units^2 /
// 32 items (class_min_items). With windows as the units, classes coarsen as n grows at a fixed
// window (their share of n is n / (32 wsize^2)), and every count made on the class bounds with
// them: best_fit efficiency 0.9999 at 10^6 documents and 0.945 at 10^9 at the default window;
// token-budget batches +0.7% at 10^7 and +101% at 10^9. Strata of at least about 18 sqrt(n)
// items (strata_per: a power of two of windows) keep the classes at most 10^-4 of n at every n;
// the range a stratum reads, ~ n / sqrt(c) positions, is what reading classes of that share
// costs at any window size.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "fastshard/feistel.hpp"
#include "fastshard/memory.hpp"
#include "fastshard/parallel.hpp"

namespace fastshard {

// The integer types a lengths array may have.
enum class LengthType { i8, i16, i32, i64, u8, u16, u32, u64 };

// A read-only view of the caller's lengths; never copied. Signed values must have been
// checked non-negative before any other use.
struct Lengths {
    const void* data = nullptr;
    LengthType type = LengthType::i64;
    std::uint64_t n = 0;
};

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

// Calls f(typed data pointer) with the lengths' data at its element type.
template <class F>
decltype(auto) with_data(const Lengths& lengths, F&& f) {
    return with_type(lengths.type, [&](auto tag) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
        return f(static_cast<const T*>(lengths.data));
    });
}

inline std::uint64_t length_at(const Lengths& lengths, std::uint64_t i) {
    return with_data(lengths, [&](const auto* data) { return static_cast<std::uint64_t>(data[i]); });  // checked
}

// Calls f(position, item, length) for the order's positions [first, last), in order; f returns
// void, or bool (false stops the walk). Returns false if f stopped it.
template <class F>
bool walk_order(const Lengths& lengths, const Feistel& perm, std::uint64_t first, std::uint64_t last, F&& f) {
    constexpr std::uint64_t kBlock = 256;
    std::uint64_t buf[kBlock];
    // f as a callback that always says whether to go on. Decided here, in walk_order itself:
    // Clang instantiates both branches of an `if constexpr` inside the generic lambda below.
    auto go_on = [&f](std::uint64_t position, std::uint64_t item, std::uint64_t length) -> bool {
        if constexpr (std::is_void_v<std::invoke_result_t<F&, std::uint64_t, std::uint64_t, std::uint64_t>>) {
            f(position, item, length);
            return true;
        } else {
            return static_cast<bool>(f(position, item, length));
        }
    };
    return with_data(lengths, [&](const auto* data) {
        for (std::uint64_t p0 = first; p0 < last; p0 += kBlock) {
            const std::size_t len = static_cast<std::size_t>(std::min(kBlock, last - p0));
            for (std::size_t i = 0; i < len; ++i) buf[i] = p0 + i;
            perm.apply(buf, len);  // positions -> the epoch's items
            for (std::size_t i = 0; i < len; ++i) {
                const auto v = static_cast<std::uint64_t>(data[buf[i]]);  // checked >= 0
                if (!go_on(p0 + i, buf[i], v)) return false;
            }
        }
        return true;
    });
}

// Per-window sums over an epoch's order: row w + 1 of the (windows + 1) x width result is what
// add(row, length) put in for the items at positions [w * window, (w + 1) * window) of the order
// (row 0 stays zero, ready for prefix sums). Integer sums, so the result does not depend on the
// order of the additions.
//
// The lengths are read sequentially and each item i placed at its position P^-1(i) (the network
// decrypted), into its window's row: n sequential reads and n scattered adds into a table of
// n / window rows, instead of n reads of the lengths at random places. Threads take parts of the
// items, each with a table of its own (part 0 adds into the result), as long as all the tables
// together stay under max(2^21 words, n / 32 words); threads are dropped to fit, and where not
// even one extra table fits, threads take windows and walk their positions instead.
//
// The scattered adds miss the caches once the tables outgrow them (31 MB per table at 10^9
// items, window 256): the tables are in 2 MiB pages where the kernel gives them (memory.hpp), and
// each add prefetches the row kPrefetch adds ahead, so that more misses are in flight at once.
// Measured at 10^9 items, one thread, CPU seconds (bench/RESULTS.md, "Packed rows"): decryption
// alone 4.0; with the adds in 4 KiB pages 19.3, in 2 MiB pages 14.7 to 15.0, and prefetched 32
// ahead 11.6 to 12.9 (a shared machine: these vary by 20%).
//
// see(part, data, first, count), if given, is called on each run of items [first, first + count)
// before they are placed (data: the typed lengths, data[first] the run's first), so that a caller
// can fold a scan of its own (a checksum, a validation) into this one sequential read; part < the
// threads asked for. It is called for every item exactly once when the sequential read runs,
// which `sequential` (if not null) says; where threads walk positions instead, never.
struct NoSee {
    template <class T>
    void operator()(unsigned, const T*, std::uint64_t, std::uint64_t) const noexcept {}
};

// read_into_windows's two passes over a run's items (stratify.cpp), compiled per instruction set
// like the checksum (clones.hpp): x[k] = first + k, and x[k] = (x[k] >> shift) + 1. In the
// baseline's 2-lane vectors they took 9% of concat's read of 10^8 lengths (bench/RESULTS.md,
// "Concat's read: narrow rounds").
void consecutive(std::uint64_t* x, std::uint64_t first, std::size_t count) noexcept;
void shifted_rows(std::uint64_t* x, std::size_t count, unsigned shift) noexcept;

// The sequential read under window_sums and window_weight_sums: the items in up to parts_max
// parts, each on a thread of its own, which claim chunks of 2^16 items as they go
// (parallel_chunks: on a shared machine a slowed thread does not hold the others up); a part
// calls start(part) first, then for each run of up to 1024 items, in increasing order within
// the part, see(part, data, first, count) and place(part, data, first, rows, count), where
// rows[k] is 1 + the window of item first + k's position in the order (row 0 stays for the
// prefix sums' zero). Returns the number of parts.
//
// The lengths are read in 4 KiB runs (1024 uint32), where the hardware's prefetch starts over at
// each page: each run prefetches the run after next into L2. Measured with concat_start at 10^8
// uint32 lengths on this project's 2-core AMD EPYC VM, 9 alternated runs: one thread, median
// 4.31 -> 4.02 ns an item; two threads 2.05 -> 2.00 (into L1 instead: slower than none).
template <class Start, class See, class Place>
unsigned read_into_windows(const Lengths& lengths, const Feistel& perm, std::uint64_t window, unsigned parts_max,
                           Start&& start, See&& see, Place&& place) {
    const bool pow2 = (window & (window - 1)) == 0;
    unsigned shift = 0;
    while (pow2 && (std::uint64_t{1} << shift) < window) ++shift;
    constexpr std::uint64_t kBlock = 1024;
    return with_data(lengths, [&](const auto* data) {
        return parallel_chunks(lengths.n, parts_max, std::uint64_t{1} << 16, start,
                               [&](unsigned part, std::uint64_t i0, std::uint64_t count) {
                                std::uint64_t rows[kBlock];
                                for (std::uint64_t b0 = i0; b0 < i0 + count; b0 += kBlock) {
                                    const auto len = static_cast<std::size_t>(std::min(kBlock, i0 + count - b0));
#if defined(__GNUC__) || defined(__clang__)
                                    if (b0 + 2 * kBlock < i0 + count) {  // the run after next, into L2
                                        const char* ahead = reinterpret_cast<const char*>(data + b0 + 2 * kBlock);
                                        for (std::size_t off = 0; off < kBlock * sizeof(*data); off += 64)
                                            __builtin_prefetch(ahead + off, 0, 1);
                                    }
#endif
                                    see(part, data, b0, static_cast<std::uint64_t>(len));
                                    consecutive(rows, b0, len);
                                    perm.invert(rows, len);  // items -> their positions in the order
                                    if (pow2) {              // -> the rows they add into
                                        shifted_rows(rows, len, shift);
                                    } else {
                                        for (std::size_t k = 0; k < len; ++k) rows[k] = rows[k] / window + 1;
                                    }
                                    place(part, data, b0, static_cast<const std::uint64_t*>(rows), len);
                                }
                            });
    });
}

// Prefetches of the scattered adds: each add prefetches the row this many adds ahead.
constexpr std::size_t kWindowPrefetch = 32;
// Tables of at most this many bytes are added into without prefetches.
constexpr std::uint64_t kSmallTable = std::uint64_t{1} << 17;

template <class Add, class See = NoSee>
std::vector<std::uint64_t> window_sums(const Lengths& lengths, const Feistel& perm, std::uint64_t window,
                                       std::uint32_t width, unsigned threads, Add&& add, See&& see = See{},
                                       bool* sequential = nullptr) {
    const std::uint64_t n = lengths.n;
    const std::uint64_t windows = n == 0 ? 0 : (n - 1) / window + 1;
    const std::uint64_t words = (windows + 1) * width;
    std::vector<std::uint64_t> out;
    assign_huge_zeros(out, static_cast<std::size_t>(words));
    if (threads == 0) threads = default_threads();
    const std::uint64_t budget = std::max<std::uint64_t>(std::uint64_t{1} << 21, n / 32);
    const std::uint64_t fit = budget / (words == 0 ? 1 : words);
    if (sequential != nullptr) *sequential = fit != 0;
    if (fit == 0) {
        parallel_for(windows, threads, 1, [&](unsigned, std::uint64_t w0, std::uint64_t count) {
            for (std::uint64_t w = w0; w < w0 + count; ++w) {
                std::uint64_t* row = out.data() + (w + 1) * width;
                walk_order(lengths, perm, w * window, std::min(n, (w + 1) * window),
                           [&](std::uint64_t, std::uint64_t, std::uint64_t v) { add(row, v); });
            }
        });
        return out;
    }
    const auto parts_max = static_cast<unsigned>(std::min<std::uint64_t>(threads, fit));
    std::vector<HugeArray<std::uint64_t>> tables(parts_max);
    const unsigned parts = read_into_windows(
        lengths, perm, window, parts_max,
        [&](unsigned part) {
            if (part != 0) tables[part] = make_huge_zeros<std::uint64_t>(static_cast<std::size_t>(words));
        },
        see,
        [&](unsigned part, const auto* data, std::uint64_t first, const std::uint64_t* rows, std::size_t len) {
            std::uint64_t* table = part == 0 ? out.data() : tables[part].get();
            for (std::size_t k = 0; k < len; ++k) {
#if defined(__GNUC__) || defined(__clang__)
                if (k + kWindowPrefetch < len) __builtin_prefetch(table + rows[k + kWindowPrefetch] * width, 1);
#endif
                add(table + rows[k] * width, static_cast<std::uint64_t>(data[first + k]));  // checked >= 0
            }
        });
    for (unsigned part = 1; part < parts; ++part)
        for (std::size_t k = 0; k < out.size(); ++k) out[k] += tables[part][k];
    return out;
}

// window_sums of width 1 where each item adds weight(length) (a token count): the same result,
// with each thread's table in 32-bit words. Half the bytes for the scattered adds to miss in:
// at 10^8 items (window 256) 1.6 MB instead of 3.1 MB, at 10^9 16 MB instead of 31 MB;
// measured, one thread, decryption included, 7.3 -> 6.0 ns an item at 10^8 and 11.3 -> 10.0 at
// 10^9 (bench/RESULTS.md, "Packed rows"). An add that carries a word past 2^32 - 1 (or a weight
// of 2^32 or more) leaves its carry, in units of 2^32, in the part's spill list, added in after;
// a part whose list passes kSpillMax entries (weights near 2^32 everywhere) moves to a 64-bit
// table for the rest of its items. The tables are summed into the result, which is 64-bit.
// Memory: one 32-bit table per thread while reading (threads capped as in window_sums), then
// the result beside one of them.
template <class Weight, class See = NoSee>
std::vector<std::uint64_t> window_weight_sums(const Lengths& lengths, const Feistel& perm, std::uint64_t window,
                                              unsigned threads, Weight&& weight, See&& see = See{},
                                              bool* sequential = nullptr) {
    const std::uint64_t n = lengths.n;
    const std::uint64_t windows = n == 0 ? 0 : (n - 1) / window + 1;
    const std::uint64_t rows = windows + 1;
    if (threads == 0) threads = default_threads();
    const std::uint64_t budget = std::max<std::uint64_t>(std::uint64_t{1} << 21, n / 32);
    const std::uint64_t fit = budget / rows;  // 64-bit tables, as window_sums counts them
    if (fit == 0)  // not even one table fits: window_sums walks windows instead
        return window_sums(
            lengths, perm, window, 1, threads, [&weight](std::uint64_t* row, std::uint64_t v) { *row += weight(v); },
            see, sequential);
    if (sequential != nullptr) *sequential = true;
    struct Part {
        HugeArray<std::uint32_t> low;   // the sums mod 2^32, while `wide` is empty
        HugeArray<std::uint64_t> wide;  // the sums, once the spill list grew too long
        std::vector<std::pair<std::uint64_t, std::uint64_t>> spill;  // (row, carries of 2^32)
    };
    constexpr std::size_t kSpillMax = std::size_t{1} << 16;
    // A table this small stays in L1/L2 without help: no prefetches (kSmallTable).
    const bool small_table = rows * sizeof(std::uint32_t) <= kSmallTable;
    const auto parts_max = static_cast<unsigned>(std::min<std::uint64_t>(threads, fit));
    std::vector<Part> tables(parts_max);
    const unsigned parts = read_into_windows(
        lengths, perm, window, parts_max,
        [&](unsigned part) { tables[part].low = make_huge_zeros<std::uint32_t>(static_cast<std::size_t>(rows)); },
        see,
        [&](unsigned part, const auto* data, std::uint64_t first, const std::uint64_t* row, std::size_t len) {
            Part& p = tables[part];
            if (p.wide) {
                std::uint64_t* table = p.wide.get();
                for (std::size_t k = 0; k < len; ++k) {
#if defined(__GNUC__) || defined(__clang__)
                    if (k + kWindowPrefetch < len) __builtin_prefetch(table + row[k + kWindowPrefetch], 1);
#endif
                    table[row[k]] += weight(static_cast<std::uint64_t>(data[first + k]));  // checked >= 0
                }
                return;
            }
            std::uint32_t* table = p.low.get();
            const auto add = [&](std::size_t k) {
                const std::uint64_t w = weight(static_cast<std::uint64_t>(data[first + k]));
                const std::uint32_t old = table[row[k]];
                const auto sum = static_cast<std::uint32_t>(old + static_cast<std::uint32_t>(w));
                table[row[k]] = sum;
                const std::uint64_t carry = (w >> 32) + (sum < old ? 1 : 0);
                if (carry != 0) p.spill.emplace_back(row[k], carry);
            };
            if (small_table) {
                for (std::size_t k = 0; k < len; ++k) add(k);
                return;
            }
            for (std::size_t k = 0; k < len; ++k) {
#if defined(__GNUC__) || defined(__clang__)
                if (k + kWindowPrefetch < len) __builtin_prefetch(table + row[k + kWindowPrefetch], 1);
#endif
                add(k);
            }
            if (p.spill.size() > kSpillMax) {  // to 64-bit words, spill included
                p.wide = make_huge_array<std::uint64_t>(static_cast<std::size_t>(rows));
                for (std::uint64_t r = 0; r < rows; ++r) p.wide[r] = p.low[r];
                for (const auto& [r, c] : p.spill) p.wide[r] += c << 32;
                p.low.reset();
                std::vector<std::pair<std::uint64_t, std::uint64_t>>().swap(p.spill);
            }
        });
    // The other parts fold into part 0's 32-bit words first (carries to its list), each freed
    // once in: the 64-bit result then meets one 32-bit table, not all of them (at 10^9 items
    // and two threads 47 MB at the peak instead of 62 MB).
    Part& base = tables[0];
    for (unsigned part = 1; part < parts && !base.wide && base.spill.size() <= kSpillMax; ++part) {
        Part& p = tables[part];
        if (p.wide) continue;
        for (std::uint64_t r = 0; r < rows; ++r) {
            const std::uint32_t old = base.low[r];
            const auto sum = static_cast<std::uint32_t>(old + p.low[r]);
            base.low[r] = sum;
            if (sum < old) base.spill.emplace_back(r, 1);
        }
        base.spill.insert(base.spill.end(), p.spill.begin(), p.spill.end());
        p = Part{};
    }
    std::vector<std::uint64_t> out;
    assign_huge_zeros(out, static_cast<std::size_t>(rows));
    for (unsigned part = 0; part < parts; ++part) {
        Part& p = tables[part];
        if (p.wide) {
            for (std::uint64_t r = 0; r < rows; ++r) out[r] += p.wide[r];
        } else if (p.low) {  // (empty once folded into part 0)
            for (std::uint64_t r = 0; r < rows; ++r) out[r] += p.low[r];
            for (const auto& [row, carry] : p.spill) out[row] += carry << 32;
        }
        p = Part{};  // freed as soon as it is in
    }
    return out;
}

// Fewest items per length class by default (measured: bench/RESULTS.md), given the number of
// strata. A stratum's quota of a class must come from near the stratum's own range of the order,
// or gathering it reads far ranges: a class of c items sits, at a stratum boundary, about
// sqrt(c) / 2 items, n / (2 sqrt(c)) positions, from its quota, and a stratum reads its own range
// plus the largest deviation of its classes on either side. Merging costs batches (rows), though:
// a merged class's bound is its largest length. At 1e7 lognormal lengths in 245 units, classes
// of >= units^2 / 32 items read 11 units per unit for 0.8% more batches than a cut on the actual
// lengths; >= units^2 / 8, 7 units for 3.3% more; >= units^2 / 2, 5 units for 14% more. Small
// epochs (strata * n <= 2^24 positions: reading all of them for every stratum costs a few tenths
// of a second) keep every key, and at least 32 classes stay possible whatever the number of
// strata.
std::uint64_t class_min_items(std::uint64_t n, std::uint64_t strata);

// Windows per stratum: the fewest, a power of two, for which class_min_items(n, strata) is at
// most n / 10^4 (0.9995 best_fit efficiency and +0.6% token-budget batches on lognormal lengths,
// bench/RESULTS.md), with strata of at most kMaxStratumItems positions (a stratum being read
// costs 16 to 24 bytes per item) and at most all the windows. 1 where the windows are few enough.
constexpr std::uint64_t kMaxStratumItems = std::uint64_t{1} << 22;
std::uint64_t strata_per(std::uint64_t n, std::uint64_t window);

// Length classes over keys 0 .. K-1 in increasing length order.
class LengthClasses {
  public:
    LengthClasses() = default;
    // counts[k]: items of key k; uppers[k]: the largest rule length among them. Occupied keys in
    // order are merged upwards until each class holds at least min_items; a short last class
    // joins the one before it. An empty key maps to the class above it (the last class past the
    // top): never looked up unless the lengths change under a sampler, and then still a valid
    // class, so the mismatch is caught by a count check rather than read out of bounds.
    LengthClasses(const std::vector<std::uint64_t>& counts, const std::vector<std::uint64_t>& uppers,
                  std::uint64_t min_items);

    std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(count_.size()); }
    std::uint32_t of_key(std::size_t key) const noexcept { return key_to_class_[key]; }
    std::uint64_t count(std::uint32_t b) const noexcept { return count_[b]; }
    std::uint64_t upper(std::uint32_t b) const noexcept { return upper_[b]; }
    const std::vector<std::uint64_t>& uppers() const noexcept { return upper_; }

  private:
    std::vector<std::uint32_t> key_to_class_;
    std::vector<std::uint64_t> count_, upper_;
};

// Windows of the order, strata of `per_stratum` windows, and each class's quota per window.
class Strata {
  public:
    Strata(std::uint64_t n, std::uint64_t window, std::uint64_t per_stratum = 1)
        : n_(n), window_(window), per_(per_stratum == 0 ? 1 : per_stratum) {}

    std::uint64_t num_items() const noexcept { return n_; }
    std::uint64_t window_size() const noexcept { return window_; }
    std::uint64_t num_windows() const noexcept { return n_ == 0 ? 0 : (n_ - 1) / window_ + 1; }
    // First position of window w in the epoch's order.
    std::uint64_t window_start(std::uint64_t w) const noexcept { return w * window_ < n_ ? w * window_ : n_; }

    std::uint64_t per_stratum() const noexcept { return per_; }
    std::uint64_t stratum_size() const noexcept { return per_ * window_; }
    std::uint64_t num_strata() const noexcept { return n_ == 0 ? 0 : (n_ - 1) / stratum_size() + 1; }
    std::uint64_t stratum_of(std::uint64_t w) const noexcept { return w / per_; }
    // First position of stratum t in the epoch's order (also the quotas' s_t).
    std::uint64_t stratum_start(std::uint64_t t) const noexcept {
        return t < num_strata() ? t * stratum_size() : n_;
    }

    const LengthClasses& classes() const noexcept { return classes_; }
    void set_classes(LengthClasses classes) { classes_ = std::move(classes); }
    std::uint32_t num_classes() const noexcept { return classes_.size(); }
    // Class-b items of strata before t: floor(c_b s_t / n).
    std::uint64_t stratum_quota_before(std::uint64_t t, std::uint32_t b) const noexcept;
    // Window w's quota of every class, into quota (resized to the number of classes).
    void quotas(std::uint64_t w, std::vector<std::uint64_t>& quota) const;
    // The same for every window of stratum t at once (a layout's loop): stratum t's quotas
    // into `stratum`, then share(t, stratum, j, out) is its j-th window's: of class b, the
    // ranks r < q_b with (C_b + r) mod windows_in(t) == j.
    std::uint64_t windows_in(std::uint64_t t) const noexcept {
        return std::min(per_, num_windows() - t * per_);
    }
    void stratum_quotas(std::uint64_t t, std::vector<std::uint64_t>& stratum) const;
    void share(std::uint64_t t, const std::vector<std::uint64_t>& stratum, std::uint64_t j,
               std::vector<std::uint64_t>& quota) const;

  private:
    std::uint64_t n_, window_, per_;
    LengthClasses classes_;
};

// Stratum t's class ranks in an epoch's order: read positions [p0, p1) of the order, in order,
// and call take(class) for each item; it says whether the item is one of stratum t's.
class WindowRanks {
  public:
    std::uint64_t p0 = 0, p1 = 0;
    bool take(std::uint32_t b) noexcept {
        const std::uint64_t r = rank_[b]++;
        return r >= lo_[b] && r < hi_[b];
    }

  private:
    friend class ClassPrefix;
    std::vector<std::uint64_t> lo_, hi_, rank_;
};

// A stratum's items as read from the order (in position order) with their lengths and classes,
// kept by a reader for the stratum's windows.
struct StratumItems {
    std::uint64_t stratum = ~std::uint64_t{0};
    std::vector<std::uint64_t> items, lens;
    std::vector<std::uint32_t> classes;
    void clear() {
        stratum = ~std::uint64_t{0};
        items.clear();
        lens.clear();
        classes.clear();
    }
};

// Calls take(i) for the indices i of window w's items among its stratum's items (classes[i],
// in position order): the class-b item of rank r among the stratum's when (C_b + r) mod k_t is
// w's place j in its stratum (Strata::share's deal).
template <class Take>
void select_window(const Strata& strata, std::uint64_t w, const std::vector<std::uint32_t>& classes, Take&& take) {
    if (strata.per_stratum() == 1) {  // the window is its stratum
        for (std::size_t i = 0; i < classes.size(); ++i) take(i);
        return;
    }
    const std::uint32_t nc = strata.num_classes();
    const std::uint64_t t = strata.stratum_of(w), j = w - t * strata.per_stratum();
    const std::uint64_t k = strata.windows_in(t);
    std::vector<std::uint64_t> phase(nc);  // (C_b + rank) mod k of class b's next item
    std::uint64_t c = 0;
    for (std::uint32_t b = 0; b < nc; ++b) {
        phase[b] = c;
        c = (c + (strata.stratum_quota_before(t + 1, b) - strata.stratum_quota_before(t, b)) % k) % k;
    }
    for (std::size_t i = 0; i < classes.size(); ++i) {
        std::uint64_t& p = phase[classes[i]];
        if (p == j) take(i);
        if (++p == k) p = 0;
    }
}

// An epoch's prefix class histograms: prefix[k * classes + b] = class-b items at positions
// [0, stratum_start(k)) of the epoch's order. Memory: (strata + 1) x classes words.
class ClassPrefix {
  public:
    ClassPrefix() = default;
    // class_of(length) -> class; one threaded scan of the order.
    template <class ClassOf>
    ClassPrefix(const Strata& strata, const Lengths& lengths, const Feistel& perm, ClassOf&& class_of,
                unsigned threads);

    // Which positions of the order hold stratum t's quotas, and the ranks to count from there.
    WindowRanks stratum_ranks(const Strata& strata, std::uint64_t t) const;

  private:
    std::uint32_t classes_ = 0;
    std::uint64_t strata_ = 0;
    std::vector<std::uint64_t> prefix_;
};

template <class ClassOf>
ClassPrefix::ClassPrefix(const Strata& strata, const Lengths& lengths, const Feistel& perm, ClassOf&& class_of,
                         unsigned threads)
    : classes_(strata.num_classes()), strata_(strata.num_strata()) {
    const std::uint32_t classes = classes_;
    // Each class's count in every stratum's range of positions, then prefix sums.
    prefix_ = window_sums(lengths, perm, strata.stratum_size(), classes, threads,
                          [&](std::uint64_t* row, std::uint64_t v) { ++row[class_of(v)]; });
    for (std::uint64_t w = 1; w <= strata_; ++w)
        for (std::uint32_t b = 0; b < classes; ++b) prefix_[w * classes + b] += prefix_[(w - 1) * classes + b];
}

}  // namespace fastshard
