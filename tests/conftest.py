import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Any

import pytest

# Tests that read /proc (VmHWM, VmRSS, VmSize) or use `resource` limits: Linux only. The wheel
# workflow runs the suite on macOS and Windows too, where neither exists (or means the same).
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc or sets resource limits (Linux)"
)

# tests/test_integrations.py: a test that reads the report of a job launched under a framework's
# own launcher (these module fixtures) is in the extended tier (`pytest -m extended`, run by
# .ci/run); the file's in-process tests stay in the default tier.
LAUNCHED_REPORTS = frozenset({"lightning_report", "accelerate_report", "trainer_report"})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if LAUNCHED_REPORTS.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.extended)


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch):
    """Tests pass num_replicas/rank explicitly unless they set the environment themselves."""
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)


def run_python(code: str, timeout: float = 120) -> str:
    """Run code in a fresh interpreter; a crash (non-zero exit, signal) fails the test.

    The child runs outside the source tree, so `import fastshard` finds the installed package.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    assert proc.returncode == 0, f"child exited with {proc.returncode}:\n{proc.stderr}"
    return proc.stdout


def child_peak_growth_kib(code: str) -> int:
    """Run `code` in a fresh interpreter after `import fastshard`; return how much its peak
    memory (VmHWM, read inside the child) grew while `code` ran, in KiB."""
    out = run_python(
        "import fastshard\n"
        "def hwm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM'): return int(line.split()[1])\n"
        "base = hwm()\n" + code + "\nprint(hwm() - base)\n"
    )
    return int(out)


# -- launching process groups ---------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """This environment without a launcher's rank variables, on the loopback."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", **extra)
    return env


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; elsewhere none)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_group(proc: subprocess.Popen) -> None:
    """End a child started with start_new_session=True, and everything it started: also
    what it started in sessions of their own (torchrun starts each rank in one), which its
    process group does not reach."""
    if proc.poll() is None:
        below = _descendants(proc.pid)
        for pid in [proc.pid, *below]:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait()


def launch(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a launcher (torchrun, a framework's script) in its own process group, outside the
    source tree; (exit code, stdout and stderr). A run past ``timeout`` fails the test, and
    the whole group is killed whatever happens."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env() if env is None else env,
        cwd=tempfile.gettempdir(),  # never import fastshard from the source tree
        start_new_session=True,  # its own process group, every rank and worker included
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        try:  # a process that escaped the kill may still hold the pipe: do not wait for it
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out = "(no output: the pipe stayed open after the kill)"
        pytest.fail(
            f"{' '.join(cmd[:4])} ... did not finish in {timeout} s (a hang?):\n{out[-3000:]}"
        )
    finally:
        kill_group(proc)
    return proc.returncode, out


def launch_ranks(worker, world: int, timeout: float) -> list:
    """Run `world` ranks of a worker script (argv: RANK WORLD PORT, one gloo group) in their
    own process groups; each rank's last stdout line is JSON with its {scenario: result}.
    A rank that exits non-zero, or a run past `timeout` (a hang), fails the test."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(r), str(world), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            cwd=tempfile.gettempdir(),  # never import fastshard from the source tree
            start_new_session=True,
        )
        for r in range(world)
    ]
    finished = []
    try:
        for p in procs:
            try:
                finished.append((*p.communicate(timeout=timeout), p.returncode))
            except subprocess.TimeoutExpired:
                finished.append(("", "", None))
    finally:
        for p in procs:
            kill_group(p)
        for p in procs:
            if p.returncode is None:
                try:
                    p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
    for r, (_, err, code) in enumerate(finished):
        if code != 0:
            what = f"did not finish in {timeout} s (a hang?)" if code is None else f"exited {code}"
            pytest.fail(f"rank {r} {what}:\n{err[-3000:]}")
    return [json.loads(out.strip().splitlines()[-1])["results"] for out, _, _ in finished]


def peer(module: str) -> Any:
    """Import a peer library that a test checks fastshard against (a writer of a format it
    reads): skip without it, or fail under FASTSHARD_REQUIRE_PEERS=1, where .ci/run installs
    them."""
    if os.environ.get("FASTSHARD_REQUIRE_PEERS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)
