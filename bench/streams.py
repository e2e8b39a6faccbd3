"""Sharded streams (issue 26): fastshard.ShardedStream + fastshard.readers beside webdataset.

    python bench/streams.py throughput [--repeat 3]     # (a) tar and Parquet, DataLoader k=2
    python bench/streams.py amplification               # (b) rows and bytes read / yielded
    python bench/streams.py planning [--shards 1e5 1e6] # (c) first item, peak memory
    python bench/streams.py quality                     # (d) local shuffle vs global, wds

Shards are written under --dir (default: a temporary directory): uneven sizes, each sample a
KEY.jpg of random bytes (--payload bytes, default 4096) and a KEY.cls. Every throughput run
iterates a whole epoch through DataLoader(batch_size=64, num_workers=2) with a collate that
returns the list (no tensor work), so it measures reading, grouping and shuffling only.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import statistics
import tarfile
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from _child import child_json

BATCH = 64
WORKERS = 2


# -- data ---------------------------------------------------------------------------------------
def shard_sizes(shards: int, seed: int = 0) -> list[int]:
    """Uneven sizes: log-uniform between 50 and 2000, one empty shard, one 5x the largest."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(50), np.log(2000), shards)).astype(int).tolist()
    sizes[1] = 0
    sizes[-1] = 10_000
    return sizes


def write_tars(d: str, sizes: list[int], payload: int) -> list[str]:
    rng = np.random.default_rng(1)
    paths = []
    for s, n in enumerate(sizes):
        path = os.path.join(d, f"shard-{s:05d}.tar")
        paths.append(path)
        if os.path.exists(path):
            continue
        with tarfile.open(path + ".tmp", "w", format=tarfile.USTAR_FORMAT) as tar:
            for r in range(n):
                key = f"s{s:05d}_{r:06d}"
                for ext, data in (
                    ("jpg", rng.bytes(payload)),
                    ("cls", str((s * 7 + r) % 1000).encode()),
                ):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        os.replace(path + ".tmp", path)
    return paths


def write_parquets(d: str, sizes: list[int], payload: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(2)
    paths = []
    for s, n in enumerate(sizes):
        path = os.path.join(d, f"shard-{s:05d}.parquet")
        paths.append(path)
        if os.path.exists(path):
            continue
        table = pa.table(
            {
                "key": [f"s{s:05d}_{r:06d}" for r in range(n)],
                "cls": pa.array([(s * 7 + r) % 1000 for r in range(n)], pa.int64()),
                "jpg": [rng.bytes(payload) for _ in range(n)],
            }
        )
        pq.write_table(table, path + ".tmp", row_group_size=1024, compression="none")
        os.replace(path + ".tmp", path)
    return paths


def as_list(batch: list[Any]) -> list[Any]:
    return batch


# -- (a) throughput -----------------------------------------------------------------------------
def fastshard_loader(shards: Any, **kw: Any) -> Any:
    from torch.utils.data import DataLoader

    import fastshard

    stream = fastshard.ShardedStream(
        shards.sizes, shards.read, batch_size=BATCH, num_replicas=1, rank=0, seed=0, **kw
    )
    return DataLoader(stream, batch_size=BATCH, num_workers=WORKERS, collate_fn=as_list)


def wds_loader(paths: list[str], buffer: int) -> Any:
    import webdataset as wds
    from torch.utils.data import DataLoader

    ds = wds.WebDataset(
        paths,
        shardshuffle=len(paths),  # a buffer as large as the shard list: a full shard shuffle
        nodesplitter=wds.split_by_node,
        workersplitter=wds.split_by_worker,
        empty_check=False,
        seed=0,
    ).shuffle(buffer, initial=buffer)
    return DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=as_list)


class ParquetDirect:
    """The floor for Parquet: each worker reads whole files (files w, w + k, ...) with
    pyarrow's iter_batches and yields to_pylist rows, no shuffling."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import pyarrow.parquet as pq
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        for path in self.paths[w::k]:
            with pq.ParquetFile(path) as f:
                for batch in f.iter_batches(batch_size=1024, use_threads=False):
                    yield from batch.to_pylist()


def parquet_direct_loader(paths: list[str]) -> Any:
    from torch.utils.data import DataLoader, IterableDataset

    class _DS(IterableDataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.inner = ParquetDirect(paths)

        def __iter__(self) -> Iterator[dict[str, Any]]:
            return iter(self.inner)

    return DataLoader(_DS(), batch_size=BATCH, num_workers=WORKERS, collate_fn=as_list)


def cpu_seconds() -> float:
    """CPU time of this process and of its waited-for children (the DataLoader workers,
    joined when an epoch ends)."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def time_epoch(loader: Any) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of main process and workers, items) for one epoch."""
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    it = iter(loader)
    n = sum(len(b) for b in it)
    del it  # joins the workers, so their CPU time is counted
    return time.perf_counter() - t0, cpu_seconds() - c0, n


