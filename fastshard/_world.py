"""Where num_replicas and rank come from when the caller does not say."""

from __future__ import annotations

import os

from . import _validate


def _process_group() -> tuple[int, int] | None:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed support
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return None


def _from_env(var: str, arg: str) -> int:
    raw = os.environ.get(var)
    if raw is None:
        raise ValueError(
            f"{arg} was not given, no torch.distributed process group is initialised and "
            f"{var} is not set: pass num_replicas= and rank=, initialise a process group, "
            "or launch with torchrun (which sets WORLD_SIZE and RANK)"
        )
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {var}={raw!r} is not an integer") from None


def resolve(num_replicas: object, rank: object) -> tuple[int, int]:
    """num_replicas and rank, each from the argument, else the process group, else torchrun's env.

    A bad value gets torch's message first (code written for torch matches on "Invalid rank"),
    then ours: where the value came from and what is wrong with it.
    """
    group = _process_group() if num_replicas is None or rank is None else None
    where = "the process group" if group else "the environment"
    if num_replicas is None:
        w = group[0] if group else _from_env("WORLD_SIZE", "num_replicas")
        w_from = f" (num_replicas from {where})"
    else:
        w = _validate.integer(num_replicas, "num_replicas")
        w_from = ""
    if rank is None:
        r = group[1] if group else _from_env("RANK", "rank")
        r_from = f" (rank from {where})"
    else:
        r = _validate.integer(rank, "rank")
        r_from = ""
    # torch has no check of its own for num_replicas: below 1 its rank check fails, so its
    # message is the invalid rank one ("in the interval [0, -1]"), which blames the rank, so
    # ours comes first there and torch's words follow for code that searches them; above
    # 2**63 - 1 it says nothing (we cannot take it).
    torch_says = f"Invalid rank {r}, rank should be in the interval [0, {w - 1}]"
    if w < 1:
        raise ValueError(
            f"num_replicas must be at least 1, got {w}{w_from} (torch's DistributedSampler "
            f"reports it as: {torch_says})"
        )
    if w > _validate.MAX_LENGTH:
        raise ValueError(f"num_replicas must be in [1, 2**63 - 1], got {w}{w_from}")
    if not 0 <= r < w:
        raise ValueError(
            f"{torch_says}: rank must be in [0, num_replicas - 1] with num_replicas = {w}, "
            f"got {r}{r_from}"
        )
    return w, r
