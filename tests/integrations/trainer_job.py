"""fastshard's samplers inside the transformers Trainer (built on accelerate), on 2 CPU ranks
under torchrun.

    torchrun --nproc_per_node=2 trainer_job.py REPORT.json WORKDIR

The documented way: fastshard.transformers.FastshardTrainer, whose training sampler is a
global fastshard order (num_replicas=1) that accelerate splits by batches. Scenarios: 2 epochs that way; a
mid-epoch checkpoint resumed with resume_from_checkpoint; the natural misuse (a sampler that
shards over the ranks itself), which must raise. Rank 0 writes {scenario: result}.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from _common import (
    BATCH,
    PACKED_BATCH,
    SEQ_LEN,
    STREAM_SIZES,
    IndexDataset,
    corpus,
    flat,
    gather,
    report,
    run,
    start_workers_by_forkserver,
    stream_read,
    summary,
    token_summary,
)
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

import fastshard
from fastshard.transformers import FastshardTrainer

REPORT, WORKDIR = sys.argv[1], Path(sys.argv[2])
hf_logging.set_verbosity_error()
ds = IndexDataset()


class Recorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[int] = []

    def forward(self, idx: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.training:
            self.seen.extend(idx.tolist())
        return {"loss": self.layer(x).pow(2).mean()}


class PerEpoch(TrainerCallback):
    """Gathers what the ranks trained on at the end of each epoch."""

    def __init__(self, model: Recorder) -> None:
        self.model = model
        self.epochs: dict[int, list[int]] = {}

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        epoch = round(state.epoch) - 1 if state.epoch == int(state.epoch) else int(state.epoch)
        self.epochs[epoch] = flat(gather(self.model.seen))
        self.model.seen = []


class MisusedTrainer(Trainer):
    """The natural misuse: a sampler that shards over the ranks itself."""

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        dataset = self.train_dataset if train_dataset is None else train_dataset
        return fastshard.DistributedSampler(dataset, seed=self.args.seed)


def args(name: str, **kw: Any) -> TrainingArguments:
    kw.setdefault("num_train_epochs", 2)
    kw.setdefault("per_device_train_batch_size", BATCH)
    kw.setdefault("dataloader_num_workers", 0)
    return TrainingArguments(
        output_dir=str(WORKDIR / name),
        use_cpu=True,
        ddp_backend="gloo",
        ddp_timeout=120,
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
        seed=5,
        **kw,
    )


def train(
    cls: type, name: str, resume: str | None = None, data: Any = ds, **kw: Any
) -> tuple[Recorder, PerEpoch]:
    model = Recorder()
    per_epoch = PerEpoch(model)
    trainer = cls(model=model, args=args(name, **kw), train_dataset=data, callbacks=[per_epoch])
    trainer.train(resume_from_checkpoint=resume)
    return model, per_epoch


def documented() -> dict[str, Any]:
    _, per_epoch = train(FastshardTrainer, "documented", save_strategy="no")
    return {"epochs": {str(e): summary([items]) for e, items in per_epoch.epochs.items()}}


def resume() -> dict[str, Any]:
    """Stop at step 70 (20 steps into epoch 1 of 50 steps) with a checkpoint there, then
    resume_from_checkpoint to the end of epoch 1."""
    first_model, first = train(
        FastshardTrainer, "resume", save_strategy="steps", save_steps=70, max_steps=70
    )
    before = first.epochs.get(1) or flat(gather(first_model.seen))
    ckpt = WORKDIR / "resume" / "checkpoint-70"
    _, second = train(FastshardTrainer, "resume", resume=str(ckpt), save_strategy="no")
    after = second.epochs.get(1, [])
    return {
        "epoch0": summary([first.epochs.get(0, [])]),
        "before": summary([before]),
        "after": summary([after]),
        "together": summary([before, after]),
        "resumed_epochs": sorted(second.epochs),
    }


def misuse() -> dict[str, Any]:
    _, per_epoch = train(MisusedTrainer, "misuse", save_strategy="no", num_train_epochs=1)
    return {"epochs": {str(e): summary([items]) for e, items in per_epoch.epochs.items()}}


def strategy(name: str) -> dict[str, Any]:
    """TrainingArguments(train_sampling_strategy=name): honoured, or refused on every rank."""
    _, per_epoch = train(
        FastshardTrainer, name, save_strategy="no", num_train_epochs=1,
        train_sampling_strategy=name,
    )  # fmt: skip
    return {"epochs": {str(e): summary([items]) for e, items in per_epoch.epochs.items()}}


class PackedModel(torch.nn.Module):
    """Records the tokens of the packed rows it trains on (each token is its position)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[int] = []

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: Any = None,
        shift_labels: Any = None,
        position_ids: Any = None,
        cu_seqlens: Any = None,
        max_seqlen: Any = None,
    ) -> dict[str, torch.Tensor]:
        if self.training:
            self.seen.extend(input_ids.flatten().tolist())
        return {"loss": self.layer(input_ids[:, :4].float() / 1e4).pow(2).mean()}


