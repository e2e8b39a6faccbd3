"""Statistical quality of the weighted draws beyond their marginal frequencies.

With replacement the draws of an epoch are i.i.d. from p = w / sum(w): any two distinct draws
-- neighbours in the sequence, the same step on two ranks, the same position in neighbouring
epochs or seeds -- form a pair distributed as p x p. Each statistic counts disjoint pairs (so
they are independent) in a k x k table and compares it with p x p by Pearson's X2, whose null
law is chi2(k^2 - 1). Without replacement the epoch is successive sampling proportional to
w: the law of its first draws and each item's inclusion probability are computed exactly
here (by enumeration, or by one integral per item) and compared in the same way.

The samples are fixed (fixed seeds and epochs), so a run is deterministic; ALPHA is the
chance that truly random draws would fail one statistic on such a sample. The controls at the
end show that each kind of statistic fails on draws with the defect it looks for.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from scipy import integrate, stats

from fastshard import WeightedDistributedSampler

# The extended tier (`pytest -m extended`, run by .ci/run):
# a statistical battery.
pytestmark = pytest.mark.extended

ALPHA = 1e-5  # per-statistic false-alarm rate, as in test_weighted.py
RAMP = np.arange(1.0, 9.0)  # 8 items, p = i / 36: every cell of the 8 x 8 table expects >= 75
PAIRS = 100_000  # pairs per statistic


def sampler(w, num_samples, world=1, rank=0, seed=7, epoch=0, replacement=True):
    s = WeightedDistributedSampler(w, num_samples, replacement, world, rank, seed=seed)
    s.set_epoch(epoch)
    return s


def pair_pvalue(a: np.ndarray, b: np.ndarray, p: np.ndarray) -> float:
    """P-value of Pearson's X2 for the pairs (a[j], b[j]) against the product law p x p."""
    k = len(p)
    counts = np.bincount(a * k + b, minlength=k * k)
    expected = np.outer(p, p).ravel() * len(a)
    x2 = float(((counts - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(x2, k * k - 1))


def p_of(w: np.ndarray) -> np.ndarray:
    return w / w.sum()


# -- with replacement -------------------------------------------------------------------------
@pytest.mark.parametrize("lag", [1, 2, 3, 64, 4096])
def test_draws_at_a_lag_are_independent(lag):
    # Disjoint pairs (x[j], x[j + lag]): blocks of 2 * lag draws, each pairing its halves.
    blocks = PAIRS // lag + 1
    x = sampler(RAMP, 2 * lag * blocks).indices().reshape(blocks, 2, lag)
    a, b = x[:, 0, :].ravel()[:PAIRS], x[:, 1, :].ravel()[:PAIRS]
    assert pair_pvalue(a, b, p_of(RAMP)) > ALPHA


@pytest.mark.parametrize("world,ranks", [(4, (0, 3)), (3, (1, 2)), (8, (0, 1))])
def test_the_same_step_on_two_ranks_is_independent(world, ranks):
    a, b = (sampler(RAMP, world * PAIRS, world, r).indices() for r in ranks)
    assert pair_pvalue(a, b, p_of(RAMP)) > ALPHA


# Neighbouring epochs and seeds, also where a 32- or 64-bit counter wraps.
NEIGHBOURS = [0, 2**32 - 1, 2**63 - 1, 2**64 - 2]


@pytest.mark.parametrize("along", ["epoch", "seed"])
def test_the_same_position_in_neighbouring_epochs_and_seeds_is_independent(along):
    per = PAIRS // len(NEIGHBOURS) + 1
    a, b = [], []
    for k in NEIGHBOURS:
        for part, key in ((a, k), (b, k + 1)):
            kw = {"epoch": key} if along == "epoch" else {"seed": key}
            part.append(sampler(RAMP, per, **kw).indices())
    assert pair_pvalue(np.concatenate(a), np.concatenate(b), p_of(RAMP)) > ALPHA


def test_pairs_of_seeds_and_epochs_differ_everywhere():
    # Not only independent on average: no two neighbouring keys give the same draws.
    heads = {
        tuple(sampler(RAMP, 64, seed=s, epoch=e).indices())
        for s in (0, 1, 2**64 - 1)
        for e in (0, 1, 2**32, 2**64 - 1)
    }
    assert len(heads) == 12


# -- without replacement ----------------------------------------------------------------------
def successive_law(w: np.ndarray, k: int) -> dict[tuple[int, ...], float]:
    """The exact law of the first k draws of successive sampling proportional to w."""
    positive = [i for i in range(len(w)) if w[i] > 0]
    law = {}
    for seq in itertools.permutations(positive, k):
        prob, left = 1.0, float(w.sum())
        for i in seq:
            prob *= w[i] / left
            left -= w[i]
        law[seq] = prob
    return law


SMALL = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 6.0])  # 6 positive weights, one zero
EPOCHS = 40_000


