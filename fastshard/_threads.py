"""How many threads the bulk fills (``indices``) may use."""

from __future__ import annotations

from typing import Any

from . import _core, _validate

MAX_THREADS = 2**16


def set_num_threads(threads: Any) -> None:
    """Set the number of threads that fill large index ranges (process-wide).

    Parameters
    ----------
    threads : int
        In ``[0, 65536]``; ``0`` restores the default, the number of hardware threads. Ranges
        are split only into parts of at least 65536 indices, so small calls stay single-threaded.
    """
    _core.set_num_threads(_validate.in_range(threads, "threads", 0, MAX_THREADS))


def get_num_threads() -> int:
    """The number of threads that fill large index ranges."""
    return int(_core.get_num_threads())
