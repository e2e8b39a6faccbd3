"""The bench's plot: three log-log panels against n, one above the other."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from .adapters import SAMPLERS
from .table import _epoch_s


def plot(results: dict[str, Any], path: str) -> bool:
    """Three log-log panels against n, one above the other, and their legend; False when
    matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return False
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    cases = [c for c in results["cases"] if c.get("ok") and c.get("role") == "peer"]
    # The panels one above the other, 671 px wide at 110 dpi: the documentation site shows a
    # figure about 690 px wide, where three panels side by side had 5 px tall labels.
    fig, axes = plt.subplots(3, 1, figsize=(6.1, 14.5))

    def first(c: dict[str, Any]) -> float | None:
        return min(c["first_s"]) if c["first_s"] else None

    def growth(c: dict[str, Any]) -> float:
        return max(float(c["growth_bytes"]), 4096.0)

    panels: tuple[tuple[str, Callable[[dict[str, Any]], float | None], tuple[str, ...]], ...] = (
        ("time to first index (s)", first, ("iter",)),
        ("whole rank epoch (s)", _epoch_s, ("iter", "array")),
        ("peak memory growth (bytes; 0 drawn as 4 KiB)", growth, ("iter", "array")),
    )
    # One colour and marker per sampler on every panel; indices() is the dashed line.
    style = {key: ("os^Dv<>p"[i], f"C{i}") for i, (key, _, _, _) in enumerate(SAMPLERS)}
    for ax, (title, value, modes) in zip(axes, panels):
        for key, label, _, kind in SAMPLERS:
            if kind == "floor" and title.startswith("time to first"):
                continue
            for mode in modes:
                pts = sorted(
                    (c["n"], value(c), c.get("prefix"))
                    for c in cases
                    if c["sampler"] == key and c["mode"] == mode
                )
                pts = [p for p in pts if p[1] is not None]
                if not pts:
                    continue
                name = (
                    label
                    if len(modes) == 1 or mode == "iter" or key == "arange"
                    else f"{label} indices()"
                )
                line = ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    linestyle="--" if mode == "array" else "-",
                    marker=style[key][0],
                    color=style[key][1],
                    label=name,
                )[0]
                est = [p for p in pts if p[2] and value is _epoch_s]
                if est:
                    ax.plot(
                        [p[0] for p in est],
                        [p[1] for p in est],
                        linestyle="none",
                        marker=style[key][0],
                        markersize=11,
                        markerfacecolor="none",
                        color=line.get_color(),
                    )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (dataset length)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].annotate(
        "large hollow marker: extrapolated from a prefix",
        (0.02, 0.97),
        xycoords="axes fraction",
        va="top",
        fontsize=8,
    )
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=2,
        fontsize=9,
        frameon=False,
        columnspacing=1.0,
        handlelength=2.2,
    )
    meta = results["meta"]
    fig.suptitle(
        f"rank 0 of W={meta['world']}: fastshard and peers "
        f"({meta['machine']['cpu']}, {meta['machine']['cores']} cores)"
    )
    # room below the panels for the legend (up to 5 rows) and above them for the title
    fig.tight_layout(rect=(0, 0.075, 1, 0.985), h_pad=1.5)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
