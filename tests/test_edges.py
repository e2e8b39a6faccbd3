"""The samplers' edges that frameworks and torch-era code reach (issue 24): torch's attributes
assigned, pickling, exactly-once elastic resume, argument mistakes that used to pass silently
or fail with a message that could not help. The framework cases themselves run under the
frameworks' own launchers in test_integrations.py; the one-rank hang in test_distributed.py.
"""

from __future__ import annotations

import copy
import io
import math
import pickle
import warnings
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, TensorDataset

import fastshard
from fastshard import (
    BatchSampler,
    DistributedSampler,
    LengthGroupedBatchSampler,
    MixtureSampler,
    WeightedDistributedSampler,
)

LENGTHS = np.array([(i * 7919) % 299 + 1 for i in range(2000)], dtype=np.int64)

MAKERS: dict[str, Callable[..., Any]] = {
    "distributed": lambda **kw: DistributedSampler(1000, 2, 0, seed=3, **kw),
    "torch_order": lambda **kw: DistributedSampler(1000, 2, 0, seed=3, order="torch", **kw),
    "block": lambda **kw: DistributedSampler(1000, 2, 0, seed=3, order="block", block_size=8, **kw),
    "weighted": lambda **kw: WeightedDistributedSampler(np.arange(1.0, 301.0), num_replicas=2, rank=0, seed=3, **kw),
    "weighted_no_replacement": lambda **kw: WeightedDistributedSampler(
        np.arange(1.0, 301.0), replacement=False, num_replicas=2, rank=0, seed=3, **kw
    ),
    "mixture": lambda **kw: MixtureSampler([300, 50, 7], [0.5, 0.3, 0.2], 1000, 2, 0, seed=3, **kw),
    "length_grouped": lambda **kw: LengthGroupedBatchSampler(LENGTHS, 16, num_replicas=2, rank=0, seed=3, **kw),
}  # fmt: skip


def epoch_of(make: Callable[..., Any], epoch: int) -> list[Any]:
    s = make()
    s.set_epoch(epoch)
    return list(s)


# -- torch's attributes ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", MAKERS)
def test_assigning_epoch_is_set_epoch(kind):
    """torch's set_epoch is `self.epoch = epoch`: torch-era code assigns it. It used to be
    ignored after the first pass (epoch 0's order again, and a checkpoint saying epoch 1)."""
    make = MAKERS[kind]
    s = make()
    first = list(s)
    s.epoch = 1
    assert s.epoch == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no EpochWarning: the epoch did change
        second = list(s)
    assert second == epoch_of(make, 1) and second != first
    state = s.state_dict(3)
    assert state["epoch"] == 1
    t = make()
    t.load_state_dict(state)
    assert list(t) == second[3:]


@pytest.mark.parametrize("kind", MAKERS)
def test_attributes_fixed_at_construction_refuse_assignment(kind):
    """`s.seed = 6` or `s.shuffle = False` used to be accepted and ignored, while repr()
    showed the new value."""
    s = MAKERS[kind]()
    before = list(s)
    frozen = [a for a in s._FROZEN if a in vars(s)]
    assert {"seed", "num_replicas", "rank", "drop_last", "shuffle", "dataset"} <= set(frozen)
    for name in frozen:
        old = getattr(s, name)
        with pytest.raises(AttributeError, match=f"{name} cannot be changed after construction"):
            setattr(s, name, 6)
        assert getattr(s, name) is old
    s.check_consistency = False  # read at every iteration: assignable
    s.auto_epoch = True
    s.set_epoch(0)
    assert list(s) == before


# -- pickling ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", MAKERS)
def test_every_sampler_pickles_deep_copies_and_saves(kind):
    """WeightedDistributedSampler with replacement used to fail all three (its alias table
    could not be pickled)."""
    s = MAKERS[kind]()
    s.set_epoch(2)
    want = list(s)
    buffer = io.BytesIO()
    torch.save(s, buffer)
    buffer.seek(0)
    for t in (
        pickle.loads(pickle.dumps(s)),
        copy.deepcopy(s),
        torch.load(buffer, weights_only=False),
    ):
        assert type(t) is type(s) and t.epoch == 2
        assert list(t) == want


