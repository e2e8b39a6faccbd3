"""Packed rows (issue 25): time and memory to the first row beside a NumPy Megatron-LM index
build, best_fit padding efficiency beside sequential and grain packing, the window choices,
and 10^9 documents.

    python bench/packing.py window [--n 1e7]
    python bench/packing.py megatron [--n 1e7 1e8]
    python bench/packing.py efficiency [--n 1e7] [--grain-n 1e5]
    python bench/packing.py fill [--n 1e5 1e6 1e7 1e8 1e9] [--base-python PY]
    python bench/packing.py huge [--n 1e9] [--cold]

Every measurement of time and memory runs in a fresh child process. Memory is the peak of
RssAnon (anonymous resident memory: what the process allocated, not the page cache of the
lengths memmap, which both sides read alike) above its value before the measured call,
sampled every 2 ms by a thread; the child also reports its VmHWM (peak resident set over its
whole life, imports and the mapped lengths' pages included) and its VmRSS before the call.
Lengths live in a uint32 memmap file under --dir.

--base-python PY runs the fastshard side also with another interpreter (another build of
fastshard, e.g. the commit before a change), interleaved with this one, --repeat times: a
before/after in one run on a shared machine. --cold drops the lengths file from the page cache
(posix_fadvise DONTNEED, this file only) before each child.

Run it outside the source tree's root so that `import fastshard` is the installed build.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

SEQ = 4096


def proc_status(key: str) -> int:
    """A size field of /proc/self/status in bytes (0 where there is none)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_anon() -> int:
    return proc_status("RssAnon")


class Peak:
    """Peak RssAnon growth while the block runs."""

    def __enter__(self) -> Peak:
        self.base = rss_anon()
        self.peak = self.base
        self._stop = False
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def _poll(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, rss_anon())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._t.join()
        self.peak = max(self.peak, rss_anon())
        self.growth = self.peak - self.base


def _lognormal_file(n: int, path: Path, mu: float, sigma: float, hi: int) -> np.memmap:
    """n lognormal(mu, sigma) lengths clipped to [1, hi] in a uint32 memmap file, made once in
    chunks of 2^24 (one generator, so that every n is a prefix-free draw of the same
    distribution; 10^9 lengths are 4 GB)."""
    if path.exists() and path.stat().st_size == 4 * n:
        return np.memmap(path, dtype=np.uint32, mode="r")
    mm = np.memmap(path, dtype=np.uint32, mode="w+", shape=(n,))
    rng = np.random.default_rng(0)
    step = 1 << 24
    for a in range(0, n, step):
        b = min(n, a + step)
        mm[a:b] = np.clip(np.rint(rng.lognormal(mu, sigma, b - a)), 1, hi)
    mm.flush()
    del mm
    return np.memmap(path, dtype=np.uint32, mode="r")


def pretrain_lengths(n: int, path: Path) -> np.memmap:
    """Pretraining-like document lengths: lognormal, median ~ 600 tokens, in [1, 10^6]."""
    return _lognormal_file(n, path, 6.4, 1.1, 10**6)


def sft_file(n: int, path: Path) -> np.memmap:
    """sft_lengths(n) (lognormal(5.5, 1) in [1, 16384]) in a uint32 memmap file."""
    return _lognormal_file(n, path, 5.5, 1.0, 16384)


def sft_lengths(n: int, seed: int = 0) -> np.ndarray:
    """SFT-like lengths: lognormal (mu=5.5, sigma=1: median 245 tokens), clipped to [1, 16384]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(5.5, 1.0, n)), 1, 16384).astype(np.uint32)


# -- megatron-core's own GPTDataset index build (the installed package, its compiled helpers) ---
def megatron_core_first_row(lengths: np.ndarray, seq_len: int, seed: int) -> tuple[int, int, int]:
    """megatron-core's GPTDataset over a low-level dataset that holds only the lengths (its
    `sequence_lengths`, int32 as its indexed dataset's), one epoch, no cache: the document,
    sample and shuffle indices built by GPTDataset itself (helpers_cpp.build_sample_idx), then
    the first row's (document position, offset) and the number of samples."""
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import Split

    class Tokenizer:
        eod = 0
        vocab_size = 2**16

        def __init__(self) -> None:
            self.unique_identifiers = {"class": "Tokenizer"}

    class Lengths:  # what GPTDataset reads of an IndexedDataset to build its indices
        path_prefix = None

        def __init__(self, sequence_lengths: np.ndarray) -> None:
            self.sequence_lengths = sequence_lengths

        def __len__(self) -> int:
            return len(self.sequence_lengths)

    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_len,
        blend=None,
        blend_per_split=None,
        split="1,0,0",
        tokenizer=Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        path_to_cache=None,
        mmap_bin_files=False,
    )
    low = Lengths(lengths.view(np.int32))  # the lengths are < 2^31: the same bits
    n = len(lengths)
    ds = GPTDataset(low, None, np.arange(n, dtype=np.int32), None, Split.train, config)
    first = int(ds.shuffle_index[0])
    return int(ds.sample_index[first, 0]), int(ds.sample_index[first, 1]), len(ds)


