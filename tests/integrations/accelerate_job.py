"""fastshard's samplers under accelerate, on 2 CPU ranks under torchrun.

    torchrun --nproc_per_node=2 accelerate_job.py REPORT.json

accelerate shards every DataLoader it prepares by batches. The documented way is a global
order (num_replicas=1) that accelerate splits; the natural misuse (a sampler that shards over
the ranks itself) must raise instead of training on half the data. Rank 0 writes
{scenario: result} to REPORT.json; tests/test_integrations.py asserts on it.
"""

from __future__ import annotations

import sys
from typing import Any

from _common import BATCH, TIMEOUT, IndexDataset, gather, report, run, summary
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch.utils.data import DataLoader

import fastshard

REPORT = sys.argv[1]
accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=TIMEOUT)])
ds = IndexDataset()


def epochs(loader: Any, count: int = 2) -> dict[str, Any]:
    out = {}
    for epoch in range(count):
        seen: list[int] = []
        for batch in loader:  # accelerate's DataLoaderShard sets the sampler's epoch itself
            seen.extend(batch["idx"].tolist())
        out[str(epoch)] = summary(gather(seen))
    return out


def documented(**kw: Any) -> dict[str, Any]:
    sampler = fastshard.DistributedSampler(ds, num_replicas=1, rank=0, seed=21, **kw)
    loader = accelerator.prepare(DataLoader(ds, sampler=sampler, batch_size=BATCH))
    return {"epochs": epochs(loader), "sampler_epoch": sampler.epoch}


def documented_batch_sampler() -> dict[str, Any]:
    bs = fastshard.BatchSampler(fastshard.DistributedSampler(ds, num_replicas=1, rank=0), BATCH)
    return {"epochs": epochs(accelerator.prepare(DataLoader(ds, batch_sampler=bs)))}


def weighted_documented() -> dict[str, Any]:
    import torch

    sampler = fastshard.WeightedDistributedSampler(torch.ones(len(ds)), num_replicas=1, rank=0)
    return {
        "epochs": epochs(accelerator.prepare(DataLoader(ds, sampler=sampler, batch_size=BATCH)))
    }


def misuse(batch_sampler: bool = False) -> dict[str, Any]:
    sampler = fastshard.DistributedSampler(ds, seed=21)  # num_replicas=2 from the process group
    if batch_sampler:
        loader = DataLoader(ds, batch_sampler=fastshard.BatchSampler(sampler, BATCH))
    else:
        loader = DataLoader(ds, sampler=sampler, batch_size=BATCH)
    return {"epochs": epochs(accelerator.prepare(loader), 1)}


results: dict[str, Any] = {}
run("documented", documented, results)
run("documented_batch_sampler", documented_batch_sampler, results)
run("weighted_documented", weighted_documented, results)
run("misuse", misuse, results)
run("misuse_batch_sampler", lambda: misuse(True), results)
report(REPORT, results)
accelerator.end_training()
