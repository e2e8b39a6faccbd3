"""Checkpoint and resume mid-epoch, on the same or another number of ranks."""

from __future__ import annotations

import copy
import json
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastshard
from fastshard import BatchSampler, DistributedSampler

ORDERS = list(fastshard._sampler.ORDERS)


# The block order runs the same resume tests with small blocks and windows, so that rounds,
# short blocks and re-deals all occur at these sizes (tests/test_block.py covers it further).
BLOCK = dict(block_size=3, window=2)


def make(n, W, r, **kw):
    epoch = kw.pop("epoch", 3)
    if kw.get("order") == "block":
        kw = {**BLOCK, **kw}
    s = DistributedSampler(n, W, r, seed=kw.pop("seed", 17), **kw)
    s.set_epoch(epoch)
    return s


def consume(sampler, k):
    """Take k indices (or all there are) through the sampler's own iterator."""
    it = iter(sampler)
    return [x for _, x in zip(range(k), it)]


def run_interrupted(n, W, W2, k, **kw):
    """W ranks consume k steps, rank 0 saves; W2 fresh ranks load it and finish the epoch."""
    old = [make(n, W, r, **kw) for r in range(W)]
    consumed = [consume(s, k) for s in old]
    state = json.loads(json.dumps(old[0].state_dict()))
    for s in old[1:]:
        # Every rank saves the same state, also with pad=False a rank whose shorter shard
        # already ran out: the step after its last is the epoch's end (its iterator ended).
        assert s.state_dict() == state
    new = [make(n, W2, r, **kw) for r in range(W2)]
    for s in new:
        s.set_epoch(0)  # load_state_dict must restore the epoch itself
        s.load_state_dict(state)
    rest = [list(s) for s in new]
    return old, consumed, new, rest


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n,W", [(1000, 4), (101, 3), (5, 8), (64, 1), (1, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_same_world_size_is_bit_identical(order, shuffle, n, W, drop_last):
    kw = dict(order=order, shuffle=shuffle, drop_last=drop_last)
    full = [list(make(n, W, r, **kw)) for r in range(W)]
    length = len(full[0])
    for k in sorted({0, 1, length // 2, max(length - 1, 0), length}):
        _, consumed, new, rest = run_interrupted(n, W, W, k, **kw)
        for r in range(W):
            assert consumed[r] + rest[r] == full[r], (k, r)
            # len() is the whole epoch's, as torch's; the resumed pass yields the rest
            assert len(new[r]) == len(full[r]) and len(new[r].indices()) == len(rest[r])


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("n", [1, 7, 100, 1001])
@pytest.mark.parametrize("W,W2", [(4, 2), (2, 4), (3, 5), (8, 3), (5, 1), (1, 6)])
def test_elastic_without_padding_yields_every_item_once(order, n, W, W2):
    length = len(make(n, W, 0, order=order, pad=False))
    for k in sorted({0, 1, length // 3, max(length - 1, 0), length}):
        _, consumed, _, rest = run_interrupted(n, W, W2, k, order=order, pad=False)
        seen = Counter(i for part in consumed + rest for i in part)
        assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}, k


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("n", [3, 7, 100, 1001])
@pytest.mark.parametrize("W,W2", [(4, 2), (2, 4), (3, 5), (8, 3), (5, 1), (1, 6)])
def test_elastic_with_padding_covers_every_item(order, n, W, W2):
    length = len(make(n, W, 0, order=order))
    for k in sorted({0, 1, length // 2, max(length - 1, 0), length}):
        _, consumed, new, rest = run_interrupted(n, W, W2, k, order=order)
        seen = Counter(i for part in consumed + rest for i in part)
        assert sorted(seen) == list(range(n)), k
        repeats = sum(seen.values()) - n
        assert 0 <= repeats < W + W2, (k, repeats)
        assert len({len(s) for s in new}) == 1  # equal lengths on every new rank (DDP)


def test_after_the_resumed_pass_set_epoch_moves_on():
    _, _, new, _ = run_interrupted(100, 4, 2, 5)
    s = new[1]
    s.set_epoch(4)
    assert s.state_dict()["cursor"] == 0
    assert list(s) == list(make(100, 2, 1, epoch=4))


def test_state_is_small_versioned_and_rankless():
    s = make(10**12, 8, 5)
    consume(s, 3)
    state = s.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["version"] == 1 and state["cursor"] == 24 and state["epoch"] == 3
    assert "rank" not in state and "num_replicas" not in state
    assert s.state_dict(consumed=10)["cursor"] == 80
    with pytest.raises(ValueError, match="consumed"):
        s.state_dict(consumed=-1)
    with pytest.raises(ValueError, match="consumed"):
        s.state_dict(consumed=len(s) + 1)


@pytest.mark.parametrize(
    "change,exc,match",
    [
        (lambda st: st.update(n=st["n"] + 1), ValueError, "n="),
        (lambda st: st.update(seed=st["seed"] + 1), ValueError, "seed="),
        (lambda st: st.update(order="other"), ValueError, "order="),
        (lambda st: st.update(shuffle=False), ValueError, "shuffle="),
        (lambda st: st.update(pad=False), ValueError, "pad="),
        (lambda st: st.update(drop_last=True), ValueError, "drop_last="),
        (lambda st: st.update(version=2), ValueError, "version"),
        (lambda st: st.pop("version"), ValueError, "version"),
        (lambda st: st.pop("cursor"), ValueError, "cursor"),
        (lambda st: st.pop("epoch"), ValueError, "epoch"),
        (lambda st: st.update(cursor="5"), TypeError, "cursor"),
        (lambda st: st.update(cursor=5.0), TypeError, "cursor"),
        (lambda st: st.update(epoch=True), TypeError, "epoch"),
        (lambda st: st.update(cursor=-1), ValueError, "cursor"),
        (lambda st: st.update(cursor=2**63), ValueError, "cursor"),
        (lambda st: st.update(shuffle=1), TypeError, "shuffle"),
    ],
)
def test_bad_states_are_refused_and_change_nothing(change, exc, match):
    donor = make(100, 4, 0)
    consume(donor, 7)
    state = donor.state_dict()
    change(state)
    s = make(100, 4, 2)
    s.set_epoch(9)
    it = iter(s)
    for _ in range(4):
        next(it)
    before = (s.state_dict(), s.epoch, s.indices().tolist(), len(s))
    it = iter(s)
    for _ in range(4):
        next(it)
    with pytest.raises(exc, match=match):
        s.load_state_dict(state)
    assert s.state_dict() == before[0]
    assert (s.epoch, list(s), len(s)) == before[1:]


@pytest.mark.parametrize("bad", [None, [], "state", 3])
def test_non_dict_state(bad):
    with pytest.raises(TypeError, match="dict"):
        make(10, 2, 0).load_state_dict(bad)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 400),
    W=st.integers(1, 9),
    W2=st.integers(1, 9),
    frac=st.floats(0, 1),
    pad=st.booleans(),
    seed=st.integers(-(2**65), 2**65),
)
def test_property_elastic_resume(n, W, W2, frac, pad, seed):
    length = len(make(n, W, 0, pad=pad, seed=seed))
    k = int(frac * length)
    _, consumed, _new, rest = run_interrupted(n, W, W2, k, pad=pad, seed=seed)
    seen = Counter(i for part in consumed + rest for i in part)
    assert sorted(seen) == list(range(n))
    if pad:
        assert sum(seen.values()) - n < W + W2
    else:
        assert set(seen.values()) == {1}
    if W == W2:
        full = [list(make(n, W, r, pad=pad, seed=seed)) for r in range(W)]
        assert [c + r for c, r in zip(consumed, rest)] == full


# -- BatchSampler ---------------------------------------------------------------------------------
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("W2", [3, 2])
def test_batch_sampler_resumes_at_batch_granularity(drop_last, W2):
    W, bs = 3, 4
    old = [BatchSampler(make(103, W, r), bs, drop_last) for r in range(W)]
    full = [list(BatchSampler(make(103, W, r), bs, drop_last)) for r in range(W)]
    taken = []
    for b in old:
        it = iter(b)
        taken.append([next(it) for _ in range(2)])
    state = old[1].state_dict()
    assert state == old[0].state_dict() and state["cursor"] == 2 * bs * W
    new = [BatchSampler(make(103, W2, r), bs, drop_last) for r in range(W2)]
    for b in new:
        b.load_state_dict(state)
    rest = [list(b) for b in new]
    if W2 == W:
        assert [t + r for t, r in zip(taken, rest)] == full
    flat = Counter(i for part in taken + rest for batch in part for i in batch)
    if not drop_last:
        assert sorted(flat) == list(range(103))


@pytest.mark.parametrize("order", ORDERS)
def test_pad_false_state_at_the_end_of_a_rank_a_step_shorter(order):
    """pad=False, 7 items, 2 ranks: rank 0 has 4 items and rank 1 has 3 (in batches of 3, two
    steps and one). Once a rank's iteration has ended (its iterator ran out), its state is
    the epoch's end, the shorter rank's too, and a resume reads nothing again. While it is
    still at its last item, it is at the same step as rank 0, whose last item is to come."""
    taken = []
    for r in range(2):
        sampler = make(7, 2, r, order=order, pad=False)
        items = list(sampler)
        taken += items
        assert sampler.state_dict()["cursor"] == 7, r
        assert sampler.state_dict(consumed=len(items))["cursor"] == 7, r
        batches = BatchSampler(make(7, 2, r, order=order, pad=False), 3)
        assert len(list(batches)) == 2 - r
        assert batches.state_dict()["cursor"] == 7, r
        rest = make(7, 1, 0, order=order, pad=False)
        rest.load_state_dict(sampler.state_dict())
        assert list(rest) == [], r
    assert sorted(taken) == list(range(7))
    # A rank with no item (1 item, 2 ranks): its loop ends at once, at the epoch's end.
    empty = make(1, 2, 1, order=order, pad=False)
    assert list(empty) == [] and empty.state_dict()["cursor"] == 1
    # Rank 1 at its 3rd and last item, its iteration not ended: step 3 of both ranks, and
    # rank 0's 4th item is still to come.
    heads = []
    for r in range(2):
        sampler = make(7, 2, r, order=order, pad=False)
        it = iter(sampler)
        heads += [next(it) for _ in range(3)]
    rest = make(7, 1, 0, order=order, pad=False)
    rest.load_state_dict(sampler.state_dict())
    assert sorted(heads + list(rest)) == list(range(7))


# -- torchdata's StatefulDataLoader ---------------------------------------------------------------
class Items(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_sampler", [False, True])
def test_stateful_dataloader(num_workers, batch_sampler):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    n, k = 500, 7

    def loader():
        s = DistributedSampler(n, 2, 1, seed=4)
        s.set_epoch(2)
        if batch_sampler:
            return sdl.StatefulDataLoader(
                Items(n), batch_sampler=BatchSampler(s, 8), num_workers=num_workers
            )
        return sdl.StatefulDataLoader(Items(n), sampler=s, batch_size=8, num_workers=num_workers)

    full = [b.tolist() for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it).tolist() for _ in range(k)]
    state = copy.deepcopy(first.state_dict())
    del it
    second = loader()
    second.load_state_dict(state)
    rest = [b.tolist() for b in second]
    assert head == full[:k]
    assert rest == full[k:]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_sampler", [False, True])
def test_end_of_epoch_loader_state_then_set_epoch_yields_that_epoch(num_workers, batch_sampler):
    """A StatefulDataLoader checkpoint taken after an epoch ended, restored, then set_epoch of
    the next epoch (the usual loop): torchdata loads the sampler's state (the saved epoch, at
    its end) when it makes its iterator, after that set_epoch. The next epoch is yielded in
    full, not an empty pass of the finished one."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    n = 40

    def loader(s):
        if batch_sampler:
            return sdl.StatefulDataLoader(
                Items(n), batch_sampler=BatchSampler(s, 8), num_workers=num_workers
            )
        return sdl.StatefulDataLoader(Items(n), sampler=s, batch_size=8, num_workers=num_workers)

    first = loader(DistributedSampler(n, 1, 0, seed=4))
    epoch0 = [x for b in first for x in b.tolist()]
    state = copy.deepcopy(first.state_dict())
    sampler = DistributedSampler(n, 1, 0, seed=4)
    again = loader(sampler)
    again.load_state_dict(state)
    sampler.set_epoch(1)
    expected = DistributedSampler(n, 1, 0, seed=4)
    expected.set_epoch(1)
    got = [x for b in again for x in b.tolist()]
    assert got == list(expected) != epoch0
    assert sampler.epoch == 1


def test_numpy_cursor_from_indices_consumers():
    # Users who consume through indices() pass `consumed` explicitly.
    s = make(1000, 4, 3)
    chunk = s.indices(0, 100)
    state = s.state_dict(consumed=np.int64(len(chunk)))
    t = make(1000, 4, 3)
    t.load_state_dict(state)
    assert np.concatenate([chunk, t.indices()]).tolist() == list(make(1000, 4, 3))


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(
    edits=st.dictionaries(
        st.sampled_from(
            [
                "version",
                "n",
                "seed",
                "order",
                "shuffle",
                "drop_last",
                "pad",
                "epoch",
                "cursor",
                "extra",
            ]
        ),
        _values,
        max_size=3,
    ),
    drop=st.lists(st.sampled_from(["version", "n", "epoch", "cursor", "order"]), max_size=2),
)
def test_fuzzed_states_never_crash_or_half_apply(edits, drop):
    donor = make(300, 3, 0)
    consume(donor, 11)
    state = donor.state_dict()
    state.update(edits)
    for key in drop:
        state.pop(key, None)
    s = make(300, 2, 1)
    s.set_epoch(5)
    before = (s.state_dict(), s.epoch, len(s))
    try:
        s.load_state_dict(state)
    except (TypeError, ValueError):
        assert (s.state_dict(), s.epoch, len(s)) == before
        assert list(s) == list(make(300, 2, 1, epoch=5))
    else:
        # accepted: then it is a valid state for this sampler and applies whole
        # a cursor past n (nothing left) is saved again as n, the exhausted pass's cursor
        assert s.epoch == state["epoch"] and s.state_dict()["cursor"] == min(state["cursor"], 300)
        assert len(s.indices()) == -(-max(300 - state["cursor"], 0) // 2)
        assert len(s) == 150  # the whole epoch's, also while the pass yields its rest


def test_pickle_keeps_the_position_not_the_caches():
    import pickle

    s = make(1000, 4, 1)
    state = s.state_dict()
    list(s)  # builds the shard and an iterator
    s2 = make(1000, 4, 1)
    consume(s2, 10)
    s2.load_state_dict(s2.state_dict())
    t = pickle.loads(pickle.dumps(s2))
    assert list(t) == list(s2) and t.state_dict(consumed=0) == s2.state_dict(consumed=0)
    assert pickle.loads(pickle.dumps(s)).state_dict() == state


# -- a state saved at the end of a pass -----------------------------------------------------------
def _weighted(**kw):
    return lambda W, r, **more: fastshard.WeightedDistributedSampler(
        num_replicas=W, rank=r, seed=5, **kw, **more
    )


def _uniform(n, **kw):
    return lambda W, r, **more: DistributedSampler(n, W, r, seed=5, **kw, **more)


# (sampler factory (W, rank, **kw), the epoch's length n, W that saves, other Ws that load).
# With padding the end of a pass is at cursor n + W - 1 at most: past 2**63 - 1 for the first
# cases, past n for all.
END_OF_PASS = {
    "feistel-2**63-1": (_uniform(2**63 - 1), 2**63 - 1, 2, (1, 3, 2**62)),
    "feistel-2**62+3-on-2**62": (_uniform(2**62 + 3), 2**62 + 3, 2**62, (1, 2, 5)),
    "block-2**63-1": (
        _uniform(2**63 - 1, order="block", block_size=7, window=3),
        2**63 - 1,
        2,
        (1, 3),
    ),
    "weighted-2**63-1-draws": (
        _weighted(weights=[1.0, 0.0, 2.5], num_samples=2**63 - 1),
        2**63 - 1,
        2,
        (1, 3, 2**62),
    ),
    "feistel-10": (_uniform(10), 10, 4, (1, 3, 7)),
    "torch-10": (_uniform(10, order="torch"), 10, 4, (1, 3, 7)),
    "block-10": (_uniform(10, order="block", block_size=3, window=2), 10, 4, (1, 3, 7)),
    "weighted-without-replacement": (
        _weighted(weights=np.arange(1.0, 11.0), num_samples=7, replacement=False),
        7,
        3,
        (1, 2, 5),
    ),
    "weighted-with-replacement": (_weighted(weights=[1.0, 3.0], num_samples=9), 9, 4, (1, 2, 5)),
}


@pytest.mark.parametrize("case", list(END_OF_PASS))
def test_a_state_saved_at_the_end_of_a_pass_always_loads(case):
    make_sampler, n, W, others = END_OF_PASS[case]
    ranks = sorted({0, 1, W - 1})
    states = []
    for r in ranks:
        s = make_sampler(W, r)
        s.set_epoch(5)
        states.append(json.loads(json.dumps(s.state_dict(consumed=len(s)))))
    state = states[0]
    # Every rank saves the same state, with a cursor a state can hold: n, nothing left.
    assert all(st == state for st in states) and state["cursor"] == n
    for W2 in (W, *others):
        for r in sorted({0, W2 - 1}):
            t = make_sampler(W2, r)
            t.load_state_dict(state)
            # iter(t): list(t) would preallocate len(t), the whole epoch's length
            assert t.epoch == 5 and t.indices().size == 0 and list(iter(t)) == []
            assert t.state_dict(consumed=0) == state  # saved again, unchanged
            # auto_epoch: the next iteration starts the next epoch, whole
            a = make_sampler(W2, r, auto_epoch=True)
            a.load_state_dict(state)
            it = iter(a)
            fresh = make_sampler(W2, r)
            fresh.set_epoch(6)
            assert a.epoch == 6 and len(a) == len(fresh) > 0
            assert [x for _, x in zip(range(5), it)] == fresh.indices(0, 5).tolist()


def test_a_cursor_past_the_end_from_an_older_state_still_loads():
    # States saved before the cursor was capped at n hold n + W - 1 at most: still nothing left.
    state = make(10, 4, 0).state_dict(consumed=3)
    assert state["cursor"] == 10
    for W2 in (1, 3):
        s = make(10, W2, 0)
        s.load_state_dict({**state, "cursor": 12})
        assert s.indices().size == 0 and list(s) == [] and s.state_dict()["cursor"] == 10


@pytest.mark.parametrize("order", ORDERS)
def test_set_epoch_of_the_loaded_epoch_keeps_the_resume(order):
    """The usual loop: load the checkpoint, then set_epoch(epoch) at the top of each epoch.
    It must continue the saved epoch, not train on its first part twice."""
    full = list(make(100, 2, 1, order=order, epoch=3))
    s = make(100, 2, 1, order=order, epoch=3)
    head = consume(s, 20)
    state = s.state_dict()
    t = make(100, 2, 1, order=order)
    t.load_state_dict(state)
    t.set_epoch(3)  # the saved epoch, before iterating: the resume stands
    assert t.state_dict()["cursor"] == state["cursor"]
    assert head + list(t) == full
    t.set_epoch(3)  # after the resumed pass was iterated: the whole epoch again
    assert list(t) == full
    u = make(100, 2, 1, order=order)
    u.load_state_dict(state)
    u.set_epoch(4)  # another epoch: the resume ends
    assert list(u) == list(make(100, 2, 1, order=order, epoch=4))
    v = make(100, 2, 1, order=order)
    v.load_state_dict(state)
    partial = consume(v, 5)  # the resumed pass began: set_epoch starts the whole epoch
    v.set_epoch(3)
    assert partial == full[20:25] and list(v) == full