class PackedTrainer(FastshardTrainer):
    """FastshardTrainer over packed rows: make_train_sampler returns a global PackedSampler."""

    def make_train_sampler(self, dataset: Any) -> Any:
        _, _, lengths = corpus()
        return fastshard.PackedSampler(
            lengths, SEQ_LEN, num_replicas=1, rank=0, seed=self.args.seed
        )


def packed() -> dict[str, Any]:
    tokens, offsets, lengths = corpus()
    data = fastshard.PackedTokens(tokens, offsets, SEQ_LEN, lengths=lengths)
    model = PackedModel()
    per_epoch = PerEpoch(model)  # type: ignore[arg-type]
    rows = fastshard.PackedSampler(lengths, SEQ_LEN, num_replicas=1, rank=0).num_rows
    # PackedTokens has no len() (its rows come from the sampler), so the Trainer needs
    # max_steps: 2 epochs of ceil(rows / (B * 2 processes)) steps.
    steps = -(-rows // (PACKED_BATCH * 2))
    trainer = PackedTrainer(
        model=model,
        args=args(
            "packed", save_strategy="no", per_device_train_batch_size=PACKED_BATCH,
            remove_unused_columns=False, max_steps=2 * steps,
        ),
        train_dataset=data,
        data_collator=fastshard.collate_rows,
        callbacks=[per_epoch],
    )  # fmt: skip
    trainer.train()
    return {"epochs": {str(e): token_summary([t], rows) for e, t in per_epoch.epochs.items()}}


def stream(num_replicas: int | None) -> dict[str, Any]:
    """The plain Trainer with a ShardedStream as train_dataset and 2 loader workers: global
    (num_replicas=1, which accelerate dispatches, the Trainer setting its epoch), or sharded
    over the ranks (refused on every rank)."""
    rank = None if num_replicas is None else 0
    data = fastshard.ShardedStream(
        STREAM_SIZES, stream_read, batch_size=BATCH, num_replicas=num_replicas, rank=rank, seed=3
    )
    name = "stream" if num_replicas else "stream_misuse"
    _, per_epoch = train(Trainer, name, data=data, save_strategy="no", dataloader_num_workers=2)
    return {"epochs": {str(e): summary([items]) for e, items in per_epoch.epochs.items()}}


if __name__ == "__main__":
    start_workers_by_forkserver("transformers", "accelerate")
    results: dict[str, Any] = {}
    run("documented", documented, results)
    run("sequential", lambda: strategy("sequential"), results)
    run("group_by_length", lambda: strategy("group_by_length"), results)
    run("packed", packed, results)
    run("resume", resume, results)
    run("misuse", misuse, results)
    run("stream", lambda: stream(1), results)
    run("stream_misuse", lambda: stream(None), results)
    report(REPORT, results)
