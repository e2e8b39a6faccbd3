"""The samplers: thin Python classes over the compiled shard engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from . import _core, _validate, _world

ORDERS = ("feistel",)


class DistributedSampler(Sampler[int]):
    """Drop-in replacement for :class:`torch.utils.data.distributed.DistributedSampler`.

    Every rank computes only its own indices, each in O(1) time and memory, for datasets of
    up to ``2**63 - 1`` items. The plan is torch's: ``num_samples = ceil(n / num_replicas)``
    (``n // num_replicas`` with ``drop_last=True``), padding wraps to the start of the epoch's
    order, and rank ``r`` takes positions ``r, r + num_replicas, ...`` of it.

    Parameters
    ----------
    dataset : Sized or int
        The dataset, or its length.
    num_replicas, rank : int, optional
        Default to the initialised process group, else to ``WORLD_SIZE`` / ``RANK``.
    shuffle : bool
        ``False`` takes the items in order.
    seed : int
        Any Python int; reduced modulo ``2**64``.
    drop_last : bool
        Truncate to a multiple of ``num_replicas`` instead of padding.
    order : {"feistel"}
        ``"feistel"``: a keyed bijection of ``[0, n)``, a fresh one for every (n, seed, epoch).
    pad : bool
        ``False`` (with ``drop_last=False``): no repeats; every item exactly once, shard
        lengths differ by at most one. For evaluation.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        order: str = "feistel",
        pad: bool = True,
    ) -> None:
        self.dataset = dataset
        self._n = _validate.length(dataset)
        self.num_replicas, self.rank = _world.resolve(num_replicas, rank)
        if self.num_replicas > _validate.MAX_LENGTH:
            raise ValueError(f"num_replicas must be <= 2**63 - 1, got {self.num_replicas}")
        self.shuffle = _validate.flag(shuffle, "shuffle")
        self.seed = _validate.integer(seed, "seed")
        self.drop_last = _validate.flag(drop_last, "drop_last")
        self.pad = _validate.flag(pad, "pad")
        if not isinstance(order, str) or order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        self.order = order
        self.epoch = 0
        self._shard: _core.Shard | None = None

    # -- the epoch's shard ------------------------------------------------------------------
    def _current(self) -> _core.Shard:
        # Read once into a local: another thread's set_epoch may reset self._shard meanwhile.
        shard = self._shard
        if shard is None:
            shard = self._shard = _core.Shard(
                self._n,
                self.num_replicas,
                self.rank,
                self.drop_last,
                self.pad,
                0,
                self.order if self.shuffle else "identity",
                self.seed % 2**64,
                self.epoch % 2**64,
            )
        return shard

    def __getstate__(self) -> dict[str, Any]:
        # The compiled shard is a cache (rebuilt on demand) and cannot be pickled.
        state = self.__dict__.copy()
        state["_shard"] = None
        return state

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the sampler yields (any int, reduced modulo 2**64)."""
        self.epoch = _validate.integer(epoch, "epoch")
        self._shard = None

    # -- torch's attributes -----------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """This rank's number of indices per epoch."""
        return len(self._current())

    @property
    def total_size(self) -> int:
        """Indices per epoch over all ranks (``num_samples * num_replicas`` unless pad=False)."""
        return self._current().total_size

    def __len__(self) -> int:
        return len(self._current())

    # -- access -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        it: Iterator[int] = self._current().iter(0)
        return it

    def indices(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """This rank's indices ``[start, stop)`` of the epoch as a new int64 array.

        ``start`` and ``stop`` follow slice rules (negative values count from the end,
        out-of-range values are clipped). Large ranges are filled by several threads.
        """
        start = 0 if start is None else _validate.integer(start, "start")
        stop = None if stop is None else _validate.integer(stop, "stop")
        shard = self._current()
        lo, hi, _ = slice(start, stop).indices(len(shard))
        return shard.indices(lo, max(lo, hi))

    def __getitem__(self, k: int) -> int:
        """This rank's k-th index of the epoch (negative k counts from the end)."""
        k = _validate.integer(k, "index")
        shard = self._current()
        n = len(shard)
        if not -n <= k < n:  # checked here: beyond int64 the compiled call cannot take k at all
            raise IndexError(f"index {k} is out of range for a shard of {n} items")
        return shard[k]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n={self._n}, num_replicas={self.num_replicas}, "
            f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}, "
            f"drop_last={self.drop_last}, order={self.order!r}, pad={self.pad}, "
            f"num_samples={self.num_samples})"
        )


class BatchSampler(Sampler[list[int]]):
    """Batches of a fastshard sampler, each built in C++ in one call.

    Use as ``DataLoader(dataset, batch_sampler=BatchSampler(sampler, batch_size))``.
    ``set_epoch`` is forwarded to the sampler.
    """

    def __init__(self, sampler: DistributedSampler, batch_size: int, drop_last: bool = False) -> None:
        if not isinstance(sampler, DistributedSampler):
            raise TypeError(
                "sampler must be a fastshard sampler, got "
                f"{type(sampler).__name__}; use torch.utils.data.BatchSampler for other samplers"
            )
        self.sampler = sampler
        self.batch_size = _validate.in_range(batch_size, "batch_size", 1, _validate.MAX_LENGTH)
        self.drop_last = _validate.flag(drop_last, "drop_last")

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        shard = self.sampler._current()
        size = self.batch_size
        end = len(shard) - len(shard) % size if self.drop_last else len(shard)
        for start in range(0, end, size):
            yield shard.batch(start, min(start + size, end))

    def __repr__(self) -> str:
        return f"BatchSampler({self.sampler!r}, batch_size={self.batch_size}, drop_last={self.drop_last})"
