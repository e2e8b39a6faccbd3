"""Statistics of random permutations, shared by tests/test_quality.py and the report (python -m fastshard quality).

Every statistic compares many permutations (one per seed or epoch) with what *uniformly random
and independent* permutations would give, and returns a two-sided p-value computed from the
statistic's own null distribution (chi-square, binomial, Poisson, normal, exact pmfs), never
from a threshold chosen to pass. Two-sided, because a too-good fit is also a defect: rotations
P_s(i) = (i + s) mod n fill a position table perfectly evenly (see chi2_two_sided for when
the lower tail of a chi-square is used).

A source turns (n, seed, epoch) into a permutation; the same battery runs on the "feistel"
order, on torch.randperm and on deliberately weak orders (the controls in test_quality.py,
which show that each statistic can fail).

Needs only numpy (and torch for the torch source); the distribution functions are written here
so the test suite needs no SciPy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import permutations

import numpy as np

# False-alarm rate of one statistic: a correct order fails any one test with this probability.
ALPHA = 1e-4


# -- distributions ----------------------------------------------------------------------------
def _gamma_log_front(a: float, x: float) -> float:
    return -x + a * math.log(x) - math.lgamma(a)


def gamma_p(a: float, x: float) -> float:
    """Regularised lower incomplete gamma P(a, x)."""
    if x <= 0:
        return 0.0
    if x < a + 1:
        # Series: P = x^a e^-x / Gamma(a+1) * sum x^k / ((a+1)...(a+k)).
        term = total = 1.0 / a
        ap = a
        for _ in range(1_000_000):
            ap += 1.0
            term *= x / ap
            total += term
            if term < total * 1e-16:
                break
        return min(1.0, total * math.exp(_gamma_log_front(a, x)))
    return 1.0 - gamma_q(a, x)


def gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) = 1 - P(a, x)."""
    if x <= 0:
        return 1.0
    if x < a + 1:
        return 1.0 - gamma_p(a, x)
    # Continued fraction (modified Lentz).
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 1_000_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return min(1.0, math.exp(_gamma_log_front(a, x)) * h)


def chi2_two_sided(x: float, df: float) -> float:
    """p of a chi-square statistic: too large (misfit), and for df >= 30 also too small (too
    regular: rotations fill a table perfectly evenly).

    The lower tail is used only from 30 degrees of freedom on, where X2 sums enough cells to
    be near-continuous; below, X2 is a function of a few integer counts and takes values such
    as exactly 0 with a probability the continuous law puts at 0.
    """
    upper = gamma_q(df / 2.0, x / 2.0)
    if df < 30:
        return upper
    lower = gamma_p(df / 2.0, x / 2.0)
    return min(1.0, 2.0 * min(lower, upper))


def normal_two_sided(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2.0))


def poisson_two_sided(k: int, lam: float) -> float:
    """min(1, 2 min(P(X <= k), P(X >= k))) for X ~ Poisson(lam)."""
    le = gamma_q(k + 1.0, lam)  # P(X <= k)
    ge = 1.0 if k == 0 else gamma_p(float(k), lam)  # P(X >= k)
    return min(1.0, 2.0 * min(le, ge))


def binomial_two_sided(k: int, trials: int, p: float = 0.5) -> float:
    """min(1, 2 min(P(X <= k), P(X >= k))) for X ~ Binomial(trials, p), exact."""
    ks = np.arange(trials, dtype=np.float64)
    # log pmf by its ratios pmf(j+1)/pmf(j), then normalised: no factorials of large numbers.
    steps = np.log((trials - ks) / (ks + 1)) + math.log(p) - math.log1p(-p)
    logpmf = np.concatenate([[0.0], np.cumsum(steps)])
    pmf = np.exp(logpmf - logpmf.max())
    pmf /= pmf.sum()
    return float(min(1.0, 2.0 * min(pmf[: k + 1].sum(), pmf[k:].sum())))


