"""Shard files as ``(shard_sizes, read)`` for :class:`fastshard.ShardedStream`.

>>> from fastshard import ShardedStream, readers
>>> sizes, read = readers.tar_shards(sorted(glob.glob("shards/*.tar")))
>>> stream = ShardedStream(sizes, read, batch_size=32)

``tar_shards`` reads WebDataset-style tar shards, ``parquet_shards`` Parquet files. Each counts
the items of every shard once, when it is called (tar: a scan of the member headers only;
Parquet: the row counts in each file's footer), and returns a :class:`Shards` pair whose
``read(shard, start, stop)`` opens the shard's file, starts as close to row ``start`` as the
format allows without decoding what lies before it, and yields rows ``[start, stop)`` lazily.
The ``read`` holds paths and small offset tables only, never an open file, so it pickles to
DataLoader workers under any start method; every call opens its own file and closes it when
the stream stops taking items.
"""

from __future__ import annotations

import importlib
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, NamedTuple, Union

import numpy as np

__all__ = ["ParquetRead", "Shards", "TarRead", "parquet_shards", "tar_shards"]

PathLike = Union[str, "os.PathLike[str]"]
Opener = Callable[[str], IO[bytes]]

# A tar member name "dir/key.ext1.ext2" is sample "dir/key", field "ext1.ext2" (the split
# webdataset makes: the key ends at the first dot of the last path component).
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
# Members named "__...__" at the top (webdataset's per-shard metadata) are not sample fields.
_META = re.compile(r"__[^/]*__($|/)")

# tar_shards keeps the byte offset of every INDEX_EVERY-th sample of a shard (8 bytes per 16
# samples), so a read that starts at row r walks the headers of fewer than INDEX_EVERY samples
# before it (at most 15 headers of 512 bytes per member).
INDEX_EVERY = 16


class Shards(NamedTuple):
    """``(shard_sizes, read)``: the first two arguments of :class:`fastshard.ShardedStream`."""

    sizes: np.ndarray
    read: Callable[[int, int, int], Iterator[Any]]


def _open_binary(path: str) -> IO[bytes]:
    return open(path, "rb")


def _paths(paths: Any) -> list[str]:
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError("paths must be a sequence of paths, one per shard, not a single path")
    return [os.fspath(p) for p in paths]


def _rows(shard: int, start: int, stop: int, sizes: np.ndarray) -> int:
    if not 0 <= shard < len(sizes):
        raise IndexError(f"shard {shard} out of range for {len(sizes)} shards")
    size = int(sizes[shard])
    if not 0 <= start <= stop <= size:
        raise ValueError(f"rows [{start}, {stop}) out of range for shard {shard} of {size} rows")
    return size


# -- tar ----------------------------------------------------------------------------------------
def _samples(tar: tarfile.TarFile, read_data: Callable[[int], bool]) -> Iterator[dict[str, Any]]:
    """The samples of ``tar`` from its current position, grouped as webdataset groups them:
    consecutive members with the same key form a sample. Yields ``{"__offset__": header
    offset of the sample's first member, "__key__": key, ext: bytes or None}``; member data is
    read only when ``read_data(ordinal)`` is true, otherwise ``tarfile`` seeks over it."""
    sample: dict[str, Any] | None = None
    ordinal = -1
    while True:
        member = tar.next()
        if member is None:
            break
        name = member.name
        if not member.isreg() or _META.match(name):
            continue
        m = _KEY_EXT.match(name)
        if m is None:
            continue
        key, ext = m.group(1), m.group(2).lower()
        if sample is None or key != sample["__key__"]:
            if sample is not None:
                yield sample
            ordinal += 1
            sample = {"__offset__": member.offset, "__key__": key}
        elif ext in sample:
            raise ValueError(f"{tar.name!r}: sample {key!r} has two members with extension {ext!r}")
        if read_data(ordinal):
            f = tar.extractfile(member)
            assert f is not None
            sample[ext] = f.read()
        else:
            sample[ext] = None
        # TarFile keeps every member it has seen; a read needs none of them.
        tar.members.clear()  # type: ignore[attr-defined]
    if sample is not None:
        yield sample


def _open_tar(f: IO[bytes], path: str) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=f, mode="r:")
    except tarfile.ReadError as err:
        raise ValueError(
            f"{path}: not an uncompressed tar file ({err}); tar_shards seeks inside shards, "
            "which a compressed stream cannot do: store shards as plain .tar"
        ) from None


