"""``python -m fastshard bench``: fastshard beside torch, torchdata and grain on one machine.

Every measurement runs in a fresh child process, so that its peak memory is its own.

Modules
-------
cli
    the subcommand's options and ``main``.
runner
    plans the cases (sizes, samplers, predictions from smaller runs) and runs each one.
harness
    the child-process harness: ``run_case`` starts a child with a watchdog on its memory and
    time; ``measure`` is the child's body, which reads its peak memory from VmHWM.
adapters
    the samplers a case can measure, each behind a small adapter.
table, plot
    the Markdown report and the plot.
weighted
    weighted sampling beside torch's WeightedRandomSampler.
units
    counts and byte sizes, parsed and formatted.

No module here imports fastshard or a peer at module level: each child loads this folder as a
standalone package (without this ``__init__``) and imports only what its measurement needs.
"""

from __future__ import annotations

from .cli import add_arguments, main
from .harness import measure, run_case
from .plot import plot
from .runner import available_samplers, run_bench
from .table import core_targets, render, render_targets
from .units import parse_bytes, parse_count
from .weighted import render_weighted, run_weighted

__all__ = [
    "add_arguments",
    "available_samplers",
    "core_targets",
    "main",
    "measure",
    "parse_bytes",
    "parse_count",
    "plot",
    "render",
    "render_targets",
    "render_weighted",
    "run_bench",
    "run_case",
    "run_weighted",
]
