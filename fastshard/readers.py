"""Shard files as ``(shard_sizes, read)`` for :class:`fastshard.ShardedStream`.

>>> from fastshard import ShardedStream, readers
>>> sizes, read = readers.tar_shards(sorted(glob.glob("shards/*.tar")))
>>> stream = ShardedStream(sizes, read, batch_size=32)

``tar_shards`` reads WebDataset-style tar shards, ``parquet_shards`` Parquet files and
``mds_shards`` Mosaic streaming's MDS shards. Each counts the items of every shard once, when
it is called (tar: a header scan in C++, or a shard index written once by ``python -m
fastshard index``; Parquet: the row counts in each file's footer; MDS: its ``index.json``), and
returns a :class:`Shards` pair whose ``read(shard, start, stop)`` yields rows ``[start, stop)``
lazily, starting as close to ``start`` as the format allows without decoding what lies before.

Bounds, whatever the number of open reads (a stream keeps one per lane, and may have
thousands): a read holds no open file between items. Files are opened by a per-process pool
of at most ``max_open_files`` (default 64), least recently used closed first, created in the
process that reads (a DataLoader worker) and never pickled; reads at offsets (``os.pread``)
let any number of open reads share one file. An open tar read buffers at most one index
interval (``index_every`` samples); Parquet row groups are decoded once into a per-process
cache of at most ``cache_bytes`` (default 256 MiB) that every open read slices rows from.
"""

from __future__ import annotations

import copy
import importlib
import mmap
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, ClassVar, NamedTuple, Union

import numpy as np

from . import _core, _index, _storage
from ._storage import RemoteReadError
from ._stream import ReadAmplificationWarning

__all__ = [
    "MdsRead",
    "ParquetRead",
    "RemoteReadError",
    "RowGroupCacheWarning",
    "Shards",
    "TarRead",
    "mds_shards",
    "parquet_shards",
    "tar_shards",
    "write_tar_index",
]

PathLike = Union[str, "os.PathLike[str]"]
Opener = Callable[[str], IO[bytes]]

# The byte offset of every INDEX_EVERY-th sample of a tar shard is kept (8 bytes per 16
# samples): a read that starts at row r walks the headers of fewer than INDEX_EVERY samples,
# and an open read buffers at most INDEX_EVERY samples.
INDEX_EVERY = 16
# Open shard files per process (per DataLoader worker): well under the usual limit of 1,024.
MAX_OPEN_FILES = 64
# Decoded Parquet row groups kept per process: the row groups the lanes read at once, about
# min(lanes, row groups) of them, are decoded once while they fit (bench/streams_start.py: all
# 80 row groups of 1 MiB of its dataset at batch 32; 256 lanes of 1 MiB row groups at most).
CACHE_BYTES = 256 << 20
# Parsed Parquet footers kept per process, counted by their serialized size: a file that the
# pool closed and opens again skips reading and parsing its footer (~75 us of a ~95 us open).
FOOTER_BYTES = 32 << 20
# Rows turned into Python objects at a time by a Parquet or MDS read.
PY_ROWS = 16
# What a Python row costs beside its Arrow bytes, counted against a RowGroupCache's bound: a
# dict and a list slot, then an object header a value (measured: 224 bytes a row of one int,
# 286 of three, 1,224 of one 1,000-byte bytes against Arrow's 8, 24 and 1,004).
PY_ROW_BYTES = 192
PY_VALUE_BYTES = 48
# A read that comes back to a row group the cache dropped keeps at most 1/PRIVATE_SHARE of
# the cache's bytes of its own rows.
PRIVATE_SHARE = 64


# This process's id, kept current in forked children: the pools and caches compare it on
# every read, which os.getpid() (a system call) would make cost more than the read.
_pid = os.getpid()
# Guards a remote reader's list of expected ranges against the thread that adds to it (see
# TarRead.prefetch); made anew in a forked child, where a parent's thread may have held it.
_expect_lock = threading.Lock()


def _after_fork() -> None:
    global _pid, _expect_lock
    _pid = os.getpid()
    _expect_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _this_pid() -> int:
    return _pid if hasattr(os, "register_at_fork") else os.getpid()


class Shards(NamedTuple):
    """``(shard_sizes, read)``: the first two arguments of :class:`fastshard.ShardedStream`."""

    sizes: np.ndarray
    read: Callable[[int, int, int], Iterator[Any]]


def _paths(paths: Any) -> list[str]:
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError("paths must be a sequence of paths, one per shard, not a single path")
    out = [os.fspath(p) for p in paths]
    if not out:
        # An empty stream would read nothing and say nothing.
        raise ValueError("no shard paths given (a glob that matched nothing?)")
    return out


def _rows(shard: int, start: int, stop: int, sizes: np.ndarray) -> int:
    if not 0 <= shard < len(sizes):
        raise IndexError(f"shard {shard} out of range for {len(sizes)} shards")
    size = int(sizes[shard])
    if not 0 <= start <= stop <= size:
        raise ValueError(f"rows [{start}, {stop}) out of range for shard {shard} of {size} rows")
    return size


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


# -- the pool of open files ---------------------------------------------------------------------
class FilePool:
    """At most ``max_open`` open files of one process, the least recently used closed first.

    ``open(path)`` opens a file (an ``int`` descriptor by default), ``close(handle)`` closes
    it, ``size`` (optional) says the length each path must have. A pool belongs to the
    process that created it: a forked child that finds its parent's pool closes its copies of
    the files and starts an empty one (see :meth:`for_process`).
    """

    def __init__(
        self,
        max_open: int,
        open: Callable[[str], Any] | None = None,
        close: Callable[[Any], None] | None = None,
        size: Callable[[str], int] | None = None,
    ) -> None:
        self.max_open = max_open
        self._open = open or _open_fd
        self._close = close or _close_handle
        self._size = size
        self.pid = _this_pid()
        self.files: OrderedDict[str, Any] = OrderedDict()
        self.opened = 0  # files opened so far (a measure of the pool's churn)
        # One reader thread at a time per pool: a file object's seek + read are one step.
        self.lock = threading.RLock()

    def get(self, path: str) -> Any:
        """The open handle of ``path`` (hold :attr:`lock` while using it)."""
        files = self.files
        handle = files.get(path)
        if handle is not None:
            files.move_to_end(path)
            return handle
        while len(files) >= self.max_open:
            _, old = files.popitem(last=False)
            self._close(old)
        handle = self._open(path)
        self.opened += 1
        if self._size is not None:
            want = self._size(path)
            have = _handle_size(handle)
            if want >= 0 and have >= 0 and have != want:
                self._close(handle)
                raise ValueError(
                    f"{path}: {have} bytes, but the shard index says {want}: the file changed "
                    "after the index was written; write the index again"
                )
        files[path] = handle
        return handle

    def read(self, path: str, offset: int, n: int) -> bytes:
        """``n`` bytes of ``path`` at ``offset`` (fewer at its end)."""
        with self.lock:
            handle = self.get(path)
            if isinstance(handle, int):
                return _pread(handle, n, offset)
            handle.seek(offset)
            data: bytes = handle.read(n)
            return data

    def close(self) -> None:
        with self.lock:
            while self.files:
                _, handle = self.files.popitem()
                self._close(handle)

    def __del__(self) -> None:
        # A read object dropped with its pool: its files are closed, not leaked.
        try:
            if self.pid == _this_pid():
                self.close()
        except Exception:  # interpreter shutdown
            pass

    @staticmethod
    def for_process(pool: FilePool | None, make: Callable[[], FilePool]) -> FilePool:
        """``pool`` if it was made in this process; otherwise a new one from ``make()``."""
        if pool is not None and pool.pid == _this_pid():
            return pool
        if pool is not None:  # inherited through fork: this process's copies of the files
            pool.close()
        return make()


def _open_fd(path: str) -> int:
    return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


def _close_handle(handle: Any) -> None:
    if isinstance(handle, int):
        os.close(handle)
    else:
        handle.close()


