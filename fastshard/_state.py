"""The samplers' checkpoint: a small, versioned, JSON-serialisable dict that holds no rank.

It records the sampler's configuration, the epoch and the global cursor: how many positions
of the epoch's global sequence all ranks together have consumed. Any rank's state restores
every rank, on the same or another number of ranks. The cursor is at most n (the epoch's
length): with padding, the positions consumed by the end of a pass reach n + W - 1, which can
exceed 2**63 - 1, so a pass that padded past the end is saved with cursor = n. Any cursor >= n
leaves nothing on any number of ranks, so states saved with the larger cursor still load.

The block order (a config with ``block_size``) adds ``round``: None, or the round of chunks
that was interrupted at the cursor, as a dict of five ints (see csrc/fastshard/block.hpp):
``chunks`` chunks of ``size`` positions (``size + 1`` for the first ``rem``), of which each
chunk's first ``offset`` items and ``taken`` more of their remaining items were consumed.
"""

from __future__ import annotations

import hashlib
from typing import Any

VERSION = 1
ROUND_FIELDS = ("chunks", "size", "rem", "offset", "taken")
Round = tuple[int, int, int, int, int]
_MAX = 2**63 - 1
# Configuration fields that came after the first version of a sampler's state, with the
# value every state saved before them had: MixtureSampler's and LengthGroupedBatchSampler's
# ``pad`` (0.3).
_ADDED: dict[str, Any] = {"pad": True}


def make(
    config: dict[str, Any], epoch: int, cursor: int, rnd: Round | None = None
) -> dict[str, Any]:
    state = {"version": VERSION, **config, "epoch": epoch, "cursor": cursor}
    if "block_size" in config:
        state["round"] = None if rnd is None else dict(zip(ROUND_FIELDS, rnd))
    return state


def round_code(rnd: Round | None) -> int:
    """The round as one int64 (0 for none), for the rank-consistency check."""
    if rnd is None:
        return 0
    digest = hashlib.blake2b(repr(tuple(rnd)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1 or 1


def _check_round(value: Any, cursor: int, config: dict[str, Any]) -> Round | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"state['round'] must be None or a dict, got {type(value).__name__}")
    if set(value) != set(ROUND_FIELDS):
        raise ValueError(
            f"state['round'] must have exactly the keys {', '.join(ROUND_FIELDS)}, got {sorted(value)}"
        )
    for key in ROUND_FIELDS:
        v = value[key]
        if not _typed(v, int):
            raise TypeError(f"state['round'][{key!r}] must be int, got {type(v).__name__} {v!r}")
        if not 0 <= v <= _MAX:
            raise ValueError(f"state['round'][{key!r}] must be in [0, 2**63 - 1], got {v}")
    chunks, size, rem, offset, taken = (value[k] for k in ROUND_FIELDS)
    n, chunk = config["n"], config["block_size"] * config["window"]
    if chunks < 1 or rem >= chunks:
        raise ValueError(
            f"state['round'] needs chunks >= 1 and rem < chunks, got chunks={chunks}, rem={rem}"
        )
    if size + (rem > 0) > chunk:
        raise ValueError(f"state['round'] chunks exceed block_size * window = {chunk}")
    if cursor + chunks * size + rem > n:
        raise ValueError(f"state['round'] does not fit in the epoch: it ends past n = {n}")
    if offset > size + 1:
        raise ValueError(f"state['round']['offset'] must be <= size + 1, got {offset}")
    left = rem * max(size + 1 - offset, 0) + (chunks - rem) * max(size - offset, 0)
    if taken > left:
        raise ValueError(
            f"state['round']['taken'] must be <= {left} (the round's items left), got {taken}"
        )
    return chunks, size, rem, offset, taken


def _typed(value: Any, kind: type) -> bool:
    # bool is an int subclass; here the two are distinct types.
    return type(value) is kind if kind in (bool, int) else isinstance(value, kind)


def check(state: Any, config: dict[str, Any]) -> tuple[int, int, Round | None]:
    """Validate ``state`` against the sampler's ``config``; return (epoch, cursor, round).

    Each config field must be present, of the config value's type, and equal to it.
    Raises TypeError/ValueError naming the field; nothing is applied before this returns.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    if "version" not in state:
        raise ValueError("state has no 'version': it is not a fastshard sampler state")
    version = state["version"]
    if not _typed(version, int) or version != VERSION:
        raise ValueError(
            f"unknown state version {version!r}; this fastshard reads version {VERSION}"
        )
    # Fields added to a sampler's configuration after states were first saved: a state
    # without one was saved with its default.
    state = {**{k: v for k, v in _ADDED.items() if k in config}, **state}
    kinds = {key: type(value) for key, value in config.items()}
    kinds.update(epoch=int, cursor=int)
    rounds = "block_size" in config
    missing = [k for k in [*kinds, *(["round"] if rounds else [])] if k not in state]
    if missing:
        raise ValueError(f"state is missing {', '.join(map(repr, missing))}")
    for key, kind in kinds.items():
        if not _typed(state[key], kind):
            raise TypeError(
                f"state[{key!r}] must be {kind.__name__}, got {type(state[key]).__name__} {state[key]!r}"
            )
    for key, value in config.items():
        if state[key] != value:
            raise ValueError(
                f"state was saved with {key}={state[key]!r} but this sampler has {key}={value!r}; "
                f"a state only restores a sampler of the same {', '.join(config)}"
            )
    cursor = state["cursor"]
    if not 0 <= cursor <= _MAX:
        raise ValueError(f"state['cursor'] must be in [0, 2**63 - 1], got {cursor}")
    rnd = _check_round(state["round"], cursor, config) if rounds else None
    return state["epoch"], cursor, rnd
