"""The samplers: thin Python classes over the compiled shard engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from . import _core, _validate, _world

ORDERS = ("feistel", "torch")

# torch.Generator.manual_seed accepts [-2**63, 2**64); order="torch" seeds with seed + epoch.
_TORCH_SEED_MIN, _TORCH_SEED_MAX = -(2**63), 2**64 - 1


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
        Any Python int; reduced modulo ``2**64``. With ``order="torch"``, ``seed + epoch``
        must lie in ``[-2**63, 2**64)`` as for :meth:`torch.Generator.manual_seed`.
    drop_last : bool
        Truncate to a multiple of ``num_replicas`` instead of padding.
    order : {"feistel", "torch"}
        ``"feistel"``: a keyed bijection of ``[0, n)``, a fresh one for every (n, seed, epoch).
        ``"torch"``: exactly the indices of torch's sampler for the same arguments, seed and
        epoch. It costs what torch's order costs by nature: torch's shuffle is sequential, so
        the epoch's whole permutation is built (in C++) when the epoch is first used, in O(n)
        time and 4 bytes per item of transient memory (8 above ``2**32`` items); then only
        this rank's ``num_samples`` items are kept. The default order costs O(1) time and
        memory per index and nothing up front.
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
    def _check_torch_seed(self, epoch: int) -> None:
        # torch.Generator.manual_seed(seed + epoch) refuses values outside [-2**63, 2**64);
        # wrapping them silently would yield an order torch never produces.
        if self.order == "torch" and self.shuffle:
            value = self.seed + epoch
            if not _TORCH_SEED_MIN <= value <= _TORCH_SEED_MAX:
                raise ValueError(
                    f'order="torch" seeds torch.Generator.manual_seed(seed + epoch), which '
                    f"needs a value in [-2**63, 2**64 - 1]; seed + epoch = {self.seed} + "
                    f"{epoch} = {value}"
                )

    def _current(self) -> _core.Shard:
        if self._shard is None:
            self._check_torch_seed(self.epoch)
            self._shard = _core.Shard(
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
        return self._shard

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the sampler yields (any int, reduced modulo 2**64)."""
        epoch = _validate.integer(epoch, "epoch")
        self._check_torch_seed(epoch)
        self.epoch = epoch
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
        return self._current()[_validate.integer(k, "index")]

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
