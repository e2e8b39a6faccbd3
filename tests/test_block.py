"""The block order: random blocks dealt in shuffled windows, with torch's plan and resume."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastshard import BatchSampler, DistributedSampler, _distributed

from .conftest import child_peak_growth_kib, linux_only


def make(n, W, r, B, K=1, epoch=0, **kw):
    s = DistributedSampler(
        n, W, r, seed=kw.pop("seed", 29), order="block", block_size=B, window=K, **kw
    )
    s.set_epoch(epoch)
    return s


def shards(n, W, B, K=1, **kw):
    return [make(n, W, r, B, K, **kw).indices().tolist() for r in range(W)]


def max_blocks(seq, B, span):
    """The most distinct blocks (item // B) among any `span` consecutive entries of seq."""
    if not seq:
        return 0
    counts = Counter()
    best = 0
    for i, item in enumerate(seq):
        counts[item // B] += 1
        if i >= span:
            old = seq[i - span] // B
            counts[old] -= 1
            if counts[old] == 0:
                del counts[old]
        best = max(best, len(counts))
    return best


def torch_length(n, W, r, drop_last, pad):
    if drop_last:
        return n // W
    if pad:
        return -(-n // W)
    return len(range(r, n, W))


# (drop_last, pad): the three plans
PLANS = [(False, True), (True, True), (False, False)]
PLAN_IDS = ["pad", "drop_last", "no_pad"]
# (B, K): B = 1, K = 1 (a permutation plan), B = 1 windows, blocks without windows, and
# blocks that exceed n, W * B and W * B * K on the small n below.
BK = [(1, 1), (1, 4), (3, 1), (4, 2), (7, 3), (16, 2), (5, 16)]
GRID_N = [0, 1, 3, 10, 37, 100, 257, 1000]
GRID_W = [1, 2, 3, 5, 8]


# -- the plan -----------------------------------------------------------------------------------
@pytest.mark.parametrize("plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("B,K", BK)
@pytest.mark.parametrize("W", GRID_W)
@pytest.mark.parametrize("n", GRID_N)
def test_plan_lengths_union_padding_and_locality(n, W, B, K, plan):
    drop_last, pad = plan
    parts = shards(n, W, B, K, drop_last=drop_last, pad=pad)
    lengths = [len(p) for p in parts]
    assert lengths == [torch_length(n, W, r, drop_last, pad) for r in range(W)]
    samplers = [make(n, W, r, B, K, drop_last=drop_last, pad=pad) for r in range(W)]
    assert [len(s) for s in samplers] == lengths
    assert {s.total_size for s in samplers} == {n if not (drop_last or pad) else lengths[0] * W}
    counts = Counter(i for p in parts for i in p)
    assert all(0 <= i < n for i in counts)
    if drop_last:
        assert set(counts.values()) <= {1} and sum(counts.values()) == W * (n // W)
    elif pad:
        assert sorted(counts) == list(range(n))
        assert sum(counts.values()) - n < W  # padding repeats fewer than W items
    else:
        assert sorted(counts) == list(range(n)) and set(counts.values()) <= {1}
        assert max(lengths) - min(lengths) <= 1
    for p in parts:  # the locality bound
        assert max_blocks(p, B, B * K) <= 2 * K + 2


def chunk_bounds(n, W, r, B, K, drop_last, pad):
    """[start, stop) of each window of rank r's fresh epoch, without its padding."""
    C = B * K
    full = n // (W * C)
    out = [(q * C, (q + 1) * C) for q in range(full)]
    last, rem = divmod(n - full * W * C, W)
    if not drop_last:
        last += r < rem
    out.append((full * C, full * C + last))
    return out


@pytest.mark.parametrize("plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("B,K", BK)
@pytest.mark.parametrize("n,W", [(1000, 3), (257, 2), (100, 8), (37, 5), (10, 3), (4096, 4)])
def test_windows_hold_whole_blocks_of_a_contiguous_run(n, W, B, K, plan):
    # Every window is a run of consecutive blocks of the epoch's layout: whole blocks, except
    # a block's tail at the start and a block's head at the end. Within a block the layout
    # keeps item order, so a cut block shows a suffix or a prefix of its items.
    drop_last, pad = plan
    for r, part in enumerate(shards(n, W, B, K, drop_last=drop_last, pad=pad)):
        for start, stop in chunk_bounds(n, W, r, B, K, drop_last, pad):
            window = part[start:stop]
            assert len(set(window)) == len(window)
            by_block = {}
            for i in window:
                by_block.setdefault(i // B, set()).add(i % B)
            cut = []
            for b, offsets in by_block.items():
                size = min(B, n - b * B)
                if len(offsets) < size:
                    lo, hi = min(offsets), max(offsets)
                    assert offsets == set(range(lo, hi + 1)), (b, offsets)
                    # a block cut at both ends is a whole window inside one block
                    assert lo == 0 or hi == size - 1 or len(by_block) == 1, (b, offsets)
                    cut.append(b)
            assert len(cut) <= 2
            assert len(by_block) <= K + 2


def unshuffled(n, W, r, B, K, drop_last, pad):
    """shuffle=False, from the definition: the layout is the items in order; windows of
    C = B * K positions are dealt round-robin; the last round is split evenly, its padding
    repeats the rank's window's first item (or wraps to the start if the window is empty)."""
    C = B * K
    full = n // (W * C)
    out = []
    for q in range(full):
        out += range((q * W + r) * C, (q * W + r + 1) * C)
    base = full * W * C
    size, rem = divmod(n - base, W)
    if drop_last:
        return out + list(range(base + r * size, base + (r + 1) * size))
    start = base + r * size + min(r, rem)
    length = size + (r < rem)
    out += range(start, start + length)
    if pad and rem and r >= rem:
        out.append(start if length else (r - rem) % n)
    return out


@pytest.mark.parametrize("plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("B,K", BK)
@pytest.mark.parametrize("W", [1, 3, 8])
@pytest.mark.parametrize("n", [0, 5, 37, 1000])
def test_unshuffled_plan_matches_its_definition(n, W, B, K, plan):
    drop_last, pad = plan
    for r in range(W):
        s = make(n, W, r, B, K, shuffle=False, drop_last=drop_last, pad=pad)
        assert s.indices().tolist() == unshuffled(n, W, r, B, K, drop_last, pad)


@pytest.mark.parametrize("plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("n,W", [(1, 1), (7, 3), (100, 4), (1000, 8), (5, 8), (2048, 3)])
def test_block_size_one_is_a_permutation_plan(n, W, plan):
    # B = K = 1: rank r's k-th item is G[r + k W] of one permutation G of [0, n), padding
    # wrapping to G's start: torch's plan over a keyed permutation.
    drop_last, pad = plan
    parts = shards(n, W, 1, 1, drop_last=drop_last, pad=pad)
    G = {}
    for r, part in enumerate(parts):
        for k, item in enumerate(part):
            G[r + k * W] = item
    total = max(G) + 1 if G else 0
    assert sorted(G) == list(range(total))  # no gaps
    head = [G[j] for j in range(min(n, total))]
    if not drop_last:
        assert sorted(head) == list(range(n))
    assert len(set(head)) == len(head)
    for j in range(n, total):
        assert G[j] == G[j % n]  # padding wraps to the start of the order
    if not (drop_last or pad):
        assert total == n


def test_each_epoch_is_a_fresh_order_of_blocks():
    n, W, B, K = 4096, 4, 16, 4
    sets = []
    for epoch in range(4):
        part = make(n, W, 1, B, K, epoch=epoch).indices().tolist()
        sets.append({i // B for i in part})
    # 64 of 256 blocks per rank: two independent draws share 16 on average; the same set
    # again would mean a fixed, not a random, assignment.
    assert all(len(a & b) < 40 for i, a in enumerate(sets) for b in sets[i + 1 :])
    a, b = make(n, W, 1, B, K, seed=1), make(n, W, 1, B, K, seed=2)
    assert a.indices().tolist() != b.indices().tolist()
    c, d = make(n, W, 1, B, K, seed=-1), make(n, W, 1, B, K, seed=2**64 - 1)
    assert c.indices().tolist() == d.indices().tolist()


# -- access paths -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n,W,r,B,K", [(10, 3, 1, 4, 1), (1000, 8, 7, 5, 3), (300_001, 2, 1, 64, 16), (5, 8, 6, 2, 2)]
)
def test_iteration_indices_getitem_and_batches_agree(n, W, r, B, K):
    s = make(n, W, r, B, K, epoch=3)
    as_list = list(s)
    assert as_list == s.indices().tolist()
    step = max(1, len(s) // 500)
    assert [s[k] for k in range(0, len(s), step)] == as_list[::step]
    assert [s[-k - 1] for k in range(min(len(s), 50))] == as_list[::-1][:50]
    for start, stop in [(0, 1), (2, 7), (len(s) // 2, len(s)), (-3, None), (5, 2), (0, 10**9)]:
        assert s.indices(start, stop).tolist() == as_list[start:stop]
    s.set_epoch(3)
    assert [i for b in BatchSampler(s, 7) for i in b] == as_list
    assert all(type(i) is int for i in as_list[:10])


def test_threaded_fill_equals_single_thread():
    import fastshard

    s = make(10**8, 4, 2, 100, 8, epoch=1)
    big = s.indices(1000, 1000 + 600_000)
    old = fastshard.get_num_threads()
    try:
        fastshard.set_num_threads(1)
        assert np.array_equal(big, s.indices(1000, 1000 + 600_000))
    finally:
        fastshard.set_num_threads(old)
    assert big.tolist()[:100] == [s[k] for k in range(1000, 1100)]


@pytest.mark.parametrize("n", [10**12, 2**63 - 1])
def test_huge_n(n):
    s = make(n, 8, 3, 4096, 16)
    assert len(s) == math.ceil(n / 8)
    head = s.indices(0, 100_000)
    assert len(np.unique(head)) == len(head) and head.min() >= 0 and head.max() < n
    assert max_blocks(head.tolist(), 4096, 4096 * 16) <= 34
    assert 0 <= s[-1] < n and [s[k] for k in range(0, 100_000, 997)] == head[::997].tolist()


@linux_only
def test_huge_n_allocates_nothing_proportional_to_n():
    growth = child_peak_growth_kib(
        "s = fastshard.DistributedSampler(2**63 - 1, 8, 0, order='block', block_size=2**20, window=64)\n"
        "a = s.indices(0, 1000); b = [s[k] for k in range(0, 10**15, 10**13)]"
    )
    assert growth < 16 * 1024  # KiB


# -- arguments ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(order="block"), ValueError, "block_size"),
        (dict(order="block", block_size=0), ValueError, "block_size"),
        (dict(order="block", block_size=-3), ValueError, "block_size"),
        (dict(order="block", block_size=2**63), ValueError, "block_size"),
        (dict(order="block", block_size=2.0), TypeError, "block_size"),
        (dict(order="block", block_size=True), TypeError, "block_size"),
        (dict(order="block", block_size="4"), TypeError, "block_size"),
        (dict(order="block", block_size=4, window=0), ValueError, "window"),
        (dict(order="block", block_size=4, window=-1), ValueError, "window"),
        (dict(order="block", block_size=4, window=1.5), TypeError, "window"),
        (dict(order="block", block_size=2**62, window=2), ValueError, "window"),
        (dict(block_size=4), ValueError, "block_size"),
        (dict(window=2), ValueError, "window"),
        (dict(order="feistel", block_size=4, window=2), ValueError, "block_size"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        DistributedSampler(10, 2, 0, **kwargs)


def test_arguments_accepted():
    s = DistributedSampler(10, 2, 0, order="block", block_size=np.int64(3))
    assert (s.block_size, s.window) == (3, 1)
    assert DistributedSampler(10, 2, 0, order="block", block_size=2**62, window=1).window == 1
    r = repr(DistributedSampler(100, 4, 1, order="block", block_size=8, window=4))
    assert "order='block'" in r and "block_size=8" in r and "window=4" in r


# -- resume ---------------------------------------------------------------------------------------
def consume(sampler, k):
    it = iter(sampler)
    return [x for _, x in zip(range(k), it)]


def run_chain(n, worlds, fracs, B, K, **kw):
    """Ranks of worlds[0] take a fraction (float) or a number (int) of their pass, rank 0
    saves; fresh ranks of the next world load it and take theirs; ...; the last world
    finishes the epoch.
    Returns, per world, each rank's items, and the states saved."""
    taken, states, state = [], [], None
    for i, W in enumerate(worlds):
        group = [make(n, W, r, B, K, epoch=2, **kw) for r in range(W)]
        for s in group:
            if state is not None:
                s.set_epoch(0)  # load_state_dict restores the epoch itself
                s.load_state_dict(state)
        assert len({len(s) for s in group}) == 1 or not kw.get("pad", True)
        if i == len(worlds) - 1:
            taken.append([list(s) for s in group])
            break
        f = fracs[i]
        rest = len(group[0].indices())  # this pass's length (len() is the whole epoch's)
        k = min(f, rest) if isinstance(f, int) else int(f * rest)
        taken.append([consume(s, k) for s in group])
        state = json.loads(json.dumps(group[0].state_dict()))
        for s in group[1:]:
            if k <= len(s.indices()):  # a shorter (pad=False) shard cannot tell its end from later
                assert s.state_dict() == state
        states.append(state)
    return taken, states


RESUME_BK = [(1, 1), (3, 2), (4, 4), (7, 1), (2, 16)]
CHAINS = [(3, 3), (4, 2), (2, 5), (1, 3), (6, 1), (3, 5, 2), (4, 7, 4, 1)]
FRACS = [0.0, 0.1, 0.37, 0.5, 0.93, 1.0]


@pytest.mark.parametrize("plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("B,K", RESUME_BK)
@pytest.mark.parametrize("worlds", CHAINS, ids=str)
@pytest.mark.parametrize("n", [1, 10, 100, 257])
def test_elastic_resume_deals_every_unconsumed_item(n, worlds, B, K, plan):
    drop_last, pad = plan
    for frac in FRACS:
        fracs = [frac, 1 - frac, 0.5]
        taken, _ = run_chain(n, worlds, fracs, B, K, drop_last=drop_last, pad=pad)
        seen = Counter(i for world in taken for part in world for i in part)
        if drop_last:
            assert set(seen.values()) <= {1} and n - len(seen) < worlds[-1]
        elif pad:
            assert sorted(seen) == list(range(n))
            assert sum(seen.values()) - n < sum(worlds)
        else:
            assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}, frac


@pytest.mark.parametrize("plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("B,K", RESUME_BK)
@pytest.mark.parametrize("n,W", [(1, 2), (10, 3), (100, 4), (257, 3), (1000, 8)])
def test_exact_resume_is_bit_identical(n, W, B, K, plan):
    drop_last, pad = plan
    full = shards(n, W, B, K, epoch=2, drop_last=drop_last, pad=pad)
    length = len(full[0])
    for k in sorted({0, 1, B, B * K - 1, B * K + 1, length // 2, max(length - 1, 0), length}):
        if k > length:
            continue
        taken, _ = run_chain(n, (W, W), [k], B, K, drop_last=drop_last, pad=pad)
        for r in range(W):
            assert taken[0][r] + taken[1][r] == full[r], (k, r)


@pytest.mark.parametrize("B,K", RESUME_BK)
@pytest.mark.parametrize("worlds", [(4, 2, 2), (2, 5, 5, 5), (3, 1, 1), (5, 3, 3)], ids=str)
def test_exact_resume_inside_an_elastic_redeal(worlds, B, K):
    # After an elastic resume, further interruptions on the same number of ranks -- also
    # inside the stride-1 re-deal of the interrupted round -- change nothing.
    n = 211
    for frac in (0.3, 0.61):
        for pad in (True, False):
            straight, _ = run_chain(n, worlds[:2], [frac], B, K, pad=pad)
            for inner in (0.0, 0.01, 0.05, 0.2, 0.7, 1.0):
                chained, _ = run_chain(
                    n, worlds, [frac] + [inner] * (len(worlds) - 2), B, K, pad=pad
                )
                for r in range(worlds[1]):
                    assert [x for world in chained[1:] for x in world[r]] == straight[1][r], (
                        frac,
                        inner,
                        r,
                    )


@pytest.mark.parametrize("B,K", [(3, 2), (4, 4), (16, 2), (2, 16)])
@pytest.mark.parametrize("worlds", [(4, 2), (2, 5), (3, 7), (8, 3)], ids=str)
def test_locality_after_resume(worlds, B, K):
    # Exact resume keeps the plan (and its bound); after an elastic resume, the rest of the
    # interrupted round is re-dealt with stride 1 (the head), then windows again: 2K + 2
    # blocks, plus one when a window that does not start on a block edge holds the short
    # block.
    n = 1013
    for frac in (0.21, 0.5, 0.77):
        W, W2 = worlds
        taken, _ = run_chain(n, (W, W), [frac], B, K)
        for part in taken[1]:
            assert max_blocks(part, B, B * K) <= 2 * K + 2
        group = [make(n, W, r, B, K) for r in range(W)]
        k = int(frac * len(group[0]))
        for s in group:
            consume(s, k)
        state = group[0].state_dict()
        for r in range(W2):
            s = make(n, W2, r, B, K)
            s.load_state_dict(state)
            head = s._current().head_length
            assert head <= math.ceil(W * B * K / W2) + 1
            assert max_blocks(s.indices(head).tolist(), B, B * K) <= 2 * K + 3


def test_state_is_small_versioned_and_validated():
    s = make(10**12, 8, 5, 64, 16)
    consume(s, 3)
    state = s.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["version"] == 1 and state["epoch"] == 0 and state["cursor"] == 0
    assert state["order"] == "block" and state["block_size"] == 64 and state["window"] == 16
    assert state["round"] == {"chunks": 8, "size": 1024, "rem": 0, "offset": 3, "taken": 0}
    assert s.state_dict(consumed=0)["round"] is None
    assert s.state_dict(consumed=2048) == {**state, "cursor": 2 * 8 * 1024, "round": None}
    with pytest.raises(ValueError, match="consumed"):
        s.state_dict(consumed=len(s) + 1)


def good_state():
    donor = make(300, 3, 0, 4, 2)
    consume(donor, 11)
    state = donor.state_dict()
    assert state["round"] is not None
    return state


def edit_round(**changes):
    def change(state):
        state["round"].update(changes)

    return change


@pytest.mark.parametrize(
    "change,exc,match",
    [
        (lambda st: st.pop("round"), ValueError, "round"),
        (lambda st: st.update(round=[3, 8, 0, 3, 0]), TypeError, "round"),
        (lambda st: st.update(block_size=5), ValueError, "block_size="),
        (lambda st: st.update(window=3), ValueError, "window="),
        (lambda st: st.pop("window"), ValueError, "window"),
        (lambda st: st["round"].pop("taken"), ValueError, "taken"),
        (lambda st: st["round"].update(extra=1), ValueError, "extra"),
        (edit_round(chunks=0), ValueError, "chunks"),
        (edit_round(chunks=-1), ValueError, "chunks"),
        (edit_round(chunks=2**63), ValueError, "chunks"),
        (edit_round(chunks=3.0), TypeError, "chunks"),
        (edit_round(offset=True), TypeError, "offset"),
        (edit_round(rem=3), ValueError, "rem"),
        (edit_round(size=9), ValueError, "block_size \\* window"),
        (edit_round(chunks=40), ValueError, "fit"),
        (edit_round(offset=10), ValueError, "offset"),
        (edit_round(taken=10**6), ValueError, "taken"),
        (lambda st: st.update(cursor=295), ValueError, "fit"),
    ],
)
def test_bad_block_states_are_refused_and_change_nothing(change, exc, match):
    state = good_state()
    change(state)
    s = make(300, 2, 1, 4, 2, epoch=9)
    consume(s, 5)
    before = (s.state_dict(), s.epoch, s.indices().tolist())
    with pytest.raises(exc, match=match):
        s.load_state_dict(state)
    assert (s.state_dict(), s.epoch, s.indices().tolist()) == before


def test_block_state_does_not_load_into_other_orders_and_back():
    block_state = good_state()
    other = DistributedSampler(300, 3, 0, seed=29)
    with pytest.raises(ValueError, match="order="):
        other.load_state_dict(block_state)
    with pytest.raises(ValueError, match=r"round|block_size|window"):
        make(300, 3, 0, 4, 2).load_state_dict(other.state_dict())


def test_core_rechecks_rounds():
    from fastshard import _core

    args = (100, 2, 0, False, True, 10, "block", 1, 0)
    with pytest.raises(ValueError, match="fit"):
        _core.Shard(*args, block_size=4, window=2, round=(20, 8, 0, 1, 0))
    with pytest.raises(ValueError, match="round"):
        _core.Shard(100, 2, 0, False, True, 10, "feistel", 1, 0, round=(2, 8, 0, 1, 0))
    with pytest.raises(ValueError, match="block_size"):
        _core.Shard(*args)


def test_batch_sampler_resume_and_pickle():
    import pickle

    W, bs = 3, 5
    full = [list(BatchSampler(make(257, W, r, 4, 3), bs)) for r in range(W)]
    old = [BatchSampler(make(257, W, r, 4, 3), bs) for r in range(W)]
    taken = [[b for _, b in zip(range(4), iter(x))] for x in old]
    state = old[2].state_dict()
    assert all(x.state_dict() == state for x in old) and state["round"] is not None
    new = [BatchSampler(make(257, W, r, 4, 3), bs) for r in range(W)]
    for x in new:
        x.load_state_dict(state)
    rest = [list(x) for x in new]
    assert [t + r for t, r in zip(taken, rest)] == full
    s = make(257, W, 1, 4, 3)
    s.load_state_dict(state)
    t = pickle.loads(pickle.dumps(s))
    assert t.indices().tolist() == s.indices().tolist() and t.state_dict(0) == s.state_dict(0)


def test_consistency_row_covers_the_round():
    a, b = make(300, 3, 0, 4, 2), make(300, 3, 1, 4, 2)
    state = good_state()
    a.load_state_dict(state)
    b.load_state_dict(
        {**state, "round": {**state["round"], "offset": state["round"]["offset"] - 1}}
    )
    fa, fb = _distributed._fields(a), _distributed._fields(b)
    assert fa["cursor"] == fb["cursor"] and fa["round"] != fb["round"] and fa["round"] != 0
    assert len(_distributed._row(fa)) == _distributed.WIDTH


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 300),
    B=st.integers(1, 9),
    K=st.integers(1, 5),
    worlds=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    fracs=st.lists(st.floats(0, 1), min_size=3, max_size=3),
    plan=st.sampled_from(PLANS),
    seed=st.integers(-(2**65), 2**65),
)
def test_property_resume_chains(n, B, K, worlds, fracs, plan, seed):
    drop_last, pad = plan
    kw = dict(drop_last=drop_last, pad=pad, seed=seed)
    taken, _ = run_chain(n, worlds, fracs, B, K, **kw)
    seen = Counter(i for world in taken for part in world for i in part)
    if drop_last:
        assert set(seen.values()) <= {1} and n - len(seen) < worlds[-1]
    elif pad:
        assert sorted(seen) == list(range(n)) and sum(seen.values()) - n < sum(worlds)
    else:
        assert sorted(seen) == list(range(n)) and set(seen.values()) <= {1}
    if len(set(worlds)) == 1:
        full = shards(n, worlds[0], B, K, epoch=2, **kw)
        for r in range(worlds[0]):
            assert [x for world in taken for x in world[r]] == full[r]
    if len(worlds) == 1:
        for part in taken[0]:
            assert max_blocks(part, B, B * K) <= 2 * K + 2


# -- statistics: with K >= 16, blocks are assigned as at random -----------------------------------
# Layouts of whole rounds (n = W * K * B * R, no short block): each rank holds R windows of K
# whole blocks per epoch. Under a uniformly random assignment of blocks, a rank's block set is
# a uniform m-subset of the nb blocks, each block's (rank, round) is uniform over the W * R
# cells, and each item's place in its window is uniform. Each test compares with that null by
# its own distribution (a p-value below ALPHA fails; the seeds are fixed, so the outcome is
# too) and shows, on a plan that is not random, that it would fail.
ALPHA = 1e-4
STATS = dict(B=4, W=4, R=4)


def stats_plan(K, seed=0, shuffle=True):
    B, W, R = STATS["B"], STATS["W"], STATS["R"]
    n = W * K * B * R
    samplers = [
        DistributedSampler(
            n, W, r, seed=seed, order="block", block_size=B, window=K, shuffle=shuffle
        )
        for r in range(W)
    ]
    return n, samplers


def epoch_parts(samplers, epoch):
    for s in samplers:
        s.set_epoch(epoch)
    return [s.indices() for s in samplers]


def chisquare_binned(observed, expected):
    """Pearson's test after merging neighbouring bins until each expects >= 5."""
    from scipy import stats

    obs, exp, o, e = [], [], 0.0, 0.0
    for a, b in zip(observed, expected):
        o, e = o + a, e + b
        if e >= 5:
            obs.append(o)
            exp.append(e)
            o = e = 0.0
    obs[-1] += o
    exp[-1] += e
    exp = np.array(exp) * (sum(obs) / sum(exp))
    return stats.chisquare(obs, exp).pvalue


@pytest.mark.parametrize("K", [16, 32])
def test_overlap_of_a_ranks_items_between_epochs_is_hypergeometric(K):
    from scipy import stats

    B = STATS["B"]
    n, samplers = stats_plan(K)
    nb, m = n // B, n // B // STATS["W"]
    pairs = 300

    def overlaps(epoch_of):
        out = []
        for i in range(pairs):
            a = set(epoch_parts(samplers[:1], epoch_of(2 * i))[0].tolist())
            b = set(epoch_parts(samplers[:1], epoch_of(2 * i + 1))[0].tolist())
            shared = len(a & b)
            assert shared % B == 0  # whole blocks
            out.append(shared // B)
        return np.bincount(out, minlength=m + 1)

    null = stats.hypergeom(nb, m, m).pmf(np.arange(m + 1)) * pairs
    assert chisquare_binned(overlaps(lambda e: e), null) > ALPHA
    # Control: the same epoch twice (a fixed assignment) is rejected.
    assert chisquare_binned(overlaps(lambda e: e // 2 * 2), null) < ALPHA


@pytest.mark.parametrize("K", [16, 32])
def test_blocks_land_uniformly_on_ranks_and_rounds(K):
    from scipy import stats

    B, W, R = STATS["B"], STATS["W"], STATS["R"]
    C = B * K

    def table(shuffle):
        n, samplers = stats_plan(K, seed=5, shuffle=shuffle)
        counts = np.zeros((n // B, W * R))
        for epoch in range(120):
            for r, part in enumerate(epoch_parts(samplers, epoch)):
                for q in range(R):
                    blocks = np.unique(part[q * C : (q + 1) * C] // B)
                    assert len(blocks) == K  # K whole blocks per window
                    counts[blocks, r * R + q] += 1
        assert (counts.sum(axis=1) == 120).all()
        return counts

    assert stats.chi2_contingency(table(True)).pvalue > ALPHA
    assert stats.chi2_contingency(table(False)).pvalue < ALPHA  # control: blocks in order


@pytest.mark.parametrize("K", [16, 32])
def test_items_take_every_place_in_their_window_uniformly(K):
    from scipy import stats

    C = STATS["B"] * K
    places = 8

    def table(seed, vary):
        n, samplers = stats_plan(K, seed=seed)
        counts = np.zeros((n, places))
        for epoch in range(60):
            parts = epoch_parts(samplers, epoch if vary else 0)
            for part in parts:
                k = np.arange(len(part))
                counts[part, (k % C) * places // C] += 1
        return counts

    assert stats.chi2_contingency(table(7, True)).pvalue > ALPHA
    assert stats.chi2_contingency(table(7, False)).pvalue < ALPHA  # control: one epoch repeated
