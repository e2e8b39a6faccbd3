"""Weighted distributed sampling: draws from weights, sharded over ranks like a permutation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import _core, _validate
from ._sampler import _ShardSampler


def _as_float64(weights: Any, copy: bool = False) -> np.ndarray:
    """The weights as a contiguous 1-D float64 array, converted without a Python loop.

    ``copy=True``: always a new array, never a view of the caller's array or tensor (which
    ``np.ascontiguousarray`` and ``Tensor.numpy()`` return for float64 input).
    """
    arr = _validate.host_array(weights, "weights", "numbers")
    if arr.dtype.kind in "OSU" and arr.ndim == 1:
        # NumPy keeps Python ints beyond 64 bits as objects, and strings as text: name the one.
        items = list(weights) if isinstance(weights, (list, tuple)) else arr.tolist()
        for i, v in enumerate(items):
            if not isinstance(v, (int, float, np.number)):
                raise TypeError(
                    f"weights[{i}] = {v!r} is not a number ({type(v).__name__}); weights must "
                    "be numbers"
                )
            try:
                float(v)
            except OverflowError:
                raise ValueError(
                    f"weights[{i}] is an int of {len(str(abs(v)))} digits, too large for "
                    "float64 (about 1.8e308 at most); scale the weights down"
                ) from None
        arr = arr.astype(np.float64)
    if arr.dtype.kind not in "biuf":
        raise TypeError(
            f"weights must be numbers (a float, int or bool dtype), got dtype {arr.dtype}"
        )
    if arr.ndim != 1:
        raise ValueError(f"weights must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("weights must not be empty")
    if copy:
        return np.array(arr, dtype=np.float64, order="C", copy=True)
    return np.ascontiguousarray(arr, dtype=np.float64)


def _num_draws(num_samples: Any, replacement: bool, n: int, positive: int) -> int:
    """The epoch's global number of draws: ``num_samples``, by default n with replacement and
    the number of positive weights without. A bad value gets torch's WeightedRandomSampler
    message first, then what is wrong with it."""
    if num_samples is None:
        return n if replacement else positive
    torch_says = (
        f"num_samples should be a positive integer value, but got num_samples={num_samples}"
    )
    try:
        k = _validate.integer(num_samples, "num_samples")
    except TypeError as err:
        raise TypeError(f"{torch_says}: {err}") from None
    if k < 1:
        raise ValueError(torch_says)
    if not replacement and k > positive:
        # torch finds this only when it draws (a RuntimeError from torch.multinomial)
        raise ValueError(
            f"num_samples must be at most the number of positive weights ({positive}) "
            f"without replacement, got {k}"
        )
    if k > _validate.MAX_LENGTH:
        raise ValueError(f"num_samples must be in [1, 2**63 - 1], got {k}")
    return k


class WeightedDistributedSampler(_ShardSampler):
    """Weighted sampling for distributed training, for any number of items.

    The epoch is a global sequence of ``num_samples`` draws; rank ``r`` of ``W`` takes draws
    ``r, r + W, ...`` (``ceil(num_samples / W)`` each, or ``num_samples // W`` with
    ``drop_last``), so the first ``num_samples`` draws of an epoch are the same for any
    number of ranks, and random access, ``indices()``, ``BatchSampler`` and (elastic)
    resume work as for :class:`DistributedSampler`.

    With replacement, draw ``j`` is computed in O(1) from (seed, epoch, j) by a counter-based
    generator and a Walker alias table built once (8 bytes per item for up to 2**32 items,
    16 above; nothing per epoch). Without replacement, the epoch is the first
    ``num_samples`` items of a weighted random order (Efraimidis-Spirakis), computed once per
    epoch in O(n log n) time and O(n) memory.

    Parameters
    ----------
    weights : sequence of float
        n >= 1 finite, non-negative numbers with a positive sum (list, NumPy array of any
        numeric dtype, CPU tensor).
    num_samples : int, optional
        The epoch's global number of draws (default n). Note: the attribute ``num_samples``
        is, as for :class:`DistributedSampler`, this rank's count; the global one is
        ``num_draws``.
    replacement : bool
        Draw with replacement (default) or without.
    num_replicas, rank, seed, drop_last
        As for :class:`DistributedSampler` (``seed=None``: a random seed drawn on rank 0 and
        broadcast; needs a process group).
    check_consistency : bool
        With a process group, check once per epoch that all ranks agree on the
        configuration, including a 64-bit checksum of the weights.
    auto_epoch : bool
        As for :class:`DistributedSampler`: advance the epoch on each new iteration after
        one that ran to its end (default ``False``: warn once instead).

    Raises
    ------
    ValueError
        A weight is negative, NaN or infinite; all are zero; their sum overflows; or
        ``num_samples`` is not in ``[1, 2**63 - 1]`` (without replacement: at most the number
        of positive weights).
    TypeError
        ``weights`` are not numbers or not 1-D, or a ``torch.Generator`` is passed where
        ``num_replicas`` goes (``WeightedRandomSampler``'s fourth argument: use ``seed``).

    Examples
    --------
    A class-balanced epoch of 8 draws over 2 ranks (item 0 is never drawn):

    >>> sampler = fastshard.WeightedDistributedSampler(
    ...     [0.0, 1.0, 3.0], num_samples=8, num_replicas=2, rank=0, seed=0
    ... )
    >>> len(sampler), sampler.num_draws, list(sampler)
    (4, 8, [2, 1, 2, 1])

    Without replacement: a weighted random order of the items with a positive weight.

    >>> sampler = fastshard.WeightedDistributedSampler(
    ...     [1.0, 2.0, 0.0, 4.0], replacement=False, num_replicas=1, rank=0
    ... )
    >>> list(sampler)
    [3, 1, 0]
    """

    def __init__(
        self,
        weights: Any,
        num_samples: int | None = None,
        replacement: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int | None = 0,
        drop_last: bool = False,
        *,
        check_consistency: bool = True,
        auto_epoch: bool = False,
    ) -> None:
        self.replacement = _validate.flag(replacement, "replacement")
        # Without replacement the sampler keeps the weights for every epoch: it owns a copy,
        # so later edits to the caller's array or tensor change no draw, cannot bypass the
        # validation below or leave the checksum stale, and cannot race with the C++ reader
        # (which runs without the GIL). With replacement only the alias table is kept: the
        # check, the checksum and the table in one C++ call (one pass over the weights fewer);
        # the table is None if the checks below fail.
        w = _as_float64(weights, copy=not self.replacement)
        if self.replacement:
            first_invalid, total, positive, checksum, table = _core.weights_table(w)
        else:
            first_invalid, total, positive, checksum = _core.summarize_weights(w)
        if first_invalid >= 0:
            v = w[first_invalid]
            what = "NaN" if np.isnan(v) else ("infinite" if np.isinf(v) else "negative")
            raise ValueError(
                f"weights[{first_invalid}] = {v!r} is {what}; weights must be finite and >= 0"
            )
        if positive == 0:
            raise ValueError("weights are all zero; at least one must be positive")
        if not np.isfinite(total):
            raise ValueError("the sum of the weights overflows float64; scale them down")
        self._n = len(w)
        # torch's DistributedSampler has a `dataset`, and code that finds an instance of it
        # may read len(sampler.dataset): the items the draws index, as a lazy range.
        self.dataset = range(self._n)
        self.num_draws = _num_draws(num_samples, self.replacement, self._n, positive)
        if isinstance(num_replicas, torch.Generator):
            # WeightedRandomSampler(weights, num_samples, replacement, generator) positionally
            raise TypeError(
                "WeightedDistributedSampler takes no generator: its fourth argument is "
                "num_replicas. Its draws come from seed and the epoch, the same on every rank "
                "and in every resumed run; pass seed=... instead of a torch.Generator"
            )
        self._set_shared_arguments(
            num_replicas, rank, seed, drop_last, check_consistency, auto_epoch
        )
        self.weights_checksum = int(checksum)
        self.shuffle = True
        if self.replacement:
            self._table: Any = table
            self._weights: np.ndarray | None = None  # the table replaces them
        else:
            self._table = None
            self._weights = w
        self._start_pass()

    def _plan_args(self) -> tuple[int, bool, bool]:
        return self.num_draws, self.drop_last, True

    def _make_shard(self, cursor: int) -> _core.Shard:
        args = (self.num_draws, self.num_replicas, self.rank, self.drop_last, True, cursor)
        key = (self.seed % 2**64, self.epoch % 2**64)
        if self._weights is None:
            return _core.weighted_shard(self._table, *args, *key)
        return _core.weighted_order_shard(self._weights, *args, *key)

    def _config(self) -> dict[str, Any]:
        return {
            "n": self._n,
            "num_samples": self.num_draws,
            "replacement": self.replacement,
            "seed": self.seed % 2**64,
            "drop_last": self.drop_last,
            "weights_checksum": self.weights_checksum,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n={self._n}, num_samples={self.num_draws}, "
            f"replacement={self.replacement}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"seed={self.seed}, epoch={self.epoch}, drop_last={self.drop_last})"
        )
