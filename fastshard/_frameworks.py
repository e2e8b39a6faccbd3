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

# How many frames above the sampler's iteration to look for accelerate's wrapper. The chain
# is short: fastshard's __iter__ <- torch's BatchSampler.__iter__ <- BatchSamplerShard's
# generator <- the DataLoader iterator's _next_index.
_DEPTH = 12
_ACCELERATE = "accelerate.data_loader"
# accelerate's classes that split one DataLoader's batches over its processes.
_SPLITTERS = ("BatchSamplerShard", "DataLoaderDispatcher")


class ReshardedError(RuntimeError):
    """A fastshard sampler that shards over ranks is being sharded again by a framework."""


def _accelerate_splitter(depth: int = _DEPTH) -> Any:
    """The accelerate object that is splitting the batches of the iteration that called us,
    if any."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        if frame.f_globals.get("__name__") == _ACCELERATE:
            owner = frame.f_locals.get("self")
            if type(owner).__name__ in _SPLITTERS:
                return owner
        frame = frame.f_back
    return None


def _processes(splitter: Any) -> int:
    n = getattr(splitter, "num_processes", None)
    if n is None:  # DataLoaderDispatcher keeps it in its state
        n = getattr(getattr(splitter, "state", None), "num_processes", None)
    return 1 if n is None else int(n)


def check_not_resharded(sampler: Any) -> None:
    """Raise ReshardedError when ``sampler`` shards over ranks (num_replicas > 1) and is
    iterated inside accelerate's batch splitting over several processes."""
    if sampler.num_replicas == 1:
        return
    splitter = _accelerate_splitter()
    if splitter is None:
        return
    processes = _processes(splitter)
    if processes < 2:
        return
    kind = type(sampler).__name__
    raise ReshardedError(
        f"fastshard.{kind}(num_replicas={sampler.num_replicas}, rank={sampler.rank}) is being "
        f"iterated by a DataLoader that accelerate prepared ({type(splitter).__name__}), which "
        f"splits the loader's batches over its {processes} processes again: each process would "
        f"train on 1/{processes} of its own shard, and all of them together on about "
        f"1/{processes} of the data. Under accelerate (and the transformers Trainer), build the "
        f"sampler as one global order and let accelerate split it: fastshard.{kind}(..., "
        "num_replicas=1, rank=0), the same seed on every process. See "
        "https://github.com/fastshard/fastshard/blob/main/docs/frameworks.md#accelerate"
    )
