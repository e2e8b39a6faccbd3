"""MixtureSampler with weights that change over training: a schedule given up front, and new
weights (or datasets) on resume. Targets are checked against the exact rational integral of
the schedule, written out here independently of the code."""

from __future__ import annotations

import json
import math
import pickle
from fractions import Fraction

import numpy as np
import pytest

from fastshard import MixtureSampler, _distributed


# -- an independent reference --------------------------------------------------------------
def exact_targets(schedule, g, anchor=0, counts=None):
    """Each dataset's exact target after global draw g: the integral of its share (each point's
    weights normalised, shares linear between points, steps where two points share a draw,
    constant after the last) over [anchor, g], plus its count at the anchor."""
    k = len(schedule[0][1])
    shares = []
    for at, w in schedule:
        w = [Fraction(x) for x in w]
        shares.append((at, [x / sum(w) for x in w]))
    out = [Fraction(c) for c in (counts or [0] * k)]
    for i, (start, p0) in enumerate(shares):
        end, p1 = shares[i + 1] if i + 1 < len(shares) else (None, p0)
        lo, hi = max(start, anchor), g if end is None else min(end, g)
        if hi <= lo:
            continue
        for c in range(k):
            if end is None or end == start:
                a = b = p0[c]
            else:
                a = p0[c] + (p1[c] - p0[c]) * Fraction(lo - start, end - start)
                b = p0[c] + (p1[c] - p0[c]) * Fraction(hi - start, end - start)
            out[c] += (a + b) / 2 * (hi - lo)
    return out


def labels_of(indices, offsets):
    return np.searchsorted(np.asarray(offsets[1:], dtype=np.int64), indices, side="right")


def run(s, epochs):
    """The global draws of epochs [0, epochs) of a sampler with one rank."""
    parts = []
    for e in range(epochs):
        s.set_epoch(e)
        parts.append(s.indices())
    return np.concatenate(parts)


