"""The Markdown report: the peer table and the core targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .adapters import LABELS, SAMPLERS
from .runner import TARGET_MEMORY_INDICES, TARGET_MEMORY_LIMIT
from .units import _fmt_bytes, _fmt_n, _fmt_time, _MiB


def _ns(case: dict[str, Any]) -> float:
    return float(min(case["total_s"]) / case["count"] * 1e9)


def _epoch_s(case: dict[str, Any]) -> float:
    """The whole rank epoch's time: measured, or per-index time times the length for a prefix."""
    return float(min(case["total_s"]) / case["count"] * case["length"])


def _find(
    cases: list[dict[str, Any]], sampler: str, mode: str, n: int, role: str = "peer"
) -> dict[str, Any] | None:
    for c in cases:
        if (c["sampler"], c["mode"], c["n"], c.get("role")) == (sampler, mode, n, role):
            return c
    return None


def render(results: dict[str, Any]) -> str:
    """The Markdown report: the peer table, then the core targets."""
    meta, cases = results["meta"], results["cases"]
    mach = meta["machine"]
    w = meta["world"]
    lines = [
        f"Rank 0 of W={w}; best of up to {meta['repeat']} runs, each case in a fresh process. "
        f"{mach['cpu']}{' (AVX-512)' if mach['avx512'] else ''}, {mach['cores']} cores, "
        f"{_fmt_bytes(mach['mem_total_bytes'])} RAM; Python {mach['python']}, "
        + ", ".join(f"{k} {v}" for k, v in mach["versions"].items() if v)
        + ".",
        (
            f"Load average {meta['loadavg_start'][0]:.2f} at the start, "
            f"{meta['loadavg_end'][0]:.2f} at the end (other jobs on the machine add noise). "
            f"Memory limit {_fmt_bytes(meta['max_mem_bytes'])}; "
            f"run time {meta['elapsed_s']:.0f} s."
        ),
        "",
        (
            "*first index*: build the sampler, `iter()`, `next()`. *iterate*: a whole rank "
            "epoch through a Python `for` loop (first index included), per index. *array*: the "
            "whole rank epoch as an int64 NumPy array (`fastshard.indices()`), per index. "
            "*peak*: growth of the child's VmHWM over its baseline after imports."
        ),
        "",
        (
            "| n | sampler | first index | iterate ns/index | iterate epoch | array ns/index "
            "| peak (iterate) | peak (array) | notes |"
        ),
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in meta["sizes"]:
        for key, label, modes, kind in SAMPLERS:
            if key in meta["skipped_samplers"]:
                continue
            it = _find(cases, key, "iter", n) if "iter" in modes else None
            ar = _find(cases, key, "array", n) if "array" in modes else None
            if it is None and ar is None:
                continue
            notes: list[str] = []
            first = ns_it = epoch = ns_ar = peak_it = peak_ar = "—"
            if it is not None:
                if it.get("ok"):
                    if kind == "sampler":
                        first = _fmt_time(min(it["first_s"]))
                    ns_it = f"{_ns(it):,.1f}"
                    epoch = _fmt_time(_epoch_s(it))
                    peak_it = _fmt_bytes(it["growth_bytes"])
                    if it["prefix"]:
                        epoch = "≈ " + epoch
                        notes.append(
                            f"iterate: a prefix of {_fmt_n(it['count'])} of "
                            f"{_fmt_n(it['length'])} indices, epoch extrapolated"
                        )
                else:
                    notes.append(f"iterate {it['error']}")
            if ar is not None:
                if ar.get("ok"):
                    ns_ar = f"{_ns(ar):,.1f}"
                    peak_ar = _fmt_bytes(ar["growth_bytes"])
                else:
                    notes.append(f"array {ar['error']}")
            elif kind == "sampler":
                notes.append("no array API")
            if key == "arange":
                notes.append("reference: writes the same number of int64")
            if key == "list":
                notes.append("reference: peak is the list itself")
            if key == "range":
                notes.append("reference: creates one int per step, as a sampler must")
            lines.append(
                f"| {_fmt_n(n)} | {label} | {first} | {ns_it} | {epoch} | {ns_ar} "
                f"| {peak_it} | {peak_ar} | {'; '.join(notes)} |"
            )
    if meta["skipped_samplers"]:
        lines.append("")
        lines.append(
            "Not run: "
            + "; ".join(f"{LABELS[k]}: {why}" for k, why in meta["skipped_samplers"].items())
            + "."
        )
    targets = render_targets(results)
    if targets:
        lines += ["", *targets]
    return "\n".join(lines) + "\n"


def _best(case: dict[str, Any] | None, key: str) -> float | None:
    values = case.get(key) if case is not None else None
    return float(min(values)) if values else None


def _median(values: list[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def core_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The core issue's targets, from this run's cases (met is None where not measured).

    Time ratios come two ways: from the separate children of the peer table (best of R each,
    wall and process CPU time), and from interleaved pairs in one child (the median of the
    per-round ratios). On a shared machine the pairs are the steadier figure, so ``met`` is
    judged on them where they ran. CPU-time ratios are given only where both sides run on one
    thread.
    """
    cases, w = results["cases"], results["meta"]["world"]
    n_big = max(results["meta"]["sizes"])
    out: list[dict[str, Any]] = []

    def ok(c: dict[str, Any] | None) -> dict[str, Any] | None:
        return c if c is not None and c.get("ok") and not c.get("prefix") else None

    def ratio(num: float | None, den: float | None) -> float | None:
        return num / den if num is not None and den else None

    def paired(
        a: tuple[str, str], b: tuple[str, str], n: int, key: str, b_over_a: bool
    ) -> tuple[float | None, int]:
        for c in cases:
            if (
                c.get("role") == "target-pair"
                and c.get("ok")
                and c["n"] == n
                and [tuple(x) for x in c["pair"]] == [a, b]
            ):
                ta, tb = c[key]
                rounds = [(y / x if b_over_a else x / y) for x, y in zip(ta, tb) if x > 0 and y > 0]
                return (_median(rounds) if rounds else None), len(rounds)
        return None, 0

    def add(
        target: str,
        goal: str,
        good: Callable[[float], bool],
        detail: str | None,
        sep: tuple[float | None, float | None],
        pair: tuple[float | None, float | None],
        rounds: int,
        missing: str,
    ) -> None:
        judged = pair[0] if pair[0] is not None else sep[0]
        out.append(
            {
                "target": target,
                "goal": goal,
                "detail": detail or missing,
                "ratio": sep[0],
                "cpu_ratio": sep[1],
                "pair_ratio": pair[0],
                "pair_cpu_ratio": pair[1],
                "pair_rounds": rounds,
                "met": None if judged is None else good(judged),
            }
        )

    fs = ok(_find(cases, "fastshard", "iter", n_big))
    tt = ok(_find(cases, "torch", "iter", 10**7))
    add(
        f"first index: fastshard at n={_fmt_n(n_big)} vs torch at n=1e7 (W={w})",
        ">= 1000x faster",
        lambda r: r >= 1000,
        f"{_fmt_time(_best(fs, 'first_s'))} vs {_fmt_time(_best(tt, 'first_s'))}"
        if fs and tt
        else None,
        (
            ratio(_best(tt, "first_s"), _best(fs, "first_s")),
            ratio(_best(tt, "first_cpu_s"), _best(fs, "first_cpu_s")),
        ),
        (None, None),
        0,
        "needs size 1e7 and a larger n",
    )

    fs = ok(_find(cases, "fastshard", "iter", 10**7))
    fi, ti = ("fastshard", "iter"), ("torch", "iter")
    pr, k = paired(fi, ti, 10**7, "total_s", True)
    pc, _ = paired(fi, ti, 10**7, "cpu_s", True)
    add(
        f"iterate a rank epoch at n=1e7 (W={w}): fastshard vs torch",
        ">= 20x faster",
        lambda r: r >= 20,
        f"{_ns(fs):.1f} vs {_ns(tt):.1f} ns/index" if fs and tt else None,
        (
            ratio(_best(tt, "total_s"), _best(fs, "total_s")),
            ratio(_best(tt, "cpu_s"), _best(fs, "cpu_s")),
        ),
        (pr, pc),
        k,
        "needs size 1e7",
    )

    def iterate_over(floor: str, what: str, limit: float) -> None:  # fastshard / a floor
        fl = ok(_find(cases, floor, "iter", 10**7))
        pr, k = paired(fi, (floor, "iter"), 10**7, "total_s", False)
        pc, _ = paired(fi, (floor, "iter"), 10**7, "cpu_s", False)
        add(
            f"iterate a rank epoch at n=1e7 (W={w}): fastshard vs {what}",
            f"<= {limit:g}x the {floor}",
            lambda r: r <= limit,
            f"{_ns(fs):.1f} vs {_ns(fl):.1f} ns/index" if fs and fl else None,
            (
                ratio(_best(fs, "total_s"), _best(fl, "total_s")),
                ratio(_best(fs, "cpu_s"), _best(fl, "cpu_s")),
            ),
            (pr, pc),
            k,
            "needs size 1e7",
        )

    iterate_over("list", "a ready Python list", 3)
    iterate_over("range", "a range of its length (new ints)", 1.2)

    fa = ok(_find(cases, "fastshard", "array", 10**9))
    na = ok(_find(cases, "arange", "array", 10**9))
    threads = results["meta"].get("fastshard_threads")
    pr, k = paired(("fastshard", "array"), ("arange", "array"), 10**9, "total_s", False)
    add(
        f"indices() of a rank epoch at n=1e9 (W={w}) vs np.arange of its length",
        "<= 4x np.arange",
        lambda r: r <= 4,
        f"{_ns(fa):.2f} vs {_ns(na):.2f} ns/index ({threads} threads)" if fa and na else None,
        (ratio(_best(fa, "total_s"), _best(na, "total_s")), None),
        (pr, None),
        k,
        "needs size 1e9",
    )

    mem = ok(_find(cases, "fastshard", "iter", TARGET_MEMORY_INDICES, role="target-memory"))
    tmem = ok(_find(cases, "torch", "iter", TARGET_MEMORY_INDICES, role="target-memory"))
    detail = None
    if mem:
        detail = f"{_fmt_bytes(mem['growth_bytes'])} ({_ns(mem):.1f} ns/index)"
        if tmem:
            detail += f"; torch: {_fmt_bytes(tmem['growth_bytes'])}"
    out.append(
        {
            "target": f"peak memory growth iterating an epoch of {_fmt_n(TARGET_MEMORY_INDICES)} "
            "indices (n=2.5e7, W=1)",
            "goal": f"<= {TARGET_MEMORY_LIMIT // _MiB} MiB",
            "detail": detail or "not run (--quick or --no-targets)",
            "ratio": None,
            "cpu_ratio": None,
            "pair_ratio": None,
            "pair_cpu_ratio": None,
            "pair_rounds": 0,
            "met": None if mem is None else mem["growth_bytes"] <= TARGET_MEMORY_LIMIT,
        }
    )
    return out


def _fmt_ratio(r: float | None) -> str:
    if r is None:
        return "—"
    return f"{r:,.2f}x" if r < 100 else f"{r:,.0f}x"


def render_targets(results: dict[str, Any]) -> list[str]:
    rows = core_targets(results)
    if all(r["met"] is None for r in rows):
        return []
    lines = [
        "Core targets:",
        "",
        (
            "| target | goal | measured (separate runs, wall) | ratio: separate runs, wall "
            "(CPU time) | ratio: interleaved pairs, median wall (CPU time) | met |"
        ),
        "|---|---|---|---:|---:|---|",
    ]
    for r in rows:
        met = {True: "yes", False: "**no**", None: "not measured"}[r["met"]]
        sep = _fmt_ratio(r["ratio"])
        if r["cpu_ratio"] is not None:
            sep += f" ({_fmt_ratio(r['cpu_ratio'])})"
        pair = _fmt_ratio(r["pair_ratio"])
        if r["pair_ratio"] is not None:
            if r["pair_cpu_ratio"] is not None:
                pair += f" ({_fmt_ratio(r['pair_cpu_ratio'])})"
            pair += f", {r['pair_rounds']} rounds"
        lines.append(f"| {r['target']} | {r['goal']} | {r['detail']} | {sep} | {pair} | {met} |")
    lines += [
        "",
        (
            "*met* is judged on the interleaved pairs where they ran (both sides timed in one "
            "process, alternating, so that both see the same load), else on the separate runs."
        ),
    ]
    return lines
