"""One rank of the gloo tests in test_stream_distributed.py (not collected by pytest).

    python stream_worker.py RANK WORLD_SIZE PORT

Each training step makes an all_reduce (DDP's gradient sync), so unequal item counts hang and
the group's timeout turns that into an error.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from fastshard import InconsistentRanksError, ShardedStream

# Dealt by shard modulo the world size (webdataset's split_by_node), rank 0 would get shards
# 0, 2, 4 (214 items) and rank 1 shards 1, 3 (10 items).
SIZES = [100, 3, 50, 7, 64]
BATCH = 8


def read(shard: int, start: int, stop: int) -> Any:
    return ((shard, row) for row in range(start, stop))


def collate(items: list[tuple[int, int]]) -> torch.Tensor:
    return torch.tensor(items, dtype=torch.int64)


def train() -> dict[str, Any]:
    stream = ShardedStream(SIZES, read, batch_size=BATCH, seed=11)
    loader = DataLoader(stream, batch_size=BATCH, num_workers=2, collate_fn=collate)
    out: dict[str, Any] = {"steps": [], "items": []}
    for epoch in range(2):
        stream.set_epoch(epoch)
        steps, items = 0, []
        for batch in loader:
            grad = torch.ones(1)
            dist.all_reduce(grad)
            steps += 1
            items.extend(map(tuple, batch.tolist()))
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, items)
        out["steps"].append(steps)
        out["items"].append(sorted(x for rank in gathered for x in rank))
    return out


def guard_sizes() -> dict[str, Any]:
    sizes = list(SIZES)
    if dist.get_rank() == 1:
        sizes[0], sizes[2] = sizes[2], sizes[0]  # the same total, other shards
    try:
        ShardedStream(sizes, read, batch_size=BATCH)
    except InconsistentRanksError as err:
        return {"raised": True, "fields": sorted(err.fields), "message": str(err)}
    return {"raised": False}


def guard_epoch() -> dict[str, Any]:
    stream = ShardedStream(SIZES, read, batch_size=BATCH)
    try:
        stream.set_epoch(dist.get_rank())
    except InconsistentRanksError as err:
        return {"raised": True, "fields": sorted(err.fields), "message": str(err)}
    return {"raised": False}


def guard_batch() -> dict[str, Any]:
    # The same lanes (so the same order), other per-rank batch sizes: the ranks would run
    # different numbers of steps.
    try:
        ShardedStream(SIZES, read, batch_size=BATCH * (1 + dist.get_rank()), lanes=64)
    except InconsistentRanksError as err:
        return {"raised": True, "fields": sorted(err.fields), "message": str(err)}
    return {"raised": False}


SCENARIOS = {
    "train": train,
    "guard_sizes": guard_sizes,
    "guard_epoch": guard_epoch,
    "guard_batch": guard_batch,
}


if __name__ == "__main__":
    import dist_worker  # beside this script: the same loop, group and sentinel checks

    dist_worker.main(SCENARIOS)
