"""PackedSampler and PackedTokens: every token (concat) or document (best_fit) exactly once per
epoch over any number of ranks, rows read back equal to the documents, fixed row counts,
W-independence, resume, DataLoader workers and bad input."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from fastshard import EpochWarning, PackedSampler, PackedTokens, collate_rows


def corpus(n=2000, seed=0, hi=300, mean=3.5):
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(mean, 1.0, n)), 1, hi).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 60000, offsets[-1]).astype(np.uint16)
    return lengths, offsets, tokens


def rows_of(sampler):
    return [np.asarray(r) for r in sampler]


def all_rows(lengths, seq_len, world, epoch=0, **kw):
    out = []
    for r in range(world):
        s = PackedSampler(lengths, seq_len, num_replicas=world, rank=r, **kw)
        s.set_epoch(epoch)
        out.append(rows_of(s))
    return out


def token_cover(rows, offsets):
    cover = np.zeros(offsets[-1], dtype=np.int64)
    for row in rows:
        for d, a, b in row:
            cover[offsets[d] + a : offsets[d] + b] += 1
    return cover


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("overlap", [False, True])
def test_concat_every_token_once(world, overlap):
    lengths, offsets, _ = corpus()
    seq = 64
    per_rank = all_rows(lengths, seq, world, epoch=3, overlap=overlap, drop_last=True)
    assert len({len(r) for r in per_rank}) == 1  # equal counts
    rows = [row for rank in per_rank for row in rank]
    width = seq + overlap
    assert all(int((r[:, 2] - r[:, 1]).sum()) == width for r in rows)
    total = int(offsets[-1])
    n_rows = (total - 1) // seq if overlap else total // seq
    assert len(rows) == n_rows // world * world
    # the whole epoch (num_replicas=1): every token but the dropped partial row exactly once;
    # with overlap, the shared token of consecutive rows twice
    sampler = PackedSampler(lengths, seq, overlap=overlap, num_replicas=1, rank=0)
    sampler.set_epoch(3)
    whole = rows_of(sampler)
    cover = token_cover(whole, offsets)
    used = n_rows * seq
    if overlap:
        expected = np.ones(total, dtype=np.int64)
        expected[seq:used:seq] = 2
        expected[used + 1 :] = 0
    else:
        expected = np.zeros(total, dtype=np.int64)
        expected[:used] = 1
    # positions are in the epoch's concatenation order, not the file's: compare sorted counts
    assert sorted(cover.tolist()) == sorted(expected.tolist())
    # ranks' rows are the whole epoch's rows r, r + W, ...
    for r in range(world):
        assert all(np.array_equal(a, b) for a, b in zip(per_rank[r], whole[r::world]))


def test_concat_rows_follow_one_concatenation():
    lengths, offsets, _ = corpus(500)
    seq = 50
    s = PackedSampler(lengths, seq, num_replicas=1, rank=0)
    rows = rows_of(s)
    # unshuffle the rows: sort by the order in which their first segment appears
    stream = [tuple(seg) for row in rows for seg in row]
    docs = [d for d, _, _ in stream]
    assert set(docs) <= set(range(len(lengths)))
    # every document fully covered once except the tail after the last full row
    cover = token_cover(rows, offsets)
    assert cover.max() == 1 and cover.sum() == len(rows) * seq
    partial = [
        d for d in range(len(lengths)) if 0 < cover[offsets[d] : offsets[d + 1]].sum() < lengths[d]
    ]
    assert len(partial) <= 2  # the document cut by the dropped last row (and its neighbour)
    # neighbouring rows of a rank's step come from unrelated places of the document order
    firsts = [int(r[0, 0]) for r in rows[:20]]
    assert len(set(firsts)) >= 15  # (a document spanning two rows starts one and ends the other)


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("long_docs", ["truncate", "split"])
def test_best_fit_every_document_once(world, long_docs):
    lengths = corpus(3000, hi=400)[0]
    seq = 128
    per_rank = all_rows(
        lengths, seq, world, epoch=1, mode="best_fit", long_docs=long_docs, pad=False, window=700
    )
    assert max(len(r) for r in per_rank) - min(len(r) for r in per_rank) <= 1
    assert_best_fit_epoch([row for rank in per_rank for row in rank], lengths, seq, long_docs)


def assert_best_fit_epoch(rows: list, lengths: np.ndarray, seq: int, long_docs: str) -> None:
    """best_fit's rows of one epoch: each within seq_len, every document once; a long one
    truncated to its first seq_len tokens, or split into pieces of seq_len (the last shorter)
    that tile it."""
    assert all(int((r[:, 2] - r[:, 1]).sum()) <= seq for r in rows)
    pieces: dict[int, list[tuple[int, int]]] = {}
    for row in rows:
        for d, a, b in row:
            pieces.setdefault(int(d), []).append((int(a), int(b)))
    assert sorted(pieces) == list(range(len(lengths)))
    for d, segs in pieces.items():
        L = int(lengths[d])
        segs.sort()
        if long_docs == "truncate":
            assert segs == [(0, min(L, seq))]
        else:
            assert segs[0][0] == 0 and segs[-1][1] == L
            assert all(x[1] == y[0] for x, y in zip(segs, segs[1:]))
            assert all(b - a == seq for a, b in segs[:-1])


def test_best_fit_row_count_fixed_and_w_independent():
    lengths = corpus(5000, hi=600)[0]
    counts = set()
    seqs = {}
    for epoch in range(4):
        s = PackedSampler(
            lengths, 256, mode="best_fit", long_docs="split", num_replicas=1, rank=0, window=1000
        )
        s.set_epoch(epoch)
        rows = rows_of(s)
        counts.add(len(rows))
        seqs[epoch] = rows
        assert len(rows) == s.num_rows == len(s)
    assert len(counts) == 1
    # fresh rows every epoch
    assert [r.tolist() for r in seqs[0]] != [r.tolist() for r in seqs[1]]
    # W-independence: rank r of 3 = rows r, r + 3, ... of the global sequence
    for r in range(3):
        s = PackedSampler(
            lengths,
            256,
            mode="best_fit",
            long_docs="split",
            num_replicas=3,
            rank=r,
            window=1000,
            drop_last=True,
        )
        s.set_epoch(2)
        mine = rows_of(s)
        assert all(np.array_equal(a, b) for a, b in zip(mine, seqs[2][r::3]))


def test_best_fit_efficiency_reported():
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(5.5, 0.9, 40000), 1, 8192).astype(np.int64)
    s = PackedSampler(lengths, 4096, mode="best_fit", long_docs="split", num_replicas=1, rank=0)
    assert s.efficiency >= 0.99
    real = sum(int((r[:, 2] - r[:, 1]).sum()) for r in s)
    assert real == int(lengths.sum())
    assert real / (len(s) * 4096) == pytest.approx(s.efficiency)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_rows_read_back_from_memmap(tmp_path, mode):
    lengths, offsets, tokens = corpus(800, hi=200)
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    np.save(tmp_path / "offsets.npy", offsets)
    seq = 96
    overlap = mode == "concat"
    s = PackedSampler(lengths, seq, mode=mode, overlap=overlap, num_replicas=1, rank=0)
    data = PackedTokens(
        str(path),
        str(tmp_path / "offsets.npy"),
        seq,
        overlap=overlap,
        pad_id=7,
        dtype=np.uint16,
        lengths=lengths,
    )
    data = pickle.loads(pickle.dumps(data))  # a path travels, not the tokens
    assert data.store._parts is None
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    for row in list(s)[:60]:
        item = data[row]
        ids, labels, shifted, pos, cu = (
            item[k].numpy()
            for k in ("input_ids", "labels", "shift_labels", "position_ids", "cu_seqlens")
        )
        width = seq + overlap
        stream, positions, bounds, starts = [], [], [0], []
        for d, a, b in row:
            starts.append(len(stream))
            stream += mm[offsets[d] + a : offsets[d] + b].astype(np.int64).tolist()
            positions += list(range(b - a))
            bounds.append(len(stream))
        used = len(stream)
        stream += [7] * (width - used)
        positions += list(range(width - used))
        assert ids.shape == (seq,) and ids.tolist() == stream[:seq]
        assert pos.tolist() == positions[:seq]
        # labels unshifted (the row's own tokens), shift_labels the next ones (with overlap,
        # the last one is the extra token); -100 across segments and in padding.
        want = np.array(stream)
        want[starts] = -100
        want[used:] = -100
        assert labels.tolist() == want[:seq].tolist()
        nxt = np.array([*stream[1:], -100])
        nxt[np.isin(np.arange(1, width + 1), starts)] = -100
        nxt[max(used - 1, 0) :] = -100
        assert shifted.tolist() == nxt[:seq].tolist()
        if overlap:
            assert cu.tolist() == [b for b in bounds if b < seq] + [seq]
        else:
            assert cu.tolist() == bounds + ([seq] if used < seq else [])
        assert cu.dtype == np.int32


def test_collate_rows_flattens_boundaries():
    lengths, offsets, tokens = corpus(300)
    s = PackedSampler(lengths, 64, mode="best_fit", num_replicas=1, rank=0)
    data = PackedTokens(tokens, offsets, 64)
    items = [data[s[k]] for k in range(3)]
    batch = collate_rows(items)
    assert batch["input_ids"].shape == (3, 64)
    cu = batch["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == 3 * 64
    assert torch.all(cu[1:] > cu[:-1])
    assert batch["max_seqlen"] == int((cu[1:] - cu[:-1]).max())


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_exact_and_elastic_resume(mode):
    lengths = corpus(3000)[0]
    seq = 128
    kw = dict(mode=mode, pad=False)
    whole = rows_of(PackedSampler(lengths, seq, num_replicas=1, rank=0, **kw))
    key = lambda r: tuple(map(tuple, r.tolist()))  # noqa: E731
    # exact: 4 ranks, interrupted after 5 rows each
    samplers = [PackedSampler(lengths, seq, num_replicas=4, rank=r, **kw) for r in range(4)]
    its = [iter(s) for s in samplers]
    first = [[next(it) for _ in range(5)] for it in its]
    state = samplers[2].state_dict()
    assert state == samplers[0].state_dict()
    rest = []
    for r in range(4):
        s = PackedSampler(lengths, seq, num_replicas=4, rank=r, **kw)
        s.load_state_dict(state)
        rest.append(rows_of(s))
        uninterrupted = rows_of(PackedSampler(lengths, seq, num_replicas=4, rank=r, **kw))
        assert [key(x) for x in first[r] + rest[r]] == [key(x) for x in uninterrupted]
    # elastic: onto 3 ranks, every unconsumed row exactly once
    again = []
    for r in range(3):
        s = PackedSampler(lengths, seq, num_replicas=3, rank=r, **kw)
        s.load_state_dict(state)
        again += [key(x) for x in s]
    consumed = [key(x) for f in first for x in f]
    assert sorted(again + consumed) == sorted(key(x) for x in whole)


def test_state_guard_and_pickle():
    lengths = corpus(500)[0]
    s = PackedSampler(lengths, 64, mode="best_fit", num_replicas=2, rank=1, seed=5)
    t = PackedSampler(lengths, 32, mode="best_fit", num_replicas=2, rank=1, seed=5)
    with pytest.raises(ValueError):
        t.load_state_dict(s.state_dict())
    other = lengths.copy()
    other[3] += 1
    with pytest.raises(ValueError):
        PackedSampler(other, 64, mode="best_fit", num_replicas=2, rank=1, seed=5).load_state_dict(
            s.state_dict()
        )
    want = [x.tolist() for x in s]
    for clone in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
        clone.set_epoch(0)
        assert [x.tolist() for x in clone] == want
    with pytest.raises(AttributeError):
        s.seq_len = 3
    s.epoch = 4
    assert s.epoch == 4 and [x.tolist() for x in s] != want
    s.epoch = 4
    assert len(s) == len(rows_of(s))
    with pytest.raises(TypeError):
        s.indices()


def test_epoch_warning_and_auto_epoch():
    lengths = corpus(300)[0]
    s = PackedSampler(lengths, 64, num_replicas=1, rank=0)
    a = rows_of(s)
    with pytest.warns(EpochWarning):
        b = rows_of(s)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    s = PackedSampler(lengths, 64, num_replicas=1, rank=0, auto_epoch=True)
    a, b = rows_of(s), rows_of(s)
    assert [x.tolist() for x in a] != [x.tolist() for x in b] and len(a) == len(b)


def test_dataloader_two_workers_end_to_end():
    lengths, offsets, tokens = corpus(1500)
    seq = 64
    s = PackedSampler(lengths, seq, num_replicas=1, rank=0)
    data = PackedTokens(tokens, offsets, seq, lengths=lengths)
    loader = DataLoader(data, sampler=s, batch_size=8, num_workers=2, collate_fn=collate_rows)
    got = torch.cat([b["input_ids"] for b in loader])
    s.set_epoch(0)
    want = torch.stack([data[r]["input_ids"] for r in s])
    assert torch.equal(got, want) and got.shape == (len(s), seq)


def test_stateful_dataloader_resume_with_workers():
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    lengths, offsets, tokens = corpus(1500)
    seq = 64

    def loader():
        s = PackedSampler(lengths, seq, num_replicas=2, rank=1, mode="best_fit")
        d = PackedTokens(tokens, offsets, seq)
        return tdl.StatefulDataLoader(
            d, sampler=s, batch_size=4, num_workers=2, collate_fn=collate_rows
        )

    full = [b["input_ids"] for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it)["input_ids"] for _ in range(3)]
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    tail = [b["input_ids"] for b in second]
    assert all(torch.equal(a, b) for a, b in zip(head + tail, full)) and len(head + tail) == len(
        full
    )


def test_large_uint32_memmap_in_place(tmp_path):
    n = 2_000_000
    path = tmp_path / "lengths.u32"
    mm = np.memmap(path, dtype=np.uint32, mode="w+", shape=(n,))
    mm[:] = (np.arange(n, dtype=np.uint32) % 97) + 1
    mm.flush()
    lengths = np.memmap(path, dtype=np.uint32, mode="r")
    s = PackedSampler(lengths, 2048, num_replicas=8, rank=0)
    assert np.shares_memory(s.lengths, lengths)
    row = s[0]
    assert int((row[:, 2] - row[:, 1]).sum()) == 2048


@pytest.mark.parametrize(
    ("lengths", "kw", "err"),
    [
        ([3, 0, 2], {}, ValueError),
        ([3, -1, 2], {}, ValueError),
        ([3, 4], {"seq_len": 0}, ValueError),
        ([3, 4], {"seq_len": -5}, ValueError),
        ([3, 4], {"seq_len": 100}, ValueError),  # fewer tokens than a row
        ([3, 4], {"mode": "first_fit"}, ValueError),
        ([3, 4], {"mode": "best_fit", "overlap": True}, ValueError),
        ([3, 4], {"long_docs": "drop"}, ValueError),
        ([], {}, ValueError),
        ([1.5, 2.0], {}, TypeError),
    ],
)
def test_bad_input(lengths, kw, err):
    kw = {"seq_len": 4, **kw}
    with pytest.raises(err):
        PackedSampler(np.asarray(lengths) if lengths else lengths, num_replicas=1, rank=0, **kw)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_first_bad_length_is_named_whatever_thread_finds_it(threads):
    # The read's threads claim chunks of 2^16 lengths as they go, so a thread may meet a later
    # bad length than another one does: the error names the first of them all.
    import fastshard

    lengths = np.full(400_000, 7, dtype=np.uint32)
    lengths[[70_000, 250_000, 390_000]] = 0
    old = fastshard.get_num_threads()
    fastshard.set_num_threads(threads)
    try:
        for _ in range(5):
            with pytest.raises(ValueError, match=r"lengths\[70000\] = 0"):
                PackedSampler(lengths, 64, num_replicas=1, rank=0)
    finally:
        fastshard.set_num_threads(old)


def test_lengths_must_match_offsets():
    lengths, offsets, tokens = corpus(50)
    bad = lengths.copy()
    bad[10] += 1
    with pytest.raises(ValueError, match=r"lengths\[10\]"):
        PackedTokens(tokens, offsets, 32, lengths=bad)
    with pytest.raises(ValueError):
        PackedTokens(tokens, offsets, 32, lengths=lengths[:-1])
    data = PackedTokens(tokens, offsets, 32)
    with pytest.raises(ValueError, match="outside document"):
        data[np.array([[10, 0, int(lengths[10]) + 1]])]


# -- the construction's one read of the lengths (concat_start) ----------------------------------
@pytest.mark.parametrize(
    "dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
)
def test_construction_checksum_is_scan_lengths(dtype):
    from fastshard import _core

    rng = np.random.default_rng(3)
    arr = rng.integers(1, 100, 70_000).astype(dtype)
    want = int(_core.scan_lengths(arr)[3])
    for kw in ({"seed": 0}, {"seed": np.int64(5)}, {"mode": "best_fit"}):
        s = PackedSampler(arr, 16, num_replicas=2, rank=1, **kw)
        assert s.lengths_checksum == want, kw
    assert _core.scan_packed(arr, 1, checksum=True)[5] == want
    assert _core.concat_start(arr, 16, False, 256, 9, 0)[3] == want
    assert _core.concat_start(arr[:1], 1, False, 256, 9, 0)[3] == _core.scan_lengths(arr[:1])[3]
    # Bad lengths: the same checks and checksum, and no rows.
    bad = arr.copy()
    bad[[123, 45_678]] = 0
    first, _, _, checksum, rows = _core.concat_start(bad, 16, False, 256, 9, 0)
    assert (first, checksum, rows) == (123, _core.scan_lengths(bad)[3], None)


@pytest.mark.parametrize("window", [1, 7, 256, 100_000])
@pytest.mark.parametrize("overlap", [False, True])
def test_construction_rows_equal_the_epoch_built_later(window, overlap):
    # Epoch 0's rows, built during construction, are the rows concat_epoch builds on its own.
    from fastshard import _core

    lengths, _, _ = corpus(30_000, seed=4)
    first, total, overflow, _, rows = _core.concat_start(lengths, 64, overlap, window, 11, 0)
    assert (first, total, overflow) == (-1, int(lengths.sum()), False)
    later = _core.concat_epoch(lengths, 64, overlap, window, 11, 0)
    assert rows is not None and rows.num_rows == later.num_rows
    a = _core.packed_shard(rows, 1, 0, False, 0)
    b = _core.packed_shard(later, 1, 0, False, 0)
    for g in range(0, later.num_rows, 97):
        assert np.array_equal(a.global_row(g), b.global_row(g)), g
    # Through the sampler: epoch 0 kept from construction, then rebuilt after another epoch.
    s = PackedSampler(lengths, 64, overlap=overlap, window=window, seed=11, num_replicas=3, rank=2)
    assert s._epoch_rows is not None and s._epoch_rows[0] == 0
    first_pass = rows_of(s)
    s.set_epoch(1)
    rows_of(s)
    s.set_epoch(0)
    again = rows_of(s)
    assert len(again) == len(first_pass)
    assert all(np.array_equal(x, y) for x, y in zip(first_pass, again))


def test_construction_without_a_sequential_read():
    # Windows so small that no window table fits: the sums walk positions, and the checks and
    # checksum are a scan of their own, with the same results.
    from fastshard import _core

    n = 2**21 + 5
    arr = (np.arange(n) % 7 + 1).astype(np.uint8)
    first, total, overflow, checksum, rows = _core.concat_start(arr, 100, True, 1, 2, 0)
    assert (first, total, overflow) == (-1, int(arr.sum(dtype=np.int64)), False)
    assert checksum == _core.scan_lengths(arr)[3]
    later = _core.concat_epoch(arr, 100, True, 1, 2, 0)
    a = _core.packed_shard(rows, 1, 0, False, 0)
    b = _core.packed_shard(later, 1, 0, False, 0)
    for g in range(0, later.num_rows, 4099):
        assert np.array_equal(a.global_row(g), b.global_row(g)), g


@pytest.mark.parametrize("huge", ["few", "all"])
def test_window_sums_carry_past_32_bits(huge):
    # The threads' window tables hold 32-bit words: a sum that carries past 2^32 - 1, and any
    # length of 2^32 or more, leaves its carry in a spill list ("few"); a part with more than
    # 2^16 of them moves to 64-bit words ("all"). Rows from those tables (window 4096) must equal
    # the rows of the positional walk (window 1: no table fits, no 32-bit words at all).
    import fastshard
    from fastshard import _core

    n = 2**21 + 5
    rng = np.random.default_rng(8)
    if huge == "few":
        arr = rng.integers(1, 2**21, n).astype(np.int64)  # window sums of ~2^32: carries
        arr[rng.choice(n, 1000, replace=False)] = rng.integers(2**32, 2**36, 1000)
    else:
        arr = rng.integers(2**32, 2**33, n).astype(np.int64)
    seq = int(arr.sum()) // 5000  # about 5000 rows, each spanning hundreds of documents
    # Three threads whatever the machine: parts 1 and 2 fold into part 0's words, with carries.
    fastshard.set_num_threads(3)
    try:
        first, total, overflow, _, rows = _core.concat_start(arr, seq, False, 4096, 6, 0)
        later = _core.concat_epoch(arr, seq, False, 4096, 6, 1)  # another epoch, later
    finally:
        fastshard.set_num_threads(0)  # the default
    assert (first, total, overflow) == (-1, int(arr.sum()), False)
    walked = _core.concat_epoch(arr, seq, False, 1, 6, 0)
    walked_later = _core.concat_epoch(arr, seq, False, 1, 6, 1)
    for x, y in ((rows, walked), (later, walked_later)):
        assert x.num_rows == y.num_rows
        a = _core.packed_shard(x, 1, 0, False, 0)
        b = _core.packed_shard(y, 1, 0, False, 0)
        for g in range(0, y.num_rows, 37):
            assert np.array_equal(a.global_row(g), b.global_row(g)), g


# -- best_fit efficiency that does not fall with n --------------------------------------------
ONE = dict(num_replicas=1, rank=0)


def sft(n, seed=0):
    """The benchmarks' SFT lengths: lognormal (mu=5.5, sigma=1), clipped to [1, 16384]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(5.5, 1.0, n)), 1, 16384).astype(np.uint32)


