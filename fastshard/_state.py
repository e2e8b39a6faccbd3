"""The samplers' checkpoint: a small, versioned, JSON-serialisable dict that holds no rank.

It records the sampler's configuration, the epoch and the global cursor: how many positions
of the epoch's global sequence all ranks together have consumed. Any rank's state restores
every rank, on the same or another number of ranks.
"""

from __future__ import annotations

from typing import Any

VERSION = 1


def make(config: dict[str, Any], epoch: int, cursor: int) -> dict[str, Any]:
    return {"version": VERSION, **config, "epoch": epoch, "cursor": cursor}


def _typed(value: Any, kind: type) -> bool:
    # bool is an int subclass; here the two are distinct types.
    return type(value) is kind if kind in (bool, int) else isinstance(value, kind)


def check(state: Any, config: dict[str, Any]) -> tuple[int, int]:
    """Validate ``state`` against the sampler's ``config``; return (epoch, cursor).

    Each config field must be present, of the config value's type, and equal to it.
    Raises TypeError/ValueError naming the field; nothing is applied before this returns.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    if "version" not in state:
        raise ValueError("state has no 'version': it is not a fastshard sampler state")
    version = state["version"]
    if not _typed(version, int) or version != VERSION:
        raise ValueError(f"unknown state version {version!r}; this fastshard reads version {VERSION}")
    kinds = {key: type(value) for key, value in config.items()}
    kinds.update(epoch=int, cursor=int)
    missing = [k for k in kinds if k not in state]
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
    if not 0 <= cursor <= 2**63 - 1:
        raise ValueError(f"state['cursor'] must be in [0, 2**63 - 1], got {cursor}")
    return state["epoch"], cursor