def _scan_tar(path: str, every: int, opener: Opener) -> tuple[int, np.ndarray]:
    offsets: list[int] = []
    count = 0
    with opener(path) as f, _open_tar(f, path) as tar:
        for count, sample in enumerate(_samples(tar, lambda _: False), 1):
            if (count - 1) % every == 0:
                offsets.append(sample["__offset__"])
    return count, np.asarray(offsets, dtype=np.int64)


class TarRead:
    """``read(shard, start, stop)`` over tar shards (see :func:`tar_shards`). Holds the
    paths and, per shard, the byte offset of every ``index_every``-th sample."""

    def __init__(
        self,
        paths: list[str],
        sizes: np.ndarray,
        index: tuple[np.ndarray, np.ndarray] | None,
        index_every: int,
        opener: Opener | None,
    ) -> None:
        self.paths = paths
        self.sizes = sizes
        # (bounds, offsets): shard s's indexed byte offsets are offsets[bounds[s]:bounds[s+1]]
        # (two flat arrays, not one array per shard: 10**6 shards cost 16 MB, not 100).
        self.index = index
        self.index_every = index_every
        self.opener = opener

    def __call__(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        _rows(shard, start, stop, self.sizes)
        return self._read(shard, start, stop)

    def _read(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        if start == stop:
            return
        path = self.paths[shard]
        first = 0
        offset = 0
        if self.index is not None:
            bounds, offsets = self.index
            lo, hi = int(bounds[shard]), int(bounds[shard + 1])
            if hi > lo:
                slot = min(start // self.index_every, hi - lo - 1)
                first, offset = slot * self.index_every, int(offsets[lo + slot])
        with (self.opener or _open_binary)(path) as f:
            f.seek(offset)
            with _open_tar(f, path) as tar:
                want = range(start - first, stop - first)
                n = first
                for sample in _samples(tar, want.__contains__):
                    if n >= start:
                        del sample["__offset__"]
                        sample["__url__"] = path
                        yield sample
                    n += 1
                    if n >= stop:
                        return
        # Fewer samples than counted: the generator ends short and ShardedStream names the shard.

    def __repr__(self) -> str:
        return f"fastshard.readers.TarRead({len(self.paths)} shards)"


def tar_shards(
    paths: Sequence[PathLike],
    *,
    sizes: Sequence[int] | None = None,
    index_every: int = INDEX_EVERY,
    opener: Opener | None = None,
) -> Shards:
    """WebDataset-style tar shards as ``(shard_sizes, read)``.

    A sample is a run of consecutive regular members whose names share a key: member
    ``"a/b/0001.jpg"`` is field ``"jpg"`` of sample ``"a/b/0001"`` (the key ends at the first
    dot of the last path component, the extension is lower-cased; members named ``__*__`` and
    names without a dot are skipped), as webdataset groups them. ``read(shard, start, stop)``
    yields ``{"__key__": key, "__url__": path, ext: bytes, ...}`` for samples ``[start, stop)``.

    Counting: each shard's member headers are scanned once here with :mod:`tarfile` (which
    seeks over member data, so only the 512-byte headers are read), keeping the byte offset
    of every ``index_every``-th sample. A read seeks to the nearest indexed sample at or
    before ``start`` and walks the headers of the fewer than ``index_every`` samples before
    ``start`` without reading their data. ``sizes`` (the sample count of each shard, e.g.
    from a manifest) skips the scan; reads then walk headers from the start of the shard.

    Shards must be uncompressed tar files (a compressed stream cannot seek). ``opener(path)``
    opens a shard as a seekable binary file (default: ``open(path, "rb")``); it must pickle,
    as ``read`` does.
    """
    ps = _paths(paths)
    if isinstance(index_every, bool) or not isinstance(index_every, int) or index_every < 1:
        raise ValueError(f"index_every must be an int >= 1, got {index_every!r}")
    index: tuple[np.ndarray, np.ndarray] | None
    if sizes is None:
        counts = []
        parts = []
        for p in ps:
            count, offsets = _scan_tar(p, index_every, opener or _open_binary)
            counts.append(count)
            parts.append(offsets)
        arr = np.asarray(counts, dtype=np.int64)
        bounds = np.zeros(len(ps) + 1, dtype=np.int64)
        np.cumsum([len(o) for o in parts], out=bounds[1:])
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        index = (bounds, flat)
    else:
        arr = np.asarray(sizes, dtype=np.int64)
        if arr.shape != (len(ps),):
            raise ValueError(
                f"sizes has shape {arr.shape}, expected one count per path ({len(ps)})"
            )
        index = None
    return Shards(arr, TarRead(ps, arr, index, index_every, opener))


# -- Parquet ------------------------------------------------------------------------------------
def _pyarrow_parquet() -> Any:
    try:
        return importlib.import_module("pyarrow.parquet")
    except ImportError as err:
        raise ImportError(
            "fastshard.readers.parquet_shards needs pyarrow: pip install pyarrow"
        ) from err


# Parquet rows become Python dicts this many at a time.
_PY_ROWS = 16


class ParquetRead:
    """``read(shard, start, stop)`` over Parquet files (see :func:`parquet_shards`). Holds
    the paths, the columns and, per file, the first row of every row group."""

    def __init__(
        self,
        paths: list[str],
        sizes: np.ndarray,
        group_starts: list[np.ndarray],
        columns: list[str] | None,
        batch_rows: int,
    ) -> None:
        self.paths = paths
        self.sizes = sizes
        self.group_starts = group_starts
        self.columns = columns
        self.batch_rows = batch_rows

    def __call__(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        _rows(shard, start, stop, self.sizes)
        return self._read(shard, start, stop)

    def _read(self, shard: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
        if start == stop:
            return
        pq = _pyarrow_parquet()
        starts = self.group_starts[shard]
        g0 = int(np.searchsorted(starts, start, side="right")) - 1
        g1 = int(np.searchsorted(starts, stop, side="left"))
        row = int(starts[g0])  # the file row of the next batch's first row
        with pq.ParquetFile(self.paths[shard]) as f:
            batches = f.iter_batches(
                batch_size=self.batch_rows,
                row_groups=range(g0, g1),
                columns=self.columns,
                use_threads=False,
            )
            for batch in batches:
                n = batch.num_rows
                if row + n <= start:  # rows of the first row group before start
                    row += n
                    continue
                lo = max(start - row, 0)
                hi = min(stop - row, n)
                # To Python objects a few rows at a time: the stream may stop taking rows
                # (a lane's window is full) long before `stop`.
                for i in range(lo, hi, _PY_ROWS):
                    yield from batch.slice(i, min(_PY_ROWS, hi - i)).to_pylist()
                row += n
                if row >= stop:
                    return

    def __repr__(self) -> str:
        return f"fastshard.readers.ParquetRead({len(self.paths)} shards)"


def parquet_shards(
    paths: Sequence[PathLike],
    columns: Sequence[str] | None = None,
    *,
    batch_rows: int = 256,
) -> Shards:
    """Parquet files as ``(shard_sizes, read)``; needs ``pyarrow``.

    Each file is a shard of ``metadata.num_rows`` rows, read from its footer (no data is
    read here). ``read(shard, start, stop)`` yields rows ``[start, stop)`` as dicts
    ``{column: value}`` of Python values (``pyarrow.RecordBatch.to_pylist``), with only
    ``columns`` if given. Dicts because a DataLoader's default collate stacks them field by
    field and they match what webdataset and HF datasets yield; a columnar batch would need
    a custom collate and would not split into the per-row items the stream orders.

    A read decodes from the start of the row group that holds ``start`` (Parquet's smallest
    unit that can be read alone), in record batches of ``batch_rows`` rows, and turns rows
    into dicts 16 at a time as the stream takes them: it decodes at most one row group's
    rows before ``start`` and ``batch_rows`` past the last row taken, no matter how large
    the file. Rows before ``start`` in a record batch are skipped without conversion. The
    default 256 was the fastest of 64 to 1024 in bench/streams.py (4 KiB rows); small row
    groups make reads that start mid-file cheaper.
    """
    pq = _pyarrow_parquet()
    ps = _paths(paths)
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows must be an int >= 1, got {batch_rows!r}")
    cols = None if columns is None else [str(c) for c in columns]
    counts = []
    group_starts = []
    for p in ps:
        meta = pq.read_metadata(p)
        rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        group_starts.append(np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])[:-1])
        counts.append(int(meta.num_rows))
    arr = np.asarray(counts, dtype=np.int64)
    return Shards(arr, ParquetRead(ps, arr, group_starts, cols, batch_rows))
