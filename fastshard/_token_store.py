"""Token stores: documents of token ids read in place from the formats corpora are kept in,
with the dtype each store declares (never a default)."""

from __future__ import annotations

import bisect
import importlib
import os
import struct
from typing import Any, cast

import numpy as np

from . import _validate

# Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py, `_IndexWriter`):
# the .idx file is this header, a little-endian uint64 version (1), a uint8 dtype code, uint64
# sequence and document counts, then int32 sequence lengths, int64 byte pointers into the .bin
# and int64 document indices (and, for multimodal data, int8 modes, not read here).
_MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
_MEGATRON_HEAD = 34
_MEGATRON_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_CHUNK = 1 << 22  # documents per step of the passes over offsets


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def _token_dtype(dtype: Any, what: str) -> np.dtype:
    try:
        dt: np.dtype = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(f"{what}: {err}") from None
    if dt.kind not in "iu":
        raise TypeError(f"{what} must be an integer dtype (token ids), got {dt}")
    return dt


def _int_array(value: Any, name: str) -> np.ndarray:
    arr = _validate.host_array(value, name, "integers")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {arr.dtype}")
    return arr


def _lengths_from_offsets(parts: list[np.ndarray]) -> np.ndarray:
    """The documents' lengths from each part's n_i + 1 offsets, in one new aligned array of
    the narrowest of uint32 and int64 that holds them (4 bytes a document where it can)."""
    n = sum(len(p) - 1 for p in parts)
    span = max((int(p[-1]) - int(p[0]) for p in parts), default=0)
    out = np.empty(n, dtype=np.uint32 if span < 2**32 else np.int64)
    at = 0
    for offs in parts:
        for a in range(0, len(offs) - 1, _CHUNK):
            b = min(a + _CHUNK, len(offs) - 1)
            diff = np.diff(np.asarray(offs[a : b + 1], dtype=np.int64))
            bad = np.flatnonzero(diff < 0)
            if bad.size:
                d = a + int(bad[0])
                raise ValueError(
                    f"offsets must not decrease: offsets[{d + 1}] = {int(offs[d + 1])} < "
                    f"offsets[{d}] = {int(offs[d])}"
                )
            out[at + a : at + b] = diff
        at += len(offs) - 1
    return out


def _megatron_prefix(path: str) -> str:
    """The prefix of a Megatron-LM pair named by its prefix, its ``.bin`` or its ``.idx``."""
    if os.path.exists(path + ".idx"):
        return path  # a prefix, even one that itself ends in .bin or .idx
    stem, suffix = os.path.splitext(path)
    if suffix in (".bin", ".idx") and os.path.exists(stem + ".idx"):
        return stem
    tried = f"{path}.idx" + (f" nor {stem}.idx" if suffix in (".bin", ".idx") else "")
    raise FileNotFoundError(
        f"TokenStore.megatron({path!r}): found no Megatron-LM index {tried}: pass the prefix, "
        "the path of the .bin and .idx pair without its suffix (as Megatron-LM's --data-path)"
    )


