"""TokenStore: Megatron-LM indexed datasets, Arrow list columns and flat .bin + offsets read in
place with the dtype each store declares, and end to end through PackedSampler and
PackedTokens: every row equals the documents' tokens its segments name, checked against the
documents as they were written."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from fastshard import PackedSampler, PackedTokens, TokenStore, collate_rows

from .conftest import peer

DATA = Path(__file__).resolve().parent / "data"
# tests/data/megatron_int32.{bin,idx}: written by megatron-core 0.19.2's IndexedDatasetBuilder
# from fixture_documents() (test_the_fixture_is_megatron_cores_output rebuilds it when
# megatron-core is installed), so a checkout without it still reads a file Megatron wrote.
FIXTURE = DATA / "megatron_int32"


def fixture_documents() -> list[list[list[int]]]:
    """12 documents of token ids above 65,535 (int32); document 3 is two sequences, as
    Megatron-LM's preprocessing writes a sentence-split document."""
    docs = []
    for d in range(12):
        n = (d * 7) % 13 + 1
        tokens = [70_000 + 1000 * d + i for i in range(n)]
        docs.append([tokens[:2], tokens[2:]] if d == 3 else [tokens])
    return docs


def megatron():
    with warnings.catch_warnings():  # it warns that Transformer Engine and Apex are absent
        warnings.simplefilter("ignore")
        return peer("megatron.core.datasets.indexed_dataset")


def megatron_write(prefix: Path, docs: list[list[list[int]]], dtype) -> None:
    """Write documents (each a list of sequences) with Megatron-LM's own builder."""
    builder = megatron().IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for seqs in docs:
        flat = [t for s in seqs for t in s]
        builder.add_document(np.array(flat, dtype=np.int64), [len(s) for s in seqs])
    builder.finalize(f"{prefix}.idx")


def random_documents(n: int, seed: int, vocab: int, hi: int = 120) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(3.0, 1.0, n)), 1, hi).astype(int)
    return [rng.integers(0, vocab, k).tolist() for k in lengths]


def check_end_to_end(store: TokenStore, docs: list[list[int]], seq_len: int, mode: str) -> None:
    """Every row of an epoch read from the store equals the tokens its segments name in the
    documents as written; concat covers every token once (but the dropped tail), best_fit
    every document once."""
    assert len(store) == len(docs)
    assert store.lengths.tolist() == [len(d) for d in docs]
    sampler = PackedSampler(store.lengths, seq_len, mode=mode, num_replicas=1, rank=0, pad=False)
    data = PackedTokens(store, seq_len)
    seen = {}
    rows = list(sampler)
    for row in rows:
        item = data[row]
        want = [t for d, a, b in row.tolist() for t in docs[d][a:b]]
        got = item["input_ids"].tolist()
        assert got[: len(want)] == want and len(got) == seq_len
        for d, a, b in row.tolist():
            for i in range(a, b):
                assert (d, i) not in seen
                seen[d, i] = True
    total = sum(map(len, docs))
    if mode == "concat":
        assert len(seen) == len(rows) * seq_len > total - seq_len
    else:
        assert {d for d, _ in seen} == set(range(len(docs)))
    batch = collate_rows([data[r] for r in rows[:3]])
    assert batch["input_ids"].shape == (3, seq_len)


# -- Megatron-LM indexed datasets ----------------------------------------------------------------
def test_the_fixture_is_megatron_cores_output(tmp_path):
    megatron_write(tmp_path / "m", fixture_documents(), np.int32)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"m{ext}").read_bytes() == FIXTURE.with_suffix(ext).read_bytes()


def test_megatron_fixture_read_with_its_dtype():
    store = TokenStore.megatron(FIXTURE)
    assert store.kind == "megatron" and store.dtype == np.int32
    seqs = [s for doc in fixture_documents() for s in doc]  # Megatron's units: sequences
    assert len(store) == len(seqs) == 13
    assert [store[i].tolist() for i in range(len(store))] == seqs
    lengths = store.lengths
    assert lengths.dtype == np.int32 and lengths.flags.aligned and lengths.flags.c_contiguous
    check_end_to_end(store, seqs, 16, "concat")
    check_end_to_end(store, seqs, 16, "best_fit")


