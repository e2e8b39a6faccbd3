"""fastshard's samplers inside Lightning's Trainer, on 2 CPU ranks under Lightning's own DDP
launcher (it starts rank 1 by running this script again).

    python lightning_job.py REPORT.json WORKDIR [lightning|pytorch_lightning]

Each scenario is one Trainer.fit on the same process group; rank 0 writes
{scenario: result} to REPORT.json. tests/test_integrations.py asserts on it.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import (
    BATCH,
    MIX_SIZES,
    MIX_WEIGHTS,
    PACKED_BATCH,
    SEQ_LEN,
    STREAM_SIZES,
    TIMEOUT,
    IndexDataset,
    N,
    corpus,
    flat,
    gather,
    mixture_counts,
    report,
    run,
    start_workers_by_forkserver,
    stream_read,
    summary,
    token_summary,
)
from torch.utils.data import DataLoader

import fastshard

REPORT, WORKDIR = sys.argv[1], Path(sys.argv[2])
FLAVOUR = sys.argv[3] if len(sys.argv) > 3 else "lightning"
pl: Any = importlib.import_module(
    "lightning.pytorch" if FLAVOUR == "lightning" else "pytorch_lightning"
)
StatefulDataLoader = importlib.import_module("torchdata.stateful_dataloader").StatefulDataLoader

N_VAL = 101  # odd: with 2 ranks, padding would repeat one item
warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*sync_dist=True.*")


class Recorder(pl.LightningModule):
    """Records the index of every item it trains or validates on; gathers per epoch.

    The loaders are built in Lightning's hooks, as Lightning recommends: by then the process
    group exists, so the samplers find num_replicas and rank in it (as torch's would).
    """

    def __init__(self, train: Any, val: Any = None) -> None:
        super().__init__()
        self.make_train, self.make_val = train, val
        self.layer = torch.nn.Linear(4, 1)
        self.train_seen: list[int] = []
        self.val_seen: list[int] = []
        self.predicted: list[int] = []
        self.epochs: dict[int, dict[str, Any]] = {}
        self.val_epochs: list[dict[str, Any]] = []

    def training_step(self, batch: dict[str, torch.Tensor], _: int) -> torch.Tensor:
        self.train_seen.extend(batch["idx"].tolist())
        return self.layer(batch["x"]).pow(2).mean()

    def validation_step(self, batch: dict[str, torch.Tensor], _: int) -> None:
        self.val_seen.extend(batch["idx"].tolist())

    def predict_step(self, batch: dict[str, torch.Tensor], _: int) -> None:
        self.predicted.extend(batch["idx"].tolist())

    def on_train_epoch_end(self) -> None:
        per_rank = gather(self.train_seen)
        self.epochs[self.current_epoch] = summary(per_rank) | {"items": sorted(flat(per_rank))}
        batches = getattr(getattr(self, "train_loader", None), "batch_sampler", None)
        if isinstance(batches, fastshard.LengthGroupedBatchSampler):
            self.epochs[self.current_epoch]["len"] = len(batches)
        self.train_seen = []

    def on_validation_epoch_end(self) -> None:
        self.val_epochs.append(summary(gather(self.val_seen), N_VAL))
        self.val_seen = []

    def train_dataloader(self) -> Any:
        self.train_loader = self.make_train()
        return self.train_loader

    def val_dataloader(self) -> Any:
        return self.make_val() if self.make_val else []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(**kw: Any) -> Any:
    kw.setdefault("max_epochs", 2)
    kw.setdefault("enable_checkpointing", False)
    return pl.Trainer(
        accelerator="cpu",
        strategy=pl.strategies.DDPStrategy(timeout=TIMEOUT),  # every collective times out
        devices=2,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def epochs_of(model: Recorder) -> dict[str, Any]:
    return {str(e): {k: v for k, v in s.items() if k != "items"} for e, s in model.epochs.items()}


ds = IndexDataset()


def natural_sampler() -> dict[str, Any]:
    """DataLoader(sampler=fastshard.DistributedSampler) with validation, pad=False."""
    val_ds = IndexDataset(N_VAL)
    model = Recorder(
        lambda: DataLoader(ds, sampler=fastshard.DistributedSampler(ds, seed=7), batch_size=BATCH),
        lambda: DataLoader(
            val_ds,
            sampler=fastshard.DistributedSampler(val_ds, shuffle=False, pad=False),
            batch_size=BATCH,
        ),
    )
    t = trainer()
    t.fit(model)
    sampler = t.train_dataloader.sampler
    return {
        "epochs": epochs_of(model),
        "validation": model.val_epochs,
        "sampler_kept": type(sampler).__module__ + "." + type(sampler).__name__,
        "sampler_epoch": sampler.epoch,
    }


def weighted() -> dict[str, Any]:
    model = Recorder(
        lambda: DataLoader(
            ds,
            sampler=fastshard.WeightedDistributedSampler(torch.ones(N), seed=3),
            batch_size=BATCH,
        )
    )
    trainer().fit(model)
    return {"epochs": epochs_of(model)}


def mixture() -> dict[str, Any]:
    """DataLoader(sampler=fastshard.MixtureSampler(...)): kept as a DistributedSampler."""
    model = Recorder(
        lambda: DataLoader(
            ds, sampler=fastshard.MixtureSampler(MIX_SIZES, MIX_WEIGHTS, seed=4), batch_size=BATCH
        )
    )
    trainer().fit(model)
    out = {}
    for e, s in model.epochs.items():
        out[str(e)] = {k: v for k, v in s.items() if k != "items"} | mixture_counts([s["items"]])
    return {"epochs": out}


class PackedRecorder(Recorder):
    """Records the tokens of every packed row it trains on (each token is its position)."""

    def training_step(self, batch: dict[str, Any], _: int) -> torch.Tensor:
        self.train_seen.extend(batch["input_ids"].flatten().tolist())
        return self.layer(batch["input_ids"][:, :4].float()).pow(2).mean() * 0.0

    def on_train_epoch_end(self) -> None:
        self.epochs[self.current_epoch] = {"per_rank": gather(self.train_seen)}
        self.train_seen = []


def packed() -> dict[str, Any]:
    """DataLoader(PackedTokens, sampler=fastshard.PackedSampler(...), batch_size=B): kept as a
    DistributedSampler; Lightning sets its epoch."""
    tokens, offsets, lengths = corpus()
    data = fastshard.PackedTokens(tokens, offsets, SEQ_LEN, lengths=lengths)
    rows: list[int] = []

    def loader() -> Any:
        sampler = fastshard.PackedSampler(lengths, SEQ_LEN, seed=6)
        rows.append(sampler.num_rows)
        return DataLoader(
            data, sampler=sampler, batch_size=PACKED_BATCH, collate_fn=fastshard.collate_rows
        )

    model = PackedRecorder(loader)
    trainer().fit(model)
    return {
        "epochs": {str(e): token_summary(s["per_rank"], rows[0]) for e, s in model.epochs.items()}
    }


def batch_sampler(use_distributed_sampler: bool) -> dict[str, Any]:
    model = Recorder(
        lambda: DataLoader(
            ds,
            batch_sampler=fastshard.BatchSampler(fastshard.DistributedSampler(ds, seed=5), BATCH),
        )
    )
    trainer(use_distributed_sampler=use_distributed_sampler).fit(model)
    return {"epochs": epochs_of(model)}


def resume(stateful: bool) -> dict[str, Any]:
    """Stop at step 70 (20 batches into epoch 1, 50 steps per epoch) with a checkpoint every
    10 steps, then fit again from that checkpoint to the end of epoch 1."""
    loader_cls = StatefulDataLoader if stateful else DataLoader
    ckdir = WORKDIR / f"ckpt-{'stateful' if stateful else 'plain'}"

    def loader() -> Any:
        return loader_cls(ds, sampler=fastshard.DistributedSampler(ds, seed=11), batch_size=BATCH)

    first = Recorder(loader)
    cb = pl.callbacks.ModelCheckpoint(dirpath=ckdir, every_n_train_steps=10, save_top_k=-1)
    trainer(max_steps=70, enable_checkpointing=True, callbacks=[cb]).fit(first)
    # Lightning ends the interrupted epoch's hooks at max_steps too; else gather what is left.
    before = first.epochs[1]["items"] if 1 in first.epochs else flat(gather(first.train_seen))
    ckpts = sorted(ckdir.glob("*step=70*.ckpt"))
    second = Recorder(loader)
    trainer().fit(second, ckpt_path=str(ckpts[0]))
    after = second.epochs[1]["items"]
    together = summary([before, after])
    return {
        "epoch0": epochs_of(first).get("0"),
        "before": summary([before]),
        "after": {k: v for k, v in second.epochs[1].items() if k != "items"},
        "together": together,
        "resumed_epochs": sorted(second.epochs),
    }


# Item lengths for the length-grouped scenarios: uniform-ish in [1, 300), as in issue 24.
LENGTHS = np.array([(i * 7919) % 299 + 1 for i in range(N)], dtype=np.int64)


def length_grouped() -> dict[str, Any]:
    """The documented set-up for length-grouped batches: batch_sampler=, with
    use_distributed_sampler=False, 3 epochs. Lightning sizes the epoch once (from len())
    and reaches the epoch through batch_sampler.sampler.set_epoch."""

    def loader() -> Any:
        bs = fastshard.LengthGroupedBatchSampler(LENGTHS, max_tokens=2048, sort_window=64, seed=5)
        return DataLoader(ds, batch_sampler=bs)

    model = Recorder(loader)
    t = trainer(use_distributed_sampler=False, max_epochs=3)
    t.fit(model)
    return {"epochs": epochs_of(model), "sampler_epoch": t.train_dataloader.batch_sampler.epoch}


def predict(kind: str) -> dict[str, Any]:
    """trainer.predict rebuilds every batch sampler (with drop_last=False), even with
    use_distributed_sampler=False. pad=False: every item predicted exactly once."""
    if kind == "BatchSampler":
        sampler = fastshard.DistributedSampler(ds, shuffle=False, pad=False)
        batches: Any = fastshard.BatchSampler(sampler, BATCH)
    else:
        batches = fastshard.LengthGroupedBatchSampler(LENGTHS, BATCH, pad=False, seed=5)
    model = Recorder(lambda: None)
    t = trainer(use_distributed_sampler=False)
    t.predict(model, dataloaders=DataLoader(ds, batch_sampler=batches), return_predictions=False)
    return {"predicted": summary(gather(model.predicted))}


def stream() -> dict[str, Any]:
    """DataLoader(fastshard.ShardedStream(...), num_workers=2), 3 epochs: Lightning sets no
    epoch on a dataset, so auto_epoch advances it, in workers started afresh every epoch."""
    lens: list[int] = []

    def loader() -> Any:
        data = fastshard.ShardedStream(
            STREAM_SIZES, stream_read, batch_size=BATCH, seed=8, auto_epoch=True
        )
        lens.append(len(data))
        return DataLoader(data, batch_size=BATCH, num_workers=2)

    model = Recorder(loader)
    t = trainer(max_epochs=3)
    t.fit(model)
    return {"epochs": epochs_of(model), "len": lens, "batches": t.num_training_batches}


def stream_cut() -> dict[str, Any]:
    """The stream recipe with epochs cut short (limit_train_batches: 5 of 50 batches) and
    persistent workers: each epoch still starts the next epoch's order."""

    def loader() -> Any:
        data = fastshard.ShardedStream(
            STREAM_SIZES, stream_read, batch_size=BATCH, seed=8, auto_epoch=True
        )
        return DataLoader(data, batch_size=BATCH, num_workers=2, persistent_workers=True)

    model = Recorder(loader)
    t = trainer(max_epochs=3, limit_train_batches=5)
    t.fit(model)
    return {"epochs": {str(e): s for e, s in model.epochs.items()}}


if __name__ == "__main__":
    start_workers_by_forkserver(
        "lightning.pytorch" if FLAVOUR == "lightning" else "pytorch_lightning"
    )
    results: dict[str, Any] = {"flavour": FLAVOUR}
    if FLAVOUR == "lightning":
        run("sampler", natural_sampler, results, barrier=False)
        run("weighted", weighted, results, barrier=False)
        run("mixture", mixture, results, barrier=False)
        run("packed", packed, results, barrier=False)
        run("batch_sampler", lambda: batch_sampler(True), results, barrier=False)
        run("batch_sampler_no_replace", lambda: batch_sampler(False), results, barrier=False)
        run("resume_stateful", lambda: resume(True), results, barrier=False)
        run("resume_plain", lambda: resume(False), results, barrier=False)
        run("length_grouped", length_grouped, results, barrier=False)
        run("predict_batch_sampler", lambda: predict("BatchSampler"), results, barrier=False)
        run("predict_length_grouped", lambda: predict("LengthGrouped"), results, barrier=False)
        run("stream", stream, results, barrier=False)
        run("stream_cut", stream_cut, results, barrier=False)
    else:
        run("sampler", natural_sampler, results, barrier=False)
    report(REPORT, results)
