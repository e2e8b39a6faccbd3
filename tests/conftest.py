import os
import subprocess
import sys
import tempfile

import pytest

# Tests that read /proc (VmHWM, VmRSS, VmSize) or use `resource` limits: Linux only. The wheel
# workflow runs the suite on macOS and Windows too, where neither exists (or means the same).
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc or sets resource limits (Linux)"
)


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
