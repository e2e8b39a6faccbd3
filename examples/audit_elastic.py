"""Audit a run of examples/train_elastic.py: what every epoch trained on, across faults.

    python examples/audit_elastic.py WORKDIR [--size N] [--epochs E] [--json]

Reads WORKDIR/log/*.jsonl. Each attempt (one formation of the process group) logged, per rank
and step, the epoch, the global cursor after the step and the items trained on; rank 0 logged
a commit each time a checkpoint was in place, and each attempt logged the checkpoint it started
from. A step is committed when a commit of its attempt (or a later attempt's start from that
attempt's checkpoint) covers it; the steps of an attempt after its last commit were lost with
it and replayed by the next attempt.

Per epoch it reports the items trained on in committed steps, the items lost (never trained on
in a committed step) and repeated (more than once), and the replayed steps. The exit status is
1 if a finished epoch lost or repeated an item, or if the run did not finish.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def read(workdir: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted((workdir / "log").glob("*.jsonl")):
        rank = int(path.stem.rsplit("rank", 1)[1])
        for line in path.read_text().splitlines():
            try:
                records.append({**json.loads(line), "rank": rank})
            except json.JSONDecodeError:  # a line cut by a kill
                continue
    return records


def audit(workdir: Path, size: int, epochs: int) -> dict[str, Any]:
    records = read(workdir)
    commits: dict[str, tuple[int, int]] = {}
    starts: dict[str, dict[str, Any]] = {}
    done = False

    def commit(attempt: str, point: tuple[int, int]) -> None:
        commits[attempt] = max(commits.get(attempt, (-1, -1)), point)

    for r in records:
        if "commit" in r:
            commit(r["attempt"], tuple(r["commit"]))
        elif r.get("start") and r["rank"] == 0:
            starts[r["attempt"]] = r
            if r["resumed_from"] is not None:  # its checkpoint was in place: a commit
                commit(r["checkpoint_attempt"], tuple(r["resumed_from"]))
        done = done or bool(r.get("done"))
    per_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    replayed: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for r in records:
        if "items" not in r:
            continue
        if (r["epoch"], r["cursor"]) <= commits.get(r["attempt"], (-1, -1)):
            per_epoch[r["epoch"]].update(r["items"])
        else:
            replayed[r["attempt"]].add((r["epoch"], r["cursor"]))
    report: dict[str, Any] = {
        "attempts": [
            {
                "attempt": a,
                "world": s["world"],
                "resumed_from": s["resumed_from"],
                "seed": s["seed"],
                "replayed_steps": len(replayed.get(a, ())),
            }
            for a, s in sorted(starts.items(), key=lambda kv: kv[1]["start"])  # in time order
        ],
        "epochs": [],
        "done": done,
    }
    for e in range(epochs):
        counts = per_epoch.get(e, Counter())
        report["epochs"].append(
            {
                "epoch": e,
                "trained": sum(counts.values()),
                "distinct": len(counts),
                "lost": size - len([i for i in counts if 0 <= i < size]),
                "repeated": sum(c - 1 for c in counts.values() if c > 1),
            }
        )
    report["replayed_steps"] = sum(len(v) for v in replayed.values())
    report["ok"] = done and all(x["lost"] == 0 and x["repeated"] == 0 for x in report["epochs"])
    return report


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("workdir", type=Path)
    p.add_argument("--size", type=int, default=10_007)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args()
    report = audit(args.workdir, args.size, args.epochs)
    if args.json:
        print(json.dumps(report))
        return 0 if report["ok"] else 1
    worlds = " -> ".join(str(a["world"]) for a in report["attempts"])
    print(f"attempts: {len(report['attempts'])} (world sizes {worlds}); "
          f"replayed steps: {report['replayed_steps']}")  # fmt: skip
    for x in report["epochs"]:
        print(f"epoch {x['epoch']}: {x['distinct']:,}/{args.size:,} items in committed steps, "
              f"lost {x['lost']}, repeated {x['repeated']}")  # fmt: skip
    print("OK" if report["ok"] else "FAIL" + ("" if report["done"] else ": the run did not finish"))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
