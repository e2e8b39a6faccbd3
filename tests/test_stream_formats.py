"""fastshard.readers end to end: WebDataset tar shards and Parquet files written here, read
through ShardedStream under DataLoader workers, for 1, 2 and 3 simulated ranks.

What is checked: every sample exactly once per epoch (pad=False) and equal counts (pad=True);
each item equal to what the file holds (the files are also read independently: tarfile
member by member, pyarrow.parquet.read_table); no reader reads a row of a shard twice and each
read() yields consecutive rows forward; tar reads skip to their start row by seeking, reading
member headers only (bytes counted through the opener).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import fastshard
from fastshard import readers

# Uneven: an empty shard, single-row shards, and shard 3 larger than all the others together.
SIZES = [37, 0, 5, 400, 12, 1, 60, 23, 0, 9]
BATCH = 4


def payload(shard: int, row: int) -> bytes:
    """A sample's binary field: deterministic bytes of a varying length (0..299)."""
    h = hashlib.sha256(f"{shard}/{row}".encode()).digest()
    return (h * 10)[: h[0] + h[1] % 44]


def write_tar(path: Path, shard: int, n: int, data_size: int = 0) -> None:
    """A WebDataset shard: per sample the members KEY.txt, KEY.bin (and KEY.big)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for row in range(n):
            key = f"part{shard}/s{shard:02d}_{row:05d}"
            add(f"{key}.txt", f"{shard}:{row}".encode())
            add(f"{key}.bin", payload(shard, row))
            if data_size:
                add(f"{key}.big", bytes([row % 251]) * data_size)


def independent_tar(path: str) -> list[dict[str, Any]]:
    """The samples of a shard read member by member with tarfile, grouped by name stem."""
    samples: dict[str, dict[str, Any]] = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            stem, _, ext = m.name.partition(".")
            f = tar.extractfile(m)
            assert f is not None
            samples.setdefault(stem, {"__key__": stem, "__url__": path})[ext] = f.read()
    return list(samples.values())


def ident(item: dict[str, Any]) -> tuple[int, int]:
    if "txt" in item:
        shard, row = item["txt"].decode().split(":")
        return int(shard), int(row)
    return int(item["shard"]), int(item["row"])


@pytest.fixture(scope="module")
def tar_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    d = tmp_path_factory.mktemp("tar")
    paths = []
    for shard, n in enumerate(SIZES):
        p = d / f"shard-{shard:04d}.tar"
        write_tar(p, shard, n)
        paths.append(str(p))
    return paths


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    d = tmp_path_factory.mktemp("parquet")
    paths = []
    for shard, n in enumerate(SIZES):
        p = d / f"shard-{shard:04d}.parquet"
        table = pa.table(
            {
                "shard": pa.array([shard] * n, pa.int64()),
                "row": pa.array(range(n), pa.int64()),
                "text": [f"{shard}:{row}" for row in range(n)],
                "bin": [payload(shard, row) for row in range(n)],
            }
        )
        pq.write_table(table, p, row_group_size=16)  # many row groups in the larger files
        paths.append(str(p))
    return paths


def reference(fmt: str, paths: list[str]) -> dict[tuple[int, int], dict[str, Any]]:
    """Every sample of the files, read without fastshard, by (shard, row)."""
    out = {}
    for shard, path in enumerate(paths):
        if fmt == "tar":
            rows = independent_tar(path)
        else:
            rows = pytest.importorskip("pyarrow.parquet").read_table(path).to_pylist()
        assert len(rows) == SIZES[shard]
        for row, sample in enumerate(rows):
            assert ident(sample) == (shard, row)
            out[shard, row] = sample
    return out


def shards_of(fmt: str, paths: list[str]) -> readers.Shards:
    return readers.tar_shards(paths) if fmt == "tar" else readers.parquet_shards(paths)


class LoggedRead:
    """Wraps a read: checks each read() yields the consecutive rows start, start + 1, ... and
    logs (shard, start, rows taken) to a file per process (one per DataLoader worker)."""

    def __init__(self, read: Any, log_dir: str) -> None:
        self.read = read
        self.log_dir = log_dir

    def __call__(self, shard: int, start: int, stop: int) -> Iterator[Any]:
        taken = 0
        try:
            for item in self.read(shard, start, stop):
                if ident(item) != (shard, start + taken):
                    raise AssertionError(
                        f"read({shard}, {start}, {stop}) yielded {ident(item)} as row "
                        f"{start + taken}"
                    )
                taken += 1
                yield item
        finally:
            with open(os.path.join(self.log_dir, f"{os.getpid()}.log"), "a") as f:
                f.write(f"{shard} {start} {taken}\n")


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def read_log(log_dir: Path) -> dict[str, list[tuple[int, int, int]]]:
    logs = {}
    for p in log_dir.glob("*.log"):
        logs[p.name] = [tuple(map(int, line.split())) for line in p.read_text().splitlines()]
    return logs  # type: ignore[return-value]


def run_rank(
    fmt: str, paths: list[str], tmp: Path, world: int, rank: int, **kw: Any
) -> tuple[list[Any], dict[str, list[tuple[int, int, int]]], fastshard.ShardedStream]:
    log_dir = tmp / f"{fmt}-w{world}-r{rank}"
    log_dir.mkdir()
    sizes, read = shards_of(fmt, paths)
    stream = fastshard.ShardedStream(
        sizes,
        LoggedRead(read, str(log_dir)),
        batch_size=BATCH,
        num_replicas=world,
        rank=rank,
        seed=7,
        **kw,
    )
    loader = DataLoader(stream, batch_size=BATCH, num_workers=2, collate_fn=as_list)
    items = [item for batch in loader for item in batch]
    return items, read_log(log_dir), stream


def check_reads(logs: dict[str, list[tuple[int, int, int]]]) -> int:
    """No reader (process) takes a row of a shard twice; returns the rows taken in all."""
    total = 0
    for name, entries in logs.items():
        seen: dict[int, set[int]] = defaultdict(set)
        for shard, start, taken in entries:
            rows = set(range(start, start + taken))
            again = seen[shard] & rows
            assert not again, f"reader {name} read rows {sorted(again)[:5]} of shard {shard} twice"
            seen[shard] |= rows
            total += taken
    return total


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("pad", [False, True])
def test_ranks_and_workers_end_to_end(
    fmt: str, world: int, pad: bool, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    paths = request.getfixturevalue(f"{fmt}_files")
    ref = reference(fmt, paths)
    n = sum(SIZES)
    seen: Counter[tuple[int, int]] = Counter()
    counts = []
    for rank in range(world):
        items, logs, stream = run_rank(fmt, paths, tmp_path, world, rank, pad=pad)
        counts.append(len(items))
        ids = [ident(x) for x in items]
        # Each item is the sample the file holds at its (shard, row), field for field.
        for item, key in zip(items, ids):
            assert item == ref[key]
        # The rank's items are its positions r, r + W, ... of the stream's global sequence.
        seq = [tuple(p) for p in stream.sequence().tolist()]
        assert ids == [seq[(rank + i * world) % n] for i in range(len(ids))]
        seen.update(ids)
        # Default lanes are private to each (rank, worker): rows taken == rows yielded, but
        # for the padding, which re-reads a window (up to `window` rows) from the epoch start.
        padded = sum(rank + i * world >= n for i in range(len(ids)))
        assert len(items) <= check_reads(logs) <= len(items) + padded * stream.window
        assert padded or check_reads(logs) == len(items)
        assert len(logs) == 2  # both workers read
    if pad:
        assert counts == [-(-n // world)] * world
        assert set(seen) == set(ref)
    else:
        assert sum(counts) == n and max(counts) - min(counts) <= 1
        assert seen == Counter(ref.keys())  # every sample exactly once


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
@pytest.mark.filterwarnings("ignore::fastshard.ReadAmplificationWarning")  # lanes shared on purpose
def test_shared_lanes_and_chunks(fmt: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """lanes not a multiple of batch_size * W * workers (lanes shared between readers) and
    shards cut into chunks (reads that start mid-shard): still every sample once, and no
    reader takes a row twice."""
    paths = request.getfixturevalue(f"{fmt}_files")
    ref = reference(fmt, paths)
    seen: Counter[tuple[int, int]] = Counter()
    taken = 0
    for rank in range(2):
        items, logs, _ = run_rank(
            fmt, paths, tmp_path, 2, rank, pad=False, lanes=5, window=3, chunk_size=50
        )
        for item in items:
            assert item == ref[ident(item)]
        seen.update(ident(x) for x in items)
        taken += check_reads(logs)
    assert seen == Counter(ref.keys())
    assert taken > sum(SIZES)  # shared lanes: readers take rows they do not yield


# webdataset leaves its shard files for the garbage collector to close (ResourceWarning).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_tar_reader_matches_webdataset(tar_files: list[str]) -> None:
    wds = pytest.importorskip("webdataset")
    sizes, read = readers.tar_shards(tar_files, index_every=7)
    assert sizes.tolist() == SIZES
    for shard, path in enumerate(tar_files):
        theirs = list(wds.WebDataset(path, shardshuffle=False, empty_check=False))
        for sample in theirs:
            sample.pop("__local_path__", None)
        assert list(read(shard, 0, SIZES[shard])) == theirs
        # Reads that start and stop anywhere, through the offset index and past it.
        for start, stop in [(0, 1), (6, 8), (7, 7), (13, 37), (SIZES[shard] // 2, SIZES[shard])]:
            if stop <= SIZES[shard]:
                assert list(read(shard, start, stop)) == theirs[start:stop]


def test_parquet_reader_slices(parquet_files: list[str]) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    sizes, read = readers.parquet_shards(parquet_files, columns=["row", "text"], batch_rows=5)
    assert sizes.tolist() == SIZES
    big = SIZES.index(max(SIZES))
    rows = pq.read_table(parquet_files[big], columns=["row", "text"]).to_pylist()
    for start, stop in [(0, 0), (0, 3), (15, 17), (16, 16), (16, 33), (390, 400), (0, 400)]:
        assert list(read(big, start, stop)) == rows[start:stop]
    with pytest.raises(ValueError, match="out of range"):
        read(big, 10, 401)


class CountingFile(io.FileIO):
    """A file that counts the bytes read through it (class-wide)."""

    bytes_read = 0

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        data = super().read(size)
        CountingFile.bytes_read += len(data)
        return data

    def readinto(self, buffer: Any) -> int:  # type: ignore[override]
        n = super().readinto(buffer)
        CountingFile.bytes_read += n or 0
        return n or 0


def counting_open(path: str) -> CountingFile:
    return CountingFile(path, "rb")


def test_tar_skip_seeks_over_member_data(tmp_path: Path) -> None:
    """The scan and the skip to a start row read member headers only: with 8 KiB of data per
    sample, a read of 10 samples from row 150 reads their data and ~1 KiB of header per
    sample it passes, not the 1.2 MiB of data before it."""
    data_size = 8192
    path = tmp_path / "big.tar"
    write_tar(path, 0, 200, data_size=data_size)
    file_size = path.stat().st_size
    CountingFile.bytes_read = 0
    sizes, read = readers.tar_shards([path], opener=counting_open, index_every=10**9)
    assert sizes.tolist() == [200]
    header = 3 * 513  # per sample: three member headers, and one byte read after each
    assert CountingFile.bytes_read <= 200 * header + 1024 < file_size / 5  # + end blocks
    # The 10 samples are read as one block: their headers and their members' data padded to
    # 512-byte blocks (.txt and .bin hold under 512 bytes each).
    wanted = 10 * (3 * 512 + 512 + 512 + data_size)
    for index_every, passed in [(10**9, 150), (64, 150 - 128)]:
        _, read = readers.tar_shards([path], opener=counting_open, index_every=index_every)
        CountingFile.bytes_read = 0
        got = list(read(0, 150, 160))
        assert [ident(x) for x in got] == [(0, r) for r in range(150, 160)]
        assert all(x["big"] == bytes([r % 251]) * data_size for x, r in zip(got, range(150, 160)))
        # Plus the headers of the samples passed on the way to row 150, and of the 10 read
        # (the walk that finds where row 160 starts, inside an index interval).
        assert CountingFile.bytes_read <= wanted + (passed + 11) * header + 2048


def test_tar_stream_reads_only_what_it_yields(tmp_path: Path) -> None:
    """A whole epoch through the stream with reads that start mid-shard (chunks): the bytes
    read are the yielded samples' data plus headers, never the data of skipped samples."""
    data_size = 4096
    paths = []
    for shard, n in enumerate([50, 0, 120, 7]):
        p = tmp_path / f"s{shard}.tar"
        write_tar(p, shard, n, data_size=data_size)
        paths.append(p)
    every = 8
    sizes, read = readers.tar_shards(paths, opener=counting_open, index_every=every)
    stream = fastshard.ShardedStream(
        sizes, read, batch_size=4, num_replicas=2, rank=1, chunk_size=16, pad=False
    )
    CountingFile.bytes_read = 0
    it = iter(stream)
    items = list(it)
    assert it.rows_read == it.yielded == len(items) == sum(sizes) // 2
    data = sum(len(v) for x in items for k, v in x.items() if not k.startswith("__"))
    # Each read: the headers of < `every` samples it passes, the headers of what it yields,
    # the first (tiny) member of the sample after the last it yields, the end blocks.
    header = 3 * 513
    bound = data + it.reads * (every * header + 2048) + len(items) * header
    assert data <= CountingFile.bytes_read <= bound
    # Rank 1 yields half the samples; what it reads beyond them is header walks (a read that
    # starts or stops inside an index interval walks up to `every` samples' headers) and the
    # padding of members to 512-byte blocks, never a skipped sample's data.
    assert CountingFile.bytes_read < 0.8 * sum(p.stat().st_size for p in paths)


