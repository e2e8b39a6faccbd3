"""Order quality report: the default "feistel" order next to torch.randperm.

    python -m fastshard quality                 # the full report (about 10-20 minutes on 2 cores)
    python -m fastshard quality --scale 1       # the test suite's sample sizes
    python -m fastshard quality --rounds 4,6    # also the bare network cut to 4 and 6 rounds
    python -m fastshard quality --speed         # only the side-by-side speed check
    python -m fastshard quality --small-network # the bare network on the table's small domains
    (python bench/quality.py ... runs the same)

Prints a Markdown table: for each statistic (fastshard/_quality.py), the p-value of the feistel
order, of torch.randperm seeded as torch's DistributedSampler seeds it, and optionally of the
bare Feistel network with fewer rounds (no small-n table; its first r rounds are the public
network's). A p-value below 1e-4 (marked **bold**) is a failure; with a hundred statistics,
a truly random order shows on average 0.01 of them.

Run it against an installed fastshard from outside the source tree's import path, e.g.
python -P bench/quality.py, or cd bench && python quality.py.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from . import _quality as q


def speed(rounds: int = 9) -> str:
    """DistributedSampler(10**9, 8, 3).indices() against np.arange of the same length, timed as
    interleaved pairs in this process (A B, then B A, ...): best and median of each, and the
    median of the per-round ratios (the machine may be shared)."""
    import fastshard

    s = fastshard.DistributedSampler(10**9, 8, 3)
    n = len(s)

    def fill() -> float:
        t = time.perf_counter()
        a = s.indices()
        dt = time.perf_counter() - t
        assert len(a) == n
        return dt

    def arange() -> float:
        t = time.perf_counter()
        b = np.arange(n)
        dt = time.perf_counter() - t
        assert len(b) == n
        return dt

    ts: list[float] = []
    ta: list[float] = []
    for i in range(rounds):
        if i % 2 == 0:
            ts.append(fill())
            ta.append(arange())
        else:
            ta.append(arange())
            ts.append(fill())
    ratios = sorted(x / y for x, y in zip(ts, ta))
    med = rounds // 2
    return (
        f"DistributedSampler(10**9, 8, 3).indices() ({n:,} indices, "
        f"{fastshard.get_num_threads()} threads): best {min(ts):.3f} s, median "
        f"{sorted(ts)[med]:.3f} s; np.arange({n:,}): best {min(ta):.3f} s, median "
        f"{sorted(ta)[med]:.3f} s; ratio: median of {rounds} paired rounds "
        f"{ratios[med]:.2f}, of the bests {min(ts) / min(ta):.2f}"
    )


def small_network() -> None:
    """The bare 8-round network (no table) on the small domains the table covers."""
    import math

    net = q.Network(8)
    print("| statistic | n | samples | bare 8-round network p | statistic |")
    print("|---|---:|---:|---:|---|")
    rows = [
        (
            "all n! permutations",
            n,
            lambda n=n: q.all_permutations(net, n, range(400 * math.factorial(n))),
        )
        for n in (3, 4, 5)
    ]
    for n in (16, 32, 64, 128, 256, 512, 1000):
        rows += [
            ("position, full table", n, lambda n=n: q.position_table(net, n, range(20 * n))),
            ("number of cycles", n, lambda n=n: q.cycle_counts(net, n, range(16000))),
            ("fixed points", n, lambda n=n: q.fixed_points(net, n, range(16000))),
            (
                "P(i+1)-P(i) mod n",
                n,
                lambda n=n: q.differences(net, n, range(max(1600, 400_000 // n))),
            ),
        ]
    for name, n, run in rows:
        r = run()
        p = f"**{r.p:.2g}**" if not r.ok else f"{r.p:.2g}"
        print(f"| {name} | {n} | {r.samples} | {p} | {r.statistic} |", flush=True)


def main(argv: list[str] | None = None, prog: str = "python -m fastshard quality") -> None:
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--scale", type=float, default=4.0, help="sample sizes relative to the tests")
    ap.add_argument("--rounds", default="", help="comma-separated round counts of the bare network")
    ap.add_argument("--speed", action="store_true", help="only the speed check")
    ap.add_argument(
        "--small-network", action="store_true", help="only the bare network on n <= 1000"
    )
    ap.add_argument("--only", default="", help="only cases whose id contains this text")
    args = ap.parse_args(argv)

    if args.speed:
        print(speed())
        return
    if args.small_network:
        small_network()
        return

    sources: list[q.Source] = [q.Feistel(), q.TorchRandperm()]
    sources += [q.Network(int(r)) for r in args.rounds.split(",") if r]
    import torch

    import fastshard

    print(
        f"fastshard {fastshard.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
        f"{platform.machine()}; scale {args.scale} (sample sizes x{args.scale} of the tests); "
        f"alpha {q.ALPHA} per statistic\n"
    )
    names = " | ".join(s.name for s in sources)
    print(f"| statistic | n | samples | {names} | feistel statistic |")
    print("|---|---:|---:|" + "---:|" * len(sources) + "---|")
    fails = {s.name: 0 for s in sources}
    worst = {s.name: 1.0 for s in sources}
    seconds = {s.name: 0.0 for s in sources}
    ran = {s.name: 0 for s in sources}
    for case in q.battery(args.scale):
        if args.only and args.only not in case.id:
            continue
        cells, detail, samples = [], "", ""
        for src in sources:
            if (case.huge and not src.huge) or (isinstance(src, q.Network) and case.n > 2**24):
                cells.append("—")
                continue
            t = time.perf_counter()
            res = case.run(src)
            seconds[src.name] += time.perf_counter() - t
            ran[src.name] += 1
            worst[src.name] = min(worst[src.name], res.p)
            if not res.ok:
                fails[src.name] += 1
            cells.append(f"**{res.p:.2g}**" if not res.ok else f"{res.p:.2g}")
            if src.name == "feistel":
                detail, samples = res.statistic, str(res.samples)
        n = "2^63-1" if case.n == 2**63 - 1 else f"{case.n:,}"
        print(
            f"| {case.group}: {case.name} | {n} | {samples} | {' | '.join(cells)} | {detail} |",
            flush=True,
        )
    print()
    for s in sources:
        print(
            f"- {s.name}: {fails[s.name]} of {ran[s.name]} statistics below {q.ALPHA}; smallest p "
            f"{worst[s.name]:.2g}; {seconds[s.name]:.0f} s"
        )


if __name__ == "__main__":
    main()
