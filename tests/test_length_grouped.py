"""fastshard.LengthGroupedBatchSampler (issue 18): budgets, coverage, equal counts per rank,
world-size independence, epochs, resume, a DataLoader end to end, and bad inputs."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import fastshard
from fastshard import EpochWarning, LengthGroupedBatchSampler

from .conftest import linux_only, run_python
from .length_worker import Sequences, pad


def lognormal(n: int, seed: int = 0, dtype: str = "int64", high: int = 4000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(4.5, 1.0, n)), 0, high).astype(dtype)


def make(lengths, W=1, r=0, epoch=0, **kw) -> LengthGroupedBatchSampler:
    kw.setdefault("max_tokens", 2048)
    if "batch_size" in kw:
        kw.pop("max_tokens")
    s = LengthGroupedBatchSampler(lengths, num_replicas=W, rank=r, **kw)
    s.set_epoch(epoch)
    return s


def global_sequence(lengths, epoch=0, **kw) -> list[list[int]]:
    return list(make(lengths, 1, 0, epoch, **kw))


# -- the rule ---------------------------------------------------------------------------------
@pytest.mark.parametrize("max_tokens", [1, 300, 2048, 10_000])
@pytest.mark.parametrize("max_batch_size", [None, 1, 7])
def test_token_budget_never_exceeded(max_tokens, max_batch_size):
    lengths = lognormal(20_000, seed=max_tokens)
    s = make(lengths, max_tokens=max_tokens, max_batch_size=max_batch_size, sort_window=3000)
    batches = list(s)
    assert len(batches) == len(s) == s.num_batches
    for b in batches:
        lb = lengths[b]
        if len(b) > 1:  # only an item longer than the budget may exceed it, and then alone
            assert len(b) * lb.max() <= max_tokens
        else:
            assert len(b) == 1
        if max_batch_size is not None:
            assert len(b) <= max_batch_size
    # every over-long item is alone in its batch
    alone = {b[0] for b in batches if len(b) == 1}
    assert set(np.flatnonzero(lengths > max_tokens)) <= alone


def test_greedy_cut_matches_a_reference():
    """Within a window the batches are the greedy cut of the length-sorted window: the batch
    takes the next item while the padded size, on the length classes' bounds, stays within the
    budget."""
    lengths = lognormal(5000, seed=3)
    s = make(lengths, max_tokens=1500, sort_window=5000)  # one window: the whole epoch
    got = list(s)
    # The classes, in length order, and each sorted item's class bound; one window: no merging,
    # so below 128 every length is its own class and its bound is exact.
    classes = s._static_layout().classes()
    assert sum(c for c, _ in classes) == len(lengths)
    sorted_lengths = np.sort(np.maximum(lengths, 1))
    bounds = np.repeat([u for _, u in classes], [c for c, _ in classes])
    small = sorted_lengths < 128
    assert (bounds[small] == sorted_lengths[small]).all()
    assert (bounds >= sorted_lengths).all() and (bounds <= sorted_lengths * 65 // 64).all()
    expected_sizes = []
    count = 0
    for v in bounds:
        if count and count + 1 > max(1500 // v, 1):
            expected_sizes.append(count)
            count = 0
        count += 1
    expected_sizes.append(count)
    assert sorted(len(b) for b in got) == sorted(expected_sizes)
    # each batch holds a contiguous run of the sorted lengths
    runs = sorted((lengths[b].min(), lengths[b].max()) for b in got)
    assert all(hi <= lo_next for (_, hi), (lo_next, _) in zip(runs, runs[1:]))


@pytest.mark.parametrize("window", [7, 100, 999, 5000])
@pytest.mark.parametrize("max_batch_size", [None, 3])
def test_counted_batches_are_the_cut_batches(window, max_batch_size):
    """The epoch's batch count comes from a histogram (few distinct lengths in a window) or a
    sort of the lengths (many); either must equal what cutting the sorted window yields, also
    with zero lengths (any number fit the budget) and over-long items."""
    rng = np.random.default_rng(window)
    lengths = np.concatenate(
        [np.zeros(300, np.int64), rng.integers(0, 50, 2000), rng.integers(0, 10**6, 700)]
    )
    s = make(lengths, max_tokens=400, max_batch_size=max_batch_size, sort_window=window)
    batches = list(s)  # the compiled build checks each window's cut against its count
    assert len(batches) == s.num_batches
    assert sorted(np.concatenate(batches)) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * lengths[b].max() <= 400
        assert max_batch_size is None or len(b) <= max_batch_size


def test_default_sort_window():
    # 1024 expected batches per window when the epoch has at least 16 such windows
    big = np.full(1_000_000, 100)
    assert make(big, batch_size=32).sort_window == 1024 * 32
    assert make(big, max_tokens=4000).sort_window == 1024 * 40
    assert make(big, max_tokens=4000, max_batch_size=8).sort_window == 1024 * 8
    # huge batches: capped, so that a window never holds more than 2**21 items
    assert make(big, max_tokens=10**9).sort_window == 2**21
    # a smaller epoch: at least 16 windows (n / 16 rounded up to whole batches) ...
    lengths = np.full(10_000, 100)
    assert make(lengths, batch_size=32).sort_window == 20 * 32  # ceil(625 / 32) batches
    assert make(lengths, max_tokens=4000).sort_window == 16 * 40
    assert make(lengths, max_tokens=4000, max_batch_size=8).sort_window == 79 * 8
    # ... unless a window would hold fewer than 16 batches
    assert make(lengths[:3000], batch_size=32).sort_window == 16 * 32
    assert make(lengths, batch_size=32, sort_window=77).sort_window == 77


def test_batch_size_groups_by_length():
    lengths = lognormal(10_000, seed=1)
    s = make(lengths, batch_size=32, sort_window=32 * 16)
    batches = list(s)
    sizes = [len(b) for b in batches]
    assert max(sizes) == 32 and sum(sizes) == 10_000
    assert sum(1 for x in sizes if x < 32) == 1  # only the last window's remainder
    # grouped: a batch spans a narrow length range compared with a random batch
    spread = np.median([np.ptp(lengths[b]) for b in batches if len(b) == 32])
    rng = np.random.default_rng(0)
    random_spread = np.median([np.ptp(rng.choice(lengths, 32)) for _ in range(200)])
    assert spread < random_spread / 5


# -- the plan: coverage, equal counts, world-size independence ---------------------------------
@pytest.mark.parametrize("W", [1, 2, 3, 7])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("rule", [{"max_tokens": 2048}, {"batch_size": 16}])
def test_equal_counts_and_coverage(W, drop_last, rule):
    lengths = lognormal(3001, seed=W)
    g = global_sequence(lengths, sort_window=500, **rule)
    nb = len(g)
    per_rank = [
        list(make(lengths, W, r, sort_window=500, drop_last=drop_last, **rule)) for r in range(W)
    ]
    counts = {len(p) for p in per_rank}
    expected = nb // W if drop_last else -(-nb // W)
    assert counts == {expected}
    assert {
        len(make(lengths, W, r, sort_window=500, drop_last=drop_last, **rule)) for r in range(W)
    } == {expected}
    # W-independence: rank r's k-th batch is the global sequence's batch r + k W (mod nb)
    for r, batches in enumerate(per_rank):
        assert batches == [g[(r + k * W) % nb] for k in range(expected)]
    items = np.concatenate([np.asarray(b) for p in per_rank for b in p])
    counted = np.bincount(items, minlength=len(lengths))
    if drop_last:
        assert counted.max() == 1 and (counted == 0).sum() == sum(len(b) for b in g[expected * W :])
    else:
        assert counted.min() >= 1  # every item once, plus fewer than W padded batches
        assert counted.sum() - len(lengths) == sum(len(b) for b in g[: expected * W - nb])
        assert expected * W - nb < W


def test_more_ranks_than_batches():
    lengths = np.array([5, 9, 100])
    s = [make(lengths, 7, r, max_tokens=10**6) for r in range(7)]
    assert {len(x) for x in s} == {1}
    assert all(list(x) == [sorted([0, 1, 2], key=lambda i: lengths[i])] for x in s)


def test_epochs_differ_and_regroup():
    from scipy.stats import hypergeom

    n, window = 20_000, 1000
    lengths = lognormal(n, seed=5)
    s0, s1 = make(lengths, 1, 0, 0, sort_window=window), make(lengths, 1, 0, 1, sort_window=window)
    e0, e1 = list(s0), list(s1)
    assert e0 != e1
    assert sorted(np.concatenate(e0)) == sorted(np.concatenate(e1)) == list(range(n))
    # A fresh grouping, not the same batches reordered: each epoch's first window is a fresh
    # random sample of the items (of fixed size per length class), so its overlap with the
    # other epoch's first window is about hypergeometric (about window**2 / n = 50); a repeated
    # grouping would overlap entirely. Bound at a false-alarm rate of 1e-9.
    first0 = np.concatenate(e0[: s0._epoch_layout().window_offset(1)])
    first1 = np.concatenate(e1[: s1._epoch_layout().window_offset(1)])
    m = len(first0)
    assert m == len(first1) and abs(m - window) < s0._static_layout().num_classes
    overlap = len(np.intersect1d(first0, first1))
    assert overlap <= hypergeom(n, m, m).ppf(1 - 1e-9)
    assert list(make(lengths, 1, 0, 0, sort_window=window)) == e0  # reproducible


def test_seed_changes_the_order():
    lengths = lognormal(5000)
    assert global_sequence(lengths, seed=1) != global_sequence(lengths, seed=2)


# -- issue 24: a fixed count per epoch, zero lengths, fresh epochs at small n -------------------
def check_epoch(lengths, W, drop_last, epoch, **kw):
    """Every rank's batches of one epoch: the count len() promised, the global sequence's items
    exactly once (ranks take its batches r, r + W, ...), the budget on the actual lengths with a
    zero length counted as 1. Returns the global sequence."""
    g = list(make(lengths, 1, 0, epoch, **kw))
    assert len(g) == make(lengths, 1, 0, epoch, **kw).num_batches
    assert np.array_equal(np.sort(np.concatenate(g)), np.arange(len(lengths)))
    rule_lengths = np.maximum(lengths, 1)
    for b in g:
        if "max_tokens" in kw and len(b) > 1:
            assert len(b) * int(rule_lengths[b].max()) <= kw["max_tokens"]
        assert kw.get("max_batch_size") is None or len(b) <= kw["max_batch_size"]
    nb = len(g)
    expected = nb // W if drop_last else -(-nb // W)
    for r in range(W):
        s = make(lengths, W, r, epoch, drop_last=drop_last, **kw)
        batches = list(s)
        assert len(batches) == len(s) == expected
        assert batches == [g[(r + k * W) % nb] for k in range(expected)]
    return g


def uniform_2000():
    return np.random.default_rng(24).integers(1, 300, 2000)


def with_zeros_and_overlong():
    rng = np.random.default_rng(25)
    return np.concatenate(
        [np.zeros(400, np.int64), rng.integers(1, 300, 2000), rng.integers(2049, 10**5, 60)]
    )[rng.permutation(2460)]


@pytest.mark.parametrize(
    "lengths,kw",
    [
        # the first setup: 202, 203, 202, 205 batches in epochs 0-3 before
        (uniform_2000, {"max_tokens": 2048, "sort_window": 64}),
        (uniform_2000, {"max_tokens": 2048, "max_batch_size": 5, "sort_window": 300}),
        (with_zeros_and_overlong, {"max_tokens": 2048, "sort_window": 500}),
        (with_zeros_and_overlong, {"max_tokens": 2048}),
        (lambda: lognormal(3000, seed=26), {"max_tokens": 2048, "sort_window": 7}),
        (lambda: lognormal(3000, seed=27), {"max_tokens": 4096}),
    ],
)
def test_len_is_the_same_in_every_epoch(lengths, kw):
    """Frameworks size an epoch once (Lightning, the Trainer's max_steps, LR schedules): with a
    token budget too, every epoch has the batches len() promised, on every number of ranks."""
    lengths = lengths()
    s = make(lengths, **kw)
    count = len(s)
    for epoch in range(20):
        s.set_epoch(epoch)
        assert len(s) == s.num_batches == count
        g = check_epoch(lengths, 1, False, epoch, **kw)
        assert len(g) == count
    for W in (2, 3, 7):
        for drop_last in (False, True):
            for epoch in (0, 5, 11):
                check_epoch(lengths, W, drop_last, epoch, **kw)
    fresh = make(lengths, **kw)
    assert len(fresh) == count and fresh._layout is None  # no epoch scan for len()


def test_len_is_the_same_in_every_epoch_at_1e5_lognormal():
    """The issue's second setup (1535 or 1536 batches before), with the default window."""
    lengths = lognormal(100_000, seed=24)
    s = make(lengths, max_tokens=2048)
    counts = set()
    for epoch in range(20):
        s.set_epoch(epoch)
        counts.add(len(s))
    assert len(counts) == 1
    for epoch in (0, 1):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == len(s)
        assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(len(lengths)))
        assert max(len(b) * int(lengths[b].max()) for b in batches if len(b) > 1) <= 2048


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 400),
    high=st.integers(1, 3000),
    zeros=st.floats(0, 1),
    max_tokens=st.integers(1, 5000),
    max_batch_size=st.one_of(st.none(), st.integers(1, 50)),
    window=st.integers(1, 500),
    seed=st.integers(0, 2**32),
)
def test_fixed_count_property(n, high, zeros, max_tokens, max_batch_size, window, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, high + 1, n) * (rng.random(n) >= zeros)
    kw = {"max_tokens": max_tokens, "max_batch_size": max_batch_size, "sort_window": window}
    counts = {len(check_epoch(lengths, 1, False, epoch, seed=seed, **kw)) for epoch in range(4)}
    assert counts == {len(make(lengths, seed=seed, **kw))}


