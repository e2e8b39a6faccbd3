"""Sharded streams: start-up, whole epochs and bounds of fastshard's readers beside webdataset
and a plain pyarrow read (issue 37's targets; bench/RESULTS.md, "Sharded streams: start-up and
readers").

    python bench/streams_start.py [--dir DIR] [--repeat 3] [--only tar|ranks|parquet|bounds]
                                  [--parquet-files 20]

Data (written once under --dir, default a temporary directory): 64 tar shards of 500-1,500
samples (61,518 in all), each sample a KEY.bin of 1,000 random bytes and a KEY.cls; and 20
Parquet files of 1,024 rows of 4 KiB in row groups of 256 rows (80 MiB; --parquet-files N
for N of them: 160 give a dataset larger than the 256 lanes' row groups).

Every case runs in a fresh interpreter, imports done before the clock starts:

- tar: rank 0 of W = 2 (``num_replicas=2, rank=0``; webdataset: RANK=0 WORLD_SIZE=2,
  ``split_by_node`` + ``split_by_worker``, ``shardshuffle=100``), batch 32, 0 and 2 DataLoader
  workers, a collate that returns the list: seconds to the first batch and samples/s over the
  whole epoch including the reader's construction. fastshard without an index (the C++ scan)
  and with one (``python -m fastshard index``).
- ranks: 4 processes started together on this machine's cores, each rank r of 4 with no
  workers, clock from a common start instant once all have imported: seconds to each rank's
  first sample. fastshard without a process group (each rank scans), with a gloo group made
  before the clock starts (rank 0 scans and broadcasts, as under torchrun), and with an index.
- parquet: ``parquet_shards`` + ``ShardedStream(batch_size=32)`` at default settings, one
  rank, no workers, beside ``ParquetFile.iter_batches()`` + ``to_pylist()`` over the files in
  order (pyarrow's defaults, which decode with its thread pool, and ``use_threads=False``,
  which on this 2-core machine is steadier and often faster): rows/s, and CPU seconds
  (steadier than wall time on a shared machine); also the
  reads alone (each file's rows in order, no stream) and the stream alone (a read that yields
  ints), which split fastshard's time into its parts, and the floor of the lanes' layout: the
  one-thread read holding every row until the epoch ends, the memory a stream holds when its
  lanes (256) are at least the row groups (80 of the default 20 files, all entered within the
  first 256 items; with more files this holds more than the lanes do and is no floor).
- bounds: ``batch_size=128`` (1,024 lanes), no workers: the most descriptors open and the peak
  memory growth (VmHWM) over an epoch, tar and Parquet.

Each timed case runs --repeat times, interleaved (fastshard, webdataset, fastshard, ...); the
table gives the median and the range. The load average is printed beside the table.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
from _child import child_json

SHARDS = 64
TOTAL = 61_518
BATCH = 32


def tar_sizes() -> list[int]:
    rng = np.random.default_rng(37)
    sizes = rng.integers(500, 1501, SHARDS)
    sizes[-1] += TOTAL - int(sizes.sum())  # the total
    assert 500 <= sizes[-1] <= 1500, sizes[-1]
    return sizes.tolist()


def write_data(d: str, parquet_files: int = 20) -> tuple[list[str], str, list[str]]:
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(1)
    tars = []
    for s, n in enumerate(tar_sizes()):
        path = os.path.join(d, f"shard-{s:03d}.tar")
        tars.append(path)
        if os.path.exists(path):
            continue
        with tarfile.open(path + ".tmp", "w", format=tarfile.USTAR_FORMAT) as tar:
            for r in range(n):
                for ext, data in (("bin", rng.bytes(1000)), ("cls", str(r % 10).encode())):
                    info = tarfile.TarInfo(f"s{s:03d}_{r:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        os.replace(path + ".tmp", path)
    index = os.path.join(d, "index.json")
    if not os.path.exists(index):
        subprocess.run(
            [sys.executable, "-m", "fastshard", "index", *tars, "-o", index],
            check=True,
            cwd=tempfile.gettempdir(),
            capture_output=True,
        )
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquets = []
    for s in range(parquet_files):
        path = os.path.join(d, f"part-{s:02d}.parquet")
        parquets.append(path)
        if os.path.exists(path):
            continue
        rows = 1024
        table = pa.table(
            {
                "id": pa.array(range(s * rows, (s + 1) * rows), pa.int64()),
                "label": pa.array([r % 10 for r in range(rows)], pa.int64()),
                "blob": pa.array([rng.bytes(4096) for _ in range(rows)], pa.binary()),
            }
        )
        pq.write_table(table, path + ".tmp", row_group_size=256)
        os.replace(path + ".tmp", path)
    return tars, index, parquets


# -- children -----------------------------------------------------------------------------------
EPOCH = r"""
import json, os, sys, time
kind, workers, arg = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
os.environ.update(RANK="0", WORLD_SIZE="2")
import torch
from torch.utils.data import DataLoader
# Each side imports its own library only: a DataLoader whose process had imported webdataset
# took ~0.1 s longer to bring fastshard's first batch from its workers in 3 runs of 5 (the
# batch was ready in the worker at 0.035 s), which no fastshard user pays.
if kind == "webdataset":
    import webdataset as wds
