"""order="torch": bit-identical to torch.utils.data.distributed.DistributedSampler."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from fastshard import BatchSampler, DistributedSampler, EpochWarning, _core

from .conftest import linux_only

# Where torch.randperm switches from Fisher-Yates to the inside-out shuffle (UINT32_MAX // 20).
INSIDE_OUT_FROM = 214_748_364


def torch_indices(n, W, r, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    s = TorchSampler(
        range(n), num_replicas=W, rank=r, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    s.set_epoch(epoch)
    return list(s), len(s)


def ours(n, W, r, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    s = DistributedSampler(n, W, r, shuffle=shuffle, seed=seed, drop_last=drop_last, order="torch")
    s.set_epoch(epoch)
    return s


def torch_randperm(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).numpy()


# -- an independent reference: the two shuffles written out over raw mt19937 draws ---------------
def mt19937_draws(seed, count):
    # RandomState(int) seeds MT19937 with init_genrand(seed), and randint over the full 32-bit
    # range returns the raw outputs; test_reference_draws_are_torchs checks both against torch.
    return np.random.RandomState(seed % 2**32).randint(0, 2**32, size=count, dtype=np.uint32)


def reference_fisher_yates(n, seed):
    d = mt19937_draws(seed, max(n - 1, 0))
    r = list(range(n))
    for i in range(n - 1):
        z = i + int(d[i]) % (n - i)
        r[i], r[z] = r[z], r[i]
    return np.array(r, dtype=np.int64)


def reference_inside_out(n, seed):
    d = mt19937_draws(seed, 2 * n).astype(np.uint64)
    r = [0] * n
    for i in range(n):
        z = ((int(d[2 * i]) << 32) | int(d[2 * i + 1])) % (i + 1)
        r[i] = r[z]
        r[z] = i
    return np.array(r, dtype=np.int64)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 1000])
@pytest.mark.parametrize("seed", [0, 7, 2**32 + 7, 2**64 - 1, -1, -(2**63)])
def test_reference_draws_are_torchs(n, seed):
    assert np.array_equal(reference_fisher_yates(n, seed), torch_randperm(n, seed))


def test_torch_seeds_with_the_low_32_bits():
    # The facts the order relies on, checked on this torch.
    assert np.array_equal(torch_randperm(500, 7), torch_randperm(500, 2**32 + 7))
    assert np.array_equal(torch_randperm(500, -1), torch_randperm(500, 2**64 - 1))
    assert not np.array_equal(torch_randperm(500, 7), torch_randperm(500, 8))


@pytest.mark.parametrize("n", [0, 1, 2, 5, 64, 1000, 2049, 100_003])
@pytest.mark.parametrize("seed", [0, 1, 2**31, 2**32 - 1])
def test_randperm_matches_torch(n, seed):
    assert np.array_equal(_core.torch_randperm(n, seed), torch_randperm(n, seed))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 257, 1000, 3001])
@pytest.mark.parametrize("seed", [0, 12345, 2**32 - 1])
def test_both_algorithms_match_the_reference(n, seed):
    # torch uses inside-out only from n = 214,748,364 on; forcing it on small n lets the
    # reference check it cheaply (the slow test checks it against torch itself).
    assert np.array_equal(
        _core.torch_randperm(n, seed, "inside_out"), reference_inside_out(n, seed)
    )
    assert np.array_equal(
        _core.torch_randperm(n, seed, "fisher_yates"), reference_fisher_yates(n, seed)
    )


def test_randperm_arguments():
    with pytest.raises(ValueError, match="algorithm"):
        _core.torch_randperm(5, 0, "sattolo")
    with pytest.raises(TypeError):
        _core.torch_randperm(5, 2**32)


# -- the sampler against torch's -----------------------------------------------------------------
# The grid of lengths, world sizes, ranks, flags, seeds and epochs against torch's class is
# tests/test_torch_parity.py::test_grid_against_torch.


def test_seed_and_epoch_add_like_torch():
    # Only seed + epoch matters, as in torch: (5, 3) and (7, 1) are the same order.
    a = ours(1000, 4, 1, seed=5, epoch=3)
    b = ours(1000, 4, 1, seed=7, epoch=1)
    assert list(a) == list(b) == torch_indices(1000, 4, 1, seed=7, epoch=1)[0]
    # A seed beyond 2**64 is fine while seed + epoch is in range.
    c = ours(1000, 4, 1, seed=2**64, epoch=-1)
    assert list(c) == torch_indices(1000, 4, 1, seed=2**64, epoch=-1)[0]


@pytest.mark.parametrize("seed, epoch", [(2**64 - 1, 1), (2**64, 0), (-(2**63), -1), (-(2**70), 3)])
def test_out_of_range_seed_is_refused_like_torch(seed, epoch):
    with pytest.raises((ValueError, RuntimeError)):
        torch.Generator().manual_seed(seed + epoch)
    s = DistributedSampler(100, 2, 0, seed=seed, order="torch")
    with pytest.raises(ValueError, match=r"seed \+ epoch"):
        s.set_epoch(epoch)
    assert s.epoch == 0  # a refused epoch changes nothing
    with pytest.raises(ValueError, match=r"seed \+ epoch"):
        s.epoch = epoch  # assigning the epoch is set_epoch: refused alike
    assert s.epoch == 0


def test_out_of_range_seed_is_fine_without_shuffle():
    # torch never seeds a generator when shuffle=False, so it takes any seed; so do we.
    s = ours(10, 2, 1, shuffle=False, seed=2**70, epoch=0)
    assert list(s) == torch_indices(10, 2, 1, shuffle=False, seed=2**70)[0]


def test_feistel_is_unaffected_by_the_torch_seed_range():
    s = DistributedSampler(100, 2, 0, seed=2**64 - 1)
    s.set_epoch(1)
    assert len(list(s)) == 50


@pytest.mark.parametrize(
    "n, W, r, drop_last", [(1031, 8, 5, False), (1031, 8, 0, True), (3, 5, 4, False)]
)
def test_access_paths_agree(n, W, r, drop_last):
    s = ours(n, W, r, seed=11, epoch=2, drop_last=drop_last)
    expected = torch_indices(n, W, r, seed=11, epoch=2, drop_last=drop_last)[0]
    assert list(s) == expected
    assert s.indices().tolist() == expected
    assert s.indices(3, 40).tolist() == expected[3:40]
    assert s.indices(-7).tolist() == expected[-7:]
    assert [s[k] for k in range(len(s))] == expected
    assert [s[-k] for k in range(1, len(s) + 1)] == expected[::-1]
    for size in (1, 4, 7):
        for drop in (False, True):
            s.set_epoch(2)  # the same epoch again, on purpose (else a warning)
            batches = list(BatchSampler(s, size, drop_last=drop))
            flat = [i for b in batches for i in b]
            keep = len(expected) - len(expected) % size if drop else len(expected)
            assert flat == expected[:keep]
            assert all(len(b) == size for b in batches[: keep // size])


def test_set_epoch_changes_the_order_and_caches_it():
    s = ours(5000, 4, 2, seed=3)
    first = list(s)
    with pytest.warns(EpochWarning, match="set_epoch"):
        assert list(s) == first  # the same epoch again: the same order (and a warning)
    s.set_epoch(1)
    second = list(s)
    assert second == torch_indices(5000, 4, 2, seed=3, epoch=1)[0]
    assert second != first


@pytest.mark.parametrize(
    "n, W, drop_last, pad",
    [(1000, 8, False, True), (1003, 8, True, True), (1003, 8, False, False), (3, 5, False, True)],
)
@pytest.mark.parametrize("cursor", [0, 1, 17, 999])
def test_cursor_follows_the_plan(n, W, drop_last, pad, cursor):
    # Whatever positions the plan gives a rank (resume re-shards from a cursor), the torch
    # order maps each position j to P(j mod n), P = torch.randperm: the identity order of the
    # same plan gives j mod n.
    seed, epoch = 21, 2
    perm = torch_randperm(n, seed + epoch)
    for r in range(W):
        args = (n, W, r, drop_last, pad, cursor)
        got = _core.Shard(*args, "torch", seed, epoch)
        pos = _core.Shard(*args, "identity", seed, epoch)
        assert len(got) == len(pos)
        assert np.array_equal(got.indices(0, len(got)), perm[pos.indices(0, len(pos))])


def test_order_name_is_checked():
    with pytest.raises(ValueError, match="order"):
        DistributedSampler(10, 1, 0, order="Torch")
    with pytest.raises(ValueError, match="order"):
        _core.Shard(10, 1, 0, False, True, 0, "torch2", 0, 0)


# -- memory ----------------------------------------------------------------------------------------
MEMORY_CHILD = r"""
import sys
import fastshard

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