class TokenStore:
    """Documents of token ids, read in place from a store, with the store's own dtype.

    Build one with :meth:`megatron` (a Megatron-LM indexed dataset), :meth:`arrow` (an Arrow
    list column: a ``datasets.Dataset`` column or a ``pyarrow`` array) or :meth:`flat` (a flat
    token array or ``.bin`` file and its offsets). ``store.lengths`` are the documents' lengths
    for :class:`PackedSampler`; ``PackedTokens(store, seq_len)`` reads the sampler's rows from
    it. Nothing is copied or converted except the lengths where the store does not keep them
    as an aligned array (Arrow and flat stores keep offsets; Megatron's index keeps its
    lengths two bytes off alignment): those are computed once, on first use of ``lengths``.

    A store pickles as its source (the paths, or the ``datasets.Dataset``, which pickles as its
    cache files), so DataLoader workers reopen it instead of receiving its tokens; a
    ``pyarrow`` array or NumPy array given directly pickles by value.

    Attributes
    ----------
    dtype : numpy.dtype
        The token dtype the store declares.
    kind : str
        ``"megatron"``, ``"arrow"`` or ``"flat"``.

    Examples
    --------
    >>> import numpy as np
    >>> tokens = np.arange(100, 110, dtype=np.uint32)
    >>> store = fastshard.TokenStore.flat(tokens, [0, 4, 7, 10])
    >>> len(store), store.dtype, store.lengths.tolist()
    (3, dtype('uint32'), [4, 3, 3])
    >>> store[1].tolist()
    [104, 105, 106]
    """

    kind: str
    dtype: np.dtype
    _source: tuple[Any, ...]
    _parts: Any  # (starts, parts) once opened, else None
    _lengths: np.ndarray | None

    def __init__(self) -> None:
        raise TypeError(
            "build a TokenStore with TokenStore.megatron(prefix), TokenStore.arrow(column) "
            "or TokenStore.flat(tokens, offsets, dtype=...)"
        )

    @classmethod
    def _make(cls, kind: str, source: tuple[Any, ...]) -> TokenStore:
        self = cls.__new__(cls)
        self.kind = kind
        self._source = source
        self._parts = None
        self._lengths = None
        self._open()
        return self

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def megatron(cls, prefix: str | os.PathLike[str]) -> TokenStore:
        """A Megatron-LM indexed dataset: ``prefix.bin`` (the tokens) and ``prefix.idx``.

        The dtype is the index header's dtype code. The documents are Megatron's sequences,
        the units its ``GPTDataset`` concatenates (one per document unless the corpus was
        preprocessed with sentence splitting). ``lengths`` is a copy of the index's int32
        lengths (they lie two bytes off alignment in the file), made on first use.

        Parameters
        ----------
        prefix : str or os.PathLike
            The path without ``.bin`` / ``.idx``, as Megatron-LM's ``--data-path`` takes it.
            The path of the ``.bin`` or the ``.idx`` names the same pair.

        Returns
        -------
        TokenStore

        Raises
        ------
        ValueError
            A file that is not a version-1 Megatron index, a truncated index, a ``.bin``
            whose size is not where the index's last sequence ends (another corpus's, or one
            written with another dtype), or a floating-point dtype code.
        FileNotFoundError
            ``prefix.idx`` or ``prefix.bin`` is missing.
        """
        if not _is_path(prefix):
            raise TypeError(f"prefix must be a path, got {type(prefix).__name__}")
        return cls._make("megatron", (_megatron_prefix(os.fspath(prefix)),))

    @classmethod
    def arrow(cls, column: Any, name: str | None = None) -> TokenStore:
        """An Arrow column of token lists, read zero-copy (its values and offsets buffers).

        Parameters
        ----------
        column : datasets.Dataset column, pyarrow array, or table
            ``dataset["input_ids"]`` of a ``datasets.Dataset``; a ``pyarrow`` ``ListArray``,
            ``LargeListArray`` or ``ChunkedArray`` of them; or a ``datasets.Dataset`` or
            ``pyarrow.Table`` with ``name``. The values must be integers, without nulls.
        name : str, optional
            The column's name, when ``column`` is a dataset or a table.

        Returns
        -------
        TokenStore

        Raises
        ------
        TypeError
            Not a list column of integers.
        ValueError
            A null document or token, or a ``datasets.Dataset`` with an indices mapping (after
            ``shuffle``, ``select``, ``sort``...): its rows are not in the table's order; call
            ``dataset.flatten_indices()`` or pass the dataset before it (the sampler shuffles).
        """
        source: Any = column
        if type(column).__module__.startswith("datasets.") and hasattr(column, "column_name"):
            source, name = column.source, column.column_name  # a datasets Column
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a column name, got {type(name).__name__}")
        return cls._make("arrow", (source, name))

    @classmethod
    def flat(cls, tokens: Any, offsets: Any, *, dtype: Any = None) -> TokenStore:
        """One flat token array and the offsets that cut it into documents.

        Parameters
        ----------
        tokens : array or path
            The tokens: an integer array (``np.memmap`` included), a ``.npy`` file (its header
            holds the dtype), or a raw ``.bin`` file, whose ``dtype`` must be given.
        offsets : array or path
            n + 1 non-decreasing offsets (an integer array or a ``.npy`` file): document d is
            ``tokens[offsets[d]:offsets[d + 1]]``.
        dtype : dtype, optional
            The token dtype: required for a raw file (it is never guessed); for an array or
            a ``.npy`` file it must be theirs, if given.

        Returns
        -------
        TokenStore

        Raises
        ------
        ValueError
            A raw file without ``dtype`` (or offsets in a raw file), a ``dtype`` that differs
            from an array's, offsets outside the tokens, or a raw file whose token count
            (at ``dtype``) is not where the offsets end: the usual sign of a wrong dtype.
        """
        if dtype is not None:
            dtype = _token_dtype(dtype, "dtype")
        if _is_path(tokens) and not os.fspath(tokens).endswith(".npy") and dtype is None:
            raise ValueError(
                f"tokens is a raw file ({os.fspath(tokens)!r}), which does not record its "
                "dtype: pass dtype= (np.uint16 only for vocabularies below 65,536; np.uint32 "
                "or np.int32 above), save the tokens as .npy, or read a Megatron-LM "
                ".bin/.idx pair with TokenStore.megatron(prefix)"
            )
        if _is_path(offsets) and not os.fspath(offsets).endswith(".npy"):
            raise ValueError(
                f"offsets must be an array or a .npy file (which records its dtype), got the "
                f"raw file {os.fspath(offsets)!r}"
            )
        return cls._make("flat", (tokens, offsets, dtype))

    # -- opening ----------------------------------------------------------------------------
    def _open(self) -> Any:
        """The opened parts, ``(starts, parts)``: per part (token array, offsets or pointers,
        lengths or None); ``starts`` the first document of each part."""
        if self._parts is None:
            opener = {"megatron": self._open_megatron, "arrow": self._open_arrow}
            self._parts = opener.get(self.kind, self._open_flat)()
        return self._parts

    def _open_megatron(self) -> Any:
        (prefix,) = self._source
        idx, binp = prefix + ".idx", prefix + ".bin"
        with open(idx, "rb") as f:
            head = f.read(_MEGATRON_HEAD)
        if len(head) < _MEGATRON_HEAD or head[:9] != _MEGATRON_MAGIC:
            raise ValueError(f"{idx} is not a Megatron-LM index (no MMIDIDX header)")
        (version,) = struct.unpack("<Q", head[9:17])
        if version != 1:
            raise ValueError(f"{idx}: index version {version}, only version 1 is known")
        code = head[17]
        if code not in _MEGATRON_DTYPES:
            raise ValueError(f"{idx}: unknown dtype code {code}")
        dt = _token_dtype(_MEGATRON_DTYPES[code], f"{idx}: the dtype code {code}")
        seqs, docs = struct.unpack("<QQ", head[18:34])
        need = _MEGATRON_HEAD + 12 * seqs + 8 * docs
        size = os.path.getsize(idx)
        if seqs == 0 or size < need:
            raise ValueError(
                f"{idx} holds {size} bytes, but its header announces {seqs} sequences and "
                f"{docs} document indices ({need} bytes): a truncated or empty index"
            )
        raw = np.memmap(idx, dtype=np.uint8, mode="r")
        lengths = np.frombuffer(raw, np.int32, seqs, _MEGATRON_HEAD)
        pointers = np.frombuffer(raw, np.int64, seqs, _MEGATRON_HEAD + 4 * seqs)
        bin_size = os.path.getsize(binp)
        if bin_size % dt.itemsize:
            raise ValueError(
                f"{binp} holds {bin_size} bytes, not a whole number of {dt} tokens: it is not "
                f"the .bin of {idx}"
            )
        # Megatron writes the sequences back to back from byte 0, so the last one ends where
        # the .bin does: one comparison catches a .bin of another corpus or another dtype
        # (which would otherwise give garbage ids for every document).
        end = int(pointers[-1]) + int(lengths[-1]) * dt.itemsize
        if int(pointers[0]) != 0 or end != bin_size:
            hint = ""
            for width in (1, 2, 4, 8):
                if width != dt.itemsize and end * width == bin_size * dt.itemsize:
                    hint = (
                        f"; its size is that of the same tokens as {width}-byte tokens: a .bin "
                        f"written with another dtype than the index's"
                    )
            raise ValueError(
                f"{binp} holds {bin_size} bytes, but {idx} says its {seqs} sequences of dtype "
                f"{dt} start at byte {int(pointers[0])} and end at byte {end}: it is not the "
                f".bin of this index{hint}"
            )
        tokens = np.memmap(binp, dtype=dt, mode="r") if bin_size else np.empty(0, dt)
        self.dtype = dt
        return [0], [(tokens, pointers, lengths)]

    def _open_arrow(self) -> Any:
        pa: Any = importlib.import_module("pyarrow")  # optional: only Arrow stores need it

        source, name = self._source
        if type(source).__module__.startswith("datasets.") and hasattr(source, "data"):
            if getattr(source, "_indices", None) is not None:
                raise ValueError(
                    "the datasets.Dataset has an indices mapping (from shuffle, select, sort, "
                    "...), so its rows are not in its table's order: call "
                    "dataset.flatten_indices() first, or pass the dataset before shuffling "
                    "(the sampler shuffles)"
                )
            if name is None:
                raise TypeError("name the token column: TokenStore.arrow(dataset, 'input_ids')")
            source = source.data.table
        if isinstance(source, (pa.Table, pa.RecordBatch)):
            if name is None:
                raise TypeError("name the token column: TokenStore.arrow(table, 'input_ids')")
            source = source.column(name)
        elif name is not None:
            raise TypeError("name applies to a dataset or a table, not to an array")
        if isinstance(source, pa.ChunkedArray):
            chunks = source.chunks
            kind = source.type
        elif isinstance(source, pa.Array):
            chunks, kind = [source], source.type
        else:
            raise TypeError(
                "column must be a datasets.Dataset column, a pyarrow list array or chunked "
                f"array, or a dataset or table with a name, got {type(source).__name__}"
            )
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not (
            pa.types.is_integer(kind.value_type)
        ):
            raise TypeError(f"the column must hold lists of integers (token ids), got {kind}")
        self.dtype = _token_dtype(kind.value_type.to_pandas_dtype(), "the column's values")
        starts, parts, n = [], [], 0
        for chunk in chunks:
            if len(chunk) == 0:
                continue
            if chunk.null_count:
                first = int(np.flatnonzero(chunk.is_null().to_numpy(zero_copy_only=False))[0])
                raise ValueError(f"document {n + first} is null: a document must be a list")
            values = chunk.values
            if values.null_count:
                raise ValueError("the column holds null tokens")
            offsets = chunk.offsets.to_numpy(zero_copy_only=True)
            parts.append((values.to_numpy(zero_copy_only=True), offsets, None))
            starts.append(n)
            n += len(chunk)
        if n == 0:
            raise ValueError("the column holds no documents")
        return starts, parts

    def _open_flat(self) -> Any:
        tokens, offsets, dtype = self._source
        if _is_path(tokens):
            path = os.fspath(tokens)
            if path.endswith(".npy"):
                toks = np.load(path, mmap_mode="r")
            else:
                size = os.path.getsize(path)
                if size % dtype.itemsize:
                    raise ValueError(
                        f"{path} holds {size} bytes, not a whole number of {dtype} tokens: "
                        "is dtype right?"
                    )
                toks = np.memmap(path, dtype=dtype, mode="r") if size else np.empty(0, dtype)
        else:
            toks = _int_array(tokens, "tokens")
        toks = cast(np.ndarray, toks)
        if toks.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {toks.shape}")
        _token_dtype(toks.dtype, "tokens")
        if dtype is not None and toks.dtype != dtype:
            raise ValueError(f"dtype={dtype} was given, but the tokens hold {toks.dtype}")
        if _is_path(offsets):
            offs = _int_array(np.load(os.fspath(offsets), mmap_mode="r"), "offsets")
        else:
            offs = _int_array(offsets, "offsets")
        if len(offs) < 2:
            raise ValueError("offsets must hold n + 1 >= 2 values")
        first, last = int(offs[0]), int(offs[-1])
        if first < 0 or last > len(toks):
            raise ValueError(
                f"offsets must lie in [0, {len(toks)}] (the token count), got [{first}, {last}]"
            )
        if _is_path(tokens) and not os.fspath(tokens).endswith(".npy") and last != len(toks):
            raise ValueError(
                f"the offsets end at token {last}, but {os.fspath(tokens)!r} holds {len(toks)} "
                f"tokens of dtype {toks.dtype}: a wrong dtype (or offsets of another file)?"
            )
        self.dtype = toks.dtype
        return [0], [(toks, offs, None)]

    # -- reading ----------------------------------------------------------------------------
    def __len__(self) -> int:
        starts, parts = self._open()
        last = parts[-1]
        return int(starts[-1] + len(last[1]) - (1 if last[2] is None else 0))

    @property
    def lengths(self) -> np.ndarray:
        """The n documents' lengths in tokens (an aligned integer array, computed once): what
        :class:`PackedSampler` takes."""
        if self._lengths is None:
            _, parts = self._open()
            if parts[0][2] is not None:  # Megatron: int32 lengths, two bytes off alignment
                self._lengths = np.array(parts[0][2], dtype=np.int32)
            else:
                self._lengths = _lengths_from_offsets([offs for _, offs, _ in parts])
        return self._lengths

    def _span(self, doc: int) -> tuple[np.ndarray, int, int]:
        """(token array, begin, end) of document ``doc``."""
        starts, parts = self._open()
        n = len(self)
        if not 0 <= doc < n:
            raise IndexError(f"document {doc} is out of range for {n} documents")
        p = bisect.bisect_right(starts, doc) - 1
        toks, offs, lens = parts[p]
        d = doc - starts[p]
        if lens is None:
            begin, end = int(offs[d]), int(offs[d + 1])
        else:
            pointer, size = int(offs[d]), int(lens[d])
            begin = pointer // toks.itemsize
            end = begin + size
            if pointer % toks.itemsize or size < 0:
                raise ValueError(
                    f"sequence {doc}: pointer {pointer} and length {size} are not a whole "
                    f"number of {toks.dtype} tokens: a corrupt index"
                )
        if not 0 <= begin <= end <= len(toks):
            raise ValueError(
                f"document {doc} spans tokens [{begin}, {end}), outside the {len(toks)} tokens "
                "of the store"
            )
        return toks, begin, end

    def __getitem__(self, doc: int) -> np.ndarray:
        """The tokens of document ``doc`` (a read-only view where the store allows one)."""
        doc = _validate.integer(doc, "doc")
        toks, begin, end = self._span(doc)
        return toks[begin:end]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Views of files or buffers, and what is computed from them: reopened from the source.
        state["_parts"] = state["_lengths"] = None
        return state

    def __repr__(self) -> str:
        where = (
            repr(self._source[0])
            if self.kind == "megatron" or _is_path(self._source[0])
            else type(self._source[0]).__name__
        )
        return f"TokenStore.{self.kind}({where}, documents={len(self)}, dtype={self.dtype})"
