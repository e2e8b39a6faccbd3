"""LengthGroupedBatchSampler on a real 2-rank gloo group: a token-budget epoch ends on every
rank without a hang, covers every item, and the guard catches different lengths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import launch_ranks

# The extended tier (`pytest -m extended`, run by .ci/run):
# multi-process; the default tier's real multi-process runs are in test_distributed.py.
pytestmark = pytest.mark.extended

WORKER = Path(__file__).resolve().parent / "length_worker.py"
TIMEOUT = 240  # seconds for the whole run; a hang fails the launch instead of the suite


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return launch_ranks(WORKER, 2, TIMEOUT)


@pytest.mark.parametrize("scenario", ["budget_epochs", "budget_epochs_drop_last"])
def test_token_budget_epoch_ends_on_every_rank(ranks, scenario):
    res = [r[scenario] for r in ranks]
    assert all("error" not in x for x in res), [x.get("error") for x in res]
    assert all(x["in_step"] for x in res)
    assert res[0]["steps"] == res[1]["steps"]  # the same number of steps: nobody waits
    assert res[0]["tokens"] != res[1]["tokens"]  # although the ranks' token counts differ
    assert all(x["over_budget"] == 0 for x in res)
    # every item every epoch, or with drop_last all but the dropped tail's (fewer than W
    # batches of the global sequence)
    assert res[0]["covered"] == res[0]["expected_covered"]
    if scenario == "budget_epochs":
        assert res[0]["covered"] == [6000, 6000]


def test_guard_refuses_different_lengths(ranks):
    res = [r["guard_lengths"] for r in ranks]
    assert all(x["in_step"] for x in res)
    assert all(x.get("raised") and x["fields"] == ["lengths_checksum"] for x in res), res
