"""Length-grouped batches (issue 18): padding efficiency and epoch start, side by side.

    python bench/length_grouped.py quality [--n 1e6] [--windows 4 16 64 256]
    python bench/length_grouped.py default-window [--sizes 2e4 1e5 1e6] [--min-windows 1 4 8 16 32]
    python bench/length_grouped.py classes [--sizes 1e6 1e7]
    python bench/length_grouped.py epoch-cost [--sizes 1e6 1e7]
    python bench/length_grouped.py start [--n 1e7] [--repeat 3]
    python bench/length_grouped.py start-large [--n 1e8] [--world-size 8]
    python bench/length_grouped.py fill [--sizes 1e5 1e6 1e7 1e8 1e9] [--base-python PY]

quality: lognormal lengths (mu=5.5, sigma=1, rounded, clipped to [1, 16384]), one epoch over
all ranks (W=1: the global batch sequence), for a token budget and a fixed batch size:
- padding efficiency (real tokens / padded tokens) for sort windows of k expected batches,
  for one global sort cut by the same rule (sort_window = n), and for random batches of the
  same mean size;
- randomness: of the pairs of items that share a batch in epoch 0, the fraction that share
  one again in epoch 1 (a global sort repeats nearly all of them);
- batch-to-batch correlation of the batches' longest length, along the global sequence and
  along rank 0's sequence of 8 ranks.

default-window: the default sort_window's floor on the number of windows, by measurement:
for each n and each floor M (sort_window = min(1024 expected batches, 2**21, ceil(n / M))),
padding efficiency, batches per epoch, and the pair repeat rate e0 -> e1, both rules.

classes: with max_tokens=16384 and the default window, for several class merging thresholds
(LengthLayout's min_class_items): classes, batches per epoch, and how many windows' ranges of
the order a window's gather spans (simulated over a NumPy random order, 25 windows).

epoch-cost: one rank's epoch with max_tokens=16384: the epoch's scan (LengthEpoch) and building
every window once, in order (best of 2).

start: construction to first batch in a fresh child process, time and peak memory (VmHWM
minus VmRSS before, from /proc/self/status inside the child), beside transformers'
LengthGroupedSampler(batch_size=32, lengths=list) at the same n; the repeats interleave.

start-large: uint16 lengths, rank 0 of W, token budget (every window sorted to count).

fill: max_tokens=16384, the default sort_window, lognormal lengths in a uint32 memmap under
--dir (10^9: 4 GB): the epoch's batches (len, in a fresh child: this build, then
--base-python's) beside a greedy cut on the actual lengths of windows of the same size of a
random order (every window up to 10^7 items; above, --sample windows of random items, scaled to
the number of windows).

Run it outside the source tree's root so that `import fastshard` is the installed build.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np


def lognormal(n: int, seed: int = 0, dtype: str = "int32") -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(5.5, 1.0, n)), 1, 16384).astype(dtype)


def epoch_batches(sampler) -> list[list[int]]:
    return list(iter(sampler))


def efficiency(lengths: np.ndarray, batches: list[list[int]]) -> float:
    real = padded = 0
    for b in batches:
        lb = lengths[b]
        real += int(lb.sum())
        padded += len(b) * int(lb.max())
    return real / padded


def repeat_rate(n: int, e0: list[list[int]], e1: list[list[int]]) -> float:
    """Of the pairs sharing a batch in e0, the fraction sharing one in e1."""
    where = np.empty(n, np.int64)
    for i, b in enumerate(e1):
        where[b] = i
    ids0 = np.concatenate([np.full(len(b), i) for i, b in enumerate(e0)])
    items0 = np.concatenate([np.asarray(b) for b in e0])
    key = ids0 * (len(e1) + 1) + where[items0]
    _, counts = np.unique(key, return_counts=True)
    sizes = np.array([len(b) for b in e0])
    pairs = (sizes * (sizes - 1) // 2).sum()
    return float((counts * (counts - 1) // 2).sum() / max(pairs, 1))


def lag1(x: np.ndarray) -> float:
    return float(np.corrcoef(x[:-1], x[1:])[0, 1])


def quality(args: argparse.Namespace) -> None:
    import fastshard

    n = int(float(args.n))
    lengths = lognormal(n)
    mean = lengths.mean()
    rules = [("max_tokens=16384", dict(max_tokens=16384)), ("batch_size=32", dict(batch_size=32))]
    print(f"n={n}, lognormal(5.5, 1) lengths, mean {mean:.0f}, median {np.median(lengths):.0f}")
    print(
        "| rule | sort_window | items | efficiency | pair repeat e0->e1 | lag-1 corr (global) "
        "| lag-1 corr (rank 0 of 8) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, rule in rules:
        per_batch = rule.get("batch_size") or int(rule["max_tokens"] // mean)
        for k in [*args.windows, "global"]:
            window = n if k == "global" else int(k) * per_batch
            e0 = epoch_batches(_sampler(fastshard, lengths, rule, window, 0, 1, 0))
            e1 = epoch_batches(_sampler(fastshard, lengths, rule, window, 1, 1, 0))
            rank0 = epoch_batches(_sampler(fastshard, lengths, rule, window, 0, 8, 0))
            maxlen = np.array([lengths[b].max() for b in e0], float)
            r0 = np.array([lengths[b].max() for b in rank0], float)
            label = "n (global sort)" if k == "global" else f"{k} batches"
            print(
                f"| {name} | {label} | {window} | {efficiency(lengths, e0):.4f} | "
                f"{repeat_rate(n, e0, e1):.4f} | {lag1(maxlen):+.3f} | {lag1(r0):+.3f} |"
            )
        # random batches of our default's mean size
        default = epoch_batches(_sampler(fastshard, lengths, rule, None, 0, 1, 0))
        size = n / len(default)
        perm = np.random.default_rng(1).permutation(n)
        cuts = np.rint(np.arange(1, len(default)) * size).astype(np.int64)
        rand = np.split(perm, cuts)
        eff = efficiency(lengths, rand)
        print(f"| {name} | random batches (mean size {size:.1f}) | - | {eff:.4f} | - | - | - |")


def identical(e0: list[list[int]], e1: list[list[int]]) -> int:
    """Batches of two or more items of e0 that are also batches of e1 (as sets)."""
    return len({tuple(sorted(b)) for b in e0 if len(b) > 1} & {tuple(sorted(b)) for b in e1})


def unstratified(lengths: np.ndarray, rule: dict, window: int, seed: int) -> list[list[int]]:
    """The rule before issue 24, in NumPy, for reference: contiguous windows of a random
    order, each sorted by length and cut greedily on the actual lengths."""
    perm = np.random.default_rng(seed).permutation(len(lengths))
    out: list[list[int]] = []
    for w0 in range(0, len(lengths), window):
        items = perm[w0 : w0 + window]
        items = items[np.argsort(lengths[items], kind="stable")]
        if "batch_size" in rule:
            out.extend(
                items[i : i + rule["batch_size"]].tolist()
                for i in range(0, len(items), rule["batch_size"])
            )
            continue
        start, count = 0, 0
        for i, v in enumerate(lengths[items].tolist()):
            if count and (count + 1) * v > rule["max_tokens"]:
                out.append(items[start:i].tolist())
                start, count = i, 0
            count += 1
        out.append(items[start:].tolist())
    return out


def default_window(args: argparse.Namespace) -> None:
    import fastshard

    rules = [("max_tokens=16384", dict(max_tokens=16384)), ("batch_size=32", dict(batch_size=32))]
    print(
        "| n | rule | min windows M | sort_window | windows | batches | efficiency "
        "| pair repeat e0->e1 | identical batches | before issue 24 (NumPy): batches, efficiency, "
        "pair repeat |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        n = int(float(size))
        lengths = lognormal(n)
        mean = lengths.mean()
        for name, rule in rules:
            per_batch = rule.get("batch_size") or int(rule["max_tokens"] // mean)
            for m in args.min_windows:
                window = min(1024 * per_batch, 2**21, -(-n // int(m)))
                s0 = _sampler(fastshard, lengths, rule, window, 0, 1, 0)
                e0 = epoch_batches(s0)
                e1 = epoch_batches(_sampler(fastshard, lengths, rule, window, 1, 1, 0))
                windows = -(-n // window)
                old = ""
                if args.reference and "max_tokens" in rule:
                    o0, o1 = (unstratified(lengths, rule, window, e) for e in (0, 1))
                    old = f"{len(o0)}, {efficiency(lengths, o0):.4f}, {repeat_rate(n, o0, o1):.4f}"
                print(
                    f"| {n:.0e} | {name} | {m} | {window} | {windows} | {len(e0)} | "
                    f"{efficiency(lengths, e0):.4f} | {repeat_rate(n, e0, e1):.4f} | "
                    f"{identical(e0, e1)} | {old} |"
                )


def classes(args: argparse.Namespace) -> None:
    from fastshard import _core

    print("| n | windows | min class items | classes | batches | ranges read (mean / max) |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    for size in args.sizes:
        n = int(float(size))
        lengths = lognormal(n)
        window = 1024 * int(16384 // lengths.mean())
        k = -(-n // window)
        perm = rng.permutation(n)
        for t in (1, k * k // 32, k * k // 8, k * k // 2):
            t = max(t, 1)
            layout = _core.LengthLayout(lengths, 0, 16384, 0, window, t)
            cls = layout.classes()
            uppers = np.array([u for _, u in cls])
            counts = np.array([c for c, _ in cls])
            by_class = np.argsort(
                np.searchsorted(uppers, np.maximum(lengths, 1))[perm], kind="stable"
            )
            starts = np.concatenate([[0], np.cumsum(counts)])[:-1]
            spans = []
            for w in range(0, k, max(1, k // 25)):
                lo = counts * min(w * window, n) // n
                hi = counts * min((w + 1) * window, n) // n
                m = hi > lo
                first = by_class[(starts + lo)[m]].min() // window
                last = by_class[(starts + hi - 1)[m]].max() // window
                spans.append(last - first + 1)
            print(
                f"| {n:.0e} | {k} | {t} | {len(counts)} | {layout.num_batches} | "
                f"{np.mean(spans):.1f} / {max(spans)} |"
            )


def epoch_cost(args: argparse.Namespace) -> None:
    import time

    import fastshard
    from fastshard import _core

    print("| n | windows | epoch scan s | build every window s |")
    print("|---|---|---|---|")
    for size in args.sizes:
        n = int(float(size))
        lengths = lognormal(n)
        s = fastshard.LengthGroupedBatchSampler(lengths, max_tokens=16384, num_replicas=1, rank=0)
        scan = build = float("inf")
        for rep in range(2):
            t = time.perf_counter()
            epoch = _core.LengthEpoch(s._static_layout(), 0, 5 + rep)
            scan = min(scan, time.perf_counter() - t)
            shard = _core.length_shard(epoch, 1, 0, False, 0)
            t = time.perf_counter()
            for w in range(epoch.num_windows):
                shard.global_batch(epoch.window_offset(w))
            build = min(build, time.perf_counter() - t)
        print(f"| {n:.0e} | {epoch.num_windows} | {scan:.3f} | {build:.3f} |")


def _sampler(fastshard, lengths, rule, window, epoch, W, r):
    s = fastshard.LengthGroupedBatchSampler(
        lengths, **rule, sort_window=window, num_replicas=W, rank=r
    )
    s.set_epoch(epoch)
    return s


CHILD = r"""
import json, sys, time
import numpy as np
kind, n, W = sys.argv[1], int(float(sys.argv[2])), int(sys.argv[3])
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key): return int(line.split()[1])
rng = np.random.default_rng(0)
lengths = np.clip(np.rint(rng.lognormal(5.5, 1.0, n)), 1, 16384)
if kind == 'transformers':
    from transformers.trainer_pt_utils import LengthGroupedSampler
    import torch
    lengths = lengths.astype(np.int64).tolist()
