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

import hashlib
import math
import mmap
import multiprocessing
import multiprocessing.context
import multiprocessing.reduction
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import _core, _distributed, _frameworks, _state, _validate, _watchdog, _world
from ._warnings import EpochWarning

# How many of its lanes per global batch a stream has by default: lanes = LANES_PER_BATCH *
# batch_size * num_replicas, so 1, 2, 4 and 8 workers per rank read private lanes.
LANES_PER_BATCH = 8
DEFAULT_WINDOW = 16

# The most chunks an epoch's plan may hold: it keeps one 64-bit word per chunk (128 MiB at this
# bound), in every process that reads the stream.
MAX_CHUNKS = 2**24

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


class _EpochBoard:
    """Which epoch each iteration of a stream reads, in memory shared by every copy of the
    stream: the main process's and every DataLoader worker's, of every generation (fresh
    workers are forked or spawned from the main process's copy; persistent ones keep theirs).

    It holds the base (the epoch, cursor and lanes that ``set_epoch``, ``load_state_dict`` or
    the construction set) and the latest iterations since: each one's key, epoch, cursor,
    lanes and which workers joined it. The first copy to start an iteration decides its epoch
    under a lock (the base for the first iteration; with ``auto_epoch``, the previous
    iteration's epoch + 1 for each later one); every other worker of the same iteration finds
    its key and reads the same entry. So the workers of one iteration agree by construction,
    whatever their timing. A worker that joins an entry it already joined has started a new
    iteration that happens to have the same key (a DataLoader seeded identically twice; the
    key also names the batch of worker processes, so one whose predecessor in an iteration cut
    short never started does not join that iteration's entry).

    The memory: on Linux a ``memfd`` mapped shared (tens of microseconds to make), which forked
    workers inherit and spawned or forkserver workers receive as a descriptor when the
    stream is pickled for them (``multiprocessing``'s ``DupFd``, as torch passes a shared
    tensor); elsewhere a torch shared-memory tensor. Any other pickle or deepcopy receives a
    copy of the words in a board of its own.

    Words: 0 the lock (the holder's pid, 0 when free), 1-3 the base (epoch, cursor, lanes), 4
    the iterations recorded since the base, 5 whether a worker started one, then a ring of
    ``ENTRIES`` entries of ``ENTRY`` words: key, epoch, cursor, lanes, whether it repeats its
    predecessor's epoch, the joined workers' bits (``MASK_WORDS`` words; workers past them
    join without a bit).
    """

    MASK_WORDS = 4
    ENTRY = 5 + MASK_WORDS
    ENTRIES = 8
    HEADER = 6
    LOCK_TIMEOUT = 60.0  # seconds; the lock is held for microseconds
    SIZE = HEADER + ENTRIES * ENTRY  # words

    def __init__(self, words: np.ndarray | None = None) -> None:
        self._create(words)

    def _create(self, words: np.ndarray | None) -> None:
        self.fd: int | None = None  # the memfd, kept open to pass on to spawned workers
        self._memory: Any = None  # what owns the words' memory (an mmap or a torch tensor)
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("fastshard-epoch-board")
            try:
                os.ftruncate(fd, self.SIZE * 8)
            except BaseException:
                os.close(fd)
                raise
            self._map(fd)
        else:
            tensor = torch.zeros(self.SIZE, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
            self._memory, self.words = tensor, tensor.numpy()
        if words is not None:
            self.words[:] = words

    def _map(self, fd: int) -> None:
        self.fd = fd
        self._memory = mmap.mmap(fd, self.SIZE * 8)  # MAP_SHARED: forked children share it
        self.words = np.frombuffer(self._memory, dtype=np.int64)

    def __getstate__(self) -> dict[str, Any]:
        if self.fd is None:
            # torch's reductions share the tensor with a worker; a plain pickle copies it.
            return {"tensor": self._memory}
        if multiprocessing.context.get_spawning_popen() is not None:
            # Pickled to start a process (a spawn or forkserver DataLoader worker): the
            # descriptor goes with it, so the worker maps the same memory.
            return {"fd": multiprocessing.reduction.DupFd(self.fd)}
        return {"words": self.words.copy()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "fd" in state:
            self._map(state["fd"].detach())
            return
        if "tensor" in state:
            tensor = state["tensor"]
            if not tensor.is_shared():  # a plain pickle or deepcopy: a new board
                tensor.share_memory_()
            self.fd, self._memory, self.words = None, tensor, tensor.numpy()
            return
        self._create(state["words"])

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)
        if fd is not None:
            self.fd = None
            try:
                os.close(fd)
            except OSError:
                pass

    # -- the lock ---------------------------------------------------------------------------
    def _acquire(self, words: np.ndarray) -> None:
        me = os.getpid()
        deadline = time.monotonic() + self.LOCK_TIMEOUT
        pause = 1e-5
        while True:
            holder = _core.compare_swap(words, 0, 0, me)
            if holder == 0:
                return
            if holder != me and not _alive(holder):
                # A process that died holding the lock (killed inside iter()) frees it.
                if _core.compare_swap(words, 0, holder, me) == holder:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"fastshard.ShardedStream: the epoch board's lock was held by process "
                    f"{holder} for over {self.LOCK_TIMEOUT:.0f} s"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-2)

    def _release(self, words: np.ndarray) -> None:
        _core.compare_swap(words, 0, os.getpid(), 0)

    # -- operations -------------------------------------------------------------------------
    def reset(self, epoch: int, cursor: int, lanes: int) -> None:
        """A new base: the next iteration reads ``epoch`` from ``cursor`` over ``lanes``."""
        words = self.words
        self._acquire(words)
        try:
            words[1:4] = (_distributed._signed(epoch), cursor, lanes)
            words[4:6] = 0
        finally:
            self._release(words)

    def read_by_workers(self) -> bool:
        """Whether a DataLoader worker started an iteration since the base."""
        return bool(self.words[5])

    def join(
        self,
        key: int,
        worker: int,
        workers: int,
        resume: tuple[int, int, int] | None,
        auto_epoch: bool,
        lanes: int,
    ) -> tuple[int, int, int, bool]:
        """(epoch, cursor, lanes, repeated) of the iteration ``key`` that worker ``worker``
        of ``workers`` (0 of 1 in the main process) is starting. ``resume``: the pass a
        ``load_state_dict`` on this copy set, which a new iteration reads. ``repeated``: a
        new iteration without ``auto_epoch`` reads the epoch its predecessor read."""
        words = self.words
        self._acquire(words)
        try:
            count = int(words[4])
            word, bit = divmod(worker, 64)
            for back in range(min(count, self.ENTRIES)):
                at = self.HEADER + ((count - 1 - back) % self.ENTRIES) * self.ENTRY
                if words[at] != key:
                    continue
                if word < self.MASK_WORDS:
                    mask = int(words[at + 5 + word]) % 2**64
                    if mask >> bit & 1:
                        break  # this worker joined it already: a new iteration, same key
                    words[at + 5 + word] = _distributed._signed(mask | 1 << bit)
                epoch, cursor, lanes, repeated = (int(w) for w in words[at + 1 : at + 5])
                return epoch, cursor, lanes, bool(repeated)
            repeated = False
            if resume is not None:
                epoch, cursor, lanes = resume
            elif count == 0:
                epoch, cursor, lanes = int(words[1]), int(words[2]), int(words[3])
            else:
                last = self.HEADER + ((count - 1) % self.ENTRIES) * self.ENTRY
                previous = int(words[last + 1])
                epoch, cursor = (previous + 1, 0) if auto_epoch else (int(words[1]), 0)
                repeated = not auto_epoch and epoch == previous
            at = self.HEADER + (count % self.ENTRIES) * self.ENTRY
            words[at : at + self.ENTRY] = 0
            words[at : at + 5] = (key, _distributed._signed(epoch), cursor, lanes, repeated)
            if word < self.MASK_WORDS:
                words[at + 5 + word] = _distributed._signed(1 << bit)
            words[4] = count + 1
            if workers > 1 or get_worker_info() is not None:
                words[5] = 1
            return epoch, cursor, lanes, repeated
        finally:
            self._release(words)

    def restore(self, key: int, epoch: int, cursor: int) -> None:
        """An iterator of iteration ``key`` was restored to ``epoch`` from ``cursor`` (a
        loader's checkpoint): later iterations count from it."""
        words = self.words
        self._acquire(words)
        try:
            count = int(words[4])
            for back in range(min(count, self.ENTRIES)):
                at = self.HEADER + ((count - 1 - back) % self.ENTRIES) * self.ENTRY
                if words[at] == key:
                    words[at + 1 : at + 3] = (_distributed._signed(epoch), cursor)
                    return
        finally:
            self._release(words)


