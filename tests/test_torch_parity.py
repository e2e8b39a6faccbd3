"""fastshard.DistributedSampler against torch.utils.data.distributed.DistributedSampler.

Compatibility as a checked property, in three parts:

- the checks torch's own test suite makes of its sampler (invalid rank, no duplicated data with
  drop_last, padding under a real process group of 1-4 ranks, reproducibility over epochs),
  written here in our own words and run against order="torch" and the default order;
- a grid that compares, in this process, every attribute torch's sampler has, ``len()`` and
  (with order="torch") every index, over lengths 0, 1, n < W, primes and large n, world sizes
  1-8, every rank, both flags, seeds negative and >= 2**63, and several epochs; with the
  default order every index is checked against torch's plan instead (the same positions,
  another permutation);
- what torch accepts and refuses as arguments, and the start of what it says, for
  DistributedSampler and for WeightedRandomSampler against WeightedDistributedSampler.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, WeightedRandomSampler
from torch.utils.data.distributed import DistributedSampler as TorchSampler

import fastshard
from fastshard import DistributedSampler, WeightedDistributedSampler

from .test_distributed import child_env, kill_group

# The default order first: the one users get without asking.
ORDERS = ["feistel", "torch"]
ATTRIBUTES = (
    "dataset",
    "num_replicas",
    "rank",
    "epoch",
    "num_samples",
    "total_size",
    "shuffle",
    "seed",
    "drop_last",
)


def plan(n: int, W: int, drop_last: bool) -> tuple[int, int]:
    """torch's (num_samples, total_size), in exact integers (torch computes them in float)."""
    if drop_last and n % W:
        k = -(-(n - W) // W)  # ceil((n - W) / W); 0 when n < W
    else:
        k = -(-n // W)
    return k, k * W


def check_plan(shards: list[list[int]], n: int, W: int, drop_last: bool) -> None:
    """The shards of all ranks are torch's plan over some order P of range(n): interleaved
    (rank r takes positions r, r + W, ...) they form G with G[j] = P[j mod n]."""
    k, total = plan(n, W, drop_last)
    assert [len(s) for s in shards] == [k] * W
    g = np.array(shards, dtype=np.int64).reshape(W, k).T.reshape(total)
    head = g[:n]
    assert ((head >= 0) & (head < n)).all() and len(np.unique(head)) == len(head)
    if total >= n:  # padded (or exact): every item, then the order again from its start
        assert len(head) == n  # n distinct values in range(n): all of them
        assert np.array_equal(g[n:], g[np.arange(n, total) % n])


# -- torch's own checks, in our words -----------------------------------------------------------
@pytest.mark.parametrize("order", ORDERS)
def test_invalid_rank_says_what_torch_says(order):
    data = torch.IntTensor(range(10))
    for W, r in ((3, 3), (3, -1), (1, 1), (0, 0), (-2, 0)):
        with pytest.raises(ValueError) as theirs:
            TorchSampler(data, W, r)
        with pytest.raises(ValueError) as ours:
            DistributedSampler(data, W, r, order=order)
        if W < 1:
            # torch blames the rank ("in the interval [0, -1]"): ours names num_replicas
            # first, and keeps torch's words after it for code that searches them.
            assert str(ours.value).startswith(f"num_replicas must be at least 1, got {W}")
            assert str(theirs.value) in str(ours.value)
            continue
        # torch's whole message first (code matches on it), then what we add
        assert str(ours.value).startswith(str(theirs.value)), (W, r, str(ours.value))
        assert len(str(ours.value)) > len(str(theirs.value))


def test_invalid_rank_from_torchrun_says_where_it_came_from(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(
        ValueError, match=r"^Invalid rank 5, rank should be in the interval \[0, 1\]: .*environment"
    ):
        DistributedSampler(10)


@pytest.mark.parametrize("order", ORDERS)
def test_drop_last_batches_hold_no_duplicates(order):
    # 9 items over 4 ranks: each rank's 3 indices include padding, but batches of 2 with
    # drop_last=True take only positions 0-7 of the epoch: no item twice over all ranks.
    ranks, items = 4, 9
    data = torch.IntTensor(range(items))
    seen = []
    for r in range(ranks):
        s = DistributedSampler(data, ranks, r, order=order)
        for batch in DataLoader(data, batch_size=items // ranks, drop_last=True, sampler=s):
            seen.append(batch)
    scanned = torch.cat(seen)
    assert scanned.numel() == 8 and scanned.unique().numel() == scanned.numel()


@pytest.mark.parametrize("order", ORDERS)
def test_reproducible_over_epochs(order):
    data = torch.IntTensor(range(50))
    a = DistributedSampler(data, 3, 1, seed=7, order=order)
    b = DistributedSampler(data, 3, 1, seed=7, order=order)
    epochs = []
    for e in range(3):
        a.set_epoch(e)
        b.set_epoch(e)
        epochs.append(list(a))
        assert list(b) == epochs[-1]  # same seed and epoch: same order, sampler to sampler
    assert len({tuple(x) for x in epochs}) == 3  # a fresh order every epoch
    a.set_epoch(1)
    assert list(a) == epochs[1]  # an epoch's order comes back when the epoch does
    # Two interleaved iterators of one sampler each yield the whole epoch.
    a.set_epoch(1)
    its = (iter(a), iter(a))
    got: tuple[list[int], list[int]] = ([], [])
    for _ in range(len(a)):
        for i in (0, 1):
            got[i].append(next(its[i]))
    assert got[0] == got[1] == epochs[1]
    # torch's reproducibility test iterates one sampler twice without set_epoch. That warns
    # (EpochWarning); under warnings-as-errors (this suite's setting) the user guide's filter
    # lets it run.
    a.set_epoch(2)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=fastshard.EpochWarning)
        assert list(a) + list(a) == epochs[2] * 2


PADDING_CHILD = r"""
import json, sys
from datetime import timedelta
import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler as TorchSampler
from fastshard import DistributedSampler

rank, most, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
out = {}
for W in range(rank + 1, most + 1):  # this process is rank `rank` of every world larger than it
    dist.init_process_group(
        "gloo", init_method=f"file://{store}{W}", rank=rank, world_size=W,
        timeout=timedelta(seconds=120),
    )
    # the sizes of torch's test: 100 + W + 1 items, and a tiny max(W // 2 - 1, 1) items
    for name, n in (("medium", 100 + W + 1), ("tiny", max(W // 2 - 1, 1))):
        data = list(range(n))
        for drop_last in (False, True):
            theirs = TorchSampler(data, drop_last=drop_last)
            for order in ("feistel", "torch"):
                s = DistributedSampler(data, drop_last=drop_last, order=order)
                got = list(s)  # also runs the rank-consistency check (an all_gather)
                k = torch.tensor([s.num_samples])
                ks = [torch.zeros(1, dtype=torch.int64) for _ in range(W)]
                dist.all_gather(ks, k)
                shards = [None] * W
                dist.all_gather_object(shards, got)
                out[f"{W}/{name}/{drop_last}/{order}"] = dict(
                    n=n, num_replicas=s.num_replicas, rank=s.rank, num_samples=s.num_samples,
                    total_size=s.total_size, len=len(s), got=got, shards=shards,
                    all_num_samples=[int(x) for x in ks],
                    torch=list(theirs), torch_num_samples=theirs.num_samples,
                )
    dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.mark.skipif(
    sys.platform == "win32", reason="ranks run in POSIX process groups, as in test_distributed.py"
)
def test_padding_under_a_process_group_of_1_to_4_ranks():
    # As torch's distributed test: num_replicas and rank from the group, every rank the same
    # num_samples (gathered), drop_last truncating and padding filling, also when the dataset
    # has fewer items than ranks. Four processes serve worlds 1-4 (rank r joins every world
    # above r), each world on its own file store.
    most = 4
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", PADDING_CHILD, str(r), str(most), f"{tmp}/store"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=child_env(),
                cwd=tmp,
                start_new_session=True,
            )
            for r in range(most)
        ]
        finished = []
        try:
            for p in procs:
                try:
                    finished.append(p.communicate(timeout=240))
                except subprocess.TimeoutExpired:
                    finished.append(("", "timed out"))
        finally:
            for p in procs:
                kill_group(p)
    for r, (p, (_, err)) in enumerate(zip(procs, finished)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{err[-3000:]}"
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in finished]
    checked = 0
    for W in range(1, most + 1):
        for name, drop_last, order in itertools.product(("medium", "tiny"), (False, True), ORDERS):
            key = f"{W}/{name}/{drop_last}/{order}"
            ranks = [results[r][key] for r in range(W)]
            n = ranks[0]["n"]
            k, total = plan(n, W, drop_last)
            for r, res in enumerate(ranks):
                assert (res["num_replicas"], res["rank"]) == (W, r)
                assert res["num_samples"] == res["len"] == len(res["got"]) == k
                assert res["torch_num_samples"] == k and res["total_size"] == total
                assert res["all_num_samples"] == [k] * W
                assert res["shards"] == [x["got"] for x in ranks]
                if order == "torch":
                    assert res["got"] == res["torch"]
            check_plan([x["got"] for x in ranks], n, W, drop_last)
            checked += 1
    assert checked == 4 * 8


# -- the grid ------------------------------------------------------------------------------------
GRID_N = [0, 1, 2, 3, 5, 7, 8, 13, 16, 31, 97, 1000, 1031]
GRID_W = range(1, 9)
# negative, >= 2**63 and 2**64 - 1 (where seed + epoch leaves manual_seed's [-2**63, 2**64))
SEEDS = [0, 1, 2**32 + 7, 2**63, 2**64 - 1, -1, -5, -(2**63)]
EPOCHS = [0, 1, 2, 3]


def compare(ours: DistributedSampler, theirs: TorchSampler) -> None:
    assert ours.dataset is theirs.dataset
    for name in ATTRIBUTES[1:]:
        a, b = getattr(ours, name), getattr(theirs, name)
        assert (a, type(a)) == (b, type(b)), (name, a, b)
    assert len(ours) == len(theirs)


def run_grid(dataset, widths, seeds, epochs) -> int:
    """Compare every (W, rank, shuffle, drop_last, seed, epoch); the number of cases."""
    n = len(dataset)
    cases = 0
    for W, shuffle, drop_last in itertools.product(widths, (True, False), (False, True)):
        for seed in seeds:
            theirs = [TorchSampler(dataset, W, r, shuffle, seed, drop_last) for r in range(W)]
            ours = {
                order: [
                    DistributedSampler(dataset, W, r, shuffle, seed, drop_last, order=order)
                    for r in range(W)
                ]
                for order in ORDERS
            }
            for s in ours["feistel"] + ours["torch"]:
                compare(s, theirs[s.rank])
            for epoch in epochs:
                try:
                    for t in theirs:
                        t.set_epoch(epoch)
                    expected = [list(t) for t in theirs]
                # manual_seed refuses seed + epoch outside [-2**63, 2**64): ValueError, and on
                # torch <= 2.5 RuntimeError ("Overflow when unpacking long") above 2**64 - 1
                except (ValueError, RuntimeError):
                    assert shuffle and not -(2**63) <= seed + epoch < 2**64
                    for s in ours["torch"]:
                        with pytest.raises(ValueError, match=r"seed \+ epoch"):
                            s.set_epoch(epoch)
                    expected = None
                for order, samplers in ours.items():
                    if expected is None and order == "torch":
                        continue
                    for s in samplers:
                        s.set_epoch(epoch)
                        compare(s, theirs[s.rank])
                    shards = [list(s) for s in samplers]
                    if order == "torch":
                        assert expected is None or shards == expected, (n, W, seed, epoch)
                    else:
                        check_plan(shards, n, W, drop_last)
                cases += W
    return cases


@pytest.mark.parametrize("n", GRID_N)
def test_grid_against_torch(n):
    cases = run_grid(range(n), GRID_W, SEEDS, EPOCHS)
    assert cases == sum(GRID_W) * 4 * len(SEEDS) * len(EPOCHS)


def test_grid_large_n():
    # A prime beyond 10**5: long enough that a wrong wrap or stride shows in many places.
    # One world size and seed only: torch's own sampler takes ~40 ms per rank and epoch here.
    assert run_grid(range(100_003), (7,), (2**63,), (0, 1)) == 7 * 4 * 2


@pytest.mark.parametrize("n", [2**31 - 1, 2**53 + 1, 2**61 - 1, 2**63 - 1])
def test_lengths_beyond_torchs_float_arithmetic(n):
    # torch computes num_samples as math.ceil(len / num_replicas) in float, exact only while the
    # quotient is: for 2**61 - 1 items on one rank it says 2**61. Ours are exact integers,
    # torch's formula without the rounding; where torch is exact the two agree.
    for W in (1, 3, 7, 8):
        for r, drop_last in itertools.product(sorted({0, W - 1}), (False, True)):
            dataset = range(n)
            ours = DistributedSampler(dataset, W, r, drop_last=drop_last, order="torch")
            assert (ours.num_samples, ours.total_size) == plan(n, W, drop_last)
            assert len(ours) == ours.num_samples
            if n < 2**53:
                compare(ours, TorchSampler(dataset, W, r, drop_last=drop_last))
            assert ours._shard is None  # no order was built to answer


# -- arguments: what torch accepts and refuses ---------------------------------------------------
@pytest.mark.parametrize(
    "dataset",
    [torch.IntTensor([7]), torch.tensor([[3]]), np.array([5]), torch.arange(4)[:1], [9]],
    ids=["IntTensor([7])", "tensor([[3]])", "array([5])", "view", "list"],
)
def test_a_dataset_of_one_integer_is_one_item(dataset):
    # Anything with __len__ is a dataset, never a length, as torch's sampler sees it.
    for order in ORDERS:
        ours = DistributedSampler(dataset, 1, 0, order=order)
        theirs = TorchSampler(dataset, 1, 0)
        compare(ours, theirs)
        assert len(ours) == 1 and list(ours) == [0]


@pytest.mark.parametrize("dataset", [torch.tensor(5), np.array(5)], ids=["0-d tensor", "0-d array"])
def test_an_unsized_array_is_refused(dataset):
    with pytest.raises(TypeError):
        TorchSampler(dataset, 1, 0)  # torch calls len(): TypeError
    with pytest.raises(TypeError, match=r"Sized object or an int length; len\(\) of this"):
        DistributedSampler(dataset, 1, 0)


@pytest.mark.parametrize("n", [5, np.int64(5), np.uint8(5)], ids=["int", "int64", "uint8"])
def test_an_integer_scalar_is_a_length(n):
    # fastshard's shortcut (torch needs a Sized dataset): only ints and NumPy integer scalars.
    s = DistributedSampler(n, 2, 1, order="torch")
    assert s.num_samples == 3 and list(s) == list(TorchSampler(range(5), 2, 1))
    for bad in (True, np.True_, 5.0):
        with pytest.raises(TypeError, match="dataset"):
            DistributedSampler(bad, 2, 1)


FLAG_VALUES = [True, False, 1, 0, np.True_, np.False_, np.int64(1), np.uint8(0)]


@pytest.mark.parametrize("value", FLAG_VALUES, ids=repr)
@pytest.mark.parametrize("name", ["shuffle", "drop_last"])
def test_flags_torch_accepts(name, value):
    # torch reads its flags by truth value: 0 and 1 and NumPy bools mean one thing each.
    theirs = TorchSampler(range(11), 3, 2, **{name: value})
    ours = DistributedSampler(range(11), 3, 2, order="torch", **{name: value})
    assert getattr(ours, name) is bool(value)  # stored as a bool (torch keeps what it got)
    assert getattr(ours, name) == getattr(theirs, name)
    assert len(ours) == len(theirs) and list(ours) == list(theirs)
    for flag in ("pad", "check_consistency", "auto_epoch"):  # the same rule for our own flags
        assert getattr(DistributedSampler(11, 3, 2, **{flag: value}), flag) is bool(value)


@pytest.mark.parametrize(
    "value,exc",
    [
        ("yes", TypeError),
        ("False", TypeError),
        (1.0, TypeError),
        (None, TypeError),
        ([1], TypeError),
        (2, ValueError),
        (-1, ValueError),
        (np.int64(2), ValueError),
    ],
    ids=repr,
)
@pytest.mark.parametrize("name", ["shuffle", "drop_last", "pad"])
def test_flags_that_mean_nothing_clear_are_refused(name, value, exc):
    # torch would take "False" as true and None as false; we say what is wrong instead.
    with pytest.raises(exc, match=rf"^{name} should be a boolean value, but got {name}="):
        DistributedSampler(11, 3, 2, **{name: value})


# -- WeightedDistributedSampler against WeightedRandomSampler -----------------------------------
WEIGHTS = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]


@pytest.mark.parametrize("num_samples", [1, 5, 6, 40])
@pytest.mark.parametrize("replacement", [True, False])
def test_weighted_takes_what_torch_takes(num_samples, replacement):
    if not replacement and num_samples > len(WEIGHTS):
        # torch finds out when it draws (torch.multinomial); we refuse it up front
        with pytest.raises(RuntimeError):
            list(WeightedRandomSampler(WEIGHTS, num_samples, replacement))
        with pytest.raises(ValueError, match="positive weights"):
            WeightedDistributedSampler(WEIGHTS, num_samples, replacement, 1, 0)
        return
    theirs = WeightedRandomSampler(WEIGHTS, num_samples, replacement)
    ours = WeightedDistributedSampler(WEIGHTS, num_samples, replacement, 1, 0)
    assert len(ours) == len(theirs) == ours.num_draws == num_samples
    assert ours.replacement == theirs.replacement
    drawn = list(ours)
    assert len(drawn) == num_samples and all(0 <= i < len(WEIGHTS) for i in drawn)
    if not replacement:
        assert len(set(drawn)) == num_samples


@pytest.mark.parametrize(
    "num_samples,exc",
    [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError), ("3", TypeError)],
    ids=repr,
)
def test_weighted_num_samples_refused_with_torchs_words(num_samples, exc):
    with pytest.raises(ValueError) as theirs:  # torch: ValueError for every bad num_samples
        WeightedRandomSampler(WEIGHTS, num_samples)
    with pytest.raises(exc) as ours:
        WeightedDistributedSampler(WEIGHTS, num_samples, num_replicas=1, rank=0)
    assert str(ours.value).startswith(str(theirs.value))


@pytest.mark.parametrize(
    "value,exc", [("no", TypeError), (None, TypeError), (1.0, TypeError), (2, ValueError)]
)
def test_weighted_replacement_refused_with_torchs_words(value, exc):
    with pytest.raises(ValueError) as theirs:
        WeightedRandomSampler(WEIGHTS, 3, value)
    with pytest.raises(exc) as ours:
        WeightedDistributedSampler(WEIGHTS, 3, value, 1, 0)
    assert str(ours.value).startswith(str(theirs.value))


@pytest.mark.parametrize("value", [1, 0, np.True_, np.False_], ids=repr)
def test_weighted_replacement_takes_0_1_and_numpy_bools(value):
    # torch's WeightedRandomSampler refuses these (it wants a bool); our flags take them, as
    # torch's DistributedSampler does. Code written for torch never passes them, so nothing
    # that works with torch breaks.
    with pytest.raises(ValueError, match="replacement should be a boolean value"):
        WeightedRandomSampler(WEIGHTS, 3, value)
    ours = WeightedDistributedSampler(WEIGHTS, 3, value, 1, 0)
    assert ours.replacement is bool(value)


def test_weighted_refuses_a_generator_where_torch_takes_one():
    g = torch.Generator().manual_seed(0)
    assert len(WeightedRandomSampler(WEIGHTS, 3, True, g)) == 3
    with pytest.raises(TypeError, match=r"takes no generator.*seed="):
        WeightedDistributedSampler(WEIGHTS, 3, True, g)
    with pytest.raises(TypeError, match="generator"):
        WeightedDistributedSampler(WEIGHTS, 3, True, generator=g)  # type: ignore[call-arg]
