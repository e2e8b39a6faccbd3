"""Pretrain a small language model on packed rows; stop it anywhere, resume it, same losses.

    torchrun --nproc_per_node=2 examples/train_lm.py --workdir run/ --steps 300
    python examples/train_lm.py --plot run/ resumed/ --out loss.png

The corpus is CPython's standard library, the ``.py`` files under
``sysconfig.get_paths()["stdlib"]`` (about 30 MB on CPython 3.11): every machine has it, no
download. The pieces, top to bottom:

- **Token store** (``--data``, built once by rank 0): a byte-level vocabulary (the 256 byte
  values, then ``EOT`` = 256 closing each file), written as one flat ``tokens.bin`` of
  **uint16** and ``offsets.npy`` (int64, n + 1 offsets: file d is
  ``tokens[offsets[d]:offsets[d + 1]]``). Every 50th file (``--holdout``) goes to a held-out
  split with the same layout.
- **Rows**: ``fastshard.PackedSampler(lengths, seq_len, mode="concat")``: the files in a
  keyed order, concatenated and cut into rows of ``seq_len`` tokens, the rows shuffled; rank
  r of W takes rows r, r + W, ... of one global row sequence, the same for every W.
  ``fastshard.PackedTokens(fastshard.TokenStore.flat(..., dtype=np.uint16), seq_len)`` reads a
  row's tokens; a torchdata ``StatefulDataLoader`` with 2 persistent workers batches them,
  started from a fork server on Linux (CPython gh-112275: see ``Trainer.make_loader``), each
  ending with its rank (``fastshard.worker_init_fn``), also when a fault kills the rank.
- **Model**: a randomly initialised transformers ``LlamaForCausalLM`` (float32, no dropout,
  about 0.8 M parameters by default) under DDP (gloo on CPUs, NCCL on GPUs). The loss is the
  model's own: ``model(input_ids=ids, labels=ids)`` (the model shifts the labels), attention
  running across file boundaries as in GPT-style pretraining (``EOT`` separates the files).
- **Global batch**: W x ``--accumulate`` x ``--batch-size`` rows a step. Another W with the
  same product trains on the same rows each step: with W = 2 rank 0 takes the step's even
  rows and rank 1 the odd; with W = 1 and ``--accumulate 2`` one rank takes them all in two
  micro-batches. Every epoch is ``rows // global batch`` steps on any W (its last rows, fewer
  than a global batch, left out), so that holds across epochs too.
- **Checkpoints** every ``--ckpt-every`` steps in ``WORKDIR/ckpt/step_NNNNNN/``: rank 0 writes
  the model, the optimizer and the sampler's state (the epoch and the global cursor: it holds
  no rank); every rank writes its loader's state and its RNG states. The files go to a
  temporary folder that rank 0 renames once every rank has written, so a crash never leaves
  half a checkpoint; the last ``--keep`` checkpoints are kept.
- **Resume**: a start with a checkpoint in ``WORKDIR`` continues from the latest one. On the
  same W each rank loads its loader's state (the workers' too); on another W (the same
  global batch) every rank loads the sampler's state, which re-shards the rest of the epoch
  over the new ranks; a checkpoint at an epoch's last step resumes into the next epoch.
  ``losses.jsonl`` is cut back to the checkpoint's step first.
- **Log**: rank 0 appends one JSON line per step to ``WORKDIR/losses.jsonl``: the step, the
  loss (the mean of the ranks' losses, as a float that round-trips exactly), the step's rows
  (each named by the index of its first token in ``tokens.bin``, sorted), the step time; and
  one line per evaluation.
- **Evaluation** every ``--eval-every`` steps and at the end: the held-out rows with
  ``pad=False``, so that every row counts once whatever W; the ranks all-reduce the loss sum
  and the token count.
- ``--train-files N``: train on the store's first N files only (quick runs, tests).
- ``--fail-at STEP``: rank 0 kills itself (SIGKILL) after that step in a run that did not
  resume, as a fault would; under ``torchrun --max-restarts 1`` the next attempt resumes.
- ``--plot RUN [RUN ...] --out FILE`` (no torchrun): the runs' loss curves on one figure,
  and below them each run's difference from the first. Needs matplotlib
  (``pip install matplotlib``, or fastshard's ``bench`` extra).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import sys
import sysconfig
import time
import warnings
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import fastshard

TOKEN_DTYPE = np.uint16  # written to meta.json, read from there and passed to PackedTokens
EOT = 256  # closes every file
VOCAB_SIZE = 257


# -- the token store -------------------------------------------------------------------------
def stdlib_files() -> list[Path]:
    """The standard library's .py files in a fixed order (installed packages left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages"))
        files += [Path(folder, n) for n in sorted(names) if n.endswith(".py")]
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


