"""fastshard.readers: the C++ tar scan against a reference in Python, shard indexes, counting
once per job, and the bounds on open files and memory whatever the number of open reads.

The reference scan below is tarfile grouped as webdataset groups members (the scan fastshard
used to run); the C++ scanner must give the same counts, offsets and samples on tars written
by tarfile in every format it writes and by webdataset's TarWriter.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import sys
import tarfile
import textwrap
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastshard
from fastshard import _core, readers

from .conftest import launch_ranks, run_python

# -- the reference: tarfile, grouped as webdataset groups members ----------------------------
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")


def reference_samples(path: str) -> list[dict[str, Any]]:
    """Every sample of a shard: {"__offset__", "__end__", "__key__", "__url__", ext: bytes}."""
    out: list[dict[str, Any]] = []
    sample: dict[str, Any] | None = None
    with tarfile.open(path, "r:") as tar:
        for member in tar:
            name = member.name
            if not member.isreg() or _META.match(name):
                continue
            m = _KEY_EXT.match(name)
            if m is None:
                continue
            key, ext = m.group(1), m.group(2).lower()
            if sample is None or key != sample["__key__"]:
                sample = {"__offset__": member.offset, "__key__": key, "__url__": path}
                out.append(sample)
            elif ext in sample:
                raise ValueError(f"duplicate {ext!r} in {key!r}")
            f = tar.extractfile(member)
            assert f is not None
            sample[ext] = f.read()
            sample["__end__"] = member.offset_data + -(-member.size // 512) * 512
    return out


def public(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if k not in ("__offset__", "__end__")}


# -- tars of every shape ------------------------------------------------------------------------
def add(tar: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    if kind == tarfile.SYMTYPE:
        info.linkname = "elsewhere"
    elif kind == tarfile.REGTYPE:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def awkward_members(tar: tarfile.TarFile, long: bool) -> None:
    deep = "/".join(f"level{i:02d}" for i in range(12)) if long else "d"  # > 100 characters
    add(tar, "__meta__.json", b"{}")  # webdataset's shard metadata: not a field
    add(tar, "__meta__/x.txt", b"meta")
    add(tar, f"{deep}", kind=tarfile.DIRTYPE)
    for i in range(23):
        key = f"{deep}/sample{i:03d}"
        add(tar, f"{key}.txt", f"text {i}".encode())
        if i % 3 == 0:
            add(tar, f"{key}.JPG", bytes([i]) * (i * 97))  # lower-cased, data of many blocks
        if i % 4 == 0:
            add(tar, f"{key}.seg.png", b"x" * 600)  # extension "seg.png"
        if i % 5 == 0:
            add(tar, f"{key}.lnk", kind=tarfile.SYMTYPE)  # not regular: skipped
            add(tar, f"{key}.cls", b"5")  # same key after the link: the same sample
        if i == 7:
            add(tar, "README", b"no dot: skipped")
            add(tar, f"{deep}/.hidden", b"key is the folder")
        if i == 11:
            add(tar, f"{deep}/k\u00e9y{i}.T\u00c9XT", b"non-ASCII")
        if i == 13:
            add(tar, f"{key}.empty", b"")
    add(tar, "a.b/c.txt", b"dot in the folder")


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("formats")
    out = {}
    for label, fmt, long in [
        ("ustar", tarfile.USTAR_FORMAT, False),
        ("ustar_prefix", tarfile.USTAR_FORMAT, True),
        ("gnu_long", tarfile.GNU_FORMAT, True),
        ("pax_long", tarfile.PAX_FORMAT, True),
    ]:
        p = d / f"{label}.tar"
        with tarfile.open(p, "w", format=fmt) as tar:
            awkward_members(tar, long)
        out[label] = str(p)
    p = d / "pax_global.tar"  # a global header first, and per-member pax records
    with tarfile.open(p, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tar:
        awkward_members(tar, True)
    out["pax_global"] = str(p)
    p = d / "empty.tar"
    with tarfile.open(p, "w"):
        pass
    out["empty"] = str(p)
    wds = pytest.importorskip("webdataset")
    p = d / "wds.tar"
    with wds.TarWriter(str(p)) as sink:
        for i in range(41):
            sink.write({"__key__": f"s{i:04d}", "txt": f"t{i}", "cls": str(i % 7), "bin": b"b" * i})
    out["webdataset"] = str(p)
    return out


LABELS = ["ustar", "ustar_prefix", "gnu_long", "pax_long", "pax_global", "empty", "webdataset"]


@pytest.mark.parametrize("label", LABELS)
@pytest.mark.parametrize("every", [1, 3, 16])
def test_scan_matches_the_reference(formats: dict[str, str], label: str, every: int) -> None:
    path = formats[label]
    ref = reference_samples(path)
    n, offsets, end = _core.tar_scan(os.open(path, os.O_RDONLY), every, path)
    assert n == len(ref)
    assert offsets.tolist() == [s["__offset__"] for s in ref[::every]]
    assert end == (ref[-1]["__end__"] if ref else 0)
    counts, bounds, flat, ends = _core.tar_scan_paths([path, path], every)
    assert counts.tolist() == [n, n] and ends.tolist() == [end, end]
    assert flat[bounds[1] : bounds[2]].tolist() == offsets.tolist()
    with open(path, "rb") as f:  # through a file object: the same
        assert _core.tar_scan(f, every, path)[0] == n


@pytest.mark.parametrize("label", LABELS)
def test_reads_match_the_reference(formats: dict[str, str], label: str) -> None:
    path = formats[label]
    ref = [public(s) for s in reference_samples(path)]
    n = len(ref)
    for every in (1, 4, 16):
        sizes, read = readers.tar_shards([path], index_every=every)
        assert sizes.tolist() == [n]
        ranges = [(0, n), (0, 0), (n, n)] + [(a, b) for a in range(0, n, 3) for b in (a + 1, n)]
        for a, b in ranges:
            if b <= n:
                assert list(read(0, a, b)) == ref[a:b], (every, a, b)
    # Counts given (as from a webdataset index): offsets are found on the first read.
    _, read = readers.tar_shards([path], sizes=[n], index_every=5)
    assert list(read(0, n // 2, n)) == ref[n // 2 :]


def test_duplicate_extension_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "dup.tar"
    with tarfile.open(p, "w") as tar:
        add(tar, "a.txt", b"1")
        add(tar, "a.TXT", b"2")
    with pytest.raises(ValueError, match="two members with extension 'txt'"):
        readers.tar_shards([p])


def test_not_a_tar_is_refused(tmp_path: Path) -> None:
    for name, data in [("empty", b""), ("text", b"hello" * 200)]:
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(ValueError, match="not an uncompressed tar"):
            readers.tar_shards([p])
    with pytest.raises(FileNotFoundError):
        readers.tar_shards([tmp_path / "missing.tar"])


# -- shard indexes ------------------------------------------------------------------------------
def write_shards(d: Path, sizes: list[int]) -> list[str]:
    paths = []
    for s, n in enumerate(sizes):
        p = d / f"shard-{s:04d}.tar"
        with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as tar:
            for r in range(n):
                add(tar, f"s{s}/r{r:05d}.txt", f"{s}:{r}".encode())
                add(tar, f"s{s}/r{r:05d}.bin", bytes([r % 256]) * (r % 700))
        paths.append(str(p))
    return paths


def ident(item: dict[str, Any]) -> tuple[int, int]:
    s, r = item["txt"].decode().split(":")
    return int(s), int(r)


def test_index_command_and_tar_shards_from_the_index(tmp_path: Path) -> None:
    sizes = [40, 0, 17, 100]
    d = tmp_path / "data"
    d.mkdir()
    paths = write_shards(d, sizes)
    out = tmp_path / "meta" / "index.json"
    out.parent.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "fastshard", "index", *paths, "-o", str(out), "--index-every", "8"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    # webdataset's own format: what wids reads, with urls relative to the index's folder.
    assert doc["__kind__"] == "wids-shard-index-v1" and doc["wids_version"] == 1
    assert [e["nsamples"] for e in doc["shardlist"]] == sizes
    assert doc["shardlist"][0]["url"] == "../data/shard-0000.tar"
    assert doc["shardlist"][0]["filesize"] == os.path.getsize(paths[0])
    scanned = readers.tar_shards(paths)
    indexed = readers.tar_shards(index=out)
    assert indexed.sizes.tolist() == sizes
    assert indexed.read.index_every == 8
    for s, n in enumerate(sizes):
        for a, b in [(0, n), (n // 3, n), (1, min(n, 9))]:
            if a <= b:
                assert list(indexed.read(s, a, b)) == list(scanned.read(s, a, b))
    # A wids index without fastshard's offsets (as webdataset's tools write it): counts only,
    # offsets found by a scan of each shard the first time it is read.
    plain = {k: v for k, v in doc.items() if k != "fastshard"}
    (tmp_path / "meta" / "wids.json").write_text(json.dumps(plain))
    counts_only = readers.tar_shards(index=tmp_path / "meta" / "wids.json")
    assert counts_only.read.index is None and counts_only.sizes.tolist() == sizes
    assert list(counts_only.read(3, 50, 60)) == list(scanned.read(3, 50, 60))
    # A shard changed after the index was written is refused when it is opened.
    with open(paths[2], "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(ValueError, match="write the index again"):
        list(readers.tar_shards(index=out).read(2, 0, 1))
    with pytest.raises(ValueError, match="not both"):
        readers.tar_shards(paths, index=out)


def test_index_offsets_are_decoded_when_a_shard_is_first_read(tmp_path: Path) -> None:
    """tar_shards(index=...) checks each shard's offsets by length and decodes them at the
    shard's first read: a damaged entry of the right length fails that shard's read, naming
    the index, and no other shard's."""
    sizes = [40, 17, 100]
    paths = write_shards(tmp_path, sizes)
    out = tmp_path / "index.json"
    readers.write_tar_index(paths, out, index_every=8)
    doc = json.loads(out.read_text())
    text = doc["fastshard"]["shards"][1]["offsets"]
    doc["fastshard"]["shards"][1]["offsets"] = "!" * 4 + text[4:]  # same length, not base64
    out.write_text(json.dumps(doc))
    sizes_read, read = readers.tar_shards(index=out)
    assert sizes_read.tolist() == sizes
    scanned = readers.tar_shards(paths)
    assert list(read(0, 3, 30)) == list(scanned.read(0, 3, 30))
    assert list(read(2, 50, 99)) == list(scanned.read(2, 50, 99))
    with pytest.raises(ValueError, match=r"index\.json: shard 1's offsets.*write the index again"):
        list(read(1, 0, 5))
    # A wrong length is refused up front.
    doc["fastshard"]["shards"][1]["offsets"] = text[:-4]
    out.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="shard 1 has 17 samples but 2 offsets"):
        readers.tar_shards(index=out)


