"""Weighted draws exact at every weight scale, the same for any number of threads, and C++
errors in fill threads reported as Python exceptions (issue 19, items 1, 3 and 5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import fastshard
from fastshard import _core

from .conftest import run_python

# False-alarm rate of each statistical test below (fixed seeds: a failure reproduces).
ALPHA = 1e-6


def draws(weights, num_samples, replacement=True, seed=0, epoch=0):
    s = fastshard.WeightedDistributedSampler(
        weights, num_samples=num_samples, replacement=replacement, num_replicas=1, rank=0, seed=seed
    )
    s.set_epoch(epoch)
    return s.indices()


# --- item 1: tiny weights ------------------------------------------------------------------


def test_one_tiny_weight_among_zeros_gets_every_draw():
    # The mean weight, 1e-309, made n / sum overflow: 0 * inf = NaN buckets, a uniform table.
    w = np.zeros(10**6)
    w[123_457] = 1e-303
    assert np.all(draws(w, 10_000) == 123_457)
    assert np.all(draws(w, 1, replacement=False) == 123_457)
    assert fastshard._core.AliasTable(w).probability(123_457) == pytest.approx(1.0, abs=1e-9)


def test_two_subnormal_weights_draw_in_their_ratio():
    w = [5e-324, 1e-323]  # 1 and 2 units of the smallest subnormal
    t = _core.AliasTable(np.array(w))
    # Exact up to the table's 2^-32 resolution per bucket.
    assert abs(t.probability(1) - 2 / 3) < 2**-31
    n = 200_000
    ones = int(np.count_nonzero(draws(w, n) == 1))
    lo, hi = stats.binom.ppf([ALPHA / 2, 1 - ALPHA / 2], n, 2 / 3)
    assert lo <= ones <= hi, (ones, lo, hi)


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("shift", [-1074, -1060, -1000, -600, 3, 900])
def test_scaling_weights_by_a_power_of_two_changes_no_draw(replacement, shift):
    rng = np.random.default_rng(19)
    w = rng.integers(0, 1000, 20_000).astype(np.float64)  # exact at every shift below
    w[::7] = 0.0
    scaled = np.ldexp(w, shift)
    assert np.array_equal(np.ldexp(scaled, -shift), w)  # the scaling itself rounded nothing
    k = 5_000
    for epoch in range(2):
        a = draws(w, k, replacement, seed=3, epoch=epoch)
        b = draws(scaled, k, replacement, seed=3, epoch=epoch)
        assert np.array_equal(a, b), (shift, epoch, np.count_nonzero(a != b))
    # Real-valued weights too, where every scaled weight stays normal.
    v = rng.random(20_000) + 0.5
    if 2.0**shift * 0.5 >= np.finfo(np.float64).tiny:
        assert np.array_equal(draws(v, k, replacement), draws(np.ldexp(v, shift), k, replacement))


def test_equal_tiny_weights_without_replacement_are_a_uniform_order():
    # Keys -log(u) / 1e-310 overflowed to inf for most items, and ties fell back to index order.
    w = [1e-310] * 100
    epochs, k = 2_000, 10
    counts = np.zeros(100)
    first = np.zeros(100)
    for epoch in range(epochs):
        d = draws(w, k, replacement=False, seed=11, epoch=epoch)
        assert d.tolist() != list(range(k)), epoch  # chance 1 / (100 * 99 * ... * 91)
        assert len(set(d.tolist())) == k
        counts[d] += 1
        first[d[0]] += 1
    # Each item is in an epoch's 10 draws with probability 0.1 and first with 0.01. Pearson's
    # statistic against chi-square(99): exact for the first draws (multinomial); for the
    # inclusion counts the variance per item is 0.9 of the multinomial's, so the test is
    # conservative there.
    limit = stats.chi2.ppf(1 - ALPHA, 99)
    for c, total in ((counts, epochs * k), (first, epochs)):
        expected = total / 100
        chi2 = float(((c - expected) ** 2 / expected).sum())
        assert chi2 < limit, (chi2, limit)


def test_tiny_weights_without_replacement_follow_their_ratio():
    # [1, 3] units of 1e-310: the first draw is item 1 with probability 3/4.
    n = 4_000
    firsts = np.array([draws([1e-310, 3e-310], 1, replacement=False, epoch=e)[0] for e in range(n)])
    lo, hi = stats.binom.ppf([ALPHA / 2, 1 - ALPHA / 2], n, 0.75)
    assert lo <= np.count_nonzero(firsts == 1) <= hi


def test_normal_weights_below_2_19_keep_their_draws():
    # The normalisation is exact for normal-range weights: the table is built from the weights
    # as they are, so it equals one built from the weights scaled by 2^k, whatever k.
    rng = np.random.default_rng(5)
    w = rng.random(300_000) * 3.0
    ref = _core.AliasTable(w)._buckets()
    for shift in (-900, -40, 7, 600):
        got = _core.AliasTable(np.ldexp(w, shift))._buckets()
        assert np.array_equal(ref[0], got[0]) and np.array_equal(ref[1], got[1]), shift


# --- item 3: the same weights give the same table on any number of threads -------------------


@pytest.mark.parametrize("n", [2**19 + 4_097, 2**22 + 2**20 + 3])  # the second: two segments
def test_summary_and_table_do_not_depend_on_the_thread_count(n):
    rng = np.random.default_rng(n)
    # A wide dynamic range: the sum's rounding depends on the order of the additions.
    w = rng.random(n) * 10.0 ** rng.integers(-12, 13, n)
    before = fastshard.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3, 7):
            fastshard.set_num_threads(threads)
            summary = _core.summarize_weights(w)
            s = fastshard.WeightedDistributedSampler(
                w, num_samples=2_000_000, num_replicas=1, rank=0, seed=7
            )
            threshold, alias = s._table._buckets()
            results.append((threads, summary, threshold, alias, s.indices(), s.weights_checksum))
    finally:
        fastshard.set_num_threads(before)
    _, summary0, threshold0, alias0, idx0, checksum0 = results[0]
    for threads, summary, threshold, alias, idx, checksum in results[1:]:
        assert summary == summary0, threads  # sum bit for bit, checksum, counts
        assert checksum == checksum0
        assert np.array_equal(threshold, threshold0) and np.array_equal(alias, alias0), threads
        assert np.array_equal(idx, idx0), threads


def test_sum_is_the_blocks_sums_added_in_order():
    # The defined rounding: each block of 4096 items added left to right, then the blocks.
    rng = np.random.default_rng(1)
    w = rng.random(3 * 4096 + 100) * 10.0 ** rng.integers(-10, 11, 3 * 4096 + 100)
    expected = 0.0
    for b in range(0, len(w), 4096):
        block = 0.0
        for v in w[b : b + 4096].tolist():
            block += v
        expected += block
    assert _core.summarize_weights(w)[1] == expected


def test_first_invalid_is_the_first_for_any_thread_count():
    w = np.ones(2**20)
    w[[700_001, 300_000, 900_000]] = [np.nan, -1.0, np.inf]
    before = fastshard.get_num_threads()
    try:
        for threads in (1, 2, 3, 7):
            fastshard.set_num_threads(threads)
            assert _core.summarize_weights(w)[0] == 300_000
    finally:
        fastshard.set_num_threads(before)


# --- item 5: C++ exceptions in fill threads and in the iterator ------------------------------


def test_errors_in_fill_threads_and_the_iterator_are_python_exceptions():
    # In a child process: before the fix these ended the process (std::terminate), which the
    # child's exit status reports as a failure instead of killing pytest.
    out = run_python(
        "from fastshard import _core\n"
        "n = 1 << 20\n"
        "def check(fn, exc):\n"
        "    try:\n"
        "        fn()\n"
        "    except exc as e:\n"
        "        return type(e).__name__\n"
        "    raise AssertionError('no exception')\n"
        "seen = []\n"
        "for error, exc in (('bad_alloc', MemoryError), ('runtime', RuntimeError)):\n"
        "    for at in (10, n // 2, n - 1):  # the caller's part, a worker's, the last worker's\n"
        "        s = _core._failing_shard(n, at, error)\n"
        "        seen.append(check(lambda: s.indices(0, n, 4), exc))\n"
        "        it = iter(s)\n"
        "        seen.append(check(lambda: [next(it) for _ in range(at + 1)], exc))\n"
        "        # The iterator stays usable: the failed refill is not skipped (it refills 1024\n"
        "        # items at a time: kBuffer in register_iterator.cpp).\n"
        "        assert it.position == at // 1024 * 1024, it.position\n"
        "    ok = _core._failing_shard(n, n, error)\n"
        "    assert list(ok.indices(0, n, 4)) == list(range(n))\n"
        "print(' '.join(seen))\n"
    )
    names = out.split()
    assert names == ["MemoryError"] * 6 + ["RuntimeError"] * 6


@settings(max_examples=80, deadline=None)
@given(
    weights=st.lists(st.integers(0, 2**20), min_size=1, max_size=300).filter(any),
    # Half of the shifts in the subnormal range, where scale-dependence would show.
    shift=st.one_of(st.integers(-1074, -1000), st.integers(-999, 980)),
    replacement=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
)
def test_any_exact_power_of_two_scaling_changes_no_draw(weights, shift, replacement, seed):
    # Integers below 2^20 times 2^shift, shift >= -1074, are exact doubles (multiples of the
    # smallest subnormal), and their sum stays finite for shift <= 980.
    w = np.array(weights, dtype=np.float64)
    scaled = np.ldexp(w, shift)
    assert np.array_equal(np.ldexp(scaled, -shift), w)
    k = int(np.count_nonzero(w)) if not replacement else 500
    assert np.array_equal(
        draws(w, k, replacement, seed=seed), draws(scaled, k, replacement, seed=seed)
    )


def test_weights_near_the_largest_double_draw_as_small_ones():
    # n / sum = 2 / (3 * 2^1022) is subnormal: the table is built from the normalised copy,
    # which equals the weights [1, 2] times a power of two.
    big = np.ldexp(np.array([1.0, 2.0]), 1022)
    assert np.array_equal(draws(big, 10_000), draws([1.0, 2.0], 10_000))
    assert np.array_equal(draws(big, 2, False), draws([1.0, 2.0], 2, False))


def test_a_range_wider_than_the_exponents_keeps_the_large_items_exact():
    # 1e-300 next to 1e300 underflows when normalised: it gets probability 0 (it had about
    # 1e-600), and the other items keep their exact ratio.
    t = _core.AliasTable(np.array([1e300, 1e-300, 3e300]))
    assert t.probability(1) == 0.0
    assert abs(t.probability(2) - 0.75) < 2**-30 and abs(t.probability(0) - 0.25) < 2**-30