def test_auto_epoch_advances_over_whole_epochs_of_fixed_length():
    """A loop that stops after len() batches (Lightning) finishes the pass, so auto_epoch
    advances, and every epoch trains every item."""
    lengths = uniform_2000()
    a = LengthGroupedBatchSampler(
        lengths, max_tokens=2048, sort_window=64, num_replicas=1, rank=0, auto_epoch=True
    )
    steps = len(a)  # sized once, as Lightning does
    for epoch in range(6):
        it = iter(a)
        assert a.epoch == epoch
        got = [next(it) for _ in range(steps)]  # the loop stops after `steps` batches
        with pytest.raises(StopIteration):  # ... which ends the pass: the epoch advances
            next(it)
        assert np.array_equal(np.sort(np.concatenate(got)), np.arange(2000))


def test_zero_lengths_count_as_one_token():
    """10^6 items, 70% of length 0, max_tokens=4096: one batch of 700,009 items before; now a
    zero length takes a token-slot like a length of 1, so no batch exceeds 4096 items."""
    rng = np.random.default_rng(12)
    lengths = np.zeros(10**6, np.int32)
    lengths[rng.permutation(10**6)[:300_000]] = rng.integers(1, 200, 300_000)
    s = make(lengths, max_tokens=4096)
    batches = list(s)
    assert len(batches) == len(s)
    sizes = np.array([len(b) for b in batches])
    assert sizes.max() <= 4096
    assert np.array_equal(np.bincount(np.concatenate(batches), minlength=10**6), np.ones(10**6))
    for b in batches:
        assert len(b) * max(int(lengths[b].max()), 1) <= 4096
    # all zeros: batches of exactly max_tokens items but for each window's last
    zeros = make(np.zeros(10_000, np.int64), max_tokens=100, sort_window=1000)
    assert sorted({len(b) for b in zeros}) == [100]


