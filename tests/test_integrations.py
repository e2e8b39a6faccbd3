"""fastshard inside the frameworks people train with, each run by its own launcher.

Lightning (its own DDP launcher), accelerate and the transformers Trainer (torchrun) run on
2 CPU ranks over gloo with a 1,000-item dataset whose items carry their index; every job
counts what the ranks trained on (all-gathered) and rank 0 writes a report these tests
assert on. torchdata.nodes and accelerate's batch splitting are also checked in process.

The frameworks come from the `integrations` extra (`pip install ".[test,integrations]"`).
Without them these tests skip, unless FASTSHARD_REQUIRE_INTEGRATIONS=1 (set by CI), which
turns a missing framework into a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler as TorchBatchSampler
from torch.utils.data.distributed import DistributedSampler as TorchDistributedSampler

import fastshard
from fastshard import BatchSampler, DistributedSampler, WeightedDistributedSampler

from .conftest import child_env, free_port, launch

JOBS = Path(__file__).resolve().parent / "integrations"
N, BATCH = 1000, 10
LAUNCH_TIMEOUT = 420


def require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    why = f"{', '.join(missing)} not installed (pip install '.[test,integrations]')"
    if os.environ.get("FASTSHARD_REQUIRE_INTEGRATIONS") == "1":
        pytest.fail(why)
    pytest.skip(why)


@pytest.mark.extended  # the reports come from launched jobs (see conftest.LAUNCHED_REPORTS)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is the default on Linux")
@pytest.mark.parametrize("job", ["lightning_report", "accelerate_report", "trainer_report"])
def test_jobs_start_loader_workers_from_a_forkserver(job, request):
    """Forked from a rank, a worker can deadlock before its first line (CPython gh-112275):
    the jobs start theirs from a forkserver (_common.start_workers_by_forkserver)."""
    assert request.getfixturevalue(job)["start_method"] == "forkserver"


def run_job(cmd: list[str], report: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    rc, out = launch(cmd, LAUNCH_TIMEOUT, env)
    assert rc == 0, f"exit {rc}:\n{out[-6000:]}"
    return json.loads(report.read_text())


def torchrun(job: str, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(JOBS / job), *args,
    ]  # fmt: skip


def once_each(summary: dict[str, Any], n: int = N) -> None:
    """Every item of [0, n) exactly once."""
    assert summary["total"] == n and summary["distinct"] == n, summary
    assert summary["repeated"] == 0 and summary["out_of_range"] == 0, summary


def two_fresh_epochs(epochs: dict[str, Any]) -> None:
    assert sorted(epochs) == ["0", "1"]
    for e in epochs.values():
        once_each(e)
    assert epochs["0"]["first"] != epochs["1"]["first"]  # a new order each epoch


# -- samplers are torch DistributedSamplers ----------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: DistributedSampler(list(range(10)), 2, 0),
        lambda: DistributedSampler(10, 2, 1, order="torch"),
        lambda: DistributedSampler(10, 2, 1, order="block", block_size=2),
        lambda: WeightedDistributedSampler([1.0, 2.0, 3.0], num_replicas=2, rank=0),
    ],
)
def test_every_sampler_is_a_torch_distributed_sampler(make):
    """Lightning, Ray Train and Composer keep a sampler in place only when it is one."""
    s = make()
    assert isinstance(s, TorchDistributedSampler)
    assert len(s) == s.num_samples and s.total_size >= len(s)
    assert len(s.dataset) >= 1  # torch code may read len(sampler.dataset)
    assert list(s) == s.indices().tolist()  # torch's __iter__ is not what runs


def test_dataset_attribute_is_meaningful():
    data = list(range(7))
    assert DistributedSampler(data, 2, 0).dataset is data
    assert WeightedDistributedSampler([0.5] * 7, num_replicas=2, rank=0).dataset == range(7)


def test_len_is_the_whole_epochs_also_while_a_resumed_pass_yields_the_rest():
    """A framework counts an epoch's batches from len() and the batches it ran from its
    checkpoint: a len() of only the rest would end a resumed epoch early."""
    for make in (
        lambda: DistributedSampler(1000, 2, 0, seed=3),
        lambda: DistributedSampler(1000, 2, 0, seed=3, order="block", block_size=8, window=2),
        lambda: WeightedDistributedSampler(torch.ones(1000), num_replicas=2, rank=0),
    ):
        s = make()
        it = iter(s)
        head = [next(it) for _ in range(120)]
        state = s.state_dict()
        t = make()
        t.load_state_dict(state)
        assert len(t) == 500 and t.num_samples == 500 and t.total_size == 1000
        assert t.remaining == 380 and make().remaining == 500
        rest = list(t)
        assert head + rest == list(make())
        b = BatchSampler(make(), BATCH)
        b.load_state_dict(state)
        assert len(b) == 50 and sum(len(x) for x in b) == 380


def test_batch_sampler_given_torchs_sampler_names_the_way_that_works():
    """What Lightning does to batch_sampler=fastshard.BatchSampler(...) by default."""
    torch_sampler = TorchDistributedSampler(list(range(10)), num_replicas=2, rank=0)
    with pytest.raises(TypeError, match="use_distributed_sampler=False") as err:
        BatchSampler(torch_sampler, 3)
    assert "sampler=fastshard_sampler" in str(err.value)
    with pytest.raises(TypeError, match="fastshard sampler, got SequentialSampler"):
        BatchSampler(torch.utils.data.SequentialSampler(range(3)), 3)


# -- accelerate's batch splitting, in process ---------------------------------------------------
def shard_of(batch_sampler: Any, processes: int, index: int) -> list[int]:
    from accelerate.data_loader import BatchSamplerShard

    shard = BatchSamplerShard(batch_sampler, num_processes=processes, process_index=index)
    return [i for batch in shard for i in batch]


@pytest.mark.parametrize("batched", [False, True], ids=["sampler", "BatchSampler"])
def test_accelerate_split_of_a_sharding_sampler_raises(batched):
    require("accelerate")
    s = DistributedSampler(N, 2, 0, seed=1)
    bs = BatchSampler(s, BATCH) if batched else TorchBatchSampler(s, BATCH, False)
    with pytest.raises(fastshard.ReshardedError, match="num_replicas=1"):
        shard_of(bs, 2, 0)


@pytest.mark.parametrize("batched", [False, True], ids=["sampler", "BatchSampler"])
def test_accelerate_split_of_a_global_order_covers_everything(batched):
    require("accelerate")
    for processes in (2, 3):
        seen = []
        for index in range(processes):  # each process has its own sampler, as under torchrun
            s = DistributedSampler(N, 1, 0, seed=1)
            bs = BatchSampler(s, BATCH) if batched else TorchBatchSampler(s, BATCH, False)
            seen += shard_of(bs, processes, index)
        # 100 batches over 3 processes: accelerate completes the last round from the start
        pad = -(100 // -processes) * processes - 100
        assert sorted(set(seen)) == list(range(N)) and len(seen) == N + pad * BATCH
    # one process: accelerate does not split, and a sampler over ranks is left alone
    assert len(shard_of(TorchBatchSampler(DistributedSampler(N, 2, 0), BATCH, False), 1, 0)) == 500


# -- torchdata.nodes, in process ----------------------------------------------------------------
def nodes_loader(rank: int) -> Any:
    from torchdata.nodes import Batcher, Loader, SamplerWrapper

    return Loader(Batcher(SamplerWrapper(DistributedSampler(N, 2, rank, seed=9)), BATCH))


def test_torchdata_nodes_epochs_advance_and_resume_exactly():
    require("torchdata")
    epochs: list[list[list[int]]] = [[], []]
    for rank in range(2):
        loader = nodes_loader(rank)
        for e in range(2):
            epochs[e].append([i for b in loader for i in b])  # SamplerWrapper sets the epoch
    for e in range(2):
        assert sorted(epochs[e][0] + epochs[e][1]) == list(range(N))
    assert epochs[0][0] != epochs[1][0]
    for rank in range(2):
        loader = nodes_loader(rank)
        for _ in loader:  # the first epoch, then the second one is interrupted
            pass
        it = iter(loader)
        head = [i for _ in range(17) for i in next(it)]
        state = loader.state_dict()
        resumed = nodes_loader(rank)
        resumed.load_state_dict(state)
        assert head + [i for b in resumed for i in b] == epochs[1][rank]


# -- the frameworks under their own launchers ---------------------------------------------------
@pytest.fixture(scope="module")
def lightning_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require("lightning", "torchdata")
    work = tmp_path_factory.mktemp("lightning")
    report = work / "report.json"
    env = child_env(MASTER_PORT=str(free_port()))
    return run_job(
        [sys.executable, str(JOBS / "lightning_job.py"), str(report), str(work)], report, env
    )


def test_lightning_keeps_the_sampler_and_covers_every_item(lightning_report):
    r = lightning_report["sampler"]
    assert "error" not in r, r
    assert r["sampler_kept"] == "fastshard._sampler.DistributedSampler"
    two_fresh_epochs(r["epochs"])
    assert r["sampler_epoch"] == 1  # through Lightning's own set_epoch calls
    # validation with pad=False: 101 items on 2 ranks, each once, every epoch
    assert len(r["validation"]) == 2
    for v in r["validation"]:
        once_each(v, 101)
        assert v["per_rank"] == [51, 50]


def test_lightning_keeps_the_weighted_sampler(lightning_report):
    r = lightning_report["weighted"]
    assert "error" not in r, r
    for e in r["epochs"].values():  # 1000 draws per epoch, not 500
        assert e["per_rank"] == [500, 500] and e["out_of_range"] == 0
    assert r["epochs"]["0"]["first"] != r["epochs"]["1"]["first"]


def mixture_epochs(epochs: dict[str, Any]) -> None:
    """N draws per epoch, 500 from each dataset, the second's 400 items once or twice each."""
    assert sorted(epochs) == ["0", "1"]
    for e in epochs.values():
        assert e["total"] == N and e["out_of_range"] == 0, e
        assert e["per_dataset"] == [500, 500] and e["second_counts"] == [1, 2], e
    assert epochs["0"]["first"] != epochs["1"]["first"]


