"""Statistical quality of the default "feistel" order: the fast battery.

Each statistic compares permutations over many seeds (or epochs) with uniformly random,
independent permutations and fails when its p-value, from the statistic's own null law, is
below ALPHA = 1e-4 (two-sided where a too-regular result is also a defect). The samples are
fixed (seeds 0, 1, ...), so a run is deterministic; ALPHA is the chance that a truly random
order would have failed a given statistic on such a sample. `bench/quality.py` runs the same
battery at larger sizes, next to torch.randperm.

The controls below run the same statistics, at the same sizes, on deliberately weak orders
and require them to fail: every statistic here can fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastshard import _quality as q

# The extended tier (`pytest -m extended`, run by .ci/run):
# a statistical battery.
pytestmark = pytest.mark.extended

FEISTEL = q.Feistel()
CASES = q.battery(1.0)


@pytest.mark.parametrize("case", CASES, ids=[c.id.replace(" ", "_") for c in CASES])
def test_feistel_order(case):
    res = case.run(FEISTEL)
    assert res.ok, f"{case.id}: p = {res.p:.3g} < {q.ALPHA} ({res.statistic})"


@pytest.mark.parametrize("n", [8, 64, 256, 1024])
def test_bare_network_parity_is_balanced(n):
    # An xor-Feistel over [0, 2**k) makes only even permutations; the additive one must not.
    # Above the table size the bare network is the public order: the battery covers 2048, 4096.
    res = q.parity(q.Network(), n, range(4000))
    assert res.ok, f"p = {res.p:.3g} ({res.statistic})"


def test_more_rounds_are_a_prefix_extension():
    # The study networks the report uses: 8 rounds is the public network (n > table size).
    from fastshard import _core

    for n in (1025, 4096, 70_001):
        assert np.array_equal(q.Network(8).perm(n, 5, 1), FEISTEL.perm(n, 5, 1))
        assert np.array_equal(_core.feistel_network(n, 5, 1, 0), FEISTEL.perm(n, 5, 1))
    for rounds in (1, 2, 3, 5, 7):  # odd rounds end with the halves swapped: still bijections
        for n in (2048, 3000):
            assert np.array_equal(np.sort(q.Network(rounds).perm(n, 9, 0)), np.arange(n))
    with pytest.raises(ValueError, match="rounds"):
        _core.feistel_network(100, 0, 0, 0, rounds=0)


def test_distributions_match_known_values():
    # The hand-written distribution functions against values computed independently.
    assert q.gamma_q(1.0, 2.0) == pytest.approx(math.exp(-2.0), rel=1e-12)  # chi2(2) sf at 4
    assert q.chi2_two_sided(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert q.chi2_two_sided(1e6, 1e6) == pytest.approx(1.0, abs=0.01)
    assert q.normal_two_sided(1.959963984540054) == pytest.approx(0.05, rel=1e-9)
    # Poisson(2): P(X <= 0) = e^-2, P(X >= 5) = 1 - e^-2 (1 + 2 + 2 + 4/3 + 2/3)
    assert q.poisson_two_sided(0, 2.0) == pytest.approx(2 * math.exp(-2), rel=1e-12)
    assert q.poisson_two_sided(5, 2.0) == pytest.approx(2 * (1 - 7 * math.exp(-2)), rel=1e-9)
    assert q.binomial_two_sided(0, 10) == pytest.approx(2 / 1024, rel=1e-9)
    assert q.cycle_count_pmf(3).tolist() == pytest.approx([0, 2 / 6, 3 / 6, 1 / 6])
    assert q.fixed_point_pmf(3).tolist() == pytest.approx([2 / 6, 3 / 6, 0, 1 / 6])


# -- controls: weak orders that each statistic must catch -----------------------------------------
def _rng(n: int, seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([n, seed, epoch, 12345])


def _sattolo(n: int, seed: int, epoch: int) -> np.ndarray:
    # What Fisher-Yates with the classic off-by-one (j < i instead of j <= i) gives: a uniform
    # n-cycle (drawn here as sigma[k] -> sigma[k+1] for a random order sigma).
    sigma = _rng(n, seed, epoch).permutation(n)
    p = np.empty(n, dtype=np.int64)
    p[sigma] = np.roll(sigma, -1)
    return p


def _xor_feistel(n: int, seed: int, epoch: int) -> np.ndarray:
    # A balanced xor-Feistel over [0, 2**k) with random round tables: always even.
    k = n.bit_length() - 1
    assert n == 1 << k and k % 2 == 0
    h = k // 2
    rng = _rng(n, seed, epoch)
    x = np.arange(n)
    a, b = x >> h, x & ((1 << h) - 1)
    for _ in range(4):
        a, b = b, a ^ rng.integers(0, 1 << h, 1 << h)[b]
    return (a << h) | b


def _parity_preserving(n: int, seed: int, epoch: int) -> np.ndarray:
    rng = _rng(n, seed, epoch)
    p = np.arange(n)
    p[0::2] = rng.permutation(p[0::2])
    p[1::2] = rng.permutation(p[1::2])
    return p


def _affine(n: int, seed: int, epoch: int) -> np.ndarray:
    rng = _rng(n, seed, epoch)
    a = int(rng.integers(1, n))
    while math.gcd(a, n) != 1:
        a += 1
    return (a * np.arange(n) + int(rng.integers(0, n))) % n


def _local(n: int, seed: int, epoch: int) -> np.ndarray:
    # Shuffled within windows of 16: items move little.
    rng = _rng(n, seed, epoch)
    keys = np.arange(n) + rng.uniform(0, 16, n)
    return np.argsort(keys, kind="stable")


def _random(n: int, seed: int, epoch: int) -> np.ndarray:
    return _rng(n, seed, epoch).permutation(n)


def _rotation(n: int, seed: int, epoch: int) -> np.ndarray:
    return (np.arange(n) + seed + epoch) % n


def _pairs_of_seeds(n: int, seed: int, epoch: int) -> np.ndarray:
    # Seeds 2s and 2s+1 (and epochs likewise) give the same order.
    return _random(n, seed // 2, epoch // 2)


def _drifting(n: int, seed: int, epoch: int) -> np.ndarray:
    # Each seed's order is the previous one with 10% of its positions re-shuffled.
    p = _random(n, 0, 0)
    for s in range(1, seed + epoch + 1):
        rng = _rng(n, s, 0)
        idx = rng.choice(n, n // 10, replace=False)
        p[idx] = p[rng.permutation(idx)]
    return p


def _rotating_by_world(world: int):
    def fn(n: int, seed: int, epoch: int) -> np.ndarray:
        # Each epoch shifts the positions by a multiple of `world`: every rank keeps its items.
        return _random(n, seed, 0)[(np.arange(n) + world * epoch) % n]

    return fn


def src(name: str, fn) -> q.Source:
    return q.FromFunction(name, fn)


class _HugeControl(q.Source):
    """Positions of a huge n from a weak closed form."""

    huge = True

    def __init__(self, name: str, fn) -> None:
        self.name = name
        self.fn = fn

    def values(self, n: int, seed: int, epoch: int, start: int, stop: int) -> np.ndarray:
        return np.array([self.fn(n, seed, i) % n for i in range(start, stop)], dtype=np.uint64)


def _huge_case(name: str, n: int):
    (case,) = [c for c in CASES if c.group == "huge" and c.name == name and c.n == n]
    return case


CONTROLS = [
    # (statistic as the battery runs it, weak order)
    (lambda s: q.position_table(s, 1025, range(2000), 32), src("rotation", _rotation)),
    (lambda s: q.position_table(s, 1025, range(4100)), src("rotation", _rotation)),
    (lambda s: q.position_table(s, 1025, range(2000), 32), src("windows of 16", _local)),
    (lambda s: q.all_permutations(s, 3, range(600)), src("Sattolo", _sattolo)),
    (
        lambda s: q.all_permutations(s, 5, range(12000)),
        src("parity-preserving", _parity_preserving),
    ),
    (lambda s: q.cycle_counts(s, 1000, range(4000)), src("Sattolo", _sattolo)),
    (lambda s: q.fixed_points(s, 1000, range(4000)), src("Sattolo", _sattolo)),
    (lambda s: q.cycle_of_zero(s, 1000, range(4000)), src("Sattolo", _sattolo)),
    (lambda s: q.parity(s, 1024, range(4000)), src("xor-Feistel", _xor_feistel)),
    (lambda s: q.differences(s, 1000, range(400)), src("affine", _affine)),
    (lambda s: q.differences(s, 1025, range(400)), src("windows of 16", _local)),
    (lambda s: q.displacement(s, 1025, range(400)), src("windows of 16", _local)),
    (
        lambda s: q.residue_table(s, 1000, range(400), 2),
        src("parity-preserving", _parity_preserving),
    ),
    (lambda s: q.bit_tables(s, 4096, range(400)), src("parity-preserving", _parity_preserving)),
    (lambda s: q.agreement(s, 1025, 2000, "seed"), src("pairs of seeds", _pairs_of_seeds)),
    (lambda s: q.agreement(s, 1025, 2000, "epoch"), src("pairs of seeds", _pairs_of_seeds)),
    (lambda s: q.spearman(s, 1025, 200, "seed"), src("drifting", _drifting)),
    (lambda s: q.spearman(s, 1025, 200, "epoch"), src("drifting", _drifting)),
    (lambda s: q.rank_overlap(s, 4096, 8, 1000), src("rotating by W", _rotating_by_world(8))),
    (
        _huge_case("P(i) over 64 ranges", 10**12).run,
        _HugeControl("lower half", lambda n, s, i: (s * 2**40 + i * 7919) % (n // 2)),
    ),
    (
        _huge_case("P(i) mod 256", 10**12).run,
        _HugeControl("even", lambda n, s, i: 2 * ((s * 2**33 + i * 2**20 + 12345) % (n // 2))),
    ),
    (
        _huge_case("P(i+1)-P(i) over 64 ranges", 10**12).run,
        _HugeControl("affine", lambda n, s, i: (s * 104729 + i * 999_999_937) % n),
    ),
    (
        _huge_case("bit b of i vs bit b of P(i)", 10**12).run,
        _HugeControl("keeps low bits", lambda n, s, i: (((s * 2654435761) % 2**30) << 8 | i) % n),
    ),
    (
        _huge_case("P_s(i) vs P_s+1(i), 8x8 ranges", 10**12).run,
        _HugeControl("seed pairs", lambda n, s, i: ((s // 2) * 2**37 + i * 2**31) % n),
    ),
]


@pytest.mark.parametrize(
    "stat,weak",
    CONTROLS,
    ids=[f"{i}-{w.name.replace(' ', '_')}" for i, (_, w) in enumerate(CONTROLS)],
)
def test_statistic_catches_a_weak_order(stat, weak):
    res = stat(weak)
    assert not res.ok, f"{weak.name} passed: p = {res.p:.3g} ({res.statistic})"


@pytest.mark.slow
def test_random_permutations_pass():
    # The other side of the controls: NumPy's permutations pass the same statistics.
    good = src("numpy", _random)
    for stat, _ in CONTROLS[:19]:
        res = stat(good)
        assert res.ok, f"p = {res.p:.3g} ({res.statistic})"
