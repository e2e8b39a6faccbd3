"""The installed distribution describes itself consistently: one version, typed, licensed."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fastshard


def test_wheel_version_is_the_package_version():
    # The build reads the version from fastshard/_version.py (scikit-build-core's regex
    # provider); the installed metadata and the module must agree.
    assert importlib.metadata.version("fastshard") == fastshard.__version__


def test_version_is_a_canonical_release_string():
    # A PEP 440 release (optionally with a pre/dev/post part), as the regex provider copies it
    # verbatim: a typo in _version.py would otherwise only surface on upload.
    assert re.fullmatch(
        r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", fastshard.__version__
    )


def test_installed_package_ships_stubs_and_marker():
    pkg = Path(fastshard.__file__).parent
    assert (pkg / "py.typed").is_file()
    assert (pkg / "_core.pyi").is_file()


def test_metadata_names_the_license():
    meta = importlib.metadata.metadata("fastshard")
    assert meta["License-Expression"] == "MIT"
    assert "LICENSE" in (meta.get_all("License-File") or [])


CHECKOUT = Path(__file__).resolve().parent.parent


def _fake_checkout(root: Path, *, checkout: bool) -> None:
    """The installed package's Python files without the compiled core, as a checkout holds them
    (pyproject.toml and csrc/ beside fastshard/ when `checkout`)."""
    installed = Path(fastshard.__file__).parent
    (root / "fastshard").mkdir()
    for f in installed.glob("*.py"):
        (root / "fastshard" / f.name).write_bytes(f.read_bytes())
    if checkout:
        (root / "pyproject.toml").write_text("[project]\nname = 'fastshard'\n")
        (root / "csrc").mkdir()


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_source_folder_that_shadows_the_install_says_so(tmp_path):
    # In a checkout's root the current folder comes first on sys.path, so `fastshard/` without
    # its compiled core is imported instead of the installed package: the error must name that
    # and send the user elsewhere, not ask for an install that is already there.
    _fake_checkout(tmp_path, checkout=True)
    installed = str(Path(fastshard.__file__).parent)
    for args in (["-c", "import fastshard"], ["-m", "fastshard", "--help"]):
        res = _run(tmp_path, *args)
        assert res.returncode != 0
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: ")
        assert "source folder" in last and str(tmp_path / "fastshard") in last
        assert installed in last and "shadowed" in last
        assert "pip install --no-build-isolation -ve ." in last
        assert "another folder" in last


def test_missing_core_outside_a_checkout_asks_for_a_reinstall(tmp_path):
    _fake_checkout(tmp_path, checkout=False)
    last = _run(tmp_path, "-c", "import fastshard").stderr.strip().splitlines()[-1]
    assert "could not be imported" in last and "Reinstall" in last
    assert "source folder" not in last


def test_cli_help_is_plain_text():
    # argparse prints docstrings as they are: no reStructuredText markup, and every command's
    # usage line names the command as the user typed it.
    top = _run(Path(fastshard.__file__).parent.parent, "-m", "fastshard", "--help")
    assert top.returncode == 0 and "``" not in top.stdout
    for command in ("quality", "bench"):
        res = _run(Path(fastshard.__file__).parent.parent, "-m", "fastshard", command, "--help")
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith(f"usage: python -m fastshard {command} ")
        assert "``" not in res.stdout and "`" not in res.stdout


@pytest.mark.skipif(
    not (CHECKOUT / "CHANGELOG.md").is_file(), reason="no CHANGELOG.md beside tests/"
)
def test_changelog_heads_with_the_version():
    # A development version's entries sit under "Unreleased", which names that version; a
    # release's under its own number.
    first = next(
        line
        for line in (CHECKOUT / "CHANGELOG.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    )
    if ".dev" in fastshard.__version__:
        assert first.startswith("## Unreleased") and fastshard.__version__ in first
    else:
        assert first.startswith(f"## {fastshard.__version__} ")
