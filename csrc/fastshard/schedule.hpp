// Mixture weights that change over training: a schedule of shares as a function of global
// progress, and each dataset's draws as one stream of keyed passes across epochs.
//
// Progress. Draw j of epoch e is global draw G = e N + j (N draws per epoch). The schedule is
// a list of points (g_i, u_i): at draw g_i the datasets' integer units u_i (each point's units
// add up to the same U <= 2^63); between two points the units move linearly (a ramp), two
// points at one draw are a step, and after the last point they stay. The share of dataset c
// at x is p_c(x) = u_c(x) / U, so the shares add up to 1 everywhere.
//
// Anchor. Counting starts at an anchor G0 with integer counts A_c (0 and 0 for a fresh run;
// the counts a resumed run had reached when it was resumed with other weights). Dataset c's
// target at G >= G0 is T_c(G) = A_c + integral of p_c over [G0, G], exact: a rational with
// denominator 2 L U (L the length of the ramp holding G; 2U on constant stretches). An anchor
// lies on a point or on a stretch where the units do not move (MixtureSchedule refuses one
// strictly inside a ramp), so every target at G has one denominator.
//
// Counts. Windows are those of the fixed-weight mixture (M = ceil(N / period) per epoch,
// boundaries floor(m N / M)), read as one global sequence of boundaries; the window holding
// the anchor starts at the anchor. At every boundary each dataset's count C_c is floor(T_c)
// or ceil(T_c), so |C_c - T_c| < 1, the counts add up to G - G0 + sum A, and they never
// decrease from one boundary to the next. Largest remainders alone would decrease when a
// dataset's target stays between the same two integers over two windows (a paused dataset,
// or one drawn less than once per window) while the others' remainders move. So a dataset
// whose target shares its integer interval [n, n + 1) with a neighbouring boundary is held:
// over the boundaries of that interval its count is one value (a chosen v in {n, n + 1}, or the
// nearest integer of its target, which only grows), except that the interval's first boundary
// may take anything in [n, value at the next] and its last anything in [value at the one
// before, n + 1]. Any choice in these ranges is monotone. Among the ranges, the remaining draws
// go to the datasets with the largest remainders. That is always possible while the held
// datasets are off their targets by less than 1 in total; paused datasets that stop at one
// change point are rounded together (the chosen v, by the Python layer) so that they are off
// by at most 1/2 together. If a boundary cannot be apportioned within 1 of every target, the
// fill raises std::runtime_error naming the draw (see docs/mixtures.md).
//
// Inside a dataset. Dataset c's k-th draw since the anchor is ordinal k of its stream: first
// the `len` positions of a lead permutation from `from` (the rest of the pass it stood in when
// the run was resumed with other weights), then global passes from ordinal `base` on, pass q
// a keyed permutation of (seed, c, q). Changing weights never restarts a pass.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fastshard/mixture.hpp"
#include "fastshard/plan.hpp"
#include "fastshard/u128.hpp"

namespace fastshard {

class Shard;

constexpr std::uint64_t kMixScheduleWindowDomain = 19;
constexpr std::uint64_t kMixStreamDomain = 20;

// Where a dataset's stream starts at the anchor (see above). All zero for a fresh run.
struct StreamStart {
    std::uint64_t key = 0, from = 0, len = 0, base = 0;
};

// A dataset's held value for one integer interval of its target: count v over [n, n + 1).
struct HeldValue {
    std::uint64_t n = 0, v = 0;
};

class MixtureSchedule {
  public:
    // Throws std::invalid_argument unless: k = sizes.size() >= 1, sizes add up to < 2^63;
    // point_draws non-decreasing from 0, below 2^63, at most two points per draw; units has k
    // entries per point, each point adding up to unit_total in [1, 2^63]; a dataset with a
    // positive unit somewhere is not empty; 1 <= draws < 2^63; period as for MixtureSpec
    // (0: the default, from the smallest positive unit); anchor < 2^63 and not strictly inside
    // a ramp; anchor_counts and starts have k entries; held lists are sorted by n per dataset.
    MixtureSchedule(std::vector<std::uint64_t> sizes, std::vector<std::uint64_t> point_draws,
                    std::vector<std::uint64_t> units, std::uint64_t unit_total, std::uint64_t draws,
                    std::uint64_t period, std::uint64_t seed, std::uint64_t anchor,
                    std::vector<std::uint64_t> anchor_counts, std::vector<StreamStart> starts,
                    std::vector<std::vector<HeldValue>> held);

    std::size_t k() const noexcept { return sizes_.size(); }
    const std::vector<std::uint64_t>& sizes() const noexcept { return sizes_; }
    const std::vector<std::uint64_t>& offsets() const noexcept { return offsets_; }
    std::uint64_t draws() const noexcept { return draws_; }
    std::uint64_t period() const noexcept { return period_; }
    std::uint64_t windows() const noexcept { return windows_; }
    std::uint64_t seed() const noexcept { return seed_; }
    std::uint64_t anchor() const noexcept { return anchor_; }
    const std::vector<std::uint64_t>& anchor_counts() const noexcept { return anchor_counts_; }
    const std::vector<StreamStart>& starts() const noexcept { return starts_; }

