"""Two builds of fastshard, timed in one run: the same cases, alternating between the builds.

    python bench/investigations/wheel_speed.py NAME=PYTHON NAME=PYTHON [--rounds 5]

Each PYTHON is an interpreter whose environment holds one build (e.g. the zig-built
manylinux_2_28 wheel and the machine's GCC build). Every measurement runs in a fresh process,
rounds alternate between the builds so that load on the machine hits both alike, and each case
reports the best round. Cases (rank 0 of W = 8, the default order unless named):
  indices   sampler.indices(): a whole rank epoch of n = 10^8 as a NumPy array, ns per index
  iterate   a Python for loop over a rank epoch of n = 8 * 10^6, ns per index
  torch     order="torch", n = 2 * 10^7: build the epoch and take the first index, seconds
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/_child.py
from _child import child_json

CHILD = r"""
import json, time
import fastshard
out = {"file": fastshard.__file__}
s = fastshard.DistributedSampler(10**8, 8, 0)
t = time.perf_counter(); a = s.indices(); dt = time.perf_counter() - t
out["indices"] = dt / len(a) * 1e9
s = fastshard.DistributedSampler(8 * 10**6, 8, 0)
t = time.perf_counter()
for i in s:
    pass
out["iterate"] = (time.perf_counter() - t) / len(s) * 1e9
t = time.perf_counter()
s = fastshard.DistributedSampler(2 * 10**7, 8, 0, order="torch")
next(iter(s))
out["torch"] = time.perf_counter() - t
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs=2, metavar="NAME=PYTHON")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    builds = dict(b.split("=", 1) for b in args.builds)
    best: dict[str, dict[str, float]] = {name: {} for name in builds}
    for _ in range(args.rounds):
        for name, python in builds.items():
            got = child_json(CHILD, python=python)
            print(name, got)
            for case, value in got.items():
                if case != "file":
                    best[name][case] = min(best[name].get(case, float("inf")), value)
    a, b = builds
    print(f"\nbest of {args.rounds} | {a} | {b} | {a}/{b}")
    units = {"indices": "ns/index", "iterate": "ns/index", "torch": "s"}
    for case, unit in units.items():
        x, y = best[a][case], best[b][case]
        print(f"{case} ({unit}) | {x:.3g} | {y:.3g} | {x / y:.2f}")


if __name__ == "__main__":
    main()
