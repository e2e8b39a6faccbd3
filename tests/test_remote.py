"""Shards in object storage: tar, Parquet and MDS read from a real S3-API server (moto's server
mode, on loopback) through a proxy that adds latency and faults, counted at the server.

Everything here runs against real processes: moto and the proxy (tests/s3_server.py) are
subprocesses in their own sessions, ended by process group; the clients are the ones
fastshard ships with (botocore for s3://).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastshard
from fastshard import _storage, readers

pytest.importorskip("moto")
pytest.importorskip("botocore")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

sys.path.insert(0, os.path.dirname(__file__))
from remote_data import payload, write_mds, write_tar  # noqa: E402
from s3_server import S3Server  # noqa: E402

BUCKET = "data"
SHARDS = 8
PER_SHARD = 40  # shard s holds PER_SHARD + s samples


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same items in three formats, on local disk."""
    root = tmp_path_factory.mktemp("remote-src")
    counts = [PER_SHARD + s for s in range(SHARDS)]
    (root / "tar").mkdir()
    (root / "pq").mkdir()
    (root / "mds").mkdir()
    tars, pqs = [], []
    first = 0
    for s, n in enumerate(counts):
        p = root / "tar" / f"shard-{s:03d}.tar"
        write_tar(p, first, n)
        tars.append(str(p))
        ids = list(range(first, first + n))
        table = pa.table({"id": ids, "data": [payload(k) for k in ids]})
        q = root / "pq" / f"part-{s:03d}.parquet"
        pq.write_table(table, q, row_group_size=16)
        pqs.append(str(q))
        first += n
    write_mds(root / "mds", counts)
    readers.write_tar_index(tars, root / "tar" / "index.json", index_every=1)
    return {"root": root, "tar": tars, "parquet": pqs, "total": first, "counts": counts}


@pytest.fixture(scope="module")
def server(local: dict[str, Any]) -> Any:
    with S3Server() as srv:
        root = local["root"]
        files = {}
        for sub in ("tar", "pq", "mds"):
            for p in sorted((root / sub).iterdir()):
                files[f"{sub}/{p.name}"] = str(p)
        srv.upload(BUCKET, files)
        # The bucket's tar index as a user writes it for remote shards: every sample's offset,
        # in a sidecar file fetched a shard at a time (the local one, uploaded above, is the
        # inline format: sample_spans reads it).
        env = srv.env()
        readers.write_tar_index(
            urls(local, "tar"),
            f"s3://{BUCKET}/tar/index.json",
            storage_options={
                "endpoint_url": srv.direct,
                "key": env["AWS_ACCESS_KEY_ID"],
                "secret": env["AWS_SECRET_ACCESS_KEY"],
            },
        )
        yield srv


@pytest.fixture()
def s3(server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    server.faults(latency=0.0, fail=0.0, reset=0.0, truncate=0.0, seed=0)
    server.reset()
    yield server
    server.faults(latency=0.0, fail=0.0, reset=0.0, truncate=0.0, seed=0)


def urls(local: dict[str, Any], fmt: str) -> list[str]:
    names = [os.path.basename(p) for p in local["tar" if fmt == "tar" else "parquet"]]
    sub = "tar" if fmt == "tar" else "pq"
    return [f"s3://{BUCKET}/{sub}/{n}" for n in names]


def remote_shards(local: dict[str, Any], fmt: str, **kw: Any) -> readers.Shards:
    if fmt == "tar":
        return readers.tar_shards(index=f"s3://{BUCKET}/tar/index.json", **kw)
    if fmt == "parquet":
        return readers.parquet_shards(urls(local, fmt), **kw)
    return readers.mds_shards(f"s3://{BUCKET}/mds/index.json", **kw)


def local_shards(local: dict[str, Any], fmt: str) -> readers.Shards:
    if fmt == "tar":
        return readers.tar_shards(local["tar"])
    if fmt == "parquet":
        return readers.parquet_shards(local["parquet"])
    return readers.mds_shards(local["root"] / "mds" / "index.json")


def ident(fmt: str, item: dict[str, Any]) -> int:
    return int(item["id"])


def batches(
    shards: readers.Shards, fmt: str, world: int, rank: int, workers: int, **kw: Any
) -> list[list[int]]:
    import torch

    stream = fastshard.ShardedStream(
        shards.sizes, shards.read, batch_size=8, num_replicas=world, rank=rank, seed=3, **kw
    )
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=8,
        num_workers=workers,
        collate_fn=lambda items: [ident(fmt, x) for x in items],
        timeout=60 if workers else 0,
    )
    return list(loader)


