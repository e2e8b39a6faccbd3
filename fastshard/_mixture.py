"""Mixtures of datasets: exact proportions in every window, sharded over ranks like a permutation."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset

from . import _core, _validate
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
    """

    def __init__(
        self,
        sizes: Any,
        weights: Any,
        num_samples: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int | None = 0,
        drop_last: bool = False,
        *,
        period: int | None = None,
        pad: bool = True,
        check_consistency: bool = True,
        auto_epoch: bool = False,
    ) -> None:
        self.sizes = _dataset_sizes(sizes)
        self.weights, self._units = _mixture_weights(weights, len(self.sizes))
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
        # The C++ spec checks the rest (an empty dataset with a positive weight, a period
        # too short for the smallest share) and settles the default period.
        self._spec_cache: Any = _core.MixtureSpec(self.sizes, self._units, draws, period or 0)
        self.period = int(self._spec_cache.period)
        self.num_draws = draws
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

    @property
    def _spec(self) -> Any:
        spec = self._spec_cache
        if spec is None:  # after unpickling
            spec = self._spec_cache = _core.MixtureSpec(
                self.sizes, self._units, self.num_draws, self.period
            )
        return spec

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_spec_cache"] = None  # a compiled object: rebuilt from the fields
        return state

    @property
    def offsets(self) -> list[int]:
        """``offsets[c]``: the index of dataset c's first item in the concatenation (k + 1
        values; the last is the total length)."""
        return list(self._spec.offsets)

    @property
    def per_epoch(self) -> list[int]:
        """Each dataset's number of draws per epoch (over all ranks, before padding)."""
        return list(self._spec.per_epoch)

    def _plan_args(self) -> tuple[int, bool, bool]:
        return self.num_draws, self.drop_last, self.pad

    def _make_shard(self, cursor: int) -> _core.Shard:
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

    def _config(self) -> dict[str, Any]:
        return {
            "sizes": list(self.sizes),
            "weights": list(self.weights),
            "num_samples": self.num_draws,
            "period": self.period,
            "seed": self.seed % 2**64,
            "drop_last": self.drop_last,
            "pad": self.pad,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sizes={self.sizes}, weights={self.weights}, "
            f"num_samples={self.num_draws}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"seed={self.seed}, epoch={self.epoch}, drop_last={self.drop_last}, "
            f"period={self.period}, pad={self.pad})"
        )
