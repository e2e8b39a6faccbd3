"""Elastic DDP training with fastshard: checkpoints, preemption, any world size, an audit log.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:2 --nproc_per_node=2 \\
        --max-restarts=3 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29400 --rdzv-id=demo \\
        examples/train_elastic.py --workdir run/
    python examples/audit_elastic.py run/

A tiny model trains on a map-style dataset whose items carry their index, with
``fastshard.DistributedSampler(pad=False)``: every item once per epoch, whatever the world size.

- **Checkpoints** every ``--ckpt-every`` steps and at the end of each epoch: model, optimizer
  and the sampler's state (which holds the epoch and the global cursor, not the rank), written by
  rank 0 to a temporary file and renamed over ``WORKDIR/checkpoint.pt`` after a barrier, so a
  crash never leaves half a checkpoint.
- **Start**: load the checkpoint if there is one, on whatever world size this start has; the
  sampler re-shards the rest of the epoch over the new ranks.
- **Preemption**: on SIGTERM (a spot or SLURM notice, or torchrun's agent stopping the workers
  to re-form a larger or smaller world), every rank finishes its current step; one all_reduce
  per step lets all ranks agree on the step to stop after; rank 0 writes a checkpoint there and
  every rank exits with status 0. Nothing is replayed.
- **Audit**: every rank appends to ``WORKDIR/log/ATTEMPT-rankR.jsonl`` one line per step (the
  epoch, the global cursor after the step, the item indices it trained on); rank 0 logs each
  checkpoint as a commit. ``examples/audit_elastic.py`` reads them: committed steps must cover
  every item of each finished epoch exactly once; steps after the last commit of a crashed
  attempt are replayed by the next one.

Options: ``--size`` (items, default 10,007), ``--epochs``, ``--batch-size``, ``--ckpt-every``,
``--seed`` (an int, or ``none`` for a seed drawn on rank 0 and shared), ``--step-time``
(seconds each step sleeps, so that a test can interrupt it), ``--timeout`` (seconds for the
process group's collectives). Backend: NCCL with one GPU per process when CUDA is available,
else gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import fastshard


class Items(Dataset):
    """Item i is (features of i, i)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        t = torch.arange(8, dtype=torch.float32)
        return torch.sin(t * (i % 97 + 1) / 97), i