def test_lightning_keeps_the_mixture_sampler(lightning_report):
    r = lightning_report["mixture"]
    assert "error" not in r, r
    mixture_epochs(r["epochs"])
    for e in r["epochs"].values():
        assert e["per_rank"] == [500, 500]


def test_lightning_batch_sampler_raises_with_the_way_that_works(lightning_report):
    r = lightning_report["batch_sampler"]
    assert r.get("error") == "TypeError", r
    assert "use_distributed_sampler=False" in r["message"]
    two_fresh_epochs(lightning_report["batch_sampler_no_replace"]["epochs"])


def test_lightning_mid_epoch_resume_with_a_stateful_loader_continues_the_epoch(
    lightning_report,
):
    r = lightning_report["resume_stateful"]
    assert "error" not in r, r
    once_each(r["epoch0"])
    assert r["before"]["total"] == 400  # 20 of epoch 1's 50 steps on 2 ranks
    assert r["after"]["total"] == 600 and r["resumed_epochs"] == [1]
    once_each(r["together"])


def test_lightning_mid_epoch_resume_with_a_plain_loader_replays_the_epochs_start(
    lightning_report,
):
    """What the docs say of a plain DataLoader: Lightning cannot resume it mid-epoch; it
    runs the rest of the epoch's steps from the start of the epoch's order (and warns)."""
    r = lightning_report["resume_plain"]
    assert "error" not in r, r
    assert r["after"]["total"] == 600
    assert r["together"]["distinct"] == 600 and r["together"]["repeated"] == 400


