"""What to say when ``fastshard._core`` cannot be imported.

The usual cause is not a missing install: Python puts the current folder (or the script's) first
on ``sys.path``, so in the root of a checkout ``import fastshard`` and ``python -m fastshard``
find the source folder, which has no compiled ``_core``, before the installed package.
"""

from __future__ import annotations

import importlib.metadata
import os


def _installed_location() -> str | None:
    """Where an installed fastshard lives, if pip installed one (None when none is)."""
    try:
        dist = importlib.metadata.distribution("fastshard")
    except importlib.metadata.PackageNotFoundError:
        return None
    return str(dist.locate_file("fastshard"))


def missing_core_message(init_file: str) -> str:
    """The ImportError's text for a fastshard package imported from ``init_file``."""
    package = os.path.dirname(os.path.abspath(init_file))
    root = os.path.dirname(package)
    in_checkout = os.path.isfile(os.path.join(root, "pyproject.toml")) and os.path.isdir(
        os.path.join(root, "csrc")
    )
    if not in_checkout:
        return (
            "fastshard's compiled module fastshard._core could not be imported from "
            f"{package}. Reinstall fastshard (from a checkout: `pip install .`)."
        )
    installed = _installed_location()
    where = (
        f"The installed fastshard ({installed}) is shadowed: "
        if installed
        else "No installed fastshard was found either: "
    )
    return (
        f"`import fastshard` found the source folder {package} (a checkout, whose fastshard/ has "
        "no compiled fastshard._core) because Python looks in the current folder, or the "
        f"script's, first. {where}"
        "run Python from another folder (or with `python -P`, Python 3.11 and later), or "
        "install the checkout in editable mode, which builds the core and makes the source "
        "folder importable: `pip install --no-build-isolation -ve .` (its build needs "
        "scikit-build-core and pybind11 installed: `pip install scikit-build-core pybind11`)."
    )
