"""WeightedDistributedSampler: distribution, sharding, resume, arguments."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

import fastshard
from fastshard import BatchSampler, WeightedDistributedSampler

ALPHA = 1e-5  # per-test false-alarm rate of the statistical tests


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    return float(stats.chisquare(counts[keep], expected).pvalue)


def weights_example(n=40, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.exponential(size=n)
    w[[3, n - 2]] = 0.0
    w[5] = 30.0  # a heavy item
    return w


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int8])
def test_draw_frequencies_match_weights_like_torch_multinomial(dtype):
    w = (weights_example() * 10).astype(dtype)
    p = w.astype(np.float64) / w.astype(np.float64).sum()
    draws = 400_000
    s = WeightedDistributedSampler(w, num_samples=draws, num_replicas=1, rank=0, seed=1)
    ours = np.bincount(s.indices(), minlength=len(w))
    torch.manual_seed(0)
    theirs = np.bincount(
        torch.multinomial(torch.as_tensor(p), draws, replacement=True).numpy(), minlength=len(w)
    )
    assert ours[p == 0].sum() == 0 and theirs[p == 0].sum() == 0
    assert chi2_pvalue(ours, p) > ALPHA
    assert chi2_pvalue(theirs, p) > ALPHA  # the reference passes the same test


def test_chi2_detects_wrong_weights():
    # the test above has power: the same draws judged against other weights fail
    w = weights_example()
    s = WeightedDistributedSampler(w, num_samples=400_000, num_replicas=1, rank=0)
    counts = np.bincount(s.indices(), minlength=len(w))
    wrong = w.copy()
    wrong[5] *= 1.05  # the heavy item, 5% more
    assert chi2_pvalue(counts, wrong / wrong.sum()) < ALPHA


def test_alias_table_probabilities_are_exact_to_2_to_the_32():
    w = weights_example(200, 3)
    t = fastshard._core.AliasTable(w)
    assert t.nbytes == 8 * len(w)
    got = np.array([t.probability(i) for i in range(len(w))])
    want = w / w.sum()
    # each bucket's split is rounded down to a multiple of 2^-32 of its mass 1/n; item i is
    # in its own bucket and at most n aliases
    assert np.all(np.abs(got - want) <= (len(w) + 1) * 2.0**-32 / len(w))
    big = want > 1e-3
    assert np.all(np.abs(got[big] - want[big]) / want[big] < 1e-6)
    assert got[w == 0].sum() == 0


def table_probabilities(table, n):
    """Each item's probability as the table represents it, and a_i, the buckets aliasing to i."""
    threshold, alias = table._buckets()
    alias = alias.astype(np.int64)
    keep = np.where(threshold == 2**32 - 1, 2.0**32, threshold.astype(np.float64)) / 2.0**32
    assert np.all(alias < n)
    mass = keep + np.bincount(alias, weights=1.0 - keep, minlength=n)
    others = alias != np.arange(n)
    return mass / n, np.bincount(alias[others], minlength=n)