def test_lightning_length_grouped_epochs_are_fresh_and_whole(lightning_report):
    """Issue 24, cases 2 and 3: Lightning never reached the batch sampler's set_epoch
    (the same batches every epoch), and sized the epoch once while the token-budget batch
    count changed by epoch (epochs 1-3 trained 1,994 of 2,000 items)."""
    r = lightning_report["length_grouped"]
    assert "error" not in r, r
    epochs = r["epochs"]
    assert sorted(epochs) == ["0", "1", "2"]
    assert len({e["len"] for e in epochs.values()}) == 1  # one len() for every epoch
    for e in epochs.values():
        # padding repeats fewer than 2 batches; every item is trained every epoch
        assert e["distinct"] == N and e["out_of_range"] == 0, e
    firsts = [tuple(map(tuple, e["first"])) for e in epochs.values()]
    assert len(set(firsts)) == 3  # a fresh order every epoch
    assert r["sampler_epoch"] == 2


@pytest.mark.parametrize("kind", ["batch_sampler", "length_grouped"])
def test_lightning_predict_with_a_fastshard_batch_sampler(lightning_report, kind):
    """Issue 24, case 9: predict rebuilds every batch sampler, and used to fail with advice
    to set the option that was already set."""
    r = lightning_report[f"predict_{kind}"]
    assert "error" not in r, r
    once_each(r["predicted"])


