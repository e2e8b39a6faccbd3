"""The core sampler: bijection, torch's plan, access paths, arguments."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler as TorchSampler

import fastshard
from fastshard import BatchSampler, DistributedSampler, _core

from .conftest import child_peak_growth_kib, linux_only, run_python


def perm(n: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    s = DistributedSampler(n, 1, 0, seed=seed)
    s.set_epoch(epoch)
    return s.indices()


# -- the order is a bijection ------------------------------------------------------------------
def test_bijection_every_small_n():
    for seed in (0, 1, 2**64 - 1):
        for n in range(0, 2001):
            p = perm(n, seed)
            assert p.dtype == np.int64 and len(p) == n
            assert np.array_equal(np.sort(p), np.arange(n)), (n, seed)


@pytest.mark.parametrize("n", [2047, 2048, 2049, 65_537, 100_003, 1 << 20, (1 << 20) + 1])
def test_bijection_larger_n(n):
    for seed in (0, 7):
        assert np.array_equal(np.sort(perm(n, seed)), np.arange(n))


def test_shuffle_actually_shuffles_and_depends_on_seed_and_epoch():
    n = 10_000
    base = perm(n, 0, 0)
    assert not np.array_equal(base, np.arange(n))
    others = [perm(n, 1, 0), perm(n, 0, 1), perm(n, 3, 0), perm(n, 2**64 + 1, 0)]
    for other in others:
        # Two independent random permutations agree in ~1 place (Poisson(1)); 20 is p < 1e-18.
        assert np.count_nonzero(base == other) < 20
    # seed is reduced modulo 2**64: -1 and 2**64 - 1 are the same seed.
    assert np.array_equal(perm(n, -1), perm(n, 2**64 - 1))
    assert np.array_equal(perm(n, 5, -1), perm(n, 5, 2**64 - 1))


# -- torch's plan ---------------------------------------------------------------------------------
GRID_N = [0, 1, 2, 3, 5, 7, 10, 13, 31, 64, 97, 1000, 1031, 4099]
GRID_W = [1, 2, 3, 8, 11]


@pytest.mark.parametrize("n", GRID_N)
@pytest.mark.parametrize("W", GRID_W)
@pytest.mark.parametrize("drop_last", [False, True])
def test_plan_matches_torch_and_covers_the_epoch(n, W, drop_last):
    samplers = [DistributedSampler(n, W, r, seed=11, drop_last=drop_last) for r in range(W)]
    torch_samplers = [TorchSampler(range(n), W, r, seed=11, drop_last=drop_last) for r in range(W)]
    p = perm(n, 11)
    for s, t in zip(samplers, torch_samplers):
        assert len(s) == len(t) == s.num_samples == t.num_samples
        assert s.total_size == t.total_size
    # rank r's k-th index is G[r + kW] with G[j] = P(j mod n)
    for r, s in enumerate(samplers):
        expected = [int(p[(r + k * W) % n]) for k in range(len(s))]
        assert list(s) == expected
    union = np.concatenate([s.indices() for s in samplers]) if n else np.empty(0, np.int64)
    counts = np.bincount(union, minlength=n)
    total = samplers[0].total_size
    if drop_last:
        assert counts.max(initial=0) <= 1 and len(union) == total == (n // W) * W
    else:
        # every item at least once, and exactly total - n wrapped repeats, taken from the
        # start of the order (repeatedly when n < W)
        assert len(union) == total == math.ceil(n / W) * W
        assert n == 0 or counts.min() >= 1
        expected_counts = np.bincount(p[np.arange(total) % n], minlength=n) if n else counts
        assert np.array_equal(counts, expected_counts)


@pytest.mark.parametrize("n", GRID_N)
@pytest.mark.parametrize("W", GRID_W)
@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_shards_equal_torch(n, W, drop_last):
    for r in range(W):
        ours = list(DistributedSampler(n, W, r, shuffle=False, drop_last=drop_last))
        theirs = list(TorchSampler(range(n), W, r, shuffle=False, drop_last=drop_last))
        assert ours == theirs


@pytest.mark.parametrize("n", [0, 1, 2, 5, 10, 97, 1000, 5003])
@pytest.mark.parametrize("W", [1, 2, 3, 8, 16])
def test_no_padding_gives_every_item_once(n, W):
    samplers = [DistributedSampler(n, W, r, pad=False, seed=3) for r in range(W)]
    lengths = [len(s) for s in samplers]
    assert sum(lengths) == n and max(lengths) - min(lengths) <= 1
    assert all(s.total_size == n for s in samplers)
    union = np.concatenate([s.indices() for s in samplers])
    assert np.array_equal(np.sort(union), np.arange(n))
    # and it is the same global order, without the padded tail
    p = perm(n, 3)
    for r, s in enumerate(samplers):
        assert np.array_equal(s.indices(), p[r::W])


# -- access paths agree ---------------------------------------------------------------------------
@pytest.mark.parametrize("n,W,r", [(10, 3, 1), (1000, 8, 7), (300_001, 2, 1), (5, 8, 6)])
def test_iteration_indices_and_getitem_agree(n, W, r):
    s = DistributedSampler(n, W, r, seed=42)
    s.set_epoch(3)
    as_list = list(s)
    arr = s.indices()
    assert as_list == arr.tolist()
    assert [s[k] for k in range(len(s))] == as_list
    assert [s[-k - 1] for k in range(min(len(s), 50))] == as_list[::-1][:50]
    for start, stop in [(0, 1), (2, 7), (len(s) // 2, len(s)), (-3, None), (5, 2), (0, 10**9)]:
        assert s.indices(start, stop).tolist() == as_list[start:stop]
    assert all(type(i) is int for i in as_list[:10])
    with pytest.raises(IndexError):
        s[len(s)]
    with pytest.raises(IndexError):
        s[-len(s) - 1]


def test_threaded_fill_equals_single_thread():
    s = DistributedSampler(10**8, 4, 2, seed=9)
    big = s.indices(1000, 1000 + 600_000)  # large enough to be split over threads
    old = fastshard.get_num_threads()
    try:
        fastshard.set_num_threads(1)
        assert fastshard.get_num_threads() == 1
        assert np.array_equal(big, s.indices(1000, 1000 + 600_000))
    finally:
        fastshard.set_num_threads(old)
    assert big.tolist()[:100] == [s[k] for k in range(1000, 1100)]


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here (Linux only)"
)
def test_default_threads_follow_the_cpu_affinity():
    # A process bound to one CPU (taskset, a container's cpuset, a launcher binding ranks to
    # cores) must not start a thread per CPU of the machine. Fresh processes: the default is
    # read once, at the first use.
    code = (
        "import os, sys\n"
        "cpus = sorted(os.sched_getaffinity(0))\n"
        "os.sched_setaffinity(0, cpus[:1] if sys.argv[1] == 'one' else cpus)\n"
        "import fastshard\n"
        "print(fastshard.get_num_threads(), len(os.sched_getaffinity(0)))\n"
    )
    for case in ("one", "all"):
        out = subprocess.run(
            [sys.executable, "-c", code, case],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tempfile.gettempdir(),  # never import fastshard from the source tree
        )
        assert out.returncode == 0, out.stderr
        threads, allowed = map(int, out.stdout.split())
        assert threads == allowed
        if case == "one":
            assert threads == 1


def test_iterator_is_lazy_and_restartable():
    s = DistributedSampler(10**12, 8, 5)
    it = iter(s)
    first = [next(it) for _ in range(1000)]
    assert first == s.indices(0, 1000).tolist()
    assert it.position == 1000
    assert [x for _, x in zip(range(1000), iter(s))] == first


@pytest.mark.parametrize("n", [10**12, 2**63 - 1])
def test_huge_n(n):
    s = DistributedSampler(n, 8, 3, seed=1)
    assert len(s) == math.ceil(n / 8)
    head = s.indices(0, 1000)
    assert len(np.unique(head)) == 1000 and head.min() >= 0 and head.max() < n
    assert s[-1] >= 0 and s[-1] < n
    assert [s[k] for k in range(0, 1000, 97)] == head[::97].tolist()


@linux_only
def test_huge_n_allocates_nothing_proportional_to_n():
    # Peak memory of a child that takes 1000 indices at n = 2**63 - 1 stays near its baseline.
    growth = child_peak_growth_kib(
        "s = fastshard.DistributedSampler(2**63 - 1, 8, 0)\n"
        "a = s.indices(0, 1000); b = list(iter(s).__next__() for _ in range(10))"
    )
    assert growth < 16 * 1024  # KiB


def test_two_processes_agree():
    code = (
        "import fastshard, json\n"
        "s = fastshard.DistributedSampler(123457, 4, 1, seed=2024)\n"
        "s.set_epoch(5)\n"
        "print(json.dumps(s.indices().tolist()))\n"
    )
    first, second = json.loads(run_python(code)), json.loads(run_python(code))
    s = DistributedSampler(123457, 4, 1, seed=2024)
    s.set_epoch(5)
    assert first == second == s.indices().tolist()


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 5000),
    W=st.integers(1, 20),
    data=st.data(),
    seed=st.integers(-(2**70), 2**70),
    epoch=st.integers(0, 2**64),
    drop_last=st.booleans(),
    pad=st.booleans(),
)
def test_property_rank_takes_its_positions(n, W, data, seed, epoch, drop_last, pad):
    rank = data.draw(st.integers(0, W - 1))
    s = DistributedSampler(n, W, rank, seed=seed, drop_last=drop_last, pad=pad)
    s.set_epoch(epoch)
    p = perm(n, seed, epoch)
    if drop_last:
        length = n // W
    elif pad:
        length = -(-n // W)
    else:
        length = len(range(rank, n, W))
    assert len(s) == length
    assert s.indices().tolist() == [int(p[(rank + k * W) % n]) for k in range(length)]


# -- numpy integers and defaults ------------------------------------------------------------------
def test_numpy_integers_accepted():
    s = DistributedSampler(np.int64(100), np.int32(4), np.uint8(3), seed=np.int64(7))
    s.set_epoch(np.int16(2))
    t = DistributedSampler(100, 4, 3, seed=7)
    t.set_epoch(2)
    assert list(s) == list(t)
    assert s[np.int64(-1)] == t[-1]
    assert s.indices(np.int64(1), np.uint16(5)).tolist() == t.indices(1, 5).tolist()
    s.set_epoch(np.int16(2))  # a second pass over the same epoch: say so (else a warning)
    t.set_epoch(2)
    assert list(BatchSampler(s, np.int64(3))) == list(BatchSampler(t, 3))


def test_sized_dataset_and_world_from_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    s = DistributedSampler(list(range(50)))
    assert (s.num_replicas, s.rank) == (4, 2) and len(s) == 13
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        DistributedSampler(50)
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="RANK"):
        DistributedSampler(50, num_replicas=2)


def test_repr():
    r = repr(DistributedSampler(100, 4, 1, seed=3))
    for part in ("n=100", "num_replicas=4", "rank=1", "seed=3", "epoch=0", "order='feistel'"):
        assert part in r


# -- bad input ------------------------------------------------------------------------------------
class NoLen:
    pass


class BadLen:
    def __len__(self):
        return -1


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(dataset=-1), ValueError, "length"),
        (dict(dataset=2**63), ValueError, "length"),
        (dict(dataset=3.0), TypeError, "dataset"),
        (dict(dataset=True), TypeError, "dataset"),
        (dict(dataset=NoLen()), TypeError, "dataset"),
        (dict(dataset=BadLen()), ValueError, "length"),
        (dict(num_replicas=0), ValueError, "num_replicas"),
        (dict(num_replicas=-2), ValueError, "num_replicas"),
        (dict(num_replicas=2.0), TypeError, "num_replicas"),
        (dict(rank=2), ValueError, "rank"),
        (dict(rank=-1), ValueError, "rank"),
        (dict(rank="0"), TypeError, "rank"),
        (dict(seed=1.5), TypeError, "seed"),
        (dict(seed="1"), TypeError, "seed"),
        (dict(order="random"), ValueError, "order"),
        (dict(order=None), ValueError, "order"),
        (dict(shuffle="yes"), TypeError, "shuffle"),
        (dict(drop_last=2), ValueError, "drop_last should be a boolean value"),
        (dict(drop_last=-1), ValueError, "drop_last"),
        (dict(shuffle=1.0), TypeError, "shuffle should be a boolean value"),
        (dict(pad=None), TypeError, "pad"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    args = dict(dataset=10, num_replicas=2, rank=0)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        DistributedSampler(**args)


def test_bad_epoch_index_and_batch_size():
    s = DistributedSampler(10, 2, 0)
    with pytest.raises(TypeError, match="epoch"):
        s.set_epoch(1.0)
    with pytest.raises(TypeError, match="index"):
        s[1.0]
    with pytest.raises(TypeError, match="start"):
        s.indices("0")
    for bs in (0, -1):
        with pytest.raises(ValueError, match="batch_size"):
            BatchSampler(s, bs)
    with pytest.raises(TypeError, match="batch_size"):
        BatchSampler(s, 2.0)
    with pytest.raises(TypeError, match="sampler"):
        BatchSampler(range(10), 2)


# -- BatchSampler ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n,W,bs", [(100, 3, 7), (10, 2, 5), (3, 4, 2), (1000, 1, 1000)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler(n, W, bs, drop_last):
    s = DistributedSampler(n, W, W - 1, seed=5)
    b = BatchSampler(s, bs, drop_last=drop_last)
    batches = list(b)
    flat = s.indices().tolist()  # not a second iteration of the epoch (that warns)
    keep = len(flat) - len(flat) % bs if drop_last else len(flat)
    assert [i for batch in batches for i in batch] == flat[:keep]
    assert len(b) == len(batches)
    assert all(len(x) == bs for x in batches[:-1])
    assert all(type(i) is int for batch in batches for i in batch)
    b.set_epoch(4)
    assert s.epoch == 4 and [i for x in b for i in x] == s.indices().tolist()[:keep]


def test_dataloader_integration():
    data = torch.arange(1000) * 10
    s = DistributedSampler(data, 2, 1, seed=1)
    s.set_epoch(1)
    loader = DataLoader(data, sampler=s, batch_size=16)
    got = torch.cat(list(loader)).tolist()
    assert got == [10 * i for i in s.indices().tolist()]
    s.set_epoch(1)  # the same epoch again, on purpose
    loader = DataLoader(data, batch_sampler=BatchSampler(s, 16))
    assert torch.cat(list(loader)).tolist() == got


def test_version():
    assert isinstance(fastshard.__version__, str) and fastshard.__version__.count(".") >= 2


# -- the inverse of the feistel order (Feistel::invert) ---------------------------------------
def feistel_points(n, seed, points, inverse=False, **kw):
    return _core._feistel_points(n, seed, 0, np.asarray(points, dtype=np.int64), inverse, **kw)


def test_feistel_invert_whole_small_domains():
    # The table (n <= 1024) and the bare network with cycle walking (table_max=0), any rounds.
    for n in [1, 2, 3, 5, 64, 1000, 1024, 1025, 2047, 2048, 2049, 5000]:
        x = np.arange(n)
        for kw in ({}, {"table_max": 0}, {"table_max": 0, "rounds": 3}):
            for seed in (0, 2**64 - 1):
                p = feistel_points(n, seed, x, **kw)
                assert np.array_equal(np.sort(p), x)
                assert np.array_equal(feistel_points(n, seed, p, inverse=True, **kw), x), (n, kw)
                assert np.array_equal(feistel_points(n, seed, x, inverse=True, **kw)[p], x)
    # apply is the sampler's order itself, so invert inverts the order samplers use.
    for n in (100, 1025, 65_537):
        assert np.array_equal(
            feistel_points(n, 3, np.arange(n)), _core.feistel_network(n, 3, 0, 1024)
        )


@pytest.mark.parametrize("n", [2**20 + 1, 10**9, 2**40 + 3, 2**62 + 12345, 2**63 - 1])
def test_feistel_invert_random_points_of_large_domains(n):
    rng = np.random.default_rng(n % 2**32)
    x = np.concatenate([rng.integers(0, n, 20_000), [0, 1, n - 2, n - 1]])
    for domain in (1, _core.PACKED_DOMAIN):
        p = feistel_points(n, 7, x, domain=domain)
        assert p.min() >= 0 and p.max() < n
        assert np.array_equal(feistel_points(n, 7, p, inverse=True, domain=domain), x)
        assert np.array_equal(
            feistel_points(n, 7, feistel_points(n, 7, x, True, domain=domain), domain=domain), x
        )


# A reference of the network in Python integers, from the algorithm feistel.hpp states (keys
# from SplitMix64 of derive_key, lowbias32 rounds adding mod 2^width, cycle walking). It pins
# the compiled kernels on either side of n = 2^32: up to there both halves have at most 16 bits
# and the rounds take a shortcut (feistel.cpp, "Narrow"); above it, the general rounds.
_M64, _M32 = 2**64 - 1, 2**32 - 1


def _xorshift_multiply(x, shifts, multipliers, mask):
    """x ^= x >> s, then x *= m, for each pair; then x ^= x >> (the last shift)."""
    for shift, m in zip(shifts, multipliers):
        x ^= x >> shift
        x = (x * m) & mask
    return x ^ (x >> shifts[-1])


def _mix64(x):  # mix.hpp's mix64 (SplitMix64's finalizer)
    return _xorshift_multiply(x, (30, 27, 31), (0xBF58476D1CE4E5B9, 0x94D049BB133111EB), _M64)


def _hash32(x):  # mix.hpp's hash32 (lowbias32)
    return _xorshift_multiply(x, (16, 15, 16), (0x7FEB352D, 0x846CA68B), _M32)


def _reference_network(n, seed, domain):
    h = _mix64(domain ^ 0x6A09E667F3BCC908)
    for word in (seed, 0, n):  # derive_key(domain, n, seed, epoch=0)
        h = _mix64(h ^ word)
    k = max((n - 1).bit_length(), 2)
    hi, lo = k - k // 2, k // 2
    keys = []
    for r in range(1, 9):  # SplitMix64(key): state += golden, then mix64
        w = _mix64((h + r * 0x9E3779B97F4A7C15) & _M64)
        keys.append((w & _M32, w >> 32))

    def encrypt(x):
        a, b, wa, wb = x >> lo, x & (2**lo - 1), hi, lo
        for kx, ka in keys:
            a, b = b, (a + _hash32(b ^ kx) + ka) % 2**wa
            wa, wb = wb, wa
        return (a << lo) | b  # eight rounds: the halves are back at their widths

    def apply(i):
        x = encrypt(i)
        while x >= n:
            x = encrypt(x)
        return x

    return apply


@pytest.mark.parametrize(
    "n", [2**20 + 1, 2**31 + 7, 2**32 - 5, 2**32, 2**32 + 1, 2**33 + 3, 2**34 - 1, 3 * 2**40 + 1]
)
def test_feistel_matches_a_reference_around_two_to_the_32(n):
    rng = np.random.default_rng(n % 2**32)
    x = np.concatenate([rng.integers(0, n, 300), [0, n - 1]])
    # Enough points that the kernels' pooled cycle walk runs (blocks of 128 lanes).
    apply = _reference_network(n, 11, 1)
    expected = np.array([apply(int(i)) for i in x], dtype=np.int64)
    assert np.array_equal(feistel_points(n, 11, x, domain=1), expected)
    assert np.array_equal(feistel_points(n, 11, expected, inverse=True, domain=1), x)
    assert not np.array_equal(feistel_points(n, 12, x, domain=1), expected)


def test_feistel_invert_fails_when_wrong():
    # The checks above are not vacuous: another key, another n or applying twice does not
    # invert, and points outside [0, n) are refused.
    n = 10**6
    x = np.arange(0, n, 37)
    p = feistel_points(n, 7, x)
    assert not np.array_equal(p, x)
    assert np.mean(feistel_points(n, 8, p, inverse=True) == x) < 0.01
    assert np.mean(feistel_points(n, 7, p) == x) < 0.01
    assert np.mean(feistel_points(n + 1, 7, p, inverse=True) == x) < 0.01
    assert np.mean(feistel_points(n, 7, p, inverse=True, rounds=7) == x) < 0.01
    for bad in ([n], [-1]):
        with pytest.raises(ValueError, match="points"):
            feistel_points(n, 7, bad)
