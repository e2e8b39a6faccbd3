"""``python -m fastshard bench``: fastshard beside torch, torchdata and grain on one machine.

Every measurement runs in a fresh child process, so that its peak memory is its own: the child
reads ``VmHWM`` (peak resident set) from ``/proc/self/status`` after its imports and again at the
end, and reports the difference. ``ru_maxrss`` would not do: it survives fork and exec, so a
child would inherit the parent's peak.

This module imports nothing from fastshard or the peers at module level: the parent imports it
as ``fastshard._bench``, and each child loads the same file as a standalone module and imports
only what its one measurement needs (a child timing a Python list never imports torch).
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RESULT_TAG = "@@fastshard-bench@@ "
_MiB = 2**20
_GiB = 2**30

FULL_SIZES = (10**6, 10**7, 10**8, 10**9)
QUICK_SIZES = (10**5, 10**6)
# The core issue's memory target: peak growth while iterating an epoch of this many indices.
TARGET_MEMORY_INDICES = 25_000_000
TARGET_MEMORY_LIMIT = 64 * _MiB
# The core targets' time comparisons, also timed as interleaved pairs: (A, B, n), A first.
PAIRS = (
    (("fastshard", "iter"), ("torch", "iter"), 10**7),
    (("fastshard", "iter"), ("list", "iter"), 10**7),
    (("fastshard", "array"), ("arange", "array"), 10**9),
)
PAIR_ROUNDS = 9
# Without an earlier measurement of the same sampler, a case above this n is first measured here
# and extrapolated, so that a sampler whose memory grows with n is never started blind.
CALIBRATION_N = 10**6

# (key, label, modes, kind): kind "sampler" is a sampler; "floor" is a reference that bounds
# what any sampler could do (iterate a ready list; write an array of the same length).
SAMPLERS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("fastshard", "fastshard", ("iter", "array"), "sampler"),
    ("fastshard-torch", "fastshard order='torch'", ("iter", "array"), "sampler"),
    ("torch", "torch DistributedSampler", ("iter",), "sampler"),
    ("torchdata", "torchdata StatefulDistributedSampler", ("iter",), "sampler"),
    ("grain", "grain IndexSampler", ("iter",), "sampler"),
    ("list", "Python list (iteration floor)", ("iter",), "floor"),
    ("arange", "np.arange (write floor)", ("array",), "floor"),
)
LABELS = {key: label for key, label, _, _ in SAMPLERS}


# ------------------------------------------------------------------------------------------
# Child side: one measurement in a fresh process.
# ------------------------------------------------------------------------------------------
def _status_bytes(field: str, pid: str = "self") -> int:
    """A ``kB`` field of /proc/PID/status (VmHWM, VmRSS) in bytes; 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _rank_length(n: int, world: int, rank: int) -> int:
    """torch's num_samples: ceil(n / world) (every rank, padding included)."""
    del rank
    return -(-n // world)


class _Adapter:
    """One sampler of one case: builds it inside the timed region, as a training loop would."""

    length: int
    counted: int | None = None  # items an adapter counted itself, where it must (grain)

    def prepare(self) -> None:
        """Untimed setup whose memory still counts (the floor's list)."""

    def iterate(self) -> Iterator[int]:
        raise NotImplementedError

    def array(self) -> Any:
        raise NotImplementedError


class _Fastshard(_Adapter):
    def __init__(self, n: int, world: int, rank: int, order: str) -> None:
        import fastshard

        self.cls = fastshard.DistributedSampler
        self.args = (n, world, rank)
        self.order = order
        self.length = len(self.cls(*self.args, order=order))

    def iterate(self) -> Iterator[int]:
        return iter(self.cls(*self.args, seed=0, order=self.order))

    def array(self) -> Any:
        return self.cls(*self.args, seed=0, order=self.order).indices()


class _Torch(_Adapter):
    def __init__(self, n: int, world: int, rank: int, stateful: bool) -> None:
        # Imported by name: torchdata ships no type information.
        if stateful:
            module = importlib.import_module("torchdata.stateful_dataloader.sampler")
            cls = module.StatefulDistributedSampler
        else:
            cls = importlib.import_module("torch.utils.data").DistributedSampler
        self.cls = cls
        self.args = (range(n), world, rank)  # a range is Sized and costs no memory
        self.length = len(cls(*self.args))

    def iterate(self) -> Iterator[int]:
        it: Iterator[int] = iter(self.cls(*self.args, shuffle=True, seed=0))
        return it


class _Grain(_Adapter):
    """grain's IndexSampler read as grain's own loader reads it: global index r, r + W, ..."""

    def __init__(self, n: int, world: int, rank: int) -> None:
        self.gp = importlib.import_module("grain.python")
        self.n, self.world, self.rank = n, world, rank
        # ShardOptions(drop_remainder=False) splits n evenly; the first n % W shards get one more.
        self.length = n // world + (1 if rank < n % world else 0)

    def iterate(self) -> Iterator[int]:
        gp = self.gp
        options = gp.ShardOptions(
            shard_index=self.rank, shard_count=self.world, drop_remainder=False
        )
        sampler = gp.IndexSampler(
            num_records=self.n, shard_options=options, shuffle=True, num_epochs=1, seed=0
        )
        return self._walk(sampler)

    def _walk(self, sampler: Any) -> Iterator[int]:
        self.counted = 0
        index = self.rank
        while True:
            try:
                record = sampler[index]
            except IndexError:
                return
            self.counted += 1
            yield record.record_key
            index += self.world


class _ListFloor(_Adapter):
    def __init__(self, n: int, world: int, rank: int) -> None:
        self.length = _rank_length(n, world, rank)
        self.items: list[int] = []

    def prepare(self) -> None:
        self.items = list(range(self.length))

    def iterate(self) -> Iterator[int]:
        return iter(self.items)


class _ArangeFloor(_Adapter):
    def __init__(self, n: int, world: int, rank: int) -> None:
        import numpy as np

        self.np = np
        self.length = _rank_length(n, world, rank)

    def array(self) -> Any:
        return self.np.arange(self.length, dtype=self.np.int64)


def _adapter(sampler: str, n: int, world: int, rank: int) -> _Adapter:
    if sampler == "fastshard":
        return _Fastshard(n, world, rank, "feistel")
    if sampler == "fastshard-torch":
        return _Fastshard(n, world, rank, "torch")
    if sampler == "torch":
        return _Torch(n, world, rank, stateful=False)
    if sampler == "torchdata":
        return _Torch(n, world, rank, stateful=True)
    if sampler == "grain":
        return _Grain(n, world, rank)
    if sampler == "list":
        return _ListFloor(n, world, rank)
    if sampler == "arange":
        return _ArangeFloor(n, world, rank)
    raise ValueError(f"unknown sampler {sampler!r}")


def _run_once(adapter: _Adapter, mode: str, count: int) -> dict[str, Any]:
    """One timed pass: build the sampler and take `count` indices (iter) or its array."""
    length = adapter.length
    # Wall time is what a user waits; process CPU time (all threads) is kept beside it because
    # other jobs on a shared machine inflate wall time but hardly the CPU time of one thread.
    if mode == "iter":
        c0, t0 = time.process_time(), time.perf_counter()
        it = adapter.iterate()
        first = next(it, None)
        c1, t1 = time.process_time(), time.perf_counter()
        if first is not None:
            if count == length:
                for _ in it:
                    pass
            else:
                for _ in itertools.islice(it, count - 1):
                    pass
        c2, t2 = time.process_time(), time.perf_counter()
        del it
        if length and first is None:
            raise RuntimeError("the sampler yielded nothing")
        if adapter.counted is not None and count == length and adapter.counted != length:
            raise RuntimeError(f"expected {length} indices, the sampler yielded {adapter.counted}")
        return {
            "first": t1 - t0,
            "first_cpu": c1 - c0,
            "total": t2 - t0,
            "cpu": c2 - c0,
            "value": first,
        }
    if mode == "array":
        c0, t0 = time.process_time(), time.perf_counter()
        out = adapter.array()
        c2, t2 = time.process_time(), time.perf_counter()
        if len(out) != length or str(out.dtype) != "int64":
            raise RuntimeError(f"array of {len(out)} {out.dtype}, expected {length} int64")
        value = int(out[0]) if length else None
        del out
        return {"first": None, "first_cpu": None, "total": t2 - t0, "cpu": c2 - c0, "value": value}
    raise ValueError(f"unknown mode {mode!r}")


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one case in this process (the child's body): time it and read its peak memory.

    With ``mode="pair"`` it times two samplers instead, ``spec["pair"] = [[sampler, mode],
    [sampler, mode]]``, interleaved round by round (A B, then B A, ...) so that both see the
    same machine; the caller compares them round by round.
    """
    if spec["mode"] == "pair":
        return _measure_pair(spec)
    n, world, rank, mode = spec["n"], spec["world"], spec["rank"], spec["mode"]
    prefix: int | None = spec.get("prefix")
    adapter = _adapter(spec["sampler"], n, world, rank)
    length = adapter.length
    count = length if prefix is None else min(prefix, length)
    baseline = _status_bytes("VmHWM")
    adapter.prepare()
    runs: list[dict[str, Any]] = []
    began = time.perf_counter()
    for _ in range(max(1, spec["repeat"])):
        runs.append(_run_once(adapter, mode, count))
        if time.perf_counter() - began > spec.get("budget", float("inf")):
            break
    peak = _status_bytes("VmHWM")
    return {
        "length": length,
        "count": count,
        "prefix": count < length,
        "first_s": [r["first"] for r in runs if r["first"] is not None],
        "total_s": [r["total"] for r in runs],
        "first_cpu_s": [r["first_cpu"] for r in runs if r["first_cpu"] is not None],
        "cpu_s": [r["cpu"] for r in runs],
        "first_value": runs[-1]["value"],
        "baseline_bytes": baseline,
        "peak_bytes": peak,
        "growth_bytes": max(0, peak - baseline),
    }


def _measure_pair(spec: dict[str, Any]) -> dict[str, Any]:
    n, world, rank = spec["n"], spec["world"], spec["rank"]
    sides = [(_adapter(s, n, world, rank), m) for s, m in spec["pair"]]
    for adapter, _ in sides:
        adapter.prepare()
    times: list[list[dict[str, Any]]] = [[], []]
    began = time.perf_counter()
    for i in range(max(1, spec["repeat"])):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            adapter, mode = sides[side]
            times[side].append(_run_once(adapter, mode, adapter.length))
        if time.perf_counter() - began > spec.get("budget", float("inf")):
            break
    return {
        "length": sides[0][0].length,
        "total_s": [[r["total"] for r in side] for side in times],
        "cpu_s": [[r["cpu"] for r in side] for side in times],
    }


def _child_main(spec_json: str) -> None:
    """Entry point of a child: one case, one JSON line on stdout."""
    spec = json.loads(spec_json)
    try:
        result = {"ok": True, **measure(spec)}
    except BaseException as err:  # the parent reports whatever went wrong
        result = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    sys.stdout.write(_RESULT_TAG + json.dumps(result) + "\n")
    sys.stdout.flush()


# The child loads this very file as a standalone module (so `import fastshard` happens only in
# the adapters that need it) with the installed package's folder first on sys.path.
_CHILD_BOOT = """\
import importlib.util, sys
sys.path.insert(0, {root!r})
spec = importlib.util.spec_from_file_location("_fastshard_bench_child", {path!r})
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
mod._child_main(sys.argv[1])
"""


def run_case(spec: dict[str, Any], timeout: float, max_mem: int | None) -> dict[str, Any]:
    """Run one case in a fresh child process.

    A watchdog polls the child's resident set and kills it above ``max_mem`` bytes, so a wrong
    memory prediction cannot take the machine down. Returns the child's result, or
    ``{"ok": False, "error": ...}`` (timeout, memory, crash).
    """
    boot = _CHILD_BOOT.format(root=_PKG_ROOT, path=os.path.abspath(__file__))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", boot, json.dumps(spec)], stdout=out, stderr=err, text=True
        )
        began = time.monotonic()
        killed = None
        peak_rss = 0
        while proc.poll() is None:
            rss = _status_bytes("VmRSS", str(proc.pid))
            peak_rss = max(peak_rss, rss)
            if max_mem is not None and rss > max_mem:
                killed = f"killed: resident memory passed the limit of {_fmt_bytes(max_mem)}"
            elif time.monotonic() - began > timeout:
                killed = f"timeout: still running after {timeout:g} s"
            if killed:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.02)
        wall = time.monotonic() - began
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if killed:
        return {"ok": False, "error": killed, "wall_s": wall}
    for line in stdout.splitlines():
        if line.startswith(_RESULT_TAG):
            result: dict[str, Any] = json.loads(line[len(_RESULT_TAG) :])
            result["wall_s"] = wall
            return result
    tail = stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
    return {"ok": False, "error": f"child failed: {tail[0]}", "wall_s": wall}


# ------------------------------------------------------------------------------------------
# Parent side: plan the cases, run them, report.
# ------------------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def available_samplers() -> tuple[list[str], dict[str, str]]:
    """Which samplers this machine can run, and why each of the others cannot."""
    import fastshard._sampler as fs_sampler

    usable: list[str] = []
    skipped: dict[str, str] = {}
    for key, _, _, _ in SAMPLERS:
        if key == "fastshard-torch" and "torch" not in fs_sampler.ORDERS:
            skipped[key] = (
                "this fastshard has no order='torch' "
                f"(fastshard._sampler.ORDERS = {tuple(fs_sampler.ORDERS)!r})"
            )
        elif key in ("torchdata", "grain") and importlib.util.find_spec(key) is None:
            skipped[key] = f"not installed (pip install {key}, or fastshard[bench])"
        else:
            usable.append(key)
    return usable, skipped


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not found in /proc/meminfo")


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu in ("", platform.machine()):
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    mem_total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_total = int(line.split()[1]) * 1024
    except OSError:
        pass
    versions = {d: _version(d) for d in ("fastshard", "torch", "numpy", "torchdata", "grain")}
    return {
        "cpu": cpu,
        "avx512": "avx512f" in flags,
        "cores": os.cpu_count(),
        "mem_total_bytes": mem_total,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def parse_count(text: str) -> int:
    """``"1e9"``, ``"1_000_000"`` or ``"2.5e7"`` as an exact positive int."""
    try:
        value = decimal.Decimal(text.replace("_", ""))
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value != value.to_integral_value() or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(value)


def parse_bytes(text: str) -> int:
    """``"6GiB"``, ``"6G"``, ``"500MiB"`` or a plain number of bytes."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = units.get(t[-1:], 1)
    if scale != 1:
        t = t[:-1]
    try:
        return int(decimal.Decimal(t) * scale)
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r}") from None


def _sizes(text: str) -> list[int]:
    return sorted({parse_count(part) for part in text.replace(",", " ").split()})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's options."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small sizes ({', '.join(f'{n:.0e}' for n in QUICK_SIZES)}), one "
        "repeat, no core-target cases: under a minute",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        metavar="N[,N...]",
        help="dataset lengths n, e.g. '1e6,1e7' (default: 1e6,1e7,1e8,1e9)",
    )
    parser.add_argument(
        "--world",
        type=int,
        default=8,
        metavar="W",
        help="number of replicas; rank 0 is measured (default: 8)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        metavar="R",
        help="repeats per case, best kept; a case stops repeating once it has "
        "run for --budget seconds (default: 3, 1 with --quick)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds before a case is killed (default: 600)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=30.0,
        metavar="S",
        help="a sampler whose whole epoch through Python would take longer is "
        "timed on a prefix of --prefix indices (default: 30)",
    )
    parser.add_argument(
        "--prefix",
        type=parse_count,
        default=10**6,
        metavar="K",
        help="prefix length for slow samplers (default: 1e6)",
    )
    parser.add_argument(
        "--max-mem",
        type=parse_bytes,
        metavar="BYTES",
        help="skip cases predicted to need more resident memory, and kill any "
        "that pass it (default: 80%% of MemAvailable)",
    )
    parser.add_argument(
        "--only",
        metavar="NAME[,NAME...]",
        help="samplers to run: " + ", ".join(k for k, _, _, _ in SAMPLERS),
    )
    parser.add_argument(
        "--no-targets",
        action="store_true",
        help="skip the extra core-target case (memory over an epoch of 2.5e7)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="also write DIR/table.md, DIR/results.json and DIR/plot.png"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--weighted-n",
        type=parse_count,
        default=None,
        help="items of the weighted comparison with torch's WeightedRandomSampler "
        "(default 2**24, its largest n; 2**16 with --quick; 0 skips it)",
    )


