"""DDP training on local WebDataset tar shards with fastshard.ShardedStream.

    torchrun --nproc_per_node=2 examples/train_streams.py [--shards DIR] [--epochs E] ...

Without ``--shards`` the script writes 7 small tar shards of uneven sizes (one empty, one
larger than the others together) to a temporary directory: shard sizes that a whole-shard
modulo split (webdataset's ``split_by_node``) would leave uneven, so ranks would run different
numbers of steps and the one with more would wait forever in the per-step all-reduce. With
``ShardedStream`` every rank yields the same number of items, each rank's DataLoader splits
them exactly over its workers, and the loop below ends on every rank at the same step.

Each sample holds ``x.f32`` (features, float32 bytes) and ``y.f32`` (the target). A linear
model learns the planted weights; DDP all-reduces the gradients at every step. At the end the
ranks all-gather their item counts and the keys they saw: the counts must be equal and,
within an epoch, every sample must have been seen (the padding repeats a few). Backend: gloo
on the CPU (NCCL if CUDA is available).

The DataLoader keeps its workers for the whole run (``persistent_workers=True``) and starts
them from a fork server where there is one: a process that forks while other threads run (the
process group's, DataLoader pin threads) can deadlock the child (CPython gh-112275), and a
loader that forks fresh workers every epoch takes that chance every epoch. ``set_epoch``
reaches persistent workers. A fork server's workers are not the rank's children, so torch's
watch of their parent would keep them (and the fork server) running after a fault kills the
rank; a worker that iterates a ``ShardedStream`` watches its rank itself and ends with it
(for a DataLoader over a fastshard sampler, pass ``worker_init_fn=fastshard.worker_init_fn``).
Every collective has a timeout (``--timeout``), so a rank that stops answering ends the run
with an error instead of a hang.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import sys
import tarfile
import tempfile
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

import fastshard
from fastshard import readers

DIM = 8
SIZES = [300, 40, 0, 1250, 95, 7, 410]  # 2102 samples


def write_shards(directory: str, sizes: list[int], seed: int = 0) -> list[str]:
    """Tar shards of samples KEY.x.f32 / KEY.y.f32 with y = x @ w + noise."""
    rng = np.random.default_rng(seed)
    w = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
    paths = []
    for shard, n in enumerate(sizes):
        path = os.path.join(directory, f"train-{shard:05d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for row in range(n):
                x = rng.standard_normal(DIM).astype(np.float32)
                y = np.float32(x @ w + 0.01 * rng.standard_normal())
                for ext, data in (("x.f32", x.tobytes()), ("y.f32", y.tobytes())):
                    info = tarfile.TarInfo(f"s{shard:05d}_{row:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def collate(samples: list[dict[str, bytes]]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Decode a batch of tar samples (module level: picklable for spawned workers)."""
    x = np.stack([np.frombuffer(s["x.f32"], dtype=np.float32) for s in samples])
    y = np.array([np.frombuffer(s["y.f32"], dtype=np.float32)[0] for s in samples])
    return torch.from_numpy(x), torch.from_numpy(y)[:, None], [str(s["__key__"]) for s in samples]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shards", help="directory of .tar shards (default: write small ones)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=120, help="seconds for any collective")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    if device is not None:
        torch.cuda.set_device(device)

    tmp = None
    if args.shards:
        directory = args.shards
    else:  # rank 0 writes the shards, the others wait for them
        tmp = [tempfile.mkdtemp(prefix="fastshard-streams-")] if rank == 0 else [None]
        dist.broadcast_object_list(tmp)
        directory = tmp[0]
        if rank == 0:
            write_shards(directory, SIZES)
        dist.barrier()
    paths = sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".tar"))
    sizes, read = readers.tar_shards(paths)

    # num_replicas and rank come from the process group; the stream checks that every rank
    # has the same shard sizes, seed and epoch before each epoch.
    stream = fastshard.ShardedStream(sizes, read, batch_size=args.batch_size, seed=0)
    workers = {}
    if args.workers > 0:
        # Workers started once, from a single-threaded fork server (see the module docstring).
        workers["persistent_workers"] = True
        if "forkserver" in multiprocessing.get_all_start_methods():
            # The server imports these once; each worker forked from it starts with them.
            multiprocessing.set_forkserver_preload(["torch", "fastshard", "numpy"])
            workers["multiprocessing_context"] = "forkserver"
    loader = DataLoader(
        stream,
        batch_size=args.batch_size,
        num_workers=args.workers,
        collate_fn=collate,
        **workers,
    )
    torch.manual_seed(0)
    model = nn.Linear(DIM, 1)
    if device is not None:
        model = model.to(device)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    ok = True
    total_items = 0
    for epoch in range(args.epochs):
        stream.set_epoch(epoch)
        keys: set[str] = set()
        items = steps = 0
        loss_sum = torch.zeros(1, device=device)
        for x, y, batch_keys in loader:
            if device is not None:
                x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces the gradients: a collective at every step
            opt.step()
            loss_sum += loss.detach()
            items += len(batch_keys)
            steps += 1
            keys.update(batch_keys)
        total_items += items
        dist.all_reduce(loss_sum)
        counts: list[int | None] = [None] * world
        dist.all_gather_object(counts, items)
        seen: list[set[str] | None] = [None] * world
        dist.all_gather_object(seen, keys)
        if rank == 0:
            union = set().union(*(s for s in seen if s is not None))
            n = int(sizes.sum())
            even = len(set(counts)) == 1
            covered = len(union) == n
            ok = ok and even and covered
            print(
                f"epoch {epoch}: items per rank {counts} "
                f"({'equal' if even else 'UNEQUAL'}), {len(union)}/{n} samples seen, "
                f"{steps} steps, mean loss {loss_sum.item() / (steps * world):.4f}",
                flush=True,
            )

    totals: list[int | None] = [None] * world
    dist.all_gather_object(totals, total_items)
    if rank == 0:
        print(f"items per rank over {args.epochs} epochs: {totals}", flush=True)
    assert len(set(totals)) == 1, f"ranks yielded different item counts: {totals}"
    verdict = [ok]
    dist.broadcast_object_list(verdict)
    dist.destroy_process_group()
    if tmp is not None and rank == 0:
        for f in os.listdir(directory):
            os.remove(os.path.join(directory, f))
        os.rmdir(directory)
    return 0 if verdict[0] else 1


if __name__ == "__main__":
    sys.exit(main())