@pytest.mark.parametrize(("dtype", "vocab"), [(np.uint16, 50_000), (np.int32, 200_000)])
@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_megatron_store_end_to_end(tmp_path, dtype, vocab, mode):
    docs = random_documents(300, seed=vocab, vocab=vocab)
    megatron_write(tmp_path / "corpus", [[d] for d in docs], dtype)
    store = TokenStore.megatron(tmp_path / "corpus")
    assert store.dtype == dtype
    with warnings.catch_warnings():  # it warns that it cannot tell its rank
        warnings.simplefilter("ignore")
        reader = megatron().IndexedDataset(str(tmp_path / "corpus"))  # Megatron's own reader
        assert all(np.array_equal(store[i], reader[i]) for i in range(len(reader)))
    check_end_to_end(store, docs, 64, mode)


def test_megatron_store_pickles_as_its_prefix():
    data = PackedTokens(TokenStore.megatron(FIXTURE), 16)
    sampler = PackedSampler(data.store.lengths, 16, num_replicas=1, rank=0)
    blob = pickle.dumps(data)
    assert len(blob) < 1000
    again = pickle.loads(blob)
    assert again.store._parts is None  # reopened on first use
    assert all(torch.equal(again[r]["input_ids"], data[r]["input_ids"]) for r in sampler)


def test_megatron_bad_files(tmp_path):
    idx, binp = FIXTURE.with_suffix(".idx").read_bytes(), FIXTURE.with_suffix(".bin").read_bytes()

    def store(idx_bytes: bytes, bin_bytes: bytes = binp) -> TokenStore:
        (tmp_path / "x.idx").write_bytes(idx_bytes)
        (tmp_path / "x.bin").write_bytes(bin_bytes)
        return TokenStore.megatron(tmp_path / "x")

    with pytest.raises(ValueError, match="not a Megatron-LM index"):
        store(b"NOTANIDX" + idx[8:])
    with pytest.raises(ValueError, match="version 2"):
        store(idx[:9] + (2).to_bytes(8, "little") + idx[17:])
    with pytest.raises(ValueError, match="truncated"):
        store(idx[:-9])
    with pytest.raises(TypeError, match="integer dtype"):
        store(idx[:17] + bytes([7]) + idx[18:])  # float32
    with pytest.raises(ValueError, match="whole number"):
        store(idx, binp[:-2])
    with pytest.raises(FileNotFoundError):
        TokenStore.megatron(tmp_path / "missing")


def _as_uint16_index(idx: bytes) -> bytes:
    """The fixture's int32 index rewritten as a uint16 corpus's: dtype code 8 and byte
    pointers halved (the index Megatron writes for the same documents at uint16)."""
    seqs = int.from_bytes(idx[18:26], "little")
    at = 34 + 4 * seqs
    pointers = np.frombuffer(idx, np.int64, seqs, at) // 2
    return idx[:17] + bytes([8]) + idx[18:at] + pointers.tobytes() + idx[at + 8 * seqs :]


def test_megatron_bin_that_is_not_the_indexs(tmp_path):
    """A .bin whose size is not where the index's last sequence ends is refused at
    construction, with both sizes; a .bin of another dtype is named as the likely cause."""
    idx, binp = FIXTURE.with_suffix(".idx").read_bytes(), FIXTURE.with_suffix(".bin").read_bytes()

    def store(idx_bytes: bytes, bin_bytes: bytes) -> TokenStore:
        (tmp_path / "x.idx").write_bytes(idx_bytes)
        (tmp_path / "x.bin").write_bytes(bin_bytes)
        return TokenStore.megatron(tmp_path / "x")

    assert store(idx, binp).lengths.sum() * 4 == len(binp)  # the pair itself is fine
    # An int32 .bin beside the uint16 index of the same documents: twice the bytes.
    wrong_dtype = r"dtype uint16.*not the \.bin of this index.*4-byte tokens"
    with pytest.raises(ValueError, match=wrong_dtype):
        store(_as_uint16_index(idx), binp)
    with pytest.raises(ValueError, match=rf"holds {len(binp) + 8} bytes.* end at byte {len(binp)}"):
        store(idx, binp + bytes(8))  # longer
    with pytest.raises(ValueError, match=rf"holds {len(binp) - 8} bytes.* end at byte {len(binp)}"):
        store(idx, binp[:-8])  # shorter, still whole tokens