def test_best_fit_efficiency_with_a_small_window_on_a_large_corpus():
    """window=2**12 on 10^7 documents: classes merged up to windows^2 / 32 documents each
    (2442 windows: 186,000 each) gave 0.85; packing windows grouped into strata keep them fine."""
    lengths = sft(10**7)
    s = PackedSampler(lengths, 4096, mode="best_fit", long_docs="split", window=2**12, **ONE)
    assert s.efficiency >= 0.995


@pytest.mark.parametrize("long_docs", ["split", "truncate"])
def test_best_fit_efficiency_at_the_class_granularity_of_1e9(long_docs):
    """10^9 documents in windows of 2**16 had classes of windows^2 / 32 = 7.3 * 10^-3 of n each
    (efficiency 0.945). 10^6 documents in windows of 2069 have that granularity: the merging must
    cost at most 0.001 of efficiency against exact classes (min_class_items=1) in the same
    windows."""
    from fastshard import _core

    lengths = sft(10**6)
    window = 2069
    s = PackedSampler(lengths, 4096, mode="best_fit", long_docs=long_docs, window=window, **ONE)
    exact = _core.PackLayout(lengths, 4096, long_docs == "split", window, 1)
    real = s._layout.packed_tokens + s._layout.full_rows * 4096
    assert s.efficiency >= real / (exact.num_rows * 4096) - 0.001
    assert s.efficiency >= 0.995
    assert s._layout.per_stratum > 1


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("long_docs", ["truncate", "split"])
def test_best_fit_strata_every_document_once(world, long_docs):
    """Windows grouped into strata (many windows: here 4 of 7 documents to a stratum): every
    document once, rows within seq_len, the same count every epoch and for every W."""
    lengths = corpus(20000, hi=400)[0]
    seq = 128
    kw = dict(mode="best_fit", long_docs=long_docs, pad=False, window=7)
    assert PackedSampler(lengths, seq, **ONE, **kw)._layout.per_stratum > 1
    counts = set()
    for epoch in (0, 1):
        per_rank = all_rows(lengths, seq, world, epoch=epoch, **kw)
        rows = [row for rank in per_rank for row in rank]
        counts.add(len(rows))
        assert_best_fit_epoch(rows, lengths, seq, long_docs)
    assert len(counts) == 1