FORMATS = ["tar", "parquet", "mds"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_item_once_and_the_local_batches(fmt: str, local: dict[str, Any], s3: Any) -> None:
    """pad=False: every item exactly once per epoch over the ranks, at W = 1, 2, 4 and 0 or 2
    workers, in global batches identical to the same shards read from local disk."""
    remote = remote_shards(local, fmt)
    here = local_shards(local, fmt)
    assert remote.sizes.tolist() == here.sizes.tolist() == local["counts"]
    for world in (1, 2, 4):
        for workers in (0, 2):
            seen: list[int] = []
            for rank in range(world):
                got = batches(remote, fmt, world, rank, workers, pad=False)
                want = batches(here, fmt, world, rank, workers, pad=False)
                assert got == want, (world, rank, workers)
                seen += [k for b in got for k in b]
            assert sorted(seen) == list(range(local["total"])), (world, workers)


def sample_spans(local: dict[str, Any]) -> dict[str, list[tuple[int, int]]]:
    """Per tar object key, the byte span of each sample, from the local index."""
    index = json.loads((local["root"] / "tar" / "index.json").read_text())
    spans = {}
    for entry, extra in zip(index["shardlist"], index["fastshard"]["shards"]):
        import base64

        offs = np.frombuffer(base64.b64decode(extra["offsets"]), "<i8").tolist()
        offs.append(extra["end"])
        spans[f"/{BUCKET}/tar/{entry['url']}"] = list(zip(offs[:-1], offs[1:]))
    return spans


@pytest.mark.parametrize("workers", [0, 2])
def test_tar_fetches_only_the_ranks_bytes(local: dict[str, Any], s3: Any, workers: int) -> None:
    """Counted at the server: rank 0 of 2 fetches no more than 1.02x the bytes of the samples
    it reads, with no HEAD and about one GET per (lane, shard) piece, and no byte twice."""
    shards = remote_shards(local, "tar")
    s3.reset()
    got = batches(shards, "tar", 2, 0, workers, pad=False)
    stats = s3.stats()
    spans = sample_spans(local)
    # The sample of each id: shards hold consecutive ids.
    key_of = {}
    k = 0
    for key in sorted(spans):
        for span in spans[key]:
            key_of[k] = (key, span)
            k += 1
    needed = sum(key_of[k][1][1] - key_of[k][1][0] for b in got for k in b)
    assert "HEAD" not in stats["requests"]
    shard_gets = [g for g in stats["gets"] if g[0].endswith(".tar")]
    fetched = sum(g[3] for g in shard_gets)
    assert needed <= fetched <= 1.02 * needed, (fetched, needed)
    # The metadata beside: the index once per process, and each process's shards' offsets
    # from the sidecar (8 bytes a sample and one a shard), at most once per process.
    meta = stats["bytes"] - fetched
    index = len(readers._storage.read_all(f"s3://{BUCKET}/tar/index.json"))
    offsets = 8 * (local["total"] + SHARDS)
    assert meta <= index + max(workers, 1) * offsets, (meta, index, offsets)
    # No byte of a shard fetched twice: the GET ranges of each shard are disjoint.
    by_key: dict[str, list[tuple[int, int]]] = {}
    for key, start, stop, _ in shard_gets:
        by_key.setdefault(key, []).append((start, stop))
    for ranges in by_key.values():
        ranges.sort()
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:])), ranges
    # Requests: one per piece a lane reads from a shard (plus the index, read once here).
    stream = fastshard.ShardedStream(
        shards.sizes, shards.read, batch_size=8, num_replicas=2, rank=0, seed=3, pad=False
    )
    plan = stream._plan(0)
    pieces = sum(
        len(plan.segments(*(lambda s, n: (s, s + n))(*plan.lane(lane))))
        for lane in range(plan.lanes)
    )
    assert stats["requests"]["GET"] <= pieces, (stats["requests"], pieces)


