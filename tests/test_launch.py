"""The test launcher itself: a hung job fails its test instead of blocking the suite, also
when the launcher started its ranks in sessions of their own (as torchrun does)."""

from __future__ import annotations

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_hung_launch_fails_and_kills_ranks_in_their_own_sessions():
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not finish in 3 s") as err:
        launch([sys.executable, "-c", HUNG], timeout=3)
    assert time.monotonic() - t0 < 40
    rank = int(str(err.value).split("a hang?):\n", 1)[1].split()[0])
    time.sleep(0.5)
    assert not alive(rank)  # the rank in its own session was killed too


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