# -- Megatron-LM's index build, in NumPy (the public algorithm, written here) -----------------
def megatron_first_row(lengths: np.ndarray, seq_len: int, seed: int) -> tuple[int, int, int]:
    """One epoch of GPTDataset's three indices, then the first row's (document position,
    offset) and the number of samples: the document order, the sample index (where each
    row of seq_len + 1 tokens, overlapping by one, starts in the concatenation), the row
    shuffle."""
    rng = np.random.RandomState(seed)
    document_index = np.arange(len(lengths), dtype=np.int32)
    rng.shuffle(document_index)
    sizes = lengths[document_index]  # lengths in the epoch's order
    ends = np.cumsum(sizes, dtype=np.int64)
    num_samples = (int(ends[-1]) - 1) // seq_len
    starts = np.arange(num_samples + 1, dtype=np.int64) * seq_len
    doc = np.searchsorted(ends, starts, side="right").astype(np.int32)
    offset = (starts - np.where(doc > 0, ends[np.maximum(doc - 1, 0)], 0)).astype(np.int32)
    sample_index = np.stack([doc, offset], axis=1)
    del sizes, ends, starts, doc, offset
    shuffle_index = np.arange(num_samples, dtype=np.int64)
    rng.shuffle(shuffle_index)
    first = int(shuffle_index[0])
    return int(sample_index[first, 0]), int(sample_index[first, 1]), num_samples