def cmd_throughput(args: argparse.Namespace) -> None:
    from fastshard import readers

    sizes = shard_sizes(args.shards)
    paths = write_tars(args.dir, sizes, args.payload)
    n = sum(sizes)
    # fastshard's default holds lanes / workers * window = 8 * 64 / 2 * 16 = 4096 items per
    # worker; the webdataset buffer is the same size.
    buffer = 8 * BATCH // WORKERS * 16
    print(f"tar: {len(paths)} shards, {n} samples, {args.payload} B payload, buffer {buffer}")
    kinds = {
        "fastshard": lambda: fastshard_loader(readers.tar_shards(paths)),
        "fastshard_lanes128": lambda: fastshard_loader(readers.tar_shards(paths), lanes=128),
        "webdataset": lambda: wds_loader(paths, buffer),
    }
    measure("tar", kinds, n, args.repeat, "webdataset")
    if args.no_parquet:
        return
    ppaths = write_parquets(args.dir, sizes, args.payload)
    pkinds = {
        "fastshard": lambda: fastshard_loader(readers.parquet_shards(ppaths)),
        "fastshard_lanes128": lambda: fastshard_loader(readers.parquet_shards(ppaths), lanes=128),
        "pyarrow_direct": lambda: parquet_direct_loader(ppaths),
    }
    measure("parquet", pkinds, n, args.repeat, "pyarrow_direct")


def measure(what: str, kinds: dict[str, Any], n: int, repeat: int, base: str) -> None:
    """Interleaved repeats; items/s by wall time and by CPU time (main + workers), and each
    kind's ratio to `base` within the same repeat."""
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(repeat):
        for kind, make in kinds.items():
            dt, dc, got = time_epoch(make())
            assert got == n, (kind, got, n)
            wall[kind].append(n / dt)
            cpu[kind].append(n / dc)
            print(
                f"  rep {rep} {what} {kind}: {n / dt:,.0f} items/s wall ({dt:.2f} s), "
                f"{n / dc:,.0f} items per CPU-s ({dc:.2f} CPU-s)",
                flush=True,
            )
    print(f"{what}: median (min - max) over {repeat} interleaved repeats")
    for kind in kinds:
        line = f"  {kind}: wall {fmt(wall[kind])} items/s; CPU {fmt(cpu[kind])} items/CPU-s"
        if kind != base:
            rw = [a / b for a, b in zip(wall[kind], wall[base])]
            rc = [a / b for a, b in zip(cpu[kind], cpu[base])]
            line += f"; vs {base}: wall {fmt(rw, 2)}x, CPU {fmt(rc, 2)}x"
        print(line)


def fmt(xs: list[float], digits: int = 0) -> str:
    return f"{statistics.median(xs):,.{digits}f} ({min(xs):,.{digits}f} - {max(xs):,.{digits}f})"


# -- (b) amplification --------------------------------------------------------------------------
class Counters:
    """Shared counters (inherited by forked DataLoader workers)."""

    def __init__(self) -> None:
        self.rows = mp.Value("q", 0)
        self.disk = mp.Value("q", 0)


class CountingFile(io.FileIO):
    counters: Counters | None = None

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        data = super().read(size)
        if self.counters is not None:
            with self.counters.disk.get_lock():
                self.counters.disk.value += len(data)
        return data


def counting_open(path: str) -> CountingFile:
    return CountingFile(path, "rb")


class CountingRead:
    def __init__(self, read: Any, counters: Counters) -> None:
        self.read = read
        self.counters = counters

    def __call__(self, shard: int, start: int, stop: int) -> Iterator[Any]:
        for item in self.read(shard, start, stop):
            with self.counters.rows.get_lock():
                self.counters.rows.value += 1
            yield item


def sample_bytes(x: dict[str, Any]) -> int:
    return sum(len(v) for k, v in x.items() if not k.startswith("__"))


