import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
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
    process group does not reach, and, once it exited, what it left in its group."""
    if proc.poll() is None:
        below = _descendants(proc.pid)
        for pid in [proc.pid, *below]:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    else:
        # What it left behind in its own group (its pid is the group's id while any member
        # lives, so this reaches no other process).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def launch(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a launcher (torchrun, a framework's script) in its own process group, outside the
    source tree; (exit code, stdout and stderr). A run past ``timeout`` fails the test with
    the stacks of its processes (:func:`hung_stacks`), and the whole group is killed whatever
    happens."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env() if env is None else env,
        cwd=tempfile.gettempdir(),  # never import fastshard from the source tree
        start_new_session=True,  # its own process group, every rank and worker included
    )
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        proc.wait(timeout=timeout)
        # The output ends when every process holding the pipe is gone: a worker or rank left
        # behind by a launcher that exited is a hang too.
        reader.join(timeout=max(0.0, deadline - time.monotonic()))
        if reader.is_alive():
            raise subprocess.TimeoutExpired(cmd, timeout)
    except subprocess.TimeoutExpired:
        out = "".join(lines)  # before the stacks, which hung_stacks gives in short
        stacks = hung_stacks(proc, lines)
        kill_group(proc)
        # A process that escaped the kill may still hold the pipe: do not wait for it.
        reader.join(timeout=30)
        if not reader.is_alive():
            proc.stdout.close()
        pytest.fail(
            f"{' '.join(cmd[:4])} ... did not finish in {timeout} s (a hang?):\n{out[-3000:]}"
            f"\n{stacks}"
        )
    finally:
        kill_group(proc)
    proc.stdout.close()
    return proc.returncode, "".join(lines)


def _read_lines(stream: Any, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


# tests/integrations/_common.py registers faulthandler for this signal in every process of a
# framework job (DataLoader workers forked from a rank inherit it).
STACKS_SIGNAL = signal.SIGUSR1


def hung_stacks(proc: subprocess.Popen, lines: list[str], frames: int = 6) -> str:
    """What each process below a hung launch is doing, one at a time: its pid, command and
    state, and, for a process that handles STACKS_SIGNAL (faulthandler), the innermost
    ``frames`` frames of each of its threads, which it prints to the pipe ``lines`` collects
    when signalled. Processes that do not handle the signal are listed, never signalled (it
    would end them)."""
    if proc.poll() is not None:
        return ""
    out = ["stacks of the processes still running (innermost frames first):"]
    for pid in [proc.pid, *_descendants(proc.pid)]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/status") as f:
                caught = next(
                    int(v, 16) for k, v in (ln.split(":", 1) for ln in f) if k == "SigCgt"
                )
        except (OSError, StopIteration):
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]  # after the command name
        words = [a.decode(errors="replace").strip() for a in argv[:3] if a.strip()]
        name = (
            " ".join([Path(words[0]).name] + [w.splitlines()[0][:80] for w in words[1:]])
            if words
            else "(no command line: exiting)"
        )
        out.append(f"- pid {pid} (parent {ppid}, state {state}): {name}")
        if not caught >> (STACKS_SIGNAL - 1) & 1:
            continue
        mark = len(lines)
        try:
            os.kill(pid, STACKS_SIGNAL)
        except ProcessLookupError:
            continue
        deadline, seen = time.monotonic() + 3.0, -1
        while time.monotonic() < deadline and (seen != len(lines) or seen == mark):
            seen = len(lines)
            time.sleep(0.3)
        out += _innermost(lines[mark:], frames)
    return "\n".join(out)


def _innermost(dump: list[str], frames: int) -> list[str]:
    """The thread headers of a faulthandler dump, each with its innermost ``frames`` frames,
    paths shortened to what follows site-packages/ or the last two parts."""
    out: list[str] = []
    kept = 0
    for line in dump:
        text = line.rstrip()
        if "(most recent call first)" in text:
            out.append("    " + text.strip())
            kept = 0
        elif text.startswith("  File ") and kept < frames:
            kept += 1
            where = text.split('"')[1] if text.count('"') >= 2 else ""
            short = where.split("site-packages/")[-1]
            if short == where:
                short = "/".join(Path(where).parts[-2:])
            out.append("      " + text.strip().replace(where, short))
    return out


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