def test_megatron_path_with_a_suffix(tmp_path):
    """The .bin or the .idx path names the pair as well as the prefix; a path that names
    neither says to pass the prefix."""
    prefix = FIXTURE
    want = TokenStore.megatron(prefix).lengths.tolist()
    for path in (f"{prefix}.bin", f"{prefix}.idx", prefix.with_suffix(".bin")):
        store = TokenStore.megatron(path)
        assert store.lengths.tolist() == want
        # The store names (and workers reopen) the pair by its prefix.
        assert repr(store).startswith(f"TokenStore.megatron({str(prefix)!r},")
    with pytest.raises(FileNotFoundError, match=r"missing\.idx.*pass the prefix"):
        TokenStore.megatron(tmp_path / "missing.bin")
    # A prefix that itself ends in .bin is still a prefix when its pair exists.
    for suffix in (".bin", ".idx"):
        (tmp_path / f"c.bin{suffix}").write_bytes(FIXTURE.with_suffix(suffix).read_bytes())
    store = TokenStore.megatron(tmp_path / "c.bin")
    assert repr(store).startswith(f"TokenStore.megatron({str(tmp_path / 'c.bin')!r},")


# -- Arrow columns -------------------------------------------------------------------------------
def test_pyarrow_list_arrays_zero_copy():
    pa = pytest.importorskip("pyarrow")
    docs = random_documents(400, seed=1, vocab=150_000)
    for kind in (pa.list_(pa.uint32()), pa.large_list(pa.int64())):
        arr = pa.array(docs, type=kind)
        store = TokenStore.arrow(arr)
        assert store.dtype == kind.value_type.to_pandas_dtype()
        values = arr.values.to_numpy(zero_copy_only=True)
        assert np.shares_memory(store[5], values)  # read in place
        check_end_to_end(store, docs, 64, "concat")


def test_pyarrow_chunked_and_sliced():
    pa = pytest.importorskip("pyarrow")
    docs = random_documents(500, seed=2, vocab=1000)
    whole = pa.array(docs, type=pa.list_(pa.int16()))
    # Chunks that are slices of one array (offsets not starting at 0) and an empty chunk.
    chunked = pa.chunked_array([whole.slice(0, 170), whole.slice(170, 0), whole.slice(170)])
    store = TokenStore.arrow(chunked)
    assert [store[i].tolist() for i in (0, 169, 170, 499)] == [docs[i] for i in (0, 169, 170, 499)]
    check_end_to_end(store, docs, 48, "best_fit")
    table = pa.table({"input_ids": chunked})
    assert TokenStore.arrow(table, "input_ids").lengths.tolist() == [len(d) for d in docs]


def test_datasets_column(tmp_path):
    datasets = peer("datasets")
    docs = random_documents(300, seed=3, vocab=128_000)
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("uint32"))})
    ds = datasets.Dataset.from_dict({"input_ids": docs}, features=features)
    ds.save_to_disk(str(tmp_path / "ds"))
    ds = datasets.load_from_disk(str(tmp_path / "ds"))  # memory-mapped, as after .map()
    store = TokenStore.arrow(ds["input_ids"])
    assert store.dtype == np.uint32
    check_end_to_end(store, docs, 64, "concat")
    same = TokenStore.arrow(ds, "input_ids")
    assert same.lengths.tolist() == store.lengths.tolist()
    # pickled to DataLoader workers as the dataset's files, not its tokens
    blob = pickle.dumps(PackedTokens(store, 64))
    assert len(blob) < 4000 < 4 * sum(map(len, docs))  # the tokens: ~38 kB
    again = pickle.loads(blob)
    assert again.store[7].tolist() == docs[7]
    with pytest.raises(ValueError, match="flatten_indices"):
        TokenStore.arrow(ds.shuffle(seed=0)["input_ids"])
    flat = ds.shuffle(seed=0).flatten_indices()
    assert TokenStore.arrow(flat["input_ids"])[0].tolist() == flat[0]["input_ids"]


def test_arrow_refusals():
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(ValueError, match="document 1 is null"):
        TokenStore.arrow(pa.array([[1, 2], None, [3]], type=pa.list_(pa.int32())))
    with pytest.raises(ValueError, match="null tokens"):
        TokenStore.arrow(pa.array([[1, None]], type=pa.list_(pa.int32())))
    with pytest.raises(TypeError, match="lists of integers"):
        TokenStore.arrow(pa.array([[1.5]], type=pa.list_(pa.float32())))
    with pytest.raises(TypeError, match="lists of integers"):
        TokenStore.arrow(pa.array([1, 2]))
    with pytest.raises(TypeError, match="name the token column"):
        TokenStore.arrow(pa.table({"ids": pa.array([[1]])}))
    with pytest.raises(TypeError):
        TokenStore.arrow([[1, 2], [3]])


