"""Cost of the rank-consistency guard: one check per iteration of the sampler.

    torchrun --nproc_per_node=2 bench/dist_guard.py [--calls 5000]

Times, on every rank, `iter(sampler)` with the check on and off and a bare all_gather of the
same 9 int64s, each call separately and the three interleaved; rank 0 prints the median and the 90th/99th percentiles.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import fastshard
from fastshard import _distributed


def timed(fn, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--n", type=int, default=10**9)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    on = fastshard.DistributedSampler(args.n)
    off = fastshard.DistributedSampler(args.n, check_consistency=False)
    t = torch.zeros(_distributed.WIDTH, dtype=torch.int64)
    bufs = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    cases = {
        "iter(sampler), check on": lambda: iter(on),
        "iter(sampler), check off": lambda: iter(off),
        "bare all_gather of 9 int64": lambda: dist.all_gather(bufs, t),
    }
    for fn in cases.values():  # warm-up: first connections, allocations
        timed(fn, 200)
    # Interleaved, so that load from elsewhere on the machine falls on every case alike.
    results: dict[str, list[float]] = {name: [] for name in cases}
    dist.barrier()
    for _ in range(args.calls):
        for name, fn in cases.items():
            results[name] += timed(fn, 1)
    if dist.get_rank() == 0:
        print(
            f"{dist.get_world_size()} ranks, backend {dist.get_backend()}, {args.calls} calls each (µs)"
        )
        for name, xs in results.items():
            q = statistics.quantiles(xs, n=100)
            print(
                f"  {name:28s} min {min(xs):7.1f}  median {statistics.median(xs):7.1f}  "
                f"p90 {q[89]:7.1f}  p99 {q[98]:7.1f}"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