# -- counting once per job ----------------------------------------------------------------------
SHARE_WORKER = textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist
    rank, world, port = map(int, sys.argv[1:4])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    from fastshard import readers
    paths = json.loads(os.environ["SHARDS"])
    scans = []
    real = readers._scan_tars
    def counting(*args):
        scans.append(1)
        return real(*args)
    readers._scan_tars = counting
    results = {}
    sizes, read = readers.tar_shards(paths, share_counts=True)
    results["shared"] = {"sizes": sizes.tolist(), "scans": len(scans),
                         "first": read(1, 5, 6).__next__()["txt"].decode()}
    scans.clear()
    sizes, _ = readers.tar_shards(paths)  # the default: each rank scans, no collective
    results["local"] = {"sizes": sizes.tolist(), "scans": len(scans)}
    try:
        readers.tar_shards(paths if rank == 0 else paths[::-1], share_counts=True)
        results["different"] = "no error"
    except ValueError as err:
        results["different"] = str(err)
    try:
        readers.tar_shards([p + ".missing" for p in paths], share_counts=True)
        results["missing"] = "no error"
    except OSError as err:
        results["missing"] = type(err).__name__
    pq = readers.parquet_shards(json.loads(os.environ["PARQUET"]), share_counts=True)
    results["parquet"] = pq.sizes.tolist()
    dist.destroy_process_group()
    print(json.dumps({"results": results}))
    """
)


def test_rank_zero_counts_and_the_others_receive(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    sizes = [12, 30, 0, 7]
    paths = write_shards(tmp_path, sizes)
    parquet = []
    for s, n in enumerate(sizes):
        p = tmp_path / f"p{s}.parquet"
        pq.write_table(pa.table({"row": pa.array(range(n), pa.int64())}), p)
        parquet.append(str(p))
    worker = tmp_path / "share_worker.py"
    worker.write_text(SHARE_WORKER)
    os.environ["SHARDS"] = json.dumps(paths)
    os.environ["PARQUET"] = json.dumps(parquet)
    try:
        ranks = launch_ranks(worker, 2, timeout=240)
    finally:
        del os.environ["SHARDS"], os.environ["PARQUET"]
    for rank, res in enumerate(ranks):
        assert res["shared"]["sizes"] == sizes
        assert res["shared"]["scans"] == (1 if rank == 0 else 0)  # only rank 0 scanned
        assert res["shared"]["first"] == "1:5"
        assert res["local"] == {"sizes": sizes, "scans": 1}  # the default: each rank scans
        assert "different shard lists" in res["different"]  # raised on both ranks
        assert res["missing"] == "FileNotFoundError"  # rank 0's error, raised on both
        assert res["parquet"] == sizes


# -- bounds: open files and memory --------------------------------------------------------------
FD_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    from collections import Counter
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    import fastshard
    from fastshard import readers
    from torch.utils.data import DataLoader

    def fds():
        return len(os.listdir("/proc/self/fd"))

    class Watched:
        # The reader, counting this process's open descriptors at every read it opens and
        # every item it yields (a DataLoader worker records its own maximum).
        def __init__(self, read, log):
            self.read, self.log = read, log
        def __call__(self, shard, start, stop):
            return self._items(shard, start, stop)
        def _items(self, shard, start, stop):
            top = fds()
            try:
                for i, item in enumerate(self.read(shard, start, stop)):
                    if i % 7 == 0:
                        top = max(top, fds())
                    yield item
            finally:
                with open(self.log, "a") as f:
                    f.write(f"{os.getpid()} {top}\\n")

    paths, workers, log = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sizes, read = readers.tar_shards(paths)
    stream = fastshard.ShardedStream(sizes, Watched(read, log), batch_size=128,
                                     num_replicas=1, rank=0, pad=False)
    base = fds()
    loader = DataLoader(stream, batch_size=128, num_workers=workers,
                        collate_fn=lambda b: [x["txt"].decode() for x in b])
    seen = Counter()
    top = base
    for batch in loader:
        seen.update(batch)
        top = max(top, fds())
    print(json.dumps({"lanes": stream.lanes, "items": sum(seen.values()),
                      "distinct": len(seen), "base": base, "top": top}))
    """
)


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_128_under_1024_open_files(tmp_path: Path, workers: int) -> None:
    """batch_size=128: 1,024 lanes, each with an open read. Under RLIMIT_NOFILE = 1,024 the
    whole epoch is read, every item once, and no process holds more descriptors than the
    pool's 64 and a few of its own."""
    sizes = [25 + (s * 37) % 60 for s in range(96)]
    paths = write_shards(tmp_path, sizes)
    child = tmp_path / "fd_child.py"
    child.write_text(FD_CHILD)
    log = tmp_path / "fds.log"
    out = run_python(
        f"import runpy, sys; sys.argv = ['x', {json.dumps(json.dumps(paths))}, '{workers}', "
        f"'{log}']; runpy.run_path('{child}', run_name='__main__')",
        timeout=300,
    )
    res = json.loads(out.strip().splitlines()[-1])
    assert res["lanes"] == 1024
    assert res["items"] == res["distinct"] == sum(sizes)
    per_process: dict[str, int] = {}
    for line in log.read_text().splitlines():
        pid, top = line.split()
        per_process[pid] = max(per_process.get(pid, 0), int(top))
    assert len(per_process) == max(workers, 1)
    # The main process: what it held before the loader, plus its workers' pipes.
    assert res["top"] <= res["base"] + readers.MAX_OPEN_FILES + 8 + 4 * workers
    # Each reading process: the pool's files and the interpreter's own few.
    assert max(per_process.values()) <= readers.MAX_OPEN_FILES + 40, per_process


