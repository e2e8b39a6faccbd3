"""Cold reads of random records from a memory-mapped file: default order vs order="block".

    python bench/block_read.py [--path /tmp/fastshard_records.bin] [--n 3906250] [--samples 100000]

Writes (once) a file of n records of 512 bytes (3,906,250 records = 2.0 GB), record i
holding i in its first 8 bytes. Then, for each configuration and repetition, in one run:
evicts the file's pages from the page cache (fsync, then posix_fadvise DONTNEED, checked with
mincore), maps it with np.memmap, and reads the first `samples` indices of rank 0 of 8 in
batches of 256 (`mm[batch]`, a gather that copies each record, as a map-style Dataset
would), checking every record's tag. Reports records per second, cold, under the kernel's
default read-around for mapped files and under MADV_RANDOM (no read-around), and how much of
the file the run brought into the page cache (what it read from disk). Configurations
alternate within each repetition so that drifts of a shared machine hit all alike; the
median is reported.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import fastshard

RECORD = 512
BATCH = 256
CONFIGS = [
    ("feistel (default)", {}),
    ("block B=8 K=1", {"order": "block", "block_size": 8, "window": 1}),
    ("block B=64 K=16", {"order": "block", "block_size": 64, "window": 16}),
    ("block B=512 K=4", {"order": "block", "block_size": 512, "window": 4}),
]


def make_file(path: Path, n: int) -> None:
    if path.exists() and path.stat().st_size == n * RECORD:
        with open(path, "rb") as f:  # reuse it if its last record carries the right tag
            f.seek((n - 1) * RECORD)
            if int.from_bytes(f.read(8), "little") == n - 1:
                return
    t0 = time.perf_counter()
    chunk = 1 << 18
    with open(path, "wb") as f:
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            rows = np.zeros((m, RECORD // 8), dtype=np.int64)
            rows[:, 0] = np.arange(start, start + m)
            f.write(rows.tobytes())
        f.flush()
        os.fsync(f.fileno())
    print(
        f"wrote {path} ({n * RECORD / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def resident_fraction(path: Path) -> float:
    """Fraction of the file's pages in the page cache (mincore over a fresh mapping)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            view = np.frombuffer(mm, dtype=np.uint8)  # the mapping's address, no copy
            if _libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            del view
            return float(np.frombuffer(vec, dtype=np.uint8).astype(bool).sum()) / pages
        finally:
            mm.close()


def evict(path: Path) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_fraction(path)


def read(path: Path, n: int, idx: np.ndarray, advice: int | None) -> float:
    """Records per second reading `idx` in batches through a fresh np.memmap."""
    mm = np.memmap(path, dtype=np.int64, mode="r", shape=(n, RECORD // 8))
    try:
        if advice is not None:
            mm._mmap.madvise(advice)  # type: ignore[union-attr]
        t0 = time.perf_counter()
        for start in range(0, len(idx), BATCH):
            batch = idx[start : start + BATCH]
            rows = mm[batch]
            if not np.array_equal(rows[:, 0], batch):
                raise AssertionError("a record carries the wrong tag")
        return len(idx) / (time.perf_counter() - t0)
    finally:
        del mm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--path", type=Path, default=Path("/tmp/fastshard_records.bin"))
    p.add_argument("--n", type=int, default=3_906_250)
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the file afterwards")
    args = p.parse_args()
    if args.n * RECORD > 2 * 10**9:
        p.error("keep the file at most 2 GB")
    make_file(args.path, args.n)
    advices = [("read-around (default)", None), ("MADV_RANDOM", mmap.MADV_RANDOM)]
    orders = {}
    for label, kw in CONFIGS:
        s = fastshard.DistributedSampler(args.n, args.replicas, 0, seed=0, **kw)
        orders[label] = s.indices(0, args.samples)
    results: dict[tuple[str, str], list[float]] = {}
    cached: dict[tuple[str, str], list[float]] = {}
    worst_resident = 0.0
    for rep in range(args.reps):
        for advice_label, advice in advices:
            for label, idx in orders.items():
                worst_resident = max(worst_resident, evict(args.path))
                rate = read(args.path, args.n, idx, advice)
                mb = resident_fraction(args.path) * args.n * RECORD / 1e6
                results.setdefault((label, advice_label), []).append(rate)
                cached.setdefault((label, advice_label), []).append(mb)
                print(
                    f"rep {rep} {advice_label:22s} {label:18s} {rate:12,.0f} records/s {mb:8,.0f} MB read",
                    file=sys.stderr,
                )
    print(
        f"{args.samples:,} cold reads of 512-byte records from a {args.n * RECORD / 1e9:.2f} GB "
        f"np.memmap, rank 0 of {args.replicas}, batches of {BATCH}; median of {args.reps}; "
        f"at most {worst_resident:.2%} of the file resident before a run\n"
    )
    print("| order | " + " | ".join(f"records/s, {a} | MB read" for a, _ in advices) + " |")
    print("|---|" + "---:|---:|" * len(advices))
    base = {a: statistics.median(results[(CONFIGS[0][0], a)]) for a, _ in advices}
    for label, _ in CONFIGS:
        cells = []
        for a, _ in advices:
            med = statistics.median(results[(label, a)])
            cells.append(
                f"{med:,.0f} ({med / base[a]:.1f}x) | {statistics.median(cached[(label, a)]):,.0f}"
            )
        print(f"| {label} | " + " | ".join(cells) + " |")
    if not args.keep:
        args.path.unlink()


if __name__ == "__main__":
    main()
