"""The installed distribution describes itself consistently: one version, typed, licensed."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

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