def test_pool_bound_and_pickling(tmp_path: Path) -> None:
    sizes = [9] * 30
    paths = write_shards(tmp_path, sizes)
    _, read = readers.tar_shards(paths, max_open_files=4)
    # 30 reads open at once, each advanced a little at a time, round robin.
    its = [read(s, 0, 9) for s in range(30)]
    got: list[list[tuple[int, int]]] = [[] for _ in its]
    for _ in range(9):
        for s, it in enumerate(its):
            got[s].append(ident(next(it)))
            assert len(read.files().files) <= 4
    assert got == [[(s, r) for r in range(9)] for s in range(30)]
    assert read.files().opened > 4  # files were closed and opened again
    # A read object pickles as paths and offsets; the copy makes its own pool.
    copy = pickle.loads(pickle.dumps(read))
    assert copy._pool is None and ident(next(copy(7, 3, 4))) == (7, 3)
    with pytest.raises(ValueError, match="max_open_files"):
        readers.tar_shards(paths, max_open_files=0)


def test_forked_child_starts_its_own_pool(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, [5, 5])
    _, read = readers.tar_shards(paths)
    assert ident(next(read(0, 0, 1))) == (0, 0)
    parent_pool = read.files()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            ok = read.files() is not parent_pool and ident(next(read(1, 4, 5))) == (1, 4)
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(r)
    assert read.files() is parent_pool


