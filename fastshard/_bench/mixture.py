"""Mixtures of datasets: ``fastshard.MixtureSampler`` beside what users build today.

Three kinds of case, each in a fresh child (the harness's ``run_case``):

``blend-index``
    A Megatron-style blended index: two arrays as long as the run, the dataset id of every
    sample (int16) and the sample's id within its dataset (int64), 10 bytes a sample. Megatron-LM
    builds them with a C++ loop that gives each sample to the dataset with the largest deficit
    (weight times samples so far, minus that dataset's count). Here ``blended_index`` builds
    arrays of the same layout and the same property (every prefix holds each dataset's share to
    within one sample) in vectorised NumPy; see its docstring for what it computes.
``mnws``
    torchdata.nodes' ``MultiNodeWeightedSampler`` over three sources, timed per draw.
``mixture-first`` / ``mixture-indices``
    fastshard's ``MixtureSampler``: the first index at a size no array could hold, and its
    ``indices()`` per draw beside the default ``DistributedSampler``'s ``indices()`` per index on
    the same n and the ``np.arange`` floor, interleaved round by round in one child.

Like the rest of this package, nothing here imports NumPy, torch or fastshard at module level:
a child imports only what its case needs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import statistics
import time
from typing import Any

from .harness import _status_bytes, run_case
from .units import _fmt_bytes, _fmt_n, _fmt_time

# Every mixture case reads three datasets at these proportions. Their lengths are split in
# other proportions, so that the last dataset is upsampled (2x) and the first downsampled.
WEIGHTS = (0.5, 0.3, 0.2)
SHARES = (6, 3, 1)  # tenths of the total length
MIXTURE_MODES = ("blend-index", "mnws", "mixture-first", "mixture-indices")
# The target: MixtureSampler.indices() at most this many times the default order's.
INDICES_TARGET = 2.0
INDICES_ROUNDS = 9
# blended_index works in int64 and forms (2j + 1) * m_d < N**2 / 2: exact below this N (and
# such arrays would need 40 GB anyway).
BLEND_MAX_N = 4 * 10**9


def split_sizes(total: int) -> list[int]:
    """Three dataset lengths adding up to ``total``, in the proportions of ``SHARES``."""
    whole = sum(SHARES)
    sizes = [total * s // whole for s in SHARES[:-1]]
    return [*sizes, total - sum(sizes)]


def quotas(n: int, weights: tuple[float, ...] | list[float]) -> list[int]:
    """Samples of each dataset in a run of ``n``: n * w_c / sum(w) rounded by largest remainder."""
    total = math.fsum(weights)
    exact = [n * w / total for w in weights]
    base = [math.floor(x) for x in exact]
    short = n - sum(base)
    # The datasets with the largest fractional parts take the remaining samples (lower id first).
    by_remainder = sorted(range(len(weights)), key=lambda c: (-(exact[c] - base[c]), c))
    for c in by_remainder[:short]:
        base[c] += 1
    return base


def blended_index(n: int, weights: tuple[float, ...] | list[float], chunk: int = 1 << 16) -> Any:
    """A Megatron-style blended index of ``n`` samples: ``(dataset_index, dataset_sample_index)``.

    ``dataset_index[t]`` (int16) is the dataset of sample t and ``dataset_sample_index[t]``
    (int64) how many samples of that dataset came before it, which is what Megatron-LM's
    ``BlendedDataset`` stores (its datasets map that count to an item).

    Megatron fills the arrays one sample at a time, giving sample t to the dataset with the
    largest deficit ``w_c * t - count_c``. This builds arrays of the same layout with the same
    guarantee without a Python loop: dataset c gets ``m_c`` samples (``quotas``), its j-th
    sample sits at the point ``(2j + 1) / (2 m_c)`` of the run, and the samples of all datasets
    are merged in the order of those points (ties to the lower dataset id). The merged position
    of (c, j) has a closed form: j, plus for every other dataset d the number of its points
    below (or, for d < c, at) c's point, an integer floor division; so each dataset's samples
    are scattered into place in chunks, and the only memory that grows with n is the two output
    arrays. Every prefix of length t then holds ``t * m_c / n`` samples of dataset c to within
    one.
    """
    import numpy as np

    if not 0 < n <= BLEND_MAX_N:
        raise ValueError(f"n must be in [1, {BLEND_MAX_N}], got {n}")
    m = quotas(n, weights)
    dataset_index = np.empty(n, dtype=np.int16)
    sample_index = np.empty(n, dtype=np.int64)
    for c, mc in enumerate(m):
        for lo in range(0, mc, chunk):
            j = np.arange(lo, min(lo + chunk, mc), dtype=np.int64)
            odd = 2 * j + 1
            pos = j.copy()
            for d, md in enumerate(m):
                if d == c or md == 0:
                    continue
                x = odd * md
                # Points (2i + 1) / (2 m_d) of dataset d at or below ours (d < c), or strictly
                # below (d > c): the odd numbers o = 2i + 1 with o * m_c <= x (< x).
                if d > c:
                    x -= 1
                x //= mc
                x += 1
                x //= 2
                pos += x
            dataset_index[pos] = c
            sample_index[pos] = j
    return dataset_index, sample_index


# ------------------------------------------------------------------------------------------
# Child side: the body of each mixture case.
# ------------------------------------------------------------------------------------------
def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one mixture case in this process; the harness's ``measure`` hands these over."""
    mode = spec["mode"]
    if mode == "blend-index":
        return _measure_blend(spec)
    if mode == "mnws":
        return _measure_mnws(spec)
    if mode == "mixture-first":
        return _measure_first(spec)
    if mode == "mixture-indices":
        return _measure_indices(spec)
    raise ValueError(f"unknown mixture mode {mode!r}")