def cmd_amplification(args: argparse.Namespace) -> None:
    from torch.utils.data import DataLoader

    import fastshard
    from fastshard import readers

    sizes = shard_sizes(args.shards)
    paths = write_tars(args.dir, sizes, args.payload)
    n = sum(sizes)
    world = 2
    print(f"{len(paths)} shards, {n} samples; W={world} ranks x k={WORKERS} workers, b={BATCH}")
    rows_out = []
    for name, kw in [
        ("fastshard default (lanes=8*b*W=1024)", {}),
        ("fastshard shared lanes (lanes=100)", {"lanes": 100}),
        ("fastshard shared lanes (lanes=100, chunk_size=64)", {"lanes": 100, "chunk_size": 64}),
    ]:
        counters = Counters()
        CountingFile.counters = counters
        shards = readers.tar_shards(paths, opener=counting_open)
        counters.disk.value = 0  # the scan is counted apart
        yielded = ybytes = 0
        counts = []
        for rank in range(world):
            stream = fastshard.ShardedStream(
                shards.sizes,
                CountingRead(shards.read, counters),
                batch_size=BATCH,
                num_replicas=world,
                rank=rank,
                pad=False,
                **kw,
            )
            loader = DataLoader(stream, batch_size=BATCH, num_workers=WORKERS, collate_fn=as_list)
            c = 0
            for batch in loader:
                c += len(batch)
                ybytes += sum(sample_bytes(x) for x in batch)
            counts.append(c)
            yielded += c
        rows_out.append((name, counts, counters.rows.value / yielded, counters.disk.value / ybytes))
    # webdataset: each reader streams its whole shards; rows read = rows yielded, and the
    # bytes read are the sizes of the files its samples came from.
    import webdataset as wds

    counts = []
    yielded = ybytes = 0
    files: set[str] = set()
    for rank in range(world):
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
        ds = wds.WebDataset(
            paths,
            shardshuffle=False,
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
            empty_check=False,
        )
        c = 0
        for batch in DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=as_list):
            c += len(batch)
            ybytes += sum(sample_bytes(x) for x in batch)
            files.update(x["__url__"] for x in batch)
        counts.append(c)
        yielded += c
    for var in ("RANK", "WORLD_SIZE"):
        os.environ.pop(var)
    disk = sum(os.path.getsize(p) for p in files)
    rows_out.append(("webdataset split_by_node/worker", counts, 1.0, disk / ybytes))
    print("| reader | items per rank | rows read / yielded | bytes read / yielded |")
    print("|---|---|---|---|")
    for name, counts, rows, byt in rows_out:
        print(f"| {name} | {counts} | {rows:.3f} | {byt:.3f} |")


# -- (c) planning -------------------------------------------------------------------------------
PLAN_CHILD = r"""
import json, sys, time
import numpy as np
import fastshard
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'): return int(line.split()[1])
def nothing(shard, start, stop):
    return range(start, stop)
n = int(sys.argv[1])
sizes = np.random.default_rng(0).integers(0, 2000, n)
base = hwm()
t0 = time.perf_counter()
stream = fastshard.ShardedStream(sizes, nothing, batch_size=64, num_replicas=8, rank=3)
t1 = time.perf_counter()
first = next(iter(stream))
t2 = time.perf_counter()
print(json.dumps({"construct_ms": (t1 - t0) * 1e3, "first_ms": (t2 - t1) * 1e3,
                  "peak_mib": (hwm() - base) / 1024, "sizes_mib": sizes.nbytes / 2**20}))
"""


def cmd_planning(args: argparse.Namespace) -> None:
    print("| shards | construct ms | first next() ms | total ms | peak MiB above baseline |")
    print("|---|---|---|---|---|")
    for shards in args.plan_shards:
        runs = []
        for _ in range(args.repeat):
            runs.append(child_json(PLAN_CHILD, str(int(shards))))
        c = [r["construct_ms"] for r in runs]
        f = [r["first_ms"] for r in runs]
        t = [a + b for a, b in zip(c, f)]
        m = max(r["peak_mib"] for r in runs)
        print(
            f"| {int(shards):,} | {min(c):.1f} / {statistics.median(c):.1f} | "
            f"{min(f):.1f} / {statistics.median(f):.1f} | {min(t):.1f} / "
            f"{statistics.median(t):.1f} | {m:.1f} (sizes array: {runs[0]['sizes_mib']:.1f}) |"
        )


# -- (d) quality --------------------------------------------------------------------------------
def wds_sequence(sizes: list[int], buffer: int, workers: int, seed: int) -> np.ndarray:
    """webdataset's own shard shuffle and buffer shuffle stages over (shard, row) items,
    one pipeline per DataLoader worker (shards w, w + k, ... of the shuffled list, as
    split_by_worker does), batches interleaved round robin as a DataLoader collects them."""
    import webdataset as wds

    def expand(src: Any) -> Iterator[tuple[int, int]]:
        for sample in src:
            s = int(sample["url"])
            for r in range(sizes[s]):
                yield (s, r)

    per_worker = []
    for w in range(workers):
        pipe = wds.DataPipeline(
            wds.SimpleShardList([str(s) for s in range(len(sizes))], seed=seed),
            wds.shuffle(len(sizes), seed=seed),  # the shard shuffle (same on every worker)
            lambda src, w=w: (x for i, x in enumerate(src) if i % workers == w),
            expand,
            wds.shuffle(buffer, initial=buffer, seed=seed + 1 + w),
        )
        per_worker.append(list(pipe))
    out: list[tuple[int, int]] = []
    pos = [0] * workers
    while any(pos[w] < len(per_worker[w]) for w in range(workers)):
        for w in range(workers):
            out.extend(per_worker[w][pos[w] : pos[w] + BATCH])
            pos[w] += BATCH
    return np.asarray(out, dtype=np.int64)


