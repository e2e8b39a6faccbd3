"""Mixtures of datasets: exact proportions in every window, sharded over ranks like a permutation."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset

from . import _core, _schedule, _state, _validate
from ._sampler import _ShardSampler
from ._weighted import _as_float64

# Real weights become integer units adding up to 2**63: a share is then exact to 2**-63.
_UNIT_TOTAL = 2**63


def _dataset_sizes(sizes: Any) -> list[int]:
    """The datasets' lengths: from ints, from datasets (their len()), or from a ConcatDataset."""
    if isinstance(sizes, ConcatDataset):
        sizes = sizes.datasets
    if isinstance(sizes, torch.Tensor):
        sizes = sizes.tolist()
    elif isinstance(sizes, np.ndarray):
        if sizes.ndim != 1:
            raise ValueError(f"sizes must be 1-D, got an array of shape {sizes.shape}")
        sizes = sizes.tolist()
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (list, tuple, range)):
        raise TypeError(
            "sizes must be a list or tuple of dataset lengths or of datasets, got "
            f"{type(sizes).__name__}"
        )
    if len(sizes) == 0:
        raise ValueError("sizes must not be empty: a mixture needs at least one dataset")
    out: list[int] = []
    for c, item in enumerate(sizes):
        name = f"sizes[{c}]"
        if isinstance(item, (bool, np.bool_)):
            raise TypeError(f"{name} must be a dataset length or a dataset, got bool")
        if isinstance(item, (int, np.integer)):
            n = int(item)
        elif hasattr(type(item), "__len__"):
            try:
                n = _validate.length(item)  # the datasets' own rule: lengths up to 2**63 - 1
            except (TypeError, ValueError) as err:
                raise type(err)(f"{name}: {err}") from err
        else:
            raise TypeError(
                f"{name} must be a dataset length (int) or a dataset (with __len__), got "
                f"{type(item).__name__}"
            )
        if n < 0:
            raise ValueError(f"{name} must be >= 0, got {n}")
        out.append(n)
    if sum(out) > _validate.MAX_LENGTH:
        raise ValueError(f"sizes must add up to less than 2**63, got {sum(out)}")
    return out


def _is_dataset(item: Any) -> bool:
    return hasattr(type(item), "__len__") and not isinstance(item, (str, bytes))


def _integer_weights(weights: Any) -> list[int] | None:
    """The weights as exact Python ints when they are given as integers (a list of ints,
    an integer array or tensor), else None: integers above 2**53 keep every digit."""
    if isinstance(weights, (list, tuple)):
        if weights and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
            for v in weights
        ):
            return [int(v) for v in weights]
        return None
    arr = weights.detach().cpu().numpy() if isinstance(weights, torch.Tensor) else weights
    if isinstance(arr, np.ndarray) and arr.dtype.kind in "iu" and arr.ndim == 1:
        return [int(v) for v in arr.tolist()]
    return None