def cycle_count_pmf(n: int) -> np.ndarray:
    """Exact pmf of the number of cycles of a uniform permutation of n items.

    The count is a sum of independent Bernoulli(1/i), i = 1..n (the Feller coupling).
    """
    pmf = np.zeros(n + 1)
    pmf[0] = 1.0
    for i in range(1, n + 1):
        q = 1.0 / i
        pmf[1 : i + 1] = pmf[1 : i + 1] * (1 - q) + pmf[:i] * q
        pmf[0] *= 1 - q
    return pmf


def fixed_point_pmf(n: int) -> np.ndarray:
    """Exact pmf of the number of fixed points (rencontres numbers / n!)."""
    out = np.zeros(n + 1)
    for k in range(n + 1):
        s = sum((-1) ** j / math.factorial(j) for j in range(min(n - k, 60) + 1))
        out[k] = s / math.factorial(k) if k < 170 else 0.0
    return out


def hypergeom_mean_var(total: int, good: int, draws: int) -> tuple[float, float]:
    mean = draws * good / total
    var = draws * (good / total) * (1 - good / total) * (total - draws) / (total - 1)
    return mean, var


def gof_chi2(observed: np.ndarray, pmf: np.ndarray) -> tuple[float, int]:
    """Pearson goodness of fit of counts to a pmf, bins pooled from the tails until each
    expects at least 5. Returns (statistic, degrees of freedom)."""
    total = observed.sum()
    expected = pmf / pmf.sum() * total
    obs_bins: list[float] = []
    exp_bins: list[float] = []
    acc_o = acc_e = 0.0
    for o, e in zip(observed, expected):
        acc_o += o
        acc_e += e
        if acc_e >= 5:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
            acc_o = acc_e = 0.0
    if obs_bins:  # the remaining tail joins the last bin
        obs_bins[-1] += acc_o
        exp_bins[-1] += acc_e
    o_arr, e_arr = np.array(obs_bins), np.array(exp_bins)
    return float(((o_arr - e_arr) ** 2 / e_arr).sum()), len(o_arr) - 1


# -- sources ------------------------------------------------------------------------------------
class Source:
    """Maps (n, seed, epoch) to a permutation of [0, n) as an int64 array."""

    name = "source"
    huge = False  # can evaluate positions of n >= 2**32 without building the permutation

    def perm(self, n: int, seed: int, epoch: int = 0) -> np.ndarray:
        raise NotImplementedError

    def subset(self, n: int, world: int, rank: int, seed: int, epoch: int) -> np.ndarray:
        """Rank `rank` of `world` ranks: positions rank, rank + world, ... (n % world == 0)."""
        return self.perm(n, seed, epoch)[rank::world]

    def values(self, n: int, seed: int, epoch: int, start: int, stop: int) -> np.ndarray:
        """P(start), ..., P(stop - 1)."""
        return self.perm(n, seed, epoch)[start:stop]


class Feistel(Source):
    """The public default order, through the public API."""

    name = "feistel"
    huge = True

    def _sampler(self, n: int, world: int, rank: int, seed: int, epoch: int):
        import fastshard

        s = fastshard.DistributedSampler(n, world, rank, seed=seed)
        s.set_epoch(epoch)
        return s

    def perm(self, n: int, seed: int, epoch: int = 0) -> np.ndarray:
        return self._sampler(n, 1, 0, seed, epoch).indices()

    def subset(self, n: int, world: int, rank: int, seed: int, epoch: int) -> np.ndarray:
        return self._sampler(n, world, rank, seed, epoch).indices()

    def values(self, n: int, seed: int, epoch: int, start: int, stop: int) -> np.ndarray:
        return self._sampler(n, 1, 0, seed, epoch).indices(start, stop)


