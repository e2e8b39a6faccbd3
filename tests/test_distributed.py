"""Real multi-process runs on gloo: shards across ranks, DataLoader workers, the rank-consistency
guard, seed=None, and the DDP example under torchrun.

Each world size starts its ranks once (tests/dist_worker.py runs every scenario on one process
group) and every test reads its scenario's result. Every launch has a timeout and is killed as a
process group when it runs out, so a hang fails a test instead of blocking the suite.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

import fastshard
from fastshard import DistributedSampler, InconsistentRanksError, WeightedDistributedSampler

from .conftest import child_env, free_port, kill_group, launch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "dist_worker.py"
EXAMPLE = HERE.parent / "examples" / "train_ddp.py"
LAUNCH_TIMEOUT = 420  # seconds for one world's whole run; a hang fails the launch


def launch_world(world: int, skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Run `world` ranks of dist_worker.py; each rank's {scenario: result}."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(world), str(port), ",".join(skip)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            cwd=tempfile.gettempdir(),  # never import fastshard from the source tree
            start_new_session=True,  # its own process group, DataLoader workers included
        )
        for r in range(world)
    ]
    finished: list[tuple[int | None, str, str]] = []
    try:
        for p in procs:
            try:
                out, err = p.communicate(timeout=LAUNCH_TIMEOUT)
                finished.append((p.returncode, out, err))
            except subprocess.TimeoutExpired:
                finished.append((None, "", ""))
    finally:
        for p in procs:
            kill_group(p)
        for p in procs:  # reap the killed ones and close their pipes
            if p.returncode is None:
                p.communicate()
    bad = [(r, code, err) for r, (code, _, err) in enumerate(finished) if code != 0]
    if bad:
        report = "\n".join(
            f"rank {r}: "
            + (
                f"did not finish in {LAUNCH_TIMEOUT} s (a hang?)"
                if code is None
                else f"exited {code}"
            )
            + f"\n{err[-3000:]}"
            for r, code, err in bad
        )
        pytest.fail(f"world {world}:\n{report}")
    outputs = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in finished]
    return [o["results"] for o in outputs]


# World size 2 is the default tier's real multi-process run; 3 ranks, the extended tier's.
@pytest.fixture(
    scope="module",
    params=[2, pytest.param(3, marks=pytest.mark.extended)],
    ids=lambda w: f"world{w}",
)
def world(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    w = request.param
    # Spawned DataLoader workers each import torch again: one world size covers them.
    return w, launch_world(w, skip=("loader_spawn",) if w != 2 else ())


def results(world: tuple[int, list[dict[str, Any]]], name: str) -> tuple[int, list[dict[str, Any]]]:
    w, ranks = world
    out = []
    for r, res in enumerate(ranks):
        got = res[name]
        assert "error" not in got, f"rank {r} failed {name}:\n{got['error']}"
        # The ranks made the same collective calls in this scenario (the sentinel agrees).
        assert got["in_step"], f"rank {r} is out of step after {name}"
        out.append(got)
    return w, out


# -- process group and plan ----------------------------------------------------------------
def test_defaults_come_from_the_process_group(world):
    w, res = results(world, "defaults")
    assert [(r["num_replicas"], r["rank"]) for r in res] == [(w, r) for r in range(w)]


def test_shards_are_the_plan_disjoint_and_complete(world):
    w, res = results(world, "shards")
    for r in res:
        assert r["checked"] == len({0, 1, w - 1, w + 1, 1000, 1001, 4099}) * 2 * 3 * 2
        assert r["failures"] == []


def test_dataloader_fork_workers_persistent(world):
    _, res = results(world, "loader_fork")
    for r in res:
        for ep in r["epochs"]:
            assert ep["counts_ok"] and ep["mine_ok"]
            # Forked workers inherit the process group, so a check there would have run (and hit
            # the collective forbidden in workers); the probe saw the group.
            assert ep["group_in_worker"] == [1]


def test_dataloader_spawn_workers_persistent(world):
    if world[0] != 2:
        pytest.skip("spawned workers are checked with 2 ranks only (start-up cost)")
    _, res = results(world, "loader_spawn")
    for r in res:
        for ep in r["epochs"]:
            assert ep["counts_ok"] and ep["mine_ok"]
            assert ep["group_in_worker"] == [0]  # the pickled sampler reached a fresh process


# -- the guard -----------------------------------------------------------------------------
def assert_raised_everywhere(res: list[dict[str, Any]], fields: dict[str, list[Any]]) -> None:
    for rank, r in enumerate(res):
        assert r["raised"] == "InconsistentRanksError", f"rank {rank} did not raise"
        assert r["fields"] == fields
        assert f"this is rank {rank}" in r["message"]
        for field in fields:
            assert f"\n  {field}: " in r["message"]
    # Apart from naming its own rank, every rank tells the same story.
    assert len({r["message"].split("(this is rank")[1].split(")", 1)[1] for r in res}) == 1


def test_guard_catches_a_different_length(world):
    w, res = results(world, "guard_length")
    assert_raised_everywhere(res, {"n": [1000] * (w - 1) + [1001]})
    msg = res[0]["message"]
    assert "n: 1000 on rank" in msg and f"1001 on rank {w - 1}" in msg


def test_guard_catches_a_forgotten_set_epoch(world):
    w, res = results(world, "guard_epoch")
    assert [r["first_pass"] for r in res] == [-(-1000 // w)] * w  # epoch 0 passed the check
    epochs = [0 if r == 1 else 1 for r in range(w)]
    assert_raised_everywhere(res, {"epoch": epochs})
    assert "epoch: 1 on rank" in res[0]["message"] and "0 on rank 1" in res[0]["message"]


def test_guard_runs_for_batch_sampler(world):
    w, res = results(world, "guard_batch_sampler")
    assert_raised_everywhere(res, {"epoch": [5] + [4] * (w - 1)})


def test_guard_names_every_differing_field(world):
    w, res = results(world, "guard_two_fields")
    assert_raised_everywhere(
        res, {"seed": [2**64 - 1] + [5] * (w - 1), "drop_last": [True] + [False] * (w - 1)}
    )


def test_guard_in_a_dataloader_with_workers(world):
    w, res = results(world, "guard_in_loader")
    assert_raised_everywhere(res, {"epoch": list(range(w))})


def test_guard_compares_the_weights_checksum(world):
    w, res = results(world, "guard_weights")
    assert [r["first_pass"] for r in res] == [-(-2000 // w)] * w
    assert all(r["raised"] == "InconsistentRanksError" for r in res)
    for r in res:
        assert set(r["fields"]) == {"weights_checksum"}
        sums = r["fields"]["weights_checksum"]
        assert len(set(sums[:-1])) == 1 and sums[-1] != sums[0]


def test_guard_compares_a_mixtures_weights(world):
    _, res = results(world, "guard_mixture_weights")
    assert all(r["first_pass_ok"] for r in res)
    digests = res[0]["fields"]["weights"]
    assert len(set(digests[:-1])) == 1 and digests[-1] != digests[0]
    assert_raised_everywhere(res, {"weights": digests})


def test_guard_catches_a_checkpoint_loaded_on_some_ranks(world):
    w, res = results(world, "guard_checkpoint_on_some_ranks")
    cursor = res[0]["cursor"]
    assert cursor == 10 * w
    assert_raised_everywhere(
        res, {"epoch": [3] * (w - 1) + [0], "cursor": [cursor] * (w - 1) + [0]}
    )


def test_guard_catches_a_different_num_replicas(world):
    w, res = results(world, "guard_num_replicas")
    assert_raised_everywhere(res, {"num_replicas": [w + 1] + [w] * (w - 1)})


def test_guard_catches_different_kinds_of_sampler(world):
    # Every rank names both kinds, although a name longer than 8 bytes travels as a digest.
    w, res = results(world, "guard_sampler_kind")
    kinds = ["DistributedSampler"] + ["WeightedDistributedSampler"] * (w - 1)
    assert_raised_everywhere(res, {"sampler": kinds})


def test_guard_catches_a_different_block_round(world):
    w, res = results(world, "guard_block_round")
    same, other = res[0]["codes"]
    assert same != other and 0 not in (same, other)
    assert_raised_everywhere(res, {"round": [same] * (w - 1) + [other]})


def test_guard_off(world):
    w, res = results(world, "guard_off")
    # Different lengths and epochs, no error: and no collective either (the sentinel agrees).
    assert [r["length"] for r in res] == [-(-(1000 + r) // w) for r in range(w)]


def test_a_sampler_on_one_rank_only_does_not_hang(world):
    """Rank 0 evaluating alone with num_replicas=1 samplers, then a barrier on every rank
    (issue 24, case 8: the guard's all_gather on rank 0 used to hang both)."""
    w, res = results(world, "one_rank_evaluation")
    assert [r["seen"] for r in res] == [10 + 10 + 10 + 10 + 5 + 4] + [0] * (w - 1)
    assert all(r["barrier_seconds"] < 25 for r in res), res


def test_sampler_pickles_with_its_check_flag(world):
    _, res = results(world, "guard_pickles")
    assert all(r["check_consistency"] is False and r["same"] for r in res)


# -- seed=None -----------------------------------------------------------------------------
def test_seed_none_is_drawn_once_and_shared(world):
    _, res = results(world, "seed_none")
    for r in res:
        assert r["type"] == "int" and r["mine_ok"]
        assert len(set(r["seeds_a"])) == 1 and len(set(r["seeds_b"])) == 1
        assert len(set(r["seeds_c"])) == 1  # WeightedDistributedSampler(seed=None)
        assert 0 <= r["seeds_a"][0] < 2**63
    # Two draws of 63 bits agree with probability 2**-63.
    assert res[0]["seeds_a"][0] != res[0]["seeds_b"][0]


def test_seed_none_without_a_process_group_is_an_error():
    with pytest.raises(ValueError, match="process group"):
        DistributedSampler(10, 2, 0, seed=None)
    with pytest.raises(ValueError, match="process group"):
        WeightedDistributedSampler([1.0, 2.0], 4, num_replicas=2, rank=0, seed=None)


# -- single process ------------------------------------------------------------------------
def test_no_process_group_no_check():
    # Without a group the check does nothing: samplers that disagree iterate freely.
    a = DistributedSampler(10, 2, 0)
    b = DistributedSampler(11, 2, 1)
    b.set_epoch(4)
    assert len(list(a)) == 5 and len(list(b)) == 6


def test_the_check_names_every_kind_of_sampler():
    # Names longer than 8 bytes travel as digests: each fastshard kind must be in the table.
    from fastshard import _distributed

    for cls in (DistributedSampler, WeightedDistributedSampler):
        assert _distributed._display(_distributed._text_id(cls.__name__), "x") == cls.__name__


def test_check_consistency_is_a_flag():
    assert DistributedSampler(10, 2, 0).check_consistency is True
    assert DistributedSampler(10, 2, 0, check_consistency=0).check_consistency is False
    with pytest.raises(ValueError, match="check_consistency"):
        DistributedSampler(10, 2, 0, check_consistency=2)
    with pytest.raises(TypeError, match="check_consistency"):
        DistributedSampler(10, 2, 0, check_consistency="no")


def test_error_type_is_exported_and_pickles():
    assert issubclass(InconsistentRanksError, RuntimeError)
    assert fastshard.InconsistentRanksError is InconsistentRanksError
    e = pickle.loads(pickle.dumps(InconsistentRanksError("msg", {"n": [1, 2]})))
    assert str(e) == "msg" and e.fields == {"n": [1, 2]}


# -- the example ----------------------------------------------------------------------------
def run_example(*args: str) -> tuple[int, str]:
    port = free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={port}", str(EXAMPLE), *args,
    ]  # fmt: skip
    return launch(cmd, LAUNCH_TIMEOUT)


def test_example_under_torchrun():
    rc, out = run_example("--size", "20001", "--epochs", "2", "--batch-size", "256")
    assert rc == 0, out
    # 20001 items on 2 ranks: one item padded, so exactly one repeat per epoch.
    for epoch in range(2):
        line = next(x for x in out.splitlines() if x.startswith(f"epoch {epoch}: "))
        assert "verdict: OK: 20001/20001 items seen, repeats 1 (padding 1)" in line, out
    assert "PASS: 2 epochs, 40,004 samples" in out


@pytest.mark.extended  # a second torchrun job of the example (the default tier runs one above)
def test_example_verdict_fails_when_ranks_disagree():
    # Rank 1 shuffles with another seed (the rank check turned off): items go missing.
    rc, out = run_example("--size", "5001", "--epochs", "1", "--inject-fault")
    assert rc != 0, out
    assert "verdict: FAIL" in out and "FAIL: 1 epochs" in out, out