def test_alias_table_round_trip_is_exact_and_checked():
    w = np.random.default_rng(0).random(5000) ** 4
    table = fastshard._core.AliasTable(w)
    copied = pickle.loads(pickle.dumps(table))
    assert len(copied) == len(table)
    for a, b in zip(table._buckets(), copied._buckets()):
        np.testing.assert_array_equal(a, b)
    n, raw = table.__getstate__()
    with pytest.raises(ValueError, match="do not match"):
        fastshard._core.AliasTable.__new__(fastshard._core.AliasTable).__setstate__((n + 1, raw))
    bad = bytearray(raw)
    bad[4:8] = (n + 5).to_bytes(4, "little")  # the first bucket's alias, past the end
    with pytest.raises(ValueError, match="out of range"):
        fastshard._core.AliasTable.__new__(fastshard._core.AliasTable).__setstate__((n, bytes(bad)))


# -- exactly-once elastic resume -----------------------------------------------------------------
def resumed(make: Callable[..., Any], old_w: int, steps: int, new_w: int, **kw: Any) -> list[Any]:
    """What ranks 0..new_w-1 yield after resuming from old_w ranks that each took `steps`
    (both runs built with ``kw``: a state restores a sampler of the same pad and drop_last)."""
    head = make(old_w, 0, **kw)
    it = iter(head)
    for _ in range(steps):
        next(it)
    state = head.state_dict(steps)
    out: list[Any] = []
    for r in range(new_w):
        s = make(new_w, r, **kw)
        s.load_state_dict(state)
        out += list(s)
    return out


def key(x: Any) -> Any:
    return tuple(x) if isinstance(x, list) else x


def test_mixture_elastic_resume_with_pad_false_makes_every_draw_once():
    """Issue 24, case 5: W=1 -> 7 with drop_last=True never made 6 unconsumed draws, and the
    mixture had no pad=False for an exactly-once resume."""

    def make(w: int, r: int, **kw: Any) -> MixtureSampler:
        return MixtureSampler([30, 20, 5], [0.5, 0.3, 0.2], 97, w, r, seed=4, **kw)

    epoch = list(make(1, 0))
    for steps in (0, 10, 41):
        rest = resumed(make, 1, steps, 7, pad=False)
        assert Counter(epoch[:steps]) + Counter(rest) == Counter(epoch)
        assert len(rest) == 97 - steps
        # drop_last drops what does not divide over the new ranks, as documented: < 7 draws
        dropped = resumed(make, 1, steps, 7, drop_last=True)
        assert len(dropped) == (97 - steps) // 7 * 7


def test_length_grouped_elastic_resume_with_pad_false_trains_every_batch_once():
    """Issue 24, case 5: 160 batches, W=2 -> 3 after 79 steps with drop_last=True: the 2
    unconsumed batches never trained."""
    lengths = np.arange(1, 161).repeat(4)

    def make(w: int, r: int, **kw: Any) -> LengthGroupedBatchSampler:
        return LengthGroupedBatchSampler(lengths, 4, num_replicas=w, rank=r, seed=2, **kw)

    assert make(1, 0).num_batches == 160
    epoch = [tuple(b) for b in make(1, 0)]
    rest = [tuple(b) for b in resumed(make, 2, 79, 3, pad=False)]
    assert sorted(epoch[:158] + rest) == sorted(epoch)
    assert len(resumed(make, 2, 79, 3, drop_last=True)) == 0  # 2 batches over 3 ranks


@pytest.mark.parametrize("kind", ["mixture", "length_grouped"])
def test_pad_false_counts_and_state(kind):
    make = MAKERS[kind]
    s = make(pad=False)
    assert s.pad is False and "pad=False" in repr(s)
    assert s.state_dict()["pad"] is False
    t = make()
    with pytest.raises(ValueError, match="pad"):
        t.load_state_dict(s.state_dict())
    # a state saved before `pad` existed is a pad=True state
    old = {k: v for k, v in t.state_dict(2).items() if k != "pad"}
    t.load_state_dict(old)
    with pytest.raises(ValueError, match="pad"):
        make(pad=False).load_state_dict(old)


# -- batch samplers -------------------------------------------------------------------------------
def test_batch_sampler_refuses_a_sampler_that_yields_batches():
    """Issue 24, case 11: accepted, then `TypeError: batch(): incompatible function
    arguments` at the first iteration."""
    with pytest.raises(TypeError, match="batch_sampler=sampler"):
        BatchSampler(LengthGroupedBatchSampler(LENGTHS, 8, num_replicas=1, rank=0), 4)