def test_parquet_and_mds_fetch_what_they_read(local: dict[str, Any], s3: Any) -> None:
    """MDS: the samples' bytes and one offsets table per shard; Parquet: each row group that a
    rank decodes, once (columns only), plus the footers."""
    shards = remote_shards(local, "mds")
    s3.reset()
    got = [k for b in batches(shards, "mds", 2, 0, 0, pad=False) for k in b]
    stats = s3.stats()
    sample_bytes = sum(4 + 8 + len(payload(k)) for k in got)
    tables = sum(4 * (n + 2) for n in local["counts"])
    assert stats["bytes"] <= 1.02 * sample_bytes + tables, (stats["bytes"], sample_bytes)
    shards = remote_shards(local, "parquet", columns=["id"])
    s3.reset()
    batches(shards, "parquet", 2, 0, 0, pad=False)
    stats = s3.stats()
    ranges = {(key, start) for key, start, _, _ in stats["gets"]}
    assert len(ranges) == len(stats["gets"]), "a row group fetched twice"
    # Only the id column: far less than the files.
    total = sum(os.path.getsize(p) for p in local["parquet"])
    assert stats["bytes"] < total / 4, (stats["bytes"], total)


@pytest.mark.parametrize("bound", [1 << 20, 16 << 10])
def test_bytes_fetched_and_unread_stay_bounded(local: dict[str, Any], s3: Any, bound: int) -> None:
    """max_inflight_bytes bounds what a process holds fetched and not yet read (counted until
    read, its streams' current blocks included), beyond one block that a read waits for; the
    epoch is exact at any bound, one below a single block too (16 kB: each read then waits
    for its own block)."""
    shards = remote_shards(local, "tar", max_inflight_bytes=bound)
    fetcher = _storage.fetcher(shards.read.storage)
    fetcher.peak = 0
    got = [k for b in batches(shards, "tar", 1, 0, 0, pad=False) for k in b]
    assert sorted(got) == list(range(local["total"]))
    block = 2 * fetcher.block_size()  # a stream's last block may be up to twice the size
    assert 0 < fetcher.peak <= bound + block, (fetcher.peak, bound, block)
    assert fetcher.inflight == 0  # everything fetched was read or released


def test_parquet_fetches_ahead_in_a_fresh_process(local: dict[str, Any], s3: Any) -> None:
    """A DataLoader worker's copy of the read (pickled: no footer of its own) still fetches
    ahead: the row groups' byte spans come with it from the count."""
    import pickle

    shards = remote_shards(local, "parquet")
    read = pickle.loads(pickle.dumps(shards.read))
    assert read._footers is None
    read.prefetch(lambda: [(0, 0, 20, 0), (1, 0, 16, 0)])  # row groups 0, 1 of 0; 0 of 1
    assert len(read._expected) == 3
    read.cancel_prefetch()


def test_faults_leave_the_epoch_exact(local: dict[str, Any], s3: Any) -> None:
    """5% of requests answered 503, 3% reset mid-body, 3% cut short: every item once."""
    s3.faults(fail=0.05, reset=0.03, truncate=0.03, seed=7)
    for fmt in FORMATS:
        shards = remote_shards(local, fmt, retries=8)
        seen = [
            k for rank in range(2) for b in batches(shards, fmt, 2, rank, 2, pad=False) for k in b
        ]
        assert sorted(seen) == list(range(local["total"])), fmt
    faults = s3.stats()["faults"]
    assert faults["fail"] > 0 and faults["reset"] > 0 and faults["truncate"] > 0, faults