_HAS_PROC = os.path.exists("/proc/self/stat")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: not gone, and not a zombie (dead, waiting for its parent
    to reap it, which can take a while: it holds nothing any more)."""
    if sys.platform == "win32":  # os.kill(pid, 0) would send CTRL_C_EVENT there
        return True
    if _HAS_PROC:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                # The state follows the command name, which may hold spaces and parentheses.
                return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
        except FileNotFoundError:
            return False
        except (OSError, IndexError):
            pass  # unreadable: ask the kernel below
    # Without /proc (macOS) a zombie counts as alive until its parent reaps it.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process, or no permission to ask: assume alive
        return True
    return True


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
    num_replicas, rank, seed, shuffle, drop_last, pad, check_consistency
        As for :class:`fastshard.DistributedSampler`. ``pad=True`` (default) fills the last
        positions by repeating items from the start of the epoch so every rank yields the
        same count; ``drop_last=True`` drops them instead; ``pad=False`` yields every item
        exactly once, with rank counts that differ by at most one.
    auto_epoch : bool
        Every iteration after the first (each ``iter(loader)``) reads the next epoch, whether
        or not the previous one was read to its end; all the workers of one iteration read
        the same epoch. Without it, call :meth:`set_epoch` before each epoch (it reaches
        persistent workers too).

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
        # lanes=None: the default, which a resumed epoch may replace by the saved one.
        self._lanes_given = lanes is not None
        if lanes is None:
            lanes = LANES_PER_BATCH * self.batch_size * self.num_replicas
        self.lanes = _validate.in_range(lanes, "lanes", 1, _validate.MAX_LENGTH)
        self.shard_sizes = sizes
        self._layout_cache: _core.StreamLayout | None = None
        # (epoch, lanes, the compiled plan)
        self._plans: tuple[int, int, _core.StreamEpoch] | None = None
        layout = self._layout()  # checks that the sizes sum below 2**63
        if layout.chunks > MAX_CHUNKS:
            smallest = -(-int(sizes.max()) // MAX_CHUNKS) if chunk_size else 0
            raise ValueError(
                f"chunk_size={chunk_size} cuts the shards into {layout.chunks} chunks; an "
                f"epoch's plan holds 8 bytes per chunk in every reading process, and at most "
                f"{MAX_CHUNKS} chunks are allowed: use a chunk_size of at least "
                f"{max(smallest, -(-int(layout.rows) // MAX_CHUNKS))}"
            )
        self.num_rows = int(layout.rows)
        self.sizes_checksum = int(_core.scan_lengths(sizes)[3])
        self.seed = _distributed.random_seed() if seed is None else _validate.integer(seed, "seed")
        self._epoch_warned = False
        self._iterations = 0  # iterations this copy started (a persistent worker counts them)
        self._board = _EpochBoard()
        self._start_pass(0, 0)
        self._board.reset(0, 0, self.lanes)
        _distributed.check(self, when="when it was built")

    # -- plan -------------------------------------------------------------------------------
    def _layout(self) -> _core.StreamLayout:
        if self._layout_cache is None:
            try:
                self._layout_cache = _core.StreamLayout(self.shard_sizes, self.chunk_size or 0)
            except ValueError as err:
                raise ValueError(f"shard_sizes: {err}") from None
        return self._layout_cache

    def _plan(self, epoch: int, lanes: int | None = None) -> _core.StreamEpoch:
        lanes = self._pass_lanes if lanes is None else lanes
        cached = self._plans
        if cached is None or cached[:2] != (epoch, lanes):
            plan = _core.StreamEpoch(
                self._layout(),
                self.seed % 2**64,
                epoch % 2**64,
                self.shuffle,
                lanes,
                self.window,
            )
            self._plans = cached = (epoch, lanes, plan)
        return cached[2]

    def _lengths(self, cursor: int) -> tuple[int, int]:
        return _core.plan_lengths(
            self.num_rows, self.num_replicas, self.rank, self.drop_last, self.pad, cursor
        )

    def _start_pass(
        self, epoch: int, cursor: int, resumed: bool = False, lanes: int | None = None
    ) -> None:
        """The pass that the next iteration of this copy reads: ``epoch`` from ``cursor`` on,
        laid out over ``lanes`` (the stream's own unless a resumed epoch was saved with
        others)."""
        self.__dict__["epoch"] = epoch
        self._cursor = cursor
        self._pass_lanes = self.lanes if lanes is None else lanes
        self._resume_pending = resumed
        self._epoch_chosen = False  # whether set_epoch chose this pass (see load_state_dict)
        # Whether the resumed pass is the board's base (a load in the main process), which
        # the first iteration since reads from the board: the copies that the main process's
        # copy hands to fresh workers, generation after generation, carry the pending flag
        # without having read anything, so they must not force the resume point again.
        self._resume_on_board = False
        self._iterator: _StreamIterator | None = None

    def _config(self, lanes: int | None = None) -> dict[str, Any]:
        return {
            "rows": self.num_rows,
            "shards": len(self.shard_sizes),
            "sizes_checksum": self.sizes_checksum,
            "seed": self.seed % 2**64,
            "shuffle": self.shuffle,
            "lanes": self._pass_lanes if lanes is None else lanes,
            "window": self.window,
            "chunk_size": self.chunk_size or 0,
            "drop_last": self.drop_last,
            "pad": self.pad,
        }

    def _resume_point(self) -> dict[str, Any]:
        # batch_size joins the guard: it is not part of the order (a state resumes at another
        # batch size), but ranks with different ones would run different numbers of steps.
        return {"cursor": self._cursor, "batch_size": self.batch_size}

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
            self._board.reset(epoch, 0, self.lanes)
            self._epoch_chosen = True
        _distributed.check(self, when="at set_epoch")

    def _iteration_key(self) -> tuple[int, int, int]:
        """(key, worker, workers) of the iteration this copy is starting. The workers of one
        DataLoader iteration share a key by construction: the DataLoader draws a base seed per
        iterator and gives worker w the seed base + w, and a persistent worker counts the
        iterations it was asked for (every worker is told of every one). Two iterators seeded
        alike draw the same base, so the key also names the iterator's batch of worker
        processes: the DataLoader creates worker w as the w-th of consecutive processes of
        the main process (``multiprocessing`` numbers them), so a fresh worker of a later
        iterator never takes the key of an earlier iteration, even one cut short before that
        worker's predecessor started. An iteration in the main process gets a key of its own."""
        self._iterations += 1
        info = get_worker_info()
        if info is None:
            return int.from_bytes(os.urandom(8), "little") >> 1, 0, 1
        base = (int(info.seed) - int(info.id)) % 2**64
        # () for a worker that is a thread of the main process: its iterator has no batch.
        number = multiprocessing.current_process()._identity
        batch = (*number[:-1], number[-1] - int(info.id)) if number else ()
        text = f"{base}/{self._iterations}/{batch}"
        digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1, int(info.id), int(info.num_workers)

    def _begin_iteration(self) -> tuple[int, int, int, int, str | None]:
        """(key, epoch, cursor, lanes) of the iteration starting in this copy, and the warning
        that its epoch repeats the previous iteration's order (given at the first item: raised
        from ``iter()`` in a DataLoader worker, an error would end the worker without its
        message)."""
        key, worker, workers = self._iteration_key()
        self._epoch_chosen = False
        resume = None
        if self._resume_pending and not self._resume_on_board:
            resume = (self.epoch, self._cursor, self._pass_lanes)
        self._resume_pending = False
        epoch, cursor, lanes, repeated = self._board.join(
            key, worker, workers, resume, self.auto_epoch, self.lanes
        )
        self._start_pass(epoch, cursor, lanes=lanes)
        if not (repeated and self.shuffle) or self._epoch_warned or worker != 0:
            return key, epoch, cursor, lanes, None
        self._epoch_warned = True
        where = (
            " (in a DataLoader worker). Call stream.set_epoch(epoch) in the main process "
            "before each epoch, which reaches the workers (persistent ones too), or build the "
            "stream with auto_epoch=True, which starts the next epoch at every new iteration"
            if get_worker_info() is not None
            else ". Call stream.set_epoch(epoch) before each epoch or build the stream with "
            "auto_epoch=True"
        )
        return (
            key,
            epoch,
            cursor,
            lanes,
            f"fastshard.ShardedStream: a new iteration started at epoch {epoch}, which an "
            f"earlier iteration already read, so it repeats the same order{where}.",
        )

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

        Every call starts an iteration: the first after construction, ``set_epoch`` or
        ``load_state_dict`` reads the epoch (and, after a resume, the rest of it) they set;
        with ``auto_epoch=True`` each later one reads the next epoch, whether or not the
        previous one was read to its end. All the workers of one DataLoader iteration read
        the same epoch.

        Raises
        ------
        fastshard.ReshardedError
            Under accelerate's ``IterableDatasetShard`` with ``num_replicas > 1``.
        """
        splitter = _frameworks.accelerate_split(_ITERABLE_SPLITTERS)
        _frameworks.check_not_resharded(self, *splitter)
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is not None:
            _watchdog.watch_trainer()  # a worker ends with its trainer (persistent ones too)
        key, epoch, cursor, lanes, repeat = self._begin_iteration()
        if info is None:
            _distributed.check(self)
        it = _StreamIterator(self, epoch, cursor, worker, workers, lanes)
        it.key = key
        it.warnings = [] if repeat is None else [(repeat, EpochWarning)]
        readers = self.batch_size * self.num_replicas * workers
        if lanes % readers and worker == 0:
            sharing = readers // math.gcd(lanes, readers)
            it.warnings.append(
                (
                    f"fastshard.ShardedStream: lanes={lanes} is not a multiple of "
                    f"batch_size * num_replicas * num_workers = {self.batch_size} * "
                    f"{self.num_replicas} * {workers} = {readers}, so each lane is read by up "
                    f"to {sharing} readers, each reading up to {sharing}x the rows it yields. "
                    + (
                        f"The lanes are those of the epoch resumed from a checkpoint; the "
                        f"next epoch uses {self.lanes}."
                        if lanes != self.lanes
                        else f"Build the stream with lanes a multiple of {readers} (the same "
                        "lanes on resume: they define the order)."
                    ),
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

        Raises
        ------
        RuntimeError
            In the main process of a stream that DataLoader workers read since the last
            ``set_epoch`` or ``load_state_dict``: this copy does not see what the workers
            yielded, and a state from it would restart the epoch. Checkpoint the loader
            (torchdata's ``StatefulDataLoader``) instead.

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
        if get_worker_info() is None and self._board.read_by_workers():
            raise RuntimeError(
                "ShardedStream.state_dict() in the main process of a stream that DataLoader "
                "workers read: the workers iterate their own copies, so this one does not know "
                "how far they got, and its state would restart the epoch. Checkpoint the "
                "loader instead: torchdata.stateful_dataloader.StatefulDataLoader(stream, ...)"
                ".state_dict(), which stream.load_state_dict() reads on any number of ranks and "
                "workers (docs/streams.md, Resume)."
            )
        it = self._iterator
        cursor = self._cursor if it is None else it.global_cursor()
        return _state.make(self._config(), self.epoch, min(cursor, self.num_rows))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint saved on any number of ranks and workers: a state of
        :meth:`state_dict`, or the ``state_dict()`` of a torchdata ``StatefulDataLoader``
        over a stream (any rank's). The next iteration yields the rest of the saved epoch
        over this stream's ranks and workers, nothing lost and nothing repeated.

        A stream built with the default ``lanes`` (``lanes=None``) reads the rest of the
        saved epoch with the lanes it was saved with (the default depends on the batch size
        and the number of ranks, which may have changed), and its own from the next epoch
        on. An explicit ``lanes`` must equal the saved one.

        Parameters
        ----------
        state : dict
            The stream's or the loader's state.

        Raises
        ------
        ValueError, TypeError
            A state of another configuration (sizes, seed, an explicit lanes, ...) or not a
            stream's; the stream is left unchanged.
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
            state = _merge_readers(readers, _steps_since_snapshot(state), _loader_finished(state))
        lanes = self._saved_lanes(state)
        epoch, cursor, _ = _state.check(state, self._config(lanes))
        if self._epoch_chosen and self.epoch > epoch and not self._lengths(cursor)[1]:
            # A state saved at the end of its epoch, loaded after set_epoch chose a later one
            # (torchdata's StatefulDataLoader without workers loads the stream's state when
            # it makes its iterator, after the loop's set_epoch): nothing of the saved epoch
            # is left, and going back to it would read it again in place of the chosen one.
            _distributed.check(self, when="at load_state_dict")
            return
        self._start_pass(epoch, cursor, resumed=True, lanes=lanes)
        if get_worker_info() is None:  # a worker restoring its own copy leaves the board alone
            self._board.reset(epoch, cursor, lanes)
            self._resume_on_board = True
        _distributed.check(self, when="at load_state_dict")

    def _saved_lanes(self, state: Any) -> int:
        """The lanes a state's epoch resumes with: the saved ones for a stream of default
        lanes; an explicit lanes must equal them."""
        saved = state.get("lanes") if isinstance(state, dict) else None
        if type(saved) is not int or saved < 1:
            return self.lanes  # _state.check names what is wrong with the state
        if self._lanes_given and saved != self.lanes:
            raise ValueError(
                f"state was saved with lanes={saved} but this stream has lanes={self.lanes}: "
                f"the lanes define the epoch's order. Build the stream with lanes={saved} (or "
                "with the default lanes=None, which reads the rest of the saved epoch with the "
                "saved lanes and its own default from the next epoch on)"
            )
        return saved

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
        self,
        stream: ShardedStream,
        epoch: int,
        cursor: int,
        worker: int,
        workers: int,
        lanes: int | None = None,
    ) -> None:
        self.stream = stream
        self.epoch = epoch
        self.cursor = cursor
        self.lanes = stream.lanes if lanes is None else lanes
        self.key = 0  # the iteration's key on the stream's epoch board
        self.worker = worker
        self.workers = workers
        self.yielded = 0
        self.done = False
        # What was read: read() calls, rows taken from them, rows yielded.
        self.reads = 0
        self.rows_read = 0
        self.warnings: list[tuple[str, type[Warning]]] = []  # given at the first item
        self._started = False
        # The current batch's places (lane, window, row in window) not yet yielded, reversed:
        # an item's lane window is read when the item is reached, not when its batch starts.
        self._places: list[list[int]] = []
        self._epoch_plan: Any = None  # the pass's compiled plan, set by the first batch
        self._lanes: dict[int, _Lane] = {}

    def __iter__(self) -> _StreamIterator:
        return self

    def __next__(self) -> Any:
        places = self._places
        if not places:
            if not self._started:
                self._started = True
                for message, category in self.warnings:
                    warnings.warn(message, category, stacklevel=2)
                self._prefetch()
            places = self._places = self._next_places()
            if not places:
                self._finish()
                raise StopIteration
        lane_id, window, u = places[-1]
        lane = self._lanes.get(lane_id)
        if lane is None:
            lane = self._lanes[lane_id] = _Lane(*self._epoch_plan.lane(lane_id))
        if lane.window != window:  # forward: a lane's windows are reached in order
            self._load(self._epoch_plan, lane_id, lane, window)
        order = lane.order
        item = lane.items[u if order is None else order[u]]
        places.pop()  # after the read: an item whose read raised is still to come
        self.yielded += 1
        return item

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            self.close()

    def close(self) -> None:
        """Close the open reads (the iterator yields nothing more)."""
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()
        cancel = getattr(self.stream.read, "cancel_prefetch", None)
        if cancel is not None:
            cancel()

    def _prefetch(self) -> None:
        """Offer a ``read`` that can fetch ahead (``read.prefetch``: the readers of
        fastshard.readers, which use it for remote shards) a function that lists every read
        this reader will open in the pass, as ``(shard, start, stop, key)``: its lanes,
        found in the batches that first reach each of them, each from the window where this
        reader enters it, cut into the reads that :meth:`_load` will open; ``key`` is the row
        of the lane at which a read starts. Lanes are read side by side, a row of each in
        turn, so ``key`` orders the reads by when they are needed."""
        prefetch = getattr(self.stream.read, "prefetch", None)
        if prefetch is not None:
            prefetch(self._reads)

    def _reads(self) -> list[tuple[int, int, int, int]]:
        s = self.stream
        count = s._lengths(self.cursor)[0]
        b = s.batch_size
        plan = s._plan(self.epoch, self.lanes)
        first: dict[int, int] = {}  # lane -> the window this reader enters it at
        j, skip = divmod(self.yielded, b)
        # A rank meets all its lanes within lanes / num_replicas of its items.
        horizon = (self.worker + j * self.workers) * b + -(-self.lanes // s.num_replicas)
        while True:
            lo = (self.worker + j * self.workers) * b
            if lo >= count or (first and lo > horizon + b * self.workers):
                break
            places = plan.places(
                self.cursor + s.rank, s.num_replicas, lo + skip, min(lo + b, count)
            )
            for lane, window, _ in places.tolist():
                first.setdefault(lane, window)
            j, skip = j + 1, 0
        m = s.window
        reads: list[tuple[int, int, int, int]] = []
        for lane, window in first.items():
            start, length = plan.lane(lane)
            at = 0
            for shard, a, z in plan.segments(start + window * m, start + length).tolist():
                reads.append((shard, a, z, at))
                at += z - a
        reads.sort(key=lambda r: r[3])
        return reads

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
        """The epoch's positions consumed by every rank once this reader's latest item is:
        at the k-th item of every rank, all positions before k * W. Once the rank's last
        batch is taken and the pass has ended here (a DataLoader's fetch of a short last batch
        ends with the iterator's StopIteration), the whole pass is, every rank's: with
        ``pad=False`` a rank's share can be an item shorter than another's, its last batch
        short of ``batch_size`` or a whole step behind the longest rank's last one.
        Before the StopIteration the rank may be stepping item by item (``state_dict`` after
        any item, without a DataLoader), and the other ranks at their k-th item too."""
        s = self.stream
        count, total = s._lengths(self.cursor)
        consumed = self._consumed(self.yielded)
        if consumed == count and self.done:
            # Every step of this rank is taken and its loop has ended: with pad=False another
            # rank may still take a step more (7 items, 2 ranks, batch 3: two steps and one),
            # which a resume from this state must not read again.
            return self.cursor + total
        return self.cursor + min(consumed * s.num_replicas, total)

    def _next_places(self) -> list[list[int]]:
        """The places (lane, window, row in window) of this reader's next batch (or of what is
        left of it after a resume), reversed for pop(); empty at the end of the pass."""
        s = self.stream
        count = s._lengths(self.cursor)[0]
        b = s.batch_size
        j, skip = divmod(self.yielded, b)
        lo = (self.worker + j * self.workers) * b
        if lo >= count:
            return []
        plan = self._epoch_plan = s._plan(self.epoch, self.lanes)
        hi = min(lo + b, count)
        places: list[list[int]] = plan.places(
            self.cursor + s.rank, s.num_replicas, lo + skip, hi
        ).tolist()
        places.reverse()
        return places

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
        state = _state.make(s._config(self.lanes), self.epoch, self.cursor)
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
        lanes = s._saved_lanes(state)
        epoch, cursor, _ = _state.check(state, s._config(lanes))
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
        self.epoch, self.cursor, self.yielded, self.lanes = epoch, cursor, yielded, lanes
        s._start_pass(epoch, cursor, lanes=lanes)
        s._iterator = self
        s._board.restore(self.key, epoch, cursor)


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


def _loader_finished(state: Any) -> bool:
    """Whether a torchdata StatefulDataLoader state was saved after the loader's iteration
    ended (its workers' snapshots are those of their last batches, before they ran out)."""
    return isinstance(state, dict) and state.get("_iterator_finished") is True


def _merge_readers(
    readers: list[dict[str, Any]], steps: int, finished: bool = False
) -> dict[str, Any]:
    """One rank- and worker-free state from the readers' states of one loader: the readers
    deliver their batches in turn, so the one furthest along holds the loader's position.
    ``finished``: the loader's iteration ended, so this rank's pass did, and the state is the
    pass's end (with ``pad=False`` another rank may take a step more than this one)."""
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
    state["cursor"] = best["rows"] if finished else min(cursor, best["rows"])
    return state
