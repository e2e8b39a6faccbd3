"""Units of the bench: counts and byte sizes parsed from the command line, and formatted."""

from __future__ import annotations

import argparse
import decimal

_MiB = 2**20
_GiB = 2**30


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def _fmt_bytes(b: float | None) -> str:
    if b is None:
        return "—"
    if b < _GiB:
        return f"{b / _MiB:.1f} MiB"
    return f"{b / _GiB:.2f} GiB"


def _fmt_n(n: int) -> str:
    mant, exp = f"{n:.1e}".split("e")
    mant = mant.rstrip("0").rstrip(".")
    text = f"{mant}e{int(exp)}"
    return text if float(text) == n else f"{n:,}"


def parse_count(text: str) -> int:
    """``"1e9"``, ``"1_000_000"`` or ``"2.5e7"`` as an exact positive int."""
    try:
        value = decimal.Decimal(text.replace("_", ""))
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value != value.to_integral_value() or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(value)


def parse_count_or_zero(text: str) -> int:
    """``parse_count``, or 0 (for options where 0 turns a part of the run off)."""
    return 0 if text.strip() == "0" else parse_count(text)


def parse_bytes(text: str) -> int:
    """``"6GiB"``, ``"6G"``, ``"500MiB"`` or a plain number of bytes."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = units.get(t[-1:], 1)
    if scale != 1:
        t = t[:-1]
    try:
        return int(decimal.Decimal(t) * scale)
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r}") from None