def write_split(folder: Path, docs: list[bytes]) -> None:
    lengths = np.array([len(d) + 1 for d in docs], dtype=np.int64)  # + EOT
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.empty(int(offsets[-1]), dtype=TOKEN_DTYPE)
    for d, start, stop in zip(docs, offsets[:-1], offsets[1:]):
        tokens[start : stop - 1] = np.frombuffer(d, dtype=np.uint8)
        tokens[stop - 1] = EOT
    folder.mkdir(parents=True)
    tokens.tofile(folder / "tokens.bin")
    np.save(folder / "offsets.npy", offsets)


def build_store(data: Path, holdout: int) -> None:
    """tokens.bin + offsets.npy for a train and a held-out split, in a temporary folder
    renamed into place when complete."""
    tmp = data.with_name(data.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    train, held = [], []
    for i, path in enumerate(stdlib_files()):
        text = path.read_bytes()
        if text:  # empty files (many __init__.py) are left out: EOT alone teaches nothing
            (held if i % holdout == holdout - 1 else train).append(text)
    write_split(tmp / "train", train)
    write_split(tmp / "heldout", held)
    meta = {"source": "stdlib .py", "python": sys.version.split()[0],
            "dtype": np.dtype(TOKEN_DTYPE).name,
            "vocab_size": VOCAB_SIZE, "eot": EOT, "holdout": holdout,
            "files": {"train": len(train), "heldout": len(held)}}  # fmt: skip
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, data)


class Rows(Dataset):
    """A row spec of the sampler -> (input_ids, row id): the tokens through
    ``fastshard.PackedTokens``; the row's id is the index in tokens.bin of its first token
    (in concat mode a token lies in exactly one row of an epoch, so ids are unique)."""

    def __init__(self, split: Path, seq_len: int, dtype: np.dtype) -> None:
        self.offsets = np.load(split / "offsets.npy")  # n + 1 int64: small
        # A raw .bin records no dtype: it is stated (from meta.json), never guessed. A store
        # given by paths pickles as its paths: each DataLoader worker maps the file itself.
        store = fastshard.TokenStore.flat(split / "tokens.bin", split / "offsets.npy", dtype=dtype)
        self.lengths = store.lengths
        self.tokens = fastshard.PackedTokens(store, seq_len)

    def __getitem__(self, row: np.ndarray) -> tuple[torch.Tensor, int]:
        doc, start, _ = row[0]
        return self.tokens[row]["input_ids"], int(self.offsets[doc] + start)