PARQUET_CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    limit_kib = int(sys.argv[2])
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1])
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    import fastshard
    from fastshard import readers
    paths = json.loads(sys.argv[1])
    sizes, read = readers.parquet_shards(paths)
    stream = fastshard.ShardedStream(sizes, read, batch_size=128, num_replicas=1, rank=0,
                                     pad=False)
    base = hwm()
    def watchdog():
        # Past twice the bound the test has failed: stop before the machine runs short.
        while True:
            if rss() - base > 2 * limit_kib:
                os._exit(3)
            threading.Event().wait(0.05)
    threading.Thread(target=watchdog, daemon=True).start()
    seen = set()
    for item in stream:
        seen.add((item["shard"], item["row"]))
    cache = getattr(read, "cache", None)
    print(json.dumps({"items": len(seen), "growth_kib": hwm() - base,
                      "decoded": cache().decoded if cache else None,
                      "groups": sum(map(len, read.group_starts))}))
    """
)

# 512 MiB: the row-group cache's 256 MiB, the lanes' windows (1,024 x 16 rows of 1 KiB) and
# Arrow's and Python's allocators around them. Measured: 164 MiB (the 80 MiB of decoded row
# groups fit in the cache); 1.1 GiB when every lane decoded its own row group.
PARQUET_GROWTH_KIB = 512 * 1024


def test_parquet_memory_is_bounded_at_batch_128(tmp_path: Path) -> None:
    """An ~80 MiB Parquet dataset in row groups of 256 rows, read at batch_size=128 (1,024
    lanes): the process grows by less than 512 MiB (1.1 GiB when each lane held its own
    decoded row group), every row once."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows_per_file, files = 4096, 20  # 81,920 rows of ~1 KiB
    paths = []
    rng = np.random.default_rng(0)
    for s in range(files):
        p = tmp_path / f"p{s:03d}.parquet"
        blob = rng.integers(0, 256, size=(rows_per_file, 1000), dtype=np.uint8)
        table = pa.table(
            {
                "shard": pa.array([s] * rows_per_file, pa.int64()),
                "row": pa.array(range(rows_per_file), pa.int64()),
                "blob": pa.array([bytes(b) for b in blob], pa.binary()),
            }
        )
        pq.write_table(table, p, row_group_size=256, compression="none")
        paths.append(str(p))
    child = tmp_path / "parquet_child.py"
    child.write_text(PARQUET_CHILD)
    proc = subprocess.run(
        [sys.executable, str(child), json.dumps(paths), str(PARQUET_GROWTH_KIB)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"exit {proc.returncode} (3: over twice the bound)\n{proc.stderr}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["items"] == rows_per_file * files
    assert res["growth_kib"] < PARQUET_GROWTH_KIB, res
    # The dataset's decoded row groups fit in the cache: each decoded once.
    assert res["decoded"] == res["groups"]


def test_parquet_unknown_columns_are_refused(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a", "b"], "label": [0, 1]}), p)
    with pytest.raises(ValueError, match="no column 'txt', 'lable'"):
        readers.parquet_shards([p], columns=["txt", "label", "lable"])
    _, read = readers.parquet_shards([p], columns=["label"])
    assert list(read(0, 0, 2)) == [{"label": 0}, {"label": 1}]


def test_parquet_cache_decodes_each_row_group_once(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"row": pa.array(range(1000), pa.int64())}), p, row_group_size=100)
    _, read = readers.parquet_shards([p])
    # 40 reads open at once over the same file, advanced in turn (as lanes are).
    its = [read(0, 25 * i, 25 * i + 25) for i in range(40)]
    rows = [[next(it)["row"] for _ in range(25)] for it in its]
    assert rows == [list(range(25 * i, 25 * i + 25)) for i in range(40)]
    assert read.cache().decoded == 10  # each row group once, for the 4 reads inside it
    # A cache too small for one row group still reads right (re-decoding what it drops).
    _, small = readers.parquet_shards([p], cache_bytes=1)
    assert [x["row"] for x in small(0, 95, 205)] == list(range(95, 205))


def test_parquet_cache_too_small_for_the_row_groups_read_at_once_does_not_cycle(
    tmp_path: Path,
) -> None:
    """Three row groups read at once by four reads each, in a cache that holds two: the
    reads that come back to a dropped row group decode it for their own rows, a bounded
    number of times, instead of each take dropping the row group the next one needs (on a
    least-recently-used cache alone: a decode for nearly every take)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"row": pa.array(range(3000), pa.int64())}), p, row_group_size=1000)
    one_group = 1000 * (8 + readers.PY_ROW_BYTES + readers.PY_VALUE_BYTES)
    cache_bytes = int(2.4 * one_group)
    _, read = readers.parquet_shards([p], batch_rows=5, cache_bytes=cache_bytes)
    its = [read(0, 250 * i, 250 * i + 250) for i in range(12)]
    rows: list[list[int]] = [[] for _ in its]
    cache = None
    with pytest.warns(readers.RowGroupCacheWarning, match=r"cache_bytes=\d+ .* decoded again"):
        for _ in range(250):  # one row from each read in turn, as lanes are read
            for i, it in enumerate(its):
                rows[i].append(next(it)["row"])
                cache = read.cache()
                assert cache.bytes <= cache.max_bytes + 1e-6 or len(cache.groups) == 1
    assert rows == [list(range(250 * i, 250 * i + 250)) for i in range(12)]
    assert cache is not None
    # The rows a read keeps for itself after a drop: the rest of its rows in the row group,
    # up to cache_bytes / PRIVATE_SHARE of them.
    kept = (
        cache_bytes // readers.PRIVATE_SHARE // (8 + readers.PY_ROW_BYTES + readers.PY_VALUE_BYTES)
    )
    assert 3 < cache.decoded <= 3 + 4 * -(-250 // kept), cache.decoded
    assert not cache.groups and cache.bytes == pytest.approx(0, abs=1e-6)


def test_a_stream_whose_row_groups_overflow_the_cache_says_so_once(tmp_path: Path) -> None:
    """Row groups much larger than a lane's stretch, in a cache that holds about one: every
    row still comes once, and a RowGroupCacheWarning (once) says that the files are decoded
    several times over; with a cache that holds them, the same stream says nothing."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "big-groups.parquet"
    pq.write_table(pa.table({"row": pa.array(range(8000), pa.int64())}), p, row_group_size=2000)
    one_group = 2000 * (8 + readers.PY_ROW_BYTES + readers.PY_VALUE_BYTES)
    for cache_bytes, warns in ((int(1.2 * one_group), True), (readers.CACHE_BYTES, False)):
        sizes, read = readers.parquet_shards([p], cache_bytes=cache_bytes)
        # 64 lanes of 125 rows: 16 lanes read each row group at once.
        stream = fastshard.ShardedStream(
            sizes, read, batch_size=8, num_replicas=1, rank=0, pad=False
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rows = [x["row"] for x in stream]
        assert sorted(rows) == list(range(8000))
        said = [w for w in caught if issubclass(w.category, readers.RowGroupCacheWarning)]
        assert len(said) == (1 if warns else 0), [str(w.message) for w in caught]
        cache = read.cache()
        if warns:
            assert cache.decoded >= 2 * len(cache.seen) == 8, cache.decoded
            assert "times over so far" in str(said[0].message)
        else:
            assert cache.decoded == len(cache.seen) == 4


def test_parquet_files_opened_again_reuse_their_parsed_footer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More files in play than the pool holds: a file the pool closed is opened again with the
    footer parsed before (parquet_shards' own, then the first open's), and the footers kept
    stay within their byte bound."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    paths = []
    for i in range(3):
        p = tmp_path / f"f{i}.parquet"
        pq.write_table(pa.table({"row": pa.array(range(100 * i, 100 * i + 100))}), p)
        paths.append(str(p))
    given: list[bool] = []  # whether each open was given a parsed footer

    class Recording:
        def __init__(self, real: Any) -> None:
            self.real = real

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

        def ParquetFile(self, source: Any, **kwargs: Any) -> Any:
            given.append(kwargs.get("metadata") is not None)
            return self.real.ParquetFile(source, **kwargs)

    real = readers._pyarrow_parquet()
    monkeypatch.setattr(readers, "_pyarrow_parquet", lambda: Recording(real))
    _, read = readers.parquet_shards(paths, max_open_files=1)
    for _ in range(2):
        for i in range(3):
            assert [x["row"] for x in read(i, 10, 12)] == [100 * i + 10, 100 * i + 11]
    assert read.files().opened == 6
    assert given == [True] * 6

    # In a process whose footers were not read by parquet_shards (a spawned worker), the
    # first open parses the footer and keeps it.
    other = pickle.loads(pickle.dumps(read))
    given.clear()
    for _ in range(2):
        for i in range(3):
            assert [x["row"] for x in other(i, 0, 1)] == [100 * i]
    assert given == [False] * 3 + [True] * 3

    # The bound: footers beyond it are dropped, least recently used first, and parsed again.
    one = pq.read_metadata(paths[0]).serialized_size
    monkeypatch.setattr(readers, "FOOTER_BYTES", int(2.5 * one))
    small = pickle.loads(pickle.dumps(read))
    given.clear()
    for _ in range(2):
        for i in range(3):
            list(small(i, 0, 1))
    assert len(small.footers().metas) == 2 and small.footers().bytes <= 2.5 * one
    assert given == [False] * 6


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_mapped_parquet_files_let_their_pages_go(tmp_path: Path) -> None:
    """Once a row group of a memory-mapped Parquet file is decoded, its pages leave the
    process's RSS (they stay in the page cache): the mapped files of the pool do not add up
    to the size of the files read."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(5)
    paths = []
    for i in range(12):
        p = tmp_path / f"m{i}.parquet"
        blobs = [rng.bytes(4096) for _ in range(512)]  # 2 MiB a file, incompressible
        pq.write_table(pa.table({"blob": blobs}), p, row_group_size=128, compression="none")
        paths.append(str(p))

    def mapped_rss_kib() -> int:
        total, ours = 0, False
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                    ours = head[-1] in paths
                elif ours and head[0] == "Rss:":
                    total += int(head[1])
        return total

    sizes, read = readers.parquet_shards(paths)
    rows = sum(1 for shard in range(12) for _ in read(shard, 0, int(sizes[shard])))
    assert rows == 12 * 512
    assert len(read.files().files) == 12  # all 12 files still mapped
    # 24 MiB of files were read through the mappings; a few pages at most are left in the RSS
    # (pyarrow checks each file's last bytes, and the kernel maps the pages around a fault).
    assert mapped_rss_kib() <= 64, mapped_rss_kib()
    read.files().close()
    assert mapped_rss_kib() == 0


def test_parquet_rows_read_twice_in_a_pass_come_back_whole(tmp_path: Path) -> None:
    """The cache releases each row it hands out; a row asked for again while its row group
    is still cached (a padded epoch repeats rows) is decoded again, not lost."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"row": pa.array(range(200), pa.int64())}), p, row_group_size=100)
    _, read = readers.parquet_shards([p], batch_rows=4)
    assert [x["row"] for x in read(0, 0, 10)] == list(range(10))
    assert [x["row"] for x in read(0, 5, 120)] == list(range(5, 120))
    assert [x["row"] for x in read(0, 0, 200)] == list(range(200))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_parquet_files_are_memory_mapped_unless_asked_not_to(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "mapped.parquet"
    pq.write_table(pa.table({"row": pa.array(range(300), pa.int64())}), p, row_group_size=100)

    def mapped() -> bool:
        with open("/proc/self/maps") as f:
            return any(line.rstrip().endswith(str(p)) for line in f)

    for memory_map in (True, False):
        _, read = readers.parquet_shards([p], memory_map=memory_map)
        assert [x["row"] for x in read(0, 50, 250)] == list(range(50, 250))
        assert mapped() == memory_map
        read.files().close()
        assert not mapped()


# -- MDS ------------------------------------------------------------------------------------------
def test_mds_shards_match_mosaic(tmp_path: Path) -> None:
    streaming = pytest.importorskip("streaming")
    from streaming.base.format.mds.reader import MDSReader

    columns = {
        "key": "str",
        "blob": "bytes",
        "n": "int",
        "i8": "int8",
        "u16": "uint16",
        "i64": "int64",
        "f32": "float32",
        "f64": "float64",
        "meta": "json",
        "obj": "pkl",
        "si": "str_int",
        "nd": "ndarray:int32:3",
    }
    out = tmp_path / "mds"
    n = 300
    with streaming.MDSWriter(out=str(out), columns=columns, size_limit=1 << 14) as w:
        for i in range(n):
            w.write(
                {
                    "key": f"k{i}",
                    "blob": bytes([i % 256]) * (i % 50),
                    "n": i * 1000,
                    "i8": i % 100 - 50,
                    "u16": i,
                    "i64": -i,
                    "f32": i / 3,
                    "f64": i / 7,
                    "meta": {"i": i, "tags": ["a"] * (i % 3)},
                    "obj": (i, str(i)),
                    "si": i,
                    "nd": np.arange(3, dtype=np.int32) + i,
                }
            )
    index = json.loads((out / "index.json").read_text())
    assert len(index["shards"]) >= 3  # several shards
    sizes, read = readers.mds_shards(out / "index.json")
    assert sizes.tolist() == [s["samples"] for s in index["shards"]]
    seen = 0
    for s, info in enumerate(index["shards"]):
        theirs = MDSReader.from_json(str(out), None, info)
        k = int(sizes[s])
        mine = list(read(s, 0, k))
        assert list(read(s, k // 2, k)) == mine[k // 2 :]
        for j, row in enumerate(mine):
            ref = theirs.decode_sample(theirs.get_sample_data(j))
            for name in columns:
                if name == "nd":  # raw bytes for encodings it does not decode
                    assert row[name] == ref[name].tobytes()
                else:
                    assert row[name] == ref[name] and type(row[name]) is type(ref[name])
        seen += k
    assert seen == n
    _, read = readers.mds_shards(out / "index.json", columns=["key", "n"])
    assert next(read(0, 1, 2)) == {"key": "k1", "n": 1000}
    with pytest.raises(ValueError, match="no column 'nope'"):
        readers.mds_shards(out / "index.json", columns=["nope"])
    # Through the stream, every sample once.
    sizes, read = readers.mds_shards(out / "index.json", columns=["key"])
    stream = fastshard.ShardedStream(sizes, read, batch_size=4, num_replicas=1, rank=0, pad=False)
    assert Counter(x["key"] for x in stream) == Counter(f"k{i}" for i in range(n))


def test_damaged_tars_raise_or_stop_never_crash(formats: dict[str, str]) -> None:
    """Truncated and corrupted archives: the scan, the skip and the cut into samples end or
    raise ValueError (as tarfile ends or raises), never read out of bounds."""
    data = Path(formats["pax_long"]).read_bytes()
    rng = np.random.default_rng(5)
    cases = [data[:cut] for cut in range(0, len(data), 4999)]
    for _ in range(20):
        b = bytearray(data)
        for i in rng.integers(0, len(b), 8):
            b[i] = int(rng.integers(0, 256))
        cases.append(bytes(b))
    for case in cases:
        for call in (
            lambda f: _core.tar_scan(f, 3, "x"),
            lambda f: _core.tar_skip(f, 0, 5, "x"),
            lambda f: _core.tar_samples(f.getvalue(), "x", "x"),
        ):
            try:
                call(io.BytesIO(case))
            except ValueError:
                pass


@pytest.mark.extended
def test_tar_code_under_sanitizers(formats: dict[str, str], tmp_path: Path) -> None:
    """csrc/fastshard/tar.cpp built with AddressSanitizer and UBSan (tests/cpp/tar_fuzz.cpp):
    every truncation and thousands of random byte changes of the test archives end or raise
    the scanner's errors without reading outside the bytes given. Needs the source tree and a
    compiler with the sanitizers; skipped without them."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    source = root / "tests" / "cpp" / "tar_fuzz.cpp"
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None or not (root / "csrc" / "fastshard" / "tar.cpp").exists():
        pytest.skip("needs the source tree and a C++ compiler")
    exe = tmp_path / "tar_fuzz"
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1"]
    build = subprocess.run(
        [
            compiler,
            "-std=c++17",
            *flags,
            f"-I{root / 'csrc'}",
            str(source),
            str(root / "csrc" / "fastshard" / "tar.cpp"),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip("the compiler has no sanitizers")
    assert build.returncode == 0, build.stderr
    archives = [formats[k] for k in ("ustar_prefix", "gnu_long", "pax_global", "webdataset")]
    run = subprocess.run([str(exe), *archives], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr[-3000:]
