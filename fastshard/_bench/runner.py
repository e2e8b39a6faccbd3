"""Plan the bench's cases (sizes, samplers, predictions from smaller runs), run each one."""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
import time
from typing import Any

from .adapters import LABELS, SAMPLERS, _rank_length
from .harness import run_case
from .units import _fmt_bytes, _fmt_n, _MiB

FULL_SIZES = (10**6, 10**7, 10**8, 10**9)
QUICK_SIZES = (10**5, 10**6)
# The core issue's memory target: peak growth while iterating an epoch of this many indices.
TARGET_MEMORY_INDICES = 25_000_000
TARGET_MEMORY_LIMIT = 64 * _MiB
# The core targets' time comparisons, also timed as interleaved pairs: (A, B, n), A first.
PAIRS = (
    (("fastshard", "iter"), ("torch", "iter"), 10**7),
    (("fastshard", "iter"), ("list", "iter"), 10**7),
    (("fastshard", "iter"), ("range", "iter"), 10**7),
    (("fastshard", "array"), ("arange", "array"), 10**9),
)
PAIR_ROUNDS = 9
# Without an earlier measurement of the same sampler, a case above this n is first measured here
# and extrapolated, so that a sampler whose memory grows with n is never started blind.
CALIBRATION_N = 10**6


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