class Network(Source):
    """The bare Feistel network with cycle walking, without the small-n table."""

    def __init__(self, rounds: int | None = None) -> None:
        self.rounds = rounds
        self.name = "network" if rounds is None else f"network/{rounds}r"

    def perm(self, n: int, seed: int, epoch: int = 0) -> np.ndarray:
        from fastshard import _core

        if self.rounds is None:
            return _core.feistel_network(n, seed, epoch, 0)
        return _core.feistel_network(n, seed, epoch, 0, rounds=self.rounds)


class TorchRandperm(Source):
    """torch.randperm seeded as torch's DistributedSampler seeds it (seed + epoch)."""

    name = "torch.randperm"

    def perm(self, n: int, seed: int, epoch: int = 0) -> np.ndarray:
        import torch

        g = torch.Generator()
        g.manual_seed(seed + epoch)
        return torch.randperm(n, generator=g).numpy()


class FromFunction(Source):
    """A source from a plain function (n, seed, epoch) -> permutation, for the controls."""

    def __init__(self, name: str, fn: Callable[[int, int, int], np.ndarray]) -> None:
        self.name = name
        self.fn = fn

    def perm(self, n: int, seed: int, epoch: int = 0) -> np.ndarray:
        return np.asarray(self.fn(n, seed, epoch), dtype=np.int64)


