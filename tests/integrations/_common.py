"""Shared by the framework jobs in this folder (each one a script its framework's own launcher
runs on 2 CPU ranks over gloo; tests/test_integrations.py starts them and reads the report).

The dataset's items carry their index, the model records the indices of every batch it
trains on, and at the end of each epoch the ranks all-gather what they saw; rank 0 writes
one JSON report the test asserts on.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

# A process of a job prints every thread's stack when sent SIGUSR1, as tests/conftest.py's
# launcher does to each one before it kills a hung job; forked DataLoader workers inherit it.
if hasattr(signal, "SIGUSR1"):
    faulthandler.register(signal.SIGUSR1, all_threads=True)

N = 1000  # items in the dataset
BATCH = 10  # per rank
TIMEOUT = timedelta(seconds=120)  # for every collective the jobs make


class IndexDataset(Dataset):
    """Item i is (i, a feature vector): training records i."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"idx": torch.tensor(i), "x": torch.full((4,), float(i) / self.n)}


def gather(seen: list[int]) -> list[list[int]]:
    """Every rank's list of indices, on every rank."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, seen)
    return out


def flat(lists: list[list[int]]) -> list[int]:
    return [i for part in lists for i in part]


def summary(per_rank: list[list[int]], n: int = N) -> dict[str, Any]:
    """What the ranks together trained on: counts against the dataset."""
    counts = Counter(i for seen in per_rank for i in seen)
    return {
        "per_rank": [len(s) for s in per_rank],
        "total": sum(len(s) for s in per_rank),
        "distinct": len(counts),
        "repeated": sum(1 for c in counts.values() if c > 1),
        "out_of_range": sum(1 for i in counts if not 0 <= i < n),
        "first": [s[:8] for s in per_rank],
    }


# A two-dataset mixture over the N items: [0, 600) and [600, N), at equal weights, N draws
# per epoch: 500 from each (the second dataset's 400 items each drawn once or twice).
MIX_SIZES, MIX_WEIGHTS = [600, N - 600], [1, 1]


def mixture_counts(per_rank: list[list[int]]) -> dict[str, Any]:
    """How many draws of each mixture dataset the ranks trained on, and the spread of the
    second dataset's per-item counts."""
    items = [i for seen in per_rank for i in seen]
    second = Counter(i for i in items if i >= MIX_SIZES[0])
    return {
        "per_dataset": [sum(1 for i in items if i < MIX_SIZES[0]), sum(second.values())],
        "second_counts": sorted(set(second.values())),
    }


# A token corpus for PackedSampler: 400 documents of 1-60 tokens whose every token is its own
# global position, so a row's input_ids say exactly which tokens were trained on.
SEQ_LEN, PACKED_BATCH = 32, 4
DOC_LENGTHS = [(d * 37) % 60 + 1 for d in range(400)]


def corpus() -> tuple[Any, Any, Any]:
    """(tokens, offsets, lengths) as NumPy arrays."""
    import numpy as np

    lengths = np.array(DOC_LENGTHS, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.arange(offsets[-1], dtype=np.int64), offsets, lengths


def token_summary(per_rank: list[list[int]], rows: int) -> dict[str, Any]:
    """What the ranks trained on, in tokens: concat rows hold seq_len distinct tokens each, so
    an epoch of `rows` rows trains rows * seq_len distinct tokens, none twice (padding repeats
    whole rows, so a repeated token shows as one)."""
    counts = Counter(t for seen in per_rank for t in seen)
    return {
        "per_rank": [len(s) for s in per_rank],
        "distinct": len(counts),
        "expected": rows * SEQ_LEN,
        "out_of_range": sum(1 for t in counts if not 0 <= t < sum(DOC_LENGTHS)),
        "first": [s[:8] for s in per_rank],
    }


def report(path: str | os.PathLike[str], results: dict[str, Any]) -> None:
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    results = results | {"start_method": multiprocessing.get_start_method(allow_none=True)}
    Path(path).write_text(json.dumps(results, indent=1))


def error_text(err: BaseException) -> dict[str, Any]:
    return {"error": type(err).__name__, "message": str(err)}


def start_workers_by_forkserver(*preload: str) -> None:
    """Start this job's DataLoader workers from a forkserver instead of forking the rank.

    A rank runs the process group's threads; a fork while one of them holds CPython 3.11's
    interpreter-list lock deadlocks the child before any of its code runs (gh-112275), and
    the other rank then waits in its next collective (a Lightning job hung that way in CI, in
    the scenario that starts fresh workers every epoch). The forkserver is a process of its
    own with one thread, started once, that imports ``preload`` (this job's libraries) and
    forks each worker from there. A worker imports the job's script again as
    ``__mp_main__``, so each job runs its scenarios under ``if __name__ == "__main__"``.
    docs/frameworks.md gives users the same advice.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return  # Windows: spawn, its default, forks nothing either
    multiprocessing.set_forkserver_preload(["torch", "numpy", "fastshard", "_common", *preload])
    multiprocessing.set_start_method("forkserver", force=True)


# Seconds after which a stage's stacks are dumped (the slowest stage takes about 60 s on a
# loaded 2-core machine; the job's launcher kills it at 420 s).
STAGE_STACKS_AFTER = 180


def run(name: str, fn: Any, results: dict[str, Any], barrier: bool = True) -> None:
    """results[name] = fn(), or the error it raised (reported, and asserted on by the test).
    With ``barrier``, the ranks meet afterwards, so they stay in step whatever a scenario
    did (the Lightning job has none: its first scenario starts the process group)."""
    # A stage that stalls dumps every thread's stack to stderr (which the test prints when the
    # job is killed at its timeout), so a hang names the stage and where it waits.
    faulthandler.dump_traceback_later(STAGE_STACKS_AFTER, repeat=False)
    try:
        results[name] = fn()
    except Exception as err:
        results[name] = error_text(err)
    finally:
        faulthandler.cancel_dump_traceback_later()
    if barrier:
        dist.barrier()


# fastshard.ShardedStream over the same N items, as uneven shards (one empty): shard s holds
# items [offset_s, offset_s + size_s), read front to back.
STREAM_SIZES = [300, 0, 17, 250, 1, 432]
_STREAM_OFFSETS = [sum(STREAM_SIZES[:s]) for s in range(len(STREAM_SIZES))]


def stream_read(shard: int, start: int, stop: int) -> Any:
    """The ShardedStream reader: IndexDataset's items of rows [start, stop) of a shard."""
    base = _STREAM_OFFSETS[shard]
    return (IndexDataset()[base + row] for row in range(start, stop))