else:
    import fastshard
    from fastshard import readers

def collate(batch):
    return batch

t0 = time.perf_counter()
if kind == "webdataset":
    ds = wds.WebDataset(arg, shardshuffle=100, nodesplitter=wds.split_by_node,
                        workersplitter=wds.split_by_worker, empty_check=False)
else:
    shards = readers.tar_shards(index=arg) if kind == "fastshard-index" else readers.tar_shards(arg)
    ds = fastshard.ShardedStream(shards.sizes, shards.read, batch_size=32, num_replicas=2,
                                 rank=0)
loader = DataLoader(ds, batch_size=32, num_workers=workers, collate_fn=collate)
n = 0
first = None
for batch in loader:
    if first is None:
        first = time.perf_counter() - t0
    n += len(batch)
total = time.perf_counter() - t0
print(json.dumps({"first": first, "total": total, "items": n}))
"""

RANK = r"""
import json, os, sys, time
kind, rank, arg = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
os.environ.update(RANK=str(rank), WORLD_SIZE="4")
import torch
if kind == "webdataset":
    import webdataset as wds
else:
    import fastshard
    from fastshard import readers
if kind == "fastshard-group":  # under torchrun: a process group, rank 0 counts for all
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['PORT']}",
                            rank=rank, world_size=4)
print("ready", flush=True)
start = float(sys.stdin.readline())  # the same instant for every rank, once all are ready
time.sleep(max(0.0, start - time.time()))
t0 = time.time()
if kind == "webdataset":
    ds = wds.WebDataset(arg, shardshuffle=100, nodesplitter=wds.split_by_node,
                        workersplitter=wds.split_by_worker, empty_check=False)
else:
    if kind == "fastshard-index":
        shards = readers.tar_shards(index=arg)
    else:  # the group case asks rank 0 to count for every rank
        shards = readers.tar_shards(arg, share_counts=kind == "fastshard-group")
    ds = fastshard.ShardedStream(shards.sizes, shards.read, batch_size=32, num_replicas=4,
                                 rank=rank, check_consistency=False)
next(iter(ds))
print(json.dumps({"first": time.time() - t0, "late": t0 - start}))
"""

PARQUET = r"""
import gc, json, sys, time
kind, paths = sys.argv[1], json.loads(sys.argv[2])
import pyarrow.parquet as pq
import fastshard
from fastshard import readers
# The imports (torch's above all) leave a full garbage collection due, ~0.06 s here, that falls
# in whichever reader first allocates enough: run it before the clock starts, on both sides.
gc.collect()
t0, c0 = time.perf_counter(), time.process_time()
n = 0
if kind == "pyarrow":
    for p in paths:
        for batch in pq.ParquetFile(p).iter_batches():
            n += len(batch.to_pylist())
elif kind == "pyarrow, one thread":  # pyarrow's defaults decode with its thread pool
    for p in paths:
        for batch in pq.ParquetFile(p).iter_batches(use_threads=False):
            n += len(batch.to_pylist())
