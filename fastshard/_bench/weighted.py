"""Weighted sampling beside torch's WeightedRandomSampler (which refuses n > 2**24)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from typing import Any

from .units import _fmt_bytes, _fmt_time

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