def test_short_shard_is_named(tar_files: list[str]) -> None:
    sizes = list(SIZES)
    sizes[6] += 1  # the manifest claims a sample shard 6 does not hold
    shards = readers.tar_shards(tar_files, sizes=sizes)
    stream = fastshard.ShardedStream(
        shards.sizes, shards.read, batch_size=4, num_replicas=1, rank=0, shuffle=False
    )
    # The shard's own count (its scan at the first read) against the one given, both named.
    with pytest.raises(ValueError, match=r"shard-0006\.tar: holds 60 samples, but sizes= says 61"):
        list(stream)


def test_reads_pickle_without_handles(tar_files: list[str], parquet_files: list[str]) -> None:
    for shards in (readers.tar_shards(tar_files), readers.parquet_shards(parquet_files)):
        read = pickle.loads(pickle.dumps(shards.read))
        assert [ident(x) for x in read(3, 398, 400)] == [(3, 398), (3, 399)]
        it = read(0, 0, 37)
        next(it)
        with pytest.raises(TypeError):
            pickle.dumps(it)  # an open read is a generator; the read itself holds no file
    with pytest.raises(TypeError, match="sequence of paths"):
        readers.tar_shards(tar_files[0])


def test_compressed_tar_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "c.tar.gz"
    with tarfile.open(p, "w:gz") as tar:
        info = tarfile.TarInfo("a.txt")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="uncompressed"):
        readers.tar_shards([p])