def batches(
    source: Source,
    n: int,
    seeds: Sequence[int],
    epochs: Sequence[int] | None = None,
    chunk_items: int = 4_000_000,
) -> Iterator[np.ndarray]:
    """Permutations for each seed (or each epoch of seed 0) as (rows, n) arrays of bounded size."""
    keys = [(s, 0) for s in seeds] if epochs is None else [(0, e) for e in epochs]
    rows = max(1, chunk_items // max(n, 1))
    for i in range(0, len(keys), rows):
        yield np.stack([source.perm(n, s, e) for s, e in keys[i : i + rows]])


# -- results ------------------------------------------------------------------------------------
@dataclass
class Result:
    statistic: str  # the value and its null distribution, e.g. "X2=1021.3 ~ chi2(1023)"
    p: float
    samples: int  # permutations (or pairs) the statistic used

    @property
    def ok(self) -> bool:
        return self.p >= ALPHA


def _chi2_result(x2: float, df: int, samples: int) -> Result:
    return Result(f"X2={x2:.1f} ~ chi2({df})", chi2_two_sided(x2, df), samples)


# -- statistics on whole permutations ------------------------------------------------------------
def class_table(
    source: Source, n: int, seeds: Sequence[int], row_of: np.ndarray, col_of: np.ndarray
) -> Result:
    """Inputs grouped by class row_of[i], outputs by class col_of[P(i)], counted over seeds.

    For one uniform permutation the table has fixed margins and is hypergeometric; Pearson's
    X2 then has mean (R-1)(C-1) n/(n-1), and X2 (n-1)/n is asymptotically chi2((R-1)(C-1)).
    Sums over independent seeds keep that law. With row_of = col_of = identity this is the
    full position table (does every i go to every j equally often?).
    """
    R, C = int(row_of.max()) + 1, int(col_of.max()) + 1
    counts = np.zeros(R * C, dtype=np.int64)
    rows_base = row_of.astype(np.int64) * C
    S = 0
    for block in batches(source, n, seeds):
        S += len(block)
        counts += np.bincount((rows_base[None, :] + col_of[block]).ravel(), minlength=R * C)
    expected = S * np.outer(np.bincount(row_of, minlength=R), np.bincount(col_of, minlength=C)) / n
    x2 = float((((counts.reshape(R, C) - expected) ** 2) / expected).sum()) * (n - 1) / n
    return _chi2_result(x2, (R - 1) * (C - 1), S)


def position_table(source: Source, n: int, seeds: Sequence[int], bins: int | None = None) -> Result:
    """Position uniformity: P(i) against i, on the full n x n table or `bins` equal ranges."""
    b = n if bins is None else bins
    cls = (np.arange(n, dtype=np.int64) * b) // n
    return class_table(source, n, seeds, cls, cls)


def residue_table(source: Source, n: int, seeds: Sequence[int], m: int) -> Result:
    """i mod m against P(i) mod m: low bits of the input must not leak into the output."""
    cls = np.arange(n, dtype=np.int64) % m
    return class_table(source, n, seeds, cls, cls)


def bit_tables(source: Source, n: int, seeds: Sequence[int]) -> Result:
    """Bit b of i against bit b of P(i), for every bit b of n - 1; the smallest p, Bonferroni."""
    width = max(1, (n - 1).bit_length())
    results = []
    for b in range(width):
        cls = (np.arange(n, dtype=np.int64) >> b) & 1
        results.append(class_table(source, n, seeds, cls, cls))
    worst = min(results, key=lambda r: r.p)
    return Result(
        f"min over {width} bits: {worst.statistic}", min(1.0, worst.p * width), worst.samples
    )


def all_permutations(source: Source, n: int, seeds: Sequence[int]) -> Result:
    """Tiny n: how often each of the n! permutations occurs; multinomial chi2(n! - 1)."""
    index = {p: i for i, p in enumerate(permutations(range(n)))}
    counts = np.zeros(len(index), dtype=np.int64)
    for block in batches(source, n, seeds):
        for row in block.tolist():
            counts[index[tuple(row)]] += 1
    e = len(seeds) / len(index)
    return _chi2_result(float(((counts - e) ** 2).sum() / e), len(index) - 1, len(seeds))


def _cycle_minima(block: np.ndarray) -> np.ndarray:
    """For each element, the smallest element of its cycle (pointer doubling, O(n log n))."""
    low = np.broadcast_to(np.arange(block.shape[1]), block.shape).copy()
    f = block.copy()
    for _ in range(max(1, int(block.shape[1] - 1).bit_length())):
        low = np.minimum(low, np.take_along_axis(low, f, axis=1))
        f = np.take_along_axis(f, f, axis=1)
    return low


def cycle_stats(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(number of cycles, length of the cycle of item 0) of each row."""
    low = _cycle_minima(block)
    ids = np.arange(block.shape[1])
    return (low == ids).sum(axis=1), (low == 0).sum(axis=1)


# Keyed by the source object itself (not its id, which a later object may reuse).
_CYCLES: dict[tuple[Source, int, tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}


def _cycles(source: Source, n: int, seeds: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """cycle_stats of every seed's permutation, computed once per (source, n, seeds)."""
    key = (source, n, tuple(seeds))
    if key not in _CYCLES:
        parts = [cycle_stats(block) for block in batches(source, n, seeds)]
        if len(_CYCLES) >= 8:  # a few samples are enough for the cases that share them
            del _CYCLES[next(iter(_CYCLES))]
        _CYCLES[key] = (
            np.concatenate([c for c, _ in parts]),
            np.concatenate([z for _, z in parts]),
        )
    return _CYCLES[key]


def cycle_counts(source: Source, n: int, seeds: Sequence[int]) -> Result:
    """Number of cycles against its exact law (mean H_n ~ ln n + 0.58)."""
    observed = np.bincount(_cycles(source, n, seeds)[0], minlength=n + 1)
    x2, df = gof_chi2(observed, cycle_count_pmf(n))
    mean = float((observed * np.arange(n + 1)).sum() / observed.sum())
    harmonic = sum(1.0 / i for i in range(1, n + 1))
    res = _chi2_result(x2, df, len(seeds))
    res.statistic = f"mean {mean:.3f} (H_n={harmonic:.3f}); {res.statistic}"
    return res


def cycle_of_zero(source: Source, n: int, seeds: Sequence[int], bins: int = 32) -> Result:
    """Length of the cycle through item 0: exactly uniform on 1..n; chi2 over `bins` ranges."""
    b = min(bins, n)
    observed = np.bincount((_cycles(source, n, seeds)[1] - 1) * b // n, minlength=b)
    sizes = np.bincount((np.arange(n) * b) // n, minlength=b)
    e = len(seeds) * sizes / n
    return _chi2_result(float(((observed - e) ** 2 / e).sum()), b - 1, len(seeds))


def fixed_points(source: Source, n: int, seeds: Sequence[int]) -> Result:
    """Fixed points per permutation against the exact rencontres law (~Poisson(1))."""
    observed = np.zeros(n + 1, dtype=np.int64)
    ids = np.arange(n)
    for block in batches(source, n, seeds):
        observed += np.bincount((block == ids).sum(axis=1), minlength=n + 1)
    x2, df = gof_chi2(observed, fixed_point_pmf(n))
    return _chi2_result(x2, df, len(seeds))


def parity(source: Source, n: int, seeds: Sequence[int]) -> Result:
    """Odd permutations are half of all: Binomial(S, 1/2)."""
    odd = int(((n - _cycles(source, n, seeds)[0]) % 2).sum())
    S = len(seeds)
    return Result(f"odd {odd}/{S}", binomial_two_sided(odd, S), S)


def differences(source: Source, n: int, seeds: Sequence[int], bins: int | None = None) -> Result:
    """(P(i+1) - P(i)) mod n over all i: each is uniform on 1..n-1.

    Summed over i the terms are weakly dependent (distinct values): for odd n the exact mean of
    X2 (full table) is n - 1 against chi2(n - 2)'s n - 2, a shift of 1 against a spread of
    sqrt(2 df) (under 0.03 standard deviations at n >= 1000); the variance differs likewise.
    """
    b = n - 1 if bins is None else bins
    observed = np.zeros(b, dtype=np.int64)
    for block in batches(source, n, seeds):
        d = (block[:, 1:] - block[:, :-1]) % n - 1  # 0..n-2
        observed += np.bincount((d * b // (n - 1)).ravel(), minlength=b)
    sizes = np.bincount((np.arange(n - 1) * b) // (n - 1), minlength=b)
    e = len(seeds) * sizes  # each of the n-1 differences per permutation hits a value w.p. 1/(n-1)
    return _chi2_result(float(((observed - e) ** 2 / e).sum()), b - 1, len(seeds))


def displacement(source: Source, n: int, seeds: Sequence[int], bins: int | None = None) -> Result:
    """(P(i) - i) mod n over all i: each is uniform on 0..n-1. Weakly dependent terms as in
    `differences`: P(i) - i = P(j) - j has probability 1/(n-1) for i != j, so the exact mean
    of X2 (full table) is n against chi2(n - 1)'s n - 1."""
    b = n if bins is None else bins
    observed = np.zeros(b, dtype=np.int64)
    ids = np.arange(n)
    for block in batches(source, n, seeds):
        d = (block - ids) % n
        observed += np.bincount((d * b // n).ravel(), minlength=b)
    sizes = np.bincount((np.arange(n) * b) // n, minlength=b)
    e = len(seeds) * sizes
    return _chi2_result(float(((observed - e) ** 2 / e).sum()), b - 1, len(seeds))


# -- statistics across neighbouring seeds and epochs ---------------------------------------------
def _neighbour_pairs(
    source: Source, n: int, count: int, along: str
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(P_k, P_{k+1}) for k = 0..count-1, k the seed (epoch 0) or the epoch (seed 0).

    Given P_{k+1}, the statistic of pair k does not depend on it when P_k is uniform, so the
    pair statistics of a chain are independent.
    """
    keys = range(count + 1)
    seeds, epochs = (keys, None) if along == "seed" else ([0], keys)
    prev = None
    for block in batches(source, n, seeds if epochs is None else [], epochs):
        if prev is not None:
            block = np.concatenate([prev[-1:], block])
        yield from zip(block[:-1], block[1:])
        prev = block


def agreement(source: Source, n: int, count: int, along: str) -> Result:
    """#{i: P_k(i) = P_{k+1}(i)} summed over `count` pairs: each term has mean 1 and variance 1
    (exactly, n >= 2) and is rencontres ~ Poisson(1), so the sum is ~ Poisson(count)."""
    total = sum(int((a == b).sum()) for a, b in _neighbour_pairs(source, n, count, along))
    return Result(f"sum {total} ~ Poisson({count})", poisson_two_sided(total, count), count)


def spearman(source: Source, n: int, count: int, along: str) -> Result:
    """Rank correlation of P_k and P_{k+1}: mean 0, variance 1/(n-1) each; the sum of
    rho sqrt(n-1) over pairs is ~ N(0, count)."""
    var = (n * n - 1) / 12.0
    mid = (n - 1) / 2.0
    rhos = [
        (float(np.dot(a.astype(np.float64), b)) / n - mid * mid) / var
        for a, b in _neighbour_pairs(source, n, count, along)
    ]
    z = float(np.sum(rhos)) * math.sqrt(n - 1) / math.sqrt(count)
    return Result(f"z={z:.2f}, max|rho|={max(map(abs, rhos)):.4f}", normal_two_sided(z), count)


def rank_overlap(source: Source, n: int, world: int, count: int, rank: int = 0) -> Result:
    """|rank's items in epoch e  ∩  in epoch e+1| summed over `count` epoch pairs.

    Each term is Hypergeometric(n, n/W, n/W) (mean n/W^2) and the terms are independent, so
    the sum is normal with the summed mean and variance.
    """
    if n % world:
        raise ValueError("n must be a multiple of world (no padding)")
    m = n // world
    prev = None
    total = 0
    for e in range(count + 1):
        mask = np.zeros(n, dtype=bool)
        mask[source.subset(n, world, rank, 0, e)] = True
        if prev is not None:
            total += int((mask & prev).sum())
        prev = mask
    mean, var = hypergeom_mean_var(n, m, m)
    z = (total - count * mean) / math.sqrt(count * var)
    return Result(
        f"mean {total / count:.2f} (n/W^2={mean:.2f}), z={z:.2f}", normal_two_sided(z), count
    )


# -- statistics on positions of huge n (no permutation is built) --------------------------------
def huge_values(source: Source, n: int, seeds: Sequence[int], positions: int) -> np.ndarray:
    """P_s(0..positions-1) for each seed, as uint64 (S, positions)."""
    return np.stack([source.values(n, s, 0, 0, positions) for s in seeds]).astype(np.uint64)


def _uniform_bins(cls: np.ndarray, b: int, probs: np.ndarray) -> Result:
    observed = np.bincount(cls.ravel(), minlength=b)
    e = cls.size * probs
    return _chi2_result(float(((observed - e) ** 2 / e).sum()), b - 1, cls.shape[0])


def _top_bins(v: np.ndarray, n: int, b: int) -> np.ndarray:
    # Float ranges: the bins differ from exact n/b ranges by under 2**-40 of a bin.
    return np.minimum((v.astype(np.float64) / n * b).astype(np.int64), b - 1)


def huge_top(v: np.ndarray, n: int, bins: int = 64) -> Result:
    """P(i) over `bins` equal ranges of [0, n). Positions of one seed are drawn without
    replacement from n >= 2**32 values; the multinomial law is exact to O(positions/n)."""
    return _uniform_bins(_top_bins(v, n, bins), bins, np.full(bins, 1.0 / bins))


def huge_low(v: np.ndarray, n: int, bits: int = 8) -> Result:
    """P(i) mod 2**bits: uniform to O(2**bits / n)."""
    b = 1 << bits
    return _uniform_bins((v % np.uint64(b)).astype(np.int64), b, np.full(b, 1.0 / b))


def huge_differences(v: np.ndarray, n: int, bins: int = 64) -> Result:
    """(P(i+1) - P(i)) mod n over `bins` ranges: uniform on 1..n-1."""
    nn = np.uint64(n)
    d = np.where(v[:, 1:] >= v[:, :-1], v[:, 1:] - v[:, :-1], nn - (v[:, :-1] - v[:, 1:]))
    return _uniform_bins(_top_bins(d, n, bins), bins, np.full(bins, 1.0 / bins))


def _ones_below(n: int, b: int) -> int:
    """How many x in [0, n) have bit b set."""
    period = 1 << (b + 1)
    return (n // period) * (1 << b) + max(0, n % period - (1 << b))


def huge_bits(v: np.ndarray, n: int) -> Result:
    """Bit b of P(i) equal to bit b of i, for every bit b of n - 1: a sum of Bernoulli terms
    whose probabilities are exact (the share of [0, n) with bit b set), so normal with known
    mean and variance; the smallest p over bits, Bonferroni."""
    width = (n - 1).bit_length()
    ids = np.arange(v.shape[1], dtype=np.uint64)
    worst_p, worst = 1.0, ""
    for b in range(width):
        q = _ones_below(n, b) / n  # P(bit b of a uniform value is 1)
        bit_i = ((ids >> np.uint64(b)) & np.uint64(1)).astype(bool)
        bit_p = ((v >> np.uint64(b)) & np.uint64(1)).astype(bool)
        agree = int((bit_p == bit_i[None, :]).sum())
        p_agree = np.where(bit_i, q, 1 - q)  # per position
        mean = float(p_agree.sum()) * v.shape[0]
        var = float((p_agree * (1 - p_agree)).sum()) * v.shape[0]
        p = normal_two_sided((agree - mean) / math.sqrt(var))
        if p < worst_p:
            worst_p, worst = p, f"bit {b}: {agree}/{v.size} (expected {mean:.0f})"
    return Result(f"worst {worst}", min(1.0, worst_p * width), v.shape[0])


def huge_neighbour_seeds(v: np.ndarray, n: int, bins: int = 8) -> Result:
    """(P_s(i), P_s+1(i)) for s = 0, 2, 4, ... (disjoint pairs of seeds, so independent) over
    bins x bins ranges: independent uniforms, chi2(bins^2 - 1)."""
    a = _top_bins(v[0::2][: len(v) // 2], n, bins)
    b = _top_bins(v[1::2][: len(v) // 2], n, bins)
    return _uniform_bins(a * bins + b, bins * bins, np.full(bins * bins, 1.0 / bins**2))


# -- the battery --------------------------------------------------------------------------------
@dataclass
class Case:
    group: str
    name: str
    n: int
    run: Callable[[Source], Result]
    huge: bool = False  # only for sources that can evaluate positions of huge n

    @property
    def id(self) -> str:
        return f"{self.group}:{self.name}:n={self.n}"


def battery(scale: float = 1.0) -> list[Case]:
    """The statistics at a sample size proportional to `scale` (1.0: the test suite's)."""

    def S(k: int) -> range:
        return range(max(2, int(k * scale)))

    def count(k: int) -> int:
        return max(2, int(k * scale))

    cases: list[Case] = []
    add = cases.append
    # Position uniformity: table (n <= 1024) and network (1025 on) sides of the threshold.
    add(Case("position", "full table", 32, lambda src: position_table(src, 32, S(640))))
    for n in (1000, 1024, 1025, 1500, 2048, 4097):
        add(
            Case(
                "position", "32x32 ranges", n, lambda src, n=n: position_table(src, n, S(2000), 32)
            )
        )
    for n, per_cell in ((1025, 4), (1500, 4), (4097, 1)):
        add(
            Case(
                "position",
                "full table",
                n,
                lambda src, n=n, c=per_cell: position_table(src, n, S(c * n)),
            )
        )
    # Tiny n: every permutation counted.
    for n in (3, 4, 5):
        k = math.factorial(n)
        add(
            Case(
                "tiny",
                "all n! permutations",
                n,
                lambda src, n=n, k=k: all_permutations(src, n, S(100 * k)),
            )
        )
    # Cycle structure and parity.
    for n in (32, 1000, 1025, 4097):
        add(Case("cycles", "number of cycles", n, lambda src, n=n: cycle_counts(src, n, S(4000))))
        add(Case("cycles", "fixed points", n, lambda src, n=n: fixed_points(src, n, S(4000))))
        add(
            Case(
                "cycles",
                "cycle length of item 0",
                n,
                lambda src, n=n: cycle_of_zero(src, n, S(4000)),
            )
        )
    for n in (1024, 1025, 2048, 4096):
        add(Case("parity", "odd permutations", n, lambda src, n=n: parity(src, n, S(4000))))
    # Neighbouring outputs and low bits.
    for n in (1000, 1025, 4097):
        add(Case("local", "P(i+1)-P(i) mod n", n, lambda src, n=n: differences(src, n, S(400))))
        add(Case("local", "P(i)-i mod n", n, lambda src, n=n: displacement(src, n, S(400))))
    for n in (1000, 1025, 4096, 4097):
        for m in (2, 3, 4, 16):
            add(
                Case(
                    "bits",
                    f"i mod {m} vs P(i) mod {m}",
                    n,
                    lambda src, n=n, m=m: residue_table(src, n, S(400), m),
                )
            )
        add(
            Case(
                "bits",
                "bit b of i vs bit b of P(i)",
                n,
                lambda src, n=n: bit_tables(src, n, S(400)),
            )
        )
    # Neighbouring seeds and epochs.
    for n in (1000, 1025, 4097, 65536):
        for along in ("seed", "epoch"):
            add(
                Case(
                    "neighbours",
                    f"P_k(i)=P_k+1(i), k={along}",
                    n,
                    lambda src, n=n, a=along: agreement(
                        src, n, count(2000 if n < 10**4 else 200), a
                    ),
                )
            )
            add(
                Case(
                    "neighbours",
                    f"Spearman P_k vs P_k+1, k={along}",
                    n,
                    lambda src, n=n, a=along: spearman(
                        src, n, count(2000 if n < 10**4 else 200), a
                    ),
                )
            )
    # One rank's items in consecutive epochs.
    for n, world in ((1000, 8), (4096, 2), (4096, 8), (4096, 64), (65536, 8)):
        add(
            Case(
                "ranks",
                f"overlap epoch e vs e+1, W={world}",
                n,
                lambda src, n=n, w=world: rank_overlap(
                    src, n, w, count(1000 if n < 10**4 else 200)
                ),
            )
        )
    # Huge n: positions only.
    for n in (2**32 + 15, 10**12, 2**63 - 1):

        def vals(src: Source, n: int = n) -> np.ndarray:
            return huge_values(src, n, S(2000), 64)

        add(
            Case(
                "huge", "P(i) over 64 ranges", n, lambda src, n=n, v=vals: huge_top(v(src), n), True
            )
        )
        add(Case("huge", "P(i) mod 256", n, lambda src, n=n, v=vals: huge_low(v(src), n), True))
        add(
            Case(
                "huge",
                "P(i+1)-P(i) over 64 ranges",
                n,
                lambda src, n=n, v=vals: huge_differences(v(src), n),
                True,
            )
        )
        add(
            Case(
                "huge",
                "bit b of i vs bit b of P(i)",
                n,
                lambda src, n=n, v=vals: huge_bits(v(src), n),
                True,
            )
        )
        add(
            Case(
                "huge",
                "P_s(i) vs P_s+1(i), 8x8 ranges",
                n,
                lambda src, n=n, v=vals: huge_neighbour_seeds(v(src), n),
                True,
            )
        )
    return cases
