"""The guides' code runs as written.

Every ```python block of the guides (docs/*.md) and of the README runs here, each in a fresh
interpreter whose current folder is an empty temporary one, so a block must import what it uses
and make (or say how to make, in code) any file it reads. Outside torchrun a block passes
``num_replicas`` and ``rank`` itself. A block that cannot run on its own (it needs torchrun, a
framework's launcher, or the names of the block before it) is marked on the line before its
fence:

    <!-- fragment -->               compiled for syntax only
    <!-- continued -->              run after the page's previous runnable block, in one process
    <!-- s3 -->                     run with the environment of a real S3-API server (moto, on
                                    loopback) whose bucket `my-bucket` holds the shards the
                                    object-storage section names (see `guide_bucket`)

The marker is an HTML comment, so the site and GitHub do not show it. docs/getting-started.md
("Code in these pages") says the same for writers of the guides. A block that imports a package
`pip install .` does not bring (anything beyond the standard library, torch and NumPy) must
come after a `pip install` line on its page that names that package, or an extra of fastshard
that brings it. The page check needs the checkout's docs/ (the sdist leaves it out) and skips
without it.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import multiprocessing
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML parser
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]
# Pages whose first code block must run as written: a newcomer starts there.
FIRST_RUNS = ("getting-started.md", "length-grouped.md", "mixtures.md", "packing.md", "streams.md")
TIMEOUT = 180

pytestmark = pytest.mark.skipif(not DOCS.is_dir(), reason="docs/ is not part of the sdist")

_FENCE = re.compile(r"^( *)```python\s*$")
_MARK = re.compile(r"^\s*<!--\s*(fragment|continued|s3)\b[^>]*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    mark: str  # "run", "fragment", "continued" or "s3"

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


def chain(block: Block) -> list[Block]:
    """A runnable block, after the blocks it continues."""
    page = [b for b in ALL if b.page == block.page]
    blocks = [block]
    k = page.index(block)
    while blocks[0].mark == "continued":
        k -= 1
        while k >= 0 and page[k].mark == "fragment":
            k -= 1
        assert k >= 0, f"{block.id}: continues no runnable block"
        blocks.insert(0, page[k])
    return blocks


def program(block: Block) -> str:
    """The code a runnable block runs: itself, after the blocks it continues."""
    return "\n".join(b.code for b in chain(block))


@pytest.fixture(scope="module")
def guide_bucket(tmp_path_factory):
    """The bucket the guides' object-storage blocks read: `my-bucket` on a real S3-API server
    (tests/s3_server.py), holding 4 tar shards of 100 samples with their index, the same
    rows as 4 Parquet files (column `text`) and as MDS shards. Yields the environment a
    client needs to reach it."""
    sys.path.insert(0, str(Path(__file__).parent))
    import pyarrow as pa
    import pyarrow.parquet as pq
    from remote_data import write_mds, write_tar
    from s3_server import S3Server

    from fastshard import readers

    d = tmp_path_factory.mktemp("guide-bucket")
    files = {}
    for s in range(4):
        tar = d / f"train-{s:04d}.tar"
        write_tar(tar, 100 * s, 100)
        files[f"shards/{tar.name}"] = str(tar)
        part = d / f"part-{s:04d}.parquet"
        pq.write_table(pa.table({"text": [f"row {100 * s + r}" for r in range(100)]}), part)
        files[f"parquet/{part.name}"] = str(part)
    (d / "mds").mkdir()
    write_mds(d / "mds", [100] * 4)
    for p in sorted((d / "mds").iterdir()):
        files[f"mds/{p.name}"] = str(p)
    with S3Server() as srv:
        srv.upload("my-bucket", files)
        env = srv.env()
        readers.write_tar_index(
            [f"s3://my-bucket/shards/train-{s:04d}.tar" for s in range(4)],
            "s3://my-bucket/shards/index.json",
            storage_options={
                "endpoint_url": env["AWS_ENDPOINT_URL"],
                "key": env["AWS_ACCESS_KEY_ID"],
                "secret": env["AWS_SECRET_ACCESS_KEY"],
            },
        )
        yield env


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_guide_block(block, tmp_path, request):
    compile(program(block) if block.mark != "fragment" else block.code, block.id, "exec")
    if block.mark == "fragment":
        return
    absent = sorted(m for b in chain(block) for m in extra_imports(b) if not find_spec(m))
    if absent and os.environ.get("FASTSHARD_REQUIRE_INTEGRATIONS") != "1":
        # the page's install line names them; CI installs them and fails instead
        pytest.skip(f"needs {', '.join(absent)} (the page's pip install line)")
    if multiprocessing.get_start_method() != "fork":
        # DataLoader workers started by spawn re-run a script without a __main__ guard
        pytest.skip("the guides' blocks are scripts for fork-started DataLoader workers")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")
    }
    if any(b.mark == "s3" for b in chain(block)):
        env.update(request.getfixturevalue("guide_bucket"))
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


# What `pip install .` brings: fastshard and its dependencies (pyproject's `dependencies`).
CORE = {"fastshard", "torch", "numpy"}
# Import names whose distribution has another name, for when the package is not installed.
DISTRIBUTIONS = {"pytorch_lightning": "lightning", "yaml": "pyyaml", "PIL": "pillow"}
_PIP = re.compile(r"pip install\s+([^`#\n]*)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def installed_by(line: str) -> set[str]:
    """The distributions a line's `pip install` commands name, a fastshard extra's included."""
    names: set[str] = set()
    for command in _PIP.findall(line):
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        skip = False
        for word in words:
            if skip or word.startswith("-"):
                # an option; those that take a value take the next word
                skip = not skip and word in ("-r", "-c", "-i", "--index-url", "--extra-index-url")
                continue
            target, _, extra = word.partition("[")
            if extra and (target in (".", "fastshard") or target.endswith("/")):
                for name in extra.rstrip("]").split(","):
                    for req in extras().get(name.strip(), []):
                        names.add(_normal(re.match(r"[\w.-]+", req).group()))
            elif m := re.match(r"[A-Za-z0-9][\w.-]*", word):
                names.add(_normal(m.group()))
    return names


def imports(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def extra_imports(block: Block) -> set[str]:
    """The block's imports that `pip install .` does not bring."""
    return {n for n in imports(block.code) if n not in CORE and n not in sys.stdlib_module_names}


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions(module: str) -> set[str]:
    found = set(_installed().get(module, []))
    return {_normal(d) for d in {module, DISTRIBUTIONS.get(module, module), *found}}


def install_lines_before(block: Block) -> set[str]:
    lines = block.page.read_text(encoding="utf-8").splitlines()[: block.line - 1]
    return set().union(*(installed_by(line) for line in lines))


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_a_block_that_needs_a_package_says_how_to_install_it(block):
    installed = install_lines_before(block)
    missing = sorted(m for m in extra_imports(block) if not distributions(m) & installed)
    assert not missing, (
        f"{block.id} imports {', '.join(missing)}, which `pip install .` does not bring: put a "
        "`pip install` line naming it before the block"
    )


def test_install_lines_are_read():
    assert installed_by('pip install ".[integrations]" matplotlib   # transformers') >= {
        "transformers",
        "lightning",
        "matplotlib",
    }
    assert installed_by("`pip install torch==2.13.0 --index-url https://x/cpu`") == {"torch"}
    assert installed_by("pip install -r docs/requirements.txt") == set()
    page = [b for b in ALL if b.page.name == "packing.md"]
    assert "transformers" in extra_imports(page[0])