def child(args: argparse.Namespace) -> None:
    """Inside a fresh process: one timed, memory-measured build to the first row."""
    lengths = np.memmap(args.path, dtype=np.uint32, mode="r")
    if args.impl.startswith("fastshard"):
        import fastshard

        mode = "best_fit" if args.impl == "fastshard_best_fit" else "concat"
    if args.impl == "megatron_core":  # imported before the clock starts, as fastshard is
        import logging
        import warnings

        logging.disable(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core.datasets.gpt_dataset  # noqa: F401
    rss_before = proc_status("VmRSS")
    # The clock runs inside the sampled block: starting the sampling thread and joining it
    # (which waits out its 2 ms sleep) would add up to ~3 ms to every side alike, a third of
    # fastshard's whole time at 10^6 documents.
    with Peak() as peak:
        cpu0 = os.times()
        t0 = time.perf_counter()
        if args.impl == "megatron":
            info = megatron_first_row(lengths, args.seq_len, 0)
        elif args.impl == "megatron_core":
            info = megatron_core_first_row(lengths, args.seq_len, 0)
        else:
            s = fastshard.PackedSampler(
                lengths,
                args.seq_len,
                mode=mode,
                overlap=mode == "concat",
                num_replicas=args.world,
                rank=0,
                long_docs="split" if mode == "best_fit" else None,
                **({"window": args.window} if args.window else {}),
            )
            row = s[0]
            info = (len(s), int(row.shape[0]))
            if mode == "best_fit":
                info += (s.efficiency, s.num_rows)
        dt = time.perf_counter() - t0
        cpu1 = os.times()
    mib = 2**20
    print(
        json.dumps(
            {
                "impl": args.impl,
                "seconds": dt,
                "cpu_user_s": cpu1.user - cpu0.user,
                "cpu_sys_s": cpu1.system - cpu0.system,
                "peak_mib": peak.growth / mib,
                "vmhwm_mib": proc_status("VmHWM") / mib,
                "vmrss_before_mib": rss_before / mib,
                "rss_file_mib": proc_status("RssFile") / mib,
                "info": info,
            }
        )
    )


def drop_cache(path: Path) -> None:
    """This file's clean pages out of the page cache (no other file is touched)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_child(
    impl: str,
    path: Path,
    seq_len: int,
    world: int = 1,
    window: int = 0,
    python: str | None = None,
    cold: bool = False,
) -> dict:
    if cold:
        drop_cache(path)
    cmd = [python or sys.executable, __file__, "child", "--impl", impl, "--path", str(path)]
    cmd += ["--seq-len", str(seq_len), "--world", str(world), "--window", str(window)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if python:
        r["python"] = python
    return r


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def fastshard_sides(args: argparse.Namespace) -> list[str | None]:
    """The interpreters the fastshard side runs with: this one, then --base-python."""
    return [None] + ([args.base_python] if args.base_python else [])


def megatron(args: argparse.Namespace) -> None:
    """Rank 0 of --world (8) to its first row, beside megatron-core's own GPTDataset build (and,
    with --numpy, the NumPy re-implementation), the load beside each run."""
    for n in map(int, args.n):
        path = Path(args.dir) / f"pretrain_{n}.u32"
        lengths = pretrain_lengths(n, path)
        tokens = int(lengths.sum(dtype=np.uint64))
        del lengths
        for _ in range(args.repeat):
            runs = [("fastshard_concat", py) for py in fastshard_sides(args)]
            runs += [("megatron_core", None)] + ([("megatron", None)] if args.numpy else [])
            for impl, py in runs:
                world = args.world if impl.startswith("fastshard") else 1
                r = run_child(impl, path, SEQ, world=world, python=py)
                r.update(n=n, tokens=tokens, seq_len=SEQ, world=world, loadavg=loadavg())
                print(json.dumps(r), flush=True)


def window(args: argparse.Namespace) -> None:
    import fastshard

    n = int(args.n[0])
    lengths = pretrain_lengths(n, Path(args.dir) / f"pretrain_{n}.u32")
    for w in (64, 256, 1024, 4096):
        s = fastshard.PackedSampler(lengths, SEQ, overlap=True, window=w, num_replicas=8, rank=0)
        s[0]
        t0 = time.perf_counter()
        k = 2000
        for i in range(k):
            s[i]
        per_row = (time.perf_counter() - t0) / k
        print(
            json.dumps(
                {
                    "concat_window": w,
                    "us_per_row": per_row * 1e6,
                    "sums_mib_at_1e9": 1e9 / w * 8 / 2**20,
                }
            ),
            flush=True,
        )
    sft = sft_lengths(10**6)
    for w in (2**12, 2**14, 2**16, 2**18):
        t0 = time.perf_counter()
        s = fastshard.PackedSampler(
            sft, SEQ, mode="best_fit", long_docs="split", window=w, num_replicas=1, rank=0
        )
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        s[0]
        first = time.perf_counter() - t0
        print(
            json.dumps(
                {
                    "best_fit_window": w,
                    "n": 10**6,
                    "efficiency": s.efficiency,
                    "layout_s": build,
                    "first_row_s": first,
                }
            ),
            flush=True,
        )


def greedy_rows(lengths: np.ndarray, seq_len: int) -> int:
    """torchtune's PackedDataset rule: documents in order, a new row when the next does not fit
    (split_across_pack=False; a document longer than seq_len split into full rows first)."""
    rows, room = 0, 0
    for v in lengths.tolist():
        full, v = divmod(v - 1, seq_len)
        rows += full
        v += 1
        if v > room:
            rows += 1
            room = seq_len
        room -= v
    return rows


def grain_rows(lengths: np.ndarray, seq_len: int, kind: str) -> tuple[int, float]:
    import grain

    ex = grain.experimental
    cls = {
        "first_fit": ex.FirstFitPackIterDataset,
        "best_fit": getattr(ex, "BestFitPackIterDataset", None),
    }[kind]
    if cls is None:
        raise RuntimeError(f"grain has no {kind} packing")
    docs = [np.zeros(min(int(v), seq_len), dtype=np.int32) for v in lengths]
    ds = grain.MapDataset.source(docs).map(lambda x: {"tokens": x}).to_iter_dataset()
    kw = dict(length_struct={"tokens": seq_len}, num_packing_bins=64)
    packed = cls(ds, **kw)
    t0 = time.perf_counter()
    rows = sum(1 for _ in packed)
    return rows, time.perf_counter() - t0


def efficiency(args: argparse.Namespace) -> None:
    import fastshard

    n = int(args.n[0])
    lengths = sft_lengths(n)
    capped = np.minimum(lengths, SEQ).astype(np.int64)  # grain truncates: compare on these
    real = int(lengths.sum(dtype=np.int64))
    t0 = time.perf_counter()
    s = fastshard.PackedSampler(
        lengths, SEQ, mode="best_fit", long_docs="split", num_replicas=1, rank=0
    )
    s[0]
    start = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "impl": "fastshard best_fit",
                "n": n,
                "efficiency": s.efficiency,
                "rows": s.num_rows,
                "epoch_start_s": start,
            }
        ),
        flush=True,
    )
    s2 = fastshard.PackedSampler(
        lengths, SEQ, mode="best_fit", long_docs="truncate", num_replicas=1, rank=0
    )
    print(
        json.dumps(
            {
                "impl": "fastshard best_fit truncate",
                "n": n,
                "efficiency": s2.efficiency,
                "rows": s2.num_rows,
            }
        ),
        flush=True,
    )
    t0 = time.perf_counter()
    rows = greedy_rows(lengths, SEQ)
    print(
        json.dumps(
            {
                "impl": "greedy sequential (torchtune rule)",
                "n": n,
                "efficiency": real / (rows * SEQ),
                "rows": rows,
                "epoch_start_s": time.perf_counter() - t0,
            }
        ),
        flush=True,
    )
    g = int(args.grain_n)
    sub = lengths[:g]
    fs = fastshard.PackedSampler(
        sub, SEQ, mode="best_fit", long_docs="truncate", num_replicas=1, rank=0
    )
    print(
        json.dumps({"impl": "fastshard best_fit truncate", "n": g, "efficiency": fs.efficiency}),
        flush=True,
    )
    for kind in ("first_fit", "best_fit"):
        try:
            rows, dt = grain_rows(sub, SEQ, kind)
            eff = int(np.minimum(sub, SEQ).sum()) / (rows * SEQ)
            print(
                json.dumps(
                    {
                        "impl": f"grain {kind}",
                        "n": g,
                        "efficiency": eff,
                        "rows": rows,
                        "epoch_s": dt,
                        "epoch_s_scaled_to_n": dt * n / g,
                    }
                ),
                flush=True,
            )
        except Exception as err:  # report and go on
            print(json.dumps({"impl": f"grain {kind}", "error": repr(err)}), flush=True)
    del capped


def fill(args: argparse.Namespace) -> None:
    """best_fit per n: efficiency (real tokens / row slots, from the lengths) and the time and
    memory from construction to rank 0 of --world's first row, default window, long_docs="split",
    SFT lengths in a uint32 memmap; this build, then --base-python's, side by side per n."""
    for n in map(int, args.n):
        path = Path(args.dir) / f"sft_{n}.u32"
        sft_file(n, path)
        for _ in range(args.repeat):
            for py in fastshard_sides(args):
                r = run_child("fastshard_best_fit", path, SEQ, world=args.world, python=py)
                r.update(n=n, world=args.world, loadavg=loadavg())
                print(json.dumps(r), flush=True)


