"""Weighted sampling targets, side by side in one fresh process per size.

    python bench/weighted.py [--n 1e8] [--repeat 3]

Table build vs `weights.sum()` and vs the write floor (filling a fresh array of the
table's size, 8 bytes per item: the kernel must zero every new page, which no build
avoids); draws through indices() vs NumPy's random gather `arr[idx]` of the same count;
and at n = 1e5 (table in cache) draws vs the default order's indices(). Run it outside the
source tree's root (or with the package installed) so `import fastshard` is the build.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
import fastshard
from fastshard import _core
n, repeat = int(float(sys.argv[1])), int(sys.argv[2])
rng = np.random.default_rng(0)
w = rng.random(n)
out = {"n": n}
def best(f):
    ts = []
    for _ in range(repeat):
        t = time.perf_counter(); r = f(); ts.append(time.perf_counter() - t); del r
    return min(ts)
out["sum_s"] = best(lambda: w.sum())
summary = _core.summarize_weights(w)
# First touches of fresh memory, each first in this process: the table and the floor.
t = time.perf_counter(); first = _core.AliasTable(w, summary[1]); out["table_first_s"] = time.perf_counter() - t
del first
t = time.perf_counter(); first = np.ones(n, dtype=np.int64); out["fresh_write_first_s"] = time.perf_counter() - t
del first
out["summary_s"] = best(lambda: _core.summarize_weights(w))
out["table_s"] = best(lambda: _core.AliasTable(w, summary[1]))
draws = min(n, 10**7)
s = fastshard.WeightedDistributedSampler(w, num_samples=draws, num_replicas=1, rank=0)
out["draws"] = draws
out["indices_s"] = best(lambda: s.indices())
arr = np.arange(n, dtype=np.int64)
idx = rng.integers(0, n, draws)
out["gather_s"] = best(lambda: arr[idx])
d = fastshard.DistributedSampler(draws, 1, 0)
out["default_order_indices_s"] = best(lambda: d.indices())
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=float, nargs="+", default=[1e5, 1e8])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(
        "| n | sum | summary (check+checksum) | table (best) | table+summary / sum | table, first call | fresh write, first call | first table / first write | draws | indices() ns/draw | NumPy gather ns/draw | ratio | default order ns/index |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.n:
        res = subprocess.run(
            [sys.executable, "-c", CHILD, str(n), str(args.repeat)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(res.stdout)
        per = 1e9 / r["draws"]
        print(
            f"| {n:.0e} | {r['sum_s'] * 1e3:.1f} ms | {r['summary_s'] * 1e3:.1f} ms | {r['table_s'] * 1e3:.1f} ms | "
            f"{(r['table_s'] + r['summary_s']) / r['sum_s']:.1f}x | {r['table_first_s'] * 1e3:.1f} ms | "
            f"{r['fresh_write_first_s'] * 1e3:.1f} ms | {r['table_first_s'] / r['fresh_write_first_s']:.1f}x | {r['draws']:.0e} | {r['indices_s'] * per:.1f} | "
            f"{r['gather_s'] * per:.1f} | {r['indices_s'] / r['gather_s']:.2f}x | {r['default_order_indices_s'] * per:.1f} |"
        )


if __name__ == "__main__":
    main()
