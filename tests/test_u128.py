"""The portable 128-bit integer of csrc/fastshard/u128.hpp (what MSVC builds use for the exact
mixture schedules) against the compiler's own unsigned __int128: 2,000,000 random operand
pairs of every width, through + - * / % < << >>. Needs the source tree and a C++ compiler
with __int128; skipped without them (an installed wheel's test run)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tests" / "cpp" / "u128_check.cpp"


def test_portable_u128_matches_the_builtin(tmp_path):
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None or not (ROOT / "csrc" / "fastshard" / "u128.hpp").exists():
        pytest.skip("needs the source tree and a C++ compiler")
    exe = tmp_path / "u128_check"
    build = subprocess.run(
        [compiler, "-O2", "-std=c++17", f"-I{ROOT / 'csrc'}", str(CHECK), "-o", str(exe)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if build.returncode != 0 and "__int128" in build.stderr:
        pytest.skip("the compiler has no __int128 to compare with")
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "bad=0", run.stdout + run.stderr