class _Progress:
    """tqdm when installed, else one rewritten line on stderr."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.bar: Any = None
        if enabled and importlib.util.find_spec("tqdm") is not None:
            tqdm = importlib.import_module("tqdm").tqdm
            self.bar = tqdm(total=total, file=sys.stderr, unit="case", dynamic_ncols=True)

    def start(self, label: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=True)
        else:
            sys.stderr.write(f"\r[{self.done}/{self.total}] {label[:60]:<60}")
            sys.stderr.flush()

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write(f"\r[{self.done}/{self.total}] done{' ' * 60}\n")


def _predict(history: list[dict[str, Any]], n: int) -> dict[str, float] | None:
    """Linear extrapolation from the largest measured n below this one (same sampler, mode)."""
    below = [c for c in history if c["n"] < n]
    if not below:
        return None
    c = max(below, key=lambda c: c["n"])
    scale = n / c["n"]
    return {
        "peak_bytes": c["baseline_bytes"] + c["growth_bytes"] * scale,
        # Per index: a prefix's time says nothing of a full epoch's length, the epoch's does.
        "epoch_s": min(c["total_s"]) / c["count"] * _rank_length(n, c["world"], 0),
        "first_s": (min(c["first_s"]) if c["first_s"] else 0.0) * scale,
    }


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Plan and run every case; returns the raw results (what results.json holds)."""
    sizes = args.sizes or (list(QUICK_SIZES) if args.quick else list(FULL_SIZES))
    repeat = args.repeat or (1 if args.quick else 3)
    world = args.world
    if world < 1:
        raise SystemExit("--world must be >= 1")
    max_mem = args.max_mem if args.max_mem is not None else int(0.8 * _mem_available())
    usable, skipped = available_samplers()
    if args.only:
        wanted = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in wanted if s not in LABELS]
        if unknown:
            raise SystemExit(f"--only: unknown sampler(s) {', '.join(unknown)}")
        usable = [s for s in usable if s in wanted]
    modes = {key: m for key, _, m, _ in SAMPLERS}

    plan: list[dict[str, Any]] = [
        {"sampler": s, "mode": m, "n": n, "world": world, "rank": 0, "role": "peer"}
        for n in sizes
        for s in usable
        for m in modes[s]
    ]
    if not args.quick and not args.no_targets:
        # The core targets' time ratios, each timed once more as interleaved pairs in one
        # process: separate children run minutes apart on a shared machine, pairs do not.
        plan += [
            {
                "sampler": a,
                "mode": "pair",
                "pair": [[a, ma], [b, mb]],
                "n": n,
                "world": world,
                "rank": 0,
                "role": "target-pair",
            }
            for (a, ma), (b, mb), n in PAIRS
            if a in usable and b in usable and n in sizes
        ]
        # The memory target is one whole epoch of 2.5e7 indices (W=1); torch beside it shows
        # what the same epoch costs there.
        plan += [
            {
                "sampler": s,
                "mode": "iter",
                "n": TARGET_MEMORY_INDICES,
                "world": 1,
                "rank": 0,
                "role": "target-memory",
            }
            for s in ("fastshard", "torch")
            if s in usable
        ]

    meta = {
        "date": datetime.date.today().isoformat(),
        "command": "python -m fastshard bench " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["bench"]
        else " ".join(sys.argv),
        "machine": _machine(),
        "world": world,
        "rank": 0,
        "sizes": sizes,
        "repeat": repeat,
        "budget_s": args.budget,
        "prefix": args.prefix,
        "timeout_s": args.timeout,
        "max_mem_bytes": max_mem,
        "mem_available_bytes": _mem_available(),
        "skipped_samplers": skipped,
        "loadavg_start": list(os.getloadavg()),
        "fastshard_threads": None,
    }
    try:
        import fastshard

        meta["fastshard_threads"] = fastshard.get_num_threads()
    except ImportError:  # pragma: no cover - the CLI imports fastshard before it gets here
        pass

    cases: list[dict[str, Any]] = []
    failed: dict[str, str] = {}  # sampler -> why it stopped (an import failure, say)
    progress = _Progress(len(plan), not args.no_progress)
    began = time.monotonic()

    def history(s: str, m: str) -> list[dict[str, Any]]:
        return [c for c in cases if c["sampler"] == s and c["mode"] == m and c.get("ok")]

    def execute(case: dict[str, Any], prefix: int | None, rounds: int = repeat) -> dict[str, Any]:
        spec = {**case, "repeat": rounds, "budget": args.budget, "prefix": prefix}
        result = run_case(spec, args.timeout, max_mem)
        record = {**case, **result, "prefix_limit": prefix}
        cases.append(record)
        return record

    for case in plan:
        s, m, n = case["sampler"], case["mode"], case["n"]
        progress.start(f"{s} {m} n={_fmt_n(n)}")
        if s in failed:
            cases.append({**case, "ok": False, "skipped": True, "error": failed[s]})
            progress.advance()
            continue
        if m == "pair":
            # Both sides live in one process: add their predicted peaks (which counts the
            # baseline twice: on the safe side).
            guesses = [_predict(history(ps, pm), n) for ps, pm in case["pair"]]
            peak = sum(g["peak_bytes"] for g in guesses if g)
            if all(guesses) and peak > max_mem:
                cases.append(
                    {
                        **case,
                        "ok": False,
                        "skipped": True,
                        "error": f"skipped: predicted peak {_fmt_bytes(peak)} > limit "
                        f"{_fmt_bytes(max_mem)}",
                    }
                )
            else:
                execute(case, None, PAIR_ROUNDS)
            progress.advance()
            continue
        if not any(c["n"] < n for c in history(s, m)) and n > CALIBRATION_N:
            cal = execute({**case, "n": CALIBRATION_N, "role": "calibration"}, None)
            if not cal.get("ok"):
                failed[s] = f"calibration at n={CALIBRATION_N:.0e} failed: {cal['error']}"
        guess = _predict(history(s, m), n)
        prefix = None
        reason = failed.get(s)
        if guess is not None and reason is None:
            if guess["peak_bytes"] > max_mem:
                reason = (
                    f"skipped: predicted peak {_fmt_bytes(guess['peak_bytes'])} > "
                    f"limit {_fmt_bytes(max_mem)}"
                )
            elif (
                m == "iter"
                and guess["epoch_s"] > args.budget
                and _rank_length(n, world, 0) > args.prefix
            ):
                prefix = args.prefix
            elif m == "array" and guess["epoch_s"] > args.timeout:
                reason = f"skipped: predicted {guess['epoch_s']:.0f} s > timeout {args.timeout:g} s"
            if reason is None and guess["first_s"] > args.timeout:
                reason = f"skipped: predicted first index after {guess['first_s']:.0f} s > timeout"
        if reason is not None:
            cases.append(
                {**case, "ok": False, "skipped": True, "error": reason, "predicted": guess}
            )
        else:
            record = execute(case, prefix)
            record["predicted"] = guess
            if (
                not record.get("ok")
                and record["error"].startswith("child failed: ")
                and ("ImportError" in record["error"] or "ModuleNotFoundError" in record["error"])
            ):
                failed[s] = record["error"]
        progress.advance()
    progress.close()
    meta["loadavg_end"] = list(os.getloadavg())
    meta["elapsed_s"] = time.monotonic() - began
    return {"meta": meta, "cases": cases}