def _handle_size(handle: Any) -> int:
    if isinstance(handle, int):
        return os.fstat(handle).st_size
    try:
        return os.fstat(handle.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return -1


if hasattr(os, "pread"):

    def _pread(fd: int, n: int, offset: int) -> bytes:
        data = os.pread(fd, n, offset)
        if len(data) == n or not data:
            return data
        parts = [data]
        got = len(data)
        while got < n:
            more = os.pread(fd, n - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

else:  # pragma: no cover - Windows: the pool's lock makes seek + read one step

    def _pread(fd: int, n: int, offset: int) -> bytes:
        os.lseek(fd, offset, os.SEEK_SET)
        parts = []
        got = 0
        while got < n:
            more = os.read(fd, n - got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)


def _check_pool_args(max_open_files: int) -> int:
    return _positive(max_open_files, "max_open_files")


# -- remote shards ------------------------------------------------------------------------------
# The defaults of the keyword arguments that every reader takes for shards at URLs
# (docs/streams.md, "Object storage"), as literals so that the reference shows their values;
# _storage's defaults are the same (tests/test_remote.py checks).
MAX_INFLIGHT_BYTES = 128 << 20  # fetched and not yet read, per process
MAX_REQUESTS = 16  # requests in flight, per process
RETRIES = 8  # attempts after the first, per range


def _remote_options(
    storage_options: dict[str, Any] | None,
    max_inflight_bytes: int,
    max_requests: int,
    retries: int,
    cache_dir: PathLike | None,
    cache_limit: int | None,
) -> _storage.Options:
    """The readers' remote keyword arguments, checked, as the storage module takes them."""
    return _storage.options(
        storage_options,
        max_inflight_bytes=max_inflight_bytes,
        max_requests=max_requests,
        retries=retries,
        cache_dir=cache_dir,
        cache_bytes=cache_limit,
    )


def _remote(paths: list[str]) -> bool:
    """Whether the shards are at URLs (all of them) or local (all of them)."""
    remote = [_storage.is_url(p) for p in paths]
    if any(remote) and not all(remote):
        first = paths[remote.index(True)]
        local = paths[remote.index(False)]
        raise ValueError(
            f"the shards mix URLs ({first!r}) and local paths ({local!r}): pass one kind"
        )
    return bool(remote) and remote[0]


class _Prefetch:
    """What a reader of remote shards shares: this process's :class:`_storage.Fetcher`, and
    the ranges it asked to fetch ahead and has not taken (forgotten at the next pass)."""

    storage: _storage.Options | None = None
    _expected: list[tuple[str, int, int]] | None = None

    def _fetcher(self) -> _storage.Fetcher:
        assert self.storage is not None
        return _storage.fetcher(self.storage)

    def _expect(
        self, ranges: list[tuple[str, int, int, float, float]], open_at_once: int | None = None
    ) -> None:
        fetcher = self._fetcher()
        with _expect_lock:
            if self._expected:
                fetcher.forget(self._expected)
            self._expected = []
            # The reads that start a lane (key 0) are the reads open at once: they split the
            # bound.
            if open_at_once is None:
                open_at_once = sum(r[3] == 0 for r in ranges)
            fetcher.concurrency = max(1, open_at_once)
        self._expect_more(ranges, self._expected)

    def _expect_more(self, ranges: list[tuple[str, int, int, float, float]], token: Any) -> None:
        """Expect ``ranges`` too, unless the pass that ``token`` (its list) stands for ended."""
        fetcher = self._fetcher()
        with _expect_lock:
            expected = self._expected
            if expected is None or expected is not token:
                return
            for url, lo, hi, key, rows in ranges:
                expected.append((url, lo, hi))
                fetcher.expect(url, lo, hi, key, rows)

    def cancel_prefetch(self) -> None:
        """Drop what :meth:`prefetch` asked for and was not read."""
        with _expect_lock:
            if self._expected and self.storage is not None:
                self._fetcher().forget(self._expected)
            self._expected = None


# -- tar ----------------------------------------------------------------------------------------
def _not_tar(err: Exception) -> ValueError:
    return ValueError(
        f"{err}: not an uncompressed tar file; tar_shards seeks inside shards, which a "
        "compressed stream cannot do: store shards as plain .tar"
    )


def _scan_tars(
    paths: list[str],
    every: int,
    opener: Opener | None,
    storage: _storage.Options | None = None,
    filesizes: list[int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(counts, bounds, flat offsets, ends) of tar shards, by the C++ header scan; the
    length of each remote shard is appended to ``filesizes`` if given."""
    try:
        if opener is None and storage is None:
            counts, bounds, offsets, ends = _core.tar_scan_paths(paths, every)
            return counts, bounds, offsets, ends
        c, parts, e = [], [], []
        for p in paths:
            # A remote shard is read front to back in large ranged GETs (its headers are spread
            # over all of it): one pass, no seek back.
            f: Any = opener(p) if storage is None else _storage.RemoteFile(p, storage)
            with f:
                n, offs, end = _core.tar_scan(f, every, p)
                if filesizes is not None and storage is not None:
                    filesizes.append(f.length)
            c.append(n)
            parts.append(offs)
            e.append(end)
    except _core.NotTarError as err:
        raise _not_tar(err) from None
    bounds = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum([len(o) for o in parts], out=bounds[1:])
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return (np.asarray(c, dtype=np.int64), bounds, flat, np.asarray(e, dtype=np.int64))


class _ShardRead:
    """What the readers share: ``read(shard, start, stop)`` checks the range against the
    shard sizes, then reads; a pickle carries the per-process state (open files, decoded
    data: ``_PER_PROCESS``, each attribute with the value a process starts from) empty."""

    sizes: np.ndarray
    _PER_PROCESS: ClassVar[dict[str, Any]] = {"_pool": None}

    def __call__(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        _rows(shard, start, stop, self.sizes)
        return self._read(shard, start, stop)

    def _read(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update({name: copy.copy(empty) for name, empty in self._PER_PROCESS.items()})
        return state


class TarRead(_ShardRead, _Prefetch):
    """``read(shard, start, stop)`` over tar shards (see :func:`tar_shards`). Holds the
    paths and, per shard, the byte offset of every ``index_every``-th sample and the end of
    its last sample; shards counted without offsets are scanned in the process that first
    reads them (headers only, once). Pickles as paths and offset tables: the pool of open
    files is made afresh in each process."""

    _PER_PROCESS: ClassVar[dict[str, Any]] = {"_pool": None, "_scanned": {}, "_expected": None}
    counted_by = "shard_sizes"  # where the counts came from, for a shard of another count

    def __init__(
        self,
        paths: list[str],
        sizes: np.ndarray,
        index: _index.TarOffsets
        | _index.TarOffsetsFile
        | tuple[np.ndarray, np.ndarray, np.ndarray]
        | None,
        index_every: int,
        opener: Opener | None,
        max_open_files: int = MAX_OPEN_FILES,
        filesizes: np.ndarray | None = None,
        storage: _storage.Options | None = None,
    ) -> None:
        self.storage = storage  # None: local files; else how the URLs are read
        self._expected = None
        self.paths = paths
        self.sizes = sizes
        # Shard s's indexed byte offsets and the end of its last sample (a tuple: the flat
        # arrays (bounds, offsets, ends), see _index.TarOffsets).
        if isinstance(index, tuple):
            index = _index.TarOffsets(*index)
        self.index = index
        self.index_every = index_every
        self.opener = opener
        self.max_open_files = max_open_files
        self.filesizes = filesizes
        self._pool: FilePool | None = None
        self._scanned: dict[int, tuple[np.ndarray, int, int]] = {}

    def files(self) -> FilePool:
        """This process's pool of open shard files."""
        self._pool = pool = FilePool.for_process(self._pool, self._make_pool)
        return pool

    def _make_pool(self) -> FilePool:
        opener = self.opener
        size = None
        if self.filesizes is not None:
            where = {p: i for i, p in enumerate(self.paths)}
            fs = self.filesizes
            size = lambda path: int(fs[where[path]])  # noqa: E731
        if opener is None:
            return FilePool(self.max_open_files, size=size)
        return FilePool(self.max_open_files, open=opener, size=size)

    def _skip(self, path: str, at: int, samples: int) -> tuple[int, int]:
        """(offset of the sample ``samples`` after the one at byte ``at``, samples passed)."""
        pool = self.files()
        with pool.lock:
            found: tuple[int, int] = _core.tar_skip(pool.get(path), at, samples, path)
            return found

    def _offsets(self, shard: int) -> tuple[np.ndarray, int, int]:
        """(offsets of every index_every-th sample, end of the last sample, samples held)."""
        if self.index is not None:
            offsets, end = self.index.shard(shard)
            path = self.paths[shard]
            have = -1
            if self.storage is None:
                pool = self.files()
                with pool.lock:
                    have = _handle_size(pool.get(path))
            if have >= 0 and end > have:  # an index without file sizes: checked here
                raise ValueError(
                    f"{self.index.where}: shard {shard}'s end {end} lies past the end of "
                    f"{path} ({have} bytes): the index is damaged; write it again"
                )
            return offsets, end, int(self.sizes[shard])
        found = self._scanned.get(shard)
        if found is None:
            path = self.paths[shard]
            try:
                if self.storage is not None:
                    length = -1 if self.filesizes is None else int(self.filesizes[shard])
                    with _storage.RemoteFile(path, self.storage, length) as f:
                        n, offs, end = _core.tar_scan(f, self.index_every, path)
                else:
                    pool = self.files()
                    with pool.lock:
                        n, offs, end = _core.tar_scan(pool.get(path), self.index_every, path)
            except _core.NotTarError as err:
                raise _not_tar(err) from None
            if int(n) != int(self.sizes[shard]):
                raise self._miscounted(shard, int(n))
            found = self._scanned[shard] = (offs, int(end), int(n))
        return found

    def _span(self, shard: int, start: int, stop: int) -> tuple[int, int]:
        """The bytes a remote read of samples ``[start, stop)`` fetches: from the indexed
        sample at or before ``start`` to the indexed sample at or after ``stop`` (exactly the
        samples' bytes when every sample is indexed, as for remote shards by default)."""
        offsets, end, _ = self._offsets(shard)
        every = self.index_every
        slot, last = start // every, -(-stop // every)
        if slot >= len(offsets):
            return end, end
        return int(offsets[slot]), (int(offsets[last]) if last < len(offsets) else end)

    def prefetch(self, reads: Callable[[], list[tuple[int, int, int, int]]]) -> None:
        """Start fetching what this process will read: ``reads()`` lists the reads
        ``(shard, start, stop, key)`` of the pass, to be fetched in the order of ``key``
        (ShardedStream gives the lane row at which each starts). Nothing for local shards
        (``reads`` is not even called), nor for shards whose offsets are not known yet."""
        if self.storage is None:
            return
        listed = [r for r in reads() if r[1] < r[2]]
        if isinstance(self.index, _index.TarOffsetsFile):
            # Offsets in the index's sidecar: those of the shards the lanes start in now (the
            # first batches need them), the rest on a thread of their own, in need order, each
            # read expected once its shard's offsets are in.
            first = [r for r in listed if r[3] == 0]
            self.index.load(sorted({r[0] for r in first}))
            self._expect(self._ranges(first), open_at_once=len(first))
            rest = [r for r in listed if r[3] != 0]
            if rest:
                token = self._expected
                threading.Thread(target=self._expect_later, args=(rest, token), daemon=True).start()
            return
        self._expect(self._ranges(listed))

    def _ranges(
        self, listed: list[tuple[int, int, int, int]]
    ) -> list[tuple[str, int, int, float, float]]:
        ranges = []
        for shard, start, stop, key in listed:
            if self.index is not None or shard in self._scanned:
                lo, hi = self._span(shard, start, stop)
                ranges.append((self.paths[shard], lo, hi, float(key), float(stop - start)))
        return ranges

    def _expect_later(self, rest: list[tuple[int, int, int, int]], token: Any) -> None:
        assert isinstance(self.index, _index.TarOffsetsFile)
        try:
            for i in range(0, len(rest), 256):
                part = rest[i : i + 256]
                if self._expected is not token:  # the pass ended or another began
                    return
                self.index.load(sorted({r[0] for r in part}))
                self._expect_more(self._ranges(part), token)
        except Exception:  # the read that needs these offsets fetches them and raises
            return

    def _read_remote(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        path = self.paths[shard]
        offsets, end, held = self._offsets(shard)
        every = self.index_every
        slot, last = start // every, -(-stop // every)
        if slot >= len(offsets):
            raise ValueError(f"shard {shard}: sample {start} has no offset in the shard index")
        lo, hi = self._span(shard, start, stop)
        src = self._fetcher().take(path, lo, hi)
        try:
            # Blocks of about 16 samples, cut at indexed samples: one C++ parse each.
            step = max(1, 16 // every)
            n, at = slot * every, lo
            while n < stop and slot < last:
                nxt = min(slot + step, last)
                until = int(offsets[nxt]) if nxt < len(offsets) else end
                if until <= at:
                    raise self._miscounted(shard, n)
                block = src.read(until - at)
                samples = _core.tar_samples(block, path, path)
                del block
                if len(samples) != min(nxt * every, held) - n:
                    # Checked before yielding: no sample past the count is passed on.
                    raise self._miscounted(shard, n + len(samples), at, until, end)
                yield from samples[max(0, start - n) : stop - n]
                n, slot, at = nxt * every, nxt, until
        finally:
            src.close()

    def _miscounted(
        self, shard: int, have: int, at: int = 0, until: int = 0, end: int = 0
    ) -> ValueError:
        """The error of a shard that holds ``have`` samples, not the count it was given (or,
        when bytes ``[at, until)`` end before ``end``, holds another number up to ``until``)."""
        source = self.counted_by
        if until < end:
            return ValueError(
                f"{self.paths[shard]}: {have} samples up to byte {until}, where {source} and its "
                "offsets put another number: the file changed after it was counted"
            )
        return ValueError(
            f"{self.paths[shard]}: holds {have} samples, but {source} says "
            f"{int(self.sizes[shard])}: the count must be the shard's exact number of samples "
            "(a file changed after it was counted?)"
        )

    def _read(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        if start == stop:
            return
        if self.storage is not None:
            yield from self._read_remote(shard, start, stop)
            return
        path = self.paths[shard]
        every = self.index_every
        offsets, end, held = self._offsets(shard)
        slot = start // every
        if slot >= len(offsets):
            raise ValueError(f"shard {shard}: sample {start} has no offset in the shard index")
        n, at = slot * every, int(offsets[slot])
        if n < start:
            at, passed = self._skip(path, at, start - n)
            if passed < start - n:
                raise self._miscounted(shard, n + passed)
            n = start
        pool = self.files()
        while n < stop:
            # The next block: up to the next indexed sample, the end, or `stop` (found by
            # walking headers) when the read stops inside an interval.
            nxt = (n // every + 1) * every
            target = min(nxt, stop)
            if target >= held:
                target, until = held, end
            elif target == nxt:
                until = int(offsets[nxt // every])
            else:
                until, _ = self._skip(path, at, target - n)
            if until <= at:
                raise self._miscounted(shard, n)
            block = pool.read(path, at, until - at)
            samples = _core.tar_samples(block, path, path)
            del block
            if len(samples) != target - n:
                # Checked before yielding: no sample past the count is passed on.
                raise self._miscounted(shard, n + len(samples), at, until, end)
            yield from samples[: stop - n]
            n, at = target, until

    def __repr__(self) -> str:
        return f"fastshard.readers.TarRead({len(self.paths)} shards)"


def tar_shards(
    paths: Sequence[PathLike] | None = None,
    *,
    index: PathLike | None = None,
    sizes: Sequence[int] | None = None,
    index_every: int = INDEX_EVERY,
    opener: Opener | None = None,
    max_open_files: int = MAX_OPEN_FILES,
    share_counts: bool = False,
    storage_options: dict[str, Any] | None = None,
    max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
    max_requests: int = MAX_REQUESTS,
    retries: int = RETRIES,
    cache_dir: PathLike | None = None,
    cache_limit: int | None = None,
) -> Shards:
    """WebDataset-style tar shards as ``(shard_sizes, read)``.

    A sample is a run of consecutive regular members whose names share a key: member
    ``"a/b/0001.jpg"`` is field ``"jpg"`` of sample ``"a/b/0001"`` (the key ends at the first
    dot of the last path component, the extension is lower-cased; members named ``__*__`` and
    names without a dot are skipped), as webdataset groups them. ``read(shard, start, stop)``
    yields ``{"__key__": key, "__url__": path, ext: bytes, ...}`` for samples ``[start, stop)``.

    Counting, once, the first that applies:

    - ``index``: a shard index (``wids-shard-index-v1`` JSON) written by ``python -m fastshard
      index`` holds the counts and the seek offsets: nothing is scanned. One written by
      webdataset's tools holds counts only; each shard's offsets are then found by a header
      scan in the process that first reads it. Urls are relative to the index's folder.
    - ``sizes`` (one count per path, e.g. from a manifest): no scan here; offsets as above.
    - Otherwise a C++ scan of the member headers (it seeks over member data), keeping the
      byte offset of every ``index_every``-th sample, on each rank. ``share_counts=True``,
      with an initialised ``torch.distributed`` process group of two or more ranks: rank 0
      scans and broadcasts the result, so every rank must then call ``tar_shards`` with the
      same paths at the same point (a collective: a rank that does not call it leaves the
      others waiting until the group's timeout, which is why it is not the default).

    Reading: a read seeks to the nearest indexed sample at or before ``start``, walks the
    headers of the fewer than ``index_every`` samples before ``start``, then reads whole
    samples a block at a time, one block (at most ``index_every`` samples) per ``os.pread``,
    ending at ``stop``. An open read holds one block and no file: files come from a
    per-process pool of at most ``max_open_files``.

    Shards must be uncompressed tar files (a compressed stream cannot seek). ``opener(path)``
    opens a shard as a seekable binary file (default: the file itself, read with
    ``os.pread``); it must pickle, as ``read`` does.

    Shards (and ``index``) may be URLs: ``s3://``, ``http(s)://``, and any other fsspec
    protocol (``gs://``, ``az://``, ``hf://``, ...), read by ranged GETs of exactly the
    samples each process reads, fetched ahead in the order the stream will read them, with
    at most ``max_requests`` requests and ``max_inflight_bytes`` fetched and not yet read
    per process, each failed request retried up to ``retries`` times (backoff, resumed from
    its last byte). ``storage_options`` go to the client (``endpoint_url``, ``region``,
    ``key``/``secret``/``token``, ``anon``, ``profile``; the AWS environment variables and
    profiles by default). Nothing is written to disk unless ``cache_dir`` is given, with
    ``cache_limit`` its bound in bytes (docs/streams.md, "Object storage"). Remote shards are
    indexed at every sample (``index_every=1``) unless an index says otherwise.
    """
    storage = _remote_options(
        storage_options, max_inflight_bytes, max_requests, retries, cache_dir, cache_limit
    )
    if isinstance(index_every, bool) or not isinstance(index_every, int) or index_every < 1:
        raise ValueError(f"index_every must be an int >= 1, got {index_every!r}")
    max_open_files = _check_pool_args(max_open_files)
    filesizes = None
    offsets: (
        _index.TarOffsets | _index.TarOffsetsFile | tuple[np.ndarray, np.ndarray, np.ndarray] | None
    )
    if index is not None:
        if paths is not None or sizes is not None:
            raise ValueError("pass either index= or paths (and sizes=), not both")
        found = _index.shared(
            lambda: _index.read_tar_index(index, storage),
            [os.fspath(index)],
            bool(share_counts),
        )
        ps = found.paths
        arr = found.sizes
        filesizes = found.filesizes
        offsets = found.offsets
        remote = _remote(ps)
        if offsets is not None:
            index_every = found.every
        elif remote:
            index_every = 1
    elif paths is None:
        raise TypeError("tar_shards needs the shard paths or index=")
    else:
        ps = _paths(paths)
        remote = _remote(ps)
        if remote:
            if opener is not None:
                raise ValueError("opener= reads local files: remote shards need none")
            index_every = 1  # ranged reads of exactly each sample's bytes
        if sizes is None:
            lengths: list[int] = []
            counts, bounds, flat, ends, fs = _index.shared(
                lambda: (
                    *_scan_tars(ps, index_every, opener, storage if remote else None, lengths),
                    lengths,
                ),
                ps,
                bool(share_counts),
            )
            arr = np.asarray(counts, dtype=np.int64)
            offsets = (bounds, flat, ends)
            if remote:
                filesizes = np.asarray(fs, dtype=np.int64)
        else:
            arr = np.asarray(sizes, dtype=np.int64)
            if arr.shape != (len(ps),):
                raise ValueError(
                    f"sizes has shape {arr.shape}, expected one count per path ({len(ps)})"
                )
            offsets = None
    read = TarRead(
        ps,
        arr,
        offsets,
        index_every,
        opener,
        max_open_files,
        filesizes,
        storage if remote else None,
    )
    # Where the counts came from, for the error of a shard that holds another number.
    if index is not None:
        where = os.fspath(index)
        where = where if _storage.is_url(where) else os.path.abspath(where)
        read.counted_by = f"the shard index {where}"
    else:
        read.counted_by = "the scan" if sizes is None else "sizes="
    return Shards(arr, read)


def write_tar_index(
    paths: Sequence[PathLike],
    output: PathLike,
    *,
    index_every: int | None = None,
    opener: Opener | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Shards:
    """Scan tar shards once and write their index to ``output`` (``wids-shard-index-v1``
    JSON with fastshard's seek offsets; urls relative to the index's folder). Returns the
    shards as :func:`tar_shards` would; ``tar_shards(index=output)`` reads them back without
    scanning. The command line does the same: ``python -m fastshard index SHARD... -o
    INDEX.json``. Shards and ``output`` may be URLs (``storage_options`` as for
    :func:`tar_shards`); an index of remote shards keeps every sample's offset unless
    ``index_every`` is given, so that reads fetch exactly their samples' bytes."""
    ps = _paths(paths)
    storage = _storage.options(storage_options)
    remote = _remote(ps)
    every = (1 if remote else INDEX_EVERY) if index_every is None else index_every
    _positive(every, "index_every")
    lengths: list[int] = []
    counts, bounds, flat, ends = _scan_tars(ps, every, opener, storage if remote else None, lengths)
    filesizes = lengths if remote else [os.path.getsize(p) for p in ps]
    # An index of remote shards keeps its offsets in a sidecar file, which each process
    # fetches a shard at a time: one with every sample's offset is 10.8 bytes a sample.
    _index.write_tar_index(
        output, ps, counts, every, bounds, flat, ends, filesizes, storage, sidecar=remote
    )
    fs = np.asarray(filesizes, dtype=np.int64)
    read = TarRead(
        ps, counts, (bounds, flat, ends), every, opener, MAX_OPEN_FILES, fs,
        storage if remote else None,
    )  # fmt: skip
    return Shards(counts, read)


# -- Parquet ------------------------------------------------------------------------------------
def _pyarrow_parquet() -> Any:
    try:
        return importlib.import_module("pyarrow.parquet")
    except ImportError as err:
        raise ImportError(
            "fastshard.readers.parquet_shards needs pyarrow: pip install pyarrow"
        ) from err


class RowGroupCacheWarning(ReadAmplificationWarning):
    """The Parquet row groups that a stream's lanes read at once do not fit in the reader's
    ``cache_bytes``: lanes that come back to a row group the cache dropped decode it again
    for their own rows, so this process decodes its files several times over (correct, and
    bounded in memory, but slower). Given once per reader and process, when the row groups
    decoded again reach the number of distinct row groups decoded (at least 8): the files were
    then decoded twice over. Smaller row groups or a larger ``cache_bytes`` (about the lanes that
    one process reads times a row group's bytes) avoid it. A subclass of
    :class:`fastshard.ReadAmplificationWarning`: a filter on that one covers both.
    """


class RowGroupCache:
    """Decoded row groups of one process, as Python rows, least recently used dropped first
    once they exceed ``max_bytes`` (the one just decoded always stays).

    A row group is turned into Python rows in one ``to_pylist`` when it is decoded, and its
    Arrow table is dropped at once: Arrow's allocator then reuses the same buffers for the
    next decode, and :meth:`take` only slices a list. Rows are counted as their Arrow bytes
    plus an estimate of the Python objects around them (:data:`PY_ROW_BYTES` a row and
    :data:`PY_VALUE_BYTES` a value), so ``max_bytes`` bounds the rows held, not only the
    decoded buffers. A row taken is released from the cache at once (a stream reads each
    row once per pass in each process), and a row group leaves the cache when all its rows
    were taken.

    When the row groups read at once exceed ``max_bytes``, least-recently-used dropping would
    go round in a cycle, each take decoding a row group that the previous one dropped. So a
    row group dropped with rows left is not let back in at the cost of another: a read that
    comes back to it decodes it for itself and takes the rest of its own rows in it, up to
    ``max_bytes / PRIVATE_SHARE`` bytes of them (at least the rows asked for).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.pid = _this_pid()
        self.groups: OrderedDict[tuple[int, int], list[Any]] = OrderedDict()
        self.left: dict[tuple[int, int], int] = {}  # rows not yet taken
        self.row_bytes: dict[tuple[int, int], float] = {}  # counted bytes of one row
        self.charge: dict[tuple[int, int], float] = {}  # counted bytes of the rows held
        self.bytes = 0.0
        self.dropped: set[tuple[int, int]] = set()  # dropped with rows left
        # rows of a dropped row group taken before the drop or by reads for themselves
        self.elsewhere: dict[tuple[int, int], int] = {}
        self.decoded = 0  # row groups decoded so far (a measure of the cache's churn)
        self.seen: set[tuple[int, int]] = set()  # row groups decoded at least once
        self.again = 0  # decodes of a dropped row group for one read's own rows
        self.warned = False

    def _drop(self, key: tuple[int, int]) -> None:
        if self.left[key] > 0:
            self.dropped.add(key)
            self.elsewhere[key] = len(self.groups[key]) - self.left[key]  # taken so far
        self.bytes -= self.charge.pop(key)
        del self.groups[key], self.left[key], self.row_bytes[key]

    def _warn(self, group_bytes: float) -> None:
        warnings.warn(
            f"fastshard.readers.parquet_shards: the row groups that the stream's lanes read at "
            f"once do not fit in cache_bytes={self.max_bytes} (this one: {group_bytes / 2**20:.1f} "
            f"MiB of rows; {len(self.groups)} held): {self.again} times so far a row group the "
            f"cache had dropped was decoded again for one read's rows ({len(self.seen)} "
            f"distinct row groups decoded): this process has decoded its row groups "
            f"{self.decoded / len(self.seen):.1f} times over so far. Write smaller row groups "
            "(pyarrow.parquet.write_table(..., row_group_size=...): a few hundred to a few "
            "thousand rows) or pass a larger cache_bytes (about the lanes one process reads "
            "times a row group's bytes).",
            RowGroupCacheWarning,
            stacklevel=2,
        )

    def take(
        self,
        key: tuple[int, int],
        lo: int,
        hi: int,
        decode: Callable[[], Any],
        end: int | None = None,
    ) -> list[dict[str, Any]]:
        """Rows ``[lo, hi)`` of a row group, decoded by ``decode()`` if not at hand; or, when
        the row group was dropped with rows left and does not fit beside the others, rows
        ``[lo, x)`` for some ``hi <= x <= end`` (``end``: the last row the caller will take
        from this row group, ``hi`` if not given)."""
        rows = self.groups.get(key)
        if rows is not None:
            self.groups.move_to_end(key)
        else:
            table = decode()
            self.decoded += 1
            n = table.num_rows
            per_row = (int(table.nbytes) + n * PY_ROW_BYTES) / max(n, 1)
            per_row += PY_VALUE_BYTES * table.num_columns
            rows = table.to_pylist()
            del table
            self.seen.add(key)
            if key in self.dropped and self.groups and self.bytes + n * per_row > self.max_bytes:
                more = max(hi, lo + int(self.max_bytes / PRIVATE_SHARE / per_row))
                own: list[dict[str, Any]] = rows[lo : min(max(hi, end or hi), more)]
                self.elsewhere[key] = self.elsewhere.get(key, 0) + len(own)
                self.again += 1
                if not self.warned and self.again >= max(8, len(self.seen)):
                    self.warned = True
                    self._warn(n * per_row)
                return own
            self.dropped.discard(key)
            self.groups[key] = rows
            # Rows already read outside the cache count as taken: the row group still
            # leaves once the rest were taken.
            self.left[key] = n - self.elsewhere.pop(key, 0)
            self.row_bytes[key] = per_row
            self.charge[key] = n * per_row
            self.bytes += n * per_row
            while self.bytes > self.max_bytes and len(self.groups) > 1:
                self._drop(next(iter(self.groups)))
        out = rows[lo:hi]
        if len(out) < hi - lo:  # fewer rows than counted: the caller names the file
            return out
        if None in out:  # taken before in this pass (a padded epoch repeats rows)
            again: list[dict[str, Any]] = decode().slice(lo, hi - lo).to_pylist()
            self.decoded += 1
            return again
        rows[lo:hi] = [None] * (hi - lo)  # the cache's reference released with the row
        self.left[key] -= hi - lo
        self.charge[key] -= (hi - lo) * self.row_bytes[key]
        self.bytes -= (hi - lo) * self.row_bytes[key]
        if self.left[key] <= 0:
            self._drop(key)
        return out


class ParquetRead(_ShardRead, _Prefetch):
    """``read(shard, start, stop)`` over Parquet files (see :func:`parquet_shards`). Holds
    the paths, the columns and, per file, the first row of every row group; the open files
    and the decoded row groups are per process and never pickled."""

    _PER_PROCESS: ClassVar[dict[str, Any]] = {
        "_pool": None,
        "_cache": None,
        "_footers": None,
        "_expected": None,
    }
    storage: _storage.Options | None = None  # remote files: how they are read
    lengths: np.ndarray | None = None  # remote files: their lengths, from the count
    # remote files: per file, the bytes [lo, hi) of each row group's column chunks (of
    # `columns`), from the count: any process fetches ahead without a footer of its own
    spans: list[np.ndarray] | None = None

    def __init__(
        self,
        paths: list[str],
        sizes: np.ndarray,
        group_starts: list[np.ndarray],
        columns: list[str] | None,
        batch_rows: int = PY_ROWS,
        max_open_files: int = MAX_OPEN_FILES,
        cache_bytes: int = CACHE_BYTES,
        memory_map: bool = True,
    ) -> None:
        self.paths = paths
        self.sizes = sizes
        self.group_starts = group_starts
        self.columns = columns
        self.batch_rows = batch_rows
        self.max_open_files = max_open_files
        self.cache_bytes = cache_bytes
        self.memory_map = memory_map
        self._pool: FilePool | None = None
        self._cache: RowGroupCache | None = None
        self._footers: _Footers | None = None

    def files(self) -> FilePool:
        """This process's pool of open Parquet files."""
        self._pool = pool = FilePool.for_process(
            self._pool,
            lambda: FilePool(self.max_open_files, open=self._open, close=_close_parquet),
        )
        return pool

    def footers(self) -> _Footers:
        """This process's parsed footers."""
        footers = self._footers
        if footers is None or footers.pid != _this_pid():
            footers = self._footers = _Footers(FOOTER_BYTES)
        return footers

    def _open(self, path: str) -> Any:
        # With more files in play than the pool holds (lanes spread over many files), files
        # are closed and opened again: the footer parsed before is used again.
        footers = self.footers()
        meta = footers.get(path)
        if self.storage is not None:
            assert self.lengths is not None
            length = int(self.lengths[self.paths.index(path)])
            f: Any = _RemoteParquet(path, meta, self.storage, length, self.columns)
        elif self.memory_map:
            f: Any = _MappedParquet(path, meta)
        else:
            f = _pyarrow_parquet().ParquetFile(path, memory_map=False, metadata=meta)
        if meta is None:
            footers.put(path, f.metadata)
        return f

    def cache(self) -> RowGroupCache:
        """This process's decoded row groups."""
        cache = self._cache
        if cache is None or cache.pid != _this_pid():
            cache = self._cache = RowGroupCache(self.cache_bytes)
        return cache

    def _take(self, shard: int, group: int, lo: int, hi: int, end: int) -> list[dict[str, Any]]:
        def decode() -> Any:
            pool = self.files()
            with pool.lock:
                f = pool.get(self.paths[shard])
                return f.read_row_group(group, columns=self.columns, use_threads=False)

        return self.cache().take((shard, group), lo, hi, decode, end)

    def prefetch(self, reads: Callable[[], list[tuple[int, int, int, int]]]) -> None:
        """Start fetching the row groups that the ``reads()`` enter, each once, in the order
        of ``key`` (see :meth:`TarRead.prefetch`); nothing for local files."""
        if self.storage is None:
            return
        first: dict[tuple[int, int], float] = {}
        for shard, start, stop, key in reads():
            starts = self.group_starts[shard]
            g0 = int(np.searchsorted(starts, start, side="right")) - 1
            g1 = int(np.searchsorted(starts, stop - 1, side="right")) - 1
            for g in range(max(g0, 0), g1 + 1):
                at = key + max(0, int(starts[g]) - start)
                if first.get((shard, g), at + 1) > at:
                    first[(shard, g)] = at
        assert self.spans is not None
        ranges = []
        for (shard, g), key in first.items():
            lo, hi = (int(v) for v in self.spans[shard][g])
            ranges.append((self.paths[shard], lo, hi, float(key), 1.0))
        ranges.sort(key=lambda r: r[3])
        self._expect(ranges)
        # The footers pyarrow decodes with, of the files the lanes start in: all at once, now
        # (a file met later has its footer read when it is opened).
        footers = self.footers()
        storage = self.storage
        missing = sorted({url for url, _, _, key, _ in ranges if key == 0} - set(footers.metas))
        metas = (
            _storage.fetcher(storage)
            .threads()
            .map(lambda url: _remote_footer(url, storage)[0], missing)
        )
        for url, meta in zip(missing, metas):
            footers.put(url, meta)

    def _read(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        starts = self.group_starts[shard]
        size = int(self.sizes[shard])
        step = self.batch_rows
        row = start
        path = self.paths[shard]
        pool = self.files()
        with pool.lock:  # the footer of the open file: a file rewritten since it was counted
            have = int(pool.get(path).metadata.num_rows)
        if have != size:
            raise self._changed(path, have, size)
        while row < stop:
            g = int(np.searchsorted(starts, row, side="right")) - 1
            first = int(starts[g])
            last = int(starts[g + 1]) if g + 1 < len(starts) else size
            hi = min(stop, last)
            while row < hi:
                k = min(step, hi - row)
                # A few rows at a time from the cache, which hands each row out once: an open
                # read holds no row group between items (more rows only when the cache had
                # to drop this row group, see RowGroupCache).
                rows = self._take(shard, g, row - first, row - first + k, hi - first)
                if len(rows) < k:  # the row groups changed, not the total: never loop on []
                    raise self._changed(path, row + len(rows), size, f"row group {g} ends early")
                yield from rows
                row += len(rows)

    @staticmethod
    def _changed(path: str, have: int, counted: int, what: str = "") -> ValueError:
        return ValueError(
            f"{path}: {have} rows{' (' + what + ')' if what else ''}, but {counted} were "
            "counted (from its footer when parquet_shards was called, or rank 0's copy's with "
            "share_counts=True): the file changed, or differs between nodes"
        )

    def __repr__(self) -> str:
        return f"fastshard.readers.ParquetRead({len(self.paths)} shards)"


class _Footers:
    """Parsed Parquet footers (``FileMetaData``) of one process by path, the least recently
    used dropped first once their serialized sizes exceed ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.pid = _this_pid()
        self.metas: OrderedDict[str, Any] = OrderedDict()
        self.bytes = 0

    def get(self, path: str) -> Any:
        meta = self.metas.get(path)
        if meta is not None:
            self.metas.move_to_end(path)
        return meta

    def put(self, path: str, meta: Any) -> None:
        old = self.metas.pop(path, None)
        if old is not None:
            self.bytes -= int(old.serialized_size)
        self.metas[path] = meta
        self.bytes += int(meta.serialized_size)
        while self.bytes > self.max_bytes and len(self.metas) > 1:
            _, dropped = self.metas.popitem(last=False)
            self.bytes -= int(dropped.serialized_size)


class _MappedParquet:
    """A Parquet file mapped into memory (``mmap``, read-only) and read by pyarrow from the
    mapping, zero-copy as with pyarrow's own ``memory_map``, which before each read asks the
    kernel to read the row group's bytes ahead (``madvise(WILLNEED)``, from its I/O thread as
    well; page-cache readahead even for cached files) and maps the file at each open: a
    file read once a row group and opened again by the pool costs less this way. After each
    row group is decoded its pages are let go from this process (``MADV_DONTNEED``; they stay
    in the page cache), so a mapped file does not keep adding to the RSS."""

    __slots__ = ("file", "mapping")

    def __init__(self, path: str, metadata: Any) -> None:
        import pyarrow as pa

        with open(path, "rb") as fh:
            self.mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self.file = _pyarrow_parquet().ParquetFile(
            pa.BufferReader(pa.py_buffer(self.mapping)), metadata=metadata
        )

    @property
    def metadata(self) -> Any:
        return self.file.metadata

    def read_row_group(self, group: int, **kwargs: Any) -> Any:
        table = self.file.read_row_group(group, **kwargs)
        if _DONTNEED is not None:
            # The whole mapping, not the row group's byte range: a fault maps the cached pages
            # around it too (the kernel's fault-around), and the page tables of a mapping
            # with no pages left cost nothing to walk. Decoded buffers are copies, but a
            # zero-copy column could still point into the mapping: dropping the pages is
            # safe either way (they fault back in).
            self.mapping.madvise(_DONTNEED)
        return table

    def close(self) -> None:
        self.file.close()
        try:
            self.mapping.close()
        except BufferError:  # a decoded column still points into it: unmapped once freed
            pass


def _row_group_span(meta: Any, group: int, columns: list[str] | None) -> tuple[int, int]:
    """The bytes of a row group's column chunks (of ``columns`` only, if given): one
    ranged GET reads them all."""
    rg = meta.row_group(group)
    lo, hi = None, 0
    for c in range(rg.num_columns):
        col = rg.column(c)
        if columns is not None and col.path_in_schema.split(".")[0] not in columns:
            continue
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset is not None:
            start = min(start, col.dictionary_page_offset)
        lo = start if lo is None else min(lo, start)
        hi = max(hi, start + col.total_compressed_size)
    return (0, 0) if lo is None else (int(lo), int(hi))


class _SpanFile(_storage.RemoteFile):
    """A remote file whose bytes ``[lo, lo + len(data))`` are at hand: pyarrow's reads of a
    row group's column chunks cost no request."""

    def __init__(self, url: str, opts: Any, length: int, lo: int, data: bytes) -> None:
        super().__init__(url, opts, length)
        self.buf, self.buf_at = data, lo


class _RemoteParquet:
    """A Parquet file at a URL, read a row group at a time: its column chunks in one ranged
    GET, taken from the process's fetcher (fetched ahead when the stream expected it)."""

    __slots__ = ("columns", "length", "metadata", "opts", "url")

    def __init__(
        self, url: str, metadata: Any, opts: Any, length: int, columns: list[str] | None
    ) -> None:
        self.url = url
        self.opts = opts
        self.length = length
        self.columns = columns
        if metadata is None:
            metadata = _remote_footer(url, opts)[0]
        self.metadata = metadata

    def read_row_group(self, group: int, **kwargs: Any) -> Any:
        lo, hi = _row_group_span(self.metadata, group, self.columns)
        src = _storage.fetcher(self.opts).take(self.url, lo, hi)
        try:
            data = src.read(hi - lo)
        finally:
            src.close()
        f = _SpanFile(self.url, self.opts, self.length, lo, data)
        pf = _pyarrow_parquet().ParquetFile(f, metadata=self.metadata)
        return pf.read_row_group(group, **kwargs)

    def close(self) -> None:
        pass


_DONTNEED = getattr(mmap, "MADV_DONTNEED", None) if hasattr(mmap.mmap, "madvise") else None


def _close_parquet(f: Any) -> None:
    close = getattr(f, "close", None)
    if close is not None:
        close()


def _remote_footer(url: str, storage: _storage.Options) -> tuple[Any, int]:
    """(the parsed footer of a remote Parquet file, the file's length): its last 64 KiB in one
    GET, and the rest of a larger footer in a second."""
    data, total = _storage.tail(url, 1 << 16, storage)
    if len(data) < 12 or data[-4:] != b"PAR1":
        raise ValueError(f"{url}: not a Parquet file (no PAR1 magic at its end)")
    need = int.from_bytes(data[-8:-4], "little") + 8
    if need > total - 4:
        raise ValueError(f"{url}: its footer claims {need - 8} bytes, the file has {total}")
    if need > len(data):
        data = _storage.fetch(url, total - need, total, storage)
    import pyarrow as pa

    return _pyarrow_parquet().read_metadata(pa.BufferReader(data[-need:])), total


def _parquet_footers(
    paths: list[str],
    columns: list[str] | None,
    footers: _Footers | None = None,
    storage: _storage.Options | None = None,
    lengths: list[int] | None = None,
    spans: list[np.ndarray] | None = None,
) -> tuple[list[int], list[np.ndarray]]:
    pq = _pyarrow_parquet()
    counts = []
    group_starts = []
    if storage is not None:
        # Every footer at once, each one GET of the file's tail (its length from the reply).
        found = _storage.fetcher(storage).threads().map(lambda p: _remote_footer(p, storage), paths)
        if lengths is not None:
            lengths += [n for _, n in found]
    for i, p in enumerate(paths):
        if storage is not None:
            meta = found[i][0]
        else:
            meta = pq.read_metadata(p)
        if footers is not None:
            footers.put(p, meta)
        if columns is not None:
            schema = meta.schema
            known = set(schema.to_arrow_schema().names)
            known.update(schema.column(i).path for i in range(len(schema)))
            unknown = [c for c in columns if c not in known]
            if unknown:
                raise ValueError(
                    f"{p}: no column {', '.join(map(repr, unknown))}; its columns are "
                    f"{sorted(schema.to_arrow_schema().names)}"
                )
        rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        group_starts.append(np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])[:-1])
        counts.append(int(meta.num_rows))
        if spans is not None:
            spans.append(
                np.asarray(
                    [_row_group_span(meta, g, columns) for g in range(meta.num_row_groups)],
                    dtype=np.int64,
                ).reshape(-1, 2)
            )
    return counts, group_starts


def parquet_shards(
    paths: Sequence[PathLike],
    columns: Sequence[str] | None = None,
    *,
    batch_rows: int = PY_ROWS,
    max_open_files: int = MAX_OPEN_FILES,
    cache_bytes: int = CACHE_BYTES,
    share_counts: bool = False,
    memory_map: bool = True,
    storage_options: dict[str, Any] | None = None,
    max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
    max_requests: int = MAX_REQUESTS,
    retries: int = RETRIES,
    cache_dir: PathLike | None = None,
    cache_limit: int | None = None,
) -> Shards:
    """Parquet files as ``(shard_sizes, read)``; needs ``pyarrow``.

    Each file is a shard of ``metadata.num_rows`` rows, read from its footer (no data is
    read here; with ``share_counts=True`` and an initialised process group of two or more
    ranks, rank 0 reads the footers and broadcasts them, a collective call on every rank, as
    for :func:`tar_shards`). ``read(shard, start, stop)`` yields rows ``[start, stop)`` as dicts
    ``{column: value}`` of Python values (``pyarrow.Table.to_pylist``), with only ``columns``
    if given: a column that a file does not have is an error, naming it. Dicts because a
    DataLoader's default collate stacks them field by field and they match what webdataset
    and HF datasets yield.

    A row group (Parquet's smallest unit that can be read alone) is decoded once per process
    and turned into Python rows at once, into a cache shared by every open read, which takes
    ``batch_rows`` rows at a time from it as the stream asks. The cache holds at most
    ``cache_bytes`` of rows not yet taken (default 256 MiB, counted as their Arrow bytes plus
    an estimate of their Python objects; least recently used row groups dropped first). When
    the row groups that the stream's lanes are reading at once exceed it, a lane that comes
    back to a dropped row group decodes it again for itself and keeps the rest of its rows
    in it, at most ``cache_bytes / 64`` of them (see :class:`RowGroupCache`). Small row
    groups (a few hundred rows) keep both the cache and the decode of a read's first rows
    small. Files come from a per-process pool of at most ``max_open_files``, memory-mapped by
    default and read by pyarrow from the mapping (``mmap``); the pages of each row group are
    let go from the process once it is decoded (they stay in the page cache), so the mapped
    files do not add up in the RSS. ``memory_map=False`` reads them with pyarrow's buffered
    reads instead.

    Files may be URLs (as for :func:`tar_shards`, with the same remote keyword arguments):
    each footer is read with one GET of the file's last 64 KiB (after a HEAD for its length),
    and each row group a process decodes with one ranged GET of its column chunks (of
    ``columns`` only), fetched ahead in the order the stream's lanes enter them.
    """
    storage = _remote_options(
        storage_options, max_inflight_bytes, max_requests, retries, cache_dir, cache_limit
    )
    _pyarrow_parquet()
    ps = _paths(paths)
    batch_rows = _positive(batch_rows, "batch_rows")
    max_open_files = _check_pool_args(max_open_files)
    cache_bytes = _positive(cache_bytes, "cache_bytes")
    cols = None if columns is None else [str(c) for c in columns]
    if isinstance(columns, str):
        raise TypeError("columns must be a sequence of column names, not one string")
    footers = _Footers(FOOTER_BYTES)
    remote = _remote(ps)
    lengths: list[int] = []
    spans: list[np.ndarray] = []
    counts, group_starts, lengths, spans = _index.shared(
        lambda: (
            *_parquet_footers(
                ps, cols, footers, storage if remote else None, lengths, spans if remote else None
            ),
            lengths,
            spans,
        ),
        ps,
        bool(share_counts),
    )
    arr = np.asarray(counts, dtype=np.int64)
    read = ParquetRead(
        ps, arr, group_starts, cols, batch_rows, max_open_files, cache_bytes, bool(memory_map)
    )
    if remote:
        read.storage = storage
        read.lengths = np.asarray(lengths, dtype=np.int64)
        read.spans = spans
    read._footers = footers  # this process's first opens skip the footers read just now
    return Shards(arr, read)


# -- MDS (Mosaic streaming) ---------------------------------------------------------------------
_MDS_FIXED = {
    "int8": "<i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "<u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
}


def _mds_decoder(encoding: str) -> Callable[[bytes], Any]:
    import json
    import pickle

    if encoding == "bytes":
        return bytes
    if encoding == "str":
        return lambda b: b.decode("utf-8")
    if encoding == "int":
        return lambda b: int(np.frombuffer(b, np.int64)[0])
    if encoding in _MDS_FIXED:
        dtype = np.dtype(_MDS_FIXED[encoding])
        return lambda b: np.frombuffer(b, dtype)[0]
    if encoding == "str_int":
        return lambda b: int(b.decode("utf-8"))
    if encoding == "str_float":
        return lambda b: float(b.decode("utf-8"))
    if encoding == "str_decimal":
        from decimal import Decimal

        return lambda b: Decimal(b.decode("utf-8"))
    if encoding == "json":
        return lambda b: json.loads(b.decode("utf-8"))
    if encoding == "pkl":
        return pickle.loads
    return bytes  # images, ndarrays and custom encodings: the stored bytes, undecoded


class MdsRead(_ShardRead, _Prefetch):
    """``read(shard, start, stop)`` over uncompressed MDS shards (see :func:`mds_shards`)."""

    _PER_PROCESS: ClassVar[dict[str, Any]] = {
        "_pool": None,
        "_tables": {},
        "_expected": None,
        "_verified": set(),
    }
    storage: _storage.Options | None = None  # remote shards: how they are read
    # verify_hashes=True: per shard, the index's {algorithm: hex digest} of the whole file
    hashes: list[dict[str, str]] | None = None
    index_path = "its index.json"  # the index, for the error of a shard of another count

    def _verify(self, shard: int) -> None:
        """Check a shard's whole file against the digests of the index, once per process."""
        verified: set[int] = self.__dict__.setdefault("_verified", set())
        if self.hashes is None or shard in verified:
            return
        import hashlib

        path = self.paths[shard]
        want = self.hashes[shard]
        algos = [a for a in want if a in hashlib.algorithms_available]
        if not algos:
            raise ValueError(
                f"{path}: verify_hashes=True, but the index gives only {sorted(want)} digests, "
                "none of which hashlib computes (sha1, sha256, md5, ...)"
            )
        data = _storage.read_all(path, self.storage or _storage.DEFAULT)
        for algo in algos:
            got = hashlib.new(algo, data).hexdigest()
            if got != want[algo]:
                raise ValueError(
                    f"{path}: its {algo} digest is {got}, the index says {want[algo]}: the "
                    "shard is not the one the index describes (corrupt, or rewritten)"
                )
        verified.add(shard)

    def __init__(
        self,
        paths: list[str],
        sizes: np.ndarray,
        columns: list[tuple[str, str, int | None]],
        keep: list[str] | None,
        max_open_files: int = MAX_OPEN_FILES,
    ) -> None:
        self.paths = paths
        self.sizes = sizes
        self.columns = columns  # (name, encoding, fixed size or None), in storage order
        self.keep = keep
        self.max_open_files = max_open_files
        self._pool: FilePool | None = None

    def files(self) -> FilePool:
        """This process's pool of open shard files."""
        self._pool = pool = FilePool.for_process(self._pool, lambda: FilePool(self.max_open_files))
        return pool

    def _table(self, shards: list[int]) -> list[np.ndarray]:
        """The offsets tables of remote shards (``uint32`` count, then one offset per sample
        and the end), fetched once per process, several at once."""
        tables: dict[int, np.ndarray] = self.__dict__.setdefault("_tables", {})
        missing = sorted({s for s in shards if s not in tables})
        if missing:
            ranges = [(self.paths[s], 0, 4 * (int(self.sizes[s]) + 2)) for s in missing]
            for s, raw in zip(missing, self._fetcher().fetch_many(ranges)):
                tables[s] = np.frombuffer(raw, "<u4")[1:].astype(np.int64)
        return [tables[s] for s in shards]

    def prefetch(self, reads: Callable[[], list[tuple[int, int, int, int]]]) -> None:
        """Start fetching the samples of the ``reads()`` in the order of ``key`` (see
        :meth:`TarRead.prefetch`), once the offsets tables of their shards
        are at hand (fetched here, all at once); nothing for local shards."""
        if self.storage is None:
            return
        live = [seg for seg in reads() if seg[1] < seg[2]]
        tables = self._table([shard for shard, _, _, _ in live])
        ranges = []
        for (shard, start, stop, key), table in zip(live, tables):
            if stop < len(table):
                lo, hi = int(table[start]), int(table[stop])
                ranges.append((self.paths[shard], lo, hi, float(key), float(stop - start)))
        self._expect(ranges)

    def _read(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        path = self.paths[shard]
        self._verify(shard)
        decoders = [(name, _mds_decoder(enc), size) for name, enc, size in self.columns]
        if self.storage is not None:
            (table,) = self._table([shard])
            if stop >= len(table):  # a shard too short for its offsets table
                raise ValueError(
                    f"{path}: holds fewer samples than {self.index_path} "
                    f"says ({int(self.sizes[shard])}): its offsets table is cut short"
                )
            src = self._fetcher().take(path, int(table[start]), int(table[stop]))
            try:
                for lo in range(start, stop, PY_ROWS):
                    hi = min(lo + PY_ROWS, stop)
                    data = src.read(int(table[hi]) - int(table[lo]))
                    yield from self._rows(data, table[lo : hi + 1], decoders)
            finally:
                src.close()
            return
        pool = self.files()
        keep = None if self.keep is None else set(self.keep)
        var = sum(size is None for _, _, size in self.columns)
        # Header: uint32 sample count, then count + 1 uint32 offsets of the samples. The
        # shard's own count must be the index's, and every offset lie in [first, last], the
        # last one a byte the file holds.
        head = np.frombuffer(pool.read(path, 0, 4), "<u4")
        count = int(head[0]) if len(head) else -1
        if count != int(self.sizes[shard]):
            raise ValueError(
                f"{path}: holds {count} samples, but {self.index_path} "
                f"says {int(self.sizes[shard])}: the shard and its index do not belong together"
            )
        first, last = 4 + 4 * (count + 1), -1
        tail = np.frombuffer(pool.read(path, 4 + 4 * count, 4), "<u4")
        if len(tail) == 1 and int(tail[0]) >= first and len(pool.read(path, int(tail[0]) - 1, 1)):
            last = int(tail[0])
        for lo in range(start, stop, PY_ROWS):
            hi = min(lo + PY_ROWS, stop)
            table = np.frombuffer(pool.read(path, 4 + 4 * lo, 4 * (hi - lo + 1)), "<u4")
            if (
                len(table) < hi - lo + 1
                or int(table[0]) < first
                or int(table[-1]) > last
                or bool(np.any(np.diff(table.astype(np.int64)) < 0))
            ):
                raise ValueError(
                    f"{path}: the offsets of samples {lo} to {hi} are not increasing offsets "
                    f"inside the file: the shard is damaged"
                )
            base = int(table[0])
            data = pool.read(path, base, int(table[-1]) - base)
            yield from self._rows(data, table, decoders, keep, var)

    def _rows(
        self,
        data: bytes,
        table: np.ndarray,
        decoders: list[tuple[str, Callable[[bytes], Any], int | None]],
        keep: set[str] | None = None,
        var: int | None = None,
    ) -> list[dict[str, Any]]:
        """The samples whose offsets ``table`` gives (one more than the samples: the end),
        from ``data``, which starts at ``table[0]``."""
        if keep is None and self.keep is not None:
            keep = set(self.keep)
        if var is None:
            var = sum(size is None for _, _, size in self.columns)
        base = int(table[0])
        rows = []
        for i in range(len(table) - 1):
            at = int(table[i]) - base
            sizes = np.frombuffer(data, "<u4", count=var, offset=at).tolist() if var else []
            at += 4 * var
            row: dict[str, Any] = {}
            v = 0
            for name, decode, size in decoders:
                if size is None:
                    size = sizes[v]
                    v += 1
                if keep is None or name in keep:
                    row[name] = decode(data[at : at + size])
                at += size
            rows.append(row)
        return rows

    def __repr__(self) -> str:
        return f"fastshard.readers.MdsRead({len(self.paths)} shards)"


def mds_shards(
    index: PathLike,
    columns: Sequence[str] | None = None,
    *,
    max_open_files: int = MAX_OPEN_FILES,
    share_counts: bool = False,
    verify_hashes: bool = False,
    storage_options: dict[str, Any] | None = None,
    max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
    max_requests: int = MAX_REQUESTS,
    retries: int = RETRIES,
    cache_dir: PathLike | None = None,
    cache_limit: int | None = None,
) -> Shards:
    """Mosaic streaming's MDS shards as ``(shard_sizes, read)``, counted from their
    ``index.json`` (nothing else is read here).

    ``index`` is the ``index.json`` that ``streaming.MDSWriter`` writes beside its shards
    (version 2, ``"format": "mds"``); the shards must be stored uncompressed (the
    ``raw_data`` files next to the index). ``read(shard, start, stop)`` yields dicts
    ``{column: value}`` (only ``columns`` if given), decoded as Mosaic decodes them for the
    encodings ``bytes``, ``str``, ``int``, ``int8`` ... ``int64``, ``uint8`` ... ``uint64``,
    ``float16``/``32``/``64`` (NumPy scalars), ``str_int``, ``str_float``, ``str_decimal``,
    ``json`` and ``pkl``; any other encoding (``jpeg``, ``png``, ``pil``, ``ndarray``, ...) is yielded as
    the stored bytes, for the caller to decode. A read fetches a sample's bytes by the
    offsets table at the start of its shard, 16 samples per ``os.pread``, through the same
    per-process pool of open files as :func:`tar_shards`.

    ``index`` and its shards may be at a URL (as for :func:`tar_shards`, with the same remote
    keyword arguments): the index is read with one GET (on rank 0 alone with
    ``share_counts=True``), each process fetches the offsets table of each shard it reads
    once, and a read fetches exactly its samples' bytes, ahead of the stream.

    ``verify_hashes=True`` checks each shard, the first time a process reads it, against the
    digests its ``index.json`` records (``raw_data.hashes``, those that ``hashlib`` computes:
    ``sha1``, ``sha256``, ``md5``, ...), and raises naming the shard on a mismatch. It reads
    each whole shard once per process for that, so it costs a shard's bytes per reader.
    """
    storage = _remote_options(
        storage_options, max_inflight_bytes, max_requests, retries, cache_dir, cache_limit
    )
    index_path = os.fspath(index)
    remote = _storage.is_url(index_path)
    if not remote:
        index_path = os.path.abspath(_storage.local_path(index_path))
    doc = _index.shared(lambda: _index._load_json(index_path, storage), [index_path], share_counts)
    if not isinstance(doc, dict) or not isinstance(doc.get("shards"), list):
        raise ValueError(f"{index_path}: not a Mosaic streaming index.json (no 'shards')")
    base = _storage.dirname(index_path)
    digests: list[dict[str, str]] = []
    paths = []
    counts = []
    layout: list[tuple[str, str, int | None]] | None = None
    for i, s in enumerate(doc["shards"]):
        if not isinstance(s, dict):
            raise ValueError(f"{index_path}: shard {i} is not an object")
        for key, kind in [
            ("column_names", list),
            ("column_encodings", list),
            ("column_sizes", list),
            ("samples", int),
        ]:
            value = s.get(key)
            if not isinstance(value, kind) or (
                kind is int and (type(value) is not int or value < 0)
            ):
                what = "no" if key not in s else "a malformed"
                raise ValueError(f"{index_path}: shard {i} has {what} '{key}'")
        if s.get("format") != "mds":
            raise ValueError(f"{index_path}: shard {i} is {s.get('format')!r}, not 'mds'")
        raw = (s.get("raw_data") or {}).get("basename")
        path = _storage.join(base, raw) if raw else ""
        if not raw or not (remote or os.path.exists(path)):
            raise ValueError(
                f"{index_path}: shard {i} has no uncompressed file {raw!r} (compression "
                f"{s.get('compression')!r}): mds_shards reads uncompressed shards"
            )
        cols = list(zip(s["column_names"], s["column_encodings"], s["column_sizes"]))
        if layout is None:
            layout = cols
        elif cols != layout:
            raise ValueError(f"{index_path}: shard {i} has other columns than shard 0")
        paths.append(path)
        counts.append(int(s["samples"]))
        digests.append(dict((s.get("raw_data") or {}).get("hashes") or {}))
    names = [c[0] for c in layout or []]
    keep = None if columns is None else [str(c) for c in columns]
    if keep is not None:
        unknown = [c for c in keep if c not in names]
        if unknown:
            raise ValueError(
                f"{index_path}: no column {', '.join(map(repr, unknown))}; its columns are {names}"
            )
    arr = np.asarray(counts, dtype=np.int64)
    read = MdsRead(paths, arr, layout or [], keep, _check_pool_args(max_open_files))
    if remote:
        read.storage = storage
    if verify_hashes:
        missing = [paths[i] for i, d in enumerate(digests) if not d]
        if missing:
            raise ValueError(
                f"{index_path}: verify_hashes=True, but the index records no digest for "
                f"{missing[0]}{f' and {len(missing) - 1} more' if len(missing) > 1 else ''} "
                "(MDSWriter(hashes=[...]) writes them)"
            )
        read.hashes = digests
    read.index_path = index_path  # for the error of a shard that holds another count
    return Shards(arr, read)