elif kind == "pyarrow, one thread, rows held":  # the floor of a layout holding every row group
    held = []
    for p in paths:
        for batch in pq.ParquetFile(p).iter_batches(use_threads=False):
            rows = batch.to_pylist()
            n += len(rows)
            held.append(rows)
    del held
elif kind == "fastshard reads alone":  # read(shard, 0, rows) of each file in turn, no stream
    sizes, read = readers.parquet_shards(paths)
    for shard, rows in enumerate(sizes.tolist()):
        for item in read(shard, 0, rows):
            n += 1
elif kind == "stream alone":  # the same layout, a read that yields ints: the stream's own cost
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in paths]
    stream = fastshard.ShardedStream(sizes, lambda s, a, b: iter(range(a, b)), batch_size=32,
                                     num_replicas=1, rank=0)
    for item in stream:
        n += 1
else:
    sizes, read = readers.parquet_shards(paths)
    stream = fastshard.ShardedStream(sizes, read, batch_size=32, num_replicas=1, rank=0)
    for item in stream:
        n += 1
total = time.perf_counter() - t0
print(json.dumps({"total": total, "cpu": time.process_time() - c0, "items": n}))
"""

BOUNDS = r"""
import json, os, sys
kind, arg = sys.argv[1], json.loads(sys.argv[2])
import fastshard
from fastshard import readers
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])
def fds():
    return len(os.listdir("/proc/self/fd"))
shards = readers.tar_shards(arg) if kind == "tar" else readers.parquet_shards(arg)
stream = fastshard.ShardedStream(shards.sizes, shards.read, batch_size=128, num_replicas=1,
                                 rank=0)
base_fds, base_mem = fds(), status("VmHWM")
top = base_fds
for i, item in enumerate(stream):
    if i % 97 == 0:
        top = max(top, fds())
print(json.dumps({"lanes": stream.lanes, "fds": top - base_fds,
                  "growth_mib": (status("VmHWM") - base_mem) / 1024, "items": i + 1}))
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def bench_tar(tars: list[str], index: str, repeat: int) -> None:
    print("\n### Rank 0 of W = 2, batch 32: first batch and whole epoch (construction included)\n")
    print("| workers | reader | first batch, s | samples/s | ratio to webdataset | items |")
    print("|---|---|---|---|---|---|")
    for workers in (0, 2):
        runs: dict[str, list[dict[str, float]]] = {}
        for _ in range(repeat):
            for kind, arg in (
                ("fastshard", tars),
                ("fastshard-index", index),
                ("webdataset", tars),
            ):
                res = child_json(EPOCH, kind, str(workers), json.dumps(arg))
                runs.setdefault(kind, []).append(res)
        wds_rates = [r["items"] / r["total"] for r in runs["webdataset"]]
        for kind, rs in runs.items():
            rates = [r["items"] / r["total"] for r in rs]
            ratios = [a / b for a, b in zip(rates, wds_rates)]
            print(
                f"| {workers} | {kind} | {spread([r['first'] for r in rs])} | "
                f"{spread(rates)} | {spread(ratios)} | {rs[0]['items']} |"
            )


def bench_ranks(tars: list[str], index: str, repeat: int) -> None:
    print("\n### 4 ranks started together: seconds to each rank's first sample\n")
    print("| reader | slowest rank, s | all ranks, s |")
    print("|---|---|---|")
    out: dict[str, list[float]] = {}
    every: dict[str, list[float]] = {}
    for _ in range(repeat):
        for kind, arg in (
            ("fastshard", tars),
            ("fastshard-group", tars),
            ("fastshard-index", index),
            ("webdataset", tars),
        ):
            env = dict(os.environ, PORT=str(free_port()), OMP_NUM_THREADS="1")
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", RANK, kind, str(r), json.dumps(arg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=tempfile.gettempdir(),
                    env=env,
                )
                for r in range(4)
            ]
            for p in procs:  # every interpreter has imported torch, fastshard, webdataset
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            start = time.time() + 0.5
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(f"{start}\n")
                p.stdin.close()
            firsts = []
            for p in procs:
                o = p.stdout.read() if p.stdout is not None else ""
                e = p.stderr.read() if p.stderr is not None else ""
                p.wait(timeout=300)
                if p.returncode != 0:
                    raise RuntimeError(e)
                res = json.loads(o.strip().splitlines()[-1])
                if res["late"] > 0.1:
                    raise RuntimeError(f"a rank started {res['late']:.2f} s late")
                firsts.append(res["first"])
            out.setdefault(kind, []).append(max(firsts))
            every.setdefault(kind, []).extend(firsts)
    for kind in out:
        print(f"| {kind} | {spread(out[kind])} | {spread(every[kind])} |")