# ------------------------------------------------------------------------------------------
# Report: Markdown tables, JSON, plot.
# ------------------------------------------------------------------------------------------
def _fmt_time(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def _fmt_bytes(b: float | None) -> str:
    if b is None:
        return "—"
    if b < _GiB:
        return f"{b / _MiB:.1f} MiB"
    return f"{b / _GiB:.2f} GiB"


def _fmt_n(n: int) -> str:
    mant, exp = f"{n:.1e}".split("e")
    mant = mant.rstrip("0").rstrip(".")
    text = f"{mant}e{int(exp)}"
    return text if float(text) == n else f"{n:,}"


def _ns(case: dict[str, Any]) -> float:
    return float(min(case["total_s"]) / case["count"] * 1e9)


def _epoch_s(case: dict[str, Any]) -> float:
    """The whole rank epoch's time: measured, or per-index time times the length for a prefix."""
    return float(min(case["total_s"]) / case["count"] * case["length"])


def _find(
    cases: list[dict[str, Any]], sampler: str, mode: str, n: int, role: str = "peer"
) -> dict[str, Any] | None:
    for c in cases:
        if (c["sampler"], c["mode"], c["n"], c.get("role")) == (sampler, mode, n, role):
            return c
    return None


def render(results: dict[str, Any]) -> str:
    """The Markdown report: the peer table, then the core targets."""
    meta, cases = results["meta"], results["cases"]
    mach = meta["machine"]
    w = meta["world"]
    lines = [
        f"Rank 0 of W={w}; best of up to {meta['repeat']} runs, each case in a fresh process. "
        f"{mach['cpu']}{' (AVX-512)' if mach['avx512'] else ''}, {mach['cores']} cores, "
        f"{_fmt_bytes(mach['mem_total_bytes'])} RAM; Python {mach['python']}, "
        + ", ".join(f"{k} {v}" for k, v in mach["versions"].items() if v)
        + ".",
        (
            f"Load average {meta['loadavg_start'][0]:.2f} at the start, "
            f"{meta['loadavg_end'][0]:.2f} at the end (other jobs on the machine add noise). "
            f"Memory limit {_fmt_bytes(meta['max_mem_bytes'])}; "
            f"run time {meta['elapsed_s']:.0f} s."
        ),
        "",
        (
            "*first index*: build the sampler, `iter()`, `next()`. *iterate*: a whole rank "
            "epoch through a Python `for` loop (first index included), per index. *array*: the "
            "whole rank epoch as an int64 NumPy array (`fastshard.indices()`), per index. "
            "*peak*: growth of the child's VmHWM over its baseline after imports."
        ),
        "",
        (
            "| n | sampler | first index | iterate ns/index | iterate epoch | array ns/index "
            "| peak (iterate) | peak (array) | notes |"
        ),
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in meta["sizes"]:
        for key, label, modes, kind in SAMPLERS:
            if key in meta["skipped_samplers"]:
                continue
            it = _find(cases, key, "iter", n) if "iter" in modes else None
            ar = _find(cases, key, "array", n) if "array" in modes else None
            if it is None and ar is None:
                continue
            notes: list[str] = []
            first = ns_it = epoch = ns_ar = peak_it = peak_ar = "—"
            if it is not None:
                if it.get("ok"):
                    if kind == "sampler":
                        first = _fmt_time(min(it["first_s"]))
                    ns_it = f"{_ns(it):,.1f}"
                    epoch = _fmt_time(_epoch_s(it))
                    peak_it = _fmt_bytes(it["growth_bytes"])
                    if it["prefix"]:
                        epoch = "≈ " + epoch
                        notes.append(
                            f"iterate: a prefix of {_fmt_n(it['count'])} of "
                            f"{_fmt_n(it['length'])} indices, epoch extrapolated"
                        )
                else:
                    notes.append(f"iterate {it['error']}")
            if ar is not None:
                if ar.get("ok"):
                    ns_ar = f"{_ns(ar):,.1f}"
                    peak_ar = _fmt_bytes(ar["growth_bytes"])
                else:
                    notes.append(f"array {ar['error']}")
            elif kind == "sampler":
                notes.append("no array API")
            if key == "arange":
                notes.append("reference: writes the same number of int64")
            if key == "list":
                notes.append("reference: peak is the list itself")
            lines.append(
                f"| {_fmt_n(n)} | {label} | {first} | {ns_it} | {epoch} | {ns_ar} "
                f"| {peak_it} | {peak_ar} | {'; '.join(notes)} |"
            )
    if meta["skipped_samplers"]:
        lines.append("")
        lines.append(
            "Not run: "
            + "; ".join(f"{LABELS[k]}: {why}" for k, why in meta["skipped_samplers"].items())
            + "."
        )
    targets = render_targets(results)
    if targets:
        lines += ["", *targets]
    return "\n".join(lines) + "\n"


def _best(case: dict[str, Any] | None, key: str) -> float | None:
    values = case.get(key) if case is not None else None
    return float(min(values)) if values else None


def _median(values: list[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def core_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The core issue's targets, from this run's cases (met is None where not measured).

    Time ratios come two ways: from the separate children of the peer table (best of R each,
    wall and process CPU time), and from interleaved pairs in one child (the median of the
    per-round ratios). On a shared machine the pairs are the steadier figure, so ``met`` is
    judged on them where they ran. CPU-time ratios are given only where both sides run on one
    thread.
    """
    cases, w = results["cases"], results["meta"]["world"]
    n_big = max(results["meta"]["sizes"])
    out: list[dict[str, Any]] = []

    def ok(c: dict[str, Any] | None) -> dict[str, Any] | None:
        return c if c is not None and c.get("ok") and not c.get("prefix") else None

    def ratio(num: float | None, den: float | None) -> float | None:
        return num / den if num is not None and den else None

    def paired(
        a: tuple[str, str], b: tuple[str, str], n: int, key: str, b_over_a: bool
    ) -> tuple[float | None, int]:
        for c in cases:
            if (
                c.get("role") == "target-pair"
                and c.get("ok")
                and c["n"] == n
                and [tuple(x) for x in c["pair"]] == [a, b]
            ):
                ta, tb = c[key]
                rounds = [(y / x if b_over_a else x / y) for x, y in zip(ta, tb) if x > 0 and y > 0]
                return (_median(rounds) if rounds else None), len(rounds)
        return None, 0

    def add(
        target: str,
        goal: str,
        good: Callable[[float], bool],
        detail: str | None,
        sep: tuple[float | None, float | None],
        pair: tuple[float | None, float | None],
        rounds: int,
        missing: str,
    ) -> None:
        judged = pair[0] if pair[0] is not None else sep[0]
        out.append(
            {
                "target": target,
                "goal": goal,
                "detail": detail or missing,
                "ratio": sep[0],
                "cpu_ratio": sep[1],
                "pair_ratio": pair[0],
                "pair_cpu_ratio": pair[1],
                "pair_rounds": rounds,
                "met": None if judged is None else good(judged),
            }
        )

    fs = ok(_find(cases, "fastshard", "iter", n_big))
    tt = ok(_find(cases, "torch", "iter", 10**7))
    add(
        f"first index: fastshard at n={_fmt_n(n_big)} vs torch at n=1e7 (W={w})",
        ">= 1000x faster",
        lambda r: r >= 1000,
        f"{_fmt_time(_best(fs, 'first_s'))} vs {_fmt_time(_best(tt, 'first_s'))}"
        if fs and tt
        else None,
        (
            ratio(_best(tt, "first_s"), _best(fs, "first_s")),
            ratio(_best(tt, "first_cpu_s"), _best(fs, "first_cpu_s")),
        ),
        (None, None),
        0,
        "needs size 1e7 and a larger n",
    )

    fs = ok(_find(cases, "fastshard", "iter", 10**7))
    ls = ok(_find(cases, "list", "iter", 10**7))
    fi, ti, li = ("fastshard", "iter"), ("torch", "iter"), ("list", "iter")
    pr, k = paired(fi, ti, 10**7, "total_s", True)
    pc, _ = paired(fi, ti, 10**7, "cpu_s", True)
    add(
        f"iterate a rank epoch at n=1e7 (W={w}): fastshard vs torch",
        ">= 20x faster",
        lambda r: r >= 20,
        f"{_ns(fs):.1f} vs {_ns(tt):.1f} ns/index" if fs and tt else None,
        (
            ratio(_best(tt, "total_s"), _best(fs, "total_s")),
            ratio(_best(tt, "cpu_s"), _best(fs, "cpu_s")),
        ),
        (pr, pc),
        k,
        "needs size 1e7",
    )
    pr, k = paired(fi, li, 10**7, "total_s", False)
    pc, _ = paired(fi, li, 10**7, "cpu_s", False)
    add(
        f"iterate a rank epoch at n=1e7 (W={w}): fastshard vs a ready Python list",
        "<= 3x the list",
        lambda r: r <= 3,
        f"{_ns(fs):.1f} vs {_ns(ls):.1f} ns/index" if fs and ls else None,
        (
            ratio(_best(fs, "total_s"), _best(ls, "total_s")),
            ratio(_best(fs, "cpu_s"), _best(ls, "cpu_s")),
        ),
        (pr, pc),
        k,
        "needs size 1e7",
    )

    fa = ok(_find(cases, "fastshard", "array", 10**9))
    na = ok(_find(cases, "arange", "array", 10**9))
    threads = results["meta"].get("fastshard_threads")
    pr, k = paired(("fastshard", "array"), ("arange", "array"), 10**9, "total_s", False)
    add(
        f"indices() of a rank epoch at n=1e9 (W={w}) vs np.arange of its length",
        "<= 4x np.arange",
        lambda r: r <= 4,
        f"{_ns(fa):.2f} vs {_ns(na):.2f} ns/index ({threads} threads)" if fa and na else None,
        (ratio(_best(fa, "total_s"), _best(na, "total_s")), None),
        (pr, None),
        k,
        "needs size 1e9",
    )

    mem = ok(_find(cases, "fastshard", "iter", TARGET_MEMORY_INDICES, role="target-memory"))
    tmem = ok(_find(cases, "torch", "iter", TARGET_MEMORY_INDICES, role="target-memory"))
    detail = None
    if mem:
        detail = f"{_fmt_bytes(mem['growth_bytes'])} ({_ns(mem):.1f} ns/index)"
        if tmem:
            detail += f"; torch: {_fmt_bytes(tmem['growth_bytes'])}"
    out.append(
        {
            "target": f"peak memory growth iterating an epoch of {_fmt_n(TARGET_MEMORY_INDICES)} "
            "indices (n=2.5e7, W=1)",
            "goal": f"<= {TARGET_MEMORY_LIMIT // _MiB} MiB",
            "detail": detail or "not run (--quick or --no-targets)",
            "ratio": None,
            "cpu_ratio": None,
            "pair_ratio": None,
            "pair_cpu_ratio": None,
            "pair_rounds": 0,
            "met": None if mem is None else mem["growth_bytes"] <= TARGET_MEMORY_LIMIT,
        }
    )
    return out


def _fmt_ratio(r: float | None) -> str:
    if r is None:
        return "—"
    return f"{r:,.2f}x" if r < 100 else f"{r:,.0f}x"


def render_targets(results: dict[str, Any]) -> list[str]:
    rows = core_targets(results)
    if all(r["met"] is None for r in rows):
        return []
    lines = [
        "Core targets:",
        "",
        (
            "| target | goal | measured (separate runs, wall) | ratio: separate runs, wall "
            "(CPU time) | ratio: interleaved pairs, median wall (CPU time) | met |"
        ),
        "|---|---|---|---:|---:|---|",
    ]
    for r in rows:
        met = {True: "yes", False: "**no**", None: "not measured"}[r["met"]]
        sep = _fmt_ratio(r["ratio"])
        if r["cpu_ratio"] is not None:
            sep += f" ({_fmt_ratio(r['cpu_ratio'])})"
        pair = _fmt_ratio(r["pair_ratio"])
        if r["pair_ratio"] is not None:
            if r["pair_cpu_ratio"] is not None:
                pair += f" ({_fmt_ratio(r['pair_cpu_ratio'])})"
            pair += f", {r['pair_rounds']} rounds"
        lines.append(f"| {r['target']} | {r['goal']} | {r['detail']} | {sep} | {pair} | {met} |")
    lines += [
        "",
        (
            "*met* is judged on the interleaved pairs where they ran (both sides timed in one "
            "process, alternating, so that both see the same load), else on the separate runs."
        ),
    ]
    return lines


def plot(results: dict[str, Any], path: str) -> bool:
    """Three log-log panels against n; False when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return False
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    cases = [c for c in results["cases"] if c.get("ok") and c.get("role") == "peer"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))

    def first(c: dict[str, Any]) -> float | None:
        return min(c["first_s"]) if c["first_s"] else None

    def growth(c: dict[str, Any]) -> float:
        return max(float(c["growth_bytes"]), 4096.0)

    panels: tuple[tuple[str, Callable[[dict[str, Any]], float | None], tuple[str, ...]], ...] = (
        ("time to first index (s)", first, ("iter",)),
        ("whole rank epoch (s)", _epoch_s, ("iter", "array")),
        ("peak memory growth (bytes; 0 drawn as 4 KiB)", growth, ("iter", "array")),
    )
    # One colour and marker per sampler on every panel; indices() is the dashed line.
    style = {key: ("os^Dv<>p"[i], f"C{i}") for i, (key, _, _, _) in enumerate(SAMPLERS)}
    for ax, (title, value, modes) in zip(axes, panels):
        for key, label, _, kind in SAMPLERS:
            if kind == "floor" and title.startswith("time to first"):
                continue
            for mode in modes:
                pts = sorted(
                    (c["n"], value(c), c.get("prefix"))
                    for c in cases
                    if c["sampler"] == key and c["mode"] == mode
                )
                pts = [p for p in pts if p[1] is not None]
                if not pts:
                    continue
                name = (
                    label
                    if len(modes) == 1 or mode == "iter" or key == "arange"
                    else f"{label} indices()"
                )
                line = ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    linestyle="--" if mode == "array" else "-",
                    marker=style[key][0],
                    color=style[key][1],
                    label=name,
                )[0]
                est = [p for p in pts if p[2] and value is _epoch_s]
                if est:
                    ax.plot(
                        [p[0] for p in est],
                        [p[1] for p in est],
                        linestyle="none",
                        marker=style[key][0],
                        markersize=11,
                        markerfacecolor="none",
                        color=line.get_color(),
                    )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (dataset length)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].annotate(
        "large hollow marker: extrapolated from a prefix",
        (0.02, 0.97),
        xycoords="axes fraction",
        va="top",
        fontsize=8,
    )
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
    meta = results["meta"]
    fig.suptitle(
        f"rank 0 of W={meta['world']}: fastshard and peers "
        f"({meta['machine']['cpu']}, {meta['machine']['cores']} cores)"
    )
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------
# Weighted sampling beside torch's WeightedRandomSampler (which refuses n > 2**24).
# ------------------------------------------------------------------------------------------
_WEIGHTED_CHILD = r"""
import json, sys, time
import numpy as np
import torch
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'):
            return int(line.split()[1]) * 1024
kind, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
w = np.random.default_rng(0).random(n) + 0.1
weights = torch.from_numpy(w) if kind == 'torch' else w
import fastshard
base = hwm()
t0 = time.perf_counter()
if kind == 'torch':
    g = torch.Generator().manual_seed(0)
    s = torch.utils.data.WeightedRandomSampler(weights, n, replacement=True, generator=g)
else:
    s = fastshard.WeightedDistributedSampler(weights, n, num_replicas=1, rank=0)
if mode == 'array':
    out = s.indices(); count = len(out)
    first = time.perf_counter() - t0
else:
    it = iter(s); next(it)
    first = time.perf_counter() - t0
    count = 1 + sum(1 for _ in it)
total = time.perf_counter() - t0
print(json.dumps({"first_s": first, "epoch_s": total, "count": count, "peak": hwm() - base}))
"""


def run_weighted(n: int, repeat: int, timeout: float) -> list[dict[str, Any]]:
    """fastshard's WeightedDistributedSampler and torch's WeightedRandomSampler (W = 1, one
    epoch of n draws with replacement), each case the best of `repeat` fresh processes."""
    rows = []
    for kind, mode in (("fastshard", "iter"), ("fastshard", "array"), ("torch", "iter")):
        best: dict[str, Any] | None = None
        for _ in range(max(1, repeat)):
            proc = subprocess.run(
                [sys.executable, "-c", _WEIGHTED_CHILD, kind, str(n), mode],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=tempfile.gettempdir(),
            )
            if proc.returncode != 0:
                best = {"error": proc.stderr.strip().splitlines()[-1:]}
                break
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            if best is None or r["epoch_s"] < best["epoch_s"]:
                best = r
        rows.append({"sampler": kind, "mode": mode, "n": n, **(best or {})})
    return rows


def render_weighted(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    n = rows[0]["n"]
    lines = [
        "",
        f"Weighted sampling, n = {n:,} items, one epoch of n draws with replacement, W = 1 "
        "(torch's WeightedRandomSampler refuses more than 2**24 items):",
        "",
        "| sampler | read as | first index | epoch | ns/draw | peak |",
        "|---|---|---:|---:|---:|---:|",
    ]
    labels = {
        "fastshard": "fastshard WeightedDistributedSampler",
        "torch": "torch WeightedRandomSampler",
    }
    for r in rows:
        how = "indices() array" if r["mode"] == "array" else "Python iteration"
        if "error" in r:
            lines.append(f"| {labels[r['sampler']]} | {how} | failed: {r['error']} | | | |")
            continue
        lines.append(
            f"| {labels[r['sampler']]} | {how} | {_fmt_time(r['first_s'])} | {_fmt_time(r['epoch_s'])} | "
            f"{r['epoch_s'] / r['count'] * 1e9:.1f} | {_fmt_bytes(r['peak'])} |"
        )
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    """``python -m fastshard bench``."""
    results = run_bench(args)
    wn = args.weighted_n if args.weighted_n is not None else (2**16 if args.quick else 2**24)
    if wn > 0:
        results["weighted"] = run_weighted(
            wn, args.repeat or (1 if args.quick else 3), args.timeout
        )
    table = render(results) + render_weighted(results.get("weighted", []))
    sys.stdout.write(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
            f.write(table)
        with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
        if not plot(results, os.path.join(args.out, "plot.png")):
            sys.stderr.write("matplotlib is not installed: no plot.png (pip install matplotlib)\n")
    return 0
