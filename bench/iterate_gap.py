"""Iteration beside its floors, interleaved in one process (issue 30).

A rank epoch (n = 1e7, W = 8) through a Python `for` loop: fastshard's default order, the same
with shuffle=False (the iterator alone), a ready list, and `range(1000, 1000 + m)` (one new
int per step, as a sampler creates). Cases rotate each round; prints each one's median
ns/item and its per-round ratio to the range (median [min, max]).

    python bench/iterate_gap.py [ROUNDS]
"""

import gc
import statistics
import sys
import time

import fastshard

N, W = 10**7, 8
M = N // W


def loop(it):
    x = None
    for x in it:  # noqa: B007 - the loop is what is timed
        pass
    return x


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 41
    s = fastshard.DistributedSampler(N, num_replicas=W, rank=0, auto_epoch=True)
    s_id = fastshard.DistributedSampler(N, num_replicas=W, rank=0, shuffle=False, auto_epoch=True)
    items = s.indices().tolist()
    cases = {
        "range": lambda: loop(range(1000, 1000 + M)),
        "list": lambda: loop(items),
        "fastshard": lambda: loop(s),
        "shuffle=False": lambda: loop(s_id),
    }
    names = list(cases)
    times: dict[str, list[float]] = {k: [] for k in names}
    gc.disable()
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            cases[k]()
            times[k].append(time.perf_counter() - t0)
    for k in names:
        ns = [v / M * 1e9 for v in times[k]]
        ratios = [a / b for a, b in zip(times[k], times["range"])]
        print(
            f"{k:14s} {statistics.median(ns):6.2f} ns/item; / range: median "
            f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]"
        )


if __name__ == "__main__":
    main()