def test_a_stopped_server_is_a_clear_error(local: dict[str, Any], tmp_path: Path) -> None:
    """A server gone mid-epoch: an error naming the URL within the retry bound, no hang."""
    with S3Server() as srv:
        env = srv.env()
        srv.upload(BUCKET, {"tar/a.tar": local["tar"][0]})
        code = f"""
import os, time
os.environ.update({env!r})
import fastshard
from fastshard import readers
sizes, read = readers.tar_shards(["s3://{BUCKET}/tar/a.tar"], retries=2)
stream = fastshard.ShardedStream(sizes, read, batch_size=4, seed=0, num_replicas=1, rank=0)
it = iter(stream)
next(it)
print("STOP", flush=True)
input()
t = time.monotonic()
try:
    for _ in it:
        pass
    print("NO ERROR")
except OSError as err:
    print("ERROR", type(err).__name__, time.monotonic() - t, err)
"""
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            cwd=tmp_path,  # not the checkout, whose source folder would shadow the package
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "STOP"
            srv.stop_upstream()
            srv.proxy.kill()  # nothing listens any more
            srv.proxy.wait(10)
            out, _ = proc.communicate("\n", timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    assert "ERROR RemoteReadError" in out, out
    assert f"s3://{BUCKET}/tar/a.tar" in out and "3 attempts failed" in out, out
    elapsed = float(out.split("ERROR RemoteReadError ")[1].split()[0])
    assert elapsed < 30, out


def test_cache_stays_under_its_bound_and_serves_the_next_epoch(
    local: dict[str, Any], s3: Any, tmp_path: Path
) -> None:
    """cache_limit below the dataset: the folder never holds more (sampled while reading,
    with 2 workers sharing it) and both epochs are exact; a cache that holds the dataset
    serves the whole second epoch (nothing fetched)."""
    limit = 400_000  # each shard (one cache block: shards are under 1 MiB) is ~120 kB
    total = sum(os.path.getsize(p) for p in local["tar"])
    assert total > limit
    folder = tmp_path / "cache"
    shards = remote_shards(local, "tar", cache_dir=folder, cache_limit=limit)
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if not (folder / ".lock").exists():
                time.sleep(0.002)
                continue
            # Under the cache's own lock, which every writer holds while it makes room and
            # writes: a consistent view of the folder, not a listing that races the writes.
            with open(folder / ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                size = sum(f.stat().st_size for f in folder.glob("*.blk"))
                fcntl.flock(lock, fcntl.LOCK_UN)
            peak[0] = max(peak[0], size)
            time.sleep(0.002)

    t = threading.Thread(target=watch)
    t.start()
    try:
        first = sorted(k for b in batches(shards, "tar", 1, 0, 2) for k in b)
        second = sorted(k for b in batches(shards, "tar", 1, 0, 2) for k in b)
    finally:
        done.set()
        t.join()
    assert first == second == list(range(local["total"]))
    assert 0 < peak[0] <= limit, (peak[0], limit)
    # A cache larger than the data: the second epoch fetches nothing.
    folder2 = tmp_path / "cache2"
    shards = remote_shards(local, "tar", cache_dir=folder2, cache_limit=1 << 30)
    batches(shards, "tar", 1, 0, 0)
    s3.reset()
    assert sorted(k for b in batches(shards, "tar", 1, 0, 0) for k in b) == first
    assert s3.stats()["bytes"] == 0


def test_resume_on_another_world_fetches_nothing_before_its_point(
    local: dict[str, Any], s3: Any
) -> None:
    """A state after 3 steps of W = 2 resumes on W = 4: the rest of the epoch exactly once, and
    the server sends no byte of a sample outside the lane windows the resumed ranks read."""
    shards = remote_shards(local, "tar")

    def stream(world: int, rank: int) -> fastshard.ShardedStream:
        return fastshard.ShardedStream(
            shards.sizes, shards.read, batch_size=8, num_replicas=world, rank=rank, seed=3,
            pad=False, lanes=64,
        )  # fmt: skip

    before = []
    states = []
    for rank in range(2):
        s = stream(2, rank)
        it = iter(s)
        before += [int(next(it)["id"]) for _ in range(3 * 8)]
        states.append(s.state_dict())
    s3.reset()
    after: list[int] = []
    windows: set[tuple[int, int]] = set()
    for rank in range(4):
        s = stream(4, rank)
        s.load_state_dict(states[rank % 2])
        plan = s._plan(s.epoch)
        count = s._lengths(s._cursor)[0]
        for lane, window, _ in plan.places(s._cursor + rank, 4, 0, count).tolist():
            windows.add((lane, window))
        after += [int(x["id"]) for x in s]
    assert sorted(before + after) == list(range(local["total"]))
    # The ids in the windows the resumed ranks read (shards hold consecutive ids).
    starts = np.concatenate([[0], np.cumsum(local["counts"])])
    allowed = set()
    for lane, window in windows:
        lo, n = plan.lane(lane)
        first = lo + window * s.window
        for shard, a, z in plan.segments(first, min(first + s.window, lo + n)).tolist():
            allowed.update(range(int(starts[shard]) + a, int(starts[shard]) + z))
    spans = sample_spans(local)
    fetched = set()
    keys = sorted(spans)
    for key, start, stop, _ in s3.stats()["gets"]:
        if key not in spans:
            continue  # the index
        base = int(starts[keys.index(key)])
        for i, (a, z) in enumerate(spans[key]):
            if a < stop and start < z:
                fetched.add(base + i)
    assert fetched <= allowed, sorted(fetched - allowed)[:10]
    assert set(after) <= fetched


@pytest.mark.extended  # two gloo ranks with DataLoader workers: about 20 s
def test_share_counts_reads_the_metadata_once(local: dict[str, Any], s3: Any) -> None:
    """Two ranks with share_counts=True: rank 0 alone GETs the tar index and index.json and
    reads the Parquet footers (no HEAD); both ranks read their shares exactly."""
    from .conftest import launch_ranks

    os.environ["SHARDS"] = str(SHARDS)
    try:
        (r0, r1) = launch_ranks(Path(__file__).with_name("remote_worker.py"), 2, 240)
    finally:
        del os.environ["SHARDS"]
    for rank in (r0, r1):
        assert "error" not in rank["shared"], rank["shared"].get("error")
    for fmt in ("tar", "parquet", "mds"):
        both = r0["shared"][fmt] + r1["shared"][fmt]
        assert sorted(both) == list(range(local["total"])), fmt
    stats = s3.stats()
    index_gets = [g for g in stats["gets"] if g[0].endswith("index.json")]
    assert len(index_gets) == 2, index_gets  # one tar index, one index.json
    assert "HEAD" not in stats["requests"], stats["requests"]  # footers: a suffix GET each


def test_index_command_lists_a_prefix_and_writes_to_the_bucket(
    local: dict[str, Any], s3: Any, tmp_path: Path
) -> None:
    """`python -m fastshard index s3://bucket/prefix/ -o s3://.../index.json`: the .tar
    objects under the prefix, sorted, indexed at every sample; the index reads back."""
    out = subprocess.run(
        [sys.executable, "-m", "fastshard", "index", f"s3://{BUCKET}/tar/", "-o",
         f"s3://{BUCKET}/cli/index.json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    sizes, read = readers.tar_shards(index=f"s3://{BUCKET}/cli/index.json")
    assert sizes.tolist() == local["counts"]
    assert read.paths == urls(local, "tar") and read.index_every == 1
    stream = fastshard.ShardedStream(sizes, read, batch_size=8, num_replicas=1, rank=0)
    assert sorted(int(x["id"]) for x in stream) == list(range(local["total"]))


def test_https_urls_read_with_ranges(local: dict[str, Any], s3: Any) -> None:
    """http(s):// URLs (here the server's own object URLs, which it serves unsigned): the
    index's relative urls resolve against the index's URL, reads are Range requests."""
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": "*",
                "Action": "s3:GetObject",
                "Resource": f"arn:aws:s3:::{BUCKET}/*",
            }
        ],
    }
    s3.client().put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(policy))
    index = f"{s3.endpoint}/{BUCKET}/tar/index.json"
    sizes, read = readers.tar_shards(index=index)
    assert read.paths[0] == f"{s3.endpoint}/{BUCKET}/tar/shard-000.tar"
    s3.reset()
    got = [k for b in batches(readers.Shards(sizes, read), "tar", 2, 1, 2, pad=False) for k in b]
    want = [k for b in batches(local_shards(local, "tar"), "tar", 2, 1, 2, pad=False) for k in b]
    assert got == want
    assert "HEAD" not in s3.stats()["requests"]


