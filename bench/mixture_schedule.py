"""Mixture weights that change over training (issue 27), side by side in one process.

    python bench/mixture_schedule.py [--n 1e8] [--world-size 8] [--points 100] [--rounds 7]
                                     [--threads 0]

- indices() of rank 0's epoch: a MixtureSampler with fixed weights, and one with a schedule of
  `--points` points (ramps between random positive weights over ten epochs; the epoch measured
  lies inside them), called in turn round after round on the same three datasets; each
  round's ratio schedule / fixed, the median of the rounds (the target: <= 1.2). Both use every
  core (GIL released, threaded fills). The schedule's extra cost is one exact integral per
  window boundary (O(k) 128-bit divisions, a few per window of about a thousand draws).
- The first draw at 10^10 items with the same schedule, construction included, in a fresh
  process (median of `--rounds` processes), and rank 3 of 8 at epoch 5.

Run it outside the source tree's root (or with the package installed) so that
`import fastshard` is the build.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

SIZES_1E10 = [6 * 10**9, 3 * 10**9, 10**9]


def schedule(points: int, total_draws: int, k: int, seed: int = 0) -> list[tuple[int, list[int]]]:
    """`points` points spread over `total_draws` global draws, ramps between positive weights."""
    rng = random.Random(seed)
    step = total_draws // points
    return [(i * step, [rng.randint(1, 9) for _ in range(k)]) for i in range(points)]


def split(n: int) -> list[int]:
    return [n * 6 // 10, n * 3 // 10, n - n * 6 // 10 - n * 3 // 10]


def indices_rounds(n: int, world: int, points: int, rounds: int) -> dict[str, object]:
    import fastshard

    sizes = split(n)
    fixed = fastshard.MixtureSampler(sizes, [5, 3, 2], num_replicas=world, rank=0, seed=1)
    sched = fastshard.MixtureSampler(
        sizes,
        schedule=schedule(points, 10 * n, 3),
        num_replicas=world,
        rank=0,
        seed=1,
    )
    for s in (fixed, sched):
        s.set_epoch(4)  # inside the schedule's ramps
        s.indices(0, 1000)  # warm up
    # Wall time, and CPU time over all threads (less swayed by other processes on a shared
    # machine); each round calls both kinds back to back, in alternating order.
    wall: dict[str, list[float]] = {"fixed": [], "schedule": []}
    cpu: dict[str, list[float]] = {"fixed": [], "schedule": []}
    ratios, cpu_ratios = [], []
    kinds = [("fixed", fixed), ("schedule", sched)]
    for r in range(rounds):
        row, cpu_row = {}, {}
        for name, s in kinds if r % 2 == 0 else kinds[::-1]:
            c0, t0 = time.process_time(), time.perf_counter()
            out = s.indices()
            row[name], cpu_row[name] = time.perf_counter() - t0, time.process_time() - c0
            assert len(out) == len(s)
            wall[name].append(row[name])
            cpu[name].append(cpu_row[name])
        ratios.append(row["schedule"] / row["fixed"])
        cpu_ratios.append(cpu_row["schedule"] / cpu_row["fixed"])
    draws = len(fixed)
    return {
        "n": n,
        "world_size": world,
        "points": points,
        "threads": fastshard.get_num_threads(),
        "draws_per_rank": draws,
        "fixed_wall_ns_per_draw_min": min(wall["fixed"]) / draws * 1e9,
        "schedule_wall_ns_per_draw_min": min(wall["schedule"]) / draws * 1e9,
        "wall_ratio_median": statistics.median(ratios),
        "wall_ratio_min_max": [min(ratios), max(ratios)],
        "fixed_cpu_ns_per_draw_min": min(cpu["fixed"]) / draws * 1e9,
        "schedule_cpu_ns_per_draw_min": min(cpu["schedule"]) / draws * 1e9,
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "cpu_ratio_min_max": [min(cpu_ratios), max(cpu_ratios)],
    }


CHILD = """
import time, json, sys
t0 = time.perf_counter()
import fastshard
sys.path.insert(0, {bench!r})
from mixture_schedule import schedule, SIZES_1E10
t1 = time.perf_counter()
s = fastshard.MixtureSampler(SIZES_1E10, schedule=schedule({points}, 10**11, 3), num_replicas=8, rank=3, seed=1)
s.set_epoch(5)
tc = time.perf_counter()
x = s[0]
t2 = time.perf_counter()
y = s[len(s) - 1]
t3 = time.perf_counter()
print(json.dumps({{"first_us": (t2 - t1) * 1e6, "construct_us": (tc - t1) * 1e6,
                   "index_us": (t2 - tc) * 1e6, "last_us": (t3 - t2) * 1e6, "first": int(x)}}))
"""


def first_draw(points: int, rounds: int) -> dict[str, object]:
    import os

    bench = os.path.dirname(os.path.abspath(__file__))
    runs = []
    for _ in range(rounds):
        out = subprocess.run(
            [sys.executable, "-c", CHILD.format(bench=bench, points=points)],
            check=True,
            capture_output=True,
            text=True,
        )
        runs.append(json.loads(out.stdout))
    return {
        "items": 10**10,
        "points": points,
        "first_us_median": statistics.median(r["first_us"] for r in runs),
        "first_us_min": min(r["first_us"] for r in runs),
        "construct_us_median": statistics.median(r["construct_us"] for r in runs),
        "first_index_us_median": statistics.median(r["index_us"] for r in runs),
        "last_index_us_median": statistics.median(r["last_us"] for r in runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, default=1e8)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="fill threads (0: fastshard's default)")
    args = ap.parse_args()
    if args.threads:
        import fastshard

        fastshard.set_num_threads(args.threads)
    result = {
        "indices": indices_rounds(int(args.n), args.world_size, args.points, args.rounds),
        "first_draw": first_draw(args.points, args.rounds),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
