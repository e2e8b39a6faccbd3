"""The samplers a bench case can measure, each behind one small adapter.

An adapter builds its sampler inside the timed region, as a training loop would, and imports
its library only when built: a child timing a Python list never imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

# (key, label, modes, kind): kind "sampler" is a sampler; "floor" is a reference that bounds
# what any sampler could do (iterate a ready list; iterate a range, creating one int per step
# as a sampler must; write an array of the same length).
SAMPLERS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("fastshard", "fastshard", ("iter", "array"), "sampler"),
    ("fastshard-torch", "fastshard order='torch'", ("iter", "array"), "sampler"),
    ("torch", "torch DistributedSampler", ("iter",), "sampler"),
    ("torchdata", "torchdata StatefulDistributedSampler", ("iter",), "sampler"),
    ("grain", "grain IndexSampler", ("iter",), "sampler"),
    ("list", "Python list (iteration floor)", ("iter",), "floor"),
    ("range", "Python range (iteration floor, new ints)", ("iter",), "floor"),
    ("arange", "np.arange (write floor)", ("array",), "floor"),
)
LABELS = {key: label for key, label, _, _ in SAMPLERS}


def _rank_length(n: int, world: int, rank: int) -> int:
    """torch's num_samples: ceil(n / world) (every rank, padding included)."""
    del rank
    return -(-n // world)


class _Adapter:
    """One sampler of one case: builds it inside the timed region, as a training loop would."""

    length: int
    counted: int | None = None  # items an adapter counted itself, where it must (grain)

    def prepare(self) -> None:
        """Untimed setup whose memory still counts (the floor's list)."""

    def iterate(self) -> Iterator[int]:
        raise NotImplementedError

    def array(self) -> Any:
        raise NotImplementedError


class _Fastshard(_Adapter):
    def __init__(self, n: int, world: int, rank: int, order: str) -> None:
        import fastshard

        self.cls = fastshard.DistributedSampler
        self.args = (n, world, rank)
        self.order = order
        self.length = len(self.cls(*self.args, order=order))

    def iterate(self) -> Iterator[int]:
        return iter(self.cls(*self.args, seed=0, order=self.order))

    def array(self) -> Any:
        return self.cls(*self.args, seed=0, order=self.order).indices()


class _Torch(_Adapter):
    def __init__(self, n: int, world: int, rank: int, stateful: bool) -> None:
        # Imported by name: torchdata ships no type information.
        if stateful:
            module = importlib.import_module("torchdata.stateful_dataloader.sampler")
            cls = module.StatefulDistributedSampler
        else:
            cls = importlib.import_module("torch.utils.data").DistributedSampler
        self.cls = cls
        self.args = (range(n), world, rank)  # a range is Sized and costs no memory
        self.length = len(cls(*self.args))

    def iterate(self) -> Iterator[int]:
        it: Iterator[int] = iter(self.cls(*self.args, shuffle=True, seed=0))
        return it


class _Grain(_Adapter):
    """grain's IndexSampler read as grain's own loader reads it: global index r, r + W, ..."""

    def __init__(self, n: int, world: int, rank: int) -> None:
        self.gp = importlib.import_module("grain.python")
        self.n, self.world, self.rank = n, world, rank
        # ShardOptions(drop_remainder=False) splits n evenly; the first n % W shards get one more.
        self.length = n // world + (1 if rank < n % world else 0)

    def iterate(self) -> Iterator[int]:
        gp = self.gp
        options = gp.ShardOptions(
            shard_index=self.rank, shard_count=self.world, drop_remainder=False
        )
        sampler = gp.IndexSampler(
            num_records=self.n, shard_options=options, shuffle=True, num_epochs=1, seed=0
        )
        return self._walk(sampler)

    def _walk(self, sampler: Any) -> Iterator[int]:
        self.counted = 0
        index = self.rank
        while True:
            try:
                record = sampler[index]
            except IndexError:
                return
            self.counted += 1
            yield record.record_key
            index += self.world


class _ListFloor(_Adapter):
    def __init__(self, n: int, world: int, rank: int) -> None:
        self.length = _rank_length(n, world, rank)
        self.items: list[int] = []

    def prepare(self) -> None:
        self.items = list(range(self.length))

    def iterate(self) -> Iterator[int]:
        return iter(self.items)


class _RangeFloor(_Adapter):
    """One new int per step, as a sampler creates: values from 1000, past the small-int cache."""

    def __init__(self, n: int, world: int, rank: int) -> None:
        self.length = _rank_length(n, world, rank)

    def iterate(self) -> Iterator[int]:
        return iter(range(1000, 1000 + self.length))


class _ArangeFloor(_Adapter):
    def __init__(self, n: int, world: int, rank: int) -> None:
        import numpy as np

        self.np = np
        self.length = _rank_length(n, world, rank)

    def array(self) -> Any:
        return self.np.arange(self.length, dtype=self.np.int64)


def _adapter(sampler: str, n: int, world: int, rank: int) -> _Adapter:
    if sampler == "fastshard":
        return _Fastshard(n, world, rank, "feistel")
    if sampler == "fastshard-torch":
        return _Fastshard(n, world, rank, "torch")
    if sampler == "torch":
        return _Torch(n, world, rank, stateful=False)
    if sampler == "torchdata":
        return _Torch(n, world, rank, stateful=True)
    if sampler == "grain":
        return _Grain(n, world, rank)
    if sampler == "list":
        return _ListFloor(n, world, rank)
    if sampler == "range":
        return _RangeFloor(n, world, rank)
    if sampler == "arange":
        return _ArangeFloor(n, world, rank)
    raise ValueError(f"unknown sampler {sampler!r}")
