"""The ``bench`` subcommand: its options and its main."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import mixture
from .adapters import SAMPLERS
from .plot import plot
from .runner import QUICK_SIZES, run_bench
from .table import render
from .units import parse_bytes, parse_count, parse_count_or_zero
from .weighted import render_weighted, run_weighted


def _sizes(text: str) -> list[int]:
    return sorted({parse_count(part) for part in text.replace(",", " ").split()})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's options."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small sizes ({', '.join(f'{n:.0e}' for n in QUICK_SIZES)}), one "
        "repeat, no core-target cases: under a minute",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        metavar="N[,N...]",
        help="dataset lengths n, e.g. '1e6,1e7' (default: 1e6,1e7,1e8,1e9)",
    )
    parser.add_argument(
        "--world",
        type=int,
        default=8,
        metavar="W",
        help="number of replicas; rank 0 is measured (default: 8)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        metavar="R",
        help="repeats per case, best kept; a case stops repeating once it has "
        "run for --budget seconds (default: 3, 1 with --quick)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds before a case is killed (default: 600)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=30.0,
        metavar="S",
        help="a sampler whose whole epoch through Python would take longer is "
        "timed on a prefix of --prefix indices (default: 30)",
    )
    parser.add_argument(
        "--prefix",
        type=parse_count,
        default=10**6,
        metavar="K",
        help="prefix length for slow samplers (default: 1e6)",
    )
    parser.add_argument(
        "--max-mem",
        type=parse_bytes,
        metavar="BYTES",
        help="skip cases predicted to need more resident memory, and kill any "
        "that pass it (default: 80%% of MemAvailable)",
    )
    parser.add_argument(
        "--only",
        metavar="NAME[,NAME...]",
        help="samplers to run: " + ", ".join(k for k, _, _, _ in SAMPLERS),
    )
    parser.add_argument(
        "--no-targets",
        action="store_true",
        help="skip the extra core-target case (memory over an epoch of 2.5e7)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="also write DIR/table.md, DIR/results.json and DIR/plot.png"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--weighted-n",
        type=parse_count_or_zero,
        default=None,
        help="items of the weighted comparison with torch's WeightedRandomSampler "
        "(default 2**24, its largest n; 2**16 with --quick; 0 skips it)",
    )
    mixture.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    """``python -m fastshard bench``."""
    results = run_bench(args)
    wn = args.weighted_n if args.weighted_n is not None else (2**16 if args.quick else 2**24)
    if wn > 0:
        results["weighted"] = run_weighted(
            wn, args.repeat or (1 if args.quick else 3), args.timeout
        )
    if args.mixture:
        meta = results["meta"]
        results["mixture"] = mixture.run_mixture(args, meta["max_mem_bytes"], meta["repeat"])
    table = (
        render(results)
        + render_weighted(results.get("weighted", []))
        + mixture.render_mixture(results.get("mixture", {}))
    )
    sys.stdout.write(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
            f.write(table)
        with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
        if not plot(results, os.path.join(args.out, "plot.png")):
            sys.stderr.write("matplotlib is not installed: no plot.png (pip install matplotlib)\n")
    return 0
