"""What each rank gets from the same uneven shards: fastshard.ShardedStream, webdataset's
split_by_node, HF datasets' split_dataset_by_node, Mosaic streaming (docs/streams.md).

    python bench/streams_peers.py [--dir DIR]

Shard sizes [300, 40, 0, 1250, 95, 7, 410] (2102 samples, 7 files) and the same without the
empty file (6 files, which W = 2 and 3 divide). Ranks W = 2, 3, 4 are simulated one at a time
(RANK / WORLD_SIZE in the environment, or num_replicas/rank given; for Mosaic one process
per rank, started together, as the ranks of one node), each iterated to the end of one epoch with num_workers=0.
Prints the items each rank yields, the distinct samples over all ranks, and, for fastshard and
webdataset, the rows each rank read.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Any

SIZES = [300, 40, 0, 1250, 95, 7, 410]


def write(d: str, sizes: list[int]) -> tuple[list[str], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tars, parquets = [], []
    for s, n in enumerate(sizes):
        keys = [f"s{s}_{r:05d}" for r in range(n)]
        t = os.path.join(d, f"shard-{s}.tar")
        with tarfile.open(t, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in keys:
                info = tarfile.TarInfo(f"{k}.txt")
                info.size = len(k)
                tar.addfile(info, io.BytesIO(k.encode()))
        p = os.path.join(d, f"shard-{s}.parquet")
        pq.write_table(pa.table({"key": pa.array(keys, pa.string())}), p)
        tars.append(t)
        parquets.append(p)
    return tars, parquets


def env(rank: int, world: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))


def run_fastshard(tars: list[str], world: int) -> list[list[str]]:
    import fastshard
    from fastshard import readers

    sizes, read = readers.tar_shards(tars)
    out = []
    for rank in range(world):
        s = fastshard.ShardedStream(sizes, read, batch_size=8, num_replicas=world, rank=rank)
        it = iter(s)
        out.append([x["__key__"] for x in it])
        FASTSHARD_ROWS_READ.append(it.rows_read)
    return out


FASTSHARD_ROWS_READ: list[int] = []


def run_webdataset(tars: list[str], world: int) -> list[list[str]]:
    import webdataset as wds

    out = []
    for rank in range(world):
        env(rank, world)
        ds = wds.WebDataset(
            tars, shardshuffle=False, nodesplitter=wds.split_by_node, empty_check=False
        )
        out.append([x["__key__"] for x in ds])
    return out


def run_hf(parquets: list[str], world: int) -> list[list[str]]:
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    out = []
    for rank in range(world):
        ds = load_dataset("parquet", data_files=parquets, split="train", streaming=True)
        part = split_dataset_by_node(ds, rank=rank, world_size=world)
        out.append([x["key"] for x in part])
    return out


# streaming's package __init__ imports its vision datasets, which import torchvision; no
# torchvision wheel for torch 2.13 CPU installs here, and StreamingDataset and MDSWriter use
# none of it, so an empty stand-in satisfies the import.
TORCHVISION_STUB = r"""
import importlib.machinery, sys, types
try:
    import torchvision  # noqa: F401
except Exception:
    for name in ("torchvision", "torchvision.datasets", "torchvision.transforms",
                 "torchvision.transforms.functional"):
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules["torchvision.datasets"].VisionDataset = object
    sys.modules["torchvision.datasets"].CIFAR10 = object
    sys.modules["torchvision.transforms.functional"].to_tensor = None
"""

MOSAIC_CHILD = (
    TORCHVISION_STUB
    + r"""
import json, os, sys
from streaming import StreamingDataset
from streaming.base.util import clean_stale_shared_memory
clean_stale_shared_memory()
ds = StreamingDataset(local=sys.argv[1], batch_size=8, shuffle=False)
keys = [x["key"] for x in ds]
print(json.dumps(keys))
"""
)


def run_mosaic(mds: str, world: int) -> list[list[str]]:
    """One process per rank, all at once: StreamingDataset joins a gloo group of the ranks
    itself (RANK, WORLD_SIZE, MASTER_ADDR/PORT); the ranks are one node (one machine)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(world):
        e = dict(os.environ)
        e.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        e.update(LOCAL_WORLD_SIZE=str(world))
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", MOSAIC_CHILD, mds],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=e,
                cwd=tempfile.gettempdir(),
            )
        )
    out = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            if proc.returncode:
                raise RuntimeError(stderr[-3000:])
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:  # a rank that timed out or failed leaves its peers waiting
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def write_mds(d: str, sizes: list[int]) -> str:
    exec(TORCHVISION_STUB)
    from streaming import MDSWriter

    out = os.path.join(d, "mds")
    shutil.rmtree(out, ignore_errors=True)
    # One MDS shard per source file: size_limit below one file's smallest encoding would cut
    # more; Mosaic splits samples, not shards, over ranks, so the cut does not change counts.
    with MDSWriter(out=out, columns={"key": "str"}, size_limit=1 << 16) as w:
        for s, n in enumerate(sizes):
            for r in range(n):
                w.write({"key": f"s{s}_{r:05d}"})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="fastshard-peers-")
    for sizes in (SIZES, [s for s in SIZES if s]):
        d = os.path.join(root, f"{len(sizes)}files")
        os.makedirs(d, exist_ok=True)
        tars, parquets = write(d, sizes)
        mds = write_mds(d, sizes)
        n = sum(sizes)
        print(f"\n{len(sizes)} files, sizes {sizes}, {n} samples")
        print("| library | W | items per rank | distinct over ranks | rows read per rank |")
        print("|---|---|---|---|---|")
        for world in (2, 3, 4):
            for name, fn, arg in [
                ("fastshard.ShardedStream", run_fastshard, tars),
                ("webdataset split_by_node", run_webdataset, tars),
                ("HF split_dataset_by_node", run_hf, parquets),
                ("Mosaic StreamingDataset", run_mosaic, mds),
            ]:
                try:
                    per_rank = fn(arg, world)  # type: ignore[operator]
                except Exception as err:  # report, do not hide
                    msg = str(err).splitlines()[-1][:120] if str(err) else ""
                    print(f"| {name} | {world} | error: {type(err).__name__}: {msg} | | |")
                    continue
                distinct = len(set().union(*map(set, per_rank)))
                read = reads(name, per_rank, sizes, world)
                counts = [len(x) for x in per_rank]
                print(f"| {name} | {world} | {counts} | {distinct}/{n} | {read} |")
        for var in ("RANK", "WORLD_SIZE"):
            os.environ.pop(var, None)


def reads(name: str, per_rank: list[list[str]], sizes: list[int], world: int) -> Any:
    """Rows each rank read, where this script can tell: fastshard's iterators count the rows
    they took from read(); webdataset streams every file it yields from to its end. Not
    measured for HF datasets and Mosaic."""
    if name.startswith("fastshard"):
        rows = FASTSHARD_ROWS_READ[-world:]  # the iterators' own count (rows_read)
        return rows
    if name.startswith("webdataset"):
        files = [{k.split("_")[0] for k in keys} for keys in per_rank]
        return [sum(sizes[int(f[1:])] for f in fs) for fs in files]
    return "not measured"


if __name__ == "__main__":
    main()