def sweep_weights(kind, n, seed=0):
    """Weights that stress the segmented sweep: heavies far from their lights, items exactly
    at the mean, heavies worth many segments, zeros."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.random(n)
    if kind == "pareto":  # a few heavies hold the mass of many segments
        return rng.pareto(0.7, n)
    if kind == "ascending":  # every light before every heavy
        return np.sort(rng.random(n))
    if kind == "descending":
        return np.sort(rng.random(n))[::-1].copy()
    if kind == "half_zero":
        w = rng.random(n)
        w[rng.random(n) < 0.5] = 0.0
        return w
    if kind == "at_the_mean":  # q == 1 exactly for most items
        w = np.ones(n)
        w[rng.integers(0, n, n // 10)] = rng.choice([0.0, 2.0], n // 10)
        return w
    if kind == "one_item":
        w = np.zeros(n)
        w[n // 3] = 5.0
        return w
    if kind == "equal":
        return np.full(n, 3.0)
    raise ValueError(kind)


SWEEP_KINDS = [
    "uniform",
    "pareto",
    "ascending",
    "descending",
    "half_zero",
    "at_the_mean",
    "one_item",
    "equal",
]


@pytest.mark.parametrize("kind", SWEEP_KINDS)
@pytest.mark.parametrize("n, segment", [(100_003, 4096), (70_000, 8192), (50_000, 2**22)])
def test_segmented_sweep_is_exact_to_the_documented_bound(kind, n, segment):
    # n = 100,003 in segments of 4096 is 25 segments swept in parallel from prefix-sum
    # states; 2**22 is one segment, the sequential sweep.
    w = sweep_weights(kind, n)
    t = fastshard._core.AliasTable(w, _segment=segment)
    got, aliased = table_probabilities(t, n)
    want = w / w.sum()
    # The user guide's bound (docs/user-guide.md): each bucket's split is a multiple of 2^-32 of its mass 1/n, so
    # |p_i - w_i / sum| <= (1 + a_i) 2^-32 / n. Double rounding adds about 1e-16 per step of
    # the sweep and at most ~1e-12 of a bucket at a segment boundary; 1e-11 / n covers both.
    bound = (1 + aliased) * 2.0**-32 / n + 1e-11 / n
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
    assert np.all(got[w == 0] == 0)
    assert abs(got.sum() - 1.0) < 1e-9


@pytest.mark.parametrize("kind", ["uniform", "pareto", "ascending", "half_zero"])
def test_segmented_table_does_not_depend_on_threads(kind):
    w = sweep_weights(kind, 200_001, seed=3)
    tables = []
    before = fastshard.get_num_threads()
    try:
        for threads in (1, 2, 3, 7):
            fastshard.set_num_threads(threads)
            tables.append(fastshard._core.AliasTable(w, _segment=4096)._buckets())
    finally:
        fastshard.set_num_threads(before)
    for threshold, alias in tables[1:]:
        assert np.array_equal(threshold, tables[0][0]) and np.array_equal(alias, tables[0][1])


def test_segment_size_must_be_a_multiple_of_the_block():
    w = np.ones(10)
    for bad in (0, 1000, 4097):
        with pytest.raises(ValueError, match="multiple of 4096"):
            fastshard._core.AliasTable(w, _segment=bad)


def test_same_first_draws_for_any_world_size():
    w = weights_example()
    for replacement in (True, False):
        draws = 37 if not replacement else 1001
        ref = WeightedDistributedSampler(w, draws, replacement, 1, 0, seed=9)
        ref.set_epoch(2)
        ref_seq = ref.indices().tolist()
        for W in (2, 3, 8):
            shards = []
            for r in range(W):
                s = WeightedDistributedSampler(w, draws, replacement, W, r, seed=9)
                s.set_epoch(2)
                shards.append(s.indices().tolist())
                assert len(s) == -(-draws // W)
            glob = [shards[j % W][j // W] for j in range(draws)]
            assert glob == ref_seq


def test_without_replacement_no_repeats_and_first_draw_frequencies():
    w = weights_example(12, 5)
    positive = int((w > 0).sum())
    s = WeightedDistributedSampler(w, replacement=False, num_replicas=1, rank=0)
    assert len(s) == positive
    firsts = np.zeros(len(w), np.int64)
    for epoch in range(20_000):
        s.set_epoch(epoch)
        if epoch < 50:
            order = s.indices()
            assert len(set(order.tolist())) == positive and np.all(w[order] > 0)
        firsts[s[0]] += 1
    assert chi2_pvalue(firsts, w / w.sum()) > ALPHA


def test_without_replacement_partial_selection_and_limits():
    w = np.arange(1.0, 1001.0)
    s = WeightedDistributedSampler(w, num_samples=10, replacement=False, num_replicas=2, rank=1)
    assert len(s) == 5 and len(set(s.indices().tolist())) == 5
    with pytest.raises(ValueError, match="num_samples"):
        WeightedDistributedSampler(
            [1.0, 0.0, 2.0], num_samples=3, replacement=False, num_replicas=1, rank=0
        )


def test_exact_and_elastic_resume():
    w = weights_example()
    full = [list(WeightedDistributedSampler(w, 500, True, 4, r, seed=2)) for r in range(4)]
    old = [WeightedDistributedSampler(w, 500, True, 4, r, seed=2) for r in range(4)]
    its = [iter(s) for s in old]
    taken = [[next(it) for _ in range(30)] for it in its]
    state = json.loads(json.dumps(old[2].state_dict()))
    assert state["weights_checksum"] == old[0].weights_checksum and state["cursor"] == 120
    same = [WeightedDistributedSampler(w, 500, True, 4, r, seed=2) for r in range(4)]
    for s in same:
        s.load_state_dict(state)
    assert [t + list(s) for t, s in zip(taken, same)] == full
    # on 3 ranks: the draws from the cursor on, re-sharded; the global sequence is unchanged
    glob = [full[j % 4][j // 4] for j in range(500)]
    new = [WeightedDistributedSampler(w, 500, True, 3, r, seed=2) for r in range(3)]
    for s in new:
        s.load_state_dict(state)
    rest = [list(s) for s in new]
    assert [rest[j % 3][j // 3] for j in range(380)] == glob[120:]
    # another set of weights is refused
    other = w.copy()
    other[7] += 1e-9
    with pytest.raises(ValueError, match="weights_checksum"):
        WeightedDistributedSampler(other, 500, True, 4, 0, seed=2).load_state_dict(state)


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("form", ["numpy", "tensor"])
def test_later_edits_to_the_callers_weights_change_nothing(form, replacement):
    # A float64 array (and a CPU tensor's .numpy()) converts without a copy: the sampler must
    # not keep that view, or the edits below would change its draws, slip past validation and
    # leave the checksum (which the rank guard and load_state_dict compare) stale.
    w = weights_example(200, 7)
    caller = w.copy() if form == "numpy" else torch.tensor(w)
    assert caller.dtype in (np.float64, torch.float64)
    kw = dict(num_samples=150, replacement=replacement, num_replicas=2, rank=1, seed=3)
    s = WeightedDistributedSampler(caller, **kw)
    ref = WeightedDistributedSampler(w.copy(), **kw)
    caller[:100] = 0.0  # fewer positive weights than draws without replacement
    caller[5] = -1.0  # invalid now
    caller[150] = 1e9  # a new heavy item
    with pytest.raises(ValueError, match="negative"):
        WeightedDistributedSampler(caller, **kw)
    assert s.weights_checksum == ref.weights_checksum
    for epoch in (0, 1, 7):
        s.set_epoch(epoch)
        ref.set_epoch(epoch)
        assert s.indices().tolist() == ref.indices().tolist() == list(s)
    state = s.state_dict(consumed=20)
    other = WeightedDistributedSampler(w, **kw)
    other.load_state_dict(state)  # the checksum still describes the draws
    assert other.indices().tolist() == ref.indices(20).tolist()


def test_batch_sampler_and_inputs_of_every_kind():
    w = [0.5, 0.0, 2.5, 1.0]
    ref = WeightedDistributedSampler(w, 50, num_replicas=2, rank=0).indices().tolist()
    for form in (np.array(w), np.array(w, np.float32), torch.tensor(w), tuple(w)):
        assert (
            WeightedDistributedSampler(form, 50, num_replicas=2, rank=0).indices().tolist() == ref
        )
    b = BatchSampler(WeightedDistributedSampler(w, 50, num_replicas=2, rank=0), 4)
    assert [i for batch in b for i in batch] == ref and len(b) == 7


def test_beyond_torch_weighted_random_sampler_limit():
    n = 2**24 + 1
    w = np.ones(n)
    w[-1] = 1e6
    s = WeightedDistributedSampler(w, num_samples=100_000, num_replicas=8, rank=0)
    got = s.indices()
    assert got.max() < n and (got == n - 1).mean() > 0.03  # p(last) = 1e6 / (2^24 + 1e6) = 0.056
    assert s._table.nbytes == 8 * n


@pytest.mark.slow
def test_hundred_million_items():
    n = 10**8
    w = np.ones(n)
    s = WeightedDistributedSampler(w, num_replicas=8, rank=3)
    head = s.indices(0, 1_000_000)
    assert head.min() >= 0 and head.max() < n
    assert len(s) == n // 8


@pytest.mark.parametrize(
    "weights,kwargs,exc,match",
    [
        ([1.0, -1.0], {}, ValueError, r"weights\[1\].*negative"),
        ([1.0, float("nan")], {}, ValueError, r"weights\[1\].*NaN"),
        ([1.0, 2.0, float("inf")], {}, ValueError, r"weights\[2\].*infinite"),
        ([0.0, 0.0], {}, ValueError, "all zero"),
        ([], {}, ValueError, "empty"),
        ([[1.0, 2.0]], {}, ValueError, "1-D"),
        (["a", "b"], {}, TypeError, "numbers"),
        ("abc", {}, TypeError, "string"),
        (None, {}, TypeError, "numbers"),
        ([1e308, 1e308], {}, ValueError, "overflow"),
        ([1.0, 2.0], {"num_samples": 0}, ValueError, "num_samples"),
        ([1.0, 2.0], {"num_samples": -3}, ValueError, "num_samples"),
        ([1.0, 2.0], {"num_samples": 2.0}, TypeError, "num_samples"),
        ([1.0, 0.0, 2.0], {"num_samples": 3, "replacement": False}, ValueError, "positive"),
        ([1.0, 2.0], {"replacement": "no"}, TypeError, "replacement"),
    ],
)
def test_bad_input(weights, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        WeightedDistributedSampler(weights, num_replicas=1, rank=0, **kwargs)