# The launched jobs' tests (the *_report fixtures) are in the extended tier: tests/conftest.py.
@pytest.mark.extended  # a Lightning job of its own
def test_pytorch_lightning_import_name(tmp_path):
    require("pytorch_lightning")
    report = tmp_path / "report.json"
    env = child_env(MASTER_PORT=str(free_port()))
    cmd = [sys.executable, str(JOBS / "lightning_job.py"), str(report), str(tmp_path)]
    r = run_job([*cmd, "pytorch_lightning"], report, env)["sampler"]
    assert "error" not in r, r
    two_fresh_epochs(r["epochs"])


@pytest.fixture(scope="module")
def accelerate_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require("accelerate")
    report = tmp_path_factory.mktemp("accelerate") / "report.json"
    return run_job(torchrun("accelerate_job.py", str(report)), report)


@pytest.mark.parametrize("scenario", ["documented", "documented_batch_sampler"])
def test_accelerate_global_order_covers_every_item(accelerate_report, scenario):
    r = accelerate_report[scenario]
    assert "error" not in r, r
    two_fresh_epochs(r["epochs"])


def test_accelerate_weighted_global_order(accelerate_report):
    r = accelerate_report["weighted_documented"]
    assert "error" not in r, r
    for e in r["epochs"].values():
        assert e["per_rank"] == [500, 500] and e["out_of_range"] == 0


def test_accelerate_mixture_global_order(accelerate_report):
    r = accelerate_report["mixture_documented"]
    assert "error" not in r, r
    mixture_epochs(r["epochs"])


def test_accelerate_length_grouped_global_order(accelerate_report):
    """accelerate splits a global LengthGroupedBatchSampler's batches and sets its epoch."""
    r = accelerate_report["length_grouped_documented"]
    assert "error" not in r, r
    for e in r["epochs"].values():
        # accelerate completes the last round of batches from the start of the epoch
        assert e["distinct"] == N and e["out_of_range"] == 0, e
    assert r["epochs"]["0"]["first"] != r["epochs"]["1"]["first"]
    assert r["sampler_epoch"] == 1


@pytest.mark.parametrize("scenario", ["misuse", "misuse_batch_sampler"])
def test_accelerate_natural_misuse_raises(accelerate_report, scenario):
    r = accelerate_report[scenario]
    assert r.get("error") == "ReshardedError", r
    assert "num_replicas=1" in r["message"]


@pytest.mark.parametrize(
    "scenario", ["dispatch_misuse_stateful_workers", "dispatch_misuse"], ids=["stateful", "plain"]
)
def test_accelerate_dispatch_of_a_sharding_sampler_raises_on_every_rank(
    accelerate_report, scenario
):
    """dispatch_batches=True: process 0 iterates the loader and sends each process its part.
    Issue 24, cases 1 and 10: with a StatefulDataLoader and workers the first iteration
    happened inside prepare() and was not refused (epoch 0 trained on half the data); with
    a plain loader only rank 0 raised, rank 1 saw the connection close."""
    ranks = accelerate_report[scenario]["ranks"]
    assert len(ranks) == 2
    for r in ranks:
        assert r.get("error") == "ReshardedError", ranks
        assert "num_replicas=1" in r["message"] and "DataLoaderDispatcher" in r["message"]


@pytest.mark.parametrize(
    "scenario",
    ["dispatch_documented", "dispatch_documented_stateful_workers"],
    ids=["plain", "stateful"],
)
def test_accelerate_dispatch_of_a_global_order_covers_every_item(accelerate_report, scenario):
    r = accelerate_report[scenario]
    assert "error" not in r, r
    two_fresh_epochs(r["epochs"])


@pytest.fixture(scope="module")
def trainer_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require("transformers", "accelerate")
    work = tmp_path_factory.mktemp("trainer")
    report = work / "report.json"
    return run_job(torchrun("trainer_job.py", str(report), str(work)), report)


def test_trainer_covers_every_item_each_epoch(trainer_report):
    r = trainer_report["documented"]
    assert "error" not in r, r
    two_fresh_epochs(r["epochs"])


def test_trainer_resume_from_a_mid_epoch_checkpoint_continues_the_epoch(trainer_report):
    r = trainer_report["resume"]
    assert "error" not in r, r
    once_each(r["epoch0"])
    assert r["before"]["total"] == 400 and r["after"]["total"] == 600
    assert r["resumed_epochs"] == [1]
    once_each(r["together"])


def test_trainer_natural_misuse_raises(trainer_report):
    r = trainer_report["misuse"]
    assert r.get("error") == "ReshardedError", r
    assert "num_replicas=1" in r["message"]