def _mixture_weights(weights: Any, k: int) -> tuple[list[int] | list[float], list[int]]:
    """(the weights as given, for the state; their integer units for the C++ core).

    Integral weights adding up to at most 2**63 are their own units (exact shares); others
    are rounded to units adding up to 2**63 by largest remainders, in exact arithmetic.
    Weights given as integers are exact at any size; others are read as float64.
    """
    ints = _integer_weights(weights)
    # One weight per dataset: k is small, so plain Python numbers beat NumPy calls here.
    w: list[Any] = ints if ints is not None else _as_float64(weights).tolist()
    if len(w) != k:
        raise ValueError(
            f"weights must have one entry per dataset: got {len(w)} weights for {k} sizes"
        )
    for c, v in enumerate(w):
        if not ((isinstance(v, int) or math.isfinite(v)) and v >= 0):
            what = "NaN" if math.isnan(v) else ("infinite" if math.isinf(v) else "negative")
            raise ValueError(f"weights[{c}] = {v!r} is {what}; weights must be finite and >= 0")
    if not any(v > 0 for v in w):
        raise ValueError("weights are all zero; at least one must be positive")
    integral = ints is not None or all(v == math.floor(v) for v in w)
    values: list[int] | list[float] = [int(v) for v in w] if integral else w
    if integral and sum(values) <= _UNIT_TOTAL:
        return values, [int(v) for v in values]
    # Exact integers: every float is a / 2**e, so over the largest denominator the weights
    # are integers A_c; unit c is A_c * 2**63 / sum(A), rounded by largest remainders.
    ratios = [(v, 1) if isinstance(v, int) else float(v).as_integer_ratio() for v in values]
    denominator = max(b for _, b in ratios)
    numerators = [a * (denominator // b) for a, b in ratios]
    total = sum(numerators)
    units = [a * _UNIT_TOTAL // total for a in numerators]
    remainders = [a * _UNIT_TOTAL % total for a in numerators]
    short = _UNIT_TOTAL - sum(units)
    for c in sorted(range(k), key=lambda c: (-remainders[c], c))[:short]:
        units[c] += 1
    for c in range(k):
        if w[c] > 0 and units[c] == 0:
            raise ValueError(
                f"weights[{c}] = {w[c]!r} is positive but below 2**-63 of the weights' sum: it "
                "would never be drawn; set it to 0 or raise it"
            )
    return values, units


class MixtureSampler(_ShardSampler):
    """A mixture of datasets at fixed proportions, for distributed training, at any size.

    Indices address :class:`torch.utils.data.ConcatDataset` of the datasets: item ``i`` of
    dataset ``c`` is ``offsets[c] + i``. The epoch is a global sequence of ``num_samples``
    draws; rank ``r`` of ``W`` takes draws ``r, r + W, ...`` with torch's lengths and
    padding, so the first draws are the same for any number of ranks, and random access,
    ``indices()``, :class:`BatchSampler` and (elastic) resume work as for
    :class:`DistributedSampler`.

    Proportions: the epoch is cut into ``ceil(num_samples / period)`` windows of about
    ``period`` draws (as equal as possible). At every window boundary ``t`` each dataset's
    count of draws so far is ``t * p_c`` rounded by largest remainders: within 1 of its
    target (strictly), where ``p_c`` is the weight's share (exact for integer weights and
    for shares that are multiples of ``2**-63``; otherwise rounded to ``2**-63``). So a
    window holds each dataset within 2 of ``period * p_c`` times. Within a window the
    datasets are interleaved in a keyed random order, a fresh one per window, epoch and seed.

    Inside a dataset: its ``d_c`` draws of an epoch (``per_epoch[c]``, the same every epoch)
    walk whole passes over it, each in a fresh keyed random order, then ``d_c mod n_c``
    draws of one more; so within an epoch every item is drawn ``floor(d_c / n_c)`` or
    ``ceil(d_c / n_c)`` times: an upsampled dataset is cycled through whole before any item
    repeats, a downsampled one takes a different part each epoch. Epochs continue where the
    last stopped: the partial passes of ``E = n_c // (d_c mod n_c)`` consecutive epochs
    (from epoch 0, E, 2E, ...) take disjoint parts of one random order, so no item repeats
    across them before the dataset is covered.

    Cost: O(1) time per draw (O(k) per window for the counts of k datasets), O(k) memory
    per rank, nothing proportional to the sizes or to ``num_samples``.

    Parameters
    ----------
    sizes : sequence of int or of datasets, or a ConcatDataset
        The k >= 1 datasets' lengths (or the datasets, whose ``len()`` is read); their sum
        below ``2**63``.
    weights : sequence of float or of int
        k finite, non-negative proportions with a positive sum (need not add up to 1). A
        dataset of length 0 must have weight 0. Integers (Python ints, an integer array or
        tensor) are exact at any size; other weights are read as float64.
    num_samples : int, optional
        The epoch's global number of draws (default: the sum of the sizes). The attribute
        ``num_samples`` is, as for :class:`DistributedSampler`, this rank's count; the global
        one is ``num_draws``.
    num_replicas, rank, seed, drop_last
        As for :class:`DistributedSampler` (``seed=None``: a random seed drawn on rank 0 and
        broadcast; needs a process group). ``drop_last`` drops the tail of each pass (the
        epoch, or its rest after a resume) so that it divides over the ranks: resumed on
        another number of ranks, fewer than that number of the unconsumed draws are dropped.
    pad : bool
        ``False`` (with ``drop_last=False``): no repeated draws; every draw of the epoch
        exactly once, rank counts differ by at most one (for evaluation, and for a resume on
        another number of ranks that makes every unconsumed draw exactly once).
    period : int, optional
        Draws per window (default 1024, or ``2 * ceil(1 / p_min)`` when the smallest positive
        share ``p_min`` is below ``1/512``). A period whose windows would give a dataset a
        target below one draw is refused (its counts could not stay monotone).
    check_consistency, auto_epoch
        As for :class:`DistributedSampler`; the check covers the sizes and weights.
    schedule : sequence of (int, sequence of weights), keyword only
        Instead of ``weights``: proportions that change over training, as points
        ``(draw, weights)`` in global draws (draw ``j`` of epoch ``e`` is global draw
        ``e * num_samples + j``), the first at draw 0. Between two points the shares move
        linearly; two points at one draw make a step; after the last point they stay. At
        every window boundary each dataset's count is within 1 of the exact integral of its
        share, and a change of weights never restarts a dataset's pass (a weight of 0
        pauses it). Guide: docs/mixtures.md.

    Raises
    ------
    TypeError
        Neither or both of ``weights`` and ``schedule``; weights or sizes of the wrong type.
    ValueError
        Negative, non-finite or all-zero weights (at a point of a schedule: the point is
        named), a dataset of length 0 with a positive weight, points out of order, or a
        ``period`` too short for the smallest share.
    RuntimeError
        A schedule whose counts cannot stay within 1 of its integral and monotone (several
        datasets ramping through 0 within a few windows of each other): the draw is named.
    fastshard.InconsistentRanksError
        At the start of an iteration, on every rank, when the ranks disagree.

    Examples
    --------
    Two datasets of 100 and 50 items at 3 : 1, eight draws per epoch:

    >>> mix = fastshard.MixtureSampler(
    ...     [100, 50], [3, 1], num_samples=8, num_replicas=1, rank=0
    ... )
    >>> mix.per_epoch  # exact counts per dataset
    [6, 2]
    >>> sum(1 for i in mix if i >= 100)  # indices >= 100 are the second dataset's
    2

    A curriculum: only the first dataset for 1000 draws, then a ramp to 1 : 1 by draw 2000:

    >>> curriculum = fastshard.MixtureSampler(
    ...     [100, 50],
    ...     schedule=[(0, [1, 0]), (1000, [1, 0]), (2000, [1, 1])],
    ...     num_samples=1000, num_replicas=1, rank=0,
    ... )
    >>> curriculum.counts(1000), curriculum.counts(2000)
    ([1000, 0], [1750, 250])
    """

    weights: list[int] | list[float] | None
    schedule: list[tuple[int, list[Any]]] | None

    def __init__(
        self,
        sizes: Any,
        weights: Any = None,
        num_samples: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int | None = 0,
        drop_last: bool = False,
        *,
        schedule: Any = None,
        period: int | None = None,
        pad: bool = True,
        check_consistency: bool = True,
        auto_epoch: bool = False,
    ) -> None:
        self.sizes = _dataset_sizes(sizes)
        k = len(self.sizes)
        if (weights is None) == (schedule is None):
            raise TypeError(
                "MixtureSampler needs exactly one of weights (fixed proportions) and schedule "
                "(proportions that change over training), got "
                + ("neither" if weights is None else "both")
            )
        total = sum(self.sizes)
        if num_samples is None:
            draws = total
        else:
            draws = _validate.integer(num_samples, "num_samples")
            if not 1 <= draws <= _validate.MAX_LENGTH:
                raise ValueError(f"num_samples must be in [1, 2**63 - 1], got {draws}")
        if period is not None:
            period = _validate.integer(period, "period")
            if not 1 <= period <= _validate.MAX_LENGTH:
                raise ValueError(f"period must be in [1, 2**63 - 1], got {period}")
        self.num_draws = draws
        self._spec_cache: Any = None
        self._sched_cache: Any = None
        # Where the draws' streams start (None: a fixed-weight mixture that keeps its per-epoch
        # order); set by a schedule, or by load_state_dict(..., reweight=True).
        self._anchor: dict[str, Any] | None = None
        if schedule is None:
            self.weights, self._units = _mixture_weights(weights, k)
            self.schedule = None
            # The C++ spec checks the rest (an empty dataset with a positive weight, a period
            # too short for the smallest share) and settles the default period.
            self._spec_cache = _core.MixtureSpec(self.sizes, self._units, draws, period or 0)
            self.period = int(self._spec_cache.period)
        else:
            points, at, units, unit_total = _schedule.parse(schedule, k, _mixture_weights)
            _schedule.check_sizes(at, units, self.sizes)
            self.weights = None
            self.schedule = points
            self._points = (at, units, unit_total)
            self._anchor = _fresh_anchor(k)
            self.period = int(self._build_schedule(period or 0, 0).period)
        # torch's DistributedSampler has a `dataset`: the ConcatDataset the indices address
        # when the sampler was given one, else the concatenation's items as a lazy range.
        self.dataset = (
            sizes
            if isinstance(sizes, ConcatDataset)
            else ConcatDataset(sizes)
            if isinstance(sizes, (list, tuple)) and all(_is_dataset(d) for d in sizes)
            else range(total)
        )
        self.shuffle = True
        self.pad = _validate.flag(pad, "pad")
        self._set_shared_arguments(
            num_replicas, rank, seed, drop_last, check_consistency, auto_epoch
        )
        self._start_pass()

    # -- the compiled descriptions -------------------------------------------------------------
    def _schedule_points(self) -> tuple[list[int], list[int], int]:
        """(draws, units point-major, unit total): the schedule's, or one point of the fixed
        weights."""
        if self.schedule is not None:
            at, units, total = self._points
            return at, units, total
        return [0], list(self._units), sum(self._units)

    def _build_schedule(self, period: int, seed: int) -> Any:
        at, units, total = self._schedule_points()
        anchor = self._anchor
        assert anchor is not None
        k = len(self.sizes)
        held = _schedule.held_values(at, units, total, k, anchor["draw"], anchor["counts"])
        return _core.MixtureSchedule(
            self.sizes,
            at,
            units,
            total,
            self.num_draws,
            period,
            seed,
            anchor["draw"],
            anchor["counts"],
            [tuple(s) for s in anchor["starts"]],
            held,
        )

    @property
    def _spec(self) -> Any:
        spec = self._spec_cache
        if spec is None:  # after unpickling
            spec = self._spec_cache = _core.MixtureSpec(
                self.sizes, self._units, self.num_draws, self.period
            )
        return spec

    @property
    def _sched(self) -> Any:
        sched = self._sched_cache
        if sched is None:
            sched = self._sched_cache = self._build_schedule(self.period, self.seed % 2**64)
        return sched

    @property
    def _bridge(self) -> Any:
        """The mixture this run drew from before it took new weights, for the rest of the
        window it took them in (None when there is none)."""
        bridge = None if self._anchor is None else self._anchor.get("bridge")
        if bridge is None:
            return None
        cached = self.__dict__.get("_bridge_cache")
        if cached is None:
            old = _sampler_from_config(bridge["config"], bridge["anchor"])
            if old._anchor is None:
                cached = _core.MixtureBridge.fixed(old._spec, old.seed % 2**64, bridge["from"])
            else:
                cached = _core.MixtureBridge.scheduled(old._sched, old._bridge, bridge["from"])
            self.__dict__["_bridge_cache"] = cached
        return cached

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_spec_cache"] = None  # compiled objects: rebuilt from the fields
        state["_sched_cache"] = None
        state.pop("_bridge_cache", None)
        return state

    @property
    def offsets(self) -> list[int]:
        """``offsets[c]``: the index of dataset c's first item in the concatenation (k + 1
        values; the last is the total length)."""
        out = [0]
        for n in self.sizes:
            out.append(out[-1] + n)
        return out

    @property
    def per_epoch(self) -> list[int]:
        """Each dataset's number of draws in the current epoch (over all ranks, before padding);
        with fixed weights the same every epoch. With a schedule, or after new weights, counted
        from where the run took them when that is inside this epoch."""
        if self._anchor is None:
            return list(self._spec.per_epoch)
        sched = self._sched
        n = self.num_draws
        lo = max(self.epoch * n, sched.anchor)
        a, b = sched.counts_at(lo), sched.counts_at((self.epoch + 1) * n)
        return [y - x for x, y in zip(a, b)]

    def counts(self, draw: int) -> list[int]:
        """Each dataset's draws among the first ``draw`` global draws (draw ``j`` of epoch ``e``
        is global draw ``e * num_samples + j``), counted from the start of training, or from
        where the run took new weights (``load_state_dict(..., reweight=True)``), which keeps
        the counts it had there. Only for a schedule, or after new weights."""
        if self._anchor is None:
            raise ValueError(
                "counts() is for mixtures with a schedule (or resumed with new weights); a "
                "fixed-weight mixture has per_epoch"
            )
        # global draws are counted below 2**63 (epoch * num_samples + j)
        draw = _validate.in_range(draw, "draw", 0, _validate.MAX_LENGTH)
        return list(self._sched.counts_at(draw))

    # -- the epoch's shard ---------------------------------------------------------------------
    def _check_epoch(self, epoch: int) -> None:
        if self._anchor is None:
            return
        n = self.num_draws
        if not 0 <= epoch <= _validate.MAX_LENGTH // n - 3:
            raise ValueError(
                f"epoch must be in [0, {_validate.MAX_LENGTH // n - 3}] for a mixture with a "
                "schedule, which counts draws across epochs (epoch * num_samples + j) below "
                f"2**63, got {epoch}"
            )
        if (epoch + 1) * n <= self._anchor["draw"] and not (
            self._resume_pending and epoch == self.epoch
        ):
            raise ValueError(
                f"epoch {epoch} ended before global draw {self._anchor['draw']}, where this run "
                "took new weights (load_state_dict(..., reweight=True)); its draws are gone"
            )

    def set_epoch(self, epoch: int) -> None:
        epoch = _validate.integer(epoch, "epoch")
        self._check_epoch(epoch)
        super().set_epoch(epoch)

    set_epoch.__doc__ = _ShardSampler.set_epoch.__doc__

    def _plan_args(self) -> tuple[int, bool, bool]:
        return self.num_draws, self.drop_last, self.pad

    def _make_shard(self, cursor: int) -> _core.Shard:
        if self._anchor is not None:
            return _core.schedule_shard(
                self._sched,
                self.num_replicas,
                self.rank,
                self.drop_last,
                self.pad,
                cursor,
                self.epoch,
                self._bridge,
            )
        return _core.mixture_shard(
            self._spec,
            self.num_replicas,
            self.rank,
            self.drop_last,
            self.pad,
            cursor,
            self.seed % 2**64,
            self.epoch % 2**64,
        )

    # -- checkpoints ---------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"sizes": list(self.sizes)}
        if self.schedule is None:
            config["weights"] = list(self.weights or [])
        else:
            config["schedule"] = [[g, list(w)] for g, w in self.schedule]
        config.update(
            num_samples=self.num_draws,
            period=self.period,
            seed=self.seed % 2**64,
            drop_last=self.drop_last,
            pad=self.pad,
        )
        return config

    def _resume_point(self) -> dict[str, Any]:
        point = super()._resume_point()
        if self._anchor is not None:
            a = self._anchor
            starts = (x for s in a["starts"] for x in s)
            point["anchor"] = [a["draw"], *a["counts"], *starts, repr(a.get("bridge"))]
        return point

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        state = super().state_dict(consumed)
        if self._anchor is not None:
            a = self._anchor
            bridge = a.get("bridge")
            if (
                bridge is not None
                and state["epoch"] * self.num_draws + state["cursor"] >= a["draw"]
            ):
                bridge = None  # the rest of the window it covered is consumed
            state["anchor"] = {
                "draw": a["draw"],
                "counts": list(a["counts"]),
                "starts": [list(s) for s in a["starts"]],
                "bridge": bridge,
            }
        return state

    state_dict.__doc__ = _ShardSampler.state_dict.__doc__

    def load_state_dict(self, state: dict[str, Any], *, reweight: bool = False) -> None:
        """Resume from a state saved by any rank, on any number of ranks.

        Without ``reweight``: as for :class:`DistributedSampler`; a state saved with other
        sizes, weights, schedule, num_samples, period, seed, drop_last or pad is refused.

        ``reweight=True``: continue a run under this sampler's weights (or schedule) from the
        saved cursor on. Each dataset continues the pass it stood in when the state was saved;
        datasets that this sampler adds after the state's (``sizes`` may gain datasets at the
        end) start their first pass. The state may come from fixed weights or a schedule, on
        any number of ranks; ``num_samples``, ``seed``, ``drop_last``, ``pad`` and the sizes of
        the state's datasets must match. A state of the same configuration resumes exactly as
        without ``reweight``. Nothing is applied unless the whole state is accepted.
        """
        reweight = _validate.flag(reweight, "reweight")
        if not reweight or _same_config(state, self._config()):
            epoch, cursor, _ = _state.check(state, self._config())
            anchor = _read_anchor(state, len(self.sizes), self.sizes)
            if anchor is None and self.schedule is not None:
                raise ValueError(
                    "state has no 'anchor': it was not saved by a mixture with a schedule"
                )
        else:
            epoch, cursor, anchor = self._reweighted(state)
        # A fixed-weight run without an anchor keeps its per-epoch order.
        self._anchor = anchor
        self._sched_cache = None
        self.__dict__.pop("_bridge_cache", None)
        self._start_pass(epoch, cursor, resumed=True)

    def _reweighted(self, state: Any) -> tuple[int, int, dict[str, Any]]:
        """(epoch, cursor, anchor) where every dataset of ``state`` stands, for this sampler."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        if "sizes" not in state or not ("weights" in state or "schedule" in state):
            raise ValueError(
                "state is not a MixtureSampler state (no sizes and weights or schedule)"
            )
        old_sizes = state["sizes"]
        if not isinstance(old_sizes, list) or not all(type(n) is int for n in old_sizes):
            raise TypeError("state['sizes'] must be a list of ints")
        k, k0 = len(self.sizes), len(old_sizes)
        if k0 > k or self.sizes[:k0] != old_sizes:
            raise ValueError(
                f"state was saved with sizes={old_sizes}, which this sampler's sizes={self.sizes} do "
                "not continue: with reweight=True the state's datasets must keep their sizes and "
                "order (new datasets may follow them)"
            )
        # Everything but the weights must match; read the state against a config of its own.
        old = _sampler_from_state(state, self)
        epoch, cursor, _ = _state.check(state, old._config())
        for key in ("num_samples", "seed", "drop_last", "pad"):
            if state[key] != self._config()[key]:
                raise ValueError(
                    f"state was saved with {key}={state[key]!r} but this sampler has "
                    f"{key}={self._config()[key]!r}; reweight=True changes only the weights"
                )
        n = self.num_draws
        if old._anchor is not None:
            old._check_epoch(epoch)
        g = epoch * n + min(cursor, n)
        # The rest of the window the cursor is in is drawn as the saved run would have: its
        # draws there are slots of a keyed interleave, so only at a window boundary is every
        # dataset's draws so far a prefix of its stream.
        switch = _next_boundary(old, g)
        if old._anchor is None:
            e_s, j_s = divmod(switch, n)
            if j_s == 0 and switch > 0:
                e_s, j_s = e_s - 1, n
            counts, starts = _core.mixture_stand(old._spec, old.seed % 2**64, e_s, j_s)
            counts = [e_s * d + x for d, x in zip(old._spec.per_epoch, counts)]
        else:
            counts = old._sched.counts_at(switch)
            taken = [x - a for x, a in zip(counts, old._anchor["counts"])]
            previous = [(s[0], s[1], s[2], s[3]) for s in old._anchor["starts"]]
            starts = _schedule.advance(previous, taken)
        counts = list(counts) + [0] * (k - k0)
        starts = list(starts) + [(0, 0, 0, 0)] * (k - k0)
        bridge = None
        if switch > g:
            bridge = {"from": g, "config": old._config(), "anchor": _anchor_json(old._anchor)}
        anchor = {
            "draw": switch,
            "counts": counts,
            "starts": [list(s) for s in starts],
            "bridge": bridge,
        }
        # Build the new description now, so that an anchor inside one of the new ramps (or any
        # other refusal) leaves this sampler unchanged.
        saved, self._anchor = self._anchor, anchor
        try:
            self._build_schedule(self.period, self.seed % 2**64)
            self.__dict__.pop("_bridge_cache", None)
            self._bridge  # noqa: B018 - builds the bridge now, so that a bad one is refused here
        finally:
            self._anchor = saved
            self.__dict__.pop("_bridge_cache", None)
        return epoch, cursor, anchor

    def __repr__(self) -> str:
        what = (
            f"weights={self.weights}"
            if self.schedule is None
            else f"schedule=<{len(self.schedule)} points>"
        )
        return (
            f"{type(self).__name__}(sizes={self.sizes}, {what}, "
            f"num_samples={self.num_draws}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"seed={self.seed}, epoch={self.epoch}, drop_last={self.drop_last}, "
            f"period={self.period}, pad={self.pad})"
        )


def _fresh_anchor(k: int) -> dict[str, Any]:
    return {
        "draw": 0,
        "counts": [0] * k,
        "starts": [[0, 0, 0, 0] for _ in range(k)],
        "bridge": None,
    }


def _anchor_json(anchor: dict[str, Any] | None) -> dict[str, Any] | None:
    if anchor is None:
        return None
    return {
        "draw": anchor["draw"],
        "counts": list(anchor["counts"]),
        "starts": [list(s) for s in anchor["starts"]],
        "bridge": anchor.get("bridge"),
    }


def _next_boundary(old: MixtureSampler, g: int) -> int:
    """The first boundary of ``old``'s windows at or after global draw g."""
    n = old.num_draws
    e, j = divmod(g, n)
    if j == 0:
        return g
    if old._anchor is None:
        spec = old._spec
        m = spec.window_of(j)
        return g if spec.boundary(m) == j else e * n + int(spec.boundary(m + 1))
    sched = old._sched
    if g <= sched.anchor:
        return int(sched.anchor)
    i = e * sched.windows + sched.window_of(j)
    begin = max(sched.boundary_draw(i), sched.anchor)
    return g if g == begin else int(sched.boundary_draw(i + 1))


def _same_config(state: Any, config: dict[str, Any]) -> bool:
    return isinstance(state, dict) and all(
        key in state and state[key] == value and type(state[key]) is type(value)
        for key, value in config.items()
    )


def _read_anchor(state: dict[str, Any], k: int, sizes: list[int]) -> dict[str, Any] | None:
    """The state's anchor, checked, or None when it has none (a fixed-weight mixture's)."""
    anchor = state.get("anchor")
    if anchor is None:
        return None
    if not isinstance(anchor, dict) or not {"draw", "counts", "starts"} <= set(anchor) <= {
        "draw",
        "counts",
        "starts",
        "bridge",
    }:
        raise ValueError("state['anchor'] must be a dict with keys draw, counts, starts and bridge")
    draw, counts, starts = anchor["draw"], anchor["counts"], anchor["starts"]
    bridge = anchor.get("bridge")
    if bridge is not None:
        if (
            not isinstance(bridge, dict)
            or set(bridge) != {"from", "config", "anchor"}
            or type(bridge["from"]) is not int
            or not 0 <= bridge["from"] <= draw
            or not isinstance(bridge["config"], dict)
        ):
            raise ValueError(
                "state['anchor']['bridge'] must be None or a dict with from (a draw before the "
                "anchor), config and anchor"
            )
        try:
            _sampler_from_config(bridge["config"], bridge["anchor"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"state['anchor']['bridge'] is not a valid mixture: {err}") from None
    ok = (
        type(draw) is int
        and 0 <= draw <= _validate.MAX_LENGTH
        and isinstance(counts, list)
        and len(counts) == k
        and all(type(x) is int and 0 <= x <= _validate.MAX_LENGTH for x in counts)
        and isinstance(starts, list)
        and len(starts) == k
        and all(
            isinstance(s, list)
            and len(s) == 4
            and all(type(x) is int and 0 <= x < 2**64 for x in s)
            and (s[2] == 0 or s[1] + s[2] <= sizes[c])
            for c, s in enumerate(starts)
        )
    )
    if not ok:
        raise ValueError(
            "state['anchor'] is malformed: draw is an int, counts one int per dataset, starts one "
            "[key, from, len, base] per dataset inside its dataset"
        )
    return {
        "draw": draw,
        "counts": list(counts),
        "starts": [list(s) for s in starts],
        "bridge": bridge,
    }


def _sampler_from_state(state: dict[str, Any], like: MixtureSampler) -> MixtureSampler:
    """The sampler that saved ``state`` (rank 0 of 1, no process group), to read where its
    datasets stood."""
    del like
    return _sampler_from_config(state, state.get("anchor"), in_state=True)


def _sampler_from_config(
    config: dict[str, Any], anchor: Any, in_state: bool = False
) -> MixtureSampler:
    kw: dict[str, Any] = dict(
        num_samples=config.get("num_samples"),
        num_replicas=1,
        rank=0,
        seed=config.get("seed", 0),
        drop_last=config.get("drop_last", False),
        period=config.get("period"),
        pad=config.get("pad", True),
        check_consistency=False,
    )
    try:
        if "schedule" in config:
            old = MixtureSampler(config["sizes"], schedule=config["schedule"], **kw)
        else:
            old = MixtureSampler(config["sizes"], config["weights"], **kw)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"state does not describe a valid mixture: {err}") from None
    read = _read_anchor({"anchor": anchor}, len(old.sizes), old.sizes)
    if read is not None:
        old._anchor = read
    elif old.schedule is not None:
        raise ValueError("state has no 'anchor': it was not saved by a mixture with a schedule")
    del in_state
    return old
