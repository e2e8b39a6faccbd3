"""The test launcher itself: a hung job fails its test instead of blocking the suite, also
when the launcher started its ranks in sessions of their own (as torchrun does)."""

from __future__ import annotations

import re
import sys
import time

import pytest

from .conftest import launch

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
