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
        In ``[0, 65536]``; ``0`` restores the default: the CPUs this process may run on
        (on Linux its affinity mask, as ``os.sched_getaffinity(0)``; elsewhere every core). Ranges
        are split only into parts of at least 65536 indices, so small calls stay single-threaded.

    Raises
    ------
    ValueError
        ``threads`` is outside ``[0, 65536]``.
    TypeError
        ``threads`` is not an int.

    Examples
    --------
    >>> fastshard.set_num_threads(1)
    >>> fastshard.get_num_threads()
    1
    >>> fastshard.set_num_threads(0)  # the default: the CPUs this process may use
    """
    _core.set_num_threads(_validate.in_range(threads, "threads", 0, MAX_THREADS))


def get_num_threads() -> int:
    """The number of threads that fill large index ranges.

    Returns
    -------
    int
        The value of :func:`set_num_threads`, or by default the CPUs this process may run on.

    Examples
    --------
    >>> fastshard.get_num_threads() >= 1
    True
    """
    return int(_core.get_num_threads())