def _memory(baseline: int) -> dict[str, int]:
    peak = _status_bytes("VmHWM")
    return {"baseline_bytes": baseline, "peak_bytes": peak, "growth_bytes": max(0, peak - baseline)}


def _measure_blend(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    n, weights = spec["n"], spec["weights"]
    baseline = _status_bytes("VmHWM")
    times, cpu = [], []
    for _ in range(max(1, spec["repeat"])):
        c0, t0 = time.process_time(), time.perf_counter()
        dataset_index, sample_index = blended_index(n, weights)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        memory = _memory(baseline)
        # Checked after the peak was read: the checks' temporaries are not the index's cost.
        counts = [int(np.count_nonzero(dataset_index == c)) for c in range(len(weights))]
        if counts != quotas(n, weights):
            raise RuntimeError(f"dataset counts {counts}, expected {quotas(n, weights)}")
        first = int(dataset_index[0])
        del dataset_index, sample_index
    return {
        "length": n,
        "count": n,
        "prefix": False,
        "first_s": [],
        "total_s": times,
        "cpu_s": cpu,
        "first_value": first,
        "bytes_per_sample": 2 + 8,
        **memory,
    }


def _measure_mnws(spec: dict[str, Any]) -> dict[str, Any]:
    nodes = importlib.import_module("torchdata.nodes")
    draws, world, rank = spec["draws"], spec["world"], spec["rank"]
    sizes = split_sizes(spec["n"])
    offsets = [sum(sizes[:c]) for c in range(len(sizes))]
    names = [f"ds{c}" for c in range(len(sizes))]
    baseline = _status_bytes("VmHWM")
    first_s, total_s, cpu_s, draw_s = [], [], [], []
    value = None
    for _ in range(max(1, spec["repeat"])):
        c0, t0 = time.process_time(), time.perf_counter()
        # Each source yields its dataset's ConcatDataset indices in order (no shuffle of its
        # own: that would only add to torchdata's time). The sources are as long as the
        # MixtureSampler's datasets, far more than the draws: none runs out and restarts.
        sources = {
            name: nodes.IterableWrapper(range(off, off + size))
            for name, off, size in zip(names, offsets, sizes)
        }
        sampler = nodes.MultiNodeWeightedSampler(
            sources,
            dict(zip(names, spec["weights"])),
            stop_criteria="CYCLE_FOREVER",
            rank=rank,
            world_size=world,
            seed=0,
        )
        value = next(sampler)
        t1 = time.perf_counter()
        for _ in range(draws - 1):
            next(sampler)
        t2, c2 = time.perf_counter(), time.process_time()
        first_s.append(t1 - t0)
        total_s.append(t2 - t0)
        cpu_s.append(c2 - c0)
        # Per draw after the first, which builds the sources and the first batch of choices.
        draw_s.append((t2 - t1) / max(1, draws - 1))
        del sampler, sources
    return {
        "length": draws,
        "count": draws,
        "prefix": False,
        "first_s": first_s,
        "total_s": total_s,
        "cpu_s": cpu_s,
        "draw_s": draw_s,
        "first_value": value,
        **_memory(baseline),
    }


def _mixture_sampler(spec: dict[str, Any]) -> Any:
    # By name: the type checker runs on fastshards that have no MixtureSampler yet.
    cls = importlib.import_module("fastshard").MixtureSampler
    return cls(
        split_sizes(spec["n"]),
        list(spec["weights"]),
        num_replicas=spec["world"],
        rank=spec["rank"],
        seed=0,
    )


def _measure_first(spec: dict[str, Any]) -> dict[str, Any]:
    import fastshard

    del fastshard  # imported before the baseline, so that the baseline holds the extension
    baseline = _status_bytes("VmHWM")
    first_s, cpu_s = [], []
    value = length = None
    for _ in range(max(1, spec["repeat"])):
        c0, t0 = time.process_time(), time.perf_counter()
        sampler = _mixture_sampler(spec)
        value = next(iter(sampler))
        first_s.append(time.perf_counter() - t0)
        cpu_s.append(time.process_time() - c0)
        length = len(sampler)
        if value != sampler[0]:
            raise RuntimeError(f"iteration starts at {value}, sampler[0] is {sampler[0]}")
        del sampler
    return {
        "length": length,
        "count": 1,
        "prefix": True,
        "first_s": first_s,
        "total_s": first_s,
        "cpu_s": cpu_s,
        "first_value": value,
        **_memory(baseline),
    }


def _measure_indices(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    import fastshard

    n, world, rank = spec["n"], spec["world"], spec["rank"]
    baseline = _status_bytes("VmHWM")
    mixture = _mixture_sampler(spec)
    default = fastshard.DistributedSampler(n, num_replicas=world, rank=rank, seed=0)
    length = len(mixture)
    if len(default) != length:
        raise RuntimeError(f"lengths differ: mixture {length}, default {len(default)}")
    sides = (
        lambda: mixture.indices(0, length),
        lambda: default.indices(0, length),
        lambda: np.arange(length, dtype=np.int64),
    )
    times: list[list[float]] = [[], [], []]
    order = [0, 1, 2]
    for _ in range(max(1, spec["repeat"])):
        # Each round in another order (rotated), so that no side always runs first.
        for side in order:
            t0 = time.perf_counter()
            out = sides[side]()
            times[side].append(time.perf_counter() - t0)
            if len(out) != length or out.dtype != np.int64:
                raise RuntimeError(f"side {side}: {len(out)} {out.dtype}, expected {length} int64")
            del out
        order = order[1:] + order[:1]
    return {
        "length": length,
        "count": length,
        "prefix": False,
        "first_s": [],
        "total_s": [min(t) for t in times],
        "rounds_s": times,
        "threads": fastshard.get_num_threads(),
        "first_value": int(mixture[0]),
        **_memory(baseline),
    }


# ------------------------------------------------------------------------------------------
# Parent side: plan and run the cases, then the table.
# ------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The mixture section's options of the ``bench`` subcommand."""
    from .units import parse_count

    parser.add_argument(
        "--mixture",
        action="store_true",
        help="add the mixture section: a Megatron-style blended index, torchdata's "
        "MultiNodeWeightedSampler and fastshard's MixtureSampler over three datasets",
    )
    parser.add_argument(
        "--mixture-max-n",
        type=parse_count,
        metavar="N",
        help="largest blended index built (10 bytes a sample; sizes 1e6 (1e4 with --quick), 1e7, "
        "... up to N, then the largest that fits under --max-mem) (default 1e9; 1e6 with --quick)",
    )
    parser.add_argument(
        "--mixture-draws",
        type=parse_count,
        metavar="K",
        help="draws timed from MultiNodeWeightedSampler (default 1e6; 1e5 with --quick)",
    )
    parser.add_argument(
        "--mixture-n",
        type=parse_count,
        default=10**10,
        metavar="N",
        help="items over the three datasets for MixtureSampler's first index (default 1e10)",
    )
    parser.add_argument(
        "--mixture-indices-n",
        type=parse_count,
        metavar="N",
        help="items for indices() beside the default order's (default 1e8; 1e6 with --quick)",
    )


def has_mixture_sampler() -> bool:
    """Whether the installed fastshard has ``MixtureSampler`` (the issue-17 branch)."""
    import fastshard

    return hasattr(fastshard, "MixtureSampler")


def blend_sizes(max_n: int, quick: bool) -> list[int]:
    """Powers of ten from 1e4 (quick) or 1e6 up to ``max_n``, and ``max_n`` itself."""
    sizes = [10**e for e in range(4 if quick else 6, 19) if 10**e < max_n]
    return [*sizes, max_n]


def _fit(last: dict[str, Any], max_mem: int) -> int:
    """The largest n whose blended index fits under ``max_mem``, from a measured smaller one,
    rounded down to two significant digits (with a tenth of the room to spare)."""
    per_sample = max(last["growth_bytes"], 1) / last["n"]
    n = int(0.9 * (max_mem - last["baseline_bytes"]) / per_sample)
    if n < 1:
        return 0
    scale = int(10 ** max(0, len(str(n)) - 2))
    return min(n // scale * scale, BLEND_MAX_N)


def run_mixture(args: argparse.Namespace, max_mem: int, repeat: int) -> dict[str, Any]:
    """Plan and run the mixture cases; returns what results.json holds under "mixture"."""
    world = args.world
    max_n = args.mixture_max_n or (10**6 if args.quick else 10**9)
    draws = args.mixture_draws or (10**5 if args.quick else 10**6)
    indices_n = args.mixture_indices_n or (10**6 if args.quick else 10**8)
    common = {"world": world, "rank": 0, "weights": list(WEIGHTS)}
    cases: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}

    def execute(case: dict[str, Any], rounds: int = repeat) -> dict[str, Any]:
        spec = {**common, **case, "repeat": rounds}
        record = {**spec, **run_case(spec, args.timeout, max_mem)}
        cases.append(record)
        return record

    # 1. The blended index at growing sizes, each predicted from the last before it runs.
    last: dict[str, Any] | None = None
    for n in blend_sizes(max_n, args.quick):
        case = {"mode": "blend-index", "n": n, "role": "blend"}
        if last is not None:
            peak = last["baseline_bytes"] + last["growth_bytes"] * n / last["n"]
            if peak > max_mem:
                fit = _fit(last, max_mem)
                cases.append(
                    {
                        **common,
                        **case,
                        "ok": False,
                        "skipped": True,
                        "error": f"skipped: predicted peak {_fmt_bytes(peak)} > limit "
                        f"{_fmt_bytes(max_mem)}",
                    }
                )
                if fit > last["n"]:
                    last = execute({**case, "n": fit, "role": "blend-fit"}, 1)
                    last = last if last.get("ok") else None
                break
        # One build from 1e8 on: it takes seconds to minutes, and its time hardly varies.
        record = execute(case, repeat if n < 10**8 else 1)
        if not record.get("ok"):
            break
        last = record

    # 2. torchdata.nodes' MultiNodeWeightedSampler, per draw.
    if importlib.util.find_spec("torchdata") is None:
        skipped["mnws"] = "torchdata is not installed (pip install 'torchdata>=0.11')"
    else:
        execute({"mode": "mnws", "n": args.mixture_n, "draws": draws, "role": "mnws"})

    # 3. fastshard's MixtureSampler, once the installed fastshard has it.
    if not has_mixture_sampler():
        why = "this fastshard has no MixtureSampler (issue 17 not merged)"
        skipped["mixture-first"] = skipped["mixture-indices"] = why
    else:
        execute({"mode": "mixture-first", "n": args.mixture_n, "role": "mixture"})
        execute({"mode": "mixture-indices", "n": indices_n, "role": "mixture"}, INDICES_ROUNDS)
    return {
        "weights": list(WEIGHTS),
        "shares": list(SHARES),
        "world": world,
        "cases": cases,
        "skipped": skipped,
    }


def indices_ratios(case: dict[str, Any]) -> dict[str, float]:
    """Per-round ratios of a ``mixture-indices`` case, each the median over its rounds."""
    mix, default, floor = case["rounds_s"]
    return {
        "mixture_over_default": statistics.median([a / b for a, b in zip(mix, default) if b > 0]),
        "mixture_over_arange": statistics.median([a / b for a, b in zip(mix, floor) if b > 0]),
        "default_over_arange": statistics.median([a / b for a, b in zip(default, floor) if b > 0]),
    }


def render_mixture(section: dict[str, Any]) -> str:
    """The mixture section's Markdown: one row per case, then indices() side by side."""
    if not section:
        return ""
    w = section["world"]
    weights = ", ".join(f"{x:g}" for x in section["weights"])
    shares = ":".join(str(s) for s in section["shares"])
    lines = [
        "",
        f"Mixtures of three datasets at weights ({weights}), their lengths split {shares}; "
        f"rank 0 of W={w} where a sampler has ranks; each case in a fresh process. *peak*: "
        "growth of the child's VmHWM over its baseline after imports.",
        "",
        "| case | n | build / first index | per sample | peak | notes |",
        "|---|---:|---:|---:|---:|---|",
    ]
    labels = {
        "blend": "Megatron-style blended index (NumPy: int16 + int64 arrays)",
        "blend-fit": "Megatron-style blended index (NumPy: int16 + int64 arrays)",
        "mnws": "torchdata MultiNodeWeightedSampler",
        "mixture": "fastshard MixtureSampler",
    }
    pairs: list[dict[str, Any]] = []
    for c in section["cases"]:
        if c["mode"] == "mixture-indices":
            pairs.append(c)
            continue
        label = labels[c["role"]]
        n = _fmt_n(c["n"])
        if not c.get("ok"):
            lines.append(f"| {label} | {n} | — | — | — | {c['error']} |")
            continue
        peak = _fmt_bytes(c["growth_bytes"])
        if c["mode"] == "blend-index":
            best = min(c["total_s"])
            note = f"{c['bytes_per_sample']} bytes a sample; build time"
            if c["role"] == "blend-fit":
                note += "; the largest n that fits under the memory limit"
            lines.append(
                f"| {label} | {n} | {_fmt_time(best)} | {best / c['n'] * 1e9:,.1f} ns "
                f"| {peak} | {note} |"
            )
        elif c["mode"] == "mnws":
            lines.append(
                f"| {label} | {n}; {_fmt_n(c['count'])} draws "
                f"| {_fmt_time(min(c['first_s']))} | {min(c['draw_s']) * 1e9:,.1f} ns | {peak} "
                "| per draw after the first; a random source per draw (proportions in "
                "expectation); the sources iterate ranges |"
            )
        else:
            lines.append(
                f"| {label} | {n} | {_fmt_time(min(c['first_s']))} | — | {peak} "
                f"| first index; {_fmt_n(c['length'])} draws on this rank |"
            )
    for why in dict.fromkeys(section["skipped"].values()):
        lines.append(f"| — | — | — | — | — | not run: {why} |")
    if pairs:
        lines += [
            "",
            f"`indices()` of rank 0's whole epoch (W={w}), each side timed in the same child, "
            f"in rotating order, {INDICES_ROUNDS} rounds; ratios are medians of the per-round "
            f"ratios; target: MixtureSampler at most {INDICES_TARGET:g}x the default order.",
            "",
            "| n | MixtureSampler ns/draw | DistributedSampler ns/index | np.arange ns/index "
            "| mixture / default | mixture / arange | default / arange | met |",
            "|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for c in pairs:
            if not c.get("ok"):
                lines.append(f"| {_fmt_n(c['n'])} | {c['error']} | | | | | | |")
                continue
            ns = [t / c["length"] * 1e9 for t in c["total_s"]]
            r = indices_ratios(c)
            met = "yes" if r["mixture_over_default"] <= INDICES_TARGET else "**no**"
            lines.append(
                f"| {_fmt_n(c['n'])} | {ns[0]:.2f} | {ns[1]:.2f} | {ns[2]:.2f} "
                f"| {r['mixture_over_default']:.2f}x | {r['mixture_over_arange']:.2f}x "
                f"| {r['default_over_arange']:.2f}x | {met} |"
            )
    return "\n".join(lines) + "\n"
