"""Shards in object storage (issue 46, "Targets"): fastshard beside LitData, webdataset over
``pipe:curl`` and HF datasets streaming, side by side in one run against one S3-API server.

    python bench/streams_remote.py --quick                          # 8 shards, one run each
    python bench/streams_remote.py --repeat 3 --out DIR             # the issue's data and table
    python bench/streams_remote.py --simulate-ranks 1024            # no server: W = 1024
    python bench/streams_remote.py --peer-python litdata=/venv/bin/python \\
        --peer-python hf=/other/bin/python                          # peers in venvs of their own

Data (written once under ``--dir``): ``--shards`` webdataset tar shards of about ``--per-shard``
samples (counts vary by a few percent, as the issue's 64,461 over 64 shards do), each sample one
``KEY.bin`` member of 1-4 KiB of random bytes; the same samples as Parquet (one file per shard,
row groups of ``--row-group`` rows) and as LitData's ``optimize()`` chunks. Everything is uploaded
to moto's S3 server behind tests/s3_server.py's proxy, which adds ``--latency`` to every request
(0 and 20 ms: a cloud round trip) and counts what it served.

Setting: rank 0 of 2, batch 32, DataLoader ``num_workers`` 0 and 2, one epoch, every run in a
fresh subprocess (killed by process group past ``--timeout``); samples/s is the median of
``--repeat`` runs. Each case also records the bytes the server sent for the samples'
objects (÷ the bytes of the samples the rank yielded: for tar each sample's span in its shard,
for Parquet and LitData the files' bytes pro rata; index files counted apart), requests by
method, the first batch (from ``iter()`` to the first batch), peak
RSS (VmHWM of the child's main process, and of each DataLoader worker at its exit) and the disk
used under the child's cache folder. Every run checks its items: distinct keys == items read ==
what the rank should read. The peers run in the interpreter named by ``--peer-python NAME=PATH``
or ``FASTSHARD_PEER_<NAME>`` (default: this one); a peer that does not import is skipped, and the
output says why.

``--simulate-ranks W`` computes, from ShardedStream's own plan (what a remote read asks its
fetcher for), the requests and bytes of a few ranks of W over a dataset of the same shard shape
with ``--scale`` times the shards, and what the server sees at the start.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUCKET = "bench"
BATCH = 32
WORLD = 2
RANK = 0
PEERS = ("litdata", "webdataset", "hf")
TAR_HEADER = 512


# -- data -----------------------------------------------------------------------------------------
def shard_counts(shards: int, per_shard: int, seed: int = 0) -> list[int]:
    """Counts a few percent around ``per_shard`` (mean ~1.007x, as 64,461 over 64 shards)."""
    rng = np.random.default_rng(seed)
    lo, hi = int(per_shard * 0.97), int(per_shard * 1.045)
    return [int(x) for x in rng.integers(lo, hi + 1, shards)]


def payload_sizes(shard: int, n: int) -> np.ndarray:
    """1-4 KiB per sample, the same for a shard index every time (the simulation needs no
    data)."""
    return np.random.default_rng([7, shard]).integers(1024, 4097, n)


def tar_spans(shard: int, n: int) -> np.ndarray:
    """Each sample's bytes in its tar shard: a header and the payload padded to 512."""
    sizes = payload_sizes(shard, n)
    return TAR_HEADER + -(-sizes // 512) * 512


def key(shard: int, row: int) -> str:
    return f"s{shard:04d}_{row:05d}"


def write_data(d: str, counts: list[int], row_group: int) -> dict[str, Any]:
    """Tar shards, Parquet files and a local index under ``d`` (kept between runs when the
    layout matches); returns the layout (meta.json)."""
    meta_path = os.path.join(d, "meta.json")
    want = {"counts": counts, "row_group": row_group, "version": 1}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta: dict[str, Any] = json.load(f)
        if {k: meta.get(k) for k in want} == want:
            return meta
        shutil.rmtree(d)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastshard import readers

    for sub in ("tar", "pq"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    tars, pqs = [], []
    for s, n in enumerate(counts):
        rng = np.random.default_rng([11, s])
        sizes = payload_sizes(s, n)
        keys = [key(s, r) for r in range(n)]
        blobs = [rng.bytes(int(z)) for z in sizes]
        path = os.path.join(d, "tar", f"shard-{s:04d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k, data in zip(keys, blobs):
                info = tarfile.TarInfo(f"{k}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        tars.append(path)
        q = os.path.join(d, "pq", f"part-{s:04d}.parquet")
        table = pa.table({"key": pa.array(keys), "bin": pa.array(blobs, pa.binary())})
        pq.write_table(table, q, row_group_size=row_group)
        pqs.append(q)
    readers.write_tar_index(tars, os.path.join(d, "tar", "index-local.json"))
    meta = {
        **want,
        "tar_bytes": [os.path.getsize(p) for p in tars],
        "pq_bytes": [os.path.getsize(p) for p in pqs],
    }
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return meta


def prepare_litdata(d: str, python: str, per_shard: int, timeout: float) -> str:
    """LitData's own chunks of the same samples (``optimize()``, run in the peer's
    interpreter); returns the folder."""
    out = os.path.join(d, "litdata")
    if os.path.exists(os.path.join(out, "index.json")):
        return out
    shutil.rmtree(out, ignore_errors=True)
    spec = {"mode": "litdata-optimize", "dir": d, "out": out, "chunk": per_shard}
    run_child(python, spec, {}, timeout, cwd=d)
    return out


def _lit_item(path: str) -> Any:
    with tarfile.open(path) as tar:
        for m in tar:
            f = tar.extractfile(m)
            assert f is not None
            yield {"key": m.name.rsplit(".", 1)[0], "bin": f.read()}


def _optimize(spec: dict[str, Any]) -> dict[str, Any]:
    from litdata import optimize

    tars = sorted(
        os.path.join(spec["dir"], "tar", n)
        for n in os.listdir(os.path.join(spec["dir"], "tar"))
        if n.endswith(".tar")
    )
    optimize(
        _lit_item, tars, spec["out"], chunk_size=spec["chunk"], num_workers=1, verbose=False,
        reorder_files=False, start_method="fork",
    )  # fmt: skip
    return {"ok": True}


# -- a child: one case, one run -----------------------------------------------------------------
def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _write_hwm(folder: str) -> None:
    with open(os.path.join(folder, f"worker-{os.getpid()}.kb"), "w") as f:
        f.write(str(_hwm_kb()))


def _worker_init(_: int) -> None:
    # Runs in each DataLoader worker: its VmHWM at its exit goes to a file (multiprocessing
    # runs its finalizers when a worker returns; atexit would not run in a forked child).
    from multiprocessing import util

    util.Finalize(None, _write_hwm, args=(os.environ["BENCH_HWM_DIR"],), exitpriority=100)


class Collate:
    """A batch becomes its keys and payload sizes: reading, not decoding, is measured."""

    def __init__(self, key: str, field: str) -> None:
        self.key, self.field = key, field

    def __call__(self, items: list[dict[str, Any]]) -> list[tuple[str, int]]:
        return [(str(x[self.key]), len(x[self.field])) for x in items]


def _dataset(spec: dict[str, Any], meta: dict[str, Any]) -> tuple[Any, int | None, Collate]:
    """The case's dataset, the items rank 0 should read (None: found from the shards it
    read), and the collate that names a sample."""
    case = spec["case"]
    counts = meta["counts"]
    url = f"s3://{BUCKET}"
    if case.startswith("fastshard"):
        import fastshard
        from fastshard import readers

        kw = {}
        if spec.get("inflight_mb"):
            kw["max_inflight_bytes"] = int(spec["inflight_mb"] * 2**20)
        if case == "fastshard-local":
            shards = readers.tar_shards(index=os.path.join(spec["dir"], "tar", "index-local.json"))
        elif case == "fastshard-parquet":
            names = [f"{url}/pq/part-{s:04d}.parquet" for s in range(len(counts))]
            shards = readers.parquet_shards(names, **kw)
        else:  # fastshard-remote, fastshard-faults
            shards = readers.tar_shards(index=f"{url}/tar/index.json", **kw)
        stream = fastshard.ShardedStream(
            shards.sizes, shards.read, batch_size=BATCH, num_replicas=WORLD, rank=RANK,
            seed=0, pad=False,
        )  # fmt: skip
        k = "__key__" if "parquet" not in case else "key"
        return stream, len(stream), Collate(k, "bin")
    if case == "litdata":
        from litdata import StreamingDataset
        from litdata.streaming import downloader

        # LitData builds its obstore client with fixed options that refuse a plain-http
        # endpoint (AWS_ALLOW_HTTP is not read); a real bucket is https, so allow http here.
        downloader._OBSTORE_CLIENT_OPTIONS = {
            **downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True
        }  # fmt: skip
        ds = StreamingDataset(f"{url}/litdata", cache_dir=spec["cache"])
        return ds, len(ds), Collate("key", "bin")
    if case == "webdataset":
        import webdataset as wds

        port = spec["port"]
        tars = [
            f"pipe:curl -s -f http://127.0.0.1:{port}/{BUCKET}/tar/shard-{s:04d}.tar"
            for s in range(len(counts))
        ]
        ds = wds.WebDataset(
            tars, shardshuffle=False, nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker, empty_check=False,
        )  # fmt: skip
        return ds, None, Collate("__key__", "bin")
    if case == "hf":
        from datasets import load_dataset
        from datasets.distributed import split_dataset_by_node

        env = os.environ
        names = [f"{url}/pq/part-{s:04d}.parquet" for s in range(len(counts))]
        ds = load_dataset(
            "parquet",
            data_files={"train": names},
            split="train",
            streaming=True,
            storage_options={
                "key": env["AWS_ACCESS_KEY_ID"],
                "secret": env["AWS_SECRET_ACCESS_KEY"],
                "client_kwargs": {
                    "endpoint_url": env["AWS_ENDPOINT_URL"],
                    "region_name": env["AWS_REGION"],
                },
            },
        )
        ds = split_dataset_by_node(ds, rank=RANK, world_size=WORLD)
        return ds, None, Collate("key", "bin")
    raise ValueError(f"unknown case {case!r}")


def child(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("mode") == "litdata-optimize":
        return _optimize(spec)
    with open(os.path.join(spec["dir"], "meta.json")) as f:
        meta = json.load(f)
    import torch.utils.data

    t0 = time.perf_counter()
    ds, expected, collate = _dataset(spec, meta)
    setup = time.perf_counter() - t0
    workers = spec["workers"]
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=collate,
        worker_init_fn=_worker_init if workers else None,
        timeout=300 if workers else 0,
    )
    seen: list[tuple[str, int]] = []
    first = None
    t0 = time.perf_counter()
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        seen += batch
    seconds = time.perf_counter() - t0
    del loader
    fetched_here = None
    if spec["case"].startswith("fastshard"):
        from fastshard import _storage

        fetched_here = _storage.stats()  # this process's reads (workers count their own)
    return {
        **check(spec["case"], meta, seen, expected),
        "setup": setup,
        "first_batch": first,
        "seconds": seconds,
        "hwm_main_kb": _hwm_kb(),
        "client_stats_main": fetched_here,
    }


def check(case: str, meta: dict[str, Any], seen: list[tuple[str, int]], expected: Any) -> dict:
    """Whether the rank read what it should, and the bytes of what it read."""
    counts = meta["counts"]
    per_shard = np.zeros(len(counts), dtype=np.int64)
    rows: list[list[int]] = [[] for _ in counts]
    for k, _ in seen:
        s, r = k[1:].split("_")
        per_shard[int(s)] += 1
        rows[int(s)].append(int(r))
    distinct = len({k for k, _ in seen})
    touched = np.flatnonzero(per_shard)
    if expected is None:
        # Peers that split by shards: every shard it touched read whole, on half the shards.
        whole = all(per_shard[s] == counts[s] for s in touched)
        half = len(touched) in (len(counts) // WORLD, -(-len(counts) // WORLD))
        expected = int(sum(counts[s] for s in touched)) if whole and half else -1
    if case in ("fastshard-local", "fastshard-remote", "fastshard-faults", "webdataset"):
        needed = int(sum(int(tar_spans(s, counts[s])[rows[s]].sum()) for s in touched))
        kind = "tar spans"
    elif case == "litdata":
        needed = int(meta.get("lit_bytes", 0) * len(seen) / sum(counts))
        kind = "chunk bytes pro rata"
    else:
        needed = int(sum(meta["pq_bytes"][s] * per_shard[s] / counts[s] for s in touched))
        kind = "file bytes pro rata"
    return {
        "items": len(seen),
        "distinct": distinct,
        "expected": int(expected),
        "ok": len(seen) == distinct == expected,
        "needed": needed,
        "needed_as": kind,
        "payload": int(sum(n for _, n in seen)),
    }


# -- the parent ---------------------------------------------------------------------------------
def run_child(
    python: str, spec: dict[str, Any], env: dict[str, str], timeout: float, cwd: str
) -> dict[str, Any]:
    """``python streams_remote.py --child SPEC`` in its own session; its last line is JSON."""
    proc = subprocess.Popen(
        [python, os.path.abspath(__file__), "--child", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, **env},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        what = spec.get("case", spec.get("mode"))
        raise RuntimeError(f"{what}: timed out after {timeout} s") from None
    finally:
        try:  # whatever the child left (DataLoader workers, curl) goes with its group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.returncode != 0:
        raise RuntimeError(f"child exited with {proc.returncode}:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def peer_pythons(given: list[str]) -> dict[str, str]:
    out = {}
    for name in PEERS:
        env = os.environ.get(f"FASTSHARD_PEER_{name.upper()}")
        if env:
            out[name] = env
    for item in given:
        name, _, path = item.partition("=")
        if name not in PEERS or not path:
            raise SystemExit(f"--peer-python takes NAME=PATH with NAME one of {PEERS}: {item!r}")
        out[name] = path
    return out


def peer_ok(python: str, module: str) -> str | None:
    """None when ``module`` imports in ``python``, else why not."""
    try:
        proc = subprocess.run(
            [python, "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tempfile.gettempdir(),
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{python}: {err}"
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return f"`import {module}` fails in {python}: {last}"
    return None


def cases(args: argparse.Namespace, skipped: dict[str, str], py: dict[str, str]) -> list[dict]:
    """(case, interpreter, workers, latency) to run, in a fixed order."""
    out = []
    names = ["fastshard-local", "fastshard-remote", "fastshard-parquet", "fastshard-faults"]
    names += [p for p in PEERS if p not in skipped]
    for name in names:
        if args.only and name not in args.only:
            continue
        for workers in args.workers:
            for latency in [0.0] if name == "fastshard-local" else args.latency:
                out.append(
                    {
                        "case": name,
                        "python": py.get(name, sys.executable),
                        "workers": workers,
                        "latency": latency,
                    }
                )
    return out


def bench(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from s3_server import S3Server

    from fastshard import readers

    os.makedirs(args.dir, exist_ok=True)
    counts = shard_counts(args.shards, args.per_shard)
    print(f"data: {len(counts)} shards, {sum(counts)} samples under {args.dir}", flush=True)
    meta = write_data(args.dir, counts, args.row_group)
    py = peer_pythons(args.peer_python)
    skipped: dict[str, str] = {}
    for name, module in (("litdata", "litdata"), ("webdataset", "webdataset"), ("hf", "datasets")):
        if args.only and name not in args.only:
            continue
        why = peer_ok(py.get(name, sys.executable), module)
        if why is None and name == "webdataset" and shutil.which("curl") is None:
            why = "no curl on PATH (webdataset reads pipe:curl URLs)"
        if why is None and name == "hf":
            why = peer_ok(py.get(name, sys.executable), "s3fs")
        if why:
            skipped[name] = why
    if "litdata" not in skipped and (not args.only or "litdata" in args.only):
        try:
            lit = prepare_litdata(args.dir, py.get("litdata", sys.executable), args.per_shard,
                                  args.timeout)  # fmt: skip
            meta["lit_bytes"] = du(lit)
            with open(os.path.join(args.dir, "meta.json"), "w") as f:
                json.dump(meta, f)
        except RuntimeError as err:
            skipped["litdata"] = f"optimize() failed: {str(err)[-300:]}"
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", flush=True)

    results: list[dict[str, Any]] = []
    with S3Server() as server:
        files = {}
        for sub in ("tar", "pq", "litdata"):
            folder = os.path.join(args.dir, sub)
            if not os.path.isdir(folder) or (sub == "litdata" and "litdata" in skipped):
                continue
            for name in sorted(os.listdir(folder)):
                if name != "index-local.json":
                    files[f"{sub}/{name}"] = os.path.join(folder, name)
        t0 = time.perf_counter()
        server.upload(BUCKET, files)
        # webdataset's curl GETs without signing: a bucket policy lets anyone read.
        server.client().put_bucket_policy(Bucket=BUCKET, Policy=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                           "Resource": f"arn:aws:s3:::{BUCKET}/*"}],
        }))  # fmt: skip
        senv = server.env()
        os.environ.update(senv)
        urls = [f"s3://{BUCKET}/tar/shard-{s:04d}.tar" for s in range(len(counts))]
        readers.write_tar_index(urls, f"s3://{BUCKET}/tar/index.json")
        print(f"uploaded {len(files)} objects in {time.perf_counter() - t0:.1f} s", flush=True)
        todo = cases(args, skipped, py)
        for i, c in enumerate(todo):
            runs = []
            for r in range(args.repeat):
                faults = {"latency": c["latency"], "fail": 0.0, "seed": r}
                if c["case"] == "fastshard-faults":
                    faults["fail"] = args.fail
                server.faults(**faults)
                server.reset()
                scratch = tempfile.mkdtemp(prefix="bench-case-", dir=args.scratch)
                cache = os.path.join(scratch, "cache")
                hwm = os.path.join(scratch, "hwm")
                os.makedirs(cache)
                os.makedirs(hwm)
                spec = {**c, "dir": args.dir, "cache": cache, "port": server.port,
                        "inflight_mb": args.max_inflight_mb}  # fmt: skip
                env = {
                    **senv,
                    "RANK": str(RANK),
                    "GLOBAL_RANK": str(RANK),
                    "WORLD_SIZE": str(WORLD),
                    "BENCH_HWM_DIR": hwm,
                    "HF_HOME": os.path.join(cache, "hf"),
                    "XDG_CACHE_HOME": cache,
                    "HF_DATASETS_OFFLINE": "0",
                    "HF_HUB_OFFLINE": "1",
                }
                env.pop("PYTHONPATH", None)
                try:
                    out = run_child(c["python"], spec, env, args.timeout, cwd=scratch)
                    out["error"] = None
                except RuntimeError as err:
                    out = {"error": str(err)[-2000:], "ok": False}
                st = server.stats()
                out["fetched"] = st["bytes"]
                # Index files (fastshard's, LitData's) apart from the samples' objects.
                out["fetched_meta"] = sum(g[3] for g in st["gets"] if g[0].endswith(".json"))
                out["requests"] = st["requests"]
                out["faults"] = st["faults"]
                out["disk"] = du(cache)
                out["hwm_workers_kb"] = [
                    int(open(os.path.join(hwm, n)).read() or 0) for n in sorted(os.listdir(hwm))
                ]
                shutil.rmtree(scratch, ignore_errors=True)
                runs.append(out)
                if out["error"]:
                    print(f"  {c['case']} k={c['workers']} {c['latency']*1e3:.0f} ms: "
                          f"{out['error'][-600:]}", flush=True)  # fmt: skip
                    break
            server.faults(latency=0.0, fail=0.0)
            row = summarize(c, runs)
            results.append(row)
            print(f"[{i + 1}/{len(todo)}] {line(row)}", flush=True)
    return {"results": results, "skipped": skipped, "meta": {"counts": counts}}


def summarize(c: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if not r.get("error")]
    row: dict[str, Any] = {k: c[k] for k in ("case", "workers", "latency")}
    row["runs"] = runs
    row["ok"] = bool(good) and len(good) == len(runs) and all(r["ok"] for r in good)
    if not good:
        row["rate"] = None
        return row
    rates = [r["items"] / r["seconds"] for r in good]
    row["rate"] = statistics.median(rates)
    row["first_batch"] = statistics.median(r["first_batch"] or 0.0 for r in good)
    row["setup"] = statistics.median(r["setup"] for r in good)
    last = good[-1]
    row["fetched"] = last["fetched"]
    row["needed"] = last["needed"]
    row["fetched_meta"] = last["fetched_meta"]
    data = last["fetched"] - last["fetched_meta"]
    row["amplification"] = data / last["needed"] if last["needed"] else None
    row["requests"] = last["requests"]
    row["faults"] = last["faults"]
    row["disk"] = max(r["disk"] for r in good)
    row["hwm_main_mb"] = max(r["hwm_main_kb"] for r in good) / 1024
    row["hwm_workers_mb"] = max(sum(r["hwm_workers_kb"]) for r in good) / 1024
    row["items"] = last["items"]
    row["expected"] = last["expected"]
    return row


def line(row: dict[str, Any]) -> str:
    head = f"{row['case']} k={row['workers']} {row['latency'] * 1e3:.0f} ms"
    if row["rate"] is None:
        return f"{head}: failed"
    return (
        f"{head}: {row['rate']:,.0f} samples/s, first batch {row['first_batch']:.2f} s, "
        f"{row['items']} items ({'ok' if row['ok'] else 'WRONG'})"
    )


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| case | workers | latency | samples/s | first batch s | setup s | fetched ÷ needed "
        "| index KB | requests | peak RSS MB (main + workers) | disk MB | items |"
    )
    out = [head, "|" + "---|" * 12]
    for r in results:
        if r["rate"] is None:
            err = (r["runs"][-1].get("error") or "").strip().splitlines()[-1:] or ["?"]
            out.append(
                f"| {r['case']} | {r['workers']} | {r['latency'] * 1e3:.0f} ms | failed: "
                f"{err[0][:80]} | | | | | | | | |"
            )
            continue
        amp = "—" if r["case"] == "fastshard-local" else f"{r['amplification']:.3f}"
        req = ", ".join(f"{k} {v}" for k, v in sorted(r["requests"].items())) or "—"
        if r["faults"].get("fail"):
            req += f" ({r['faults']['fail']} failed)"
        items = f"{r['items']}" + ("" if r["ok"] else f" WRONG (expected {r['expected']})")
        out.append(
            f"| {r['case']} | {r['workers']} | {r['latency'] * 1e3:.0f} ms | {r['rate']:,.0f} "
            f"| {r['first_batch']:.3f} | {r['setup']:.2f} | {amp} | {r['fetched_meta'] / 1e3:.0f} "
            f"| {req} "
            f"| {r['hwm_main_mb']:.0f} + {r['hwm_workers_mb']:.0f} | {r['disk'] / 1e6:.1f} "
            f"| {items} |"
        )
    return "\n".join(out)


def ratios(results: list[dict[str, Any]], latency: float) -> list[str]:
    """The issue's targets, each as measured / target."""
    got = {(r["case"], r["workers"], r["latency"]): r for r in results if r["rate"]}

    def rate(case: str, k: int, lat: float) -> float | None:
        r = got.get((case, k, lat))
        return None if r is None else float(r["rate"])

    def ratio(a: float | None, b: float | None) -> str:
        return "n/a" if a is None or b is None or not b else f"{a / b:.2f}"

    L = latency
    ms = f"{L * 1e3:.0f} ms"
    out = []
    for k in sorted({r["workers"] for r in results}):
        rem = rate("fastshard-remote", k, L)
        out.append(
            f"- k={k}: remote tar @{ms} ÷ LitData @{ms}: "
            f"{ratio(rem, rate('litdata', k, L))} (target ≥ 1.0); ÷ fastshard local disk: "
            f"{ratio(rem, rate('fastshard-local', k, 0.0))} (≥ 0.8); ÷ webdataset pipe:curl: "
            f"{ratio(rem, rate('webdataset', k, L))}"
        )
        out.append(
            f"- k={k}: remote tar @{ms} ÷ @0 ms: {ratio(rem, rate('fastshard-remote', k, 0.0))}"
            f" (≥ 0.9); Parquet @{ms} ÷ @0 ms: "
            f"{ratio(rate('fastshard-parquet', k, L), rate('fastshard-parquet', k, 0.0))}"
        )
        out.append(
            f"- k={k}: Parquet @{ms} ÷ HF datasets @{ms}: "
            f"{ratio(rate('fastshard-parquet', k, L), rate('hf', k, L))} (≥ 1.0); 5% failed "
            f"requests ÷ clean @{ms}: {ratio(rate('fastshard-faults', k, L), rem)} (≥ 0.9)"
        )
        r, loc = got.get(("fastshard-remote", k, L)), got.get(("fastshard-local", k, 0.0))
        f = got.get(("fastshard-faults", k, L))
        if r:
            mem = "n/a"
            if loc is not None:
                peak = r["hwm_main_mb"] + r["hwm_workers_mb"]
                mem = f"{peak / (loc['hwm_main_mb'] + loc['hwm_workers_mb']):.2f}"
            out.append(
                f"- k={k}: remote tar @{ms}: fetched ÷ needed {r['amplification']:.3f} (≤ 1.02), "
                f"first batch {r['first_batch']:.3f} s (≤ 0.3), disk {r['disk']} B (0), peak "
                f"RSS ÷ local {mem} (≤ 1.25)"
            )
        if f:
            out.append(
                f"- k={k}: 5% faults @{ms}: {f['faults'].get('fail', 0)} requests failed, "
                f"items {'exact (distinct == expected)' if f['ok'] else 'WRONG'}"
            )
    return out


# -- W = 1024 by simulation ---------------------------------------------------------------------
class _Recorder:
    """A ``read`` that records what a remote reader would ask its fetcher for."""

    def __init__(self) -> None:
        self.segments: list[tuple[int, int, int, int]] = []
        self.opened: list[tuple[int, int, int]] = []

    def prefetch(self, segments: Any) -> None:
        # A list of reads, or (newer streams) a function that lists them when asked.
        self.segments = list(segments() if callable(segments) else segments)

    def __call__(self, shard: int, start: int, stop: int) -> Any:
        self.opened.append((shard, start, stop))
        return range(start, stop)


def _gets(size: int, lanes_open: int) -> int:
    """The GETs a fetcher cuts one read of ``size`` bytes into, as fastshard._storage's
    RangeStream does: blocks of the bound split over twice the open lanes (within
    [MIN_BLOCK_BYTES, BLOCK_BYTES]), a last piece under two blocks joined to the one before.
    Older builds: a first block of FIRST_BLOCK_BYTES, then doubling up to BLOCK_BYTES."""
    from fastshard import _storage

    top = _storage.BLOCK_BYTES
    if hasattr(_storage, "MIN_BLOCK_BYTES"):
        share = _storage.MAX_INFLIGHT_BYTES // (2 * max(1, lanes_open))
        block = max(_storage.MIN_BLOCK_BYTES, min(top, share))
        return 1 if size < 2 * block else size // block
    n, at, block = 0, 0, min(_storage.FIRST_BLOCK_BYTES, top)
    while at < size:
        at, block, n = at + block, min(block * 2, top), n + 1
    return max(n, 1)


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    import fastshard

    base = shard_counts(args.shards, args.per_shard)
    scale = args.scale
    sizes = np.tile(np.asarray(base, dtype=np.int64), scale)
    spans = [tar_spans(s, n) for s, n in enumerate(base)]
    cum = [np.concatenate([[0], np.cumsum(x)]) for x in spans]
    W = args.simulate_ranks
    n = int(sizes.sum())
    print(f"simulating W = {W}: {len(sizes)} shards, {n:,} samples (the data's shard shape "
          f"x{scale}), batch {BATCH}, default lanes", flush=True)  # fmt: skip
    ranks = sorted({0, 1, W // 2, W - 1})
    rows = []
    for rank in ranks:
        rec = _Recorder()
        stream = fastshard.ShardedStream(
            sizes, rec, batch_size=BATCH, num_replicas=W, rank=rank, seed=0, pad=False
        )
        it = iter(stream)
        t0 = time.perf_counter()
        for _ in range(BATCH):  # the first batch: prefetch is told everything at its start
            next(it)
        plan_s = time.perf_counter() - t0
        first_reads = len(rec.opened)
        segs = rec.segments
        requests = 0
        fetched = 0
        lanes_open = sum(1 for *_, at in segs if at == 0)  # as readers.py sets concurrency
        for shard, a, z, _ in segs:
            b = int(cum[shard % len(base)][z] - cum[shard % len(base)][a])
            fetched += b
            requests += _gets(b, lanes_open)
        items = len(stream)
        # The offsets this rank fetches from the index's sidecar: 8 bytes a sample and one
        # more per shard, for the shards it reads (fastshard-tar-offsets-v2).
        read_shards = {shard for shard, *_ in segs}
        offsets_bytes = sum(8 * (int(sizes[s]) + 1) for s in read_shards)
        rows.append(
            {
                "rank": rank,
                "items": items,
                "shards_read": len(read_shards),
                "offsets_bytes": offsets_bytes,
                "pieces": len(segs),
                "requests": requests,
                "bytes": fetched,
                "rows_in_pieces": int(sum(z - a for _, a, z, _ in segs)),
                "first_batch_reads": first_reads,
                "lanes": stream.lanes,
                "plan_s": plan_s,
            }
        )
        it.close() if hasattr(it, "close") else None
    # The index as written for remote shards: wids' shard list in the JSON (measured per
    # shard on this data's index), every sample's offset in the sidecar (8 B a sample, 8 a shard).
    idx = os.path.join(args.dir, "tar", "index-remote-layout.json")
    per_shard = None
    if os.path.isdir(os.path.join(args.dir, "tar")):
        from fastshard import _index, readers

        tars = sorted(
            os.path.join(args.dir, "tar", x)
            for x in os.listdir(os.path.join(args.dir, "tar"))
            if x.endswith(".tar")
        )
        if tars and not os.path.exists(idx):
            counts, bounds, flat, ends = readers._scan_tars(tars, 1, None)
            _index.write_tar_index(
                idx, tars, counts, 1, bounds, flat, ends,
                [os.path.getsize(t) for t in tars], sidecar=True,
            )  # fmt: skip
        if os.path.exists(idx):
            per_shard = os.path.getsize(idx) / len(tars)
    return {"W": W, "shards": len(sizes), "samples": n, "ranks": rows,
            "index_json_bytes_per_shard": per_shard}  # fmt: skip


def print_simulation(sim: dict[str, Any]) -> None:
    W = sim["W"]
    print(f"\n### W = {W}, {sim['shards']:,} shards, {sim['samples']:,} samples (simulated)\n")
    print("| rank | items | (lane, shard) pieces | requests | bytes | bytes ÷ item "
          "| reads opened by the first batch |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in sim["ranks"]:
        print(
            f"| {r['rank']} | {r['items']:,} | {r['pieces']:,} | {r['requests']:,} "
            f"| {r['bytes'] / 1e6:,.1f} MB | {r['bytes'] / max(1, r['items']):,.0f} "
            f"| {r['first_batch_reads']} |"
        )
    r0 = sim["ranks"][0]
    print(f"\nrows in the pieces ÷ items: {r0['rows_in_pieces'] / max(1, r0['items']):.3f} "
          f"(1.0: a rank fetches exactly its own samples); lanes {r0['lanes']:,}")  # fmt: skip
    per = sim["index_json_bytes_per_shard"]
    if per:
        one = per * sim["shards"]
        side = 8 * (sim["samples"] + sim["shards"])
        print(
            f"index: the JSON (wids' shard list) {per:.0f} B per shard -> one GET of "
            f"{one / 1e6:,.1f} MB; at the start the server sees {W:,} GETs of it "
            f"({W * one / 1e9:,.2f} GB) without share_counts, 1 with share_counts=True (rank 0 "
            f"broadcasts it). The offsets ({side / 1e9:,.2f} GB in the sidecar) are fetched "
            f"per shard read: rank 0 reads {r0['shards_read']:,} shards, "
            f"{r0['offsets_bytes'] / 1e6:,.1f} MB of offsets in {r0['shards_read']:,} ranged GETs"
        )
    print(
        f"first batch: each rank opens {r0['first_batch_reads']} reads; its fetcher starts "
        f"min(pieces, max_requests) requests at once, so {W:,} ranks x up to 16 = "
        f"{W * 16:,} concurrent GETs at the start"
    )


# -- main -------------------------------------------------------------------------------------
def fastshard_version() -> str:
    """The fastshard this interpreter imports: its version and, for a checkout, its commit."""
    import fastshard

    root = os.path.dirname(os.path.dirname(os.path.abspath(fastshard.__file__)))
    try:
        head = subprocess.run(
            ["git", "-C", root, "describe", "--always", "--dirty"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        head = ""
    return f"fastshard {fastshard.__version__}" + (f" ({root} at {head})" if head else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastshard-remote-bench"))
    p.add_argument("--scratch", default=None, help="where each run's cache folder goes")
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--per-shard", type=int, default=1000)
    p.add_argument("--row-group", type=int, default=100, help="Parquet rows per row group")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--latency", type=float, nargs="+", default=[0.0, 0.02], help="seconds")
    p.add_argument("--fail", type=float, default=0.05, help="share of failed requests")
    p.add_argument(
        "--max-inflight-mb", type=float, default=None,
        help="fastshard's max_inflight_bytes for the remote cases, in MiB (default: its own)",
    )  # fmt: skip
    p.add_argument("--only", nargs="+", help="cases to run (fastshard-local, litdata, ...)")
    p.add_argument("--peer-python", action="append", default=[], metavar="NAME=PATH")
    p.add_argument("--quick", action="store_true", help="8 shards, one run each")
    p.add_argument("--out", help="a folder for results.json and table.md")
    p.add_argument("--simulate-ranks", type=int, metavar="W")
    p.add_argument("--scale", type=int, default=1024, help="simulated shards = shards x scale")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.quick:
        args.shards, args.repeat = min(args.shards, 8), 1
        args.timeout = min(args.timeout, 300.0)
        if args.dir == p.get_default("dir"):
            args.dir += "-quick"
    if args.simulate_ranks:
        sim = simulate(args)
        print_simulation(sim)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "simulation.json"), "w") as f:
                json.dump(sim, f, indent=1)
        return 0
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    before = fastshard_version()
    res = bench(args)
    after = fastshard_version()
    load = os.getloadavg()
    results = res["results"]
    text = [
        f"## Remote streams, {started} (load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
        f"{os.cpu_count()} CPUs)",
        "",
        before if before == after else f"{before} at the start, {after} at the end",
        "",
        f"{len(res['meta']['counts'])} tar shards, {sum(res['meta']['counts']):,} samples; "
        f"rank {RANK} of {WORLD}, batch {BATCH}; samples/s the median of {args.repeat}",
        "",
        table(results),
        "",
    ]
    for lat in sorted(set(args.latency) - {0.0}) or [0.0]:
        text += ratios(results, lat)
    for name, why in res["skipped"].items():
        text.append(f"- skipped {name}: {why}")
    wrong = [r for r in results if not r["ok"]]
    text.append(
        "- every case read what it should"
        if not wrong
        else "- WRONG or failed: " + ", ".join(f"{r['case']} k={r['workers']}" for r in wrong)
    )
    print("\n" + "\n".join(text))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({**res, "started": started, "load": load, "args": vars(args)}, f, indent=1)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write("\n".join(text) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
