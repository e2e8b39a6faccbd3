"""DDP training with fastshard.DistributedSampler, checking what every rank consumed.

    torchrun --nproc_per_node=2 examples/train_ddp.py [--size N] [--epochs E] ...

A small MLP learns a planted function on a synthetic map-style dataset whose items carry their
own index. After each epoch the ranks sum per-item counts of the indices their DataLoader
delivered (one all_reduce of an int32 vector of length n) and rank 0 checks the epoch: every
item seen at least once and the repeats equal to the sampler's padding (total_size - n). The
process exits with status 1 if any epoch fails. Backend: NCCL with one GPU per process when
CUDA is available, else gloo on the CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import fastshard


class Synthetic(Dataset):
    """Item i is (features(i), target(i), i): a pure function of i, cheap to compute.

    ``__getitems__`` builds a whole batch with tensor ops (the DataLoader calls it with a
    batch's indices when it exists); ``__getitem__`` is the one-item form of the same thing.
    """

    def __init__(self, size: int, dim: int) -> None:
        self.size = size
        gen = torch.Generator().manual_seed(1234)
        self.freq = torch.rand(dim, generator=gen, dtype=torch.float64) * 0.1 + 1e-3
        self.phase = torch.rand(dim, generator=gen, dtype=torch.float64) * 2 * math.pi
        self.w = torch.randn(dim, generator=gen, dtype=torch.float64) / math.sqrt(dim)

    def __len__(self) -> int:
        return self.size

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx = torch.tensor(indices, dtype=torch.int64)
        x = torch.sin(idx.to(torch.float64)[:, None] * self.freq + self.phase)
        y = torch.tanh(x @ self.w) + 0.5 * x[:, 0] * x[:, 1]
        return x.float(), y.float()[:, None], idx

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y, idx = self.__getitems__([i])
        return x[0], y[0], idx[0]


def keep_batch(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """collate_fn for batches __getitems__ already built (module level: picklable for spawn)."""
    return batch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=1_000_000, help="dataset items (default 1e6)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1024, help="per rank")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--dim", type=int, default=16, help="feature dimension")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0, help="sampler seed")
    p.add_argument(
        "--inject-fault",
        action="store_true",
        help="test the verdict: rank 1 uses another seed (with the rank check off), so items "
        "are missed and repeated and the run must fail",
    )
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    if cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # one core per process on a small CPU machine
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def barrier() -> None:  # NCCL wants to be told the device
        dist.barrier(device_ids=[device.index] if cuda else None)

    dataset = Synthetic(args.size, args.dim)
    # num_replicas and rank come from the process group. (The rank check is a collective: it is
    # turned off on every rank or on none.)
    seed = args.seed + 1 if args.inject_fault and rank == 1 else args.seed
    sampler = fastshard.DistributedSampler(
        dataset, seed=seed, check_consistency=not args.inject_fault
    )
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        collate_fn=keep_batch,
        persistent_workers=args.workers > 0,
        pin_memory=cuda,
    )

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(args.dim, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)

    if rank == 0:
        print(
            f"fastshard {fastshard.__version__}, torch {torch.__version__}: {world} ranks, "
            f"backend {dist.get_backend()}, n={args.size}, {len(sampler)} items/rank/epoch, "
            f"batch {args.batch_size}/rank, {args.workers} workers/rank",
            flush=True,
        )

    all_ok = True
    t_total = 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        counts = torch.zeros(args.size, dtype=torch.int32, device=device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        steps = 0
        barrier()
        t0 = time.perf_counter()
        for x, y, idx in loader:
            x, y, idx = (t.to(device, non_blocking=True) for t in (x, y, idx))
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            counts.index_add_(0, idx, torch.ones_like(idx, dtype=torch.int32))
            loss_sum += loss.detach()
            steps += 1
        barrier()
        seconds = time.perf_counter() - t0
        t_total += seconds

        # One collective for the whole epoch: the per-item counts of every rank, summed.
        dist.all_reduce(counts)
        stats = torch.tensor([loss_sum.item(), steps], dtype=torch.float64, device=device)
        dist.all_reduce(stats)
        ok = torch.zeros(1, dtype=torch.int32, device=device)
        if rank == 0:
            unseen = int((counts == 0).sum())
            repeats = int(counts.sum()) - args.size + unseen
            padding = sampler.total_size - args.size
            ok[0] = int(unseen == 0 and repeats == padding)
            print(
                f"epoch {epoch}: loss {stats[0].item() / stats[1].item():.4f}, "
                f"{sampler.total_size / seconds:,.0f} samples/s ({seconds:.2f} s); "
                f"verdict: {'OK' if ok.item() else 'FAIL'}: "
                f"{args.size - unseen}/{args.size} items seen, "
                f"repeats {repeats} (padding {padding})",
                flush=True,
            )
        dist.broadcast(ok, src=0)  # every rank exits with the verdict
        all_ok = all_ok and bool(ok.item())

    if rank == 0:
        total = args.epochs * sampler.total_size
        print(
            f"{'PASS' if all_ok else 'FAIL'}: {args.epochs} epochs, {total:,} samples in "
            f"{t_total:.2f} s, {total / max(t_total, 1e-9):,.0f} samples/s over {world} ranks",
            flush=True,
        )
    dist.destroy_process_group()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
