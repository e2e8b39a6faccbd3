// Mixtures of datasets: G[j] is (dataset c, item i of c), addressed as offset_c + i, the
// index of the item in the concatenation of the datasets (torch's ConcatDataset).
//
// The epoch's N draws are cut into M = ceil(N / period) windows, as equal as possible
// (boundaries b_m = floor(m N / M), so each window has floor(N / M) or ceil(N / M) draws).
//
// Proportions. The weights are integers u_c with sum U (the Python layer turns real weights
// into such integers exactly, or to 63 bits). At every boundary t = b_m the cumulative count
// of each dataset is its target t u_c / U rounded by largest remainders: floor(t u_c / U),
// plus one for the R datasets with the largest remainders (R makes the counts add up to t;
// ties go to the lower index). So |C_c(t) - t u_c / U| < 1 at every boundary, for every c.
// Largest remainders are not monotone in t in general (the Alabama paradox), but they are
// whenever every window is long enough that its target for every dataset with u_c > 0 is at
// least 1 (window length * u_c >= U): then floor grows by at least one per window while the
// rounding moves a count by at most one. MixtureSpec refuses periods that break this. A
// window's count of dataset c is C_c(b_{m+1}) - C_c(b_m), within 2 of its target.
//
// Interleaving. Window m's draws are its slots under a keyed permutation of [0, length)
// (the bare Feistel network, keyed by seed, epoch and m): slot s belongs to dataset c when
// prefix_c <= s < prefix_{c+1} (the window's counts in dataset order), and is the dataset's
// ordinal C_c(b_m) + s - prefix_c of the epoch.
//
// Inside a dataset. Of the d_c = C_c(N) draws of dataset c in an epoch (the same in every
// epoch), the first q n_c (q = d_c / n_c) walk q full passes over the dataset, each a fresh
// keyed permutation (the feistel order) per (seed, epoch, pass); the last r = d_c mod n_c
// draws take the next r positions of a permutation that lasts E = n_c / r epochs: epoch e
// takes positions [(e mod E) r, (e mod E) r + r) of the permutation of cycle e / E. So
// within an epoch every item is drawn floor(d_c / n_c) or ceil(d_c / n_c) times, and the
// partial passes of E consecutive epochs (e from a multiple of E) never repeat an item.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fastshard/plan.hpp"

namespace fastshard {

class Shard;

// Domain separators of the mixture's keys (versioned with the order).
constexpr std::uint64_t kMixWindowDomain = 16;
constexpr std::uint64_t kMixPassDomain = 17;
constexpr std::uint64_t kMixCycleDomain = 18;

// Windows up to this length are permuted by a Fisher-Yates table, longer ones by the
// network alone (its key setup is O(1), so a rank that takes one draw in W of a window does
// not pay for the whole window).
constexpr std::uint64_t kMixWindowTableMax = 64;

class MixtureSpec {
  public:
    // Throws std::invalid_argument (naming the argument) unless: k = sizes.size() =
    // units.size() >= 1; the sizes add up to < 2^63; the units add up to a U in [1, 2^64);
    // a dataset with u_c > 0 is not empty; 1 <= draws < 2^63; period >= 1; and, with two or
    // more windows, floor(draws / M) * u_c >= U for every u_c > 0 (monotone counts).
    MixtureSpec(std::vector<std::uint64_t> sizes, std::vector<std::uint64_t> units,
                std::uint64_t draws, std::uint64_t period);

    std::size_t k() const noexcept { return sizes_.size(); }
    const std::vector<std::uint64_t>& sizes() const noexcept { return sizes_; }
    const std::vector<std::uint64_t>& offsets() const noexcept { return offsets_; }  // k + 1
    const std::vector<std::uint64_t>& per_epoch() const noexcept { return per_epoch_; }
    std::uint64_t draws() const noexcept { return draws_; }
    std::uint64_t period() const noexcept { return period_; }
    std::uint64_t windows() const noexcept { return windows_; }
    std::uint64_t unit_total() const noexcept { return unit_total_; }
    const std::vector<std::uint64_t>& units() const noexcept { return units_; }

    // b_m = floor(m N / M) for m in [0, M].
    std::uint64_t boundary(std::uint64_t m) const noexcept;
    // The window holding draw j < N.
    std::uint64_t window_of(std::uint64_t j) const noexcept;
    // C_c(t) for every c into out[0..k): largest-remainder apportionment of t draws. `scratch`
    // holds 2 k words (no allocation once it has grown).
    void cumulative(std::uint64_t t, std::uint64_t* out, std::vector<std::uint64_t>& scratch) const;
    // The exact targets of t draws: t u_c = quot[c] U + rem[c], 0 <= rem[c] < U.
    void split(std::uint64_t t, std::uint64_t* quot, std::uint64_t* rem) const noexcept;
    // counts[c] from quot[c] of the split of t to C_c(t): one more for the t - sum(quot)
    // datasets of largest remainders. `order` holds k words.
    void round_up(std::uint64_t t, std::uint64_t* counts, const std::uint64_t* rem,
                  std::uint64_t* order) const;

    // The smallest window length that keeps the counts monotone: ceil(U / min positive u_c).
    std::uint64_t min_window() const noexcept { return min_window_; }

  private:
    // Whether windows of `period` draws give every dataset a target of at least one draw.
    bool period_fits(std::uint64_t period) const noexcept;
    std::vector<std::uint64_t> sizes_;
    std::vector<std::uint64_t> units_;
    std::vector<std::uint64_t> offsets_;
    std::vector<std::uint64_t> per_epoch_;
    std::uint64_t draws_ = 0;
    std::uint64_t period_ = 0;
    std::uint64_t windows_ = 0;
    std::uint64_t unit_total_ = 0;
    std::uint64_t min_window_ = 1;
};

std::shared_ptr<const Shard> make_mixture_shard(const Plan& plan,
                                                std::shared_ptr<const MixtureSpec> spec,
                                                std::uint64_t seed, std::uint64_t epoch);

}  // namespace fastshard
