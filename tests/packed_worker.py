"""One rank of the 2-rank gloo tests in test_packed_distributed.py (not collected by pytest).

    python packed_worker.py RANK WORLD_SIZE PORT

Each training step makes an all_reduce (DDP's gradient sync), so unequal row counts hang and
the group's timeout turns that into an error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from fastshard import InconsistentRanksError, PackedSampler, PackedTokens, collate_rows

N, SEQ = 3000, 128


def corpus() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = np.clip(np.rint(rng.lognormal(3.5, 1.0, N)), 1, 400).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    tokens = (np.arange(offsets[-1]) % 50000).astype(np.uint16)
    return lengths, offsets, tokens


def epochs(mode: str) -> dict[str, Any]:
    lengths, offsets, tokens = corpus()
    sampler = PackedSampler(
        lengths, SEQ, mode=mode, long_docs="split" if mode == "best_fit" else None
    )
    data = PackedTokens(tokens, offsets, SEQ)
    loader = DataLoader(data, sampler=sampler, batch_size=4, collate_fn=collate_rows, num_workers=1)
    out: dict[str, Any] = {"steps": [], "real": []}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        steps = real = 0
        for batch in loader:
            grad = torch.ones(1)
            dist.all_reduce(grad)
            steps += 1
            real += int((batch["labels"] != -100).sum())
        out["steps"].append(steps)
        out["real"].append(real)
    return out


def guard_lengths() -> dict[str, Any]:
    lengths = corpus()[0]
    if dist.get_rank() == 1:
        lengths[7] += 1
    sampler = PackedSampler(lengths, SEQ)
    try:
        iter(sampler)
    except InconsistentRanksError as err:
        return {"raised": True, "fields": sorted(err.fields)}
    return {"raised": False}


SCENARIOS = {
    "concat": lambda: epochs("concat"),
    "best_fit": lambda: epochs("best_fit"),
    "guard_lengths": guard_lengths,
}


if __name__ == "__main__":
    import dist_worker  # beside this script: the same loop, group and sentinel checks

    dist_worker.main(SCENARIOS)
