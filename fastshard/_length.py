"""Length-grouped and token-budget batches for distributed training: the unit of the epoch's
global sequence is a batch."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import Sampler

from . import _core, _frameworks, _validate
from ._sampler import _UnitSampler

# Default sort window, in expected batches: each window is sorted by length and cut into
# batches, so a window of k batches loses about 1/k of a batch's length spread to padding,
# while fewer windows make the grouping more repeatable from epoch to epoch (two batch-mates can
# be batch-mates again only in the same window: about 1 / windows of them are). Chosen by
# measurement (bench/length_grouped.py quality and default-window, bench/RESULTS.md): on
# lognormal lengths, 1024 batches per window come within 0.3% (token budget) and 2.4% (fixed
# count) of one global sort's padding efficiency, where 64 lose 3% and 19%.
WINDOW_BATCHES = 1024
# ... but at most this many items: a window costs 8 to 32 bytes per item while it is sorted,
# so huge batches get fewer batches per window rather than windows of hundreds of MB.
WINDOW_MAX_ITEMS = 2**21
# ... and at least this many windows per epoch, so that a small dataset is not one global sort
# whose batches nearly repeat every epoch (20,000 lognormal lengths in one window: 83% of
# batch-mate pairs again in the next epoch; in 16 windows: 5%) ...
WINDOW_MIN_COUNT = 16
# ... while a window still holds this many expected batches (tiny datasets).
WINDOW_MIN_BATCHES = 16
_MAX_U64 = 2**64 - 1


def _as_lengths(lengths: Any) -> np.ndarray:
    """The lengths as a 1-D C-contiguous integer array in native byte order: the caller's own
    array (or a CPU tensor's memory) when it already is one, else a converted copy."""
    if isinstance(lengths, Sampler):
        # Lightning (use_distributed_sampler=True) rebuilds a custom batch sampler as
        # cls(sampler, batch_size=..., drop_last=...); a TypeError makes it say how to stop.
        raise TypeError(
            f"lengths must be the items' lengths, got a {type(lengths).__name__}: a framework "
            "is rebuilding this batch sampler around a sampler of its own. It shards over "
            "ranks itself: under Lightning build the Trainer with use_distributed_sampler=False "
            "(see docs/length-grouped.md)"
        )
    arr = _validate.host_array(lengths, "lengths", "integers")
    if arr.dtype.kind in "fO" and isinstance(lengths, (list, tuple)):
        # NumPy turns a list of Python ints beyond int64 into float64 or objects: name the one.
        for i, v in enumerate(lengths):
            if isinstance(v, (int, np.integer)) and not 0 <= v < 2**63:
                raise ValueError(
                    f"lengths[{i}] = {v} is out of range: lengths must be in [0, 2**63 - 1]"
                )
    if arr.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {arr.shape}")
    if arr.size == 0:  # before the dtype: np.asarray([]) is float64
        raise ValueError("lengths must not be empty")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"lengths must have an integer dtype, got dtype {arr.dtype}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    # np.memmap and other subclasses: the same memory as a plain ndarray, no copy.
    return np.ascontiguousarray(arr).view(np.ndarray)


def _rule(batch_size: Any, max_tokens: Any, max_batch_size: Any) -> tuple[int, int, int]:
    """(batch_size, max_tokens, max_batch_size), 0 for each one absent."""
    if (batch_size is None) == (max_tokens is None):
        raise ValueError(
            "pass exactly one of batch_size (items per batch) and max_tokens (a padded-token "
            f"budget per batch), got batch_size={batch_size!r}, max_tokens={max_tokens!r}"
        )
    if batch_size is not None:
        if max_batch_size is not None:
            raise ValueError("max_batch_size only applies with max_tokens, not with batch_size")
        return _validate.in_range(batch_size, "batch_size", 1, _validate.MAX_LENGTH), 0, 0
    tokens = _validate.in_range(max_tokens, "max_tokens", 1, _validate.MAX_LENGTH)
    cap = (
        0
        if max_batch_size is None
        else _validate.in_range(max_batch_size, "max_batch_size", 1, _validate.MAX_LENGTH)
    )
    return 0, tokens, cap


class LengthGroupedBatchSampler(_UnitSampler):
    """Batches of items of similar length, by count or by a padded-token budget, for
    distributed training at any size. Use as ``DataLoader(dataset, batch_sampler=sampler)``.

    Each epoch, the items in a fresh keyed random order (the ``"feistel"`` order of
    :class:`DistributedSampler`) are dealt into windows of about ``sort_window`` items; each
    window is sorted by length and cut into batches, and the window's batches are shuffled. The
    epoch's global batch sequence (window 0's batches, then window 1's, ...) is the same for any
    number of ranks; rank ``r`` of ``W`` takes batches ``r, r + W, ...``. Every rank gets the
    same number of batches (padding repeats fewer than ``W`` batches from the start of the
    epoch, or ``drop_last`` drops them), so no rank waits on a collective another never
    reaches, even with a token budget.

    ``len()`` is the same in every epoch, also with ``max_tokens``: lengths fall in classes
    (exact below 128, then less than 1/64 wide; merged only on large epochs, to at most
    ``n / 10**4`` items each at any size), every stratum of windows takes a fixed number of each
    class's items (which ones changes every epoch) and its windows equal shares of them, and the
    budget is applied to each class's largest length, so a window's batch count follows from
    its class counts alone: within 1% of a cut on the actual lengths at every size.

    The plan is built in C++, on several threads, without the GIL. Beyond the lengths, memory
    is one offset per window plus the window the rank is reading (8 bytes per item of it); with
    ``max_tokens`` also a table of (strata + 1) x classes counts per epoch, filled by one
    threaded scan of the epoch's order at its first iteration, the ranges of the order the
    last stratum read (16 bytes per position, at most 64 MiB), which the next one reuses, and
    that stratum's items (20 bytes each) for its windows.

    Parameters
    ----------
    lengths : array-like of int
        The n >= 1 item lengths (tokens, frames), non-negative: a 1-D NumPy array of any
        integer dtype (also ``np.memmap``), a CPU tensor, or a list. A C-contiguous
        native-endian integer array (or tensor) is used in place, never copied; do not modify
        it while the sampler is in use.
    batch_size : int, optional
        Items per batch, grouped by length. Each window's last batch may be smaller (one per
        window; none when ``sort_window`` is a multiple of ``batch_size``, as the default is,
        except the epoch's last window).
    max_tokens : int, optional
        Instead of ``batch_size``: a padded-token budget, ``len(batch) * max(lengths[batch])
        <= max_tokens``, filled greedily along the sorted window with each length rounded up to
        its class's largest (at most 1/64 more above 127). A length of 0 counts as 1, so a
        batch never holds more than ``max_tokens`` items. An item longer than the budget is a
        batch on its own.
    max_batch_size : int, optional
        With ``max_tokens``: at most this many items per batch.
    sort_window : int, optional
        Items per sorted window. Default: 1024 expected batches (``1024 * batch_size``, or
        ``1024 * (max_tokens // mean length)`` with that quotient capped by
        ``max_batch_size``), at most 2**21 items, and at most ``n / 16`` (rounded up to whole
        batches) so that an epoch has at least 16 windows, unless that leaves fewer than 16
        batches per window. Chosen by measurement (docs/length-grouped.md).
    num_replicas, rank : int, optional
        Default to the initialised process group, else to ``WORLD_SIZE`` / ``RANK``.
    seed : int or None
        As for :class:`DistributedSampler` (``None``: drawn on rank 0 and broadcast).
    drop_last : bool
        Drop the tail of the pass's batch sequence so that it divides over the ranks, instead
        of repeating fewer than ``num_replicas`` batches from the epoch's start. A pass is the
        epoch, or its rest after a resume: resumed on another number of ranks, fewer than
        that number of the unconsumed batches are dropped.
    pad : bool
        ``False`` (with ``drop_last=False``): no repeats; every batch exactly once, rank
        batch counts differ by at most one (for evaluation, and for a resume on another
        number of ranks that trains every unconsumed batch exactly once). A training loop
        with a collective per step needs equal counts: keep the default there.
    check_consistency : bool
        With a process group, check at each iteration that all ranks agree on the
        configuration, including a 64-bit checksum of the lengths.
    auto_epoch : bool
        Advance the epoch on each new iteration after one that ran to its end (default
        ``False``: warn once, as the other samplers).

    Notes
    -----
    ``len(sampler)`` is this rank's number of batches per epoch. ``state_dict(consumed)``
    counts in batches; pass the number of batches the training loop has consumed when the
    DataLoader prefetches (it reads batch indices ahead of the training step).

    Raises
    ------
    ValueError
        Both or neither of ``batch_size`` and ``max_tokens`` given, ``max_batch_size``
        without ``max_tokens``, a negative length, an empty ``lengths``, or an argument out of
        range.
    TypeError
        ``lengths`` are not integers, or a framework passes a sampler where the lengths go
        (under Lightning: ``Trainer(use_distributed_sampler=False)``).

    Examples
    --------
    Short and long items in batches of two, each batch of similar lengths:

    >>> lengths = [5, 30, 7, 28, 6, 31, 8, 29]
    >>> sampler = fastshard.LengthGroupedBatchSampler(
    ...     lengths, batch_size=2, num_replicas=1, rank=0, seed=0
    ... )
    >>> len(sampler), list(sampler)
    (4, [[2, 6], [0, 4], [1, 5], [3, 7]])

    A padded-token budget instead: ``len(batch) * max(lengths[batch]) <= 64``.

    >>> sampler = fastshard.LengthGroupedBatchSampler(
    ...     lengths, max_tokens=64, num_replicas=1, rank=0, seed=0
    ... )
    >>> list(sampler)
    [[0, 4, 2, 6], [3, 7], [1, 5]]

    In a DataLoader: ``DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_batch)``.
    """

    def __init__(
        self,
        lengths: Any,
        batch_size: int | None = None,
        *,
        max_tokens: int | None = None,
        max_batch_size: int | None = None,
        sort_window: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int | None = 0,
        drop_last: bool = False,
        pad: bool = True,
        check_consistency: bool = True,
        auto_epoch: bool = False,
    ) -> None:
        if isinstance(lengths, Sampler):
            original = _frameworks.lightning_predict_original(LengthGroupedBatchSampler)
            if original is not None:
                # Lightning's predict loop rebuilds every batch sampler around the DataLoader's
                # default sampler: continue the one it rebuilds, with its drop_last=False.
                self.__dict__.update(original.__getstate__())
                self.__dict__["drop_last"] = _validate.flag(drop_last, "drop_last")
                self._start_pass()
                return
        arr = _as_lengths(lengths)  # first: refuses a framework's sampler (see _as_lengths)
        # The rule as ints, 0 for absent (the compiled layout's and the state's form); the
        # public attributes are None for absent.
        self._rule = _rule(batch_size, max_tokens, max_batch_size)
        self.batch_size, self.max_tokens, self.max_batch_size = (v or None for v in self._rule)
        if sort_window is not None:
            sort_window = _validate.in_range(sort_window, "sort_window", 1, _validate.MAX_LENGTH)
        first_negative, _, total, checksum = _core.scan_lengths(arr)
        if first_negative >= 0:
            raise ValueError(
                f"lengths[{first_negative}] = {arr[first_negative]} is negative; lengths must "
                "be >= 0"
            )
        self.lengths = arr
        self._n = len(arr)
        self.dataset = range(self._n)
        self.lengths_checksum = int(checksum)
        self.sort_window = (
            self._default_window(total / self._n) if sort_window is None else sort_window
        )
        self.shuffle = True
        self.pad = _validate.flag(pad, "pad")
        self._set_shared_arguments(
            num_replicas, rank, seed, drop_last, check_consistency, auto_epoch
        )
        self._static: Any = None  # _core.LengthLayout: windows, classes, batch counts
        self._layout: Any = None  # (epoch, _core.LengthEpoch) of the latest epoch used
        self._start_pass()

    # fastshard.BatchSampler refuses to batch this sampler's batches again.
    _yields_batches = True

    @property
    def sampler(self) -> LengthGroupedBatchSampler:
        """The sampler of this batch sampler's items: itself.

        Frameworks reach a batch sampler's order through ``batch_sampler.sampler`` (Lightning
        calls ``dataloader.batch_sampler.sampler.set_epoch(epoch)`` every epoch, accelerate
        too); this batch sampler is its own order, so that call sets its epoch.
        """
        return self

    def _default_window(self, mean: float) -> int:
        if self.batch_size:
            per_batch = self.batch_size
        else:
            per_batch = max(1, int(self._rule[1] // max(mean, 1.0)))
            if self.max_batch_size:
                per_batch = min(per_batch, self.max_batch_size)
        # In whole batches: with batch_size, only the epoch's last window has a short batch.
        per_window = -(-self._n // WINDOW_MIN_COUNT)
        at_least_windows = max(-(-per_window // per_batch), WINDOW_MIN_BATCHES) * per_batch
        return min(WINDOW_BATCHES * per_batch, WINDOW_MAX_ITEMS, at_least_windows)

    # -- the epoch's batches ----------------------------------------------------------------
    def _static_layout(self) -> _core.LengthLayout:
        """What no epoch changes: the windows, the length classes, the batch counts."""
        if self._static is None:
            self._static = _core.LengthLayout(self.lengths, *self._rule, self.sort_window)
        result: _core.LengthLayout = self._static
        return result

    def _epoch_layout(self) -> _core.LengthEpoch:
        layout = self._layout
        if layout is None or layout[0] != self.epoch:
            epoch = _core.LengthEpoch(self._static_layout(), self.seed % 2**64, self.epoch % 2**64)
            layout = self._layout = (self.epoch, epoch)
        result: _core.LengthEpoch = layout[1]
        return result

    @property
    def num_batches(self) -> int:
        """The epoch's number of batches over all ranks (before padding or drop_last): fixed
        by the lengths and the configuration, the same in every epoch."""
        return int(self._static_layout().num_batches)

    def _plan_args(self) -> tuple[int, bool, bool]:
        return self.num_batches, self.drop_last, self.pad

    def _make_shard(self, cursor: int) -> _core.LengthShard:  # type: ignore[override]
        return _core.length_shard(
            self._epoch_layout(), self.num_replicas, self.rank, self.drop_last, cursor, self.pad
        )

    def _config(self) -> dict[str, Any]:
        return {
            "n": self._n,
            "seed": self.seed % 2**64,
            "batch_size": self._rule[0],
            "max_tokens": self._rule[1],
            "max_batch_size": self._rule[2],
            "sort_window": self.sort_window,
            "drop_last": self.drop_last,
            "pad": self.pad,
            "lengths_checksum": self.lengths_checksum,
        }

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_layout"] = state["_static"] = None  # compiled objects: rebuilt after unpickling
        return state

    # -- access -----------------------------------------------------------------------------
    _unit, _units = "batch", "batches"

    def _element(self, shard: _core.LengthShard, k: int) -> list[int]:
        return shard.batch(k)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state saved by any rank, on any number of ranks: the rest of the
        saved epoch's batch sequence, re-sharded over this sampler's ``num_replicas``
        (exactly the uninterrupted run's batches on the same number).

        Parameters
        ----------
        state : dict
            What ``state_dict`` returned (counted in batches).

        Raises
        ------
        ValueError
            The state was saved with other lengths or another configuration.
        TypeError
            The state is not a dict of the expected types.

        Examples
        --------
        >>> lengths = [5, 30, 7, 28, 6, 31, 8, 29]
        >>> def make():
        ...     return fastshard.LengthGroupedBatchSampler(
        ...         lengths, batch_size=2, num_replicas=1, rank=0
        ...     )
        >>> saved = make()
        >>> state = saved.state_dict(consumed=1)
        >>> resumed = make()
        >>> resumed.load_state_dict(state)
        >>> list(resumed) == list(saved)[1:]
        True
        """
        super().load_state_dict(state)

    def __repr__(self) -> str:
        rule = (
            f"batch_size={self.batch_size}"
            if self.batch_size
            else f"max_tokens={self.max_tokens}, max_batch_size={self.max_batch_size}"
        )
        return (
            f"{type(self).__name__}(n={self._n}, {rule}, sort_window={self.sort_window}, "
            f"num_replicas={self.num_replicas}, rank={self.rank}, seed={self.seed}, "
            f"epoch={self.epoch}, drop_last={self.drop_last}, pad={self.pad})"
        )