def pair_repeat(e0, e1, n):
    """Of the pairs of items sharing a batch in e0, the fraction sharing one in e1."""
    where = np.empty(n, np.int64)
    for i, b in enumerate(e1):
        where[b] = i
    pairs = again = 0
    for b in e0:
        _, c = np.unique(where[b], return_counts=True)
        pairs += len(b) * (len(b) - 1) // 2
        again += int((c * (c - 1) // 2).sum())
    return again / pairs


def test_small_epochs_are_fresh_with_the_default_window():
    """The issue's setup: 20,000 lognormal lengths, max_tokens=8192 were one window (one global
    sort) by default, so the same batches came back every epoch. Two batch-mates of epoch 0 can
    share a batch in epoch 1 only if epoch 1 puts them in the same window; each window takes a
    fixed share of every length class at random, so that chance is about sum_w (m_w / n)^2 for
    windows of m_w items. Bound the repeat rate by it, plus 5 standard deviations of a rate
    measured over the epoch's batches (pairs of one batch move together)."""
    n = 20_000
    lengths = lognormal(n, seed=28)
    s0, s1 = make(lengths, 1, 0, 0, max_tokens=8192), make(lengths, 1, 0, 1, max_tokens=8192)
    layout = s0._epoch_layout()
    assert layout.num_windows >= 16  # the default keeps at least 16 windows here
    e0, e1 = list(s0), list(s1)
    sizes = np.array(
        [
            len(np.concatenate(e0[layout.window_offset(w) : layout.window_offset(w + 1)]))
            for w in range(layout.num_windows)
        ]
    )
    same_window = float(((sizes / n) ** 2).sum())
    sd = np.sqrt(same_window * (1 - same_window) / len(e0))
    rate = pair_repeat(e0, e1, n)
    assert rate <= same_window + 5 * sd, (rate, same_window, sd)


# -- lengths: dtypes, no copy, both sort paths -----------------------------------------------
@pytest.mark.parametrize(
    "dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
)
def test_every_integer_dtype_gives_the_same_batches(dtype):
    lengths = lognormal(4000, seed=2, high=120)
    ref = make(lengths, max_tokens=500)
    s = make(lengths.astype(dtype), max_tokens=500)
    assert s.lengths_checksum == ref.lengths_checksum
    assert list(s) == list(ref)


def test_list_tensor_and_non_native_inputs():
    lengths = lognormal(3000, seed=4, high=1000)
    ref = list(make(lengths, max_tokens=2000))
    assert list(make(lengths.tolist(), max_tokens=2000)) == ref
    assert list(make(torch.from_numpy(lengths.astype(np.int32)), max_tokens=2000)) == ref
    assert list(make(lengths.astype(">i4"), max_tokens=2000)) == ref
    assert list(make(lengths[::-1][::-1].copy()[:, None][:, 0], max_tokens=2000)) == ref
    strided = np.repeat(lengths, 2)[::2]  # a non-contiguous view is copied, same result
    assert list(make(strided, max_tokens=2000)) == ref


def test_contiguous_arrays_are_not_copied(tmp_path):
    lengths = lognormal(10_000, dtype="uint16")
    s = make(lengths)
    assert np.shares_memory(s.lengths, lengths)
    t = torch.from_numpy(lengths.astype(np.int32))
    assert s.lengths.dtype == np.uint16
    assert make(t).lengths.ctypes.data == t.data_ptr()
    mm = np.memmap(tmp_path / "lengths.u16", dtype=np.uint16, mode="w+", shape=(10_000,))
    mm[:] = lengths
    sm = make(mm)
    assert np.shares_memory(sm.lengths, mm)
    assert list(sm) == list(s)


def test_wide_lengths_take_the_comparison_sort_with_the_same_order():
    """Lengths whose range and window positions do not pack into 64 bits are sorted by
    comparisons; the order is the same (length, then position in the window)."""
    lengths = lognormal(6000, seed=7, high=3000)
    small = list(make(lengths, batch_size=8, sort_window=1000))
    wide = list(make(lengths.astype(np.uint64) << np.uint64(50), batch_size=8, sort_window=1000))
    assert wide == small
    huge = np.random.default_rng(0).integers(0, 2**63, 5000, dtype=np.int64)
    batches = list(make(huge, max_tokens=2**63 - 1, sort_window=700))
    assert sorted(np.concatenate(batches)) == list(range(5000))
    for b in batches:
        assert len(b) == 1 or len(b) * int(huge[b].max()) <= 2**63 - 1


@linux_only
def test_epoch_memory_is_per_window_not_per_item():
    """A token-budget epoch over 2e7 items: the count scan and the first batch need memory
    per window and per thread, not per item (8 bytes per item would be 160 MB)."""
    grown = run_python(
        "import numpy as np, fastshard\n"
        "L = (np.arange(20_000_000, dtype=np.uint32) * 2654435761 % 3000).astype(np.uint16)\n"
        "def hwm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM'): return int(line.split()[1])\n"
        "open('/proc/self/clear_refs', 'w').write('5'); base = hwm()\n"
        "s = fastshard.LengthGroupedBatchSampler(L, max_tokens=8192, num_replicas=8, rank=3)\n"
        "b = next(iter(s)); print(hwm() - base)\n"
    )
    assert int(grown) < 40 * 1024  # KiB


def test_compiled_core_checks_its_own_inputs():
    from fastshard import _core

    L = np.arange(10, dtype=np.int32)
    with pytest.raises(ValueError, match="exactly one"):
        _core.LengthEpoch(L, 0, 0, 0, 4, 0, 0)
    with pytest.raises(ValueError, match="sort_window"):
        _core.LengthEpoch(L, 2, 0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="empty"):
        _core.LengthEpoch(L[:0], 2, 0, 0, 4, 0, 0)
    with pytest.raises(ValueError, match="contiguous"):
        _core.LengthEpoch(L[::2], 2, 0, 0, 4, 0, 0)
    with pytest.raises(TypeError, match="integer dtype"):
        _core.scan_lengths(L.astype(np.float32))
    shard = _core.length_shard(_core.LengthEpoch(L, 3, 0, 0, 4, 0, 0), 2, 1, False, 0)
    with pytest.raises(IndexError):
        shard.batch(len(shard))
    with pytest.raises(ValueError, match="rank"):
        _core.length_shard(_core.LengthEpoch(L, 3, 0, 0, 4, 0, 0), 2, 2, False, 0)


def test_threads_reading_one_shard_get_the_same_batches():
    """The shard keeps one window; reads from several threads (without the GIL) take turns."""
    from concurrent.futures import ThreadPoolExecutor

    lengths = lognormal(50_000, seed=12)
    s = make(lengths, max_tokens=2048, sort_window=2000)
    expected = list(s)
    shard = s._current()
    ks = list(range(len(expected))) * 2
    np.random.default_rng(0).shuffle(ks)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(shard.batch, ks))
    assert got == [expected[k] for k in ks]


# -- resume ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", [{"max_tokens": 2048}, {"batch_size": 16}])
def test_exact_resume(rule):
    lengths = lognormal(5000, seed=8)
    W = 3
    full = [list(make(lengths, W, r, 2, **rule)) for r in range(W)]
    for k in (0, 1, 17, len(full[0])):
        samplers = [make(lengths, W, r, 2, **rule) for r in range(W)]
        its = [iter(s) for s in samplers]
        for it in its:
            for _ in range(k):
                next(it)
        states = [s.state_dict() for s in samplers]
        assert all(st == states[0] for st in states)  # no rank in the state
        state = json.loads(json.dumps(states[0]))
        for r in range(W):
            fresh = make(lengths, W, r, 0, **rule)
            fresh.load_state_dict(state)
            fresh.set_epoch(2)  # the usual loop: keeps the resume
            assert list(fresh) == full[r][k:]
            assert len(fresh) == len(full[r])  # len() is the whole epoch's


@pytest.mark.parametrize("old_w,new_w", [(2, 3), (3, 2), (4, 1), (1, 7)])
def test_elastic_resume_covers_every_unconsumed_item(old_w, new_w):
    lengths = lognormal(4000, seed=9)
    g = global_sequence(lengths, 1, max_tokens=2048)
    k = 5
    state = make(lengths, old_w, 0, 1, max_tokens=2048).state_dict(consumed=k)
    assert state["cursor"] == k * old_w
    rest = []
    for r in range(new_w):
        s = make(lengths, new_w, r, 0, max_tokens=2048)
        s.load_state_dict(state)
        rest.append(list(s))
    assert len({len(x) for x in rest}) == 1  # still equal counts
    cursor, nb = k * old_w, len(g)
    for r, batches in enumerate(rest):  # the rest of G re-dealt; padding wraps to its start
        assert batches == [g[(cursor + r + j * new_w) % nb] for j in range(len(batches))]
    assert len(rest[0]) * new_w - (nb - cursor) < new_w
    got = np.concatenate([np.asarray(b) for x in rest for b in x])
    unconsumed = np.concatenate(g[cursor:])
    assert np.bincount(got, minlength=4000)[unconsumed].min() >= 1  # every one covered


def test_state_refused_for_other_lengths_or_rule():
    lengths = lognormal(1000)
    state = make(lengths).state_dict()
    other = lengths.copy()
    other[10] += 1
    with pytest.raises(ValueError, match="lengths_checksum"):
        make(other).load_state_dict(state)
    with pytest.raises(ValueError, match="max_tokens"):
        make(lengths, max_tokens=4096).load_state_dict(state)


# -- epochs, warnings, pickling -------------------------------------------------------------------
def test_forgotten_set_epoch_warns_and_auto_epoch_advances():
    lengths = lognormal(2000)
    s = make(lengths)
    first = list(s)
    with pytest.warns(EpochWarning):
        again = list(s)
    assert again == first
    a = LengthGroupedBatchSampler(lengths, max_tokens=2048, num_replicas=1, rank=0, auto_epoch=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e0, e1 = list(a), list(a)
    assert a.epoch == 1 and e0 == first and e1 == global_sequence(lengths, 1)


def test_pickle_and_getitem():
    import pickle

    lengths = lognormal(3000)
    s = make(lengths, 2, 1)
    t = pickle.loads(pickle.dumps(s))
    batches = list(s)
    assert list(t) == batches
    assert s[0] == batches[0] and s[-1] == batches[-1]
    with pytest.raises(IndexError):
        s[len(s)]
    with pytest.raises(TypeError, match="batches"):
        s.indices()
    assert isinstance(s, torch.utils.data.distributed.DistributedSampler)
    assert "max_tokens=2048" in repr(s)


# -- a DataLoader end to end ---------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_end_to_end_with_padding_collate(workers):
    lengths = lognormal(3000, seed=11, high=600) + 1
    seen = []
    for r in range(2):
        sampler = make(lengths, 2, r, max_tokens=1024)
        loader = DataLoader(
            Sequences(lengths), batch_sampler=sampler, collate_fn=pad, num_workers=workers
        )
        assert len(loader) == len(sampler)
        for x in loader:
            assert x.numel() <= 1024 or x.shape[0] == 1
            ids = x[:, 0]
            assert all(int((x[i] >= 0).sum()) == lengths[int(ids[i])] for i in range(len(ids)))
            seen.extend(ids.tolist())
    assert set(seen) == set(range(3000))


def test_public_api():
    assert "LengthGroupedBatchSampler" in fastshard.__all__


# -- bad inputs --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lengths,error,match",
    [
        ([], ValueError, "lengths must not be empty"),
        (np.zeros((3, 2), np.int64), ValueError, "lengths must be 1-D"),
        ([3, -1, 4], ValueError, r"lengths\[1\] = -1 is negative"),
        ([1.0, 2.0], TypeError, "lengths must have an integer dtype"),
        (np.array([True, False]), TypeError, "lengths must have an integer dtype"),
        (torch.tensor([1.5]), TypeError, "lengths must have an integer dtype"),
        ("abc", TypeError, "lengths"),
        ([[1], [2, 3]], TypeError, "lengths"),
        (5, ValueError, "lengths must be 1-D"),
        (torch.utils.data.SequentialSampler(range(3)), TypeError, "use_distributed_sampler"),
    ],
)
def test_bad_lengths(lengths, error, match):
    with pytest.raises(error, match=match):
        LengthGroupedBatchSampler(lengths, batch_size=2, num_replicas=1, rank=0)


@pytest.mark.parametrize(
    "kw,error,match",
    [
        ({}, ValueError, "exactly one of batch_size"),
        ({"batch_size": 2, "max_tokens": 10}, ValueError, "exactly one of batch_size"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"batch_size": -3}, ValueError, "batch_size"),
        ({"batch_size": 2.0}, TypeError, "batch_size"),
        ({"max_tokens": 0}, ValueError, "max_tokens"),
        ({"max_tokens": "9"}, TypeError, "max_tokens"),
        ({"max_tokens": 10, "max_batch_size": 0}, ValueError, "max_batch_size"),
        ({"batch_size": 2, "max_batch_size": 4}, ValueError, "max_batch_size"),
        ({"batch_size": 2, "sort_window": 0}, ValueError, "sort_window"),
        ({"batch_size": 2, "drop_last": "yes"}, TypeError, "drop_last"),
        ({"batch_size": 2, "seed": 1.5}, TypeError, "seed"),
    ],
)
def test_bad_arguments(kw, error, match):
    with pytest.raises(error, match=match):
        LengthGroupedBatchSampler([3, 1, 4, 1, 5], num_replicas=1, rank=0, **kw)


