"""Real faults under torchrun's elastic agent, audited item by item.

Each scenario runs examples/train_elastic.py under torchrun (c10d rendezvous on 127.0.0.1, gloo,
a prime number of items, pad=False), injects a fault while it trains (a worker SIGKILLed, a
"node" -- a second torchrun agent -- killed or started, every worker SIGTERMed, a restart on
another number of ranks), lets it finish, and audits the step logs with
examples/audit_elastic.py: every item of every epoch trained on exactly once in committed
steps. Every launch runs in its own process group with a timeout, and is killed whole at the
end whatever happened.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import child_env, free_port, kill_group

# The extended tier (`pytest -m extended`, run by .ci/run):
# elastic and fault scenarios under torchrun's agent, minutes each.
pytestmark = [
    pytest.mark.extended,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups and signals"),
]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SIZE, BATCH, EVERY = 401, 8, 5  # 401 is prime: uneven shards on 2 and 3 ranks
TIMEOUT = 240  # seconds for any one launch to finish


# torchrun's agent shares its rendezvous store with the workers by default. Across restarts
# and re-formed groups that store keeps the last round's keys: restarted workers then read a
# dead peer's address ("Connection refused"), and an agent that joins a running job waits for
# a MASTER_ADDR the others never write again. A fresh store per round avoids both.
ENV = child_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")


def _load_audit() -> Any:
    spec = importlib.util.spec_from_file_location("audit_elastic", EXAMPLES / "audit_elastic.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


audit_module = _load_audit()


class Launch:
    """One torchrun agent (a "node") and its workers, in a process group of its own."""

    def __init__(self, workdir: Path, nproc: int, port: int, *, nnodes: str = "1",
                 host: bool | None = None, max_restarts: int = 2, epochs: int = 1,
                 extra: tuple[str, ...] = ()) -> None:  # fmt: skip
        conf = "join_timeout=60,last_call_timeout=2,close_timeout=10,read_timeout=20"
        conf += ",keep_alive_interval=1,keep_alive_max_attempt=3"
        if host is not None:
            conf += f",is_host={str(host).lower()}"
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", f"--max-restarts={max_restarts}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic-test",
            f"--rdzv-conf={conf}", "--monitor-interval=0.5",
            str(EXAMPLES / "train_elastic.py"), "--workdir", str(workdir), "--size", str(SIZE),
            "--batch-size", str(BATCH), "--ckpt-every", str(EVERY), "--epochs", str(epochs),
            "--step-time", "0.05", "--timeout", "60", *extra,
        ]  # fmt: skip
        self.workdir = workdir
        self.out = open(
            workdir.parent / f"{workdir.name}-agent{port}-{time.monotonic_ns()}.log", "w"
        )
        self.proc = subprocess.Popen(
            cmd, stdout=self.out, stderr=subprocess.STDOUT, text=True, env=ENV,
            cwd=tempfile.gettempdir(), start_new_session=True,
        )  # fmt: skip

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"torchrun did not finish in {timeout} s:\n{self.text()[-4000:]}")

    def kill(self) -> None:
        """The agent and every worker it started (each in a session of its own)."""
        for pid in workers(self.workdir, agent=self.proc.pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_group(self.proc)

    def text(self) -> str:
        self.out.flush()
        return Path(self.out.name).read_text()


@pytest.fixture
def launches():
    started: list[Launch] = []
    yield started
    for launch in started:  # end everything a test started, whatever happened
        launch.kill()
        launch.out.close()


def steps_done(workdir: Path, epoch: int = 0) -> int:
    """Steps rank 0 has logged in ``epoch`` (any attempt)."""
    count = 0
    for path in (workdir / "log").glob("*-rank0.jsonl"):
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            count += r.get("epoch") == epoch and "items" in r
    return count


def wait_steps(workdir: Path, steps: int, launches: list[Launch], epoch: int = 0) -> None:
    deadline = time.monotonic() + TIMEOUT
    while steps_done(workdir, epoch) < steps:
        for launch in launches:
            if launch.proc.poll() is not None:
                pytest.fail(
                    f"torchrun ended early ({launch.proc.returncode}):\n{launch.text()[-4000:]}"
                )
        if time.monotonic() > deadline:
            pytest.fail("the run made no progress")
        time.sleep(0.1)


def workers(workdir: Path, agent: int | None = None) -> dict[int, dict[str, Any]]:
    """pid -> {rank, agent, attempt} of the workers started in ``workdir`` (by ``agent``)."""
    found = {}
    for path in (workdir / "pids").glob("*"):
        try:
            who = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):  # being written
            continue
        if agent is None or who["agent"] == agent:
            found[int(path.name)] = who
    return found


def worker_pid(workdir: Path, rank: int) -> int:
    """The live worker of ``rank`` (of the latest attempt)."""
    live = [(p, w) for p, w in workers(workdir).items() if w["rank"] == rank and alive(p)]
    assert live, f"no live worker of rank {rank}"
    return max(live, key=lambda pw: (workdir / "pids" / str(pw[0])).stat().st_mtime)[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def audited(workdir: Path, epochs: int = 1) -> dict[str, Any]:
    report = audit_module.audit(workdir, SIZE, epochs)
    for e in report["epochs"]:
        assert e["lost"] == 0 and e["repeated"] == 0, report
        assert e["distinct"] == SIZE and e["trained"] == SIZE, report
    assert report["done"] and report["ok"], report
    lost = sum(e["lost"] for e in report["epochs"])
    repeated = sum(e["repeated"] for e in report["epochs"])
    print(  # the figures docs/fault-tolerance.md shows (pytest -s)
        f"AUDIT worlds {' -> '.join(map(str, worlds(report)))}; restarts "
        f"{len(report['attempts']) - 1}; lost {lost}; repeated {repeated}; replayed steps "
        f"{report['replayed_steps']}"
    )
    return report


def worlds(report: dict[str, Any]) -> list[int]:
    return [a["world"] for a in report["attempts"]]


def test_no_fault_covers_every_item_each_epoch(tmp_path, launches):
    work = tmp_path / "run"
    launches.append(Launch(work, 2, free_port(), epochs=2))
    assert launches[0].wait() == 0, launches[0].text()
    report = audited(work, epochs=2)
    assert worlds(report) == [2] and report["replayed_steps"] == 0


def test_killed_worker_restarts_and_resumes(tmp_path, launches):
    work = tmp_path / "run"
    launches.append(Launch(work, 2, free_port(), max_restarts=3))
    wait_steps(work, 2 * EVERY + 2, launches)
    os.kill(worker_pid(work, 1), signal.SIGKILL)
    assert launches[0].wait() == 0, launches[0].text()
    report = audited(work)
    assert worlds(report) == [2, 2]
    assert report["attempts"][1]["resumed_from"] is not None
    # at most the steps since the last checkpoint, and the one in flight, are replayed
    assert 0 <= report["replayed_steps"] <= EVERY + 1, report


def test_restart_on_another_number_of_ranks(tmp_path, launches):
    """2 ranks crash together; the run restarts from the checkpoint on 3 ranks (401 items)."""
    work = tmp_path / "run"
    launches.append(Launch(work, 2, free_port()))
    wait_steps(work, 2 * EVERY + 1, launches)
    launches[0].kill()
    launches.append(Launch(work, 3, free_port()))
    assert launches[1].wait() == 0, launches[1].text()
    report = audited(work)
    assert worlds(report) == [2, 3], report


def test_preemption_replays_nothing(tmp_path, launches):
    work = tmp_path / "run"
    launches.append(Launch(work, 2, free_port()))
    wait_steps(work, EVERY + 2, launches)
    for rank in range(2):
        os.kill(worker_pid(work, rank), signal.SIGTERM)
    assert launches[0].wait() == 0, launches[0].text()
    assert "preempted; checkpoint written" in launches[0].text()
    launches.append(Launch(work, 2, free_port()))
    assert launches[1].wait() == 0, launches[1].text()
    report = audited(work)
    assert worlds(report) == [2, 2] and report["replayed_steps"] == 0, report


def test_node_lost_the_rest_finish_on_fewer_ranks(tmp_path, launches):
    work = tmp_path / "run"
    port = free_port()
    launches.append(Launch(work, 1, port, nnodes="1:2", host=True, max_restarts=3))
    launches.append(Launch(work, 1, port, nnodes="1:2", host=False, max_restarts=3))
    wait_steps(work, 2 * EVERY + 1, launches)
    launches[1].kill()  # the second node and its worker, at once
    assert launches[0].wait() == 0, launches[0].text()
    report = audited(work)
    assert worlds(report)[0] == 2 and worlds(report)[-1] == 1, report


def test_node_joins_the_run_continues_on_more_ranks(tmp_path, launches):
    work = tmp_path / "run"
    port = free_port()
    # slower steps: the run must still be going when the second agent has started (seconds)
    slow = ("--step-time", "0.25")
    launches.append(Launch(work, 1, port, nnodes="1:2", host=True, max_restarts=3, extra=slow))
    wait_steps(work, EVERY + 1, launches)
    launches.append(Launch(work, 1, port, nnodes="1:2", host=False, max_restarts=3, extra=slow))
    rcs = [launch.wait() for launch in launches]
    assert rcs == [0, 0], [launch.text()[-3000:] for launch in launches]
    report = audited(work)
    assert worlds(report)[0] == 1 and worlds(report)[-1] == 2, report
    # torchrun's agent stops the workers with SIGTERM to re-form the group: they checkpoint
    assert report["replayed_steps"] == 0, report


def test_two_nodes_share_one_drawn_seed_and_the_guard_fires_on_both(tmp_path, launches):
    work = tmp_path / "run"
    port = free_port()
    for host in (True, False):
        launches.append(Launch(work, 1, port, nnodes="2", host=host, extra=("--seed", "none")))
    assert [launch.wait() for launch in launches] == [0, 0]
    report = audited(work)
    assert worlds(report) == [2] and len({a["seed"] for a in report["attempts"]}) == 1
    seeds = set()
    for path in (work / "log").glob("*.jsonl"):
        seeds |= {json.loads(x)["seed"] for x in path.read_text().splitlines() if '"start"' in x}
    assert len(seeds) == 1  # both nodes' ranks trained with the one seed rank 0 drew

    bad = tmp_path / "bad"
    port = free_port()
    node_a = Launch(bad, 1, port, nnodes="2", host=True, max_restarts=0)
    node_b = Launch(bad, 1, port, nnodes="2", host=False, max_restarts=0, extra=("--size", "402"))
    launches += [node_a, node_b]
    assert node_a.wait() != 0 and node_b.wait() != 0
    for launch in (node_a, node_b):
        assert "InconsistentRanksError" in launch.text(), launch.text()[-3000:]
