"""Glue for torch.distributed: the rank-consistency guard and ``seed=None``.

Both make exactly one small collective call on the default process group, and whether a
rank makes it never depends on the rank's own values: a rank that disagrees still takes
part, so every rank learns of the disagreement and none waits for a call that never comes.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

# What every rank's sampler must agree on: its configuration (the part of a checkpoint that
# must match: n, seed, order, ... or, for weighted sampling, the weights' checksum), then the
# epoch, the resume cursor and num_replicas. `rank` is absent on purpose: it differs by design
# (and under tensor or pipeline parallelism several processes share one). The row has a fixed
# width, so ranks with different kinds of sampler still make the same collective call.
WIDTH = 16

_U64 = 2**64
_I64 = 2**63


class Checked(Protocol):
    """What the check reads of a sampler. A protocol rather than the sampler class, so that
    this module does not import the samplers that import it."""

    check_consistency: bool
    epoch: int
    num_replicas: int

    def _config(self) -> dict[str, Any]: ...

    def _resume_point(self) -> dict[str, Any]: ...


class InconsistentRanksError(RuntimeError):
    """The ranks of the process group disagree on a sampler's configuration.

    Raised by the consistency check at the start of an iteration (``check_consistency=True``,
    the default, with an initialised process group; a ``ShardedStream`` also checks when it is
    built, at ``set_epoch`` and at ``load_state_dict``), on every rank at once, with the same
    message, so that no rank trains on a plan the others do not share.

    Parameters
    ----------
    message : str
        What differs, on which ranks.
    fields : dict of str to list, optional
        Each differing field (``"seed"``, ``"epoch"``, ``"n"``, ...) mapped to its value on
        each process rank (list index = rank in the default process group). Kept as the
        attribute ``fields``.

    Examples
    --------
    >>> err = fastshard.InconsistentRanksError(
    ...     "ranks disagree on epoch", {"epoch": [3, 2]}
    ... )
    >>> err.fields["epoch"]
    [3, 2]

    Catching it around an iteration::

        try:
            for batch in loader:
                ...
        except fastshard.InconsistentRanksError as err:
            print(err.fields)  # e.g. {'epoch': [3, 2]}: rank 1 missed a set_epoch
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


def _text_id(name: str) -> int:
    """An int64 per name, the same in every process (unlike hash()): the name's own bytes
    when it fits in 8, so an error can show it, else 8 bytes of its BLAKE2 digest."""
    raw = name.encode()
    if len(raw) > 8:
        raw = hashlib.blake2b(raw, digest_size=8).digest()
    return int.from_bytes(raw.ljust(8, b"\0"), "little", signed=True)


def _text_name(value: int) -> str:
    raw = value.to_bytes(8, "little", signed=True).rstrip(b"\0")
    text = raw.decode("ascii", errors="replace")
    return text if text.isprintable() and "\ufffd" not in text else f"<{value:#x}>"


