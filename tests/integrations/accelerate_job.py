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

import torch.distributed as dist
from _common import (
    BATCH,
    MIX_SIZES,
    MIX_WEIGHTS,
    PACKED_BATCH,
    SEQ_LEN,
    STREAM_SIZES,
    TIMEOUT,
    IndexDataset,
    corpus,
    error_text,
    gather,
    mixture_counts,
    report,
    run,
    start_workers_by_forkserver,
    stream_read,
    summary,
    token_summary,
)
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs
from torch.utils.data import DataLoader

import fastshard

REPORT = sys.argv[1]
ds = IndexDataset()
accelerator: Accelerator  # made under __main__ below: a DataLoader worker imports this script


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


def mixture_documented() -> dict[str, Any]:
    sampler = fastshard.MixtureSampler(MIX_SIZES, MIX_WEIGHTS, num_replicas=1, rank=0, seed=4)
    loader = accelerator.prepare(DataLoader(ds, sampler=sampler, batch_size=BATCH))
    out = {}
    for epoch in range(2):
        seen = [i for batch in loader for i in batch["idx"].tolist()]
        ranks = gather(seen)
        out[str(epoch)] = summary(ranks) | mixture_counts(ranks)
    return {"epochs": out}


def length_grouped_documented() -> dict[str, Any]:
    """A global LengthGroupedBatchSampler that accelerate splits; accelerate's loader sets
    its epoch through batch_sampler.sampler."""
    lengths = [(i * 7919) % 299 + 1 for i in range(len(ds))]
    bs = fastshard.LengthGroupedBatchSampler(lengths, max_tokens=2048, num_replicas=1, rank=0)
    loader = accelerator.prepare(DataLoader(ds, batch_sampler=bs))
    return {"epochs": epochs(loader), "len": len(bs), "sampler_epoch": bs.epoch}


def packed_documented() -> dict[str, Any]:
    """A global PackedSampler (num_replicas=1) whose rows accelerate splits by batches."""
    tokens, offsets, lengths = corpus()
    data = fastshard.PackedTokens(tokens, offsets, SEQ_LEN, lengths=lengths)
    sampler = fastshard.PackedSampler(lengths, SEQ_LEN, num_replicas=1, rank=0, seed=6)
    loader = accelerator.prepare(
        DataLoader(
            data, sampler=sampler, batch_size=PACKED_BATCH, collate_fn=fastshard.collate_rows
        )
    )
    out = {}
    for epoch in range(2):
        seen = [t for batch in loader for t in batch["input_ids"].flatten().tolist()]
        out[str(epoch)] = token_summary(gather(seen), sampler.num_rows)
    return {"epochs": out, "rows": sampler.num_rows}


def misuse(batch_sampler: bool = False) -> dict[str, Any]:
    sampler = fastshard.DistributedSampler(ds, seed=21)  # num_replicas=2 from the process group
    if batch_sampler:
        loader = DataLoader(ds, batch_sampler=fastshard.BatchSampler(sampler, BATCH))
    else:
        loader = DataLoader(ds, sampler=sampler, batch_size=BATCH)
    return {"epochs": epochs(accelerator.prepare(loader), 1)}


def dispatcher(stateful: bool) -> Accelerator:
    """An Accelerator whose loaders iterate on process 0 and send each process its part
    (DataLoaderDispatcher), with torchdata's StatefulDataLoader or torch's DataLoader."""
    config = DataLoaderConfiguration(dispatch_batches=True, use_stateful_dataloader=stateful)
    return Accelerator(cpu=True, dataloader_config=config)


def every_rank(fn: Any) -> dict[str, Any]:
    """What fn() did on each rank: its result or its error (all-gathered), so a test can
    assert that every rank failed loudly, not only the one whose sampler ran."""
    try:
        mine: dict[str, Any] = {"result": fn()}
    except Exception as err:
        mine = error_text(err)
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return {"ranks": out}


def dispatch_misuse(stateful: bool, workers: int) -> dict[str, Any]:
    """A sampler that shards over the ranks under dispatch_batches=True."""
    acc = dispatcher(stateful)

    def fit() -> dict[str, Any]:
        sampler = fastshard.DistributedSampler(ds, seed=21)  # num_replicas=2
        loader = DataLoader(ds, sampler=sampler, batch_size=BATCH, num_workers=workers)
        return epochs(acc.prepare(loader), 1)  # the stateful loader iterates inside prepare

    return every_rank(fit)


def dispatch_documented(stateful: bool, workers: int) -> dict[str, Any]:
    """The documented global order (num_replicas=1) under dispatch_batches=True: process 0
    iterates it alone, so it must make no collective call there."""
    acc = dispatcher(stateful)
    sampler = fastshard.DistributedSampler(ds, num_replicas=1, rank=0, seed=21)
    loader = DataLoader(ds, sampler=sampler, batch_size=BATCH, num_workers=workers)
    return {"epochs": epochs(acc.prepare(loader))}


def stream_documented() -> dict[str, Any]:
    """A global ShardedStream (num_replicas=1) in a loader with 2 workers: accelerate
    dispatches it (its default for an IterableDataset), process 0 reading, and sets its
    epoch on every process."""
    data = fastshard.ShardedStream(
        STREAM_SIZES, stream_read, batch_size=BATCH, num_replicas=1, rank=0, seed=9
    )
    loader = accelerator.prepare(DataLoader(data, batch_size=BATCH, num_workers=2))
    return {"epochs": epochs(loader), "len": len(loader)}


def stream_misuse(dispatch: bool) -> dict[str, Any]:
    """A ShardedStream that shards over the ranks itself (num_replicas=2 from the group),
    dispatched or wrapped in accelerate's IterableDatasetShard: refused on every rank."""
    config = DataLoaderConfiguration(dispatch_batches=dispatch)
    acc = Accelerator(cpu=True, dataloader_config=config)

    def fit() -> dict[str, Any]:
        data = fastshard.ShardedStream(STREAM_SIZES, stream_read, batch_size=BATCH, seed=9)
        return epochs(acc.prepare(DataLoader(data, batch_size=BATCH, num_workers=2)), 1)

    return every_rank(fit)


if __name__ == "__main__":
    start_workers_by_forkserver("accelerate")
    accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=TIMEOUT)])
    results: dict[str, Any] = {}
    run("documented", documented, results)
    run("documented_batch_sampler", documented_batch_sampler, results)
    run("weighted_documented", weighted_documented, results)
    run("mixture_documented", mixture_documented, results)
    run("length_grouped_documented", length_grouped_documented, results)
    run("packed_documented", packed_documented, results)
    run("misuse", misuse, results)
    run("misuse_batch_sampler", lambda: misuse(True), results)
    run("dispatch_misuse_stateful_workers", lambda: dispatch_misuse(True, 2), results)
    run("dispatch_misuse", lambda: dispatch_misuse(False, 0), results)
    run("dispatch_documented", lambda: dispatch_documented(False, 0), results)
    run("dispatch_documented_stateful_workers", lambda: dispatch_documented(True, 2), results)
    run("stream_documented", stream_documented, results)
    run("stream_misuse_dispatch", lambda: stream_misuse(True), results)
    run("stream_misuse_shard", lambda: stream_misuse(False), results)
    report(REPORT, results)
    accelerator.end_training()
