"""One rank of the 2-rank gloo tests in test_length_distributed.py (not collected by pytest).

    python length_worker.py RANK WORLD_SIZE PORT

Runs each scenario on one gloo group through dist_worker.main and prints its JSON line. Every
training step makes an all_reduce, as DDP's gradient sync does, so a rank with more batches
than another would wait for a peer that never comes: the group's timeout turns such a hang
into an error, and the test's launch timeout kills it in any case.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from fastshard import InconsistentRanksError, LengthGroupedBatchSampler

N = 6000


def lengths() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.clip(np.rint(rng.lognormal(4.5, 1.2, N)), 1, 5000).astype(np.int32)


class Sequences(Dataset):
    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((int(self.lengths[i]),), int(i), dtype=torch.int64)


def pad(batch: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=-1)


def token_budget_epochs(drop_last: bool) -> dict[str, Any]:
    L = lengths()
    sampler = LengthGroupedBatchSampler(L, max_tokens=4096, drop_last=drop_last, sort_window=1500)
    loader = DataLoader(Sequences(L), batch_sampler=sampler, collate_fn=pad, num_workers=1)
    world = dist.get_world_size()
    out: dict[str, Any] = {"steps": [], "tokens": [], "covered": [], "over_budget": 0}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = torch.zeros(N, dtype=torch.int64)
        steps = tokens = 0
        for x in loader:
            grad = torch.ones(1)
            dist.all_reduce(grad)  # the per-step collective of DDP
            steps += 1
            tokens += int((x >= 0).sum())
            out["over_budget"] += int(x.numel() > 4096 and x.shape[0] > 1)
            seen[x[:, 0]] += 1
        dist.all_reduce(seen)
        out["steps"].append(steps)
        out["tokens"].append(tokens)
        out["covered"].append(int((seen > 0).sum()))
        # What the plan leaves out: the global sequence's batches past the ranks' share.
        whole = LengthGroupedBatchSampler(
            L, max_tokens=4096, sort_window=1500, num_replicas=1, rank=0, check_consistency=False
        )
        whole.set_epoch(epoch)
        g = list(whole)
        out.setdefault("expected_covered", []).append(
            N - sum(len(b) for b in g[steps * world :]) if drop_last else N
        )
    return out


def guard_lengths() -> dict[str, Any]:
    L = lengths()
    if dist.get_rank() == 1:
        L[123] += 1
    sampler = LengthGroupedBatchSampler(L, max_tokens=4096)
    try:
        iter(sampler)
    except InconsistentRanksError as err:
        return {"raised": True, "fields": sorted(err.fields)}
    return {"raised": False}


SCENARIOS = {
    "budget_epochs": lambda: token_budget_epochs(False),
    "budget_epochs_drop_last": lambda: token_budget_epochs(True),
    "guard_lengths": guard_lengths,
}


if __name__ == "__main__":
    import dist_worker  # beside this script: the same loop, group and sentinel checks

    dist_worker.main(SCENARIOS)
