"""What fastshard knows of the training frameworks that handle samplers themselves.

Lightning, Ray Train and Composer recognise a sampler that already shards over ranks by
``isinstance(sampler, torch.utils.data.distributed.DistributedSampler)``, which every
fastshard sampler is. accelerate (and the transformers ``Trainer`` built on it) instead
shards every DataLoader it prepares by batches, whatever its sampler: a fastshard sampler
that shards over ranks too would have each rank train on ``1 / num_processes`` of its own
shard. That case is refused at the start of the iteration, with the way that works.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import torch.distributed as dist

# How many frames above the sampler's iteration to look for accelerate's wrapper. The usual
# chain is short: fastshard's __iter__ <- torch's BatchSampler.__iter__ <- BatchSamplerShard's
# generator <- the DataLoader iterator's _next_index. The longest seen is about 12: a
# StatefulDataLoader's workers prefetching from inside DataLoaderDispatcher.__init__.
_DEPTH = 24
_ACCELERATE = "accelerate.data_loader"
# accelerate's classes that split one DataLoader's batches over its processes.
_SPLITTERS = ("BatchSamplerShard", "DataLoaderDispatcher")


class ReshardedError(RuntimeError):
    """A fastshard sampler that shards over ranks is being sharded again by a framework.

    A sampler with ``num_replicas > 1`` already yields only this rank's share. accelerate's
    ``prepare`` splits a DataLoader's batches over the processes once more (and its
    ``dispatch_batches`` mode reads the sampler on process 0 only), so each process would
    train on ``1 / world_size`` of its shard. Instead, iterating the sampler (or
    ``set_epoch``) raises this error on every process; it names the fix: build the sampler
    with ``num_replicas=1, rank=0`` (one global order that accelerate splits), or do not
    prepare the DataLoader. See the frameworks guide.

    Examples
    --------
    ::

        sampler = fastshard.DistributedSampler(dataset)        # shards over the ranks
        loader = accelerator.prepare(DataLoader(dataset, sampler=sampler, batch_size=8))
        next(iter(loader))                                     # raises ReshardedError

        sampler = fastshard.DistributedSampler(dataset, num_replicas=1, rank=0)
        loader = accelerator.prepare(DataLoader(dataset, sampler=sampler, batch_size=8))
    """


def _accelerate_splitter(splitters: tuple[str, ...], depth: int = _DEPTH) -> Any:
    """The accelerate object that is splitting the batches of the iteration that called us,
    if any."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        if frame.f_globals.get("__name__") == _ACCELERATE:
            owner = frame.f_locals.get("self")
            if type(owner).__name__ in splitters:
                return owner
        frame = frame.f_back
    return None


def _processes(splitter: Any) -> int:
    n = getattr(splitter, "num_processes", None)
    if n is None:  # DataLoaderDispatcher keeps it in its state
        n = getattr(getattr(splitter, "state", None), "num_processes", None)
    if n is None:
        # DataLoaderDispatcher.__init__ already iterates the loader before it has a state:
        # with use_stateful_dataloader=True it calls StatefulDataLoader.state_dict(), which
        # starts the workers and prefetches batches. accelerate's processes are the process
        # group's.
        n = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return int(n)


def accelerate_split(splitters: tuple[str, ...] = _SPLITTERS) -> tuple[str, int]:
    """(the accelerate class splitting the calling iteration's batches, its number of
    processes), or ("", 0) when no accelerate splitter is iterating us.

    ``BatchSamplerShard`` runs on every process (each iterates the whole batch sampler and
    keeps its share); ``DataLoaderDispatcher`` iterates the loader on process 0 only and
    sends the batches to the others. A dataset passes its own ``splitters``: accelerate's
    ``IterableDatasetShard`` iterates an IterableDataset on every process and keeps 1/W.
    """
    splitter = _accelerate_splitter(splitters)
    if splitter is None:
        return "", 0
    return type(splitter).__name__, _processes(splitter)


def check_not_resharded(sampler: Any, splitter: str, processes: int) -> None:
    """Raise ReshardedError when ``sampler`` shards over ranks (num_replicas > 1) and
    accelerate splits it over several processes again (``splitter, processes`` from
    :func:`accelerate_split`): when a ``BatchSamplerShard`` iterates it, and when a
    ``DataLoaderDispatcher`` iterates it or sets its epoch (which every process does at the
    start of each iteration, while only process 0 iterates the sampler: so every process
    raises, not only process 0)."""
    if sampler.num_replicas == 1 or processes < 2:
        return
    kind = type(sampler).__name__
    raise ReshardedError(
        f"fastshard.{kind}(num_replicas={sampler.num_replicas}, rank={sampler.rank}) is being "
        f"used by a DataLoader that accelerate prepared ({splitter}), which "
        f"splits the loader's batches over its {processes} processes again: each process would "
        f"train on 1/{processes} of its own shard, and all of them together on about "
        f"1/{processes} of the data. Under accelerate (and the transformers Trainer), build the "
        f"sampler as one global order and let accelerate split it: fastshard.{kind}(..., "
        "num_replicas=1, rank=0), the same seed on every process. See "
        "https://github.com/fastshard/fastshard/blob/main/docs/frameworks.md#accelerate"
    )


# Where Lightning rebuilds a DataLoader's batch sampler (as cls(sampler, batch_size=...,
# drop_last=...)); in predict it always does, even with use_distributed_sampler=False.
_LIGHTNING = ("lightning.pytorch.utilities.data", "pytorch_lightning.utilities.data")
_REBUILD = "_dataloader_init_kwargs_resolve_sampler"


def lightning_predict_original(kind: type) -> Any:
    """The batch sampler of class ``kind`` that Lightning's predict loop is rebuilding, when
    the caller's constructor runs inside that rebuild; else None.

    Lightning's predict loop rebuilds every batch sampler with the DataLoader's own
    ``sampler`` (a SequentialSampler when the loader was given a batch_sampler), which
    carries nothing of the fastshard configuration; the original batch sampler is still on
    the DataLoader being rebuilt, and is what the rebuilt one must continue.
    """
    frame: FrameType | None = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name == _REBUILD and frame.f_globals.get("__name__") in _LIGHTNING:
            if not frame.f_locals.get("is_predicting"):
                return None
            original = getattr(frame.f_locals.get("dataloader"), "batch_sampler", None)
            return original if isinstance(original, kind) else None
        frame = frame.f_back
    return None
