"""A language model pretrained on packed rows, killed and resumed: examples/train_lm.py.

The runs train on the first few files of the standard library, so that the 40 steps cross
epochs (every 4 to 16 steps), before and after the resume. One uninterrupted run of N steps
on 2 ranks; a second run of the same configuration killed by
SIGKILL to its whole process group once its checkpoint at step K is on disk (a fault: nothing
is flushed or closed), then resumed from that checkpoint on 2 ranks, and on 1 rank with
``--accumulate 2`` (the same global batch). The script logs every step's loss and rows
(``losses.jsonl``), which are compared here step by step.

Four torchrun jobs of a 0.13 M-parameter model: 40-65 s on a shared 2-core machine (load
average 2-5), docs/train-lm.md.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from .conftest import child_env, free_port, kill_group, launch

pytestmark = pytest.mark.extended

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_lm.py"
STEPS, KILL_AFTER, CKPT_EVERY = 40, 20, 10
SEQ_LEN, BATCH = 128, 4  # rows of 128 tokens, 4 rows per rank per micro-batch
# a model small enough for 2 ranks on 2 CPU cores (~0.03 s a step on an idle machine)
CONFIG = ["--steps", str(STEPS), "--ckpt-every", str(CKPT_EVERY), "--seq-len", str(SEQ_LEN),
          "--batch-size", str(BATCH), "--dim", "64", "--layers", "2", "--heads", "4",
          "--keep", "0", "--print-every", "1000"]  # fmt: skip
LAUNCH_TIMEOUT = 300  # seconds for one torchrun job; a hang fails the test
TOKENS_PER_STEP = 2 * BATCH * SEQ_LEN  # 2 ranks


class Store(NamedTuple):
    path: Path
    train_files: int  # the runs train on this many of the store's first files


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        why = f"examples/train_lm.py needs {module} (the `integrations` extra)"
        if os.environ.get("FASTSHARD_REQUIRE_INTEGRATIONS") == "1":
            pytest.fail(why)
        pytest.skip(why)


def torchrun(world: int, workdir: Path, data: Store, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={world}",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(EXAMPLE),
        "--workdir", str(workdir), "--data", str(data.path),
        "--train-files", str(data.train_files), *CONFIG, *extra,
    ]  # fmt: skip


def run(world: int, workdir: Path, data: Store, *extra: str) -> str:
    rc, out = launch(torchrun(world, workdir, data, *extra), LAUNCH_TIMEOUT)
    assert rc == 0, f"exit {rc}:\n{out[-6000:]}"
    return out


def read_log(workdir: Path) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]], list]:
    """(step -> its record, the evaluations, the resumes) of a run's losses.jsonl."""
    steps, evals, resumes = {}, [], []
    for line in (workdir / "losses.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            assert record["step"] not in steps, f"step {record['step']} logged twice"
            steps[record["step"]] = record
        elif "eval_loss" in record:
            evals.append(record)
        else:
            resumes.append(record)
    return steps, evals, resumes


def checkpoints(workdir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (workdir / "ckpt").glob("step_[0-9]*[0-9]"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Store:
    """The example's token store, built here by its own function, and the number of files
    that makes an epoch 4 to 16 steps (11 on CPython 3.11)."""
    _require("transformers")
    _require("torchdata")
    spec = importlib.util.spec_from_file_location("train_lm", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    path = tmp_path_factory.mktemp("lm") / "stdlib"
    example.build_store(path, 50)
    offsets = np.load(path / "train" / "offsets.npy")
    files = int(np.searchsorted(offsets, 16 * TOKENS_PER_STEP, side="right")) - 1
    assert offsets[files] // TOKENS_PER_STEP >= 4, offsets[:10]
    return Store(path, files)


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    run(2, workdir, data)
    return workdir


@pytest.fixture(scope="module")
def killed(data, tmp_path_factory) -> Path:
    """A run killed (SIGKILL to every process of the job) once its checkpoint at KILL_AFTER is
    written, with the checkpoints after it removed (a kill that came late)."""
    workdir = tmp_path_factory.mktemp("killed")
    proc = subprocess.Popen(
        torchrun(2, workdir, data),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
        cwd=tempfile.gettempdir(),
        start_new_session=True,
    )
    target = workdir / "ckpt" / f"step_{KILL_AFTER:06d}"
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        while not target.exists():
            assert proc.poll() is None, (
                f"the run ended ({proc.returncode}) before step {KILL_AFTER}"
            )
            assert time.monotonic() < deadline, f"no checkpoint at step {KILL_AFTER} in time"
            time.sleep(0.05)
    finally:
        kill_group(proc)
    log = workdir / "losses.jsonl"
    assert f'"step": {STEPS},' not in log.read_text(), "the run finished before the kill"
    for step in checkpoints(workdir):
        if step > KILL_AFTER:
            shutil.rmtree(workdir / "ckpt" / f"step_{step:06d}")
    return workdir


def test_resume_after_a_kill_gives_the_same_losses_bit_for_bit(data, uninterrupted, killed):
    workdir = killed.with_name(killed.name + "-same-w")
    shutil.copytree(killed, workdir)
    out = run(2, workdir, data)
    assert f"from step {KILL_AFTER}" in out, out[-3000:]
    full, full_eval, _ = read_log(uninterrupted)
    resumed, resumed_eval, resumes = read_log(workdir)
    assert [r["resumed_at"] for r in resumes] == [KILL_AFTER]
    assert sorted(resumed) == sorted(full) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        # floats logged with repr round-trip exactly: == is bit for bit
        assert resumed[step]["loss"] == full[step]["loss"], step
        assert resumed[step]["rows"] == full[step]["rows"], step
    # the held-out evaluation after the last step: every row once, the same sum
    assert resumed_eval == full_eval and len(full_eval) == 1
    assert full_eval[0]["eval_tokens"] == full_eval[0]["eval_rows"] * (SEQ_LEN - 1)


def test_resume_on_another_world_size_trains_on_the_same_rows(data, uninterrupted, killed):
    workdir = killed.with_name(killed.name + "-one-rank")
    shutil.copytree(killed, workdir)
    out = run(1, workdir, data, "--accumulate", "2")
    assert f"from step {KILL_AFTER}" in out, out[-3000:]
    full, full_eval, _ = read_log(uninterrupted)
    resumed, resumed_eval, _ = read_log(workdir)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    # The step's loss is the mean of n = 2 x 4 x 127 predicted tokens' losses (each >= 0). One
    # rank sums other groups of them per micro-batch than each of two ranks does, so the
    # float32 sums round differently. A sum of n terms of one sign in any order is within
    # (n - 1) u of the exact sum (relative; u = 2**-24, Higham's gamma_{n-1}), so two are
    # within 2 n u of each other, the mean's division and the mean over micro-batches or
    # ranks included. The weights, equal at the checkpoint, then differ by the gradients'
    # rounding, which stayed far below that (measured: at most 4 u on these 20 steps, 7 u on
    # 150 steps of the guide's run, docs/train-lm.md).
    n = 2 * BATCH * (SEQ_LEN - 1)
    rtol = 2 * n * 2.0**-24
    for step in range(1, STEPS + 1):
        assert resumed[step]["rows"] == full[step]["rows"], step
        if step <= KILL_AFTER:
            assert resumed[step]["loss"] == full[step]["loss"], step
        else:
            assert resumed[step]["loss"] == pytest.approx(full[step]["loss"], rel=rtol, abs=0), step
    assert resumed_eval[0]["eval_rows"] == full_eval[0]["eval_rows"]
    assert resumed_eval[0]["eval_tokens"] == full_eval[0]["eval_tokens"]
    assert resumed_eval[0]["eval_loss"] == pytest.approx(full_eval[0]["eval_loss"], rel=1e-5)


def test_the_loss_falls(uninterrupted):
    full, evals, _ = read_log(uninterrupted)
    losses = [full[s]["loss"] for s in range(1, STEPS + 1)]
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    # a byte-level model starts near ln(257) = 5.55 nats; 40 steps take it well below 4
    assert losses[0] == pytest.approx(math.log(257), abs=0.2)
    assert last < first - 1.0, (first, last)
    assert evals[0]["eval_loss"] < first - 1.0
    # every epoch is the same number of steps, and none trains on a row twice
    epochs: dict[int, list[int]] = {}
    for s in range(1, STEPS + 1):
        epochs.setdefault(full[s]["epoch"], []).extend(full[s]["rows"])
    assert len(epochs) >= 3, sorted(epochs)  # so the resumed runs crossed an epoch after step 20
    sizes = {len(rows) for e, rows in epochs.items() if e < max(epochs)}
    assert len(sizes) == 1 and all(len(set(rows)) == len(rows) for rows in epochs.values())