# -- flat .bin + offsets -------------------------------------------------------------------------
def flat_files(tmp_path: Path, docs: list[list[int]], dtype) -> tuple[Path, Path]:
    tokens = np.array([t for d in docs for t in d], dtype=dtype)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    tokens.tofile(tmp_path / "tokens.bin")
    np.save(tmp_path / "offsets.npy", offsets)
    return tmp_path / "tokens.bin", tmp_path / "offsets.npy"


def test_flat_bin_end_to_end(tmp_path):
    docs = random_documents(300, seed=4, vocab=150_000)
    tokens, offsets = flat_files(tmp_path, docs, np.uint32)
    store = TokenStore.flat(tokens, offsets, dtype=np.uint32)
    assert store.lengths.dtype == np.uint32 and store.lengths.flags.aligned
    check_end_to_end(store, docs, 64, "concat")
    # the form PackedTokens always had, with the dtype stated
    data = PackedTokens(str(tokens), str(offsets), 64, dtype=np.uint32)
    assert len(pickle.dumps(data)) < 2000
    row = PackedSampler(store.lengths, 64, num_replicas=1, rank=0)[0]
    assert torch.equal(data[row]["input_ids"], PackedTokens(store, 64)[row]["input_ids"])


def test_a_raw_token_file_needs_its_dtype(tmp_path):
    docs = random_documents(50, seed=5, vocab=150_000)
    tokens, offsets = flat_files(tmp_path, docs, np.uint32)
    with pytest.raises(ValueError, match="dtype"):
        PackedTokens(str(tokens), str(offsets), 32)  # read as uint16 before: 2x garbage ids
    with pytest.raises(ValueError, match="dtype"):
        TokenStore.flat(tokens, offsets)
    with pytest.raises(ValueError, match="wrong dtype"):
        TokenStore.flat(tokens, offsets, dtype=np.uint16)  # twice as many "tokens"
    np.arange(3, dtype=np.uint16).tofile(tmp_path / "odd.bin")
    with pytest.raises(ValueError, match="whole number"):
        TokenStore.flat(tmp_path / "odd.bin", [0, 1], dtype=np.uint32)  # 6 bytes
    np.save(tmp_path / "tokens.npy", np.fromfile(tokens, dtype=np.uint32))
    assert TokenStore.flat(tmp_path / "tokens.npy", offsets).dtype == np.uint32  # its header's
    with pytest.raises(ValueError, match="raw file"):
        TokenStore.flat(tmp_path / "tokens.npy", tokens)  # raw offsets: their dtype unknown


def test_flat_arrays_and_refusals():
    tokens = np.arange(20, dtype=np.int32)
    store = TokenStore.flat(tokens, [0, 5, 5, 20])
    assert store.lengths.tolist() == [5, 0, 15] and store.dtype == np.int32
    assert np.shares_memory(store[2], tokens)
    with pytest.raises(ValueError, match="hold int32"):
        TokenStore.flat(tokens, [0, 20], dtype=np.uint16)
    with pytest.raises(TypeError, match="integer dtype"):
        TokenStore.flat(np.zeros(4, np.float32), [0, 4])
    with pytest.raises(ValueError, match="must lie in"):
        TokenStore.flat(tokens, [0, 21])
    with pytest.raises(ValueError, match="must not decrease"):
        _ = TokenStore.flat(tokens, [0, 6, 5, 20]).lengths
    with pytest.raises(TypeError, match=r"TokenStore\.megatron"):
        TokenStore()
    with pytest.raises(TypeError, match="own offsets"):
        PackedTokens(store, [0, 20], 8)
    with pytest.raises(TypeError, match="declares its dtype"):
        PackedTokens(store, 8, dtype=np.int32)
    with pytest.raises(TypeError, match="needs offsets"):
        PackedTokens(tokens, seq_len=8)
    assert PackedTokens(store, seq_len=8).seq_len == 8


def test_lengths_are_checked_against_the_store():
    store = TokenStore.megatron(FIXTURE)
    good = np.array([len(s) for doc in fixture_documents() for s in doc])
    PackedTokens(store, 16, lengths=good)
    bad = good.copy()
    bad[4] += 1
    with pytest.raises(ValueError, match=r"lengths\[4\]"):
        PackedTokens(store, 16, lengths=bad)
