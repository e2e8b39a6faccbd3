"""One label convention per output, proven on a transformers causal LM: ``labels`` unshifted
(the model shifts them), ``shift_labels`` already shifted; a packed batch's loss equals the
loss of its documents computed one by one. And the packing arguments that cannot mean
anything are refused: ``long_docs`` with concat, ``BatchSampler`` over rows. The guide's
first example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fastshard
from fastshard import PackedSampler, PackedTokens, collate_rows

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "packing.md"
VOCAB = 101


def corpus(n=60, seed=0, hi=30):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, hi, n)
    lengths[:3] = 1  # documents of one token: nothing to predict in them
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(1, VOCAB, offsets[-1]).astype(np.int32)
    return lengths, offsets, tokens


def segments(row, seq_len):
    """(document, start, stop, first position in the row, the row spec's stop) of each
    segment's input tokens (with overlap, the row spec also holds the extra token)."""
    out, at = [], 0
    for d, a, b in np.asarray(row).tolist():
        n = min(b - a, seq_len - at)
        if n > 0:
            out.append((d, a, a + n, at, b))
        at += b - a
    return out


@pytest.mark.parametrize(
    ("mode", "overlap"), [("concat", True), ("concat", False), ("best_fit", False)]
)
def test_labels_unshifted_and_shift_labels_next_tokens(mode, overlap):
    lengths, offsets, tokens = corpus()
    seq = 24
    s = PackedSampler(lengths, seq, mode=mode, overlap=overlap, num_replicas=1, rank=0)
    data = PackedTokens(tokens, offsets, seq, overlap=overlap, pad_id=0)
    for row in s:
        item = data[row]
        ids, labels = item["input_ids"].tolist(), item["labels"].tolist()
        want_labels, want_shifted = [-100] * seq, [-100] * seq
        for d, a, b, at, stop in segments(row, seq):
            doc = tokens[offsets[d] : offsets[d + 1]].tolist()
            for i in range(a, b):
                t = at + i - a
                assert ids[t] == doc[i]
                if i > a:  # a segment's first token has no token before it in the row
                    want_labels[t] = doc[i]
                if i + 1 < stop:  # the row holds the next token (with overlap, its extra one)
                    want_shifted[t] = doc[i + 1]
        assert labels == want_labels
        shifted = item["shift_labels"].tolist()
        assert shifted == want_shifted
        assert shifted[:-1] == labels[1:]


def tiny_llama(attn: str):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        # Large weights, so that the logits are far from uniform and a target one token off
        # changes the loss by far more than the tolerance.
        initializer_range=0.5,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(torch.float64).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(
    ("mode", "overlap"), [("concat", True), ("concat", False), ("best_fit", False)]
)
def test_packed_loss_equals_the_documents_loss(attn, mode, overlap):
    """A packed batch given to a transformers causal LM as the guide says (input_ids,
    position_ids, labels; no attention mask; use_cache=False) computes the loss of its
    documents, each run alone: transformers builds a block-diagonal causal mask from the
    position ids that restart at every segment."""
    model = tiny_llama(attn)
    tol = 1e-9 if attn == "sdpa" else 1e-4  # logits of magnitude ~10
    lengths, offsets, tokens = corpus()
    seq = 24
    s = PackedSampler(lengths, seq, mode=mode, overlap=overlap, num_replicas=1, rank=0, seed=3)
    data = PackedTokens(tokens, offsets, seq, overlap=overlap)
    rows = [s[k] for k in range(4)]
    batch = collate_rows([data[r] for r in rows])
    with torch.no_grad():
        packed = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            labels=batch["labels"],
            use_cache=False,
        )
        # Each segment alone (a document, or the part of one this row holds), from position 0.
        total, count, alone_runs = torch.zeros((), dtype=torch.float64), 0, []
        for r, row in enumerate(rows):
            for _, a, b, at, _ in segments(row, seq):
                ids = batch["input_ids"][r, at : at + b - a]
                alone = model(input_ids=ids[None], use_cache=False).logits[0]
                # Documents isolated: every logit of the packed batch is the lone run's (to
                # float64 rounding with sdpa; eager takes its softmax in float32).
                assert torch.allclose(packed.logits[r, at : at + b - a], alone, rtol=0, atol=tol)
                ce = torch.nn.functional.cross_entropy(alone[:-1], ids[1:], reduction="sum")
                total, count = total + ce, count + len(ids) - 1
                alone_runs.append((r, at, alone))
        # The loss, over float32 logits (transformers upcasts to float32 and no further):
        # equal to within 1e-5 relative; a label one token off changes it by far more.
        assert packed.loss.item() == pytest.approx((total / count).item(), rel=1e-5, abs=0)
        assert int((batch["labels"] != -100).sum()) == count
        shifted_total, shifted_count = torch.zeros((), dtype=torch.float64), 0
        for r, at, alone in alone_runs:
            targets = batch["shift_labels"][r, at : at + len(alone)]
            keep = targets != -100
            shifted_total = shifted_total + torch.nn.functional.cross_entropy(
                alone[keep], targets[keep], reduction="sum"
            )
            shifted_count += int(keep.sum())
        # Megatron-style targets reach the model as shift_labels, never shifted again.
        both = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            labels=batch["labels"],
            shift_labels=batch["shift_labels"],
            use_cache=False,
        )
        want = (shifted_total / shifted_count).item()
        assert both.loss.item() == pytest.approx(want, rel=1e-5, abs=0)
        # The pre-shifted labels that overlap=True used to give, taken as labels, train two
        # tokens ahead: a different loss.
        ahead = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            labels=batch["shift_labels"],
            use_cache=False,
        )
        assert abs(ahead.loss.item() - (total / count).item()) > 1e-2


