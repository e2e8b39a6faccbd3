"""The forgotten set_epoch: a warning when a shuffled epoch repeats, and auto_epoch."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fastshard
from fastshard import BatchSampler, DistributedSampler, EpochWarning, WeightedDistributedSampler

MATCH = r"set_epoch\(epoch\).*auto_epoch=True"


def samplers(**kw):
    """One of each shuffled kind, fresh."""
    return [
        DistributedSampler(100, 4, 1, seed=3, **kw),
        DistributedSampler(100, 4, 1, seed=3, order="block", block_size=4, window=2, **kw),
        WeightedDistributedSampler(np.arange(1.0, 51.0), 60, num_replicas=2, rank=1, **kw),
        WeightedDistributedSampler(
            np.arange(1.0, 51.0), 40, replacement=False, num_replicas=2, rank=0, **kw
        ),
    ]


KINDS = ["feistel", "block", "weighted", "weighted-noreplace"]


def order_at(sampler, epoch):
    """The sampler's order at `epoch`, read without iterating it."""
    other = copy.copy(sampler)
    other.set_epoch(epoch)
    return other.indices().tolist()


# -- when it warns ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", range(4), ids=KINDS)
def test_warns_once_when_a_finished_epoch_repeats(kind):
    s = samplers()[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = list(s)  # the first pass never warns
    with pytest.warns(EpochWarning, match=MATCH) as record:
        second = list(s)
    assert len(record) == 1 and "epoch 0" in str(record[0].message)
    assert record[0].filename == __file__  # points at the loop that repeats the epoch
    assert second == first  # the warning changes nothing: torch's behaviour is kept
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(s) == first  # once per sampler
        s.set_epoch(1)
        list(s)
        assert list(s) == order_at(s, 1)  # still silent: warned already


@pytest.mark.parametrize("kind", range(4), ids=KINDS)
def test_silent_after_set_epoch_load_state_dict_or_a_partial_pass(kind):
    s = samplers()[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(s)
        s.set_epoch(0)  # the same epoch, explicitly: the user asked for it
        list(s)
        s.load_state_dict(s.state_dict(consumed=0))
        list(s)
        s.set_epoch(5)
        it = iter(s)
        next(it)  # a partial pass, then a new iteration: not a repeat of a finished epoch
        list(s)
        s.set_epoch(6)
        list(s)
        s.indices()  # reading without iterating starts no pass
        s[0]
        s.set_epoch(7)
    assert s.epoch == 7


def test_silent_without_shuffle():
    s = DistributedSampler(50, 2, 0, shuffle=False)
    b = DistributedSampler(50, 2, 0, shuffle=False, order="block", block_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for x in (s, b):
            assert list(x) == list(x)
            assert list(BatchSampler(x, 7)) == list(BatchSampler(x, 7))


def test_a_second_distinct_sampler_warns_on_its_own():
    a, b = DistributedSampler(30, 1, 0), DistributedSampler(30, 1, 0)
    list(a)
    list(b)
    with pytest.warns(EpochWarning, match=MATCH):
        list(a)
    with pytest.warns(EpochWarning, match=MATCH):
        list(b)


def test_epoch_warning_is_its_own_category():
    # A UserWarning, so that default filters show it, and a class of its own, so that a suite
    # run with warnings as errors (torch's reproducibility test iterates a sampler twice) can
    # silence exactly it, as the user guide (docs/user-guide.md) says.
    assert issubclass(EpochWarning, UserWarning) and EpochWarning is not UserWarning
    assert fastshard.EpochWarning is EpochWarning and "EpochWarning" in fastshard.__all__
    s = DistributedSampler(40, 2, 1, seed=9)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        list(s)
        list(s)
    assert [type(w.message) for w in record] == [EpochWarning]
    s = DistributedSampler(40, 2, 1, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=fastshard.EpochWarning)
        assert list(s) == list(s)  # the repeat passes under -W error
        with pytest.raises(UserWarning, match="other"):  # and only this category is silenced
            warnings.warn("other", UserWarning, stacklevel=1)


# -- BatchSampler -----------------------------------------------------------------------------
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_warns_when_its_finished_epoch_repeats(drop_last):
    s = DistributedSampler(103, 3, 2, seed=1)
    b = BatchSampler(s, 10, drop_last=drop_last)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = list(b)
    with pytest.warns(EpochWarning, match=MATCH) as record:
        assert list(b) == first
    assert record[0].filename == __file__


def test_batch_sampler_and_sampler_share_the_pass():
    s = DistributedSampler(64, 2, 0, seed=1)
    b = BatchSampler(s, 5)
    list(s)
    with pytest.warns(EpochWarning, match=MATCH):  # the sampler's finished pass, then a batch pass
        list(b)
    s2 = DistributedSampler(64, 2, 0, seed=1)
    b2 = BatchSampler(s2, 5)
    list(b2)
    with pytest.warns(EpochWarning, match=MATCH):  # a finished batch pass, then the sampler
        list(s2)


def test_batch_sampler_silent_cases():
    s = DistributedSampler(64, 2, 0, seed=1)
    b = BatchSampler(s, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        it = iter(b)
        next(it)
        next(it)  # partial
        list(b)
        b.set_epoch(1)  # through the batch sampler
        list(b)
        s.set_epoch(2)  # or directly on the sampler
        list(b)
        b.load_state_dict(b.state_dict(consumed_batches=0))
        list(b)
    # A batch pass that outlives a set_epoch does not mark the new epoch as finished.
    s.set_epoch(3)
    stale = iter(b)
    next(stale)
    s.set_epoch(4)
    list(stale)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(b)


def test_dataloader_without_set_epoch_warns():
    data = torch.arange(200)
    s = DistributedSampler(data, 2, 0, seed=5)
    loader = DataLoader(data, sampler=s, batch_size=16)
    list(loader)
    with pytest.warns(EpochWarning, match=MATCH):
        list(loader)
    s.set_epoch(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(loader)
        s.set_epoch(2)
        list(loader)


# -- auto_epoch -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", range(4), ids=KINDS)
def test_auto_epoch_advances_after_each_finished_pass(kind):
    s = samplers(auto_epoch=True)[kind]
    expected = [order_at(s, e) for e in range(4)]
    assert len({tuple(x) for x in expected}) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = []
        for epoch in range(4):
            got.append(list(s))
            assert s.epoch == epoch  # the epoch of the pass just taken
    assert got == expected


def test_auto_epoch_off_by_default_and_validated():
    assert DistributedSampler(10, 1, 0).auto_epoch is False
    assert DistributedSampler(10, 1, 0, auto_epoch=1).auto_epoch is True  # a flag, as torch's
    with pytest.raises(ValueError, match="auto_epoch"):
        DistributedSampler(10, 1, 0, auto_epoch=2)
    with pytest.raises(TypeError, match="auto_epoch"):
        DistributedSampler(10, 1, 0, auto_epoch=1.0)
    with pytest.raises(TypeError, match="auto_epoch"):
        WeightedDistributedSampler([1.0, 2.0], num_replicas=1, rank=0, auto_epoch="yes")


def test_auto_epoch_partial_pass_and_set_epoch_do_not_advance():
    s = DistributedSampler(100, 2, 1, seed=9, auto_epoch=True)
    it = iter(s)
    next(it)
    list(s)  # after a partial pass: the same epoch
    assert s.epoch == 0
    s.set_epoch(10)  # set_epoch wins over the automatic advance
    assert list(s) == order_at(s, 10) and s.epoch == 10
    s.set_epoch(10)
    list(s)
    assert s.epoch == 10
    list(s)  # a finished pass and no set_epoch: now it advances
    assert s.epoch == 11


@pytest.mark.parametrize("order", ["feistel", "block"])
def test_auto_epoch_with_resume(order):
    kw = dict(seed=2, auto_epoch=True, order=order)
    if order == "block":
        kw.update(block_size=5, window=3)
    full = DistributedSampler(300, 3, 0, **kw)
    epochs = [list(full) for _ in range(3)]
    s = DistributedSampler(300, 3, 0, **kw)
    list(s)
    it = iter(s)
    head = [next(it) for _ in range(17)]
    state = s.state_dict()
    assert state["epoch"] == 1
    t = DistributedSampler(300, 3, 0, **kw)
    t.load_state_dict(state)
    assert head + list(t) == epochs[1]  # the resumed pass finishes epoch 1
    assert list(t) == epochs[2] and t.epoch == 2  # then the next pass is epoch 2


def test_auto_epoch_batch_sampler_and_dataloader():
    data = torch.arange(500)
    s = DistributedSampler(data, 2, 1, seed=4, auto_epoch=True)
    b = BatchSampler(s, 32)
    loader = DataLoader(data, batch_sampler=b)
    expected = [order_at(s, e) for e in range(3)]
    got = [torch.cat(list(loader)).tolist() for _ in range(3)]
    assert got == expected and s.epoch == 2
    s2 = DistributedSampler(data, 2, 1, seed=4, auto_epoch=True)
    loader2 = DataLoader(data, sampler=s2, batch_size=32, num_workers=0)
    assert [torch.cat(list(loader2)).tolist() for _ in range(3)] == expected


def test_auto_epoch_consistency_check_sees_the_advanced_epoch():
    # The check runs after the advance, so every rank compares the epoch it will yield.
    from fastshard import _distributed

    s = DistributedSampler(20, 2, 0, auto_epoch=True)
    seen = []
    real = _distributed.check
    try:
        _distributed.check = lambda sampler, together=0: seen.append(
            _distributed._fields(sampler)["epoch"]
        )
        list(s)
        list(s)
        list(BatchSampler(s, 3))
    finally:
        _distributed.check = real
    assert seen == [0, 1, 2]


@pytest.mark.parametrize("batch_sampler", [False, True])
def test_auto_epoch_stateful_dataloader(batch_sampler):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    n = 200
    data = torch.arange(n)

    def loader():
        s = DistributedSampler(n, 2, 0, seed=8, auto_epoch=True)
        if batch_sampler:
            return sdl.StatefulDataLoader(data, batch_sampler=BatchSampler(s, 8)), s
        return sdl.StatefulDataLoader(data, sampler=s, batch_size=8), s

    ref, ref_s = loader()
    epochs = [[b.tolist() for b in ref] for _ in range(3)]
    assert ref_s.epoch == 2 and epochs[0] != epochs[1]
    first, _ = loader()
    list(first)  # epoch 0
    it = iter(first)  # epoch 1, advanced by itself
    head = [next(it).tolist() for _ in range(5)]
    state = copy.deepcopy(first.state_dict())
    del it
    second, s2 = loader()
    second.load_state_dict(state)
    rest = [b.tolist() for b in second]
    assert head + rest == epochs[1]
    assert [b.tolist() for b in second] == epochs[2] and s2.epoch == 2
    # A state saved at the very end of an epoch resumes to the next epoch.
    third, _ = loader()
    list(third)
    end_state = copy.deepcopy(third.state_dict())
    fourth, s4 = loader()
    fourth.load_state_dict(end_state)
    assert [b.tolist() for b in fourth] == epochs[1] and s4.epoch == 1


@pytest.mark.parametrize("order", ["feistel", "block"])
@pytest.mark.parametrize("auto", [False, True])
def test_state_saved_at_the_end_of_a_pass(order, auto):
    kw = dict(seed=1, auto_epoch=auto, order=order, pad=False)
    if order == "block":
        kw.update(block_size=4, window=2)
    s = DistributedSampler(51, 2, 0, **kw)
    list(s)
    state = s.state_dict()
    for rank in range(2):
        t = DistributedSampler(51, 2, rank, **kw)
        t.load_state_dict(state)
        if auto:  # the rest of epoch 0 is empty on every rank: epoch 1 begins at once
            assert list(t) == order_at(t, 1) and t.epoch == 1
        else:  # torch's behaviour: the (empty) rest of the saved epoch
            assert list(t) == [] and t.epoch == 0
