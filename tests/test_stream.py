"""fastshard.ShardedStream: equal and exact shares of sequential shard reads, one global
sequence for any number of ranks and DataLoader workers, resume, and refusals."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import time
import warnings
from collections import Counter
from itertools import permutations

import numpy as np
import pytest
import torch
from scipy import stats
from torch.utils.data import DataLoader, get_worker_info

import fastshard
from fastshard import ShardedStream, ShardReadError

# 3 workers on a 2-core machine: torch's advice, not a failure. Most tests use few lanes on
# purpose (shared lanes must be exact too); test_shared_lanes_warn checks the warning.
pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore::fastshard.ReadAmplificationWarning"),
]

# Uneven: empty shards, a one-row shard, and one shard larger than all the others together.
SIZES = [7, 0, 23, 3, 1, 0, 11, 90, 5, 14]
N = sum(SIZES)
B = 4


class Rows:
    """read(shard, start, stop): (shard, row, worker) per row; logs each call to a file when
    given one (one line per call, appended: safe from several worker processes)."""

    def __init__(self, log: str | None = None, short: tuple[int, int] | None = None) -> None:
        self.log = log
        self.short = short  # (shard, rows it really has)

    def __call__(self, shard: int, start: int, stop: int):
        info = get_worker_info()
        worker = -1 if info is None else info.id
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(json.dumps([os.getpid(), shard, start, stop]) + "\n")
        if self.short is not None and shard == self.short[0]:
            stop = min(stop, self.short[1])
        for row in range(start, stop):
            yield (shard, row, worker)


def collate(items):
    return items


def run(stream: ShardedStream, workers: int) -> list[list[tuple[int, int, int]]]:
    """The batches one rank's DataLoader yields, in order."""
    loader = DataLoader(
        stream, batch_size=stream.batch_size, num_workers=workers, collate_fn=collate
    )
    return [[tuple(x) for x in b] for b in loader]


def make(world: int, rank: int, **kw) -> ShardedStream:
    kw.setdefault("batch_size", B)
    kw.setdefault("lanes", 24)
    kw.setdefault("window", 4)
    kw.setdefault("seed", 5)
    return ShardedStream(SIZES, kw.pop("read", Rows()), num_replicas=world, rank=rank, **kw)