def huge(args: argparse.Namespace) -> None:
    n = int(args.n[0])
    path = Path(args.dir) / f"pretrain_{n}.u32"
    t0 = time.perf_counter()
    pretrain_lengths(n, path)
    print(json.dumps({"made_lengths_s": time.perf_counter() - t0}), flush=True)
    for _ in range(args.repeat):
        for py in fastshard_sides(args):
            r = run_child("fastshard_concat", path, SEQ, world=8, python=py, cold=args.cold)
            r.update(n=n, world=8, rank=0, cold=args.cold)
            print(json.dumps(r), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["window", "megatron", "efficiency", "fill", "huge", "child"])
    p.add_argument("--n", nargs="+", type=float, default=[1e7])
    p.add_argument("--grain-n", type=float, default=1e5)
    p.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    p.add_argument("--impl")
    p.add_argument("--path")
    p.add_argument("--seq-len", type=int, default=SEQ)
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--numpy", action="store_true", help="megatron: also the NumPy build")
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--base-python", default=None)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--cold", action="store_true")
    args = p.parse_args()
    {
        "window": window,
        "megatron": megatron,
        "efficiency": efficiency,
        "fill": fill,
        "huge": huge,
        "child": child,
    }[args.what](args)


if __name__ == "__main__":
    main()
