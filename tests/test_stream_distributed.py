"""ShardedStream on 2 gloo ranks with an all_reduce per step: equal shares end every epoch on
every rank (no hang) over shards a modulo split would leave uneven; the guard refuses ranks
that disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import launch_ranks

# The extended tier (`pytest -m extended`, run by .ci/run):
# multi-process; the default tier's real multi-process runs are in test_distributed.py.
pytestmark = pytest.mark.extended

WORKER = Path(__file__).resolve().parent / "stream_worker.py"
TIMEOUT = 240  # seconds for the whole run; a hang fails the launch instead of the suite
SIZES = [100, 3, 50, 7, 64]


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return launch_ranks(WORKER, 2, TIMEOUT)


def test_modulo_split_would_be_uneven():
    # What webdataset's split_by_node deals: shards r, r + W, ...
    assert [sum(SIZES[r::2]) for r in range(2)] == [214, 10]


def test_every_epoch_ends_on_every_rank_with_every_item(ranks):
    res = [r["train"] for r in ranks]
    assert all("error" not in x for x in res), [x.get("error") for x in res]
    assert all(x["in_step"] for x in res)
    n = sum(SIZES)
    per_rank = -(-n // 2)
    assert res[0]["steps"] == res[1]["steps"] == [-(-per_rank // 8)] * 2
    everything = sorted([s, r] for s, size in enumerate(SIZES) for r in range(size))
    for epoch in range(2):
        items = res[0]["items"][epoch]
        assert len(items) == 2 * per_rank  # padded by one repeated item
        assert sorted({tuple(x) for x in items}) == [tuple(x) for x in everything]


def test_guard_refuses_other_shard_sizes(ranks):
    res = [r["guard_sizes"] for r in ranks]
    assert all(x["in_step"] for x in res)
    assert all(x.get("raised") and x["fields"] == ["sizes_checksum"] for x in res), res
    # The stream checks when it is built: the message says so, not "an iteration".
    assert all("disagree on the sampler when it was built" in x["message"] for x in res), res


def test_guard_refuses_other_epochs(ranks):
    res = [r["guard_epoch"] for r in ranks]
    assert all(x["in_step"] for x in res)
    assert all(x.get("raised") and x["fields"] == ["epoch"] for x in res), res
    assert all("disagree on the sampler at set_epoch" in x["message"] for x in res), res


def test_guard_refuses_other_batch_sizes(ranks):
    res = [r["guard_batch"] for r in ranks]
    assert all(x["in_step"] for x in res)
    assert all(x.get("raised") and x["fields"] == ["batch_size"] for x in res), res
    # What to make equal names the field that differs.
    assert all(", pad, batch_size and num_replicas" in x["message"] for x in res), res
