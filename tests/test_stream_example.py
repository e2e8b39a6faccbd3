"""examples/train_streams.py under torchrun, 20 times in a row: every run ends (no hang), with
equal item counts on both ranks and every sample seen in every epoch.

The example once hung in about 1 run in 30: a DataLoader worker forked afresh for the next epoch
deadlocked in the child (CPython gh-112275) and the other rank waited in DDP's all-reduce. It now
keeps its workers (started from a fork server) and gives every collective a timeout; a run that
still does not end within RUN_TIMEOUT fails here, its process group killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import free_port, launch

pytestmark = pytest.mark.extended

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_streams.py"
RUNS = 20
RUN_TIMEOUT = 180  # seconds for one run (about 7 s on an idle 2-core machine)


def test_example_runs_to_the_end_twenty_times():
    for run in range(RUNS):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(EXAMPLE),
            "--timeout", "60",
        ]  # fmt: skip
        rc, out = launch(cmd, RUN_TIMEOUT)
        assert rc == 0, f"run {run}:\n{out[-3000:]}"
        for epoch in range(2):
            line = next(x for x in out.splitlines() if x.startswith(f"epoch {epoch}: "))
            assert "(equal), 2102/2102 samples seen" in line, f"run {run}:\n{out[-3000:]}"
        assert "items per rank over 2 epochs: [2102, 2102]" in out, f"run {run}:\n{out[-3000:]}"
