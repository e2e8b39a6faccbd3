"""The test launcher itself: a hung job fails its test instead of blocking the suite, also
when the launcher started its ranks in sessions of their own (as torchrun does)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from .conftest import child_env, free_port, kill_group, launch

# The extended tier (`pytest -m extended`, run by .ci/run):
# the launcher's hang handling, with real process groups.
pytestmark = pytest.mark.extended

# A "launcher" that starts a "rank" in its own session holding the output pipe, then hangs.
HUNG = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                        start_new_session=True)
print(rank.pid, flush=True)
time.sleep(600)
"""


# A "launcher" whose "rank" prints its stacks when signalled (as the framework jobs' processes
# do), waiting in a function whose name the failure must show; the launcher itself does not
# handle the signal.
RANK_WITH_STACKS = """
import faulthandler, signal, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
def waiting_in_a_collective():
    time.sleep(600)
waiting_in_a_collective()
"""
HUNG_WITH_STACKS = f"""
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", {RANK_WITH_STACKS!r}])
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_hung_launch_shows_where_each_process_waits():
    with pytest.raises(pytest.fail.Exception, match="did not finish in 5 s") as err:
        launch([sys.executable, "-c", HUNG_WITH_STACKS], timeout=5)
    message = str(err.value)
    stacks = message.split("stacks of the processes still running", 1)[1]
    # Both processes are listed; only the rank, which handles the signal, shows its frames.
    assert len(re.findall(r"- pid \d+ \(parent \d+, state \w\)", stacks)) == 2, stacks
    launcher, rank = stacks.split("- pid ")[1:]
    assert "File" not in launcher, stacks
    assert "(most recent call first)" in rank, stacks
    assert re.search(r"line \d+ in waiting_in_a_collective", rank), stacks


# A "launcher" that exits at once, leaving a "worker" of its process group that holds the
# output pipe: the launch has not ended while the worker lives.
EXITED_LEAVING_A_WORKER = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(worker.pid, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    "script",
    [HUNG, EXITED_LEAVING_A_WORKER],
    ids=["rank_in_its_own_session", "worker_left_by_an_exited_launcher"],
)
def test_a_hung_launch_fails_and_ends_what_it_started(script):
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not finish in 3 s") as err:
        launch([sys.executable, "-c", script], timeout=3)
    assert time.monotonic() - t0 < 40
    child = int(str(err.value).split("a hang?):\n", 1)[1].split()[0])  # the pid it printed
    time.sleep(0.5)
    assert not alive(child)


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- a killed rank leaves nothing behind ----------------------------------------------------
# A rank of a 2-rank job whose DataLoaders keep their workers (persistent) and start them from
# a forkserver, as the guides recommend: one over a fastshard sampler (with fastshard's
# worker_init_fn), one over a ShardedStream (which watches its trainer by itself). Once both
# loaders' workers run on both ranks, rank 0 writes its pid to READY and waits: the test
# SIGKILLs it, as a fault would. argv: READY, and "none" to run without the worker_init_fn.
ORPHAN_JOB = """
import multiprocessing, os, sys, time
import torch.distributed as dist
from torch.utils.data import DataLoader
import fastshard

def rows(shard, start, stop):
    return range(start, stop)