    // b_m of an epoch, for m in [0, M].
    std::uint64_t boundary(std::uint64_t m) const noexcept;
    std::uint64_t window_of(std::uint64_t j) const noexcept;
    // Global draw of boundary index i = e M + m (the last boundary of an epoch is the first of
    // the next).
    std::uint64_t boundary_draw(std::uint64_t i) const noexcept;
    // The first boundary index after the anchor.
    std::uint64_t first_boundary() const noexcept { return first_boundary_; }

    // T_c(G) for G >= anchor: integer parts into whole[0, k), remainders into num[0, k) over
    // the returned denominator.
    struct Targets {
        std::vector<std::uint64_t> whole;
        std::vector<u128> num;
        u128 den = 1;
    };
    void targets(std::uint64_t g, Targets& out) const;

    // Counts at boundary index i >= first_boundary() - 1 (the anchor for first_boundary() - 1).
    // `cache` keeps the targets of recent boundaries, so a sequential walk evaluates one new
    // boundary per window. Throws std::runtime_error if no apportionment within 1 exists.
    struct Cache {
        std::vector<Targets> ring;         // targets of recent boundary indices, by idx % size
        std::vector<std::uint64_t> tags;   // the index each slot holds
        std::vector<std::uint64_t> scratch;
        std::vector<std::uint32_t> order;
    };
    void boundary_counts(std::uint64_t i, Cache& cache, std::uint64_t* out) const;
    // Counts after g >= anchor draws (any g, not only boundaries).
    void counts_at(std::uint64_t g, std::uint64_t* out) const;

    // Stream ordinal x (draws since the anchor) of dataset c: position and key.
    void locate(std::size_t c, std::uint64_t x, std::uint64_t& pos, std::uint64_t& key) const noexcept;
    bool one_order(std::size_t c, std::uint64_t lo, std::uint64_t hi) const noexcept;
    std::uint64_t window_key(std::uint64_t epoch, std::uint64_t m) const noexcept;

  private:
    void ensure(std::uint64_t from, std::uint64_t to, Cache& cache) const;
    // The value of dataset c at a boundary inside an integer interval: its held value there,
    // else its target's nearest integer.
    std::uint64_t interior_value(std::size_t c, const Targets& t) const noexcept;
    // The held value of dataset c over [n, n + 1), or all ones if none was chosen.
    std::uint64_t held(std::size_t c, std::uint64_t n) const noexcept;

    std::vector<std::uint64_t> sizes_, offsets_;
    std::vector<std::uint64_t> point_draws_;
    std::vector<std::uint64_t> units_;  // point-major, k per point
    std::uint64_t unit_total_ = 1;
    std::uint64_t draws_ = 0, period_ = 0, windows_ = 0, seed_ = 0;
    std::uint64_t anchor_ = 0;
    std::size_t anchor_point_ = 0;  // the last point at or before the anchor
    std::uint64_t first_boundary_ = 0;
    std::vector<std::uint64_t> anchor_counts_;
    std::vector<StreamStart> starts_;
    std::vector<std::uint64_t> stream_keys_;
    std::vector<std::vector<HeldValue>> held_;
    // For points i > anchor_point_: the integral from the anchor to g_i, whole and remainder
    // over 2U, point-major.
    std::vector<std::uint64_t> pre_whole_;
    std::vector<u128> pre_rem_;
};

// The mixture a run drew from before it took new weights, for the draws between the cursor
// where it took them (`from`, a global draw) and the next boundary of that mixture's windows
// (the new anchor): the rest of that window is drawn as it would have been, so that every
// dataset's draws so far are a prefix of its stream when the new weights start. Either a
// fixed-weight mixture (spec, seed) or a schedule (with its own bridge, if any).
struct Bridge {
    std::shared_ptr<const MixtureSpec> spec;
    std::uint64_t seed = 0;
    std::shared_ptr<const MixtureSchedule> schedule;
    std::shared_ptr<const Bridge> inner;
    std::uint64_t from = 0;
};

// A rank's shard of epoch `epoch`: its draws from the cursor on, which must not start before
// the anchor (or the bridge's `from`, with a bridge).
std::shared_ptr<const Shard> make_schedule_shard(const Plan& plan,
                                                 std::shared_ptr<const MixtureSchedule> schedule,
                                                 std::uint64_t epoch,
                                                 std::shared_ptr<const Bridge> bridge = nullptr);

// Where each dataset of a fixed-weight mixture stands after the first j draws of an epoch:
// its draws so far in counts[c], and the rest of the pass it is in as a stream start.
void mixture_stand(std::shared_ptr<const MixtureSpec> spec, std::uint64_t seed,
                   std::uint64_t epoch, std::uint64_t j, std::vector<std::uint64_t>& counts,
                   std::vector<StreamStart>& starts);

}  // namespace fastshard
