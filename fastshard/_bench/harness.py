"""The child-process harness: every measurement runs in a fresh process.

The child reads ``VmHWM`` (peak resident set) from ``/proc/self/status`` after its imports and
again at the end, and reports the difference, so that its peak memory is its own. ``ru_maxrss``
would not do: it survives fork and exec, so a child would inherit the parent's peak.

The child loads this subpackage's folder as a standalone package (``_fastshard_bench_child``)
without running ``fastshard/__init__.py`` or this package's ``__init__``, and imports only
what its one measurement needs.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from .adapters import _Adapter, _adapter
from .units import _fmt_bytes

_HERE = os.path.dirname(os.path.abspath(__file__))
# The folder that holds the installed ``fastshard`` package: first on the child's sys.path.
_PKG_ROOT = os.path.dirname(os.path.dirname(_HERE))
_CHILD_PACKAGE = "_fastshard_bench_child"
_RESULT_TAG = "@@fastshard-bench@@ "


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
    if spec["mode"] not in ("iter", "array"):
        # The mixture cases (blended index, torchdata, MixtureSampler) have bodies of their own;
        # imported here only, since that module starts children through this one.
        from . import mixture

        return mixture.measure(spec)
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


# The child loads this folder as a standalone package whose __init__ is never run (so that
# `import fastshard` happens only in the adapters that need it), with the installed package's
# folder first on sys.path, then imports this module from it.
_CHILD_BOOT = """\
import importlib, importlib.util, sys
sys.path.insert(0, {root!r})
spec = importlib.util.spec_from_file_location(
    {name!r}, {init!r}, submodule_search_locations=[{here!r}]
)
sys.modules[spec.name] = importlib.util.module_from_spec(spec)
importlib.import_module({name!r} + ".harness")._child_main(sys.argv[1])
"""


def run_case(spec: dict[str, Any], timeout: float, max_mem: int | None) -> dict[str, Any]:
    """Run one case in a fresh child process.

    A watchdog polls the child's resident set and kills it above ``max_mem`` bytes, so a wrong
    memory prediction cannot take the machine down. Returns the child's result, or
    ``{"ok": False, "error": ...}`` (timeout, memory, crash).
    """
    boot = _CHILD_BOOT.format(
        root=_PKG_ROOT,
        name=_CHILD_PACKAGE,
        init=os.path.join(_HERE, "__init__.py"),
        here=_HERE,
    )
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
