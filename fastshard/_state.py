"""The sampler's checkpoint: a small, versioned, JSON-serialisable dict that holds no rank.

It records the configuration, the epoch and the global cursor: how many positions of the
epoch's global sequence all ranks together have consumed. Any rank's state restores every
rank, on the same or another number of ranks.
"""

from __future__ import annotations

from typing import Any

VERSION = 1

# key -> (accepted types, description); bool is not an int here.
_FIELDS: dict[str, tuple[type, ...]] = {
    "version": (int,),
    "n": (int,),
    "seed": (int,),
    "order": (str,),
    "shuffle": (bool,),
    "drop_last": (bool,),
    "pad": (bool,),
    "epoch": (int,),
    "cursor": (int,),
}

# The fields that must equal the sampler's own for a state to apply to it.
CONFIG = ("n", "seed", "order", "shuffle", "drop_last", "pad")


def make(config: dict[str, Any], epoch: int, cursor: int) -> dict[str, Any]:
    return {"version": VERSION, **config, "epoch": epoch, "cursor": cursor}


def check(state: Any, config: dict[str, Any]) -> tuple[int, int]:
    """Validate ``state`` against the sampler's ``config``; return (epoch, cursor).

    Raises TypeError/ValueError naming the field; the caller applies nothing before this returns.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    version = state.get("version")
    if "version" not in state:
        raise ValueError("state has no 'version': it is not a fastshard sampler state")
    if version != VERSION or type(version) is not int:
        raise ValueError(f"unknown state version {version!r}; this fastshard reads version {VERSION}")
    missing = [k for k in _FIELDS if k not in state]
    if missing:
        raise ValueError(f"state is missing {', '.join(map(repr, missing))}")
    for key, types in _FIELDS.items():
        value = state[key]
        ok = isinstance(value, types) and not (types == (int,) and isinstance(value, bool))
        if not ok:
            want = " or ".join(t.__name__ for t in types)
            raise TypeError(f"state[{key!r}] must be {want}, got {type(value).__name__} {value!r}")
    for key in CONFIG:
        if state[key] != config[key]:
            raise ValueError(
                f"state was saved with {key}={state[key]!r} but this sampler has "
                f"{key}={config[key]!r}; a state only restores a sampler of the same "
                f"{', '.join(CONFIG)}"
            )
    cursor = state["cursor"]
    if not 0 <= cursor <= 2**63 - 1:
        raise ValueError(f"state['cursor'] must be in [0, 2**63 - 1], got {cursor}")
    return state["epoch"], cursor
