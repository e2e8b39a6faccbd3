"""Locality of the block order: distinct pages one rank touches, as a deterministic count.

    python bench/block_locality.py [--n 3906250] [--replicas 8] [--span 10000]

For a file of fixed-size records read in one rank's order, counts the distinct 4 KiB pages
(and 1 MiB extents) behind each run of `span` consecutive samples, averaged over the first
`spans` runs of the epoch. No I/O: it only maps indices to byte offsets, so the figures are
the same on every machine. Importable, needs only fastshard and NumPy:

    from block_locality import distinct_pages
    distinct_pages(3_906_250, order="block", block_size=64, window=16)
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import fastshard

# (label, sampler keyword arguments) of the default table.
CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("feistel (default)", {}),
    ("block B=1 K=16", {"order": "block", "block_size": 1, "window": 16}),
    ("block B=8 K=1", {"order": "block", "block_size": 8, "window": 1}),
    ("block B=8 K=64", {"order": "block", "block_size": 8, "window": 64}),
    ("block B=64 K=16", {"order": "block", "block_size": 64, "window": 16}),
    ("block B=256 K=4", {"order": "block", "block_size": 256, "window": 4}),
    ("block B=4096 K=1", {"order": "block", "block_size": 4096, "window": 1}),
]


def distinct_pages(
    n: int,
    *,
    num_replicas: int = 8,
    rank: int = 0,
    record_size: int = 512,
    page_size: int = 4096,
    span: int = 10_000,
    spans: int = 20,
    seed: int = 0,
    epoch: int = 0,
    **sampler_kwargs: Any,
) -> float:
    """Mean number of distinct pages of `page_size` bytes behind `span` consecutive samples
    of one rank (records of `record_size` bytes, record i at byte i * record_size), over the
    rank's first `spans` runs of the epoch. `sampler_kwargs` go to DistributedSampler
    (order, block_size, window, ...)."""
    s = fastshard.DistributedSampler(n, num_replicas, rank, seed=seed, **sampler_kwargs)
    s.set_epoch(epoch)
    runs = min(spans, len(s) // span)
    if runs == 0:
        raise ValueError(f"the rank has {len(s)} samples, fewer than one span of {span}")
    idx = s.indices(0, runs * span)
    pages = idx * record_size // page_size
    return float(np.mean([len(np.unique(pages[i * span : (i + 1) * span])) for i in range(runs)]))


def table(
    n: int = 3_906_250, num_replicas: int = 8, span: int = 10_000, record_size: int = 512
) -> list[dict[str, Any]]:
    """One row per configuration: pages per span, 1 MiB extents per span, and pages relative
    to the default order."""
    rows = []
    for label, kw in CONFIGS:
        common = dict(num_replicas=num_replicas, span=span, record_size=record_size, **kw)
        pages = distinct_pages(n, **common)
        extents = distinct_pages(n, page_size=1 << 20, **common)
        rows.append({"order": label, "pages": pages, "extents_1MiB": extents})
    base = rows[0]["pages"]
    for row in rows:
        row["vs_default"] = row["pages"] / base
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--n", type=int, default=3_906_250, help="records (default: 2 GB of 512-byte records)"
    )
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--span", type=int, default=10_000)
    p.add_argument("--record-size", type=int, default=512)
    args = p.parse_args()
    print(
        f"n = {args.n:,} records of {args.record_size} B, rank 0 of {args.replicas}, "
        f"mean over the first 20 runs of {args.span:,} consecutive samples\n"
    )
    print("| order | distinct 4 KiB pages | vs default | distinct 1 MiB extents |")
    print("|---|---:|---:|---:|")
    for row in table(args.n, args.replicas, args.span, args.record_size):
        print(
            f"| {row['order']} | {row['pages']:,.1f} | {row['vs_default']:.3f} | {row['extents_1MiB']:,.1f} |"
        )


if __name__ == "__main__":
    main()