@pytest.mark.slow
@linux_only
def test_billion_item_uint16_memmap(tmp_path):
    path = tmp_path / "lengths.u16"
    run_python(
        "import numpy as np, fastshard\n"
        f"mm = np.memmap({str(path)!r}, dtype=np.uint16, mode='w+', shape=(10**9,))\n"
        "mm[:: 2**20] = 7\n"  # a few pages: the file stays sparse
        "s = fastshard.LengthGroupedBatchSampler(mm, batch_size=64, num_replicas=8, rank=5)\n"
        "assert np.shares_memory(s.lengths, mm)\n"
        "b = next(iter(s)); assert len(b) == 64, len(b)\n"
        "assert len(s) == -(-s.num_batches // 8)\n",
        timeout=600,
    )


# -- token-budget fill that does not fall with n ----------------------------------------------
def actual_cut(lengths, window, max_tokens, seed=0):
    """Batches of a greedy cut on the actual lengths of windows of a random order, each sorted:
    a batch takes the next item while (count + 1) * its length <= max_tokens."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    batches = 0
    for a in range(0, len(lengths), window):
        lens = np.sort(np.maximum(lengths[order[a : a + window]], 1))
        cap = np.maximum(max_tokens // lens, 1)
        i, m = 0, len(lens)
        while i < m:
            lo, hi = 1, m - i  # the most items k with k <= cap[i + k - 1] (cap nonincreasing)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if mid <= cap[i + mid - 1]:
                    lo = mid
                else:
                    hi = mid - 1
            i += lo
            batches += 1
    return batches


@pytest.mark.parametrize("window", [1295, 4096])
def test_token_budget_fill_at_the_class_granularity_of_1e9(window):
    """10^9 lognormal items in the default sort window (40,960) had classes of windows^2 / 32 =
    1.9 * 10^-2 of n each: 101% more batches than a cut on the actual lengths. 10^6 items in
    windows of 1295 have that granularity (4096: 10^8's). Merging classes must cost at most 0.5%
    against the unmerged classes (min_class_items=1) in the same windows, and the count stay
    near a cut on the actual lengths (1%; 1.5% in windows of only ~33 batches, where the classes'
    1/64 width alone costs ~0.8%)."""
    from fastshard import _core

    rng = np.random.default_rng(3)
    lengths = np.clip(np.rint(rng.lognormal(5.5, 1.0, 10**6)), 1, 16384).astype(np.int64)
    s = make(lengths, max_tokens=16384, sort_window=window)
    unmerged = _core.LengthLayout(lengths, 0, 16384, 0, window, 1).num_batches
    assert len(s) <= 1.005 * unmerged
    assert len(s) <= (1.015 if window < 4096 else 1.01) * actual_cut(lengths, window, 16384)
    assert s._static_layout().per_stratum > 1


def test_strata_windows_hold_equal_shares():
    """A stratum's items are dealt to its windows round-robin, class after class: every window
    of a stratum holds the same number of items to one (not, say, every class's last item in
    the stratum's last window)."""
    lengths = lognormal(30_000, seed=31)
    s = make(lengths, max_tokens=2048, sort_window=5)
    layout = s._static_layout()
    k = layout.per_stratum
    assert k > 1
    batches = list(s)
    sizes = [
        sum(len(b) for b in batches[layout.window_offset(w) : layout.window_offset(w + 1)])
        for w in range(layout.num_windows)
    ]
    for t in range(layout.num_windows // k):
        assert max(sizes[t * k : (t + 1) * k]) - min(sizes[t * k : (t + 1) * k]) <= 1


@pytest.mark.parametrize("W", [1, 3])
def test_strata_equal_counts_coverage_and_fixed_count(W):
    """Windows grouped into strata (here 4 windows of 5 items to a stratum): every item once per
    epoch, the budget kept, one count in every epoch and on every number of ranks."""
    lengths = lognormal(30_000, seed=31)
    kw = dict(max_tokens=2048, sort_window=5)
    assert make(lengths, **kw)._static_layout().per_stratum > 1
    g = global_sequence(lengths, **kw)
    nb = len(g)
    for epoch in (0, 1):
        per_rank = [list(make(lengths, W, r, epoch, pad=False, **kw)) for r in range(W)]
        assert sum(len(p) for p in per_rank) == nb
        items = np.concatenate([np.asarray(b) for p in per_rank for b in p])
        assert np.array_equal(np.sort(items), np.arange(len(lengths)))
        assert (
            max(len(b) * int(lengths[b].max()) for p in per_rank for b in p if len(b) > 1) <= 2048
        )
        if epoch == 0:
            assert [b for p in zip(*per_rank) for b in p] == g[: len(per_rank[-1]) * W]


def test_strata_elastic_resume():
    lengths = lognormal(30_000, seed=32)
    kw = dict(max_tokens=2048, sort_window=5, pad=False)
    g = global_sequence(lengths, 1, **kw)
    state = make(lengths, 2, 0, 1, **kw).state_dict(consumed=500)
    rest = []
    for r in range(3):
        s = make(lengths, 3, r, 0, **kw)
        s.load_state_dict(state)
        rest += list(s)
    assert sorted(map(tuple, rest)) == sorted(map(tuple, g[1000:]))


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(6000, 9000),
    high=st.integers(1, 3000),
    zeros=st.floats(0, 0.5),
    max_tokens=st.integers(1, 5000),
    max_batch_size=st.one_of(st.none(), st.integers(1, 50)),
    window=st.integers(1, 2),
    seed=st.integers(0, 2**32),
)
def test_fixed_count_property_over_strata(n, high, zeros, max_tokens, max_batch_size, window, seed):
    """As test_fixed_count_property, with windows few enough items that they are grouped into
    strata (windows * n > 2^24), a last stratum of fewer windows included."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, high + 1, n) * (rng.random(n) >= zeros)
    kw = {"max_tokens": max_tokens, "max_batch_size": max_batch_size, "sort_window": window}
    assert make(lengths, seed=seed, **kw)._static_layout().per_stratum > 1
    counts = {len(check_epoch(lengths, 2, False, epoch, seed=seed, **kw)) for epoch in range(2)}
    assert counts == {len(make(lengths, seed=seed, **kw))}