def interleave(per_rank: list[list]) -> list:
    """The global sequence from the ranks' item lists (rank r took positions r, r + W, ...)."""
    out = []
    for i in range(max(map(len, per_rank))):
        out.extend(items[i] for items in per_rank if i < len(items))
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("pad", [True, False])
def test_exact_shares_per_rank_and_worker(world, workers, pad):
    per_rank = []
    for rank in range(world):
        stream = make(world, rank, pad=pad)
        batches = run(stream, workers)
        items = [x for b in batches for x in b]
        assert len(items) == len(stream)
        # Batch q of the rank comes whole from worker q mod k: the split over workers is exact.
        for q, batch in enumerate(batches):
            assert len(batch) == (B if q < len(batches) - 1 else len(items) - B * q)
            assert {w for _, _, w in batch} == {-1 if workers == 0 else q % workers}
        per_rank.append([(s, r) for s, r, _ in items])
    counts = [len(x) for x in per_rank]
    if pad:
        assert counts == [-(-N // world)] * world  # the same on every rank: no rank waits
        assert set(interleave(per_rank)) == {(s, r) for s, n in enumerate(SIZES) for r in range(n)}
    else:
        assert max(counts) - min(counts) <= 1
        seen = Counter(interleave(per_rank))
        assert len(seen) == N and set(seen.values()) == {1}  # every item exactly once
    # Padding repeats items from the start of the epoch's sequence.
    seq = [tuple(x) for x in make(world, 0).sequence().tolist()]
    glob = interleave(per_rank)
    assert glob[:N] == seq
    assert glob[N:] == seq[: len(glob) - N]


def test_global_sequence_independent_of_ranks_and_workers():
    reference = [tuple(x) for x in make(1, 0).sequence().tolist()]
    assert sorted(reference) == sorted((s, r) for s, n in enumerate(SIZES) for r in range(n))
    for world, workers in [(1, 0), (1, 3), (2, 2), (3, 1), (3, 3)]:
        per_rank = [
            [(s, r) for b in run(make(world, r_, pad=False), workers) for s, r, _ in b]
            for r_ in range(world)
        ]
        assert interleave(per_rank) == reference, (world, workers)
    # The global batches at a fixed global batch size: 12 = 3 ranks x 4 = 2 ranks x 6.
    three = [run(make(3, r, pad=False, lanes=36), 2) for r in range(3)]
    two = [run(make(2, r, pad=False, lanes=36, batch_size=6), 1) for r in range(2)]
    for step in range(len(three[0]) - 1):
        assert sorted(x[:2] for r in range(3) for x in three[r][step]) == sorted(
            x[:2] for r in range(2) for x in two[r][step]
        )


def test_drop_last():
    per_rank = [[x[:2] for b in run(make(3, r, drop_last=True), 2) for x in b] for r in range(3)]
    assert [len(x) for x in per_rank] == [N // 3] * 3
    glob = interleave(per_rank)
    assert len(set(glob)) == len(glob) == N // 3 * 3


def test_reads_go_forward_and_read_only_what_is_yielded(tmp_path):
    """Each reader (a worker process) reads shards forward from a start row, never a row
    twice; with lanes a multiple of batch_size * num_replicas * num_workers the readers
    together read exactly the rows they yield. (A reader may hold reads of one shard at two
    start rows at once: a shard that spans two of its lanes.)"""
    log = tmp_path / "reads.jsonl"
    world, workers = 2, 2
    for rank in range(world):
        stream = make(world, rank, pad=False, lanes=world * B * workers * 2, read=Rows(str(log)))
        run(stream, workers)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    rows = sum(stop - start for _, _, start, stop in calls)
    assert rows == N  # nothing read twice, nothing read that was not yielded
    ranges: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for pid, shard, start, stop in calls:
        assert 0 <= start < stop <= SIZES[shard]
        ranges.setdefault((pid, shard), []).append((start, stop))
    for spans in ranges.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "a row read twice"
    assert len({pid for pid, *_ in calls}) == world * workers


def test_shared_lanes_stay_exact_and_read_a_bounded_excess(tmp_path):
    """lanes not a multiple of the readers: still every item once; each reader reads the
    lanes it shares, so the excess is bounded by the sharing."""
    log = tmp_path / "reads.jsonl"
    world, workers, lanes = 2, 3, 10
    per_rank = []
    for rank in range(world):
        stream = make(world, rank, pad=False, lanes=lanes, read=Rows(str(log)))
        per_rank.append([x[:2] for b in run(stream, workers) for x in b])
    seen = Counter(interleave(per_rank))
    assert len(seen) == N and set(seen.values()) == {1}
    rows = sum(
        stop - start for _, _, start, stop in (json.loads(x) for x in log.read_text().splitlines())
    )
    assert N <= rows <= N * world * workers


def test_shared_lanes_warn_once_per_rank():
    with pytest.warns(fastshard.ReadAmplificationWarning, match="up to 3 readers"):
        list(ShardedStream(SIZES, Rows(), batch_size=3, lanes=8, num_replicas=1, rank=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastshard.ReadAmplificationWarning)
        list(make(1, 0, lanes=8, batch_size=4))  # private lanes: no warning
        list(make(2, 1, lanes=16, batch_size=4, pad=False))
        # with workers, worker 0 of each rank warns (as an error, it reaches the main process)
        with pytest.raises(fastshard.ReadAmplificationWarning, match="2 \\* 3 = 24"):
            run(make(2, 0, lanes=32), 3)
        run(make(2, 0, lanes=48), 3)


def test_fresh_order_every_epoch_and_shuffle_off():
    stream = make(1, 0)
    orders = []
    for epoch in range(3):
        stream.set_epoch(epoch)
        order = [x[:2] for b in run(stream, 0) for x in b]
        assert sorted(order) == sorted((s, r) for s, n in enumerate(SIZES) for r in range(n))
        orders.append(order)
    assert orders[0] != orders[1] != orders[2] != orders[0]
    plain = ShardedStream(
        SIZES, Rows(), batch_size=B, lanes=1, window=1, shuffle=False, num_replicas=1, rank=0
    )
    assert [x[:2] for x in plain] == [(s, r) for s, n in enumerate(SIZES) for r in range(n)]


def test_window_shuffle_stays_inside_lane_windows():
    stream = make(1, 0, lanes=5, window=6)
    seq = [tuple(x) for x in stream.sequence().tolist()]
    flat = ShardedStream(
        SIZES, Rows(), batch_size=B, lanes=5, window=1, seed=5, num_replicas=1, rank=0
    )
    base = [tuple(x) for x in flat.sequence().tolist()]
    assert seq != base
    for lane in range(5):
        mine, ref = seq[lane::5], base[lane::5]
        for w in range(0, len(ref), 6):
            assert sorted(mine[w : w + 6]) == sorted(ref[w : w + 6])


def test_chunk_order_is_uniform():
    """Four shards in one lane: the 24 orders of the shards over 4800 seeds, against the
    uniform distribution (chi-square, p < 1e-6 fails)."""
    sizes = [1, 1, 1, 1]
    index = {p: i for i, p in enumerate(permutations(range(4)))}
    counts = np.zeros(24)
    for seed in range(4800):
        s = ShardedStream(
            sizes, Rows(), batch_size=1, lanes=1, window=1, seed=seed, num_replicas=1, rank=0
        )
        counts[index[tuple(s.sequence()[:, 0].tolist())]] += 1
    assert stats.chisquare(counts).pvalue > 1e-6


def test_chunks_split_shards_into_units():
    stream = ShardedStream(
        SIZES, Rows(), batch_size=B, lanes=1, window=1, chunk_size=5, seed=1, num_replicas=1, rank=0
    )
    seq = [tuple(x) for x in stream.sequence().tolist()]
    runs = []
    for s, r in seq:
        if runs and runs[-1][0] == s and runs[-1][2] == r:
            runs[-1][2] = r + 1
        else:
            runs.append([s, r, r + 1])
    # Each run starts at a chunk boundary and is at most a chunk (consecutive chunks of one
    # shard may meet by chance).
    assert all(start % 5 == 0 for _, start, _ in runs)
    assert len(runs) >= sum(-(-n // 5) for n in SIZES) // 2


def test_exact_resume_in_process():
    full = [x for b in run(make(2, 0), 0) for x in b]
    stream = make(2, 0)
    it = iter(stream)
    head = [next(it) for _ in range(9)]
    state = stream.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert "rank" not in state and "worker" not in state
    again = make(2, 0)
    again.load_state_dict(state)
    again.set_epoch(0)  # the saved epoch: keeps the resume
    rest = list(again)
    assert head + rest == full


@pytest.mark.parametrize(("world", "new_world", "new_workers"), [(2, 3, 2), (3, 1, 3), (2, 2, 1)])
def test_elastic_resume_through_stateful_dataloader(world, new_world, new_workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    consumed, states = [], []
    for rank in range(world):
        stream = make(world, rank, pad=False)
        loader = StatefulDataLoader(stream, batch_size=B, num_workers=2, collate_fn=collate)
        it = iter(loader)
        batches = [next(it) for _ in range(5)]
        states.append(loader.state_dict())
        consumed.extend(x[:2] for b in batches for x in b)
        del it
    rest = []
    for rank in range(new_world):
        stream = make(new_world, rank, pad=False)
        stream.load_state_dict(states[0])  # any rank's loader state
        rest.extend(x[:2] for b in run(stream, new_workers) for x in b)
    seen = Counter(consumed + rest)
    assert len(seen) == N and set(seen.values()) == {1}, "lost or repeated items"


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_exact_resume_through_stateful_dataloader(workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader():
        return StatefulDataLoader(make(2, 1), batch_size=B, num_workers=workers, collate_fn=collate)

    full = [b for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(7)]
    state = first.state_dict()
    del it
    second = loader()
    second.load_state_dict(state)
    assert head + list(second) == full


def unpadded(sizes: list[int], batch_size: int, world: int, rank: int) -> ShardedStream:
    """A pad=False stream whose items are their positions in the stream's rows."""
    return ShardedStream(
        sizes,
        lambda s, a, b: range(a, b),
        batch_size=batch_size,
        seed=1,
        num_replicas=world,
        rank=rank,
        pad=False,
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_pad_false_state_of_a_shorter_rank_at_its_last_batch(workers):
    """pad=False: a rank's share can be an item short, its last batch short of batch_size.
    The state of every rank after the step that takes its last batch is the same cursor (the
    end of that step's batches on every rank), so any rank's resumes without repeating."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def states_after(n, steps):
        out, taken = [], []
        for rank in range(2):
            loader = StatefulDataLoader(
                unpadded([n], 3, 2, rank), batch_size=3, num_workers=workers, collate_fn=collate
            )
            it = iter(loader)
            taken += [x for _ in range(steps) for x in next(it)]
            out.append(loader.state_dict())
            del it
        return out, taken

    # 11 items: ranks of 6 and 5, two steps each; the second is the last on both.
    # 13 items: ranks of 7 and 6 (3 and 2 steps): after step 2 rank 0 has one step to go.
    for n, steps, cursor in ((11, 2, 11), (13, 2, 12)):
        states, taken = states_after(n, steps)
        for state in states:
            rest = unpadded([n], 3, 1, 0)
            rest.load_state_dict(state)
            assert rest.state_dict()["cursor"] == cursor, (n, state)
            assert sorted(taken + list(rest)) == list(range(n)), (n, state)


@pytest.mark.parametrize("workers", [0, 2])
def test_pad_false_state_at_the_epoch_end_of_a_rank_a_step_shorter(workers):
    """pad=False, 7 items, 2 ranks, batch 3: rank 0 takes two batches, rank 1 one (the
    ranks are a step apart). Once a rank's loop over its loader has ended, its state is the
    epoch's end, rank 1's too: a resume from it reads nothing again."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    for rank in range(2):
        loader = StatefulDataLoader(
            unpadded([7], 3, 2, rank), batch_size=3, num_workers=workers, collate_fn=collate
        )
        assert sum(len(batch) for batch in loader) == 4 - rank
        rest = unpadded([7], 3, 1, 0)
        rest.load_state_dict(loader.state_dict())
        assert rest.state_dict()["cursor"] == 7 and list(rest) == [], rank


def test_pad_false_state_item_by_item_on_a_shorter_rank():
    """Without a DataLoader a state may be taken after any item, every rank at its k-th: a
    rank that has yielded its last item but not ended its pass is at k * W like the others,
    even where its last batch is short (3 items, 2 ranks, batch 2: shares of 2 and 1)."""
    taken, states = [], []
    for rank in range(2):
        stream = unpadded([0, 0, 3], 2, 2, rank)
        it = iter(stream)
        taken.append(next(it))
        states.append(stream.state_dict())
    assert [state["cursor"] for state in states] == [2, 2]
    for state in states:
        rest = unpadded([0, 0, 3], 2, 1, 0)
        rest.load_state_dict(state)
        assert sorted(taken + list(rest)) == [0, 1, 2]


@pytest.mark.parametrize("auto_epoch", [True, False])
def test_resumed_stream_then_fresh_workers_every_epoch(auto_epoch):
    """stream.load_state_dict, then a DataLoader whose workers start afresh every epoch: the
    first iteration reads the rest of the saved epoch, later ones the next epochs (auto_epoch)
    or warn that the order repeats; never the resumed rest again, silently (the main process's
    copy, which never iterates, hands its pending resume to every generation of workers)."""
    saved = make(1, 0, auto_epoch=auto_epoch)
    it = iter(saved)
    head = [next(it)[:2] for _ in range(9)]
    state = saved.state_dict()
    stream = make(1, 0, auto_epoch=auto_epoch)
    stream.load_state_dict(state)
    loader = DataLoader(stream, batch_size=B, num_workers=2, collate_fn=collate, timeout=60)
    first = [x[:2] for b in loader for x in b]
    assert sorted(head + first) == sorted((s, r) for s, n in enumerate(SIZES) for r in range(n))
    if auto_epoch:
        for epoch in (1, 2):
            order = [tuple(x) for x in stream.sequence(epoch=epoch).tolist()]
            assert [x[:2] for b in loader for x in b] == order
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error", fastshard.EpochWarning)
            with pytest.raises(fastshard.EpochWarning, match="repeats the same order"):
                list(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_end_of_epoch_loader_state_then_set_epoch_reads_the_next(workers):
    """A StatefulDataLoader checkpoint taken after an epoch ended, restored, then set_epoch of
    the next epoch: the loader reads that epoch. Without workers torchdata loads the stream's
    own state (the saved epoch, at its end) when it makes the iterator, after set_epoch; that
    state must not take the stream back to the finished epoch."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(stream):
        return StatefulDataLoader(stream, batch_size=B, num_workers=workers, collate_fn=collate)

    first = loader(make(1, 0))
    epoch0 = [x[:2] for b in first for x in b]
    state = first.state_dict()
    stream = make(1, 0)
    again = loader(stream)
    again.load_state_dict(state)
    stream.set_epoch(1)
    order = [tuple(x) for x in stream.sequence(epoch=1).tolist()]
    assert order != epoch0
    assert [x[:2] for b in again for x in b] == order
    assert stream.epoch == 1


def test_epoch_warning_and_auto_epoch():
    stream = make(1, 0)
    first = [x[:2] for x in stream]
    with pytest.warns(fastshard.EpochWarning):
        again = [x[:2] for x in stream]
    assert again == first
    auto = make(1, 0, auto_epoch=True)
    a = [x[:2] for x in auto]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = [x[:2] for x in auto]
    assert auto.epoch == 1 and a == first and b != a and sorted(b) == sorted(a)


def test_len_and_pickle():
    stream = make(3, 2)
    assert len(stream) == -(-N // 3)
    assert len(DataLoader(stream, batch_size=B)) == -(-len(stream) // B)
    clone = pickle.loads(pickle.dumps(stream))
    assert [x[:2] for x in clone] == [x[:2] for x in stream]


def test_bad_input():
    with pytest.raises(ValueError, match=r"shard_sizes\[2\] = -1"):
        ShardedStream([3, 4, -1], Rows(), batch_size=2, num_replicas=1, rank=0)
    with pytest.raises(TypeError, match="integers"):
        ShardedStream([3.0, 4.5], Rows(), batch_size=2, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="2\\*\\*63"):
        ShardedStream([2**62, 2**62], Rows(), batch_size=2, num_replicas=1, rank=0)
    with pytest.raises(TypeError, match="callable"):
        ShardedStream([3], "not a function", batch_size=2, num_replicas=1, rank=0)
    for kw in ({"batch_size": 0}, {"batch_size": 2, "lanes": 0}, {"batch_size": 2, "window": 0}):
        with pytest.raises(ValueError):
            ShardedStream([3], Rows(), **kw, num_replicas=1, rank=0)
    with pytest.raises(ValueError):
        ShardedStream([3], Rows(), batch_size=2, num_replicas=2, rank=2)
    state = make(2, 0).state_dict()
    with pytest.raises(ValueError, match="seed"):
        make(2, 0, seed=6).load_state_dict(state)
    other = [*SIZES[:-1], SIZES[-1] + 1]
    with pytest.raises(ValueError, match="rows"):
        ShardedStream(
            other, Rows(), batch_size=B, lanes=24, window=4, seed=5, num_replicas=2, rank=0
        ).load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_short_read_names_the_shard(workers):
    stream = make(1, 0, read=Rows(short=(7, 50)))
    with pytest.raises(Exception) as err:
        run(stream, workers)
    text = str(err.value)
    assert "shard 7 has 90 rows" in text
    if workers == 0:
        assert isinstance(err.value, ShardReadError)


def test_empty_and_tiny():
    empty = ShardedStream([0, 0], Rows(), batch_size=2, num_replicas=1, rank=0)
    assert len(empty) == 0 and list(empty) == []
    one = ShardedStream([1], Rows(), batch_size=2, num_replicas=3, rank=2)
    assert [x[:2] for x in one] == [(0, 0)]  # padded: every rank yields the one item


def test_planning_is_lazy_in_the_shard_count():
    """10^6 shards: the plan is one word per shard, built in one pass (no Python loop)."""
    sizes = np.full(10**6, 7, dtype=np.int64)
    stream = ShardedStream(sizes, Rows(), batch_size=32, seed=1, num_replicas=1, rank=0)
    first = next(iter(stream))
    assert first[1] < 7 and 0 <= first[0] < 10**6
    with pytest.raises(ValueError, match="sum"):
        ShardedStream(
            np.full(4, 2**62, dtype=np.int64), Rows(), batch_size=1, num_replicas=1, rank=0
        )


def test_torch_tensor_sizes_and_stats():
    stream = ShardedStream(
        torch.tensor(SIZES), Rows(), batch_size=B, lanes=8, window=2, num_replicas=1, rank=0
    )
    it = iter(stream)
    items = list(it)
    assert len(items) == N
    assert it.rows_read == N and it.reads >= 1


@pytest.mark.parametrize("persistent", [False, True])
def test_auto_epoch_and_warning_with_workers(persistent):
    """Workers iterate copies of the stream (fresh ones every epoch unless persistent), yet
    auto_epoch advances after an epoch read to its end, and a repeat without set_epoch warns."""

    def epochs(stream, n):
        loader = DataLoader(
            stream, batch_size=B, num_workers=2, collate_fn=collate, persistent_workers=persistent
        )
        return [[x[:2] for b in loader for x in b] for _ in range(n)]

    auto = epochs(make(1, 0, auto_epoch=True), 3)
    assert all(sorted(e) == sorted(auto[0]) for e in auto)
    assert auto[0] != auto[1] != auto[2] != auto[0]
    explicit = make(1, 0)
    orders = []
    for e in range(3):
        explicit.set_epoch(e)
        orders.append(epochs(explicit, 1)[0])
    assert orders == auto  # the same epochs as set_epoch(0), (1), (2)
    # The warning comes from the workers (which inherit the filters): as an error it reaches
    # the main process; ignored, the epoch repeats.
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastshard.EpochWarning)
        with pytest.raises(fastshard.EpochWarning, match="repeats the same order"):
            epochs(make(1, 0), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastshard.EpochWarning)
        repeat = epochs(make(1, 0), 2)
    assert repeat[0] == repeat[1] == orders[0]


@pytest.mark.parametrize(("lanes", "window"), [(2, 1), (3, 4), (1, 5)])
def test_one_reader_opens_each_lane_piece_once(lanes, window):
    """A reader that owns every lane (one rank, no workers) reads each lane front to back:
    one read() per piece of a chunk in a lane, every row once, also when a batch holds
    several windows of one lane."""
    stream = ShardedStream(
        SIZES, Rows(), batch_size=B, lanes=lanes, window=window, seed=2, num_replicas=1, rank=0
    )
    it = iter(stream)
    assert sorted(x[:2] for x in it) == sorted(
        (s, r) for s, n in enumerate(SIZES) for r in range(n)
    )
    plan = stream._plan(0)
    pieces = 0
    for lane in range(lanes):
        start, length = plan.lane(lane)
        pieces += len(plan.segments(start, start + length))
    assert it.reads == pieces and it.rows_read == N


class Calls:
    """read(shard, start, stop) yielding (shard, row), recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, shard: int, start: int, stop: int):
        self.calls.append((shard, start, stop))
        return ((shard, row) for row in range(start, stop))


def test_an_item_waits_for_its_own_lane_only():
    """A batch's items come from several lanes, each read when its first item is reached:
    the first item of a batch of 8 lanes is yielded after the reads of one lane's window
    (at most 2 pieces: a window of 4 crosses at most one boundary of shards of 40), every
    later item after at most its own lane's, in the order of the global sequence."""
    read = Calls()
    stream = ShardedStream([40] * 6, read, batch_size=8, window=4, num_replicas=1, rank=0)
    it = iter(stream)
    items = []
    for k in range(24):
        before = len(read.calls)
        items.append(next(it))
        new = read.calls[before:]
        assert len(new) <= 2
        if k == 0:
            assert 1 <= len(new)
        shard, row = items[-1]
        assert any(s == shard and a <= row < b for s, a, b in read.calls)
    assert items == [tuple(x) for x in stream.sequence(0, 24).tolist()]
    assert it.reads == len(read.calls) <= 2 * 24


# -- batch diversity at the defaults -----------------------------------------------------------
def _global_shuffle_shards(sizes: np.ndarray, g: int) -> float:
    """The expected number of distinct shards among g items of a global shuffle (drawn
    without replacement): sum over shards of 1 - P(none of its items drawn)."""
    n = int(sizes.sum())
    i = np.arange(g)
    none = np.exp(np.log1p(-sizes[:, None] / (n - i[None, :])).sum(axis=1))
    return float((1 - none).sum())


@pytest.mark.parametrize(
    ("shards", "low", "high", "world", "batch"),
    [(64, 500, 1500, 2, 32), (2000, 20, 80, 2, 128), (300, 1, 2000, 4, 16)],
)
def test_global_batches_hold_as_many_shards_as_a_global_shuffle(shards, low, high, world, batch):
    """At the default lanes, window and chunk_size, a global batch draws from at least 0.8x
    as many shards as a global shuffle's batch would, and file neighbours (rows r and r + 1
    of a shard) share a global batch no more often than a global shuffle puts them there."""
    rng = np.random.default_rng(shards)
    sizes = rng.integers(low, high + 1, shards)
    n, g = int(sizes.sum()), world * batch
    stream = ShardedStream(sizes, Rows(), batch_size=batch, num_replicas=world, rank=0, seed=3)
    seq = stream.sequence()
    full = n // g
    distinct = np.mean([len(np.unique(b)) for b in seq[: full * g, 0].reshape(full, g)])
    assert distinct >= 0.8 * _global_shuffle_shards(sizes, g)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    position = np.empty(n, dtype=np.int64)
    position[starts[seq[:, 0]] + seq[:, 1]] = np.arange(n)
    batch_of = position // g
    same = pairs = 0
    for s in range(shards):
        b = batch_of[starts[s] : starts[s] + sizes[s]]
        pairs += len(b) - 1
        same += int((b[1:] == b[:-1]).sum())
    assert same / pairs <= (g - 1) / (n - 1)  # a global shuffle's rate


# -- resume with the default arguments ---------------------------------------------------------
@pytest.mark.parametrize(
    ("world", "batch", "workers", "new_world", "new_batch", "new_workers"),
    [
        (2, 6, 0, 3, 4, 2),  # 2 -> 3 ranks at a fixed global batch; 0 -> 2 workers
        (2, 4, 2, 3, 4, 2),  # 2 -> 3 ranks at a fixed per-rank batch
        (4, 3, 2, 2, 6, 0),  # 4 -> 2 ranks at a fixed global batch
        (4, 4, 2, 2, 4, 3),  # 4 -> 2 ranks at a fixed per-rank batch
        (1, 4, 0, 1, 4, 2),  # 0 -> 2 workers
    ],
)
def test_default_arguments_resume_on_other_ranks_and_workers(
    world, batch, workers, new_world, new_batch, new_workers
):
    """Streams built with the defaults (lanes among them, which depend on the batch size and
    the number of ranks) resume a loader's checkpoint on other ranks, batch sizes and
    workers: every item of the epoch exactly once (pad=False), the saved epoch read with its
    own lanes, and the next epoch with the new stream's."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    consumed, states = [], []
    for rank in range(world):
        stream = ShardedStream(
            SIZES, Rows(), batch_size=batch, num_replicas=world, rank=rank, pad=False
        )
        loader = StatefulDataLoader(
            stream, batch_size=batch, num_workers=workers, collate_fn=collate
        )
        it = iter(loader)
        consumed.extend(x[:2] for _ in range(3) for x in next(it))
        states.append(loader.state_dict())
        del it
    rest, lanes = [], set()
    for rank in range(new_world):
        stream = ShardedStream(
            SIZES, Rows(), batch_size=new_batch, num_replicas=new_world, rank=rank, pad=False
        )
        stream.load_state_dict(states[rank % world])  # any rank's loader state
        rest.extend(x[:2] for b in run(stream, new_workers) for x in b)
        lanes.add(stream.lanes)
        stream.set_epoch(1)
        assert stream._plan(1).lanes == stream.lanes  # the next epoch: this stream's lanes
    seen = Counter(consumed + rest)
    assert len(seen) == N and set(seen.values()) == {1}, "lost or repeated items"
    assert lanes == {8 * new_batch * new_world}


def test_explicit_lanes_must_equal_the_saved_ones():
    old = ShardedStream(SIZES, Rows(), batch_size=4, num_replicas=2, rank=0)
    it = iter(old)
    head = [next(it)[:2] for _ in range(5)]
    state = old.state_dict()
    assert state["lanes"] == 64
    other = ShardedStream(SIZES, Rows(), batch_size=4, num_replicas=3, rank=0, lanes=96)
    with pytest.raises(ValueError, match=r"saved with lanes=64 .* has lanes=96.*with lanes=64"):
        other.load_state_dict(state)
    assert other.remaining == len(other)  # left unchanged
    same = ShardedStream(SIZES, Rows(), batch_size=4, num_replicas=2, rank=0, lanes=64)
    same.load_state_dict(state)
    assert head + [x[:2] for x in same] == [x[:2] for b in run(make_default(2, 0), 0) for x in b]


def make_default(world: int, rank: int) -> ShardedStream:
    return ShardedStream(SIZES, Rows(), batch_size=4, num_replicas=world, rank=rank)


# -- epochs: every iteration starts one, the same in every worker ------------------------------
SMALL = [7, 0, 5, 3]  # 15 items: 4 batches of 4, two per worker


def _late_worker_one(worker_id: int) -> None:
    if worker_id == 1:
        time.sleep(1.0)  # worker 0 reads its whole share and stops before worker 1 starts


def _epoch_order(epoch: int, **kw) -> list[tuple[int, int]]:
    stream = ShardedStream(SMALL, Rows(), num_replicas=1, rank=0, seed=4, **kw)
    stream.set_epoch(epoch)
    return [x[:2] for x in stream]


@pytest.mark.parametrize("persistent", [False, True])
def test_auto_epoch_workers_of_one_iteration_read_one_epoch(persistent):
    """Worker 1 starts a second after worker 0 has read its share to the end: both still
    read the iteration's epoch (the epoch is decided once per iteration, not by timing)."""
    kw = dict(batch_size=4, lanes=4, window=2)
    stream = ShardedStream(SMALL, Rows(), num_replicas=1, rank=0, seed=4, auto_epoch=True, **kw)
    loader = DataLoader(
        stream,
        batch_size=4,
        num_workers=2,
        collate_fn=collate,
        persistent_workers=persistent,
        worker_init_fn=_late_worker_one,
    )
    for epoch in range(3):
        assert [x[:2] for b in loader for x in b] == _epoch_order(epoch, **kw)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("persistent", [False, True])
def test_auto_epoch_advances_after_an_epoch_cut_short(workers, persistent):
    """A loop that stops early (a break, max_steps, limit_train_batches) still gets the next
    epoch's order at its next iteration."""
    if persistent and not workers:
        pytest.skip("persistent workers need workers")
    stream = make(1, 0, auto_epoch=True)
    loader = DataLoader(
        stream, batch_size=B, num_workers=workers, collate_fn=collate, persistent_workers=persistent
    )
    firsts = []
    for _ in range(3):
        for i, batch in enumerate(loader):
            if i == 0:
                firsts.append([x[:2] for x in batch])
            if i == 2:
                break
    expected = []
    for epoch in range(3):
        reference = make(1, 0)
        reference.set_epoch(epoch)
        expected.append([x[:2] for x in reference][:B])
    assert firsts == expected and firsts[0] != firsts[1] != firsts[2]


def test_set_epoch_reaches_persistent_workers():
    stream = make(1, 0)
    loader = DataLoader(
        stream, batch_size=B, num_workers=2, collate_fn=collate, persistent_workers=True
    )
    orders = []
    for epoch in range(3):
        stream.set_epoch(epoch)
        orders.append([x[:2] for b in loader for x in b])
    for epoch in range(3):
        reference = make(1, 0)
        reference.set_epoch(epoch)
        assert orders[epoch] == [x[:2] for x in reference]


def test_main_process_state_of_a_stream_read_by_workers_refuses():
    stream = make(1, 0)
    loader = DataLoader(stream, batch_size=B, num_workers=2, collate_fn=collate)
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="StatefulDataLoader"):
        stream.state_dict()
    del it
    stream.set_epoch(1)  # a new pass that no worker has read yet
    state = stream.state_dict()
    assert (state["epoch"], state["cursor"]) == (1, 0)


def test_copies_get_a_shared_board_of_their_own():
    """pickle and deepcopy give a stream whose epoch board is shared memory (its workers see
    it: auto_epoch advances), separate from the original's (which still starts at epoch 0)."""
    stream = make(1, 0, auto_epoch=True)
    firsts = []
    for clone in (pickle.loads(pickle.dumps(stream)), copy.deepcopy(stream)):
        loader = DataLoader(clone, batch_size=B, num_workers=2, collate_fn=collate)
        first, second = ([x[:2] for b in loader for x in b] for _ in range(2))
        assert first != second and sorted(first) == sorted(second)
        firsts.append(first)
    loader = DataLoader(stream, batch_size=B, num_workers=2, collate_fn=collate)
    assert [x[:2] for b in loader for x in b] == firsts[0] == firsts[1]


def _worker_one_never_starts(worker_id: int) -> None:
    if worker_id == 1:
        time.sleep(120)  # the DataLoader ends this worker at shutdown, before it iterates


def _late_worker_zero(worker_id: int) -> None:
    if worker_id == 0:
        time.sleep(1.0)  # worker 1 reaches the epoch board first


def test_auto_epoch_worker_that_never_started_an_iteration_cut_short():
    """Two loaders seeded identically give their iterations the same key. The first
    iteration is cut short before its worker 1 started; in the next one worker 1 comes
    first: it starts the next epoch (the entry of the ended iteration is closed to it), and
    worker 0 joins it, so the iteration reads one epoch, every item once."""
    kw = dict(batch_size=4, lanes=4, window=2)
    stream = ShardedStream(SMALL, Rows(), num_replicas=1, rank=0, seed=4, auto_epoch=True, **kw)

    def loader(init):
        return DataLoader(
            stream,
            batch_size=4,
            num_workers=2,
            collate_fn=collate,
            worker_init_fn=init,
            generator=torch.Generator().manual_seed(7),
            timeout=60,
        )

    it = iter(loader(_worker_one_never_starts))
    first = [x[:2] for x in next(it)]  # worker 0's first batch of epoch 0
    del it  # shuts the workers down; worker 1 is still asleep in its init
    assert first == _epoch_order(0, **kw)[:4]
    second = [x[:2] for b in loader(_late_worker_zero) for x in b]
    assert second == _epoch_order(1, **kw)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="zombies as /proc shows them")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/stat")
def test_a_lock_holder_that_died_unreaped_frees_the_epoch_board(monkeypatch):
    """A process that died holding the board's lock, but that its parent has not reaped yet
    (a zombie), holds nothing: set_epoch takes the lock at once instead of waiting out the
    timeout and raising."""
    stream = make(1, 0)
    # This interpreter, not `true`: the release check runs the suite with a PATH of its own.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while _proc_state(child.pid) != "Z":  # exited, not reaped: child.wait() is not called
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    try:
        monkeypatch.setattr(type(stream._board), "LOCK_TIMEOUT", 5.0)
        stream._board.words[0] = child.pid  # it died inside the lock
        t0 = time.monotonic()
        stream.set_epoch(1)
        assert time.monotonic() - t0 < 2
        assert stream.epoch == 1 and stream._board.words[0] == 0
    finally:
        child.wait()


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


START_METHOD_CHILD = r"""
import json, sys, time
from torch.utils.data import DataLoader
import fastshard

class Rows:
    def __call__(self, shard, start, stop):
        return [(shard, row) for row in range(start, stop)]

def late_worker_one(worker_id):
    if worker_id == 1:
        time.sleep(0.5)  # worker 0 reads its share first

def collate(items):
    return items

def make(**kw):
    return fastshard.ShardedStream(
        [7, 0, 5, 3], Rows(), batch_size=4, lanes=4, window=2, num_replicas=1, rank=0,
        seed=4, **kw
    )

if __name__ == "__main__":
    method, persistent = sys.argv[1], sys.argv[2] == "1"
    loader = DataLoader(
        make(auto_epoch=True), batch_size=4, num_workers=2, collate_fn=collate,
        persistent_workers=persistent, multiprocessing_context=method,
        worker_init_fn=late_worker_one,
    )
    got = [[list(x) for b in loader for x in b] for _ in range(3)]
    want = []
    for epoch in range(3):
        reference = make()
        reference.set_epoch(epoch)
        want.append([list(x) for x in reference])
    print(json.dumps({"got": got, "want": want}))
"""


@pytest.mark.parametrize(
    ("method", "persistent"),
    [
        ("spawn", False),
        pytest.param("spawn", True, marks=pytest.mark.extended),
        pytest.param("forkserver", False, marks=pytest.mark.extended),
        pytest.param("forkserver", True, marks=pytest.mark.extended),
    ],
)
def test_auto_epoch_workers_agree_under_spawn_and_forkserver(tmp_path, method, persistent):
    """Workers that receive the stream by pickle (spawn, forkserver) share its epoch board:
    every worker of an iteration reads the iteration's epoch (worker 1 starts late), and
    each iteration the next epoch."""
    script = tmp_path / "child.py"
    script.write_text(START_METHOD_CHILD)
    proc = subprocess.run(
        [sys.executable, str(script), method, str(int(persistent))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["got"] == out["want"]
    assert len({json.dumps(order) for order in out["want"]}) == 3


def test_chunk_count_is_checked_up_front():
    with pytest.raises(ValueError, match=r"1000000000 chunks.*chunk_size of at least 60"):
        ShardedStream([10**9], Rows(), batch_size=128, chunk_size=1, num_replicas=1, rank=0)