def quality_stats(seq: np.ndarray, sizes: list[int], global_batch: int) -> dict[str, float]:
    n = len(seq)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    flat = offsets[seq[:, 0]] + seq[:, 1]  # the item's position in the concatenated files
    pos = np.empty(n, dtype=np.int64)
    pos[flat] = np.arange(n)
    # Neighbours in a file: items (s, r) and (s, r + 1).
    same = np.ones(n - 1, dtype=bool)
    starts = offsets[1:-1]
    same[starts[(starts > 0) & (starts < n)] - 1] = False  # pairs across a file boundary
    d = np.abs(pos[1:] - pos[:-1])[same]
    shards_of_batch = seq[: n - n % global_batch, 0].reshape(-1, global_batch)
    distinct = np.array([len(np.unique(b)) for b in shards_of_batch])
    return {
        "median_gap": float(np.median(d)),
        "p10_gap": float(np.percentile(d, 10)),
        "frac_gap_lt_batch": float(np.mean(d < global_batch)),
        "single_shard_batches": float(np.mean(distinct == 1)),
        "mean_shards_per_batch": float(distinct.mean()),
    }


def cmd_quality(args: argparse.Namespace) -> None:
    for shards in args.quality_shards:
        quality(shard_sizes(shards))


def quality(sizes: list[int]) -> None:
    import torch

    import fastshard

    n = sum(sizes)
    gb = BATCH * 2  # a global batch of W = 2 ranks
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    shard_of = np.repeat(np.arange(len(sizes)), sizes)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0)).numpy()
    glob = np.stack([shard_of[perm], perm - offsets[shard_of[perm]]], axis=1)
    kinds: dict[str, np.ndarray] = {"global shuffle (torch.randperm)": glob}

    for name, kw in [
        ("fastshard default (lanes=8*b*W=1024, window=16)", {}),
        ("fastshard lanes=128, window=16", {"lanes": 128}),
        ("fastshard default + chunk_size=64", {"chunk_size": 64}),
    ]:
        stream = fastshard.ShardedStream(
            sizes, as_list, batch_size=BATCH, num_replicas=2, rank=0, seed=0, **kw
        )
        kinds[name] = stream.sequence()
    buffer = 8 * BATCH // WORKERS * 16
    for w in (WORKERS,):
        kinds[f"webdataset shardshuffle + shuffle({buffer}), k={w}"] = wds_sequence(
            sizes, buffer, w, 0
        )
    print(f"{len(sizes)} shards, {n} items, global batch {gb}")
    print(
        "| order | median gap | 10th pct gap | gap < global batch | single-shard batches "
        "| shards per batch (mean) |"
    )
    print("|---|---|---|---|---|---|")
    for name, seq in kinds.items():
        assert len(seq) == n and len({tuple(x) for x in seq.tolist()}) == n, name
        s = quality_stats(seq, sizes, gb)
        print(
            f"| {name} | {s['median_gap']:,.0f} | {s['p10_gap']:,.0f} | "
            f"{s['frac_gap_lt_batch']:.4f} | {s['single_shard_batches']:.4f} | "
            f"{s['mean_shards_per_batch']:.1f} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["throughput", "amplification", "planning", "quality"])
    p.add_argument("--dir", default=None)
    p.add_argument("--shards", type=int, default=24)
    p.add_argument("--payload", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-parquet", action="store_true")
    p.add_argument("--plan-shards", type=float, nargs="+", default=[1e5, 1e6])
    p.add_argument("--quality-shards", type=int, nargs="+", default=[24, 400])
    args = p.parse_args()
    if args.dir is None:
        args.dir = os.path.join(tempfile.gettempdir(), "fastshard-bench-streams")
    os.makedirs(args.dir, exist_ok=True)
    {
        "throughput": cmd_throughput,
        "amplification": cmd_amplification,
        "planning": cmd_planning,
        "quality": cmd_quality,
    }[args.what](args)


if __name__ == "__main__":
    main()
