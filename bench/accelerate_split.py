"""What the documented way under accelerate costs: one rank's epoch of batches.

accelerate splits every DataLoader it prepares by batches (``BatchSamplerShard``), so with
fastshard the sampler is one global order (``num_replicas=1``) and every rank walks all of
it, keeping every W-th batch. This measures one rank's epoch of batch indices (no data):

  global_torch_bs   global order, torch's BatchSampler, under BatchSamplerShard (W processes)
  global_fs_bs      global order, fastshard.BatchSampler, under BatchSamplerShard
  shard_fs_bs       the rank's own shard (num_replicas=W), fastshard.BatchSampler, no accelerate:
                    what a rank would pay if nothing split the loader again
  floor             np.arange of the rank's n/W indices (writing the same int64s)

Sides run in turn, round by round, in one process; the table gives the median per side and
each side's ratio to ``shard_fs_bs``.

    python bench/accelerate_split.py --n 1e7 --world-size 2 8 --batch-size 32 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import BatchSampler as TorchBatchSampler

import fastshard


def sides(n: int, w: int, b: int) -> dict[str, Callable[[], int]]:
    def global_torch() -> int:
        s = fastshard.DistributedSampler(n, 1, 0, seed=1)
        shard = BatchSamplerShard(TorchBatchSampler(s, b, False), num_processes=w, process_index=0)
        return sum(len(x) for x in shard)

    def global_fs() -> int:
        s = fastshard.DistributedSampler(n, 1, 0, seed=1)
        shard = BatchSamplerShard(fastshard.BatchSampler(s, b), num_processes=w, process_index=0)
        return sum(len(x) for x in shard)

    def own_shard() -> int:
        s = fastshard.DistributedSampler(n, w, 0, seed=1)
        return sum(len(x) for x in fastshard.BatchSampler(s, b))

    def floor() -> int:
        return len(np.arange(n // w, dtype=np.int64))

    return {
        "global_torch_bs": global_torch,
        "global_fs_bs": global_fs,
        "shard_fs_bs": own_shard,
        "floor": floor,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=float, default=1e7)
    p.add_argument("--world-size", type=int, nargs="+", default=[2, 8])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    n = int(a.n)
    print(f"n = {n:,}, batch size {a.batch_size}, {a.rounds} rounds, median seconds per rank epoch")
    print(f"{'W':>3}  {'side':<16} {'seconds':>9} {'x shard':>8} {'items':>12}")
    for w in a.world_size:
        fns = sides(n, w, a.batch_size)
        times: dict[str, list[float]] = {k: [] for k in fns}
        items: dict[str, int] = {}
        for _ in range(a.rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                items[name] = fn()
                times[name].append(time.perf_counter() - t0)
        base = statistics.median(times["shard_fs_bs"])
        for name in fns:
            m = statistics.median(times[name])
            print(f"{w:>3}  {name:<16} {m:>9.3f} {m / base:>8.2f} {items[name]:>12,}")


if __name__ == "__main__":
    main()