def boundaries(s, epochs):
    """Global window boundaries of epochs [0, epochs): from the anchor on when it has one."""
    n = s.num_draws
    m = s._spec.windows if s._anchor is None else s._sched.windows
    grid = {e * n + (w * n) // m for e in range(epochs) for w in range(m + 1)}
    if s._anchor is not None:
        grid = {b for b in grid if b > s._anchor["draw"]} | {s._anchor["draw"]}
    return sorted(grid)


def coverage_ok(draws, offsets, sizes, bounds, start=0):
    """At every boundary, each dataset's items drawn since `start` were drawn equally often,
    give or take one: it walks whole passes, nothing repeated before everything was seen once."""
    lab = labels_of(draws, offsets)
    starts = start if isinstance(start, list) else [start] * len(sizes)
    for b in bounds:
        for c, size in enumerate(sizes):
            start = starts[c]
            if b <= start:
                continue
            mine = draws[start:b][lab[start:b] == c] - offsets[c]
            counts = np.bincount(mine, minlength=size)
            if counts.max() - counts.min() > 1:
                return False
    return True


def check_counts(s, schedule, epochs, anchor=0, counts=None, draws=None, slack=Fraction(0)):
    """Every window boundary: each dataset within 1 of its exact target (plus `slack` per
    draw for weights rounded to 2**-63), counts monotone and adding up."""
    draws = run(s, epochs) if draws is None else draws
    k = len(s.sizes)
    lab = labels_of(draws, s.offsets)
    onehot = np.zeros((len(lab) + 1, k), dtype=np.int64)
    onehot[np.arange(1, len(lab) + 1), lab] = 1
    running = np.cumsum(onehot, axis=0)
    base = np.asarray(counts or [0] * k)
    worst, previous = Fraction(0), None
    for b in boundaries(s, epochs):
        if b < anchor:
            continue
        got = (running[b - anchor] + base).tolist()
        want = exact_targets(schedule, b, anchor, counts)
        for c in range(k):
            err = abs(got[c] - want[c])
            assert err < 1 + slack * b, (b, c, got, [float(x) for x in want])
            worst = max(worst, err)
        if previous is not None:
            assert all(x >= y for x, y in zip(got, previous))
        previous = got
    return worst


def per_dataset(draws, offsets):
    lab = labels_of(draws, offsets)
    return [(draws[lab == c] - offsets[c]).tolist() for c in range(len(offsets) - 1)]


# A curriculum in four phases over epochs of 1000 draws (global draws, across epochs): web and
# code; a ramp towards books; books paused (weight 0) and back; then an anneal on code alone.
CURRICULUM = [
    (0, [3, 1, 0]),
    (2500, [3, 1, 0]),
    (4500, [1, 1, 2]),
    (4500, [2, 2, 0]),
    (6300, [2, 2, 0]),
    (6300, [1, 1, 1]),
    (8000, [1, 1, 1]),
    (8000, [0, 1, 0]),
]

SCHEDULES = {
    # steps between constant stretches, the change points inside windows (period 256)
    "steps": (
        [400, 300, 90],
        [(0, [1, 1, 0]), (1300, [1, 1, 0]), (1300, [0, 1, 1]), (3777, [1, 0, 1])],
        1000,
        256,
    ),
    "ramp": ([500, 500], [(0, [1, 0]), (3950, [0, 1])], 1000, None),  # one ramp from 0 to 1
    "ramps_between": (
        [200, 300, 400],
        [(0, [5, 3, 2]), (2100, [2, 3, 5]), (2600, [2, 3, 5]), (4100, [1, 1, 1])],
        997,
        100,
    ),
    "zero_and_back": (
        [100, 200, 300],
        [
            (0, [1, 1, 1]),
            (1500, [1, 1, 1]),
            (1500, [1, 0, 1]),
            (3100, [1, 0, 1]),
            (3100, [1, 1, 1]),
        ],
        1000,
        128,
    ),
    "curriculum": ([300, 700, 50], CURRICULUM, 1000, None),
    # four of five datasets pause at one point: rounded one by one to the nearest draw they
    # would be 1.6 draws above their targets together, more than the fifth can make up
    "anneal": ([50] * 5, [(0, [1] * 5), (1003, [1] * 5), (1003, [0, 0, 0, 0, 1])], 1000, 128),
    "dyadic_floats": (
        [64, 64, 64, 64],
        [(0, [0.5, 0.25, 0.125, 0.125]), (3000, [0.125, 0.125, 0.25, 0.5])],
        1111,
        128,
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_counts_stay_within_one_of_the_exact_integral_at_every_window_boundary(name):
    sizes, schedule, n, period = SCHEDULES[name]
    s = MixtureSampler(
        sizes, schedule=schedule, num_samples=n, num_replicas=1, rank=0, seed=5, period=period
    )
    epochs = -(-schedule[-1][0] // n) + 2
    # some change point lies strictly inside a window: that window is apportioned exactly too
    inside = [g for g, _ in schedule if g not in set(boundaries(s, epochs))]
    assert inside, "the case must have a change point inside a window"
    worst = check_counts(s, schedule, epochs)
    assert worst < 1


# Pauses while the others' remainders move: plain largest remainders take a paused dataset's
# draw back at some boundary in each of these (found by a search over random pauses).
PAUSES = [
    (
        [108, 79, 193],
        [(0, [4, 3, 1]), (748, [4, 3, 1]), (748, [4, 0, 1]), (2387, [4, 0, 1]), (3248, [4, 3, 1])],
        777,
        37,
    ),
    (
        [149, 120, 170, 28],
        [
            (0, [2, 4, 4, 2]),
            (1283, [2, 4, 4, 2]),
            (1283, [2, 4, 0, 2]),
            (2906, [2, 4, 0, 2]),
            (3783, [2, 4, 4, 2]),
        ],
        777,
        100,
    ),
    (
        [42, 132, 189, 150],
        [
            (0, [2, 5, 4, 3]),
            (521, [2, 5, 4, 3]),
            (521, [2, 5, 4, 0]),
            (2521, [2, 5, 4, 0]),
            (3021, [2, 5, 4, 3]),
        ],
        333,
        64,
    ),
    (
        [62, 60, 85],
        [
            (0, [2, 3, 3]),
            (1380, [2, 3, 3]),
            (1380, [2, 0, 3]),
            (3318, [2, 0, 3]),
            (3880, [2, 3, 3]),
        ],
        500,
        64,
    ),
]


@pytest.mark.parametrize("case", range(len(PAUSES)))
def test_paused_datasets_hold_their_count_within_one_and_never_go_back(case):
    sizes, schedule, n, period = PAUSES[case]
    s = MixtureSampler(
        sizes, schedule=schedule, num_samples=n, num_replicas=1, rank=0, seed=case, period=period
    )
    epochs = -(-schedule[-1][0] // n) + 2
    draws = run(s, epochs)
    check_counts(s, schedule, epochs, draws=draws)
    assert coverage_ok(draws, s.offsets, sizes, boundaries(s, epochs))


def test_a_weight_at_zero_pauses_the_dataset_and_it_resumes_where_it_stopped():
    sizes, schedule, n, period = SCHEDULES["zero_and_back"]
    s = MixtureSampler(
        sizes, schedule=schedule, num_samples=n, num_replicas=1, rank=0, seed=2, period=period
    )
    draws = run(s, 5)
    lab = labels_of(draws, s.offsets)
    bounds = boundaries(s, 5)
    held = [int((lab[:b] == 1).sum()) for b in bounds if 1500 < b <= 3100]
    # weight 0 over [1500, 3100): its count holds (at most the one draw its rounding owed it)
    assert max(held) - min(held) <= 1 and held[-1] - int((lab[:1500] == 1).sum()) <= 1
    # and its pass goes on where it stopped: whole passes over the pause, from the start
    assert coverage_ok(draws, s.offsets, sizes, bounds)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_dataset_walks_whole_passes_across_change_points_and_epochs(name):
    sizes, schedule, n, period = SCHEDULES[name]
    s = MixtureSampler(
        sizes, schedule=schedule, num_samples=n, num_replicas=1, rank=0, seed=9, period=period
    )
    epochs = -(-schedule[-1][0] // n) + 2
    draws = run(s, epochs)
    assert coverage_ok(draws, s.offsets, sizes, boundaries(s, epochs))


@pytest.mark.parametrize("world", [2, 3, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_global_sequence_is_the_same_for_any_number_of_ranks(world, drop_last):
    sizes, schedule, n, period = SCHEDULES["steps"]
    one = MixtureSampler(
        sizes, schedule=schedule, num_samples=n, num_replicas=1, rank=0, seed=4, period=period
    )
    for epoch in (1, 3):  # an epoch holding a step, and one inside a ramp
        one.set_epoch(epoch)
        whole = one.indices()
        shards = []
        for r in range(world):
            s = MixtureSampler(
                sizes,
                schedule=schedule,
                num_samples=n,
                num_replicas=world,
                rank=r,
                seed=4,
                period=period,
                drop_last=drop_last,
            )
            s.set_epoch(epoch)
            shards.append(s.indices())
            assert list(s) == shards[-1].tolist()
        total = len(shards[0]) * world
        merged = np.empty(total, dtype=np.int64)
        for r in range(world):
            merged[r::world] = shards[r]
        assert np.array_equal(merged, np.concatenate([whole, whole])[:total])


def test_exact_resume_inside_a_ramp_on_the_same_and_another_world():
    sizes, schedule, n, period = SCHEDULES["ramp"][0], SCHEDULES["ramp"][1], 1000, None
    kw = dict(schedule=schedule, num_samples=n, seed=11, period=period)
    run2 = [MixtureSampler(sizes, num_replicas=2, rank=r, **kw) for r in range(2)]
    for s in run2:
        s.set_epoch(2)  # draws 2000-3000: inside the ramp
    full = [s.indices() for s in run2]
    its = [iter(s) for s in run2]
    for it in its:
        for _ in range(123):
            next(it)
    state = json.loads(json.dumps(run2[0].state_dict()))
    assert state == run2[1].state_dict() and state["schedule"] == [[g, w] for g, w in schedule]
    for r in range(2):
        t = MixtureSampler(sizes, num_replicas=2, rank=r, **kw)
        t.load_state_dict(state)
        t.set_epoch(2)
        assert list(t) == full[r][123:].tolist()
    whole = MixtureSampler(sizes, num_replicas=1, rank=0, **kw)
    whole.set_epoch(2)
    rest = [MixtureSampler(sizes, num_replicas=3, rank=r, **kw) for r in range(3)]
    for t in rest:
        t.load_state_dict(state)
    parts = [t.indices() for t in rest]
    merged = np.empty(len(parts[0]) * 3, dtype=np.int64)
    for r in range(3):
        merged[r::3] = parts[r]
    assert np.array_equal(merged[: n - 246], whole.indices()[246:])


def test_a_state_of_other_weights_is_refused_unless_reweight_is_asked():
    old = MixtureSampler([100, 200], [1, 1], 300, 1, 0)
    state = old.state_dict(consumed=50)
    new = MixtureSampler([100, 200], [1, 3], 300, 1, 0)
    with pytest.raises(ValueError, match="state was saved with weights"):
        new.load_state_dict(state)
    sched = MixtureSampler(
        [100, 200], schedule=[(0, [1, 1])], num_samples=300, num_replicas=1, rank=0
    )
    with pytest.raises(ValueError, match="state"):
        sched.load_state_dict(state)
    for bad, match in (
        (MixtureSampler([100, 201], [1, 3], 300, 1, 0), "sizes"),
        (MixtureSampler([100, 200], [1, 3], 301, 1, 0), "num_samples"),
        (MixtureSampler([100, 200], [1, 3], 300, 1, 0, seed=1), "seed"),
        (MixtureSampler([200], [1], 300, 1, 0), "sizes"),
    ):
        with pytest.raises(ValueError, match=match):
            bad.load_state_dict(state, reweight=True)
    before = new.indices()
    new.load_state_dict(state, reweight=True)  # accepted when asked
    assert not np.array_equal(new.indices()[:10], before[:10])


def _resumed(state, sizes, world, **kw):
    ranks = [MixtureSampler(sizes, num_replicas=world, rank=r, **kw) for r in range(world)]
    for t in ranks:
        t.load_state_dict(state, reweight=True)
    rest = [t.indices() for t in ranks]
    merged = np.empty(len(rest[0]) * world, dtype=np.int64)
    for r in range(world):
        merged[r::world] = rest[r]
    return ranks, merged


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("source", ["weights", "schedule"])
def test_new_weights_on_resume_continue_every_dataset_where_it_stood(world, source):
    sizes, n = [50, 120, 30], 400
    if source == "weights":
        old = MixtureSampler(sizes, [2, 1, 1], n, 1, 0, seed=3)
    else:
        old = MixtureSampler(
            sizes,
            schedule=[(0, [2, 1, 1]), (700, [1, 2, 1])],
            num_samples=n,
            num_replicas=1,
            rank=0,
            seed=3,
        )
    before = []
    for e in range(2):
        old.set_epoch(e)
        before.append(old.indices())
    old.set_epoch(2)
    before.append(old.indices(0, 150))
    state = json.loads(json.dumps(old.state_dict(consumed=150)))
    new_schedule = [(0, [1, 1, 6]), (1500, [1, 1, 6]), (1500, [0, 1, 1])]
    kw = dict(schedule=new_schedule, num_samples=n, seed=3)
    ranks, merged = _resumed(state, sizes, world, **kw)
    after = [merged[: n - 150]]
    for e in range(3, 6):
        for t in ranks:
            t.set_epoch(e)
        parts = [t.indices() for t in ranks]
        m = np.empty(len(parts[0]) * world, dtype=np.int64)
        for r in range(world):
            m[r::world] = parts[r]
        after.append(m[:n])
    draws = np.concatenate(before + after)
    offsets = ranks[0].offsets
    one = MixtureSampler(sizes, num_replicas=1, rank=0, **kw)
    one.load_state_dict(state, reweight=True)
    assert np.array_equal(merged[: n - 150], one.indices())  # the same on any W
    g0 = one._anchor["draw"]  # the new weights start at the next window boundary
    assert 2 * n + 150 <= g0 < 2 * n + 150 + old.period
    # nothing repeated before everything was seen once: counted from the start for streams;
    # for the per-epoch order of fixed weights, from the start of the epochs whose partial
    # passes share one order (E = n // (d mod n) epochs from a multiple of E)
    old_bounds = [b for b in boundaries(old, 3) if b <= g0]
    start = 0
    if source == "weights":
        start = []
        for size, d in zip(sizes, old.per_epoch):
            cycle = size // (d % size) if d % size else 1
            start.append(2 // cycle * cycle * n)
    assert coverage_ok(draws, offsets, sizes, old_bounds + boundaries(one, 6), start)
    # from there on, the counts follow the new schedule within 1 of its exact integral
    counts = np.bincount(labels_of(draws[:g0], offsets), minlength=3).tolist()
    if source == "weights":
        assert counts == one._anchor["counts"]
    check_counts(one, new_schedule, 6, anchor=g0, counts=one._anchor["counts"], draws=draws[g0:])


@pytest.mark.parametrize("world", [1, 3])
def test_a_dataset_added_on_resume_starts_its_first_pass_and_the_others_continue(world):
    sizes, n = [40, 90], 300
    old = MixtureSampler(sizes, [1, 1], n, 1, 0, seed=8)
    old.set_epoch(1)
    head = old.indices(0, 100)
    state = old.state_dict(consumed=100)
    old.set_epoch(0)
    head = np.concatenate([old.indices(), head])
    bigger = [*sizes, 25]
    kw = dict(schedule=[(0, [1, 1, 1])], num_samples=n, seed=8)
    ranks, merged = _resumed(state, bigger, world, **kw)
    rest = [merged[: n - 100]]
    for e in (2, 3):
        for t in ranks:
            t.set_epoch(e)
        parts = [t.indices() for t in ranks]
        m = np.empty(len(parts[0]) * world, dtype=np.int64)
        for r in range(world):
            m[r::world] = parts[r]
        rest.append(m[:n])
    offsets = ranks[0].offsets
    draws = np.concatenate([head, *rest])
    g0 = ranks[0]._anchor["draw"]
    bounds = [b for b in boundaries(old, 2) if b <= g0] + boundaries(ranks[0], 4)
    assert coverage_ok(draws, offsets, bigger, bounds, start=n)
    items = per_dataset(draws, offsets)
    assert len(items[2]) > 0 and items[2] == per_dataset(np.concatenate(rest), offsets)[2]


def test_resume_with_new_weights_inside_a_new_ramp_is_refused_and_changes_nothing():
    old = MixtureSampler([100, 100], [1, 1], 500, 1, 0)
    state = old.state_dict(consumed=100)
    new = MixtureSampler(
        [100, 100], schedule=[(0, [1, 0]), (1000, [0, 1])], num_samples=500, num_replicas=1, rank=0
    )
    before = new.indices()
    with pytest.raises(ValueError, match="inside a ramp"):
        new.load_state_dict(state, reweight=True)
    assert np.array_equal(new.indices(), before)


def test_pickle_repr_and_the_guard_digest_the_schedule():
    a = MixtureSampler(
        [10, 20], schedule=[(0, [1, 1]), (100, [1, 2])], num_samples=30, num_replicas=1, rank=0
    )
    b = MixtureSampler(
        [10, 20], schedule=[(0, [1, 1]), (100, [1, 3])], num_samples=30, num_replicas=1, rank=0
    )
    u = pickle.loads(pickle.dumps(a))
    assert np.array_equal(u.indices(), a.indices()) and repr(u) == repr(a)
    row_a, row_b = (_distributed._row(_distributed._fields(s)) for s in (a, b))
    assert row_a != row_b and len(row_a) == _distributed.WIDTH
    assert isinstance(_distributed._fields(a)["schedule"], list)
    with pytest.raises(AttributeError):
        a.schedule = []


@pytest.mark.parametrize(
    "schedule,match",
    [
        (
            [(0, [1, 1]), (50, [1, 1]), (40, [1, 2])],
            r"schedule\[2\] is at draw 40, before schedule\[1\]",
        ),
        ([(0, [1, 1]), (50, [1, -1])], r"schedule\[1\]: weights\[1\] = -1 is negative"),
        ([(0, [1, 1]), (50, [0, 0])], r"schedule\[1\]: weights are all zero"),
        ([(0, [1, 1]), (50, [math.nan, 1])], r"schedule\[1\]: weights\[0\] = nan is NaN"),
        ([(0, [1, 1]), (50, [1, math.inf])], r"schedule\[1\]: weights\[1\] = inf is infinite"),
        ([(10, [1, 1])], r"schedule\[0\] must be at draw 0"),
        (
            [(0, [1, 1]), (5, [1, 2]), (5, [2, 1]), (5, [1, 1])],
            r"schedule\[3\] is the third point at draw 5",
        ),
        ([(0, [1, 1, 1])], r"schedule\[0\]: weights must have one entry per dataset"),
        ([(0, [1, 1]), (-1, [1, 1])], r"schedule\[1\]'s draw must be in"),
        ([], "at least one point"),
        ([(0, [1, 0]), (9, [0, 1])], r"schedule\[1\]: dataset 1 is empty"),
    ],
)
def test_bad_schedules_are_refused_naming_the_point(schedule, match):
    sizes = [5, 0] if "empty" in match else [5, 5]
    with pytest.raises(ValueError, match=match):
        MixtureSampler(sizes, schedule=schedule, num_replicas=1, rank=0)


def test_weights_and_schedule_are_exclusive():
    with pytest.raises(TypeError, match="exactly one of weights"):
        MixtureSampler([5, 5], [1, 1], schedule=[(0, [1, 1])], num_replicas=1, rank=0)
    with pytest.raises(TypeError, match="neither"):
        MixtureSampler([5, 5], num_replicas=1, rank=0)


def test_ten_billion_items_with_a_schedule():
    sizes = [6 * 10**9, 3 * 10**9, 10**9]
    schedule = [(0, [5, 3, 2]), (10**10, [2, 3, 5]), (3 * 10**10, [1, 1, 1])]
    s = MixtureSampler(sizes, schedule=schedule, num_replicas=8, rank=3, seed=1)
    one = MixtureSampler(sizes, schedule=schedule, num_replicas=1, rank=0, seed=1)
    s.set_epoch(1)
    one.set_epoch(1)  # inside the ramp
    for k in (0, 1, 12345, len(s) - 1):
        assert s[k] == one[3 + 8 * k]
    head = one.indices(0, 1 << 16)
    assert head.min() >= 0 and head.max() < 10**10


def test_fixed_weight_orders_are_unchanged():
    """The fixed-weight map is pinned: a schedule is a separate map and leaves it alone."""
    s = MixtureSampler([10, 100, 1000], [0.5, 0.3, 0.2], 5000, 2, 1, seed=3, period=100)
    s.set_epoch(2)
    assert s.indices(0, 12).tolist() == PINNED
    assert s._anchor is None


PINNED = [109, 52, 2, 8, 5, 2, 2, 5, 67, 9, 180, 56]


@pytest.mark.parametrize(
    ("draw", "error", "match"),
    [
        (-1, ValueError, r"draw must be in \[0, 9223372036854775807\], got -1"),
        (2**63, ValueError, "draw must be in"),
        (2**64, ValueError, "draw must be in"),
        (1.5, TypeError, "draw must be an integer"),
        (True, TypeError, "draw must be an integer"),
    ],
)
def test_counts_refuses_a_draw_out_of_range_naming_it(draw, error, match):
    # Before: pybind's "incompatible function arguments" from the core for -1 and 2**64.
    s = MixtureSampler([10, 20], schedule=[(0, [1, 1]), (100, [1, 2])], num_replicas=1, rank=0)
    with pytest.raises(error, match=match):
        s.counts(draw)
    assert sum(s.counts(2**63 - 1)) == 2**63 - 1  # the last global draw is still counted