def main():
    ready, init = sys.argv[1], sys.argv[2] != "none"
    multiprocessing.set_forkserver_preload(["torch", "fastshard"])
    dist.init_process_group("gloo")
    workers = dict(num_workers=2, persistent_workers=True, multiprocessing_context="forkserver")
    sampler = fastshard.DistributedSampler(64, seed=0)
    indexed = DataLoader(range(64), sampler=sampler, batch_size=4, **workers,
                         worker_init_fn=fastshard.worker_init_fn if init else None)
    stream = fastshard.ShardedStream([16, 16], rows, batch_size=4, lanes=16)
    streamed = DataLoader(stream, batch_size=4, **workers)
    for _ in range(2):  # two epochs: the workers persist
        assert sum(len(b) for b in indexed) == 32
        assert sum(len(b) for b in streamed) == 16
    dist.barrier()
    if dist.get_rank() == 0:
        with open(ready + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(ready + ".tmp", ready)
    time.sleep(600)  # rank 0 until it is killed; rank 1 until the launcher ends it

if __name__ == "__main__":
    main()
"""


def _marked(mark: str) -> dict[int, str]:
    """The processes whose environment holds ``mark`` (a job's processes inherit it, also
    those left under another parent): pid -> command line."""
    needle = mark.encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # dead, its parent not done reaping it
        except OSError:
            continue
        found[int(entry)] = argv[:120]
    return found


def _kill_marked(mark: str) -> None:
    for pid in _marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; forkserver")
def test_a_killed_rank_leaves_no_process_behind(tmp_path):
    """SIGKILL rank 0 of a 2-rank torchrun job whose DataLoaders keep forkserver workers:
    within 10 s nothing of the job is left (the fork servers and their workers included, whose
    parent is not the rank)."""
    script, ready, log = tmp_path / "job.py", tmp_path / "ready", tmp_path / "job.log"
    script.write_text(ORPHAN_JOB)
    mark = f"fastshard-orphan-test-{os.getpid()}-{time.monotonic_ns()}"
    env = child_env(FASTSHARD_TEST_JOB=mark)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), str(ready), "init",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
            start_new_session=True,  # its own process group, killed whatever happens
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not ready.exists():
            assert proc.poll() is None, f"the job ended ({proc.returncode}):\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the job never got ready:\n{log.read_text()}"
            time.sleep(0.1)
        # torchrun, 2 ranks, 2 forkservers, 2 x 2 loaders x 2 workers (and resource trackers)
        before = _marked(mark)
        assert len(before) >= 13, before
        os.kill(int(ready.read_text()), signal.SIGKILL)
        killed = time.monotonic()
        left = before
        while left and time.monotonic() - killed < 10:
            time.sleep(0.2)
            left = _marked(mark)
        assert not left, (
            f"{len(left)} of the job's {len(before)} processes still run 10 s after rank 0 was "
            f"killed:\n"
            + "\n".join(f"{pid}: {cmd}" for pid, cmd in left.items())
            + f"\n{log.read_text()[-3000:]}"
        )
        assert proc.wait(timeout=30) != 0
    finally:
        kill_group(proc)
        _kill_marked(mark)


# A trainer whose DataLoader's workers run (an iterator open, or persistent workers idle
# between epochs) under a start method; argv: METHOD, PERSISTENT (0/1), READY.
TRAINER = """
import os, sys, time
from torch.utils.data import DataLoader
import fastshard

if __name__ == "__main__":
    method, persistent, ready = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    sampler = fastshard.DistributedSampler(64, num_replicas=1, rank=0)
    loader = DataLoader(range(64), sampler=sampler, batch_size=4, num_workers=2,
                        persistent_workers=persistent, multiprocessing_context=method,
                        worker_init_fn=fastshard.worker_init_fn)
    if persistent:
        assert sum(len(b) for b in loader) == 64  # the workers stay, idle
    else:
        it = iter(loader)
        next(it)  # the iterator's workers run
    open(ready, "w").close()
    time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_with_the_worker_init_fn_end_with_their_trainer(tmp_path, method, persistent):
    script, ready = tmp_path / "trainer.py", tmp_path / "ready"
    script.write_text(TRAINER)
    mark = f"fastshard-trainer-test-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, str(script), method, str(int(persistent)), str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(FASTSHARD_TEST_JOB=mark),
        cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the trainer never got ready"
            time.sleep(0.05)
        before = _marked(mark)
        assert len(before) >= 3, before  # the trainer and its 2 workers
        proc.kill()
        proc.wait(timeout=30)
        killed, left = time.monotonic(), before
        while left and time.monotonic() - killed < 10:
            time.sleep(0.2)
            left = _marked(mark)
        assert not left, f"still running 10 s after the trainer's death: {left}"
    finally:
        kill_group(proc)
        _kill_marked(mark)
        proc.stderr.close()