def test_any_fsspec_protocol(local: dict[str, Any]) -> None:
    """Another fsspec protocol (fsspec's own memory filesystem, which a forked DataLoader
    worker inherits): counted by a scan, read exactly, with workers."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    names = []
    for p in local["tar"]:
        name = f"memory://fastshard-test/{os.path.basename(p)}"
        fs.pipe_file(name, Path(p).read_bytes())
        names.append(name)
    shards = readers.tar_shards(names)
    assert shards.sizes.tolist() == local["counts"]
    got = [k for b in batches(shards, "tar", 1, 0, 2, pad=False) for k in b]
    assert sorted(got) == list(range(local["total"]))


def test_mds_hashes_verified_when_asked(local: dict[str, Any], s3: Any) -> None:
    """verify_hashes=True: each shard checked against index.json's sha1 once per process; a
    shard changed in the bucket is an error naming it, without it the bytes are read as is."""
    shards = remote_shards(local, "mds", verify_hashes=True)
    got = [k for b in batches(shards, "mds", 1, 0, 0, pad=False) for k in b]
    assert sorted(got) == list(range(local["total"]))
    raw = (local["root"] / "mds" / "shard.00003.mds").read_bytes()
    bad = raw[:-1] + bytes([raw[-1] ^ 1])  # the last sample's last byte flipped
    c = s3.client()
    c.put_object(Bucket=BUCKET, Key="mds/shard.00003.mds", Body=bad)
    try:
        with pytest.raises(ValueError, match=r"shard\.00003\.mds: its sha1 digest"):
            batches(remote_shards(local, "mds", verify_hashes=True), "mds", 1, 0, 0)
        unchecked = remote_shards(local, "mds")
        assert len([k for b in batches(unchecked, "mds", 1, 0, 0) for k in b]) == local["total"]
    finally:
        c.put_object(Bucket=BUCKET, Key="mds/shard.00003.mds", Body=raw)


@pytest.mark.parametrize("runs", [3, pytest.param(50, marks=pytest.mark.extended)], ids=["3", "50"])
def test_clean_exits(local: dict[str, Any], s3: Any, tmp_path: Path, runs: int) -> None:
    """Short reads in fresh processes (two at a time), each with reads still fetched ahead
    when it ends: every one exits 0 with nothing on stderr (no client thread or runtime left
    to abort or hold up the interpreter at exit)."""
    env = {**os.environ, **s3.env()}
    code = f"""
