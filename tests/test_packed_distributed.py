"""PackedSampler on a real 2-rank gloo group: concat and best_fit epochs through a DataLoader
with a worker end on every rank at the same step, and the guard catches different lengths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import launch_ranks

# The extended tier (`pytest -m extended`, run by .ci/run):
# multi-process; the default tier's real multi-process runs are in test_distributed.py.
pytestmark = pytest.mark.extended

WORKER = Path(__file__).resolve().parent / "packed_worker.py"
TIMEOUT = 240  # seconds for the whole run; a hang fails the launch instead of the suite


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return launch_ranks(WORKER, 2, TIMEOUT)


@pytest.mark.parametrize("scenario", ["concat", "best_fit"])
def test_rows_epoch_ends_on_every_rank(ranks, scenario):
    res = [r[scenario] for r in ranks]
    assert all("error" not in x for x in res), [x.get("error") for x in res]
    assert all(x["in_step"] for x in res)
    assert res[0]["steps"] == res[1]["steps"]  # the same number of steps: nobody waits
    assert res[0]["steps"][0] == res[0]["steps"][1]  # and the same every epoch


def test_guard_refuses_different_lengths(ranks):
    res = [r["guard_lengths"] for r in ranks]
    assert all(x["in_step"] for x in res)
    assert all(x.get("raised") and x["fields"] == ["lengths_checksum"] for x in res), res
