"""One rank of the multi-process tests in test_distributed.py (not collected by pytest).

    python dist_worker.py RANK WORLD_SIZE PORT

Joins a gloo process group on 127.0.0.1:PORT, runs every scenario in SCENARIOS in order on
that one group, and prints a single JSON line: {scenario: result}. After each scenario the
ranks make one sentinel all_reduce, so a scenario that left the ranks out of step (a rank
making a collective call the others did not) shows up as a wrong sentinel or a timeout.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import fastshard
from fastshard import (
    BatchSampler,
    DistributedSampler,
    InconsistentRanksError,
    MixtureSampler,
    WeightedDistributedSampler,
)

RANK, WORLD = 0, 1


# -- references, independent of the sampler's plan ---------------------------------------------
def permutation(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The epoch's order P: the one-rank sampler, whose whole epoch is P itself."""
    s = DistributedSampler(n, 1, 0, shuffle=shuffle, seed=seed, check_consistency=False)
    s.set_epoch(epoch)
    return s.indices()


def expected_shards(
    n: int, w: int, drop_last: bool, pad: bool, perm: np.ndarray
) -> list[list[int]]:
    """torch's plan: G[j] = P[j mod n] for j < total_size, rank r takes G[r], G[r + w], ..."""
    if not pad and not drop_last:
        total = n
    else:
        if drop_last and n % w:
            num_samples = max(0, -(-(n - w) // w))
        else:
            num_samples = -(-n // w)
        total = num_samples * w
    g = perm[np.arange(total) % n] if n else np.zeros(0, dtype=np.int64)
    return [g[r::w].tolist() for r in range(w)]


def summed_counts(indices: list[int], n: int) -> np.ndarray:
    """Per-item counts of every rank's indices, summed over the ranks (one all_reduce)."""
    counts = torch.bincount(torch.tensor(indices, dtype=torch.int64), minlength=n)
    dist.all_reduce(counts)
    return counts.numpy()


def gathered(value: int) -> list[int]:
    t = torch.tensor([value], dtype=torch.int64)
    out = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(out, t)
    return [int(x) for x in out]


# -- datasets for the DataLoader scenarios -------------------------------------------------------
class Indexed(Dataset):
    """Item i is (i, whether a process group looked initialised where the item was made).

    Every item also iterates ``probe`` (a sampler) inside the worker: a consistency check run
    there would call the collective that ``forbid_collectives`` replaced in each worker.
    """

    def __init__(self, n: int, probe: DistributedSampler) -> None:
        self.n = n
        self.probe = probe

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        next(iter(self.probe), None)
        return i, int(dist.is_available() and dist.is_initialized())


def _no_collectives(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a collective was called inside a DataLoader worker")


def forbid_collectives(worker_id: int) -> None:
    dist.all_gather = _no_collectives
    dist.broadcast = _no_collectives


# -- scenarios -----------------------------------------------------------------------------------
def defaults() -> dict[str, Any]:
    # The environment says something else on purpose: the process group must win.
    os.environ["WORLD_SIZE"], os.environ["RANK"] = "97", "96"
    try:
        s = DistributedSampler(1000)
    finally:
        del os.environ["WORLD_SIZE"], os.environ["RANK"]
    return {"num_replicas": s.num_replicas, "rank": s.rank}


def shards() -> dict[str, Any]:
    """Every config: the summed counts of all ranks' shards equal the plan's, and each rank's
    own sequence is its stride of the global sequence."""
    failures = []
    checked = 0
    for n in sorted({0, 1, WORLD - 1, WORLD + 1, 1000, 1001, 4099}):
        for shuffle in (True, False):
            for drop_last, pad in ((False, True), (True, True), (False, False)):
                for seed, epoch in ((0, 0), (2**64 + 5, 3)):
                    s = DistributedSampler(
                        n, shuffle=shuffle, seed=seed, drop_last=drop_last, pad=pad
                    )
                    s.set_epoch(epoch)
                    mine = list(s)  # through __iter__, so through the check as well
                    want = expected_shards(
                        n, WORLD, drop_last, pad, permutation(n, shuffle, seed, epoch)
                    )
                    want_counts = np.bincount(
                        np.concatenate([np.array(w, dtype=np.int64) for w in want]), minlength=n
                    )
                    got_counts = summed_counts(mine, n)
                    lengths = gathered(len(mine))
                    cfg = (n, shuffle, drop_last, pad, seed, epoch)
                    if not np.array_equal(got_counts, want_counts):
                        failures.append(f"{cfg}: summed counts differ from the plan's")
                    if lengths != [len(w) for w in want]:
                        failures.append(f"{cfg}: lengths {lengths} != {[len(w) for w in want]}")
                    if mine != want[RANK]:
                        failures.append(f"{cfg}: rank {RANK}'s sequence differs")
                    checked += 1
    return {"checked": checked, "failures": failures}


def _loader_epochs(context: str, workers: int, epochs: int = 2) -> dict[str, Any]:
    n = 997
    sampler = DistributedSampler(n, seed=11)
    probe = DistributedSampler(n, seed=11)  # never used here: pickled fresh to spawned workers
    loader = DataLoader(
        Indexed(n, probe),
        sampler=sampler,
        batch_size=13,
        num_workers=workers,
        persistent_workers=True,
        multiprocessing_context=context,
        worker_init_fn=forbid_collectives,
    )
    out: dict[str, Any] = {"epochs": []}
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        seen: list[int] = []
        flags: set[int] = set()
        for idx, flag in loader:
            seen += idx.tolist()
            flags.update(flag.tolist())
        want = expected_shards(n, WORLD, False, True, permutation(n, True, 11, epoch))
        want_counts = np.bincount(
            np.concatenate([np.array(w, dtype=np.int64) for w in want]), minlength=n
        )
        out["epochs"].append(
            {
                "counts_ok": bool(np.array_equal(summed_counts(seen, n), want_counts)),
                "mine_ok": seen == want[RANK],
                "group_in_worker": sorted(flags),
            }
        )
    del loader
    return out


def loader_fork() -> dict[str, Any]:
    return _loader_epochs("fork", 2)


def loader_spawn() -> dict[str, Any]:
    # One worker: each spawned process imports torch again, and one shows the sampler pickled.
    return _loader_epochs("spawn", 1)


def _expect_raise(make: Callable[[], Any]) -> dict[str, Any]:
    try:
        make()
    except InconsistentRanksError as e:
        return {"raised": type(e).__name__, "message": str(e), "fields": e.fields}
    return {"raised": None}


def guard_length() -> dict[str, Any]:
    n = 1001 if RANK == WORLD - 1 else 1000
    return _expect_raise(lambda: list(DistributedSampler(n)))


def guard_epoch() -> dict[str, Any]:
    """A rank that forgets set_epoch after an epoch that passed the check."""
    s = DistributedSampler(1000)
    first = len(list(s))
    if RANK != 1:
        s.set_epoch(1)
    out = _expect_raise(lambda: list(s))
    out["first_pass"] = first
    return out


def guard_batch_sampler() -> dict[str, Any]:
    s = DistributedSampler(1000)
    s.set_epoch(5 if RANK == 0 else 4)
    return _expect_raise(lambda: list(BatchSampler(s, 64)))


def guard_two_fields() -> dict[str, Any]:
    if RANK == 0:
        s = DistributedSampler(1000, seed=-1, drop_last=True)
    else:
        s = DistributedSampler(1000, seed=5)
    return _expect_raise(lambda: list(s))


def guard_in_loader() -> dict[str, Any]:
    """The check runs where the DataLoader iterates the sampler: in the main process."""
    s = DistributedSampler(500)
    s.set_epoch(RANK)
    loader = DataLoader(
        range(500), sampler=s, batch_size=10, num_workers=2, worker_init_fn=forbid_collectives
    )
    return _expect_raise(lambda: list(loader))


def guard_weights() -> dict[str, Any]:
    """Weighted sampling: ranks whose weights differ in one item."""
    w = np.linspace(0.5, 2.0, 5000)
    if RANK == WORLD - 1:
        w[1234] += 1e-6
    same = WeightedDistributedSampler(np.linspace(0.5, 2.0, 5000), 2000)
    first = len(list(same))  # agreeing ranks pass
    out = _expect_raise(lambda: list(WeightedDistributedSampler(w, 2000)))
    out["first_pass"] = first
    return out


def guard_mixture_weights() -> dict[str, Any]:
    """A mixture whose last rank has other weights; before that, agreeing ranks draw the
    global sequence's every W-th draw, the same as one process computes alone."""
    sizes = [30, 200, 1000]
    same = MixtureSampler(sizes, [0.2, 0.3, 0.5], 700, seed=4)
    mine = list(same)
    want = MixtureSampler(sizes, [0.2, 0.3, 0.5], 700, 1, 0, seed=4).indices()
    padded = np.concatenate([want, want])[: len(mine) * WORLD]
    weights = [0.2, 0.3, 0.5] if RANK != WORLD - 1 else [0.2, 0.35, 0.45]
    out = _expect_raise(lambda: list(MixtureSampler(sizes, weights, 700, seed=4)))
    out["first_pass_ok"] = mine == padded[RANK::WORLD].tolist()
    return out


def guard_checkpoint_on_some_ranks() -> dict[str, Any]:
    """The last rank forgot load_state_dict: it is at epoch 0, from the start."""
    donor = DistributedSampler(1000, check_consistency=False)
    donor.set_epoch(3)
    state = donor.state_dict(consumed=10)
    s = DistributedSampler(1000)
    if RANK != WORLD - 1:
        s.load_state_dict(state)
    out = _expect_raise(lambda: list(s))
    out["cursor"] = state["cursor"]
    return out


def guard_num_replicas() -> dict[str, Any]:
    """Rank 0 was told one more replica than the group has."""
    s = DistributedSampler(1000, num_replicas=WORLD + 1 if RANK == 0 else WORLD, rank=RANK)
    return _expect_raise(lambda: list(s))


def guard_sampler_kind() -> dict[str, Any]:
    """Rank 0 samples uniformly, the others by weight (the same n and seed)."""
    if RANK == 0:
        s: Any = DistributedSampler(1000)
    else:
        s = WeightedDistributedSampler(np.ones(1000))
    return _expect_raise(lambda: list(s))


def guard_block_round() -> dict[str, Any]:
    """The block order: the same cursor, but the last rank's interrupted round differs."""
    kw: dict[str, Any] = dict(order="block", block_size=4, window=2, seed=29)
    donor = DistributedSampler(300, 3, 0, check_consistency=False, **kw)
    state = donor.state_dict(consumed=11)
    other = {**state, "round": {**state["round"], "offset": state["round"]["offset"] - 1}}
    s = DistributedSampler(300, **kw)
    s.load_state_dict(other if RANK == WORLD - 1 else state)
    out = _expect_raise(lambda: list(s))
    out["codes"] = [fastshard._state.round_code(tuple(x["round"].values())) for x in (state, other)]
    return out


def guard_off() -> dict[str, Any]:
    s = DistributedSampler(1000 + RANK, check_consistency=False)
    s.set_epoch(RANK)
    return {"length": len(list(s)), "batches": len(list(BatchSampler(s, 100)))}


def guard_pickles() -> dict[str, Any]:
    s = DistributedSampler(1000, check_consistency=False, seed=3)
    t = pickle.loads(pickle.dumps(s))
    return {"check_consistency": t.check_consistency, "same": list(t) == list(s)}


def seed_none() -> dict[str, Any]:
    a = DistributedSampler(1001, seed=None)
    b = DistributedSampler(1001, seed=None)
    c = WeightedDistributedSampler(np.arange(1.0, 50.0), num_samples=301, seed=None)
    a.set_epoch(2)
    c.set_epoch(1)
    mine = list(a)  # passes the check: the seed is the same everywhere
    list(c)  # so does the weighted sampler's
    want = expected_shards(1001, WORLD, False, True, permutation(1001, True, a.seed, 2))
    return {
        "seeds_a": gathered(a.seed),
        "seeds_b": gathered(b.seed),
        "seeds_c": gathered(c.seed),
        "type": type(a.seed).__name__,
        "mine_ok": mine == want[RANK],
    }


def one_rank_evaluation() -> dict[str, Any]:
    """Rank 0 alone iterates samplers that are not sharded over the group (num_replicas=1),
    as an evaluation on rank 0 does; then every rank meets at a barrier with a timeout. A
    collective inside the samplers would leave rank 0 waiting in it and the others at the
    barrier: a hang, here a timeout error."""
    from fastshard import LengthGroupedBatchSampler

    seen = 0
    t0 = time.perf_counter()
    if RANK == 0:
        for make in (
            lambda: DistributedSampler(range(10), num_replicas=1, rank=0, shuffle=False),
            lambda: DistributedSampler(range(10), num_replicas=1, rank=0),
            lambda: WeightedDistributedSampler([1.0] * 10, num_replicas=1, rank=0),
            lambda: MixtureSampler([4, 6], [1, 1], num_replicas=1, rank=0),
            lambda: LengthGroupedBatchSampler([3] * 10, 2, num_replicas=1, rank=0),
        ):
            seen += len(list(make()))
        seen += len(list(BatchSampler(DistributedSampler(10, 1, 0), 3)))
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    return {"seen": seen, "barrier_seconds": time.perf_counter() - t0}


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    f.__name__: f
    for f in (
        defaults,
        shards,
        loader_fork,
        loader_spawn,
        guard_length,
        guard_epoch,
        guard_batch_sampler,
        guard_two_fields,
        guard_in_loader,
        guard_weights,
        guard_mixture_weights,
        guard_checkpoint_on_some_ranks,
        guard_num_replicas,
        guard_sampler_kind,
        guard_block_round,
        guard_off,
        guard_pickles,
        seed_none,
        one_rank_evaluation,
    )
}


def main(scenarios: dict[str, Callable[[], dict[str, Any]]] | None = None) -> None:
    """Run ``scenarios`` (default: SCENARIOS) on one gloo group; another worker script may
    pass its own."""
    global RANK, WORLD
    scenarios = SCENARIOS if scenarios is None else scenarios
    RANK, WORLD, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    skip = set(sys.argv[4].split(",")) if len(sys.argv) > 4 and sys.argv[4] else set()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=RANK,
        world_size=WORLD,
        # generous: a spawned DataLoader worker imports torch afresh, and CI machines are shared
        timeout=timedelta(seconds=120),
    )
    results: dict[str, Any] = {}
    for i, (name, scenario) in enumerate(scenarios.items(), start=1):
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            result = scenario()
        except Exception:
            result = {"error": traceback.format_exc()}
        result["seconds"] = time.perf_counter() - t0
        sentinel = torch.tensor([i], dtype=torch.int64)
        dist.all_reduce(sentinel)
        result["in_step"] = int(sentinel) == i * WORLD
        results[name] = result
    dist.destroy_process_group()
    print(json.dumps({"fastshard": fastshard.__file__, "results": results}))


if __name__ == "__main__":
    main()
