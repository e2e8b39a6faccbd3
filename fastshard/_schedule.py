"""Mixture schedules: weights as a function of global draws, turned into the exact integer units,
anchor and held values that the C++ core (csrc/fastshard/schedule.hpp) works with."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from . import _validate

# Real weights become integer units adding up to 2**63: a share is then exact to 2**-63.
UNIT_TOTAL = 2**63

Point = tuple[int, list[Any]]  # (global draw, weights as given)


def parse(schedule: Any, k: int, weights_of: Any) -> tuple[list[Point], list[int], list[int], int]:
    """Validate a schedule of ``(draw, weights)`` points for k datasets.

    Returns (the points as given, their draws, their units point-major, the unit total).
    ``weights_of(weights, k)`` turns one point's weights into (values, units) and raises naming
    ``weights``; its messages are re-raised naming the point.
    """
    if isinstance(schedule, (str, bytes, dict)) or not hasattr(schedule, "__iter__"):
        raise TypeError(
            "schedule must be a sequence of (draw, weights) points, e.g. "
            f"[(0, [0.7, 0.3]), (10_000, [0.5, 0.5])], got {type(schedule).__name__}"
        )
    items = list(schedule)
    if not items:
        raise ValueError("schedule must have at least one point")
    points: list[Point] = []
    draws: list[int] = []
    per_point: list[tuple[list[Any], list[int]]] = []
    for i, item in enumerate(items):
        name = f"schedule[{i}]"
        if isinstance(item, (str, bytes)) or not hasattr(item, "__len__") or len(item) != 2:
            raise TypeError(f"{name} must be a (draw, weights) pair, got {item!r}")
        at, weights = item
        try:
            g = _validate.integer(at, f"{name}'s draw")
        except TypeError as err:
            raise TypeError(str(err)) from None
        if not 0 <= g <= _validate.MAX_LENGTH:
            raise ValueError(f"{name}'s draw must be in [0, 2**63 - 1], got {g}")
        if i == 0 and g != 0:
            raise ValueError(f"schedule[0] must be at draw 0 (the start of training), got draw {g}")
        if i > 0 and g < draws[-1]:
            raise ValueError(
                f"{name} is at draw {g}, before schedule[{i - 1}] at draw {draws[-1]}: the points' "
                "draws must not decrease"
            )
        if i > 1 and g == draws[-2]:
            raise ValueError(
                f"{name} is the third point at draw {g}: a draw holds at most two points (a step)"
            )
        try:
            values, units = weights_of(weights, k)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{name}: {err}") from None
        points.append((g, list(values)))
        draws.append(g)
        per_point.append((list(values), units))
    totals = {sum(u) for _, u in per_point}
    if len(totals) == 1:
        total = totals.pop()
        flat = [u for _, units in per_point for u in units]
        return points, draws, flat, total
    lcm = math.lcm(*totals)
    if lcm <= UNIT_TOTAL:
        flat = [u * (lcm // sum(units)) for _, units in per_point for u in units]
        return points, draws, flat, lcm
    # Exact shares rounded to 2**63 per point, by largest remainders.
    flat = []
    for i, (values, _) in enumerate(per_point):
        shares = [Fraction(v) for v in values]
        s = sum(shares)
        exact = [x / s * UNIT_TOTAL for x in shares]
        units = [math.floor(x) for x in exact]
        short = UNIT_TOTAL - sum(units)
        for c in sorted(range(k), key=lambda c: (-(exact[c] - units[c]), c))[:short]:
            units[c] += 1
        for c in range(k):
            if shares[c] > 0 and units[c] == 0:
                raise ValueError(
                    f"schedule[{i}]: weights[{c}] = {values[c]!r} is positive but below 2**-63 of "
                    "the point's sum: it would never be drawn; set it to 0 or raise it"
                )
        flat.extend(units)
    return points, draws, flat, UNIT_TOTAL


def check_sizes(draws: list[int], units: list[int], sizes: list[int]) -> None:
    k = len(sizes)
    for i in range(len(draws)):
        for c in range(k):
            if units[i * k + c] and sizes[c] == 0:
                raise ValueError(
                    f"schedule[{i}]: dataset {c} is empty (sizes[{c}] = 0) but its weight is positive"
                )


def integral(
    draws: list[int], units: list[int], total: int, k: int, anchor: int, counts: list[int], g: int
) -> list[Fraction]:
    """Each dataset's exact target at global draw g >= anchor: its count at the anchor plus the
    integral of its share over [anchor, g] (units move linearly between points)."""
    out = [Fraction(a) for a in counts]
    for i, start in enumerate(draws):
        end = draws[i + 1] if i + 1 < len(draws) else None
        lo = max(start, anchor)
        hi = g if end is None else min(end, g)
        if hi <= lo:
            continue
        length = 1 if end is None else end - start
        for c in range(k):
            u0 = units[i * k + c]
            u1 = u0 if end is None else units[(i + 1) * k + c]
            at_lo = u0 + Fraction((u1 - u0) * (lo - start), length)
            at_hi = u0 + Fraction((u1 - u0) * (hi - start), length)
            out[c] += (at_lo + at_hi) * (hi - lo) / (2 * total)
    return out


def held_values(
    draws: list[int], units: list[int], total: int, k: int, anchor: int, counts: list[int]
) -> list[list[tuple[int, int]]]:
    """The count each paused dataset is held at while its target stays in [n, n + 1).

    A dataset pauses where its units reach 0 and stay 0, until they are positive again. The
    datasets that pause at one draw are rounded together (systematically, in dataset order),
    starting from the rounding error of those still paused from earlier points, so that all
    the paused datasets together are off their targets by at most 1/2 there and the others
    can make up the difference within one draw each.
    """
    runs: dict[int, list[tuple[int, Fraction, int | None]]] = {}  # start -> (c, target, end)
    for c in range(k):
        for i, start in enumerate(draws):
            u = units[i * k + c]
            stays = i + 1 == len(draws) or units[(i + 1) * k + c] == 0
            before = i > 0 and (units[(i - 1) * k + c] > 0)
            if u != 0 or not stays or not before or start <= anchor:
                continue
            target = integral(draws, units, total, k, anchor, counts, start)[c]
            if target.denominator == 1:
                continue
            end = next((draws[j] for j in range(i + 1, len(draws)) if units[j * k + c] > 0), None)
            runs.setdefault(start, []).append((c, target, end))
    held: list[dict[int, int]] = [{} for _ in range(k)]
    paused: list[tuple[int, Fraction, int | None, int]] = []  # (c, target, end, value)
    for start in sorted(runs):
        paused = [p for p in paused if p[2] is None or p[2] > start]
        error = sum((t - v for _, t, _, v in paused), Fraction(0))
        acc = error - math.floor(error + Fraction(1, 2))
        for c, target, end in sorted(runs[start], key=lambda r: r[0]):
            below = math.floor(acc + Fraction(1, 2))
            acc += target
            n = math.floor(target)
            value = held[c].setdefault(n, math.floor(acc + Fraction(1, 2)) - below)
            paused.append((c, target, end, value))
    return [sorted(h.items()) for h in held]


def advance(
    starts: list[tuple[int, int, int, int]], taken: list[int]
) -> list[tuple[int, int, int, int]]:
    """Stream starts after each dataset drew taken[c] more: the rest of its lead, or its global
    pass ordinal."""
    out = []
    for (key, frm, length, base), x in zip(starts, taken):
        if x < length:
            out.append((key, frm + x, length - x, base))
        else:
            out.append((0, 0, 0, base + x - length))
    return out