n, W = int(sys.argv[1]), int(sys.argv[2])
warm = fastshard.DistributedSampler(1000, W, 0, order="torch")  # import everything lazy first
next(iter(warm)); warm.indices(); warm[0]
before = status("VmRSS")
s = fastshard.DistributedSampler(n, W, W - 1, order="torch", seed=3)
first = next(iter(s))
after = status("VmRSS")
peak = status("VmHWM")
print(before, after, peak, len(s))
"""


@linux_only
def test_only_the_rank_share_stays_in_memory():
    n, W = 20_000_000, 8
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(n), str(W)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    assert proc.returncode == 0, proc.stderr
    before, after, peak, num_samples = map(int, proc.stdout.split())
    assert num_samples == n // W
    kept = after - before
    # The rank's share is 4 bytes per item, n / W items (10 MB). Allow twice that: keeping the
    # permutation (4 * n = 80 MB) or widening the share to int64 would still fail.
    assert kept < 2 * 4 * n // W, kept
    # The transient peak is the 32-bit permutation plus the share; 1.5x catches int64 storage.
    assert peak - before < 1.5 * (4 * n + 4 * n // W), peak - before


# -- torch's second algorithm, at its threshold -----------------------------------------------------
@pytest.mark.slow
def test_inside_out_at_the_threshold_matches_torch(request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("20-60 s and 3 GB of memory: run with -m slow")
    n, W, seed, epoch = INSIDE_OUT_FROM, 8, 2**32 + 5, 1
    t0 = time.perf_counter()
    perm = torch_randperm(n, seed + epoch)  # int64, 1.7 GB
    t_torch = time.perf_counter() - t0
    for r, drop_last in ((7, False), (0, True)):
        t0 = time.perf_counter()
        s = ours(n, W, r, seed=seed, epoch=epoch, drop_last=drop_last)
        got = s.indices()
        t_ours = time.perf_counter() - t0
        total = len(s) * W
        assert len(s) == (n // W if drop_last else -(-n // W))
        assert np.array_equal(got, perm[np.arange(r, total, W) % n])
        print(
            f"n={n} rank={r} drop_last={drop_last}: torch.randperm {t_torch:.1f} s, "
            f"fastshard sampler {t_ours:.1f} s"
        )
        del s, got


def test_lengths_do_not_build_the_permutation():
    # 2**40 items would need terabytes: len(), num_samples, total_size and state_dict come
    # from the plan alone.
    s = DistributedSampler(2**40, 8, 3, order="torch")
    assert len(s) == s.num_samples == 2**37 and s.total_size == 2**40
    assert s.state_dict(consumed=5)["cursor"] == 40
    assert s._shard is None
