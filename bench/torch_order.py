"""order="torch" against torch itself: time to the first index and peak memory.

Every measurement runs in a fresh interpreter that first imports numpy, torch and fastshard
(the baseline), resets its peak-RSS counter (``/proc/self/clear_refs``), then builds one of

  torch_sampler       torch.utils.data.distributed.DistributedSampler, next(iter(s))
  fastshard_sampler   fastshard.DistributedSampler(order="torch"), next(iter(s))
  torch_randperm      torch.randperm(n, generator=manual_seed(seed))
  fastshard_randperm  fastshard._core.torch_randperm(n, seed) (int64 NumPy array out, as torch)

and reports wall and CPU time of that step and VmHWM - VmRSS(baseline) from /proc/self/status.
Each child then hashes the full sequence it produced, so the table also shows that fastshard
and torch agree. Linux only.

    python bench/torch_order.py --n 2e7 1e8 --world-size 8 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics

from _child import child_json

CHILD = r"""
import hashlib, itertools, json, sys, time
import numpy as np
import torch
import fastshard
from fastshard import _core
from torch.utils.data.distributed import DistributedSampler as TorchSampler

kind, n, W, rank, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current RSS
base = status("VmRSS")
w0, c0 = time.perf_counter(), time.process_time()
if kind == "torch_sampler":
    s = TorchSampler(range(n), num_replicas=W, rank=rank, seed=seed)
    it = iter(s)
    first = next(it)
elif kind == "fastshard_sampler":
    s = fastshard.DistributedSampler(n, W, rank, seed=seed, order="torch")
    it = iter(s)
    first = next(it)
elif kind == "torch_randperm":
    g = torch.Generator()
    g.manual_seed(seed)
    p = torch.randperm(n, generator=g)
elif kind == "fastshard_randperm":
    p = _core.torch_randperm(n, seed)
else:
    raise ValueError(kind)
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
peak = status("VmHWM") - base
if kind.endswith("sampler"):
    arr = np.fromiter(itertools.chain([first], it), dtype=np.int64, count=len(s))
else:
    arr = np.asarray(p)
digest = hashlib.sha1(arr.tobytes()).hexdigest()[:12]
print(json.dumps(dict(kind=kind, n=n, wall=wall, cpu=cpu, peak=peak, base=base, digest=digest)))
"""

KINDS = ("torch_sampler", "fastshard_sampler", "torch_randperm", "fastshard_randperm")


def run(kind: str, n: int, W: int, rank: int, seed: int) -> dict:
    return child_json(CHILD, kind, str(n), str(W), str(rank), str(seed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=float, nargs="+", default=[2e7, 1e8])
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    args = ap.parse_args()

    print(
        "| n | what | wall s (min / median) | CPU s (min) | peak MB above baseline (max) | sha1 |"
    )
    print("|---|---|---|---|---|---|")
    for n in map(int, args.n):
        best = {}
        # Interleaved repeats, so that a burst of load on a shared machine hits all kinds.
        results: dict[str, list[dict]] = {k: [] for k in args.kinds}
        for _ in range(args.repeat):
            for kind in args.kinds:
                results[kind].append(run(kind, n, args.world_size, args.rank, args.seed))
        for kind in args.kinds:
            rs = results[kind]
            digests = {r["digest"] for r in rs}
            assert len(digests) == 1, (kind, digests)
            walls = [r["wall"] for r in rs]
            best[kind] = {
                "wall": min(walls),
                "median": statistics.median(walls),
                "cpu": min(r["cpu"] for r in rs),
                "peak": max(r["peak"] for r in rs),
            }
            print(
                f"| {n:,} | {kind} | {min(walls):.3f} / {statistics.median(walls):.3f} "
                f"| {best[kind]['cpu']:.3f} | {best[kind]['peak'] / 1e6:.0f} "
                f"| {rs[0]['digest']} |",
                flush=True,
            )
        for a, b in (
            ("torch_sampler", "fastshard_sampler"),
            ("torch_randperm", "fastshard_randperm"),
        ):
            if a in best and b in best:
                print(
                    f"|  | {b} vs {a} | {best[a]['wall'] / best[b]['wall']:.1f}x / "
                    f"{best[a]['median'] / best[b]['median']:.1f}x faster "
                    f"| {best[a]['cpu'] / best[b]['cpu']:.1f}x | "
                    f"{best[b]['peak'] / best[a]['peak']:.3f} of the memory |  |",
                    flush=True,
                )
            if a in results and b in results:
                assert results[a][0]["digest"] == results[b][0]["digest"], (a, b, n)


if __name__ == "__main__":
    main()