def first_draws_on_ranks(w: np.ndarray, k: int, seed: int) -> Counter[tuple[int, ...]]:
    """(draw 0, ..., draw k-1) of each epoch, read as step 0 of ranks 0..k-1 of k ranks."""
    ranks = [sampler(w, k, k, r, seed=seed, replacement=False) for r in range(k)]
    seen: Counter[tuple[int, ...]] = Counter()
    for e in range(EPOCHS):
        for s in ranks:
            s.set_epoch(e)
        seen[tuple(s[0] for s in ranks)] += 1
    return seen


@pytest.fixture(scope="module")
def small_draws() -> Counter[tuple[int, ...]]:
    return first_draws_on_ranks(SMALL, 3, seed=12)


def ordered_pvalue(seen: Counter[tuple[int, ...]], law: dict[tuple[int, ...], float]) -> float:
    assert set(seen) <= set(law)  # no zero weight, no repeat
    cells = list(law)
    observed = np.array([seen[c] for c in cells], dtype=np.float64)
    expected = np.array([law[c] for c in cells]) * observed.sum()
    assert expected.min() >= 5
    x2 = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(x2, len(cells) - 1))


def test_first_draws_without_replacement_follow_successive_sampling(small_draws):
    # All 120 ordered triples of the 6 positive items, from 3 ranks' first steps: the order of
    # the selection, its independence across ranks and the zero weight in one table.
    assert ordered_pvalue(small_draws, successive_law(SMALL, 3)) > ALPHA


def test_inclusion_probabilities_by_enumeration(small_draws):
    # num_samples = 3 of 6 positive items: each item's inclusion count is Binomial(EPOCHS, pi)
    # with pi from the exact law; two-sided binomial tests, Bonferroni over the items.
    law = successive_law(SMALL, 3)
    pi = np.zeros(len(SMALL))
    for seq, prob in law.items():
        pi[list(seq)] += prob
    assert abs(pi.sum() - 3) < 1e-12
    included = np.zeros(len(SMALL), np.int64)
    for seq, count in small_draws.items():
        included[list(seq)] += count
    assert included[SMALL == 0].sum() == 0
    for i in np.flatnonzero(SMALL > 0):
        p = stats.binomtest(int(included[i]), EPOCHS, pi[i]).pvalue
        assert p > ALPHA / 6, (i, included[i] / EPOCHS, pi[i])


def inclusion_probabilities(w: np.ndarray, k: int) -> np.ndarray:
    """Exact inclusion probabilities of successive sampling of k items proportional to w.

    Successive sampling is the order of the keys E_i / w_i with E_i ~ Exp(1) i.i.d.; item i is
    included when fewer than k other keys lie below its own:
    pi_i = integral over t of w_i exp(-w_i t) P(#{j != i: E_j / w_j < t} < k) dt,
    the count being Poisson-binomial with success probabilities 1 - exp(-w_j t).
    """

    def fewer_than_k(others: np.ndarray, t: float) -> float:
        dist = np.zeros(k)  # P(count = c) for c < k
        dist[0] = 1.0
        for q in -np.expm1(-others * t):
            dist[1:] = dist[1:] * (1 - q) + dist[:-1] * q
            dist[0] *= 1 - q
        return float(dist.sum())

    pi = np.zeros(len(w))
    for i in np.flatnonzero(w > 0):
        others = np.delete(w, i)
        others = others[others > 0]

        def density(t: float, wi: float = w[i], others: np.ndarray = others) -> float:
            return wi * math.exp(-wi * t) * fewer_than_k(others, t)

        pi[i] = integrate.quad(density, 0, math.inf, epsabs=1e-12, epsrel=1e-9, limit=200)[0]
    return pi


MEDIUM = np.concatenate([np.arange(1.0, 31.0), [0.0, 0.0], [40.0, 0.5]])  # 32 positive
MEDIUM_K = 9


@pytest.fixture(scope="module")
def medium_inclusions() -> np.ndarray:
    s = sampler(MEDIUM, MEDIUM_K, 1, 0, seed=31, replacement=False)
    included = np.zeros(len(MEDIUM), np.int64)
    for e in range(EPOCHS):
        s.set_epoch(e)
        sel = s.indices()
        assert len(np.unique(sel)) == MEDIUM_K
        included[sel] += 1
    return included


@pytest.fixture(scope="module")
def medium_pi() -> np.ndarray:
    return inclusion_probabilities(MEDIUM, MEDIUM_K)


def test_inclusion_probabilities_by_integration(medium_inclusions, medium_pi):
    # 9 of 32 positive weights, from 0.5 to 40: inclusion is far from k * p for the heavy
    # items (the heaviest: p = 0.079, k p = 0.71, pi = 0.60), so a selection whose inclusion
    # followed k * p, or keys u / w instead of -log(u) / w (the control below), fails.
    pi = medium_pi
    assert abs(pi.sum() - MEDIUM_K) < 1e-7
    assert medium_inclusions[MEDIUM == 0].sum() == 0
    assert inclusion_pvalue(medium_inclusions, pi) > ALPHA


def test_inclusion_reference_matches_enumeration():
    # The integral against the enumeration where both apply.
    law = successive_law(SMALL, 3)
    pi = np.zeros(len(SMALL))
    for seq, prob in law.items():
        pi[list(seq)] += prob
    assert np.allclose(inclusion_probabilities(SMALL, 3), pi, atol=1e-9)