elif kind == 'fastshard_large':
    import fastshard
    lengths = lengths.astype(np.uint16)
else:
    import fastshard
    lengths = lengths.astype(np.int32)
open('/proc/self/clear_refs', 'w').write('5')
base = status('VmRSS')
t0 = time.perf_counter(); c0 = time.process_time()
if kind == 'transformers':
    s = LengthGroupedSampler(batch_size=32, lengths=lengths, generator=torch.Generator().manual_seed(0))
    first = next(iter(s))
elif kind == 'fastshard_batch':
    s = fastshard.LengthGroupedBatchSampler(lengths, batch_size=32, num_replicas=W, rank=0)
    first = next(iter(s))
else:
    s = fastshard.LengthGroupedBatchSampler(lengths, max_tokens=16384, num_replicas=W, rank=0)
    first = next(iter(s))
wall = time.perf_counter() - t0; cpu = time.process_time() - c0
print(json.dumps({"wall": wall, "cpu": cpu, "peak_mib": (status('VmHWM') - base) / 1024}))
"""


def child(kind: str, n: float, world: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(n), str(world)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def start(args: argparse.Namespace, kinds: list[str], world: int) -> None:
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for _ in range(args.repeat):
        for k in kinds:
            runs[k].append(child(k, args.n, world))
    print(f"n={int(float(args.n)):,}, W={world}, rank 0, {args.repeat} interleaved repeats")
    print("| what | wall s (min / median) | CPU s (min) | peak MiB above baseline (max) |")
    print("|---|---|---|---|")
    for k, rs in runs.items():
        walls = [r["wall"] for r in rs]
        print(
            f"| {k} | {min(walls):.3f} / {statistics.median(walls):.3f} | "
            f"{min(r['cpu'] for r in rs):.3f} | {max(r['peak_mib'] for r in rs):.0f} |"
        )


def sft_file(n: int, path: Path) -> np.memmap:
    """lognormal(5.5, 1) lengths, rounded, clipped to [1, 16384], in a uint32 memmap, made in
    chunks of 2^24 from one generator (bench/packing.py's sft_file: the same file)."""
    if path.exists() and path.stat().st_size == 4 * n:
        return np.memmap(path, dtype=np.uint32, mode="r")
    mm = np.memmap(path, dtype=np.uint32, mode="w+", shape=(n,))
    rng = np.random.default_rng(0)
    for a in range(0, n, 1 << 24):
        b = min(n, a + (1 << 24))
        mm[a:b] = np.clip(np.rint(rng.lognormal(5.5, 1.0, b - a)), 1, 16384)
    mm.flush()
    del mm
    return np.memmap(path, dtype=np.uint32, mode="r")


def greedy_cut(lens: np.ndarray, max_tokens: int) -> int:
    """Batches of the greedy cut of one window on its actual lengths: sorted, a batch takes the
    next item while (count + 1) * its length <= max_tokens."""
    lens = np.sort(np.maximum(lens.astype(np.int64), 1))
    cap = np.maximum(max_tokens // lens, 1)
    i, m, batches = 0, len(lens), 0
    while i < m:
        lo, hi = 1, m - i  # the most items k with k <= cap[i + k - 1] (cap nonincreasing)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if mid <= cap[i + mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        i += lo
        batches += 1
    return batches


def actual_cut(lengths: np.ndarray, window: int, max_tokens: int, sample: int) -> float:
    n = len(lengths)
    rng = np.random.default_rng(1)
    if n <= 10**7:
        order = rng.permutation(n)
        return float(
            sum(greedy_cut(lengths[order[a : a + window]], max_tokens) for a in range(0, n, window))
        )
    full, rest = divmod(n, window)
    per = [
        greedy_cut(lengths[np.sort(rng.integers(0, n, window))], max_tokens) for _ in range(sample)
    ]
    last = greedy_cut(lengths[np.sort(rng.integers(0, n, rest))], max_tokens) if rest else 0
    return full * float(np.mean(per)) + last


FILL_CHILD = r"""
import json, sys, time
import numpy as np
import fastshard
lengths = np.memmap(sys.argv[1], dtype=np.uint32, mode="r")
t0 = time.perf_counter()
s = fastshard.LengthGroupedBatchSampler(lengths, max_tokens=16384, num_replicas=1, rank=0)
print(json.dumps({"batches": len(s), "sort_window": s.sort_window, "len_s": time.perf_counter() - t0}))
"""


def fill(args: argparse.Namespace) -> None:
    for size in args.sizes:
        n = int(float(size))
        path = Path(args.dir) / f"sft_{n}.u32"
        lengths = sft_file(n, path)
        sides = [(sys.executable, "this")] + (
            [(args.base_python, "base")] if args.base_python else []
        )
        for py, side in sides:
            out = subprocess.run(
                [py, "-c", FILL_CHILD, str(path)], capture_output=True, text=True, check=True
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            load = open("/proc/loadavg").read().split()[:3]
            ref = actual_cut(lengths, r["sort_window"], 16384, args.sample)
            r.update(n=n, side=side, actual_cut=ref, excess=r["batches"] / ref - 1, loadavg=load)
            r.update(items_per_batch=n / r["batches"], actual_items_per_batch=n / ref)
            print(json.dumps(r), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--n", default="1e6")
    q.add_argument("--windows", nargs="+", default=["4", "16", "64", "256", "1024"])
    d = sub.add_parser("default-window")
    d.add_argument("--sizes", nargs="+", default=["2e4", "1e5", "1e6"])
    d.add_argument("--min-windows", nargs="+", default=["1", "4", "8", "16", "32"])
    d.add_argument("--reference", action="store_true", help="also the rule before issue 24")
    c = sub.add_parser("classes")
    c.add_argument("--sizes", nargs="+", default=["1e6", "1e7"])
    ec = sub.add_parser("epoch-cost")
    ec.add_argument("--sizes", nargs="+", default=["1e6", "1e7"])
    s = sub.add_parser("start")
    s.add_argument("--n", default="1e7")
    s.add_argument("--repeat", type=int, default=3)
    large = sub.add_parser("start-large")
    large.add_argument("--n", default="1e8")
    large.add_argument("--repeat", type=int, default=2)
    large.add_argument("--world-size", type=int, default=8)
    f = sub.add_parser("fill")
    f.add_argument("--sizes", nargs="+", default=["1e5", "1e6", "1e7", "1e8", "1e9"])
    f.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    f.add_argument("--base-python", default=None)
    f.add_argument("--sample", type=int, default=300, help="windows sampled above 10^7 items")
    args = p.parse_args()
    if args.cmd == "fill":
        fill(args)
        return
    if args.cmd == "quality":
        quality(args)
    elif args.cmd == "default-window":
        default_window(args)
    elif args.cmd == "classes":
        classes(args)
    elif args.cmd == "epoch-cost":
        epoch_cost(args)
    elif args.cmd == "start":
        start(args, ["transformers", "fastshard_batch", "fastshard_tokens"], 1)
    else:
        start(args, ["fastshard_large"], args.world_size)


if __name__ == "__main__":
    main()