def _list_id(values: list[Any] | tuple[Any, ...]) -> int:
    """An int64 digest of a list (a mixture's sizes or weights), the same in every process."""
    digest = hashlib.blake2b(repr([*values]).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _encode(value: Any) -> int:
    if isinstance(value, str):
        return _text_id(value)
    if isinstance(value, (list, tuple)):
        return _list_id(value)
    return _signed(int(value))  # bools become 0/1


def _fields(sampler: Checked) -> dict[str, Any]:
    return {
        "sampler": type(sampler).__name__,
        **sampler._config(),
        "epoch": sampler.epoch,
        **sampler._resume_point(),
        "num_replicas": sampler.num_replicas,
    }


def _row(fields: dict[str, Any]) -> list[int]:
    row = [_encode(v) for v in fields.values()]
    if len(row) > WIDTH:  # pragma: no cover - a new sampler with a larger config
        raise AssertionError("the consistency row is too narrow for this sampler")
    return row + [0] * (WIDTH - len(row))


# The kinds of sampler fastshard makes. A name longer than 8 bytes travels as a digest, so a
# rank names another rank's kind from this table (a subclass of one shows as <0x...>).
_KINDS = {
    _text_id(name): name
    for name in (
        "DistributedSampler",
        "WeightedDistributedSampler",
        "MixtureSampler",
        "LengthGroupedBatchSampler",
        "PackedSampler",
        "ShardedStream",
    )
}


def _display(value: int, local: Any) -> Any:
    """A received value in the form of the local one (the ranks' samplers share a type once
    their kinds agree; the kind itself is a sampler class name)."""
    if isinstance(local, bool):
        return bool(value)
    if isinstance(local, (list, tuple)):
        # Only a digest travels, so every rank shows digests (the same message everywhere).
        return f"<digest {value % _U64:#018x}>"
    if isinstance(local, str):
        if value == _text_id(local):
            return local
        return _KINDS.get(value) or _text_name(value)
    return value % _U64 if value < 0 else value


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
    by_value: dict[str, list[int]] = {}  # keyed by repr: a list value is not hashable
    for rank, v in enumerate(values):
        by_value.setdefault(repr(v), []).append(rank)
    return f"{field}: " + "; ".join(f"{v} on {_ranks(rs)}" for v, rs in by_value.items())


def check(sampler: Checked, together: int = 0, when: str = "at the start of an iteration") -> None:
    """Raise InconsistentRanksError on every rank unless all ranks' samplers agree.

    Runs at the start of each pass (each ``__iter__``, which a training loop calls once per
    epoch), with an initialised process group of two or more processes, outside DataLoader
    workers, unless the sampler was built with ``check_consistency=False``; a stream also
    checks when it is built, at ``set_epoch`` and at ``load_state_dict`` (``when`` says which,
    in the message). One all_gather of ``WIDTH`` int64s.

    A sampler with ``num_replicas=1`` is not sharded over the group, so nothing says every
    process iterates it (rank 0 evaluating alone is an everyday pattern, and a collective
    there would hang every rank): it is checked only where ``together`` (the processes known
    to iterate it at once, as accelerate's BatchSamplerShard does on every process) is at
    least 2.
    """
    if not sampler.check_consistency:
        return
    if sampler.num_replicas == 1 and together < 2:
        return
    world = _world_size()
    if world < 2:
        return
    local = _fields(sampler)
    mine = torch.tensor(_row(local), dtype=torch.int64, device=_device())
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    rows = torch.stack(gathered).tolist()
    if any(row[0] != rows[0][0] for row in rows):
        # Different kinds of sampler: the other columns mean different things.
        names = [_display(row[0], local["sampler"]) for row in rows]
        fields = {"sampler": names}
    else:
        fields = {
            name: [_display(row[i], value) for row in rows]
            for i, (name, value) in enumerate(local.items())
            if any(row[i] != rows[0][i] for row in rows)
        }
    if fields:
        detail = "\n  ".join(_describe(f, vs) for f, vs in fields.items())
        # What a rank passes when it builds the sampler: its configuration, and a per-rank
        # batch size where the guard holds one (a stream's, part of its resume point).
        built = [*sampler._config(), *(k for k in sampler._resume_point() if k == "batch_size")]
        # The same message on every rank: with different kinds, no rank's own config names
        # what must agree.
        same = (
            "the same kind of sampler, with the same configuration"
            if "sampler" in fields
            else f"its sampler with the same {', '.join(built)}"
        )
        raise InconsistentRanksError(
            f"fastshard.{type(sampler).__name__}: the {world} ranks disagree on the sampler "
            f"{when} (this is rank {dist.get_rank()}):\n  {detail}\n"
            f"Every rank must build {same} "
            "and num_replicas, and be at the same epoch (set_epoch) and resume point before "
            "iterating. Raised on every rank; pass "
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