def test_trainer_honours_a_sequential_sampling_strategy(trainer_report):
    r = trainer_report["sequential"]
    assert "error" not in r, r
    e = r["epochs"]["0"]
    once_each(e)
    assert e["first"] == [list(range(8))]  # rank 0's first batch: items 0-9, in order


def test_trainer_refuses_a_length_grouping_strategy_it_would_ignore(trainer_report):
    """Issue 24, case 6: group_by_length used to give a plain shuffled order, silently."""
    r = trainer_report["group_by_length"]
    assert r.get("error") == "ValueError", r
    assert "train_sampling_strategy='group_by_length'" in r["message"]


# -- PackedSampler under each framework ---------------------------------------------------------
def packed_epochs(epochs: dict[str, Any]) -> None:
    """Every epoch trains all of its rows' tokens (rows * seq_len distinct tokens, no token of
    the corpus out of range), a fresh row order each epoch."""
    assert sorted(epochs) == ["0", "1"]
    for e in epochs.values():
        assert e["distinct"] == e["expected"] and e["out_of_range"] == 0, e
    assert epochs["0"]["first"] != epochs["1"]["first"]


def test_lightning_keeps_the_packed_sampler(lightning_report):
    r = lightning_report["packed"]
    assert "error" not in r, r
    packed_epochs(r["epochs"])


def test_accelerate_packed_global_order(accelerate_report):
    r = accelerate_report["packed_documented"]
    assert "error" not in r, r
    packed_epochs(r["epochs"])


def test_trainer_packed_rows(trainer_report):
    r = trainer_report["packed"]
    assert "error" not in r, r
    packed_epochs(r["epochs"])


# -- fastshard.ShardedStream (an IterableDataset) under the frameworks ---------------------------
def test_lightning_stream_epochs_advance_in_fresh_workers(lightning_report):
    """Lightning sets no epoch on a dataset; auto_epoch advances the stream in the workers
    that every epoch starts afresh: 3 epochs, each every item once, each a new order."""
    r = lightning_report["stream"]
    assert "error" not in r, r
    assert sorted(r["epochs"]) == ["0", "1", "2"]
    for e in r["epochs"].values():
        once_each(e)
        assert e["per_rank"] == [500, 500]
    firsts = [r["epochs"][e]["first"] for e in ("0", "1", "2")]
    assert firsts[0] != firsts[1] != firsts[2] != firsts[0]
    assert r["len"] == [500] and r["batches"] == 50


def test_lightning_stream_epochs_cut_short_still_advance(lightning_report):
    """limit_train_batches stops every epoch after 5 batches: each epoch is still a new
    order (the next epoch of the stream), not the first 5 batches of epoch 0 again."""
    r = lightning_report["stream_cut"]
    assert "error" not in r, r
    assert sorted(r["epochs"]) == ["0", "1", "2"]
    items = []
    for e in ("0", "1", "2"):
        epoch = r["epochs"][e]
        assert epoch["per_rank"] == [50, 50] and epoch["repeated"] == 0, epoch
        items.append(tuple(epoch["items"]))
    assert len(set(items)) == 3, "an epoch cut short was read again"


def test_accelerate_dispatches_a_global_stream(accelerate_report):
    r = accelerate_report["stream_documented"]
    assert "error" not in r, r
    two_fresh_epochs(r["epochs"])
    assert r["len"] == 50


@pytest.mark.parametrize("scenario", ["stream_misuse_dispatch", "stream_misuse_shard"])
def test_accelerate_resharding_a_sharded_stream_raises_on_every_rank(accelerate_report, scenario):
    """num_replicas=2 under DataLoaderDispatcher (process 0 reads, splits) or under
    IterableDatasetShard (each process reads its share and keeps half): refused on both."""
    ranks = accelerate_report[scenario]["ranks"]
    assert len(ranks) == 2
    for r in ranks:
        assert r.get("error") == "ReshardedError" or "ReshardedError" in r.get("message", ""), ranks
        assert "num_replicas=1" in r["message"]


def test_trainer_trains_a_global_stream(trainer_report):
    r = trainer_report["stream"]
    assert "error" not in r, r
    two_fresh_epochs(r["epochs"])


def test_trainer_refuses_a_sharded_stream(trainer_report):
    r = trainer_report["stream_misuse"]
    assert r.get("error") == "ReshardedError", r
    assert "num_replicas=1" in r["message"]
