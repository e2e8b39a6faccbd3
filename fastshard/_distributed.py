"""Glue for torch.distributed: the rank-consistency guard and ``seed=None``.

Both make exactly one small collective call on the default process group, and whether a
rank makes it never depends on the rank's own values: a rank that disagrees still takes
part, so every rank learns of the disagreement and none waits for a call that never comes.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

if TYPE_CHECKING:  # pragma: no cover
    from ._sampler import DistributedSampler

# What every rank's sampler must agree on, in the order they are sent. `rank` is absent on
# purpose: it differs by design (and under tensor or pipeline parallelism several processes
# share one).
FIELDS = ("n", "seed", "epoch", "cursor", "order", "shuffle", "drop_last", "pad", "num_replicas")

_U64 = 2**64
_I64 = 2**63


class InconsistentRanksError(RuntimeError):
    """The ranks of the process group disagree on a sampler's configuration.

    Raised by the consistency check at the start of an iteration, on every rank at once, with
    the same message. ``fields`` maps each differing field to its value on each process rank
    (list index = rank in the default process group).
    """

    def __init__(self, message: str, fields: dict[str, list[Any]] | None = None) -> None:
        super().__init__(message)
        self.fields: dict[str, list[Any]] = dict(fields or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.fields)


def _world_size() -> int:
    """The default group's size, or 0 without one (or inside a DataLoader worker).

    A forked worker inherits the parent's process-group object; a collective issued from it
    would interleave with the parent's traffic on the same connections, so workers never
    communicate.
    """
    if get_worker_info() is not None:
        return 0
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return int(dist.get_world_size())


def _device() -> torch.device:
    """Where the default group's backend wants tensors: NCCL on the current CUDA device,
    everything else (gloo, mpi, and mixed "cpu:gloo,cuda:nccl" groups) on the CPU."""
    backend = str(dist.get_backend())
    if "nccl" in backend and "cpu" not in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _signed(value: int) -> int:
    """``value mod 2**64`` as the int64 with the same bits."""
    v = value % _U64
    return v - _U64 if v >= _I64 else v


def _order_id(name: str) -> int:
    """An int64 per order name, the same in every process (unlike hash()): the name's own
    bytes when it fits in 8, so an error can show it, else 8 bytes of its BLAKE2 digest."""
    raw = name.encode()
    if len(raw) > 8:
        raw = hashlib.blake2b(raw, digest_size=8).digest()
    return int.from_bytes(raw.ljust(8, b"\0"), "little", signed=True)


def _order_name(value: int) -> str:
    raw = value.to_bytes(8, "little", signed=True).rstrip(b"\0")
    text = raw.decode("ascii", errors="replace")
    return text if text.isprintable() and "\ufffd" not in text else f"<order {value:#x}>"


def _row(sampler: DistributedSampler) -> list[int]:
    return [
        sampler._n,
        _signed(sampler.seed),
        _signed(sampler.epoch),
        # The resume cursor of load_state_dict; 0 where the sampler has none.
        int(getattr(sampler, "_cursor", 0)),
        _order_id(sampler.order),
        int(sampler.shuffle),
        int(sampler.drop_last),
        int(sampler.pad),
        sampler.num_replicas,
    ]


def _display(field: str, value: int, local_order: str) -> Any:
    if field in ("seed", "epoch"):
        return value % _U64
    if field == "order":
        return local_order if value == _order_id(local_order) else _order_name(value)
    if field in ("shuffle", "drop_last", "pad"):
        return bool(value)
    return value


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2, 5'."""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def _describe(field: str, values: list[Any]) -> str:
    by_value: dict[Any, list[int]] = {}
    for rank, v in enumerate(values):
        by_value.setdefault(v, []).append(rank)
    return f"{field}: " + "; ".join(f"{v!r} on {_ranks(rs)}" for v, rs in by_value.items())


def check(sampler: DistributedSampler) -> None:
    """Raise InconsistentRanksError on every rank unless all ranks' samplers agree.

    Runs at the start of each pass (each ``__iter__``, which a training loop calls once per
    epoch), with an initialised process group of two or more processes, outside DataLoader
    workers, unless the sampler was built with ``check_consistency=False``. One all_gather of
    ``len(FIELDS)`` int64s.
    """
    if not sampler.check_consistency:
        return
    world = _world_size()
    if world < 2:
        return
    mine = torch.tensor(_row(sampler), dtype=torch.int64, device=_device())
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    rows = torch.stack(gathered).tolist()
    fields = {
        field: [_display(field, row[i], sampler.order) for row in rows]
        for i, field in enumerate(FIELDS)
        if any(row[i] != rows[0][i] for row in rows)
    }
    if fields:
        detail = "\n  ".join(_describe(f, vs) for f, vs in fields.items())
        raise InconsistentRanksError(
            f"fastshard.{type(sampler).__name__}: the {world} ranks disagree on the sampler at "
            f"the start of an iteration (this is rank {dist.get_rank()}):\n  {detail}\n"
            "Every rank must build its sampler with the same dataset length, seed, order, "
            "shuffle, drop_last, pad and num_replicas, and be at the same epoch (set_epoch) "
            "and resume point before iterating. Raised on every rank; pass "
            "check_consistency=False (on every rank) to turn the check off.",
            fields,
        )


def random_seed() -> int:
    """A seed in [0, 2**63) drawn on rank 0 and broadcast to every rank (``seed=None``)."""
    if get_worker_info() is not None:
        raise ValueError(
            "seed=None cannot be resolved inside a DataLoader worker; build the sampler in "
            "the main process or pass an int seed"
        )
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "seed=None draws a random seed on rank 0 and broadcasts it to every rank, which "
            "needs an initialised torch.distributed process group; call "
            "torch.distributed.init_process_group() first or pass an int seed"
        )
    # 63 bits: fits an int64 tensor as is, and leaves room for seed + epoch in int64.
    value = secrets.randbits(63) if dist.get_rank() == 0 else 0
    t = torch.tensor([value], dtype=torch.int64, device=_device())
    dist.broadcast(t, src=0)
    return int(t.item())