def test_best_fit_strata_resume_onto_another_world():
    lengths = corpus(20000, hi=400)[0]
    seq = 128
    kw = dict(mode="best_fit", pad=False, window=7)
    key = lambda r: tuple(map(tuple, r.tolist()))  # noqa: E731
    whole = [key(x) for x in PackedSampler(lengths, seq, **ONE, **kw)]
    samplers = [PackedSampler(lengths, seq, num_replicas=2, rank=r, **kw) for r in range(2)]
    its = [iter(s) for s in samplers]
    first = [[key(next(it)) for _ in range(700)] for it in its]
    state = samplers[1].state_dict()
    again = []
    for r in range(3):
        s = PackedSampler(lengths, seq, num_replicas=3, rank=r, **kw)
        s.load_state_dict(state)
        again += [key(x) for x in s]
    assert sorted(again + [x for f in first for x in f]) == sorted(whole)


@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(6000, 9000),
    high=st.integers(1, 700),
    seq=st.integers(1, 300),
    window=st.integers(1, 2),
    long_docs=st.sampled_from(["truncate", "split"]),
    seed=st.integers(0, 2**32),
)
def test_best_fit_strata_property(n, high, seq, window, long_docs, seed):
    """Strata of packing windows on random lengths and seq_len: one row count in every epoch,
    every document in it (whole, truncated or split as asked), rows within seq_len."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, high + 1, n)
    kw = dict(mode="best_fit", long_docs=long_docs, window=window, seed=seed, **ONE)
    assert PackedSampler(lengths, seq, **kw)._layout.per_stratum > 1
    counts = set()
    for epoch in (0, 1):
        s = PackedSampler(lengths, seq, **kw)
        s.set_epoch(epoch)
        rows = rows_of(s)
        counts.add(len(rows))
        assert all(int((r[:, 2] - r[:, 1]).sum()) <= seq for r in rows)
        covered = np.zeros(n, np.int64)
        for row in rows:
            for d, a, b in row:
                covered[d] += b - a
        assert np.array_equal(
            covered, np.minimum(lengths, seq) if long_docs == "truncate" else lengths
        )
    assert counts == {PackedSampler(lengths, seq, **kw).num_rows}
