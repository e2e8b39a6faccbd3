"""Builds of fastshard timed by CPU time, interleaved: indices() on 1 and 2 threads.

    python bench/investigations/wheel_cpu.py NAME=PYTHON [NAME=PYTHON ...] [--rounds 5]

Complements bench/investigations/wheel_speed.py (wall time, one call per process) on a shared, noisy machine:
CPU time (time.process_time) is less sensitive to other jobs than wall time. Each round starts
one fresh process per build, in turn; each process times rank 0 of W = 8 at n = 10^8 and 10^9,
with set_num_threads(1) and (2), best of 3 calls. Reports per case and build the minimum over
rounds of CPU and wall ns per index, and the sorted CPU times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/_child.py
from _child import child_json

CHILD = r"""
import json, time, fastshard
out = {}
for th in (1, 2):
    fastshard.set_num_threads(th)
    for n in (10**8, 10**9):
        s = fastshard.DistributedSampler(n, 8, 0)
        bc = bw = float("inf")
        for _ in range(3):
            c = time.process_time(); w = time.perf_counter(); a = s.indices()
            bw = min(bw, (time.perf_counter() - w) / len(a) * 1e9)
            bc = min(bc, (time.process_time() - c) / len(a) * 1e9)
            del a
        out[f"threads={th} n=1e{len(str(n)) - 1}"] = (bc, bw)
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+", metavar="NAME=PYTHON")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    builds = dict(b.split("=", 1) for b in args.builds)
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for name, python in builds.items():
            for case, value in child_json(CHILD, python=python).items():
                got.setdefault((case, name), []).append(tuple(value))
    print(f"best of {args.rounds} rounds (ns per index) | CPU | wall | all CPU, sorted")
    for (case, name), v in sorted(got.items()):
        cpu = sorted(x[0] for x in v)
        print(
            f"{case} {name} | {cpu[0]:.2f} | {min(x[1] for x in v):.2f} | "
            + " ".join(f"{c:.2f}" for c in cpu)
        )


if __name__ == "__main__":
    main()
