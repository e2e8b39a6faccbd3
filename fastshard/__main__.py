"""python -m fastshard COMMAND: tools that ship with the package.

Commands
--------
bench
    fastshard beside torch, torchdata and grain on this machine (see ``fastshard._bench``).
quality
    the default order's statistics next to torch.randperm (see ``fastshard._quality_report``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastshard", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    from . import _bench

    _bench.add_arguments(
        commands.add_parser(
            "bench",
            help="compare fastshard with torch, torchdata and grain on this machine",
            description="Time to the first index, a whole rank epoch (Python iteration and "
            "array) and peak memory, each case in a fresh process, for fastshard and each "
            "installed peer. Prints a Markdown table.",
        )
    )
    commands.add_parser(
        "quality",
        help="the default order's statistics next to torch.randperm (--help for options)",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "quality":
        from . import _quality_report

        _quality_report.main(rest)
        return 0
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "bench":
        return _bench.main(args)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