# -- resume without replacement ---------------------------------------------------------------
RESUME_W = np.where(np.arange(300) % 5 == 0, 0.0, np.arange(300) % 17 + 0.5)  # 240 positive


def global_order(num_samples: int, seed: int, epoch: int) -> list[int]:
    return (
        sampler(RESUME_W, num_samples, seed=seed, epoch=epoch, replacement=False).indices().tolist()
    )


@pytest.mark.parametrize("num_samples", [240, 101])
@pytest.mark.parametrize("W,W2", [(4, 4), (4, 3), (3, 7), (5, 1), (1, 6)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_without_replacement(num_samples, W, W2, drop_last):
    seed, epoch = 19, 4
    order = global_order(num_samples, seed, epoch)
    assert len(set(order)) == num_samples and all(RESUME_W[i] > 0 for i in order)

    def make(world, rank):
        s = WeightedDistributedSampler(
            RESUME_W, num_samples, False, world, rank, seed=seed, drop_last=drop_last
        )
        s.set_epoch(epoch)
        return s

    full = [list(make(W, r)) for r in range(W)]
    length = len(full[0])
    for k in sorted({0, 1, length // 3, max(length - 1, 0), length}):
        old = [make(W, r) for r in range(W)]
        taken = []
        for s in old:
            it = iter(s)
            taken.append([x for _, x in zip(range(k), it)])
        state = old[0].state_dict()
        assert all(s.state_dict() == state for s in old)
        new = [make(W2, r) for r in range(W2)]
        for s in new:
            s.load_state_dict(state)
        rest = [list(s) for s in new]
        if W2 == W:
            assert [t + r for t, r in zip(taken, rest)] == full, k
        # Interleaved, the new ranks continue the epoch's global sequence from the cursor:
        # the uninterrupted rest, then (with padding) the epoch's first draws again.
        cursor = min(k * W, len(full[0]) * W)
        glob = [rest[j % W2][j // W2] for j in range(len(rest[0]) * W2)]
        if not drop_last:
            left = max(num_samples - cursor, 0)
            assert glob[:left] == order[cursor:]
            assert glob[left:] == order[: len(glob) - left]
        else:
            assert glob == order[cursor : cursor + len(glob)]
            assert num_samples - cursor - len(glob) < W2  # only the dropped tail is missing
        # No draw outside the selection, none twice beyond the padding.
        seen = Counter(i for part in taken + rest for i in part)
        assert set(seen) <= set(order)
        if not drop_last:
            assert set(seen) == set(order)


# -- controls: each kind of statistic fails on draws with its defect --------------------------
def _iid(p: np.ndarray, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(len(p), size=count, p=p)


def test_pair_statistic_catches_dependent_pairs():
    # b repeats a in 2% of pairs, else is independent: what a generator whose neighbouring
    # positions, ranks, epochs or seeds shared state now and then would give.
    p = p_of(RAMP)
    a, b = _iid(p, PAIRS, 1), _iid(p, PAIRS, 2)
    assert pair_pvalue(a, b, p) > ALPHA  # the reference passes
    copy = np.random.default_rng(3).random(PAIRS) < 0.02
    assert pair_pvalue(a, np.where(copy, a, b), p) < ALPHA


def test_ordered_statistic_catches_wrong_weights(small_draws):
    wrong = SMALL.copy()
    wrong[0] *= 1.3  # the lightest item, 30% heavier
    assert ordered_pvalue(small_draws, successive_law(wrong, 3)) < ALPHA


def inclusion_pvalue(included: np.ndarray, pi: np.ndarray, trials: int = EPOCHS) -> float:
    """The smallest two-sided binomial p-value over the positive items, times their number
    (Bonferroni): below ALPHA fails."""
    positive = np.flatnonzero(pi > 0)
    pvalues = [stats.binomtest(int(included[i]), trials, pi[i]).pvalue for i in positive]
    return min(pvalues) * len(positive)


def test_inclusion_statistic_passes_numpy_and_catches_a_wrong_key(medium_pi):
    pi, p = medium_pi, p_of(MEDIUM)
    rng = np.random.default_rng(4)
    # NumPy's choice without replacement is successive sampling, by another algorithm (draws
    # from the renormalised rest): a Monte Carlo check of the reference, which it must pass.
    ref = np.zeros(len(MEDIUM), np.int64)
    for _ in range(EPOCHS // 4):  # about 130 us a call
        ref[rng.choice(len(p), size=MEDIUM_K, replace=False, p=p)] += 1
    assert inclusion_pvalue(ref, pi, EPOCHS // 4) > ALPHA
    # Keys u / w instead of -log(u) / w: a plausible slip that still favours heavy items.
    with np.errstate(divide="ignore"):
        keys = rng.random((EPOCHS, len(MEDIUM))) / MEDIUM
    wrong = np.bincount(
        np.argpartition(keys, MEDIUM_K, axis=1)[:, :MEDIUM_K].ravel(), minlength=len(MEDIUM)
    )
    assert inclusion_pvalue(wrong, pi) < ALPHA
