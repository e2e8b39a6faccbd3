"""Argument checks shared by the public API: each names the argument and the allowed range."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch

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
    """A flag: ``True``/``False``, a NumPy bool, or the integers 0 and 1 (Python or NumPy).

    torch reads its flags by truth value, so code written for it may pass 0 and 1; those mean
    one thing only and are taken. Anything else (strings, floats, None, other integers) is
    refused rather than judged by truthiness: ``"False"`` or ``2`` is a mistake, not a flag.
    The message starts with torch's own wording for a bad flag.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    start = f"{name} should be a boolean value, but got {name}={value}"
    if isinstance(value, (int, np.integer)):
        if value == 0 or value == 1:
            return bool(value)
        raise ValueError(f"{start}: an integer flag must be 0 or 1")
    raise TypeError(
        f"{start} ({type(value).__name__}): pass True or False (0 and 1 and NumPy bools are "
        "taken too)"
    )


def length(dataset: Any) -> int:
    """The number of items of a dataset, or a length given as an int, in [0, 2**63 - 1].

    Anything with ``__len__`` is a dataset, whatever else it is: a one-element integer tensor
    or array has ``len() == 1`` (as torch's sampler sees it), not the length its value would
    say. Only a plain int or a NumPy integer scalar stands for a length (never a bool).
    """
    len_method = getattr(type(dataset), "__len__", None)
    if len_method is None:
        if isinstance(dataset, (bool, np.bool_)):
            raise TypeError("dataset must be a Sized object or an int length, got bool")
        if not isinstance(dataset, (int, np.integer)):
            raise TypeError(
                "dataset must be a Sized object (with __len__) or an int length, "
                f"got {type(dataset).__name__}"
            )
        n = int(dataset)
    else:
        # Called directly rather than through len(), which cannot return 2**63 or more and
        # would hide a huge length behind an OverflowError.
        try:
            size = len_method(dataset)
        except TypeError as err:
            # e.g. a 0-d tensor or array: a class with __len__ whose instance has no length
            raise TypeError(
                f"dataset must be a Sized object or an int length; len() of this "
                f"{type(dataset).__name__} fails: {err}"
            ) from err
        n = integer(size, "len(dataset)")
    if not 0 <= n <= MAX_LENGTH:
        raise ValueError(f"dataset length must be in [0, 2**63 - 1], got {n}")
    return n


def seed64(value: Any, name: str) -> int:
    """Any Python int, reduced modulo 2**64 (so -1 and 2**64 - 1 are the same seed)."""
    return integer(value, name) % _U64


def host_array(value: Any, name: str, what: str) -> np.ndarray:
    """``value`` (a CPU tensor, a NumPy array or a sequence) as a NumPy array, without a
    Python loop and without a copy where NumPy needs none; ``what`` says what its elements
    should be, for the messages (e.g. "numbers")."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise TypeError(
                f"{name} must be a CPU tensor, got one on {value.device}; call .cpu() first"
            )
        value = value.detach().numpy()
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a 1-D sequence of {what}, got a string")
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a 1-D sequence of {what}: {err}") from None