import fastshard
from fastshard import readers
sizes, read = readers.tar_shards(index="s3://{BUCKET}/tar/index.json")
stream = fastshard.ShardedStream(sizes, read, batch_size=4, seed=0, num_replicas=1, rank=0)
it = iter(stream)
print(sum(int(next(it)["id"]) >= 0 for _ in range(5)))
"""
    bad = []
    pending: list[subprocess.Popen[str]] = []
    for i in range(runs):
        pending.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
                cwd=tmp_path,
            )
        )
        if len(pending) == 2 or i == runs - 1:
            for p in pending:
                try:
                    out, err = p.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
                    out, err = p.communicate()
                if p.returncode != 0 or err.strip() or out.strip() != "5":
                    bad.append((p.returncode, out, err[-500:]))
            pending = []
    assert not bad, bad


def test_urls_mixed_with_paths_and_bad_options(local: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="mix URLs"):
        readers.tar_shards([local["tar"][0], f"s3://{BUCKET}/tar/x.tar"], sizes=[1, 1])
    with pytest.raises(ValueError, match="cache_dir needs cache_limit"):
        readers.tar_shards(local["tar"], cache_dir="/tmp/x")
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        readers.tar_shards(local["tar"], max_inflight_bytes=0)


def test_missing_object_names_the_url(local: dict[str, Any], s3: Any) -> None:
    with pytest.raises(_storage.RemoteReadError, match=f"s3://{BUCKET}/tar/nope.tar.*404"):
        readers.tar_shards([f"s3://{BUCKET}/tar/nope.tar"])


def test_remote_index_keeps_offsets_beside_it(local: dict[str, Any], s3: Any) -> None:
    """The index of remote shards names a sidecar of offsets, and a process fetches the
    offsets of the shards it reads only (one ranged GET per shard here, none for the rest)."""
    doc = json.loads(readers._storage.read_all(f"s3://{BUCKET}/tar/index.json"))
    assert doc["fastshard"]["format"] == "fastshard-tar-offsets-v2"
    assert doc["fastshard"]["offsets"] == "index.json.offsets"
    assert doc["fastshard"]["index_every"] == 1
    s3.reset()
    _, read = readers.tar_shards(index=f"s3://{BUCKET}/tar/index.json")
    items = [x["id"] for x in read(2, 3, 9)]
    assert [int(i) for i in items] == list(
        range(sum(local["counts"][:2]) + 3, sum(local["counts"][:2]) + 9)
    )
    sidecar = [g for g in s3.stats()["gets"] if g[0].endswith(".offsets")]
    assert len(sidecar) == 1 and sidecar[0][3] == 8 * (local["counts"][2] + 1), sidecar
    # A sidecar cut short is an error naming it, not a wrong read.
    c = s3.client()
    raw = c.get_object(Bucket=BUCKET, Key="tar/index.json.offsets")["Body"].read()
    c.put_object(Bucket=BUCKET, Key="tar/index.json.offsets", Body=raw[:-8])
    try:
        _, read = readers.tar_shards(index=f"s3://{BUCKET}/tar/index.json")
        # (the store refuses the range past its end: 416, not retried)
        with pytest.raises(OSError, match=r"index\.json\.offsets: bytes .*HTTP 416"):
            list(read(SHARDS - 1, 0, 2))
    finally:
        c.put_object(Bucket=BUCKET, Key="tar/index.json.offsets", Body=raw)


def test_remote_index_written_locally(local: dict[str, Any], s3: Any, tmp_path: Path) -> None:
    """An index of remote shards written to a local file keeps its sidecar there too."""
    readers.write_tar_index(urls(local, "tar"), tmp_path / "index.json")
    assert (tmp_path / "index.json.offsets").stat().st_size == 8 * (local["total"] + SHARDS)
    sizes, read = readers.tar_shards(index=tmp_path / "index.json")
    assert sizes.tolist() == local["counts"]
    assert [int(x["id"]) for x in read(0, 5, 8)] == [5, 6, 7]


def test_reader_defaults_are_the_storage_defaults() -> None:
    assert readers.MAX_INFLIGHT_BYTES == _storage.MAX_INFLIGHT_BYTES
    assert readers.MAX_REQUESTS == _storage.MAX_REQUESTS
    assert readers.RETRIES == _storage.RETRIES


def test_storage_join_and_split() -> None:
    assert _storage.join("s3://b/a/", "x.tar") == "s3://b/a/x.tar"
    assert _storage.join("s3://b/a/", "../y/x.tar") == "s3://b/y/x.tar"
    assert _storage.join("/data/a", "x.tar") == "/data/a/x.tar"
    assert _storage.dirname("https://h/p/q/index.json") == "https://h/p/q/"
    assert not _storage.is_url("file:///tmp/x") and _storage.is_url("gs://b/x")