def collate(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([ids for ids, _ in items]), torch.tensor([r for _, r in items])


# -- the run ---------------------------------------------------------------------------------
def make_model(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=args.dim,
        intermediate_size=args.dim * 8 // 3 // 8 * 8,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.seq_len,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=EOT,
        pad_token_id=None,
    )
    torch.manual_seed(args.seed)  # the same initial weights on every rank and every W
    return LlamaForCausalLM(config).to(torch.float32)


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warmup, then a cosine to a tenth: a function of the step, nothing to save."""
    warmup = max(1, args.steps // 20)
    if step < warmup:
        return args.lr * (step + 1) / warmup
    done = (step - warmup) / max(1, args.steps - warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(done, 1.0))))


def latest_checkpoint(workdir: Path) -> Path | None:
    done = sorted((workdir / "ckpt").glob("step_[0-9]*[0-9]"))
    return done[-1] if done else None


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        self.workdir = Path(args.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        data = Path(args.data)
        if self.rank == 0 and not data.exists():
            build_store(data, args.holdout)
        dist.barrier()
        meta = json.loads((data / "meta.json").read_text())
        dtype = np.dtype(meta["dtype"])  # the tokens are read as the store says they are kept
        self.train = Rows(data / "train", args.seq_len, dtype)
        self.heldout = Rows(data / "heldout", args.seq_len, dtype)
        lengths = self.train.lengths[: args.train_files]  # all of them by default
        self.sampler = fastshard.PackedSampler(
            lengths, args.seq_len, mode="concat", seed=args.seed
        )  # num_replicas and rank from the process group
        # Every epoch is the same whole number of steps on any W of the same global batch, so
        # that a step trains on the same rows whatever W: the epoch's last rows, fewer than a
        # global batch, are left out (as padding would otherwise be read).
        self.steps_per_epoch = self.sampler.num_rows // self.global_batch
        if self.steps_per_epoch == 0:
            raise SystemExit(f"an epoch holds {self.sampler.num_rows} rows, fewer than a step")
        self.model = DistributedDataParallel(make_model(args).to(self.device))
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1
        )
        self.step = 0  # optimizer steps done; the epoch is step // steps_per_epoch
        self.in_pass = 0  # rows this rank took since the sampler's pass began (epoch or resume)
        self.loader = self.make_loader()

    def make_loader(self) -> Any:
        from torchdata.stateful_dataloader import StatefulDataLoader

        # torchdata 0.11 calls an API that torch 2.13 deprecated, once per iterator
        warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning)
        # The workers start once (persistent) and from a single-threaded fork server where
        # there is one, never forked from this rank for each epoch: a fork while one of the
        # process group's threads holds CPython 3.11's interpreter-list lock deadlocks the child
        # before its first line (gh-112275), and the other ranks then wait in the next
        # all-reduce (until --timeout).
        start = {}
        if "forkserver" in multiprocessing.get_all_start_methods():
            multiprocessing.set_forkserver_preload(["torch", "numpy", "fastshard"])
            start["multiprocessing_context"] = "forkserver"
        # A forkserver's workers are not the rank's children, so torch's check of the parent
        # never sees the rank die: a rank killed by a fault (--fail-at) would leave them and
        # the fork server running forever. fastshard's worker_init_fn ends them with the rank.
        return StatefulDataLoader(
            self.train,
            sampler=self.sampler,
            batch_size=self.args.batch_size,
            num_workers=2,
            collate_fn=collate,
            persistent_workers=True,
            worker_init_fn=fastshard.worker_init_fn,
            **start,
        )

    @property
    def global_batch(self) -> int:
        return self.world * self.args.accumulate * self.args.batch_size

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self) -> None:
        final = self.workdir / "ckpt" / f"step_{self.step:06d}"
        tmp = final.with_name(final.name + ".tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        if self.rank == 0:
            torch.save(
                {
                    "model": self.model.module.state_dict(),
                    "optimizer": self.opt.state_dict(),
                    # rank-free: the epoch and the global cursor, loadable on any W
                    "sampler": self.sampler.state_dict(consumed=self.in_pass),
                    "step": self.step,
                    "world": self.world,
                    "global_batch": self.global_batch,
                },
                tmp / "trainer.pt",
            )
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
               "python": random.getstate()}  # fmt: skip
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        loader = {"loader": self.loader.state_dict(), "rng": rng}
        torch.save(loader, tmp / f"rank{self.rank}.pt")
        dist.barrier()  # every rank has written
        if self.rank == 0:
            os.replace(tmp, final)
            for old in sorted((self.workdir / "ckpt").glob("step_[0-9]*[0-9]"))[: -self.args.keep]:
                shutil.rmtree(old)
        dist.barrier()  # nobody goes on (or dies) before the checkpoint is in place

    def load(self, folder: Path) -> None:
        ckpt = torch.load(folder / "trainer.pt", map_location=self.device, weights_only=False)
        if ckpt["global_batch"] != self.global_batch:
            raise SystemExit(
                f"the checkpoint's global batch is {ckpt['global_batch']} rows, this run's "
                f"{self.global_batch} (W x --accumulate x --batch-size): keep it, e.g. with "
                f"--accumulate {ckpt['global_batch'] // (self.world * self.args.batch_size)}"
            )
        self.model.module.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.step, self.in_pass = ckpt["step"], 0
        mid_epoch = self.step % self.steps_per_epoch != 0  # else the next epoch starts afresh
        if ckpt["world"] == self.world:  # this rank's loader exactly as it was, workers included
            mine = torch.load(folder / f"rank{self.rank}.pt", weights_only=False)
            if mid_epoch:
                self.loader.load_state_dict(mine["loader"])
            rng = mine["rng"]
            torch.set_rng_state(rng["torch"])
            np.random.set_state(rng["numpy"])
            random.setstate(rng["python"])
            if "cuda" in rng and self.device.type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"], self.device)
        elif mid_epoch:  # the rest of the epoch re-sharded over this W; the loader starts afresh
            self.sampler.load_state_dict(ckpt["sampler"])
        if self.rank == 0:  # the log as it was at the checkpoint
            log = self.workdir / "losses.jsonl"
            kept = []
            for line in log.read_text().splitlines() if log.exists() else []:
                try:
                    record = json.loads(line)
                except ValueError:  # the line a kill cut short
                    continue
                if record.get("step", record.get("eval_step", 0)) <= self.step:
                    kept.append(line)
            log.write_text("".join(k + "\n" for k in kept))

    # -- steps --------------------------------------------------------------------------------
    def batches(self) -> Any:
        """This rank's micro-batches, steps_per_epoch x --accumulate of them an epoch."""
        while True:  # at the start of a step
            epoch, done = divmod(self.step, self.steps_per_epoch)
            if done == 0:  # a new epoch, not one resumed in its middle
                self.sampler.set_epoch(epoch)
                self.in_pass = 0
            loader = iter(self.loader)  # after a resume: from the checkpoint's point on
            for _ in range((self.steps_per_epoch - done) * self.args.accumulate):
                batch = next(loader)
                self.in_pass += self.args.batch_size
                yield batch

    def train_step(self, batches: Any) -> dict[str, Any]:
        args, t0 = self.args, time.perf_counter()
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step, args)
        loss_sum = torch.zeros((), device=self.device)
        rows = []
        for micro in range(args.accumulate):
            ids, row_ids = next(batches)
            ids = ids.to(self.device)
            # gradients are all-reduced on the last micro-batch only
            sync = micro == args.accumulate - 1
            with nullcontext() if sync else self.model.no_sync():
                loss = self.model(input_ids=ids, labels=ids).loss
                (loss / args.accumulate).backward()
            loss_sum += loss.detach()
            rows.append(row_ids)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        # the step's loss (the mean over its micro-batches and ranks) and its rows, on rank 0
        dist.all_reduce(loss_sum)
        mine = torch.cat(rows).to(self.device)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        return {
            "step": self.step,
            "epoch": (self.step - 1) // self.steps_per_epoch,
            "loss": (loss_sum / (self.world * args.accumulate)).item(),
            "rows": sorted(torch.cat(every).tolist()),
            "lr": lr_at(self.step - 1, args),
            "step_time": round(time.perf_counter() - t0, 4),
        }

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Every held-out row exactly once over the ranks (pad=False: shards differ by at most
        one row), summed in float64 and all-reduced."""
        sampler = fastshard.PackedSampler(
            self.heldout.lengths, self.args.seq_len, mode="concat", seed=self.args.seed, pad=False
        )
        loader = DataLoader(
            self.heldout, sampler=sampler, batch_size=4 * self.args.batch_size, collate_fn=collate
        )
        model = self.model.module
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)  # loss sum, tokens
        for ids, _ in loader:
            ids = ids.to(self.device)
            logits = model(input_ids=ids).logits[:, :-1]
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
            )
            total[0] += loss.double()
            total[1] += ids[:, 1:].numel()
        model.train()
        dist.all_reduce(total)
        return {"eval_step": self.step, "eval_loss": (total[0] / total[1]).item(),
                "eval_tokens": int(total[1]), "eval_rows": sampler.num_rows}  # fmt: skip

    def run(self) -> None:
        args = self.args
        ckpt = latest_checkpoint(self.workdir)
        if ckpt is not None:
            self.load(ckpt)
        resumed = ckpt is not None
        log = open(self.workdir / "losses.jsonl", "a") if self.rank == 0 else None

        def write(record: dict[str, Any]) -> None:
            if log is not None:
                log.write(json.dumps(record) + "\n")
                log.flush()

        if self.rank == 0:
            n = sum(p.numel() for p in self.model.parameters())
            where = f"step {self.step} ({ckpt})" if resumed else "step 0"
            print(f"{self.world} ranks x {args.accumulate} x {args.batch_size} rows of "
                  f"{args.seq_len} tokens a step, {n:,} parameters, from {where}; "
                  f"{self.steps_per_epoch:,} steps an epoch", flush=True)  # fmt: skip
        if resumed:
            write({"resumed_at": self.step, "world": self.world, "accumulate": args.accumulate})
        batches = self.batches()
        while self.step < args.steps:
            record = self.train_step(batches)
            write(record)
            if self.rank == 0 and self.step % args.print_every == 0:
                print(f"step {self.step}: loss {record['loss']:.4f}, "
                      f"{record['step_time']:.3f} s", flush=True)  # fmt: skip
            # evaluate before the checkpoint: a run resumed from it has this step's evaluation
            if args.eval_every and self.step % args.eval_every == 0 and self.step < args.steps:
                write(self.evaluate())
            if self.step % args.ckpt_every == 0 or self.step == args.steps:
                self.save()
            if self.step == args.fail_at and not resumed and self.rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)  # a fault: no clean-up of any kind
        result = self.evaluate()
        write(result)
        if self.rank == 0:
            print(f"held-out loss {result['eval_loss']:.4f} over {result['eval_rows']:,} rows",
                  flush=True)  # fmt: skip


# -- the figure ------------------------------------------------------------------------------
def read_log(run: Path) -> tuple[dict[int, float], list[int]]:
    losses, resumes = {}, []
    for line in (run / "losses.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            losses[record["step"]] = record["loss"]
        elif "resumed_at" in record:
            resumes.append(record["resumed_at"])
    return losses, resumes


def plot(runs: list[Path], labels: list[str] | None, out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = [read_log(r) for r in runs]
    labels = labels or [str(r) for r in runs]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]}
    )
    base = logs[0][0]
    for (losses, resumes), label, style in zip(logs, labels, ["-", "--", ":", "-."] * 4):
        steps = sorted(losses)
        top.plot(steps, [losses[s] for s in steps], style, lw=1.6, label=label)
        common = [s for s in steps if s in base]
        bottom.plot(common, [losses[s] - base[s] for s in common], style, lw=1.2, label=label)
        for r in resumes:
            top.axvline(r, color="grey", lw=0.8, ls=":")
            bottom.axvline(r, color="grey", lw=0.8, ls=":")
    top.set_ylabel("training loss (nats per token)")
    top.legend()
    top.grid(alpha=0.3)
    bottom.set_ylabel(f"loss - {labels[0]}")
    bottom.set_xlabel("step")
    bottom.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", help="checkpoints and losses.jsonl")
    p.add_argument("--data", default="data/stdlib", help="the token store (built if missing)")
    p.add_argument("--holdout", type=int, default=50, help="every HOLDOUT-th file is held out")
    p.add_argument("--train-files", type=int, help="train on the store's first N files only")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8, help="rows per rank per micro-batch")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--keep", type=int, default=3, help="checkpoints kept (0: all)")
    p.add_argument("--eval-every", type=int, default=0, help="0: at the end only")
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--fail-at", type=int, default=-1, help="SIGKILL rank 0 after this step")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for a collective")
    p.add_argument("--plot", nargs="+", type=Path, metavar="RUN", help="plot these runs' logs")
    p.add_argument("--labels", nargs="+", help="with --plot: a label per run")
    p.add_argument("--out", type=Path, default=Path("loss.png"), help="with --plot")
    args = p.parse_args()
    if args.plot:
        plot(args.plot, args.labels, args.out)
        return 0
    if not args.workdir:
        p.error("--workdir is required to train")
    missing = [m for m in ("transformers", "torchdata") if importlib.util.find_spec(m) is None]
    if missing:
        p.error(
            f"training needs {' and '.join(missing)}: pip install transformers torchdata (or fastshard's integrations extra)"
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        Trainer(args).run()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
