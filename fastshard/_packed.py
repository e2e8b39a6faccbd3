"""Packed sequences: the unit of the epoch's global sequence is a row of ``seq_len`` tokens,
described by the (document, start, stop) token segments that fill it."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from . import _core, _validate
from ._length import _as_lengths
from ._sampler import _UnitSampler
from ._token_store import TokenStore

MODES = ("concat", "best_fit")
LONG_DOCS = ("truncate", "split")

# concat: documents per window of the order whose token count before it is kept (one uint64).
# A row is found by a binary search over the windows and a walk inside one, so the walk costs
# about window / 2 feistel evaluations and length reads per row while the sums cost 8 bytes per
# window per rank. Measured (bench/packing.py window, bench/RESULTS.md): 256 documents walk in
# ~3 us per row (far below reading a row's tokens), and 10^9 documents cost 31 MiB of sums.
CONCAT_WINDOW = 256
# best_fit: documents per packing window. Larger windows pack tighter (more documents to choose
# from) and cost more per window build (the window's documents are
# gathered, sorted and packed when a rank first reads one of its rows, ~24 bytes per document).
# Measured (bench/packing.py window): on 10^6 lognormal SFT lengths, seq_len 4096, efficiency
# 0.99854 / 0.99962 / 0.99989 / 0.99995 at 2**12 / 2**14 / 2**16 / 2**18, first row of a window
# after construction 0.007 / 0.008 / 0.014 / 0.044 s. Strata of windows keep the classes fine
# at any size (docs/packing.md), so the efficiency does not fall with n.
BEST_FIT_WINDOW = 2**16
# best_fit keeps one count per packing length and class: seq_len is bounded to keep that small.
MAX_BEST_FIT_SEQ_LEN = 2**22
_MAX_ROW_TOKENS = 2**62


def _seed_or_none(seed: Any) -> int | None:
    """The seed as an int where it is one (bool excepted), else None: None and bad seeds are
    left to the shared argument checks, which come after the lengths' own checks."""
    if isinstance(seed, (bool, np.bool_)):
        return None
    try:
        return operator.index(seed)
    except TypeError:
        return None


