"""fastshard's rank guard and seed broadcast on a CUDA machine (not collected by pytest).

    torchrun --nproc_per_node=1 tests/gpu/nccl_check.py nccl     # NCCL, one GPU
    torchrun --nproc_per_node=2 tests/gpu/nccl_check.py mixed    # "cpu:gloo,cuda:nccl"

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so on a one-GPU machine the pure
NCCL group has one rank: there the check is that fastshard's collectives (the seed broadcast,
the guard's all_gather of its row) run on CUDA tensors, which NCCL requires. With two ranks the
group is the mixed "cpu:gloo,cuda:nccl" one that frameworks build: fastshard's tensors must go
to the CPU (gloo), a consistent configuration must iterate, and a rank with another seed must
make every rank raise InconsistentRanksError, for every sampler. Prints one JSON line per rank
and exits 1 if anything is wrong.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import fastshard
from fastshard import _distributed


def read(shard: int, start: int, stop: int) -> list[int]:
    return [shard * 1000 + i for i in range(start, stop)]


def samplers(seed: int) -> dict[str, Callable[[], Any]]:
    """Every sampler kind, small, with the group's num_replicas and rank."""
    lengths = (np.arange(500) % 37 + 1).astype(np.int64)
    return {
        "DistributedSampler": lambda: fastshard.DistributedSampler(1000, seed=seed),
        "DistributedSampler(torch)": lambda: fastshard.DistributedSampler(
            1000, seed=seed, order="torch"
        ),
        "WeightedDistributedSampler": lambda: fastshard.WeightedDistributedSampler(
            np.linspace(0.1, 1.0, 300), seed=seed
        ),
        "MixtureSampler": lambda: fastshard.MixtureSampler([300, 200], [0.7, 0.3], seed=seed),
        "LengthGroupedBatchSampler": lambda: fastshard.LengthGroupedBatchSampler(
            lengths, 8, seed=seed
        ),
        "PackedSampler(concat)": lambda: fastshard.PackedSampler(lengths, 64, seed=seed),
        "PackedSampler(best_fit)": lambda: fastshard.PackedSampler(
            lengths, 64, mode="best_fit", seed=seed
        ),
        "ShardedStream": lambda: fastshard.ShardedStream(
            [40, 25, 33], read, batch_size=4, seed=seed
        ),
    }


def first(s: Any) -> list[Any]:
    out = []
    for x in s:
        out.append(x.tolist() if hasattr(x, "tolist") else x)
        if len(out) == 3:
            break
    return out


def main() -> int:
    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    cuda = torch.cuda.is_available()  # without CUDA: a dry run of the script on gloo
    if cuda:
        # one GPU may serve every rank of the mixed group (its NCCL side then stays unused)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    backend = ("nccl" if mode == "nccl" else "cpu:gloo,cuda:nccl") if cuda else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=60))
    world = dist.get_world_size()
    result: dict[str, Any] = {"rank": rank, "world": world, "backend": str(dist.get_backend())}
    errors: list[str] = []
    device = _distributed._device()
    result["device"] = str(device)
    want = "cuda" if mode == "nccl" and cuda else "cpu"
    if device.type != want:
        errors.append(f"_device() is {device}, want {want}")

    # seed=None: drawn on rank 0, broadcast on the backend's device.
    s = fastshard.DistributedSampler(1000, seed=None)
    seeds: list[Any] = [None] * world
    dist.all_gather_object(seeds, s.seed)
    result["seed_none_equal"] = len(set(seeds)) == 1
    if not result["seed_none_equal"]:
        errors.append(f"seed=None gave {seeds}")

    # The guard's row gathered on the backend's device (with one rank, check() itself skips).
    for name, make in samplers(7).items():
        sampler = make()
        row = torch.tensor(
            _distributed._row(_distributed._fields(sampler)), dtype=torch.int64, device=device
        )
        gathered = [torch.empty_like(row) for _ in range(world)]
        dist.all_gather(gathered, row)
        if any(not torch.equal(g.cpu(), row.cpu()) for g in gathered):
            errors.append(f"{name}: rows differ across ranks with one configuration")
        try:
            got = first(sampler)
        except Exception as e:
            errors.append(f"{name}: consistent configuration raised {type(e).__name__}: {e}")
            continue
        if not got:
            errors.append(f"{name}: nothing iterated")

    if world >= 2:  # a rank with another seed: every rank must raise
        raised = {}
        for name, make in samplers(7 if rank == 0 else 8).items():
            try:
                first(make())
                raised[name] = False
            except fastshard.InconsistentRanksError:
                raised[name] = True
        result["mismatch_raised"] = raised
        errors += [f"{k}: a mismatched seed did not raise" for k, v in raised.items() if not v]

    if mode == "nccl" and cuda:
        t = torch.ones(1, device="cuda")
        dist.all_reduce(t)  # NCCL itself works here
        result["nccl_all_reduce"] = t.item() == world
    result["errors"] = errors
    print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
