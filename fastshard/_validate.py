"""Argument checks shared by the public API: each names the argument and the allowed range."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

MAX_LENGTH = 2**63 - 1
_U64 = 2**64


def integer(value: Any, name: str) -> int:
    """Return ``value`` as a Python int; accepts int and NumPy integers, refuses bool and floats."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None


def in_range(value: Any, name: str, low: int, high: int) -> int:
    """An integer in [low, high]."""
    v = integer(value, name)
    if not low <= v <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {v}")
    return v


def flag(value: Any, name: str) -> bool:
    """A bool (Python or NumPy); anything else is refused rather than judged by truthiness."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def length(dataset: Any) -> int:
    """The number of items of a Sized object or an int length, in [0, 2**63 - 1]."""
    if isinstance(dataset, (bool, np.bool_)):
        raise TypeError("dataset must be a Sized object or an int length, got bool")
    try:
        n = operator.index(dataset)
    except TypeError:
        len_method = getattr(type(dataset), "__len__", None)
        if len_method is None:
            raise TypeError(
                "dataset must be a Sized object (with __len__) or an int length, "
                f"got {type(dataset).__name__}"
            ) from None
        # Called directly rather than through len(), which cannot return 2**63 or more and
        # would hide a huge length behind an OverflowError.
        n = integer(len_method(dataset), "len(dataset)")
    if not 0 <= n <= MAX_LENGTH:
        raise ValueError(f"dataset length must be in [0, 2**63 - 1], got {n}")
    return n


def seed64(value: Any, name: str) -> int:
    """Any Python int, reduced modulo 2**64 (so -1 and 2**64 - 1 are the same seed)."""
    return integer(value, name) % _U64
