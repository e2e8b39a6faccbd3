"""MixtureSampler: proportions in every window, coverage inside each dataset, the plan over
ranks, resume, the data path through ConcatDataset, randomness, and bad input."""

from __future__ import annotations

import json
import math
import pickle
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

import fastshard
from fastshard import BatchSampler, MixtureSampler

from .conftest import child_peak_growth_kib


def labels_of(indices: np.ndarray, offsets: list[int]) -> np.ndarray:
    """The dataset of each concatenation index."""
    return np.searchsorted(np.asarray(offsets[1:], dtype=np.int64), indices, side="right")


def epoch_of(sizes, weights, num_samples=None, period=None, seed=0, epoch=0) -> np.ndarray:
    s = MixtureSampler(sizes, weights, num_samples, 1, 0, seed, period=period)
    s.set_epoch(epoch)
    return s.indices()


def shares(weights) -> list[Fraction]:
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    return [w / total for w in exact]


def reference_cumulative(t: int, units: list[int]) -> list[int]:
    """Largest remainders, written out independently of the C++ code."""
    total = sum(units)
    floors = [t * u // total for u in units]
    rems = [t * u % total for u in units]
    extra = t - sum(floors)
    for c in sorted(range(len(units)), key=lambda c: (-rems[c], c))[:extra]:
        floors[c] += 1
    return floors


# (sizes, weights, num_samples, period): even and uneven shares, one tiny dataset upsampled
# hundreds of times, a zero weight, many datasets, windows that do not divide the epoch.
CASES = [
    ([1000, 1000], [1, 1], None, None),
    ([10, 100, 1000], [0.5, 0.3, 0.2], 5000, None),
    ([7, 5000, 300], [1, 1, 1], 9001, 100),
    ([3, 10_000], [0.25, 0.75], 12_345, 64),
    ([50, 60, 70, 80, 90], [3, 1, 4, 1, 5], 7777, 97),
    ([1000, 0, 1000], [2, 0, 1], 3000, 10),
    ([100] * 13, [1 / 3] * 6 + [0.1] * 7, 20_000, 1000),
    ([5, 5, 5], [1e-3, 1, 1], 30_000, None),  # a small share: the default period grows
]


@pytest.mark.parametrize("sizes,weights,num_samples,period", CASES)
def test_cumulative_counts_stay_within_one_of_the_target_at_every_window_boundary(
    sizes, weights, num_samples, period
):
    s = MixtureSampler(sizes, weights, num_samples, 1, 0, seed=3, period=period)
    spec = s._spec
    labels = labels_of(s.indices(), s.offsets)
    k = len(sizes)
    onehot = np.zeros((len(labels) + 1, k), dtype=np.int64)
    onehot[np.arange(1, len(labels) + 1), labels] = 1
    running = np.cumsum(onehot, axis=0)  # running[t] = counts among the first t draws
    p = shares(weights)
    worst = Fraction(0)
    previous = [0] * k
    for m in range(spec.windows + 1):
        t = spec.boundary(m)
        got = running[t].tolist()
        assert got == reference_cumulative(t, spec.units) == spec.cumulative(t)
        for c in range(k):
            # the exact target t * p_c, for real weights to within their 2**-63 rounding
            err = abs(got[c] - t * p[c])
            assert err < 1 + Fraction(t, 2**63), (m, c, got[c], float(t * p[c]))
            worst = max(worst, err)
            if m:
                window = t - spec.boundary(m - 1)
                assert abs((got[c] - previous[c]) - window * p[c]) < 2 + Fraction(window, 2**62)
                assert got[c] >= previous[c]
        previous = got
    assert worst < 1
    assert s.per_epoch == running[-1].tolist() == reference_cumulative(len(labels), spec.units)


def test_windows_are_as_equal_as_possible_and_at_most_period():
    s = MixtureSampler([10**6, 10**6], [1, 1], 10_000, 1, 0, period=300)
    spec = s._spec
    lengths = {spec.boundary(m + 1) - spec.boundary(m) for m in range(spec.windows)}
    assert spec.windows == math.ceil(10_000 / 300)
    assert lengths <= {10_000 // spec.windows, -(-10_000 // spec.windows)}
    assert max(lengths) <= 300


def test_integer_weights_are_exact_shares_and_real_ones_are_rounded_to_2_pow_63():
    assert MixtureSampler([10, 10], [3, 1], num_replicas=1, rank=0)._units == [3, 1]
    units = MixtureSampler([10, 10, 10], [0.1, 0.2, 0.7], num_replicas=1, rank=0)._units
    assert sum(units) == 2**63
    for u, p in zip(units, shares([0.1, 0.2, 0.7])):
        assert abs(Fraction(u, 2**63) - p) < Fraction(1, 2**63)
    # dyadic shares are exact
    assert MixtureSampler([10, 10], [0.25, 0.75], num_replicas=1, rank=0)._units == [
        2**61,
        3 * 2**61,
    ]


@pytest.mark.parametrize("sizes,weights,num_samples,period", CASES)
def test_items_of_a_dataset_are_drawn_evenly_and_whole_passes_come_first(
    sizes, weights, num_samples, period
):
    s = MixtureSampler(sizes, weights, num_samples, 1, 0, seed=5, period=period)
    idx = s.indices()
    labels = labels_of(idx, s.offsets)
    spec = s._spec
    for c, n in enumerate(sizes):
        mine = idx[labels == c] - s.offsets[c]
        d = s.per_epoch[c]
        assert len(mine) == d
        if n == 0:
            continue
        counts = np.bincount(mine, minlength=n)
        assert len(counts) == n
        assert set(counts.tolist()) <= {d // n, -(-d // n)}
    # At every window boundary each dataset's items so far were drawn equally often, give or
    # take one: a dataset is cycled through whole before any of its items repeats.
    for m in range(1, spec.windows + 1):
        prefix = idx[: spec.boundary(m)]
        pl = labels_of(prefix, s.offsets)
        for c, n in enumerate(sizes):
            if n:
                counts = np.bincount(prefix[pl == c] - s.offsets[c], minlength=n)
                assert counts.max() - counts.min() <= 1, (m, c)


@pytest.mark.parametrize("n", [50, 5000])  # a Fisher-Yates table, the Feistel network
def test_an_upsampled_dataset_gets_a_fresh_order_every_pass(n):
    # One dataset and windows of one draw: draw j is item P_pass(j mod n) itself.
    s = MixtureSampler([n], [1], 10 * n, 1, 0, period=1, seed=2)
    passes = s.indices().reshape(10, n)
    for p in passes:
        assert sorted(p.tolist()) == list(range(n))
    assert len({tuple(p.tolist()) for p in passes}) == 10
    s.set_epoch(1)
    assert not np.array_equal(s.indices().reshape(10, n)[0], passes[0])


def test_downsampled_epochs_continue_where_the_last_stopped():
    # dataset 1: 1000 items, 300 draws per epoch: epochs 0-2 take 900 distinct items of one
    # order (E = 1000 // 300 = 3), epochs 3-5 the same from a fresh order.
    sizes, weights = [300, 1000], [1, 1]
    seen = []
    for epoch in range(6):
        idx = epoch_of(sizes, weights, 600, seed=9, epoch=epoch)
        labels = labels_of(idx, [0, 300, 1300])
        mine = idx[labels == 1] - 300
        assert len(mine) == 300 and len(set(mine.tolist())) == 300
        seen.append(set(mine.tolist()))
    for cycle in (0, 3):
        a, b, c = seen[cycle : cycle + 3]
        assert not (a & b) and not (a & c) and not (b & c)
    assert seen[0] != seen[3]
    # a dataset that divides evenly covers everything in n / d epochs
    union: set[int] = set()
    for epoch in range(10):
        idx = epoch_of([100, 1000], [1, 1], 200, seed=1, epoch=epoch)
        part = set((idx[labels_of(idx, [0, 100, 1100]) == 1] - 100).tolist())
        assert not union & part
        union |= part
    assert union == set(range(1000))


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_global_sequence_is_the_same_for_any_number_of_ranks(world, drop_last):
    sizes, weights, n = [13, 400, 77], [0.2, 0.5, 0.3], 1001
    whole = epoch_of(sizes, weights, n, seed=4, epoch=2)
    shards = []
    for r in range(world):
        s = MixtureSampler(sizes, weights, n, world, r, seed=4, drop_last=drop_last)
        s.set_epoch(2)
        shards.append(s.indices())
        assert len(s) == (n // world if drop_last else -(-n // world))
        assert list(s) == shards[-1].tolist()
        assert [s[k] for k in (0, len(s) - 1)] == [shards[-1][0], shards[-1][-1]]
    total = len(shards[0]) * world
    merged = np.empty(total, dtype=np.int64)
    for r in range(world):
        merged[r::world] = shards[r]
    padded = np.concatenate([whole, whole])[:total]  # padding wraps to the start
    assert np.array_equal(merged, padded)


def test_epochs_and_seeds_give_different_orders_and_the_same_arguments_the_same():
    a = epoch_of([100, 200], [1, 2], seed=0, epoch=0)
    assert np.array_equal(a, epoch_of([100, 200], [1, 2], seed=0, epoch=0))
    others = [epoch_of([100, 200], [1, 2], seed=0, epoch=1), epoch_of([100, 200], [1, 2], seed=1)]
    for b in others:
        assert not np.array_equal(a, b)
        assert np.array_equal(np.sort(a), np.sort(b))  # same counts: one pass of each


def test_concat_dataset_end_to_end_through_a_dataloader():
    sizes, weights = [30, 500, 7], [0.5, 0.25, 0.25]
    parts = [TensorDataset(torch.arange(n) + 1000 * c) for c, n in enumerate(sizes)]
    data = ConcatDataset(parts)
    s = MixtureSampler(data, weights, num_samples=2000, num_replicas=2, rank=1, seed=8)
    assert s.sizes == sizes
    loader = DataLoader(data, sampler=s, batch_size=64, num_workers=2)
    got = torch.cat([b[0] for b in loader]).numpy()
    want_idx = s.indices()
    labels = labels_of(want_idx, s.offsets)
    want = 1000 * labels + (want_idx - np.asarray(s.offsets)[labels])
    assert np.array_equal(got, want)
    assert len(got) == 1000
    # the datasets' shares on this rank are those of every other draw of the epoch
    assert np.bincount(got // 1000, minlength=3).sum() == 1000


def test_resume_exactly_on_the_same_world_and_elastically_on_another():
    sizes, weights, n = [40, 900, 300], [1, 2, 1], 2001
    kw = dict(seed=12)
    run = [MixtureSampler(sizes, weights, n, 2, r, **kw) for r in range(2)]
    for s in run:
        s.set_epoch(1)
    full = [s.indices() for s in run]
    iters = [iter(s) for s in run]
    consumed = [[next(it) for _ in range(300)] for it in iters]
    state = json.loads(json.dumps(run[0].state_dict()))
    assert state == run[1].state_dict()
    assert state["sizes"] == sizes and state["weights"] == weights and state["period"] == 1024
    # same world: exactly the rest
    for r in range(2):
        t = MixtureSampler(sizes, weights, n, 2, r, **kw)
        t.load_state_dict(state)
        t.set_epoch(1)  # the usual loop: keeps the resume
        assert list(t) == full[r][300:].tolist()
    # three ranks: the rest of the epoch, re-sharded; with what was consumed, the epoch
    whole = epoch_of(sizes, weights, n, seed=12, epoch=1)
    rest = []
    for r in range(3):
        t = MixtureSampler(sizes, weights, n, 3, r, **kw)
        t.load_state_dict(state)
        rest.append(t.indices())
    merged = np.empty(len(rest[0]) * 3, dtype=np.int64)
    for r in range(3):
        merged[r::3] = rest[r]
    assert np.array_equal(merged[: n - 600], whole[600:])
    done = np.concatenate([np.asarray(c) for c in consumed] + [merged[: n - 600]])
    assert np.array_equal(np.sort(done), np.sort(whole))


def test_batch_sampler_resume_and_pickle():
    s = MixtureSampler([10, 1000], [1, 3], 999, 3, 2, seed=1)
    b = BatchSampler(s, 16)
    batches = list(b)
    assert [i for b in batches for i in b] == s.indices().tolist()
    state = b.state_dict(consumed_batches=5)
    t = BatchSampler(MixtureSampler([10, 1000], [1, 3], 999, 3, 2, seed=1), 16)
    t.load_state_dict(state)
    assert list(t) == batches[5:]
    u = pickle.loads(pickle.dumps(s))
    assert np.array_equal(u.indices(), s.indices())
    assert repr(u) == repr(s)


def test_a_state_of_other_sizes_weights_or_period_is_refused():
    s = MixtureSampler([10, 20], [1, 1], 100, 1, 0)
    state = s.state_dict()
    for other in (
        MixtureSampler([10, 21], [1, 1], 100, 1, 0),
        MixtureSampler([10, 20], [1, 2], 100, 1, 0),
        MixtureSampler([10, 20], [1, 1], 100, 1, 0, period=50),
        MixtureSampler([10, 20], [1, 1], 101, 1, 0),
    ):
        with pytest.raises(ValueError, match="state was saved with"):
            other.load_state_dict(state)
    plain = fastshard.DistributedSampler(30, 1, 0)
    with pytest.raises(ValueError):
        plain.load_state_dict(state)


def test_forgotten_set_epoch_warns_and_auto_epoch_advances():
    s = MixtureSampler([10, 20], [1, 1], 30, 1, 0)
    first = list(s)
    with pytest.warns(fastshard.EpochWarning):
        second = list(s)
    assert first == second
    a = MixtureSampler([10, 20], [1, 1], 30, 1, 0, auto_epoch=True)
    one, two = list(a), list(a)
    assert one == first and two != one and a.epoch == 1


# -- randomness ----------------------------------------------------------------------------
def test_tiny_mixture_every_outcome_equally_likely():
    """Two datasets of two items, 4 draws in one window: 6 interleavings x 2 x 2 item orders,
    24 outcomes, each equally likely over seeds (chi-square at a 1e-4 false-alarm rate)."""
    trials = 4800
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(trials):
        key = tuple(epoch_of([2, 2], [1, 1], 4, 4, seed=seed).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 24
    observed = np.array(list(counts.values()))
    chi2 = float(((observed - trials / 24) ** 2 / (trials / 24)).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-4, 23), chi2


def test_the_window_interleave_is_a_uniform_looking_permutation():
    """1024 datasets of one item each, equal weights, one window of 1024 (a power of two:
    the bare Feistel network, no cycle walking): the draws are the window's permutation
    itself. A network of xor rounds would only ever give even permutations; these rounds
    add, so parities must split evenly. Number of cycles and fixed points follow a uniform
    random permutation's distributions. Thresholds: 1e-4 two-sided false-alarm rates."""
    n, trials = 1024, 400
    odd = 0
    cycles = []
    fixed = []
    for seed in range(trials):
        perm = epoch_of([1] * n, [1] * n, n, seed=seed)
        seen = np.zeros(n, dtype=bool)
        c = 0
        for i in range(n):
            if not seen[i]:
                c += 1
                j = i
                while not seen[j]:
                    seen[j] = True
                    j = perm[j]
        cycles.append(c)
        fixed.append(int((perm == np.arange(n)).sum()))
        odd += (n - c) % 2
    z = stats.norm.ppf(1 - 0.5e-4)
    assert abs(odd - trials / 2) < z * math.sqrt(trials / 4), odd
    h1 = sum(1 / i for i in range(1, n + 1))
    h2 = sum(1 / i**2 for i in range(1, n + 1))
    mean_sd = math.sqrt((h1 - h2) / trials)
    assert abs(np.mean(cycles) - h1) < z * mean_sd, np.mean(cycles)
    assert abs(np.mean(fixed) - 1) < z * math.sqrt(1 / trials), np.mean(fixed)


def test_neighbouring_draws_are_as_independent_as_in_a_random_arrangement():
    """Two datasets, 512 draws each per window of 1024: the number of runs (maximal blocks of
    one dataset) per window against its exact mean and variance for a uniformly random
    arrangement (Wald-Wolfowitz), summed over 300 windows; and each offset's frequency of
    dataset 0 against the binomial (chi-square). 1e-4 false-alarm rates."""
    windows, length = 300, 1024
    idx = epoch_of([10**6, 10**6], [1, 1], windows * length, period=length, seed=2)
    labels = labels_of(idx, [0, 10**6, 2 * 10**6]).reshape(windows, length)
    assert (labels.sum(axis=1) == length // 2).all()
    runs = 1 + (labels[:, 1:] != labels[:, :-1]).sum(axis=1)
    n1 = n2 = length // 2
    nn = n1 + n2
    mean = 2 * n1 * n2 / nn + 1
    var = 2 * n1 * n2 * (2 * n1 * n2 - nn) / (nn**2 * (nn - 1))
    z = (runs.sum() - windows * mean) / math.sqrt(windows * var)
    assert abs(z) < stats.norm.ppf(1 - 0.5e-4), z
    ones = labels.sum(axis=0)  # per offset, over windows
    chi2 = float(((ones - windows / 2) ** 2 / (windows / 4)).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-4, length), chi2


# -- scale ---------------------------------------------------------------------------------
def test_ten_billion_items_over_three_datasets_on_eight_ranks():
    sizes, weights = [6 * 10**9, 3 * 10**9, 10**9], [0.5, 0.3, 0.2]
    ranks = [MixtureSampler(sizes, weights, num_replicas=8, rank=r, seed=1) for r in range(8)]
    one = MixtureSampler(sizes, weights, num_replicas=1, rank=0, seed=1)
    assert len(ranks[0]) == 10**10 // 8
    assert one.per_epoch == [5 * 10**9, 3 * 10**9, 2 * 10**9]
    for r, s in enumerate(ranks):
        for k in (0, 1, 12345, len(s) // 2, len(s) - 1):
            assert s[k] == one[r + 8 * k]
    head = one.indices(0, 1_048_576)
    assert head.min() >= 0 and head.max() < 10**10
    labels = labels_of(head, one.offsets)
    spec = one._spec
    for m in range(1024):
        t = spec.boundary(m + 1)
        counts = np.bincount(labels[:t], minlength=3)
        for c, p in enumerate(shares(weights)):
            assert abs(counts[c] - t * p) < 1 + Fraction(t, 2**63)
    # dataset 2 is downsampled 1:2 per epoch... no: 2e9 draws of 1e9 items, two whole passes
    mine = head[labels == 2] - one.offsets[2]
    assert len(np.unique(mine)) == len(mine)  # no repeats early in a pass


def test_first_index_at_ten_billion_allocates_nothing_that_grows():
    code = """
from fastshard import MixtureSampler
s = MixtureSampler([6 * 10**9, 3 * 10**9, 10**9], [0.5, 0.3, 0.2], num_replicas=8, rank=3)
x = s[0] + s[len(s) - 1]
"""
    assert child_peak_growth_kib(code) < 4096


def test_positions_near_the_largest_epoch_wrap_for_padding():
    n = 2**63 - 1
    s = MixtureSampler([2**62, 2**62 - 1], [1, 1], n, 8, 7, seed=3)
    one = MixtureSampler([2**62, 2**62 - 1], [1, 1], n, 1, 0, seed=3)
    last = s[len(s) - 1]
    pos = 7 + 8 * (len(s) - 1)
    assert pos >= n and last == one[pos - n]
    assert 0 <= s.indices(len(s) - 3).min() and s.indices(len(s) - 3).max() < n


# -- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(sizes=[], weights=[]), ValueError, "sizes must not be empty"),
        (dict(sizes=[1, 2], weights=[1]), ValueError, "weights must have one entry per dataset"),
        (dict(sizes=[1, 2], weights=[1, 2, 3]), ValueError, "weights must have one entry"),
        (dict(sizes=[1, 2], weights=[]), ValueError, "weights must not be empty"),
        (dict(sizes=[1, 2], weights=[1, -1]), ValueError, r"weights\[1\] = -1 is negative"),
        (dict(sizes=[1, 2], weights=[math.nan, 1]), ValueError, r"weights\[0\] = nan is NaN"),
        (dict(sizes=[1, 2], weights=[1, math.inf]), ValueError, r"weights\[1\] = inf is infinite"),
        (dict(sizes=[1, 2], weights=[0, 0]), ValueError, "weights are all zero"),
        (dict(sizes=[1, 0], weights=[1, 1]), ValueError, r"weights\[1\] is positive but dataset 1"),
        (dict(sizes=[1, -1], weights=[1, 0]), ValueError, r"sizes\[1\] must be >= 0"),
        (dict(sizes=[2**62, 2**62], weights=[1, 1]), ValueError, "sizes must add up to less"),
        (dict(sizes=[5, 5], weights=[1, 1], num_samples=0), ValueError, "num_samples must be"),
        (dict(sizes=[5, 5], weights=[1, 1], num_samples=-3), ValueError, "num_samples must be"),
        (dict(sizes=[5, 5], weights=[1, 1], num_samples=2.0), TypeError, "num_samples must be"),
        (dict(sizes=[5, 5], weights=[1, 1], period=0), ValueError, "period must be"),
        (dict(sizes=[5, 5], weights=[1, 1], period=-1), ValueError, "period must be"),
        (dict(sizes=[5, 5], weights=[1, 1], period=1.5), TypeError, "period must be"),
        (dict(sizes=[10**4, 10**4], weights=[1, 1e-3], period=1024), ValueError, "period=1024"),
        (dict(sizes="abc", weights=[1]), TypeError, "sizes must be a list"),
        (dict(sizes=[1.5, 2], weights=[1, 1]), TypeError, r"sizes\[0\] must be"),
        (dict(sizes=[True, 2], weights=[1, 1]), TypeError, r"sizes\[0\] must be"),
        (dict(sizes=[1, 2], weights=["a", "b"]), TypeError, "weights must be numbers"),
        (dict(sizes=[1, 2], weights=[[1, 2]]), ValueError, "weights must be 1-D"),
        (dict(sizes=[1, 2], weights=[1, 1e-300]), ValueError, r"weights\[1\] = 1e-300 is positive"),
        (dict(sizes=[5, 5], weights=[1, 1], seed=1.0), TypeError, "seed must be"),
        (dict(sizes=[5, 5], weights=[1, 1], num_replicas=2, rank=2), ValueError, "Invalid rank"),
    ],
)
def test_bad_input_names_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        MixtureSampler(**{"num_replicas": 1, "rank": 0, **kwargs})


def test_sizes_may_be_datasets_arrays_or_tensors():
    one = dict(num_replicas=1, rank=0)
    assert MixtureSampler([range(3), [0] * 4], [1, 1], **one).sizes == [3, 4]
    assert MixtureSampler(np.array([3, 4]), [1, 1], **one).sizes == [3, 4]
    assert MixtureSampler(torch.tensor([3, 4]), torch.tensor([1.0, 1.0]), **one).sizes == [3, 4]
    s = MixtureSampler([3, 4], np.array([0.5, 0.5], dtype=np.float32), **one)
    assert s.weights == [0.5, 0.5] and len(s.dataset) == 7 and s.offsets == [0, 3, 7]


def test_warnings_are_not_raised_by_a_normal_epoch_loop():
    s = MixtureSampler([10, 20], [1, 1], 30, 1, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for epoch in range(3):
            s.set_epoch(epoch)
            list(s)
