"""A fresh interpreter per measurement, for the bench scripts run as `python bench/NAME.py`."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from typing import Any


def child_json(code: str, *args: str, python: str | None = None) -> Any:
    """Run ``python -c code args...`` (default: this interpreter) and return its last line of
    output as JSON. It runs in the temporary directory, so that ``import fastshard`` finds that
    interpreter's installed build, never the checkout's sources; a child that fails raises
    RuntimeError with its stderr."""
    proc = subprocess.run(
        [python or sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {' '.join(args)} exited with {proc.returncode}:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
