"""The portable wheel beside a -march=native build, in one run, interleaved.

    python bench/investigations/portable_native.py PYTHON_PORTABLE PYTHON_NATIVE [--rounds 5]

Each PYTHON is an interpreter (a venv) with one build of fastshard installed. Every round runs
one fresh child per build, in alternating order, and each child times, best of 3:
indices() of rank 0's whole epoch at n=1e9, W=8 (1.25e8 int64, default threads); iterating
rank 0's epoch at n=1e7, W=8 in a Python for loop (1.25e6 ints); and np.arange of 1.25e8
int64 (the write floor). Prints the per-round numbers and the medians over rounds in ns/index.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/_child.py
from _child import child_json

CHILD = r"""
import json, time
import numpy as np
import fastshard

def best(fn, k=3):
    out = []
    for _ in range(k):
        t = time.perf_counter(); r = fn(); out.append(time.perf_counter() - t); del r
    return min(out)

big = fastshard.DistributedSampler(10**9, num_replicas=8, rank=0)
a = big.indices()
assert a.shape == (125_000_000,) and int(a.min()) >= 0 and int(a.max()) < 10**9
assert len(np.unique(a[:1_000_000])) == 1_000_000
del a
small = fastshard.DistributedSampler(10**7, num_replicas=8, rank=0)
def iterate():
    c = 0
    for _ in small:
        c += 1
    assert c == 1_250_000
res = {
    "indices_1e9": best(big.indices) / 125_000_000 * 1e9,
    "iterate_1e7": best(iterate) / 1_250_000 * 1e9,
    "arange": best(lambda: np.arange(125_000_000, dtype=np.int64)) / 125_000_000 * 1e9,
    "threads": fastshard.get_num_threads(),
}
print(json.dumps(res))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("portable")
    ap.add_argument("native")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    builds = {"portable": args.portable, "native": args.native}
    results: dict[str, list[dict[str, float]]] = {b: [] for b in builds}
    for r in range(args.rounds):
        order = list(builds) if r % 2 == 0 else list(builds)[::-1]
        for b in order:
            res = child_json(CHILD, python=builds[b])
            results[b].append(res)
            print(
                f"round {r} {b:8s} " + "  ".join(f"{k} {v:.2f}" for k, v in res.items()), flush=True
            )
    print("\npaired per round, portable / native (median, min-max):")
    for k in ("indices_1e9", "iterate_1e7", "arange"):
        ratios = [p[k] / n[k] for p, n in zip(results["portable"], results["native"])]
        print(f"  {k:12s} {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    print("\nmedian over rounds, ns/index:")
    for b, rows in results.items():
        med = {
            k: statistics.median(row[k] for row in rows)
            for k in ("indices_1e9", "iterate_1e7", "arange")
        }
        print(f"{b:8s} " + "  ".join(f"{k} {v:.2f}" for k, v in med.items()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
