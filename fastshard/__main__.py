"""python -m fastshard COMMAND: tools that ship with the package.

Commands
--------
bench
    fastshard beside torch, torchdata and grain on this machine (see ``fastshard._bench``).
quality
    the default order's statistics next to torch.randperm (see ``fastshard._quality_report``).
index
    a shard index of tar shards (counts and seek offsets) for ``readers.tar_shards(index=...)``.
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
    index = commands.add_parser(
        "index",
        help="write a shard index of tar shards (wids-shard-index-v1 JSON with seek offsets)",
        description="Count the samples of tar shards and find their seek offsets once (a "
        "header scan), and write them as a wids-shard-index-v1 JSON file that "
        "fastshard.readers.tar_shards(index=...) starts from in milliseconds.",
    )
    index.add_argument(
        "shards",
        nargs="+",
        metavar="SHARD",
        help="tar shard files or URLs, in order; a URL that ends in '/' stands for the .tar "
        "objects under it, sorted",
    )
    index.add_argument("-o", "--output", required=True, metavar="INDEX.json")
    index.add_argument(
        "--index-every",
        type=int,
        default=None,
        metavar="N",
        help="keep the offset of every N-th sample (default 16 for local shards, 1 for "
        "remote ones, whose reads then fetch exactly their samples' bytes)",
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
    if args.command == "index":
        return _index_command(args)
    parser.print_help(sys.stderr)
    return 2


def _index_command(args: argparse.Namespace) -> int:
    import os

    from . import _index, _storage, readers

    try:
        paths: list[str] = []
        for shard in args.shards:
            if _storage.is_url(shard) and shard.endswith("/"):
                listed = [u for u in _storage.list_prefix(shard) if u.endswith(".tar")]
                if not listed:
                    raise ValueError(f"no .tar objects under {shard}")
                paths += listed
            else:
                paths.append(shard)
        if not _storage.is_url(args.output):
            # Before the scan: an output that would overwrite a shard, or has no folder,
            # fails at once rather than after every shard's headers were read.
            output = os.path.abspath(_storage.local_path(args.output))
            _index.check_output(output, paths)
        shards = readers.write_tar_index(paths, args.output, index_every=args.index_every)
    except (OSError, ValueError) as err:
        # A user's mistake (a missing shard, a damaged one, a wrong output): one line.
        print(f"fastshard: error: {_one_line(err)}", file=sys.stderr)
        return 1
    print(f"{args.output}: {len(shards.sizes)} shards, {int(shards.sizes.sum())} samples")
    return 0


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror and err.filename is not None:
        return f"{err.filename}: {err.strerror}"
    return " ".join(str(err).split())


if __name__ == "__main__":
    sys.exit(main())