class PackedSampler(_UnitSampler):
    """Rows of ``seq_len`` tokens packed from variable-length documents, computed on the fly,
    for distributed training at any size. Use as
    ``DataLoader(PackedTokens(...), sampler=sampler, batch_size=B, collate_fn=collate_rows)``.

    Each element is one row: an int64 array of shape ``(segments, 3)`` whose lines are
    ``(document, start, stop)``, the token range ``[start, stop)`` of document ``document``;
    the row is the segments' tokens in that order. :class:`PackedTokens` reads it.

    ``mode="concat"`` (pretraining): the epoch's documents in a fresh keyed order, concatenated
    and cut into rows of exactly ``seq_len`` tokens (``overlap=True``: ``seq_len + 1`` tokens,
    consecutive rows sharing one token, Megatron-LM's layout). The last partial row is dropped
    (Megatron's choice): every other token of the epoch lies in exactly one row. The rows are
    then shuffled by a keyed permutation. Rows per epoch: ``total_tokens // seq_len``
    (``(total_tokens - 1) // seq_len`` with overlap), the same every epoch.

    ``mode="best_fit"`` (SFT): whole documents packed best-fit decreasing into rows of at most
    ``seq_len`` tokens, within windows of ``window`` documents of the epoch's order; a row's
    rest is padding. The row count is the same every epoch: windows are stratified by length
    class (each stratum of windows gets a fixed quota of each class, filled from the epoch's
    order, and its windows equal shares of it) and packed on the class bounds, so the count
    depends on the quotas alone (docs/packing.md). Strata hold enough windows that the classes
    stay fine at any size: the efficiency does not fall as the corpus grows.
    A document longer than ``seq_len``: ``long_docs="truncate"`` keeps its first ``seq_len``
    tokens; ``"split"`` cuts it into full rows of ``seq_len`` tokens and a last piece that is
    packed like a document.

    Ranks take rows ``r, r + W, ...`` of the epoch's global row sequence (the same for any
    number of ranks); the plan, padding, ``drop_last``, ``pad``, checkpoints and resume on
    another number of ranks are those of every fastshard sampler, in rows.

    Cost: beyond the lengths (read in place, never copied), one uint64 per ``window``
    documents per rank; once per epoch one threaded sequential read of the lengths, each
    placed in the epoch's order by the inverse permutation (concat with a ``seed`` given: the
    construction's one read of the lengths also does epoch 0's); best_fit also keeps a
    (strata x classes) count table per epoch and the stratum and window a rank reads (about 12
    and 24 bytes per document of them).

    Parameters
    ----------
    lengths : array-like of int
        The n >= 1 document lengths in tokens, each >= 1: a 1-D NumPy array of any integer
        dtype (``np.memmap`` included), a CPU tensor, or a list. Used in place when it is a
        C-contiguous native-endian integer array; do not modify it while the sampler is used.
    seq_len : int
        Tokens per row (>= 1).
    mode : {"concat", "best_fit"}
        ``"concat"`` (pretraining: documents concatenated and cut into rows) or ``"best_fit"``
        (SFT: whole documents packed best-fit into rows, with padding), as described above.
    overlap : bool
        concat only: rows of ``seq_len + 1`` tokens overlapping by one, as Megatron-LM's, so
        that the last input token has a target (``PackedTokens``' ``shift_labels``).
    long_docs : str or None
        best_fit only: what happens to a document longer than ``seq_len``, ``"truncate"``
        (what None means) or ``"split"``. Refused with concat, which cuts every document
        into rows.
    window : int, optional
        Documents per window of the order: default 256 for concat, 2**16 for best_fit
        (chosen by measurement, docs/packing.md).
    num_replicas, rank, seed, drop_last, pad, check_consistency, auto_epoch
        As for :class:`LengthGroupedBatchSampler`, in rows.

    Notes
    -----
    ``len(sampler)`` is this rank's number of rows per epoch; ``state_dict(consumed)`` counts
    rows. ``sampler[k]`` is this rank's k-th row; ``indices()`` is not available (the elements
    are rows, not indices).

    Raises
    ------
    ValueError
        A length below 1 (the index is named), lengths that sum to 2**63 or more, ``seq_len``
        out of range, fewer tokens than one row, an unknown ``mode`` or ``long_docs``,
        ``overlap`` with ``best_fit``, or ``long_docs`` with ``concat``.
    TypeError
        Lengths that are not integers.
    fastshard.InconsistentRanksError
        At the start of an iteration, on every rank, when the ranks disagree (the lengths
        are compared by checksum).

    Examples
    --------
    Five documents of 23 tokens in rows of 8 (the last 7 tokens, a partial row, are
    dropped):

    >>> import numpy as np
    >>> lengths = np.array([5, 3, 7, 2, 6])
    >>> rows = fastshard.PackedSampler(lengths, 8, num_replicas=1, rank=0, seed=0)
    >>> len(rows)
    2
    >>> rows[0].tolist()  # (document, start, stop) segments that fill row 0
    [[2, 1, 7], [4, 0, 2]]

    In training: ``DataLoader(fastshard.PackedTokens(tokens, offsets, 8), sampler=rows,
    batch_size=B, collate_fn=fastshard.collate_rows)``.
    """

    def __init__(
        self,
        lengths: Any,
        seq_len: int,
        *,
        mode: str = "concat",
        overlap: bool = False,
        long_docs: str | None = None,
        window: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int | None = 0,
        drop_last: bool = False,
        pad: bool = True,
        check_consistency: bool = True,
        auto_epoch: bool = False,
    ) -> None:
        arr = _as_lengths(lengths)
        if not isinstance(mode, str) or mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
        best_fit = mode == "best_fit"
        if long_docs is not None and not best_fit:
            raise ValueError(
                f'long_docs applies to mode="best_fit" only, got long_docs={long_docs!r} with '
                'mode="concat", which never truncates: it cuts every document into rows, '
                "continuing it in the next row"
            )
        if best_fit and long_docs is None:
            long_docs = "truncate"
        if long_docs is not None and (not isinstance(long_docs, str) or long_docs not in LONG_DOCS):
            raise ValueError(
                f"long_docs must be one of {', '.join(map(repr, LONG_DOCS))}, got {long_docs!r}"
            )
        high = MAX_BEST_FIT_SEQ_LEN if best_fit else _MAX_ROW_TOKENS
        self.seq_len = _validate.in_range(seq_len, "seq_len", 1, high)
        self.overlap = _validate.flag(overlap, "overlap")
        if best_fit and self.overlap:
            raise ValueError('overlap applies to mode="concat" only')
        if window is not None:
            window = _validate.in_range(window, "window", 1, _validate.MAX_LENGTH)
        self.mode = mode
        self.long_docs = long_docs
        self.window = window or (BEST_FIT_WINDOW if best_fit else CONCAT_WINDOW)
        # concat with a seed given: one sequential read of the lengths checks them, takes their
        # checksum and counts the tokens of epoch 0's windows (its rows, kept for the first
        # epoch if it is still epoch 0 when first read). Otherwise one read checks them and
        # takes the checksum, and the epoch's rows come from a read of their own when needed.
        start_seed = None if best_fit else _seed_or_none(seed)
        first_rows: Any = None
        if start_seed is not None:
            first_bad, total, overflow, checksum, first_rows = _core.concat_start(
                arr, self.seq_len, self.overlap, self.window, start_seed % 2**64, 0
            )
        else:
            first_bad, total, overflow, _, _, checksum = _core.scan_packed(arr, 1, checksum=True)
        if first_bad >= 0:
            raise ValueError(
                f"lengths[{first_bad}] = {arr[first_bad]}: every document must hold at least one "
                "token (drop empty documents before packing, so that every document appears "
                "in the epoch's rows)"
            )
        if overflow or total > _validate.MAX_LENGTH:
            raise ValueError(f"the lengths sum to more than 2**63 - 1 tokens ({total})")
        self.total_tokens = int(total)
        self.lengths = arr
        self._n = len(arr)
        self.dataset = range(self._n)
        self.lengths_checksum = int(checksum)  # scan_lengths's
        self._layout: Any = None
        if best_fit:
            self._layout = _core.PackLayout(arr, self.seq_len, long_docs == "split", self.window)
            self._num_rows = int(self._layout.num_rows)
        else:
            rows = (
                (self.total_tokens - 1) // self.seq_len
                if self.overlap
                else self.total_tokens // self.seq_len
            )
            if rows == 0:
                raise ValueError(
                    f"the documents hold {self.total_tokens} tokens, fewer than one row of "
                    f"seq_len={self.seq_len}{' + 1' if self.overlap else ''}"
                )
            self._num_rows = rows
        self.shuffle = True
        self.pad = _validate.flag(pad, "pad")
        self._set_shared_arguments(
            num_replicas, rank, seed, drop_last, check_consistency, auto_epoch
        )
        self._epoch_rows: Any = None  # (epoch, _core.PackedEpoch) of the latest epoch used
        self._start_pass()
        if first_rows is not None:  # epoch 0's, built with self.seed (the same integer)
            self._epoch_rows = (0, first_rows)

    _FROZEN = _UnitSampler._FROZEN | {"seq_len", "mode", "overlap", "long_docs"}

    # -- the epoch's rows -------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """The epoch's number of rows over all ranks (before padding or drop_last): fixed by
        the lengths and the configuration, the same every epoch."""
        return self._num_rows

    @property
    def efficiency(self) -> float:
        """Real tokens per row slot of an epoch (1 - padding), from the lengths alone."""
        if self._layout is None:
            return 1.0
        real = int(self._layout.packed_tokens) + int(self._layout.full_rows) * self.seq_len
        return real / (self._num_rows * self.seq_len)

    @property
    def truncated_tokens(self) -> int:
        """Tokens beyond ``seq_len`` dropped from documents by ``long_docs="truncate"``."""
        return 0 if self._layout is None else int(self._layout.truncated_tokens)

    def _rows(self) -> _core.PackedEpoch:
        cached = self._epoch_rows
        if cached is None or cached[0] != self.epoch:
            # Let the previous epoch's sums go before the new ones are built (a shard or
            # iterator of that epoch may still hold them), so that two are not kept for nothing.
            self._epoch_rows = cached = None
            seed, epoch = self.seed % 2**64, self.epoch % 2**64
            if self._layout is not None:
                rows = _core.best_fit_epoch(self._layout, seed, epoch)
            else:
                rows = _core.concat_epoch(
                    self.lengths, self.seq_len, self.overlap, self.window, seed, epoch
                )
            cached = self._epoch_rows = (self.epoch, rows)
        result: _core.PackedEpoch = cached[1]
        return result

    def _plan_args(self) -> tuple[int, bool, bool]:
        return self._num_rows, self.drop_last, self.pad

    def _make_shard(self, cursor: int) -> _core.PackedShard:  # type: ignore[override]
        return _core.packed_shard(
            self._rows(), self.num_replicas, self.rank, self.drop_last, cursor, self.pad
        )

    def _config(self) -> dict[str, Any]:
        return {
            "n": self._n,
            "seed": self.seed % 2**64,
            "seq_len": self.seq_len,
            "mode": self.mode,
            "overlap": self.overlap,
            # concat's is None; its states have always said "truncate", and still do.
            "long_docs": self.long_docs or "truncate",
            "window": self.window,
            "drop_last": self.drop_last,
            "pad": self.pad,
            "lengths_checksum": self.lengths_checksum,
        }

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_epoch_rows"] = None  # compiled objects: rebuilt after unpickling
        state["_layout"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.mode == "best_fit":
            self.__dict__["_layout"] = _core.PackLayout(
                self.lengths, self.seq_len, self.long_docs == "split", self.window
            )

    # -- access -----------------------------------------------------------------------------
    _unit, _units = "row", "rows"

    def _element(self, shard: _core.PackedShard, k: int) -> np.ndarray:
        return shard.row(k)

    def __repr__(self) -> str:
        extra = (
            f"overlap={self.overlap}" if self.mode == "concat" else f"long_docs={self.long_docs!r}"
        )
        return (
            f"{type(self).__name__}(n={self._n}, seq_len={self.seq_len}, mode={self.mode!r}, "
            f"{extra}, window={self.window}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"seed={self.seed}, epoch={self.epoch}, drop_last={self.drop_last}, pad={self.pad})"
        )


# -- reading rows ---------------------------------------------------------------------------
class PackedTokens(Dataset[dict[str, torch.Tensor]]):
    """The rows of a :class:`PackedSampler` read from a token store.

    ``dataset[row]`` for a row spec (the ``(segments, 3)`` array the sampler yields) returns

    - ``input_ids``: int64 ``[seq_len]``, the segments' tokens, then ``pad_id`` (best_fit);
    - ``labels``: int64 ``[seq_len]``, **unshifted**: the ``input_ids`` themselves, ``-100`` at
      padding and at the first token of every segment, for a model that shifts labels itself
      (every transformers causal LM): nothing is predicted across a document boundary;
    - ``shift_labels``: int64 ``[seq_len]``, **already shifted** (Megatron-LM's labels, and
      what transformers' causal LM loss takes as ``shift_labels``): at position ``t`` the
      token ``t + 1`` of the same segment, else ``-100``. With ``overlap`` the last position's
      target is the row's extra token; ``shift_labels[:-1] == labels[1:]`` always;
    - ``position_ids``: int64 ``[seq_len]``, restarting at 0 at every segment start (a document
      start, or the row's start for a document continued from the row before);
    - ``cu_seqlens``: int32 ``[segments + 1]``, the segments' boundaries (padding, if any, is
      the last segment), as flash-attention's varlen kernels take them.

    Forms: ``PackedTokens(store, seq_len)`` with a :class:`TokenStore` (its dtype is the
    store's), or ``PackedTokens(tokens, offsets, seq_len)``, the same as
    ``PackedTokens(TokenStore.flat(tokens, offsets, dtype=dtype), seq_len)``.

    Parameters
    ----------
    tokens : TokenStore, array or path
        A :class:`TokenStore`; or the flat token array (``np.memmap`` of a ``.bin`` file, a
        ``.npy`` file, or a raw file's path with ``dtype``; a path is reopened in each process
        instead of being pickled to DataLoader workers).
    offsets : array or path
        With a flat token array: n + 1 non-decreasing offsets (an array or a ``.npy`` file),
        document d is ``tokens[offsets[d]:offsets[d + 1]]``. Not with a store.
    seq_len : int
        The sampler's ``seq_len``.
    overlap : bool
        The sampler's ``overlap``.
    pad_id : int
        The token of best_fit padding.
    dtype : dtype, optional
        The token dtype of a raw token file: required there (never guessed), refused with a
        store (the store declares it).
    lengths : array, optional
        The sampler's lengths: checked against the store's (one pass, in chunks).

    Raises
    ------
    ValueError
        A raw token file without ``dtype`` (see :meth:`TokenStore.flat`), ``offsets``
        outside ``[0, len(tokens)]``, or ``lengths`` given that disagree with the store's
        (their count, or a document's length).
    TypeError
        ``offsets`` or ``dtype`` with a store, or no ``offsets`` without one.

    Examples
    --------
    >>> import numpy as np
    >>> lengths = np.array([5, 3, 7, 2, 6])
    >>> offsets = np.concatenate([[0], np.cumsum(lengths)])
    >>> data = fastshard.PackedTokens(np.arange(offsets[-1]), offsets, 8)
    >>> rows = fastshard.PackedSampler(lengths, 8, num_replicas=1, rank=0, seed=0)
    >>> item = data[rows[0]]
    >>> item["input_ids"].tolist()
    [9, 10, 11, 12, 13, 14, 17, 18]
    >>> item["labels"].tolist()  # unshifted: the model shifts them
    [-100, 10, 11, 12, 13, 14, -100, 18]
    >>> item["shift_labels"].tolist()  # the next token of the same document
    [10, 11, 12, 13, 14, -100, 18, -100]
    >>> item["position_ids"].tolist()  # restarting at every document
    [0, 1, 2, 3, 4, 5, 0, 1]
    """

    def __init__(
        self,
        tokens: Any,
        offsets: Any = None,
        seq_len: int | None = None,
        *,
        overlap: bool = False,
        pad_id: int = 0,
        dtype: Any = None,
        lengths: Any = None,
    ) -> None:
        if isinstance(tokens, TokenStore):
            if (
                seq_len is None
                and isinstance(offsets, (int, np.integer))
                and not isinstance(offsets, (bool, np.bool_))
            ):
                seq_len, offsets = int(offsets), None  # PackedTokens(store, seq_len)
            if offsets is not None:
                raise TypeError("a TokenStore holds its own offsets: PackedTokens(store, seq_len)")
            if dtype is not None:
                raise TypeError(f"a TokenStore declares its dtype ({tokens.dtype}): drop dtype=")
            store = tokens
        else:
            if offsets is None:
                raise TypeError(
                    "PackedTokens(tokens, offsets, seq_len) needs offsets; or pass a "
                    "TokenStore: PackedTokens(TokenStore.megatron(prefix), seq_len)"
                )
            store = TokenStore.flat(tokens, offsets, dtype=dtype)
        if seq_len is None:
            raise TypeError("seq_len is required")
        self.seq_len = _validate.in_range(seq_len, "seq_len", 1, _MAX_ROW_TOKENS)
        self.overlap = _validate.flag(overlap, "overlap")
        self.pad_id = _validate.integer(pad_id, "pad_id")
        self.store = store
        if lengths is not None:
            lens = _as_lengths(lengths)
            own = store.lengths
            if len(lens) != len(own):
                raise ValueError(f"lengths has {len(lens)} documents, the store {len(own)}")
            step = 1 << 22
            for a in range(0, len(lens), step):
                b = min(a + step, len(lens))
                bad = np.flatnonzero(np.asarray(own[a:b], dtype=np.int64) != lens[a:b])
                if bad.size:
                    d = a + int(bad[0])
                    raise ValueError(
                        f"lengths[{d}] = {int(lens[d])} does not match the store: document "
                        f"{d} holds {int(own[d])} tokens"
                    )

    def __getitem__(self, row: Any) -> dict[str, torch.Tensor]:
        spec = np.asarray(row, dtype=np.int64).reshape(-1, 3)
        width = self.seq_len + (1 if self.overlap else 0)
        parts, sizes = [], []
        for doc, start, stop in spec.tolist():
            toks, base, end = self.store._span(doc)
            if not 0 <= start < stop <= end - base:
                raise ValueError(
                    f"segment ({doc}, {start}, {stop}) lies outside document {doc} of "
                    f"{end - base} tokens: do the sampler's lengths match the store?"
                )
            parts.append(np.asarray(toks[base + start : base + stop], dtype=np.int64))
            sizes.append(stop - start)
        used = sum(sizes)
        if used > width:
            raise ValueError(f"the row holds {used} tokens, more than {width}")
        if used < width:
            parts.append(np.full(width - used, self.pad_id, dtype=np.int64))
        ids = np.concatenate(parts) if parts else np.full(width, self.pad_id, np.int64)
        bounds = np.zeros(len(sizes) + 1 + (used < width), dtype=np.int64)
        np.cumsum(sizes, out=bounds[1 : len(sizes) + 1])
        if used < width:
            bounds[-1] = width
        starts = np.zeros(width, dtype=np.int64)
        starts[bounds[:-1]] = 1
        seg = np.cumsum(starts) - 1  # segment of each token
        position = np.arange(width, dtype=np.int64) - bounds[seg]
        # labels: the tokens themselves where a model that shifts may predict them from the
        # token before (not at a segment's first token, not in padding).
        labels = ids.copy()
        labels[starts == 1] = -100
        labels[used:] = -100
        # shift_labels: each token's next token, where it is in the same segment and real.
        shifted = np.full(width, -100, dtype=np.int64)
        shifted[:-1] = labels[1:]
        if self.overlap:
            # width = seq_len + 1: the inputs are the first seq_len tokens; the extra token is
            # only the last input's target.
            n = self.seq_len
            ids, labels, shifted, position = ids[:n], labels[:n], shifted[:n], position[:n]
            cu = np.minimum(bounds, n)
            cu = np.concatenate([cu[:1], cu[1:][np.diff(cu) > 0]])
        else:
            cu = bounds
        return {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "shift_labels": torch.from_numpy(shifted),
            "position_ids": torch.from_numpy(position),
            "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
        }


def collate_rows(items: Sequence[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """A batch of :class:`PackedTokens` rows: ``input_ids``, ``labels`` (unshifted),
    ``shift_labels`` (shifted) and ``position_ids`` stacked to ``[B, seq_len]``;
    ``cu_seqlens`` (int32) the segment boundaries of the batch flattened to one sequence of
    ``B * seq_len`` tokens (what flash-attention's varlen kernels and transformers' flattening
    collator use), and ``max_seqlen``.

    A transformers causal LM takes ``input_ids``, ``position_ids`` and ``labels`` (it shifts
    them; give it no attention mask and ``use_cache=False``, so that it separates the
    documents by their position ids); a loss on already shifted targets takes
    ``shift_labels``. Never shift ``shift_labels`` again.

    Parameters
    ----------
    items : sequence of dict
        Rows of :class:`PackedTokens`, all of one ``seq_len``.

    Returns
    -------
    dict
        ``input_ids``, ``labels``, ``shift_labels``, ``position_ids`` (``[B, seq_len]``
        tensors), ``cu_seqlens`` (int32) and ``max_seqlen`` (int).

    Examples
    --------
    >>> import numpy as np
    >>> lengths = np.array([5, 3, 7, 2, 6])
    >>> offsets = np.concatenate([[0], np.cumsum(lengths)])
    >>> data = fastshard.PackedTokens(np.arange(offsets[-1]), offsets, 8)
    >>> rows = fastshard.PackedSampler(lengths, 8, num_replicas=1, rank=0, seed=0)
    >>> batch = fastshard.collate_rows([data[rows[0]], data[rows[1]]])
    >>> tuple(batch["input_ids"].shape), batch["cu_seqlens"].tolist()
    ((2, 8), [0, 6, 8, 13, 15, 16])
    """
    keys = [k for k in ("input_ids", "labels", "shift_labels", "position_ids") if k in items[0]]
    out: dict[str, Any] = {key: torch.stack([it[key] for it in items]) for key in keys}
    seq_len = out["input_ids"].shape[1]
    cus = [items[0]["cu_seqlens"]]
    cus += [it["cu_seqlens"][1:] + i * seq_len for i, it in enumerate(items) if i > 0]
    cu = torch.cat(cus).to(torch.int32)
    out["cu_seqlens"] = cu
    out["max_seqlen"] = int((cu[1:] - cu[:-1]).max()) if len(cu) > 1 else 0
    return out
