"""PackedSampler on a real 2-rank gloo group: concat and best_fit epochs through a DataLoader
with a worker end on every rank at the same step, and the guard catches different lengths."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from .conftest import child_env, free_port, kill_group

WORKER = Path(__file__).resolve().parent / "packed_worker.py"
TIMEOUT = 240  # seconds for the whole run; a hang fails the launch instead of the suite


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), "2", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            cwd=tempfile.gettempdir(),  # never import fastshard from the source tree
            start_new_session=True,
        )
        for r in range(2)
    ]
    finished = []
    try:
        for p in procs:
            try:
                finished.append((*p.communicate(timeout=TIMEOUT), p.returncode))
            except subprocess.TimeoutExpired:
                finished.append(("", "", None))
    finally:
        for p in procs:
            kill_group(p)
        for p in procs:
            if p.returncode is None:
                p.communicate()
    for r, (_, err, code) in enumerate(finished):
        if code != 0:
            what = f"did not finish in {TIMEOUT} s (a hang?)" if code is None else f"exited {code}"
            pytest.fail(f"rank {r} {what}:\n{err[-3000:]}")
    return [json.loads(out.strip().splitlines()[-1])["results"] for out, _, _ in finished]


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
