"""The guides' code runs as written.

Every ```python block of the guides (docs/*.md) and of the README runs here, each in a fresh
interpreter whose current folder is an empty temporary one, so a block must import what it uses
and make (or say how to make, in code) any file it reads. Outside torchrun a block passes
``num_replicas`` and ``rank`` itself. A block that cannot run on its own (it needs torchrun, a
framework's launcher, or the names of the block before it) is marked on the line before its
fence:

    <!-- fragment -->               compiled for syntax only
    <!-- continued -->              run after the page's previous runnable block, in one process

The marker is an HTML comment, so the site and GitHub do not show it. docs/getting-started.md
("Code in these pages") says the same for writers of the guides. The page check needs the
checkout's docs/ (the sdist leaves it out) and skips without it.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]
# Pages whose first code block must run as written: a newcomer starts there.
FIRST_RUNS = ("getting-started.md", "length-grouped.md", "mixtures.md", "packing.md", "streams.md")
TIMEOUT = 180

pytestmark = pytest.mark.skipif(not DOCS.is_dir(), reason="docs/ is not part of the sdist")

_FENCE = re.compile(r"^( *)```python\s*$")
_MARK = re.compile(r"^\s*<!--\s*(fragment|continued)\b[^>]*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    mark: str  # "run", "fragment" or "continued"

    @property
    def id(self) -> str:
        return f"{self.page.name}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        before = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        mark = _MARK.match(before)
        out.append(Block(page, start + 1, "\n".join(body) + "\n", mark.group(1) if mark else "run"))
        i += 1
    return out


ALL = [b for page in PAGES if page.is_file() for b in blocks(page)]


def program(block: Block) -> str:
    """The code a runnable block runs: itself, after the blocks it continues."""
    page = [b for b in ALL if b.page == block.page]
    chain = [block]
    k = page.index(block)
    while chain[0].mark == "continued":
        k -= 1
        while k >= 0 and page[k].mark == "fragment":
            k -= 1
        assert k >= 0, f"{block.id}: continues no runnable block"
        chain.insert(0, page[k])
    return "\n".join(b.code for b in chain)


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_guide_block(block, tmp_path):
    compile(program(block) if block.mark != "fragment" else block.code, block.id, "exec")
    if block.mark == "fragment":
        return
    if multiprocessing.get_start_method() != "fork":
        # DataLoader workers started by spawn re-run a script without a __main__ guard
        pytest.skip("the guides' blocks are scripts for fork-started DataLoader workers")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")
    }
    script = tmp_path / "guide_block.py"  # a file, not -c: spawned workers re-import it
    script.write_text(program(block), encoding="utf-8")
    res = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert res.returncode == 0, f"{block.id} failed:\n{res.stderr[-4000:]}"


def test_blocks_were_found():
    assert len(ALL) >= 15
    assert sum(b.mark != "fragment" for b in ALL) >= 6


@pytest.mark.parametrize("name", FIRST_RUNS)
def test_a_guides_first_block_runs_as_written(name):
    first = next(b for b in ALL if b.page.name == name)
    assert first.mark == "run", f"{first.id} is the first example of {name}: it must run"