@pytest.mark.extended  # imports Lightning: half a minute on 2 cores
def test_length_grouped_sampler_is_its_own_sampler():
    """Frameworks set the epoch through batch_sampler.sampler (Lightning's _set_sampler_epoch
    reaches dataloader.sampler and dataloader.batch_sampler.sampler only)."""
    pytest.importorskip("lightning")
    from lightning.fabric.utilities.data import _set_sampler_epoch

    s = LengthGroupedBatchSampler(LENGTHS, 8, num_replicas=1, rank=0, seed=1)
    loader = torch.utils.data.DataLoader(range(len(LENGTHS)), batch_sampler=s)
    first = list(s)
    _set_sampler_epoch(loader, 1)
    assert s.sampler is s and s.epoch == 1 and list(s) != first


# -- mixtures: small things ------------------------------------------------------------------------
def test_mixture_period_message_names_the_smallest_period_that_works():
    """[1, 1] with period=1 said 'use period >= 4' though 2 and 3 work."""
    with pytest.raises(ValueError, match=r"smallest period that works .* is 2 "):
        MixtureSampler([10, 10], [1, 1], period=1, num_replicas=1, rank=0)
    MixtureSampler([10, 10], [1, 1], period=2, num_replicas=1, rank=0)
    # 5 draws: windows of period 2 would be 3 windows of 1-2 draws, too short
    with pytest.raises(ValueError, match=r"smallest period that works .* is 3 "):
        MixtureSampler([10, 10], [1, 1], 5, period=2, num_replicas=1, rank=0)
    MixtureSampler([10, 10], [1, 1], 5, period=3, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="is 1000 "):
        MixtureSampler([10, 10], [999, 1], 5000, period=999, num_replicas=1, rank=0)
    MixtureSampler([10, 10], [999, 1], 5000, period=1000, num_replicas=1, rank=0)


def test_mixture_dataset_is_the_concatenation():
    a = TensorDataset(torch.arange(5))
    b = TensorDataset(torch.arange(7))
    concat = ConcatDataset([a, b])
    assert MixtureSampler(concat, [1, 1], num_replicas=1, rank=0).dataset is concat
    from_list = MixtureSampler([a, b], [1, 1], num_replicas=1, rank=0).dataset
    assert isinstance(from_list, ConcatDataset) and len(from_list) == 12
    assert from_list.datasets == [a, b]
    assert MixtureSampler([5, 7], [1, 1], num_replicas=1, rank=0).dataset == range(12)


def test_mixture_integer_weights_are_exact_at_any_size():
    """[2**60 + 1, 2**60] used to become equal shares (float64)."""
    s = MixtureSampler([10, 10], [2**60 + 1, 2**60], num_replicas=1, rank=0)
    assert s.weights == [2**60 + 1, 2**60] and s._units == [2**60 + 1, 2**60]
    t = MixtureSampler([10, 10], np.array([2**60 + 1, 2**60]), num_replicas=1, rank=0)
    assert t._units == s._units
    with pytest.raises(ValueError, match="weights"):
        MixtureSampler([10, 10], [2**60, 2**60], num_replicas=1, rank=0).load_state_dict(
            s.state_dict()
        )
    # above 2**63 in all: rounded to units adding up to 2**63 from the exact shares (here
    # float64 would read 3 * 2**62 and 2**62 and give 3 * 2**61 and 2**61)
    weights = [3 * 2**62 + 2**9, 2**62 + 3]
    exact = [Fraction(w * 2**63, sum(weights)) for w in weights]
    floors = [math.floor(x) for x in exact]
    order = sorted(range(2), key=lambda c: -(exact[c] - floors[c]))
    for c in order[: 2**63 - sum(floors)]:
        floors[c] += 1
    big = MixtureSampler([10, 10], weights, num_replicas=1, rank=0)
    assert big._units == floors and floors != [3 * 2**61, 2**61]
    with pytest.raises(ValueError, match="below 2\\*\\*-63 of the weights' sum"):
        MixtureSampler([10, 10], [10**400, 1], num_replicas=1, rank=0)


def test_messages_name_the_number_that_does_not_fit():
    """Used to say 'got dtype float64' for a list of ints and 'got dtype object'."""
    with pytest.raises(ValueError, match=r"lengths\[0\] = 9223372036854775808 is out of range"):
        LengthGroupedBatchSampler([2**63, 1], 2, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"weights\[0\] is an int of 401 digits"):
        WeightedDistributedSampler([10**400, 1], num_replicas=1, rank=0)
    with pytest.raises(TypeError, match=r"weights\[1\] = 'x' is not a number"):
        WeightedDistributedSampler([1, "x"], num_replicas=1, rank=0)