class Preemption:
    """Remembers a SIGTERM; the training loop stops at a step every rank agrees on."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: Any) -> None:
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        """One all_reduce: True on every rank once any rank was signalled."""
        flag = torch.tensor([int(self.requested)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(args.workdir)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        # One id per formation of the process group: the audit tells attempts apart by it.
        token = torch.tensor([secrets.randbits(62) if self.rank == 0 else 0], device=self.device)
        dist.broadcast(token, 0)
        self.attempt = f"{int(token.item()):016x}"
        self.dataset = Items(args.size)
        seed = None if args.seed == "none" else int(args.seed)
        self.sampler = fastshard.DistributedSampler(self.dataset, seed=seed, pad=False)
        self.loader = DataLoader(self.dataset, sampler=self.sampler, batch_size=args.batch_size)
        torch.manual_seed(0)
        model = nn.Linear(8, 1).to(self.device)
        self.model = nn.parallel.DistributedDataParallel(model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        (self.workdir / "log").mkdir(parents=True, exist_ok=True)
        self.log = open(self.workdir / "log" / f"{self.attempt}-rank{self.rank}.jsonl", "a")
        # Who runs where, for fault injection and clean-up: torchrun starts each worker in a
        # session of its own, so ending an agent's process group does not end its workers.
        (self.workdir / "pids").mkdir(exist_ok=True)
        who = {"rank": self.rank, "agent": os.getppid(), "attempt": self.attempt}
        (self.workdir / "pids" / str(os.getpid())).write_text(json.dumps(who))
        self.preemption = Preemption()

    # -- checkpoints ------------------------------------------------------------------------
    def load(self) -> dict[str, Any] | None:
        path = self.workdir / "checkpoint.pt"
        if not path.exists():
            return None
        ckpt = torch.load(path, map_location=self.device, weights_only=False)
        self.model.module.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.sampler.load_state_dict(ckpt["sampler"])
        return ckpt

    def save(self, consumed: int, final: bool = False) -> None:
        """Checkpoint after every rank consumed ``consumed`` items of this pass (counted on
        rank 0, whose shard is the longest with pad=False)."""
        dist.barrier()  # every rank has finished the step
        if self.rank == 0:
            state = self.sampler.state_dict(consumed=consumed)
            ckpt = {
                "model": self.model.module.state_dict(),
                "optimizer": self.opt.state_dict(),
                "sampler": state,
                "attempt": self.attempt,
                "world": self.world,
            }
            tmp = self.workdir / f".checkpoint.{self.attempt}.tmp"
            torch.save(ckpt, tmp)
            os.replace(tmp, self.workdir / "checkpoint.pt")
            self.write({"commit": [state["epoch"], state["cursor"]], "final": final})
        dist.barrier()  # nobody moves on (or exits) before the checkpoint is in place

    def write(self, record: dict[str, Any]) -> None:
        self.log.write(json.dumps({"attempt": self.attempt, **record}) + "\n")
        self.log.flush()

    # -- training ---------------------------------------------------------------------------
    def epoch(self, epoch: int, start_cursor: int) -> bool:
        """Train the rest of an epoch from ``start_cursor``; False if preempted."""
        args, n, w = self.args, self.args.size, self.world
        rest = self.sampler.remaining  # this rank's part of the pass (the longest on rank 0)
        steps = torch.tensor([-(-rest // args.batch_size)], device=self.device)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)  # with pad=False ranks differ by one item
        batches = iter(self.loader)
        for k in range(int(steps.item())):
            x, idx = next(batches, (torch.zeros(0, 8), torch.zeros(0, dtype=torch.int64)))
            loss = self.model(x.to(self.device)).pow(2).sum() / args.batch_size
            self.opt.zero_grad()
            loss.backward()  # a rank without a batch still joins the gradient all_reduce
            self.opt.step()
            cursor = start_cursor + min((k + 1) * args.batch_size * w, n - start_cursor)
            self.write({"epoch": epoch, "cursor": cursor, "world": w, "items": idx.tolist()})
            if args.step_time:
                time.sleep(args.step_time)
            consumed = min((k + 1) * args.batch_size, rest)
            if self.preemption.agreed(self.device):
                self.save(consumed)
                return False
            if (k + 1) % args.ckpt_every == 0 and k + 1 < steps.item():
                self.save(consumed)
        self.save(rest)  # the end of the epoch: the next start begins the next epoch
        return True

    def train(self) -> int:
        ckpt = self.load()
        resumed = ckpt is not None
        start = self.sampler.epoch if resumed else 0
        cursor = ckpt["sampler"]["cursor"] if resumed else 0
        self.write({"start": time.time(), "world": self.world, "seed": self.sampler.seed,
                    "resumed_from": [start, cursor] if resumed else None,
                    "checkpoint_attempt": ckpt["attempt"] if resumed else None})  # fmt: skip
        if self.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            print(
                "note: torchrun shares its rendezvous store with the workers; restarts and "
                "joining nodes are more reliable with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                "(docs/fault-tolerance.md)",
                flush=True,
            )
        if self.rank == 0:
            where = f"epoch {start}, cursor {cursor:,}" if resumed else "the beginning"
            print(f"attempt {self.attempt}: {self.world} ranks, from {where}", flush=True)
        for epoch in range(start, self.args.epochs):
            # the usual call: for the epoch just loaded it keeps the resume point
            self.sampler.set_epoch(epoch)
            if not (resumed and epoch == start):
                cursor = 0
            if not self.epoch(epoch, cursor):
                if self.rank == 0:
                    print(f"attempt {self.attempt}: preempted; checkpoint written", flush=True)
                return 0
        if self.rank == 0:
            self.write({"done": True})
            print(f"attempt {self.attempt}: done, {self.args.epochs} epochs", flush=True)
        return 0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", required=True)
    p.add_argument("--size", type=int, default=10_007)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--seed", default="0")
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        return Run(args).train()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
