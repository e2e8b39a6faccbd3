"""fastshard.ShardedStream: shard files read front to back, in equal, reshuffled and resumable
shares for every rank and DataLoader worker.

The epoch's global sequence (csrc/fastshard/stream.hpp) depends on the shard sizes, the seed,
the epoch, ``chunk_size``, ``lanes`` and ``window`` only: never on the number of ranks or of
workers. Rank r of W takes positions ``cursor + r + i*W`` of it, as every fastshard sampler
does, and within a rank the DataLoader's batches go to the workers round robin (batch q of
the rank to worker q mod k), which is the order in which a DataLoader collects them. So the
global batches are the same for any W and k at a fixed global batch size, a checkpoint is one
cursor, and the cursor re-shards what is left over any W and k.

Reads: the sequence interleaves ``lanes`` contiguous stretches of the shuffled stream, and a
lane's rows are read front to back. When ``lanes`` is a multiple of
``batch_size * num_replicas * num_workers`` each lane belongs to one reader (rank, worker),
which reads exactly the rows it yields; otherwise a lane is shared by a few readers, each of
which reads the lane's windows and keeps its own rows (docs/streams.md gives the bound).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import _core, _distributed, _frameworks, _state, _validate, _world
from ._warnings import EpochWarning

# How many of its lanes per global batch a stream has by default: lanes = LANES_PER_BATCH *
# batch_size * num_replicas, so 1, 2, 4 and 8 workers per rank read private lanes.
LANES_PER_BATCH = 8
DEFAULT_WINDOW = 16

# DataLoader workers per rank whose completed passes the stream's board records (a worker with
# a larger id still reads its share; only the auto_epoch/EpochWarning bookkeeping skips it).
BOARD_WORKERS = 256

# accelerate's wrapper that iterates an IterableDataset on every process and keeps 1/W of it.
_ITERABLE_SPLITTERS = ("IterableDatasetShard", "DataLoaderDispatcher")


class ReadAmplificationWarning(UserWarning):
    """A ShardedStream's lanes are shared by several readers (``lanes`` is not a multiple of
    ``batch_size * num_replicas * num_workers``): each reader reads the shared lanes' rows
    and keeps its own, so it reads up to the sharing factor times the rows it yields.

    Examples
    --------
    Batches of 3 on one rank need lanes in multiples of 3; 4 lanes are shared:

    >>> import warnings
    >>> stream = fastshard.ShardedStream(
    ...     [6], lambda s, a, b: range(a, b), batch_size=3, lanes=4, num_replicas=1, rank=0
    ... )
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     items = list(stream)
    >>> sorted(items), [w.category.__name__ for w in caught]
    ([0, 1, 2, 3, 4, 5], ['ReadAmplificationWarning'])
    """


class ShardReadError(RuntimeError):
    """A shard's ``read`` yielded fewer rows than the shard's size says it holds.

    Raised by the reader that found it (in a DataLoader worker, the DataLoader raises it
    again in the main process), with the shard, the rows asked for and the rows missing:
    ``shard_sizes`` must give each shard's exact number of items, or the epoch would be
    short on one rank and the others would wait for it.

    Examples
    --------
    A shard said to hold 3 rows whose read stops after 2:

    >>> stream = fastshard.ShardedStream(
    ...     [3], lambda s, a, b: range(a, min(b, 2)), batch_size=1, lanes=1,
    ...     num_replicas=1, rank=0,
    ... )
    >>> try:
    ...     list(stream)
    ... except fastshard.ShardReadError as err:
    ...     print(str(err).split(" items")[0])
    read(0, 0, 3) yielded 2
    """


class ShardedStream(IterableDataset[Any]):
    """An ``IterableDataset`` over shard files read front to back: every rank gets the same
    number of items per epoch, split exactly over its DataLoader workers, in a fresh keyed
    order every epoch; the order is one global sequence for any number of ranks and
    workers, and a checkpoint is one cursor that resumes on any number of either.

    Parameters
    ----------
    shard_sizes : sequence of int
        The number of items (rows) in each shard; 0 for an empty shard.
    read : callable
        ``read(shard, start, stop)`` returns an iterable over the items of rows
        ``[start, stop)`` of shard ``shard``, in order. It is called in the process that
        iterates the stream (a DataLoader worker), so it must be picklable for the ``spawn``
        start method. A read that yields fewer items than asked raises
        :class:`ShardReadError`, naming the shard; extra items are never taken.
    batch_size : int
        The per-rank batch size of the DataLoader that iterates the stream. Worker w of k
        yields the rank's batches w, w + k, ..., so the DataLoader must batch by this size
        (``DataLoader(stream, batch_size=batch_size, num_workers=k)``).
    lanes : int, optional
        How many stretches of the shuffled stream the global sequence interleaves (the
        job's concurrent sequential reads). Default ``8 * batch_size * num_replicas``: the
        same for any world size at a fixed global batch size. Each reader (rank, worker)
        reads only its own rows when ``lanes`` is a multiple of ``batch_size * num_replicas
        * num_workers``.
    window : int
        The local shuffle: each lane's rows are taken in windows of this many consecutive
        rows, in a keyed order inside each window (a reader holds one window per lane).
    chunk_size : int, optional
        Cut shards into chunks of at most this many rows, shuffled as units (default: whole
        shards). Smaller chunks shuffle more finely but start more reads mid-shard.
    num_replicas, rank, seed, shuffle, drop_last, pad, check_consistency, auto_epoch
        As for :class:`fastshard.DistributedSampler`. ``pad=True`` (default) fills the last
        positions by repeating items from the start of the epoch so every rank yields the
        same count; ``drop_last=True`` drops them instead; ``pad=False`` yields every item
        exactly once, with rank counts that differ by at most one.

    Raises
    ------
    ValueError
        A negative shard size, sizes summing to 2**63 or more, ``batch_size``, ``lanes``,
        ``window`` or ``chunk_size`` below 1, or a rank outside ``[0, num_replicas)``.
    TypeError
        Shard sizes that are not integers, or a ``read`` that is not callable.
    fastshard.InconsistentRanksError
        At construction, ``set_epoch`` and ``load_state_dict``, on every rank of an
        initialised process group, when the ranks disagree on the shard sizes, the seed,
        the configuration or the epoch.
    fastshard.ReshardedError
        When accelerate would split the stream's batches over its processes again.

    Examples
    --------
    Three shards of 4, 0 and 3 rows, read by rank 1 of 2 (each rank gets 4 of the 7
    items, one repeated from the start of the epoch):

    >>> def read(shard, start, stop):
    ...     return [(shard, row) for row in range(start, stop)]
    >>> stream = fastshard.ShardedStream(
    ...     [4, 0, 3], read, batch_size=2, num_replicas=2, rank=1, seed=0
    ... )
    >>> len(stream)
    4
    >>> items = list(stream)
    >>> len(items), all(shard in (0, 2) for shard, _ in items)
    (4, True)

    In a training job: ``DataLoader(stream, batch_size=2, num_workers=k)`` and
    ``stream.set_epoch(epoch)`` before each epoch (docs/streams.md).
    """

    epoch: int
    num_replicas: int
    rank: int
    seed: int

    def __init__(
        self,
        shard_sizes: Any,
        read: Callable[[int, int, int], Iterable[Any]],
        *,
        batch_size: int,
        lanes: int | None = None,
        window: int = DEFAULT_WINDOW,
        chunk_size: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int | None = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        pad: bool = True,
        check_consistency: bool = True,
        auto_epoch: bool = False,
    ) -> None:
        sizes = _shard_sizes(shard_sizes)
        if not callable(read):
            raise TypeError(f"read must be callable as read(shard, start, stop), got {read!r}")
        self.read = read
        self.batch_size = _validate.in_range(batch_size, "batch_size", 1, _validate.MAX_LENGTH)
        self.window = _validate.in_range(window, "window", 1, _validate.MAX_LENGTH)
        if chunk_size is not None:
            chunk_size = _validate.in_range(chunk_size, "chunk_size", 1, _validate.MAX_LENGTH)
        self.chunk_size = chunk_size
        self.shuffle = _validate.flag(shuffle, "shuffle")
        self.pad = _validate.flag(pad, "pad")
        self.num_replicas, self.rank = _world.resolve(num_replicas, rank)
        self.drop_last = _validate.flag(drop_last, "drop_last")
        self.check_consistency = _validate.flag(check_consistency, "check_consistency")
        self.auto_epoch = _validate.flag(auto_epoch, "auto_epoch")
        if lanes is None:
            lanes = LANES_PER_BATCH * self.batch_size * self.num_replicas
        self.lanes = _validate.in_range(lanes, "lanes", 1, _validate.MAX_LENGTH)
        self.shard_sizes = sizes
        self._layout_cache: _core.StreamLayout | None = None
        self._plans: tuple[int, _core.StreamEpoch] | None = None  # (epoch, its compiled plan)
        layout = self._layout()  # checks that the sizes sum below 2**63
        self.num_rows = int(layout.rows)
        self.sizes_checksum = int(_core.scan_lengths(sizes)[3])
        self.seed = _distributed.random_seed() if seed is None else _validate.integer(seed, "seed")
        self._epoch_warned = False
        # Shared memory, so that it outlives the DataLoader workers, which each iterate their
        # own copy of the stream and are started afresh every epoch: row w holds (1, epoch)
        # once worker w read that epoch to its end ((0, 0): nothing since the last set_epoch
        # or load_state_dict). The next generation of workers learns from it which epoch the
        # previous one finished.
        self._board = torch.zeros(BOARD_WORKERS, 2, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._start_pass(0, 0)
        _distributed.check(self)

    # -- plan -------------------------------------------------------------------------------
    def _layout(self) -> _core.StreamLayout:
        if self._layout_cache is None:
            try:
                self._layout_cache = _core.StreamLayout(self.shard_sizes, self.chunk_size or 0)
            except ValueError as err:
                raise ValueError(f"shard_sizes: {err}") from None
        return self._layout_cache

    def _plan(self, epoch: int) -> _core.StreamEpoch:
        cached = self._plans
        if cached is None or cached[0] != epoch:
            plan = _core.StreamEpoch(
                self._layout(),
                self.seed % 2**64,
                epoch % 2**64,
                self.shuffle,
                self.lanes,
                self.window,
            )
            self._plans = cached = (epoch, plan)
        return cached[1]

    def _lengths(self, cursor: int) -> tuple[int, int]:
        return _core.plan_lengths(
            self.num_rows, self.num_replicas, self.rank, self.drop_last, self.pad, cursor
        )

    def _start_pass(self, epoch: int, cursor: int, resumed: bool = False) -> None:
        self.__dict__["epoch"] = epoch
        self._cursor = cursor
        self._resume_pending = resumed
        self._iterator: _StreamIterator | None = None

    def _config(self) -> dict[str, Any]:
        return {
            "rows": self.num_rows,
            "shards": len(self.shard_sizes),
            "sizes_checksum": self.sizes_checksum,
            "seed": self.seed % 2**64,
            "shuffle": self.shuffle,
            "lanes": self.lanes,
            "window": self.window,
            "chunk_size": self.chunk_size or 0,
            "drop_last": self.drop_last,
            "pad": self.pad,
        }

    def _resume_point(self) -> dict[str, Any]:
        return {"cursor": self._cursor}

    # -- epochs -----------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "epoch" and "epoch" in self.__dict__:
            self.set_epoch(value)
            return
        object.__setattr__(self, name, value)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the stream yields; call it on every rank before each
        epoch, in the process that builds the DataLoader iterator (workers started afterwards
        receive it). Checks that every rank agrees (one small collective).

        Right after ``load_state_dict``, ``set_epoch`` of the saved epoch keeps the resume.

        Parameters
        ----------
        epoch : int
            Any int (reduced modulo 2**64 for the order).

        Raises
        ------
        fastshard.InconsistentRanksError
            On every rank, when the ranks are not at the same epoch and configuration.
        fastshard.ReshardedError
            Under accelerate's ``DataLoaderDispatcher`` with ``num_replicas > 1``.

        Examples
        --------
        >>> stream = fastshard.ShardedStream(
        ...     [3, 3], lambda s, a, b: range(a, b), batch_size=1, num_replicas=1, rank=0
        ... )
        >>> first = list(stream)
        >>> stream.set_epoch(1)
        >>> second = list(stream)
        >>> sorted(first) == sorted(second), stream.epoch
        (True, 1)
        """
        epoch = _validate.integer(epoch, "epoch")
        # accelerate's DataLoaderDispatcher sets the epoch on every process, then iterates
        # the loader on process 0 only (in its workers, out of sight of __iter__'s check).
        _frameworks.check_not_resharded(self, *_frameworks.accelerate_split(_ITERABLE_SPLITTERS))
        if not (self._resume_pending and epoch == self.epoch):
            self._start_pass(epoch, 0)
            self._board.zero_()
        _distributed.check(self)

    def _finished_epoch(self, workers: int) -> int | None:
        """The epoch this copy's latest iterator read to its end; or, for a fresh copy in a
        new generation of DataLoader workers, the epoch every worker of the previous
        generation read to its end, as the board records; None when neither."""
        it = self._iterator
        if it is not None:
            return it.epoch if it.done else None
        if get_worker_info() is None or workers > BOARD_WORKERS:
            return None
        rows = self._board[:workers].tolist()
        if rows[0][0] != 1 or any(row != rows[0] for row in rows):
            return None
        return int(rows[0][1])

    def _begin_iteration(self, workers: int) -> str | None:
        """Advance the epoch after one read to its end (auto_epoch); else return the warning
        that the epoch repeats (once per copy), which the iterator gives at its first item:
        raised from ``iter()`` in a DataLoader worker, an error would end the worker without
        its message."""
        finished = self._finished_epoch(workers)
        self._resume_pending = False
        if finished is None:
            return None
        if self.auto_epoch:
            self._start_pass(finished + 1, 0)
        elif self.shuffle and not self._epoch_warned:
            self._epoch_warned = True
            where = (
                " (in a DataLoader worker). Call stream.set_epoch(epoch) in the main process "
                "before each epoch, which the workers receive when the epoch's iteration "
                "starts (not with persistent_workers=True, whose workers keep their copy), or "
                "build the stream with auto_epoch=True, which advances in the workers too"
                if get_worker_info() is not None
                else ". Call stream.set_epoch(epoch) before each epoch or build the stream with "
                "auto_epoch=True"
            )
            return (
                f"fastshard.ShardedStream: a new iteration started at epoch {self.epoch}, which "
                f"was already read to its end, so it repeats the same order{where}."
            )
        return None

    # -- lengths ----------------------------------------------------------------------------
    def __len__(self) -> int:
        """This rank's number of items per epoch (all its workers together): the whole
        epoch's, also after ``load_state_dict``, as frameworks size an epoch once."""
        return self._lengths(0)[0]

    @property
    def remaining(self) -> int:
        """This rank's number of items in the current pass (less than ``len()`` after
        ``load_state_dict``)."""
        return self._lengths(self._cursor)[0]

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> _StreamIterator:
        """This reader's items of the pass: all of the rank's in the main process, or the
        rank's batches w, w + k, ... in DataLoader worker w of k. The iterator is stateful
        for torchdata (``state_dict``/``load_state_dict``) and counts ``reads``,
        ``rows_read`` and ``yielded``.

        Raises
        ------
        fastshard.ReshardedError
            Under accelerate's ``IterableDatasetShard`` with ``num_replicas > 1``.
        """
        splitter = _frameworks.accelerate_split(_ITERABLE_SPLITTERS)
        _frameworks.check_not_resharded(self, *splitter)
        info = get_worker_info()
        if info is None:
            _distributed.check(self)
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        repeat = self._begin_iteration(workers)
        it = _StreamIterator(self, self.epoch, self._cursor, worker, workers)
        it.warnings = [] if repeat is None else [(repeat, EpochWarning)]
        readers = self.batch_size * self.num_replicas * workers
        if self.lanes % readers and worker == 0:
            sharing = readers // math.gcd(self.lanes, readers)
            it.warnings.append(
                (
                    f"fastshard.ShardedStream: lanes={self.lanes} is not a multiple of "
                    f"batch_size * num_replicas * num_workers = {self.batch_size} * "
                    f"{self.num_replicas} * {workers} = {readers}, so each lane is read by up "
                    f"to {sharing} readers, each reading up to {sharing}x the rows it yields. "
                    f"Build the stream with lanes a multiple of {readers} (the same lanes on "
                    "resume: they define the order).",
                    ReadAmplificationWarning,
                )
            )
        self._iterator = it
        return it

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable checkpoint holding no rank and no worker: the epoch and the
        global cursor after what this process's latest iteration yielded. Use it when the
        stream is iterated in this process (``num_workers=0``); with workers, checkpoint the
        loader (torchdata's ``StatefulDataLoader``), whose state this class's
        ``load_state_dict`` also reads, for any number of ranks and workers.

        Returns
        -------
        dict
            ``version``, the configuration (rows, shards, a checksum of the sizes, seed,
            shuffle, lanes, window, chunk_size, drop_last, pad), ``epoch`` and ``cursor``.

        Examples
        --------
        >>> stream = fastshard.ShardedStream(
        ...     [5, 5], lambda s, a, b: range(a, b), batch_size=2, num_replicas=2, rank=0
        ... )
        >>> it = iter(stream)
        >>> _ = [next(it) for _ in range(3)]
        >>> stream.state_dict()["cursor"]  # 3 items on each of the 2 ranks
        6
        """
        it = self._iterator
        cursor = self._cursor if it is None else it.global_cursor()
        return _state.make(self._config(), self.epoch, min(cursor, self.num_rows))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint saved on any number of ranks and workers: a state of
        :meth:`state_dict`, or the ``state_dict()`` of a torchdata ``StatefulDataLoader``
        over a stream (any rank's). The next iteration yields the rest of the saved epoch
        over this stream's ranks and workers, nothing lost and nothing repeated.

        Parameters
        ----------
        state : dict
            The stream's or the loader's state.

        Raises
        ------
        ValueError, TypeError
            A state of another configuration (sizes, seed, lanes, ...) or not a stream's;
            the stream is left unchanged.
        fastshard.InconsistentRanksError
            On every rank, when the ranks load different states.

        Examples
        --------
        >>> read = lambda s, a, b: range(a, b)
        >>> old = fastshard.ShardedStream([5, 5], read, batch_size=2, num_replicas=2, rank=0)
        >>> it = iter(old)
        >>> _ = [next(it) for _ in range(3)]
        >>> new = fastshard.ShardedStream([5, 5], read, batch_size=2, num_replicas=2, rank=0)
        >>> new.load_state_dict(old.state_dict())
        >>> new.remaining  # of rank 0's 5 items, 3 were consumed
        2
        """
        readers = _reader_states(state)
        if readers:
            state = _merge_readers(readers, _steps_since_snapshot(state))
        epoch, cursor, _ = _state.check(state, self._config())
        self._start_pass(epoch, cursor, resumed=True)
        if get_worker_info() is None:  # a worker restoring its own copy leaves the board alone
            self._board.zero_()
        _distributed.check(self)

    def __getstate__(self) -> dict[str, Any]:
        # Compiled plans are rebuilt where the stream is used (a worker builds its own).
        state = self.__dict__.copy()
        state["_layout_cache"] = None
        state["_plans"] = None
        state["_iterator"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"fastshard.ShardedStream(shards={len(self.shard_sizes)}, rows={self.num_rows}, "
            f"batch_size={self.batch_size}, lanes={self.lanes}, window={self.window}, "
            f"num_replicas={self.num_replicas}, rank={self.rank}, seed={self.seed}, "
            f"epoch={self.epoch})"
        )

    def sequence(
        self, start: int = 0, stop: int | None = None, epoch: int | None = None
    ) -> np.ndarray:
        """The epoch's global sequence ``[start, stop)`` as an (m, 2) int64 array of (shard,
        row): what the stream yields over all ranks and workers, without reading anything.
        For checks and measurements (one lookup per position)."""
        n = self.num_rows
        lo, hi, _ = slice(start, stop).indices(n)
        plan = self._plan(self.epoch if epoch is None else _validate.integer(epoch, "epoch"))
        return plan.sequence(lo, max(lo, hi))


def _shard_sizes(value: Any) -> np.ndarray:
    arr = _validate.host_array(value, "shard_sizes", "ints")
    if arr.ndim != 1:
        raise ValueError(f"shard_sizes must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"shard_sizes must hold integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > _validate.MAX_LENGTH:
        raise ValueError("shard_sizes must be < 2**63")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.size:
        first = int(_core.scan_lengths(arr)[0])
        if first >= 0:
            raise ValueError(f"shard_sizes[{first}] = {arr[first]}: a shard size must be >= 0")
    return arr


class _Lane:
    """A reader's view of one lane: its open read and the window it holds."""

    __slots__ = (
        "current",
        "items",
        "left",
        "length",
        "order",
        "pos",
        "read",
        "segments",
        "start",
        "window",
    )  # fmt: skip

    def __init__(self, start: int, length: int) -> None:
        self.start = start
        self.length = length
        self.pos = -1  # stream row the open reads yield next; -1: none open
        self.segments: list[list[int]] = []  # the reads still to open: (shard, start, stop)
        self.read: Any = None  # the open read
        self.current = [0, 0, 0]  # its (shard, start, stop)
        self.left = 0  # its rows not yet taken
        self.window = -1
        self.items: list[Any] = []
        self.order: list[int] | None = None

    def close_read(self) -> None:
        close = getattr(self.read, "close", None)
        if close is not None:
            close()
        self.read = None
        self.left = 0

    def close(self) -> None:
        self.close_read()
        self.segments = []
        self.pos = -1


class _StreamIterator(Iterator[Any]):
    """One reader's pass: rank ``rank`` of the stream, DataLoader worker ``worker`` of
    ``workers`` (0 of 1 in the main process). Its state (torchdata snapshots it in every
    worker) is the pass's start and how many items this reader yielded."""

    def __init__(
        self, stream: ShardedStream, epoch: int, cursor: int, worker: int, workers: int
    ) -> None:
        self.stream = stream
        self.epoch = epoch
        self.cursor = cursor
        self.worker = worker
        self.workers = workers
        self.yielded = 0
        self.done = False
        # What was read: read() calls, rows taken from them, rows yielded.
        self.reads = 0
        self.rows_read = 0
        self.warnings: list[tuple[str, type[Warning]]] = []  # given at the first item
        self._started = False
        self._batch: list[Any] = []  # the current batch's items not yet yielded, reversed
        self._lanes: dict[int, _Lane] = {}

    def __iter__(self) -> _StreamIterator:
        return self

    def __next__(self) -> Any:
        batch = self._batch
        if not batch:
            if not self._started:
                self._started = True
                for message, category in self.warnings:
                    warnings.warn(message, category, stacklevel=2)
            batch = self._batch = self._next_batch()
            if not batch:
                self._finish()
                raise StopIteration
        self.yielded += 1
        return batch.pop()

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            for lane in self._lanes.values():
                lane.close()
            self._lanes.clear()
            if self.worker < BOARD_WORKERS:
                self.stream._board[self.worker] = torch.tensor(
                    [1, _distributed._signed(self.epoch)]
                )

    def close(self) -> None:
        """Close the open reads (the iterator yields nothing more)."""
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()

    # -- the plan of this reader -------------------------------------------------------------
    def _consumed(self, yielded: int) -> int:
        """This rank's items consumed once this reader's ``yielded``-th item is (the batches
        of the rank up to and including that item's batch)."""
        if yielded == 0:
            return 0
        b = self.stream.batch_size
        last = yielded - 1
        q = self.worker + (last // b) * self.workers
        return q * b + last % b + 1

    def global_cursor(self) -> int:
        s = self.stream
        total = s._lengths(self.cursor)[1]
        return self.cursor + min(self._consumed(self.yielded) * s.num_replicas, total)

    def _next_batch(self) -> list[Any]:
        """The items of this reader's next batch (or of what is left of it after a resume),
        reversed for pop(); empty at the end of the pass."""
        s = self.stream
        count = s._lengths(self.cursor)[0]
        b = s.batch_size
        j, skip = divmod(self.yielded, b)
        lo = (self.worker + j * self.workers) * b
        if lo >= count:
            return []
        plan = s._plan(self.epoch)
        lanes = self._lanes
        hi = min(lo + b, count)
        places = plan.places(self.cursor + s.rank, s.num_replicas, lo + skip, hi).tolist()
        out = []
        for lane_id, window, u in places:  # forward: a lane's windows are read in order
            lane = lanes.get(lane_id)
            if lane is None:
                lane = lanes[lane_id] = _Lane(*plan.lane(lane_id))
            if lane.window != window:
                self._load(plan, lane_id, lane, window)
            order = lane.order
            out.append(lane.items[u if order is None else order[u]])
        out.reverse()
        return out

    def _load(self, plan: Any, lane_id: int, lane: _Lane, window: int) -> None:
        """Read window ``window`` of a lane: continue its open read when the window starts
        where the read stands, else open the reads from the window's first row."""
        m = self.stream.window
        first = lane.start + window * m
        size = min(m, lane.length - window * m)
        if lane.pos != first:
            lane.close()
            lane.segments = plan.segments(first, lane.start + lane.length).tolist()[::-1]
            lane.pos = first
        items: list[Any] = []
        need = size
        while need:
            if lane.left == 0:
                lane.close_read()
                shard, start, stop = lane.current = lane.segments.pop()
                self.reads += 1
                lane.read = iter(self.stream.read(shard, start, stop))
                lane.left = stop - start
            take = min(need, lane.left)
            got = list(islice(lane.read, take))
            if len(got) < take:
                shard, start, stop = lane.current
                done = stop - start - lane.left + len(got)
                raise ShardReadError(
                    f"read({shard}, {start}, {stop}) yielded {done} items and stopped, "
                    f"but shard {shard} has {int(self.stream.shard_sizes[shard])} rows "
                    f"according to shard_sizes, so rows [{start + done}, {stop}) are missing: "
                    "shard_sizes must give each shard's exact number of items"
                )
            items += got
            lane.left -= take
            need -= take
        self.rows_read += size
        lane.items = items
        lane.pos += size
        lane.window = window
        lane.order = (
            plan.window_order(lane_id, window).tolist()
            if self.stream.shuffle and size > 1
            else None
        )

    # -- torchdata's Stateful protocol -------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        s = self.stream
        state = _state.make(s._config(), self.epoch, self.cursor)
        state["reader"] = {
            "num_replicas": s.num_replicas,
            "batch_size": s.batch_size,
            "workers": self.workers,
            "worker": self.worker,
            "yielded": self.yielded,
            "global_cursor": min(self.global_cursor(), s.num_rows),
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        s = self.stream
        epoch, cursor, _ = _state.check(state, s._config())
        reader = state.get("reader")
        if not isinstance(reader, dict):
            raise ValueError("state has no 'reader': it is not a ShardedStream iterator state")
        mine = {
            "num_replicas": s.num_replicas,
            "batch_size": s.batch_size,
            "workers": self.workers,
            "worker": self.worker,
        }
        for key, value in mine.items():
            if reader.get(key) != value:
                raise ValueError(
                    f"this loader state was saved by a reader with {key}={reader.get(key)!r}, "
                    f"this one has {key}={value!r}: a loader's state restores the same ranks and "
                    "workers. To resume on other ones, build the stream and pass the loader's "
                    "state_dict() to stream.load_state_dict() before creating the DataLoader."
                )
        yielded = reader.get("yielded")
        if type(yielded) is not int or yielded < 0:
            raise ValueError(f"state['reader']['yielded'] must be an int >= 0, got {yielded!r}")
        if self._started:
            raise RuntimeError("load_state_dict on a stream iterator that already started")
        self.epoch, self.cursor, self.yielded = epoch, cursor, yielded
        s.__dict__["epoch"] = epoch
        s._cursor = cursor


def _reader_states(state: Any) -> list[dict[str, Any]]:
    """The stream iterator states inside a torchdata StatefulDataLoader state (any depth)."""
    found: list[dict[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if "reader" in value and "version" in value and isinstance(value["reader"], dict):
                found.append(value)
                return
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(state)
    return found


def _steps_since_snapshot(state: Any) -> int:
    steps = state.get("_steps_since_snapshot", 0) if isinstance(state, dict) else 0
    return steps if type(steps) is int and steps >= 0 else 0


def _merge_readers(readers: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """One rank- and worker-free state from the readers' states of one loader: the readers
    deliver their batches in turn, so the one furthest along holds the loader's position."""
    epochs = {r["epoch"] for r in readers}
    if len(epochs) != 1:
        raise ValueError(f"the loader's readers are at different epochs {sorted(epochs)}")
    best = max(readers, key=lambda r: r["reader"].get("global_cursor", 0))
    cursor = best["reader"].get("global_cursor")
    if type(cursor) is not int or cursor < 0:
        raise ValueError("a reader state has no valid 'global_cursor'")
    if steps:
        # Batches the loader yielded after its latest snapshot (snapshot_every_n_steps > 1).
        r = best["reader"]
        cursor += steps * r["batch_size"] * r["num_replicas"]
    state = {key: value for key, value in best.items() if key != "reader"}
    state["cursor"] = min(cursor, best["rows"])
    return state
