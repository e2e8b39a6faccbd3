"""Weighted sampling targets, side by side in fresh processes.

    python bench/weighted.py [--n 1e5 1e8] [--repeat 5]

- What a user pays, the whole constructor `WeightedDistributedSampler(w)` (validation, sum,
  checksum and table, one C++ call), vs `weights.sum()` on the same float64 array, called in
  turn round after round: the median of the rounds' ratios (the issue-19 target: <= 5x). Beside
  them the validation pass alone (`summarize_weights`), the table with its own summary
  (`AliasTable(w)`), and the floor of any build, one read of the weights (the sum) plus one
  write of a table-sized array (8 bytes per item); best of `repeat` rounds after one.
- First calls: allocating fresh memory costs page faults, and on a virtual machine the
  first touch of memory the host has not backed yet can cost seconds, so the constructor's
  first call is compared with a first write of the same size made by another fresh process in
  the same state (each creates the weights first, then does only that one thing).
- Draws through indices() vs NumPy's random gather `arr[idx]` of the same count and vs the
  default order's indices() (the target at n = 1e5, where the table is in cache), called in
  turn, best of 8 rounds after 2: on this VM the same call swings between about 6 and 20 ns
  per draw from one call to the next (host-side memory effects, not time since the build),
  so only calls made side by side are compared.

Run it outside the source tree's root (or with the package installed) so that
`import fastshard` is the build.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import numpy as np
import fastshard
from fastshard import _core
n, repeat, first = int(float(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
w = rng.random(n)
out = {"n": n}
if first == "table":
    t = time.perf_counter()
    x = fastshard.WeightedDistributedSampler(w, num_replicas=1, rank=0)
    out["first_s"] = time.perf_counter() - t
    print(json.dumps(out)); sys.exit()
if first == "write":
    t = time.perf_counter(); x = np.ones(n, dtype=np.int64); out["first_s"] = time.perf_counter() - t
    print(json.dumps(out)); sys.exit()
def side_by_side(fs, rounds, warmup=2):
    # Calls the functions in turn, round after round, so that all see the machine in the same
    # states; the best of each after `warmup` rounds, and each round's times.
    ts = {key: [] for key in fs}
    for _ in range(warmup + rounds):
        for key, f in fs.items():
            t = time.perf_counter(); r = f(); ts[key].append(time.perf_counter() - t); del r
    out.update({key: min(v[warmup:]) for key, v in ts.items()})
    return {key: v[warmup:] for key, v in ts.items()}
rounds = side_by_side({
    "sum_s": lambda: w.sum(),
    "ctor_s": lambda: fastshard.WeightedDistributedSampler(w, num_replicas=1, rank=0),
    "summary_s": lambda: _core.summarize_weights(w),
    "table_s": lambda: _core.AliasTable(w),
    "write_s": lambda: np.ones(n, dtype=np.int64),
}, repeat, warmup=1)
out["ctor_ratio_median"] = statistics.median(c / s for c, s in zip(rounds["ctor_s"], rounds["sum_s"]))
draws = min(n, 10**7)
s = fastshard.WeightedDistributedSampler(w, num_samples=draws, num_replicas=1, rank=0)
out["draws"] = draws
arr = np.arange(n, dtype=np.int64)
idx = rng.integers(0, n, draws)
d = fastshard.DistributedSampler(draws, 1, 0)
side_by_side({
    "indices_s": s.indices,
    "gather_s": lambda: arr[idx],
    "default_order_indices_s": d.indices,
}, 8)
print(json.dumps(out))
"""


def child(n: float, repeat: int, first: str) -> dict:
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(repeat), first],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=float, nargs="+", default=[1e5, 1e8])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--first-calls", type=int, default=3, help="fresh processes per first-call column"
    )
    args = ap.parse_args()
    print(
        "| n | sum | write (fresh) | summary | table (best) | constructor (best) "
        "| constructor / sum (median of rounds) | table / (sum + write) "
        "| constructor, first call (median) | write, first call (median) "
        "| draws | indices() ns/draw | NumPy gather ns/draw | ratio | default order ns/index |"
    )
    print("|---:" * 15 + "|")
    for n in args.n:
        r = child(n, args.repeat, "all")
        # Alternate the two first-call children so that both see the machine in the same state.
        firsts: dict[str, list[float]] = {"table": [], "write": []}
        for _ in range(args.first_calls):
            for kind in firsts:
                firsts[kind].append(child(n, 1, kind)["first_s"])
        ft, fw = statistics.median(firsts["table"]), statistics.median(firsts["write"])
        per = 1e9 / r["draws"]
        ms = 1e3
        print(
            f"| {n:.0e} | {r['sum_s'] * ms:.1f} ms | {r['write_s'] * ms:.1f} ms | {r['summary_s'] * ms:.1f} ms "
            f"| {r['table_s'] * ms:.1f} ms | {r['ctor_s'] * ms:.1f} ms "
            f"| {r['ctor_ratio_median']:.1f}x "
            f"| {r['table_s'] / (r['sum_s'] + r['write_s']):.1f}x "
            f"| {ft * ms:.0f} ms | {fw * ms:.0f} ms | {r['draws']:.0e} "
            f"| {r['indices_s'] * per:.1f} | {r['gather_s'] * per:.1f} | {r['indices_s'] / r['gather_s']:.2f}x "
            f"| {r['default_order_indices_s'] * per:.1f} |"
        )


if __name__ == "__main__":
    main()