def bench_parquet(parquets: list[str], repeat: int) -> None:
    print(
        f"\n### Parquet, {len(parquets)} files of 4 row groups of 256 rows of 4 KiB "
        f"({4 * len(parquets)} MiB): one rank, no workers, default settings\n"
    )
    print(
        "| reader | rows/s | ratio to pyarrow | ratio to pyarrow, one thread | ratio to rows held "
        "| CPU s | CPU ratio to pyarrow | rows |"
    )
    print("|---|---|---|---|---|---|---|---|")
    runs: dict[str, list[dict[str, float]]] = {}
    kinds = (
        "fastshard",
        "pyarrow",
        "pyarrow, one thread",
        "pyarrow, one thread, rows held",
        "fastshard reads alone",
        "stream alone",
    )
    for _ in range(repeat):
        for kind in kinds:
            runs.setdefault(kind, []).append(child_json(PARQUET, kind, json.dumps(parquets)))
    base = [r["items"] / r["total"] for r in runs["pyarrow"]]
    base1 = [r["items"] / r["total"] for r in runs["pyarrow, one thread"]]
    floor = [r["items"] / r["total"] for r in runs["pyarrow, one thread, rows held"]]
    base_cpu = [r["cpu"] for r in runs["pyarrow"]]
    for kind, rs in runs.items():
        rates = [r["items"] / r["total"] for r in rs]
        ratios = [a / b for a, b in zip(rates, base)]
        ratios1 = [a / b for a, b in zip(rates, base1)]
        ratios_floor = [a / b for a, b in zip(rates, floor)]
        cpu = [r["cpu"] for r in rs]
        cpu_ratios = [b / a for a, b in zip(cpu, base_cpu)]  # > 1: less CPU than pyarrow
        print(
            f"| {kind} | {spread(rates)} | {spread(ratios)} | {spread(ratios1)} "
            f"| {spread(ratios_floor)} | {spread(cpu)} "
            f"| {spread(cpu_ratios)} | {rs[0]['items']} |"
        )


def bench_bounds(tars: list[str], parquets: list[str]) -> None:
    print("\n### batch_size = 128 (1,024 lanes), one reader, no workers\n")
    print("| shards | lanes | most descriptors open (above the start) | peak memory growth, MiB |")
    print("|---|---|---|---|")
    for kind, arg in (("tar", tars), ("parquet", parquets)):
        res = child_json(BOUNDS, kind, json.dumps(arg))
        print(f"| {kind} | {res['lanes']} | {res['fds']} | {res['growth_mib']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["tar", "ranks", "parquet", "bounds"], default=None)
    parser.add_argument(
        "--parquet-files",
        type=int,
        default=20,
        help="Parquet files of 4 MiB (default 20, the issue's 80 MiB); more show the steady state",
    )
    args = parser.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="streams_start_")
    tars, index, parquets = write_data(d, args.parquet_files)
    print(f"data: {d}; load average before: {open('/proc/loadavg').read().strip()}")
    if args.only in (None, "tar"):
        bench_tar(tars, index, args.repeat)
    if args.only in (None, "ranks"):
        bench_ranks(tars, index, args.repeat)
    if args.only in (None, "parquet"):
        bench_parquet(parquets, args.repeat)
    if args.only in (None, "bounds"):
        bench_bounds(tars, parquets)
    print(f"\nload average after: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