# -- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("long_docs", ["truncate", "split"])
def test_long_docs_is_refused_with_concat(long_docs):
    with pytest.raises(ValueError, match='long_docs applies to mode="best_fit" only'):
        PackedSampler([50, 60], 16, long_docs=long_docs, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="long_docs"):
        PackedSampler([50, 60], 16, mode="concat", long_docs="drop", num_replicas=1, rank=0)
    s = PackedSampler([50, 60], 16, mode="best_fit", long_docs=long_docs, num_replicas=1, rank=0)
    assert s.long_docs == long_docs
    assert PackedSampler([50, 60], 16, mode="best_fit", num_replicas=1, rank=0).long_docs == (
        "truncate"
    )


def test_concat_states_still_load():
    # States saved before concat refused long_docs carry long_docs="truncate": they load.
    s = PackedSampler(np.full(100, 9), 16, num_replicas=1, rank=0)
    state = s.state_dict(0)
    assert state["long_docs"] == "truncate"
    PackedSampler(np.full(100, 9), 16, num_replicas=2, rank=1).load_state_dict(state)


def test_a_raw_token_file_without_dtype_is_refused(tmp_path):
    # uint32 tokens (a vocabulary over 65,535) read as uint16 would be twice as many garbage ids
    lengths, offsets, _ = corpus()
    tokens = np.arange(offsets[-1], dtype=np.uint32) + 70_000
    tokens.tofile(tmp_path / "tokens.bin")
    np.save(tmp_path / "offsets.npy", offsets)
    with pytest.raises(ValueError, match="pass dtype="):
        PackedTokens(str(tmp_path / "tokens.bin"), str(tmp_path / "offsets.npy"), 16)
    with pytest.raises(ValueError, match="wrong dtype"):
        PackedTokens(tmp_path / "tokens.bin", tmp_path / "offsets.npy", 16, dtype=np.uint16)
    data = PackedTokens(tmp_path / "tokens.bin", tmp_path / "offsets.npy", 16, dtype=np.uint32)
    row = PackedSampler(lengths, 16, num_replicas=1, rank=0)[0]
    want = [70_000 + offsets[d] + i for d, a, b in row.tolist() for i in range(a, b)]
    assert data[row]["input_ids"].tolist() == want


def test_batch_sampler_refuses_rows():
    rows = PackedSampler(np.full(100, 9), 16, num_replicas=1, rank=0)
    with pytest.raises(
        TypeError, match=r"yields rows.*sampler=sampler, batch_size=B.*collate_rows"
    ):
        fastshard.BatchSampler(rows, 4)
    lengths = fastshard.LengthGroupedBatchSampler([3] * 10, 2, num_replicas=1, rank=0)
    with pytest.raises(TypeError, match="batch_sampler=sampler"):
        fastshard.BatchSampler(lengths, 4)


# -- the guide's first example --------------------------------------------------------------------
@pytest.mark.skipif(not GUIDE.is_file(), reason="docs/ is not part of the sdist")
def test_the_guides_first_example_runs(tmp_path):
    pytest.importorskip("transformers")
    code = re.search(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert code is not None
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code.group(1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # It prints its losses; a model that learns the data lowers them.
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", proc.stdout)]
    assert len(losses) >= 2 and losses[-1] < losses[0], proc.stdout
