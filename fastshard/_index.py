"""Shard indexes: counts (and tar seek offsets) written once, read in milliseconds.

The file is webdataset's own shard index (``wids-shard-index-v1``: a ``shardlist`` of ``url``
and ``nsamples``), so wids and other tools read it too; fastshard's seek offsets sit under an
extra top-level key, ``"fastshard"``, which they ignore. Relative urls are relative to the index
file's folder, as wids resolves them.

Also here: counting once per job. When a ``torch.distributed`` process group of two or more
ranks is initialised, rank 0 counts and the others receive its result (one broadcast), instead
of every rank reading every shard's headers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import urllib.parse
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any, NamedTuple, TypeVar

import numpy as np

from . import _storage

KIND = "wids-shard-index-v1"
FORMAT = "fastshard-tar-offsets-v1"
# The offsets in a sidecar file, fetched a shard at a time (see TarOffsetsFile): what an index
# of remote shards, which keeps every sample's offset, is written as.
FORMAT_FILE = "fastshard-tar-offsets-v2"

T = TypeVar("T")


class TarOffsets:
    """Per shard, the byte offset of every ``every``-th sample and the byte just past the last
    sample, in flat arrays: shard s's offsets are ``offsets[bounds[s]:bounds[s + 1]]`` (10**6
    shards cost 16 MB, not one array object each).

    Read from an index, a shard's offsets stay base64 text until the shard is first read:
    decoding them all costs more than the first sample (64 shards: about 0.2 ms).
    """

    def __init__(
        self,
        bounds: np.ndarray,
        offsets: np.ndarray,
        ends: np.ndarray,
        encoded: list[str] | None = None,
        where: str = "",
    ) -> None:
        self.bounds = bounds
        self.offsets = offsets
        self.ends = ends
        # encoded[s]: shard s's offsets as in the index, until decoded into `offsets`
        self.encoded = encoded
        self.decoded = None if encoded is None else np.zeros(len(encoded), dtype=bool)
        self.where = where  # the index file, for errors

    def shard(self, s: int) -> tuple[np.ndarray, int]:
        """(offsets of every ``every``-th sample of shard s, end of its last sample)."""
        lo, hi = int(self.bounds[s]), int(self.bounds[s + 1])
        decoded = self.decoded
        if decoded is not None and not decoded[s]:
            assert self.encoded is not None
            try:
                raw = base64.b64decode(self.encoded[s], validate=True)
            except ValueError:  # binascii.Error: not base64
                raw = b""
            if len(raw) != 8 * (hi - lo):
                raise ValueError(
                    f"{self.where}: shard {s}'s offsets are not {hi - lo} base64 int64 "
                    "values: write the index again"
                )
            values = np.frombuffer(raw, dtype="<i8")
            end = int(self.ends[s])
            # Each offset is a sample's first header: in order, and before the shard's end.
            if len(values) and (
                values[0] < 0 or values[-1] >= end or bool(np.any(np.diff(values) <= 0))
            ):
                raise ValueError(
                    f"{self.where}: shard {s}'s offsets are not increasing byte offsets "
                    f"in [0, {end}): the index is damaged; write the index again"
                )
            self.offsets[lo:hi] = values
            decoded[s] = True
        return self.offsets[lo:hi], int(self.ends[s])


# A sidecar of offsets up to this size (2 M samples) is read whole, in one GET, when a pass
# needs the offsets of more than one of its shards.
SIDECAR_WHOLE = 16 << 20


class TarOffsetsFile:
    """Per shard, the byte offset of every ``every``-th sample and the end of its last sample,
    kept in the index's sidecar file (``fastshard-tar-offsets-v2``: for each shard in turn,
    its offsets then its end, little-endian int64) and fetched a shard at a time when the
    shard is first read: a rank that reads 1,222 of a million shards fetches their offsets
    alone, not the index's 10 GB. ``load`` fetches many shards' at once; what a process
    fetched stays with it (never pickled)."""

    def __init__(
        self,
        counts: np.ndarray,
        every: int,
        url: str,
        filesizes: np.ndarray,
        storage: _storage.Options,
        where: str,
    ) -> None:
        per_shard = (-(-int(n) // every) + 1 for n in counts)
        # entry [bounds[s], bounds[s + 1]) of the file: shard s's offsets, then its end
        self.bounds = np.fromiter(
            accumulate(per_shard, initial=0), dtype=np.int64, count=len(counts) + 1
        )
        self.url = url
        self.filesizes = filesizes
        self.storage = storage
        self.where = where
        self.cache: dict[int, tuple[np.ndarray, int]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "cache": {}}

    def _check(self, s: int, raw: bytes) -> tuple[np.ndarray, int]:
        lo, hi = int(self.bounds[s]), int(self.bounds[s + 1])
        if len(raw) != 8 * (hi - lo):
            raise ValueError(
                f"{self.where}: {self.url} is {len(raw)} bytes short of shard {s}'s offsets: "
                "the index is damaged; write it again"
            )
        values = np.frombuffer(raw, dtype="<i8")
        offsets, end = values[:-1], int(values[-1])
        size = int(self.filesizes[s])
        if (
            end < 0
            or (size >= 0 and end > size)
            or (len(offsets) and (offsets[0] < 0 or offsets[-1] >= end))
            or bool(np.any(np.diff(offsets) <= 0))
        ):
            raise ValueError(
                f"{self.where}: shard {s}'s offsets in {self.url} are not increasing byte "
                f"offsets before its end {end} (file of {size} bytes): the index is damaged; "
                "write it again"
            )
        return offsets, end

    def load(self, shards: Sequence[int]) -> None:
        """Fetch the offsets of ``shards`` not fetched yet, all at once (the whole sidecar in
        one GET while it is at most SIDECAR_WHOLE bytes)."""
        missing = sorted({int(s) for s in shards} - set(self.cache))
        if not missing:
            return
        total = 8 * int(self.bounds[-1])
        if total <= SIDECAR_WHOLE and len(missing) > 1:
            raw = _storage.read_all(self.url, self.storage)
            for s in range(len(self.bounds) - 1):
                if s not in self.cache:
                    lo, hi = 8 * int(self.bounds[s]), 8 * int(self.bounds[s + 1])
                    self.cache[s] = self._check(s, raw[lo:hi])
            return
        ranges = [(self.url, 8 * int(self.bounds[s]), 8 * int(self.bounds[s + 1])) for s in missing]
        if _storage.is_url(self.url):
            raws = _storage.fetcher(self.storage).fetch_many(ranges)
        else:
            with open(self.url, "rb") as f:
                raws = [os.pread(f.fileno(), hi - lo, lo) for _, lo, hi in ranges]
        for s, raw in zip(missing, raws):
            self.cache[s] = self._check(s, raw)

    def shard(self, s: int) -> tuple[np.ndarray, int]:
        """(offsets of every ``every``-th sample of shard s, end of its last sample)."""
        found = self.cache.get(s)
        if found is None:
            self.load([s])
            found = self.cache[s]
        return found


class TarIndex(NamedTuple):
    """Counts and, where known, seek offsets of tar shards (see readers.TarRead)."""

    paths: list[str]
    sizes: np.ndarray  # samples per shard
    every: int
    offsets: TarOffsets | TarOffsetsFile | None
    filesizes: np.ndarray  # per shard, -1 where unknown


def _encode(values: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype="<i8").tobytes()).decode("ascii")


def _decoded_length(text: str) -> int:
    """The bytes that base64 ``text`` (no whitespace, padded) decodes to, without decoding."""
    return len(text) // 4 * 3 - (text[-2:] == "==") - (text[-1:] == "=")


def write_tar_index(
    output: str | os.PathLike[str],
    paths: Sequence[str | os.PathLike[str]],
    sizes: np.ndarray,
    every: int,
    bounds: np.ndarray,
    offsets: np.ndarray,
    ends: np.ndarray,
    filesizes: Sequence[int],
    storage: _storage.Options = _storage.DEFAULT,
    sidecar: bool = False,
) -> dict[str, Any]:
    """Write the index of tar shards to ``output`` (a path or URL; urls relative to its
    folder where they are under it); returns it.

    A local ``output`` may not be one of the shards, nor an existing file that is not a shard
    index (``-o shards/*.tar`` makes the shell pass the first shard as the output)."""
    out = os.fspath(output)
    remote = _storage.is_url(out)
    if not remote:
        out = os.path.abspath(_storage.local_path(out))
        check_output(out, paths)
    base = _storage.dirname(out)
    shardlist = []
    per_shard = []
    for s, p in enumerate(paths):
        url = _relative(os.fspath(p), base)
        shardlist.append({"url": url, "nsamples": int(sizes[s]), "filesize": int(filesizes[s])})
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        if sidecar:
            per_shard.append(np.append(offsets[lo:hi], ends[s]).astype("<i8"))
        else:
            per_shard.append({"offsets": _encode(offsets[lo:hi]), "end": int(ends[s])})
    extra: dict[str, Any]
    if sidecar:
        # The offsets first, then the index that names them: a reader never finds an index
        # whose offsets are not there yet.
        name = out[out.rfind("/") + 1 :] if remote else os.path.basename(out)
        data = b"".join(a.tobytes() for a in per_shard)
        if remote:
            _storage.write_all(out + ".offsets", data, storage)
        else:
            with open(out + ".offsets.partial", "wb") as f:
                f.write(data)
            os.replace(out + ".offsets.partial", out + ".offsets")
        extra = {"format": FORMAT_FILE, "index_every": int(every), "offsets": name + ".offsets"}
    else:
        extra = {"format": FORMAT, "index_every": int(every), "shards": per_shard}
    doc = {"__kind__": KIND, "wids_version": 1, "shardlist": shardlist, "fastshard": extra}
    if remote:
        _storage.write_all(out, (json.dumps(doc, indent=1) + "\n").encode(), storage)
        return doc
    tmp = out + ".partial"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, out)
    return doc


def _relative(path: str, base: str) -> str:
    """``path`` as an index url: relative to the index's folder ``base`` where it lies under
    it (always, for local files), else as given."""
    if _storage.is_url(path) or _storage.is_url(base):
        if _storage.is_url(path) and path.startswith(base):
            return path[len(base) :]
        return path if _storage.is_url(path) else os.path.abspath(path)
    return os.path.relpath(os.path.abspath(path), base).replace(os.sep, "/")


def check_output(out: str, paths: Sequence[str | os.PathLike[str]]) -> None:
    """Refuse to write an index over one of its shards or over a file that is not an index."""
    if not os.path.exists(out):
        folder = os.path.dirname(out)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{out}: the output's folder {folder} does not exist")
        return
    for p in paths:
        p = os.fspath(p)
        if _storage.is_url(p):
            continue
        p = _storage.local_path(p)
        if os.path.abspath(p) == out or (os.path.exists(p) and os.path.samefile(p, out)):
            raise ValueError(f"{out}: the output is one of the shards; name the index file")
    try:
        with open(out, "rb") as f:
            doc = json.loads(f.read(64 << 20))
        ok = isinstance(doc, dict) and doc.get("__kind__", KIND) == KIND and "shardlist" in doc
    except (OSError, ValueError, RecursionError):
        ok = False
    if not ok:
        raise ValueError(
            f"{out} exists and is not a shard index: fastshard writes an index over an older "
            "index only; pass another output file (or remove this one)"
        )


def _resolve(url: str, base: str) -> str:
    if _storage.is_url(base) or _storage.is_url(url):
        return _storage.join(base, url)
    if ":" not in url:  # a plain path: no scheme to parse (urlparse costs 1 us a shard)
        if "/" not in url and os.sep not in url and url not in ("", ".", ".."):
            # a file name in `base` (normalised already): nothing to normalise
            return base + url if base.endswith(os.sep) else base + os.sep + url
        return os.path.normpath(os.path.join(base, url))
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return urllib.parse.unquote(parsed.path)
    return os.path.normpath(os.path.join(base, url))


def _load_json(path: str, storage: _storage.Options = _storage.DEFAULT) -> Any:
    """The JSON document at ``path`` (a path or URL); one that is not JSON is an error naming
    it. Every index file is read here."""
    raw = _storage.read_all(path, storage)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def read_tar_index(
    index: str | os.PathLike[str], storage: _storage.Options = _storage.DEFAULT
) -> TarIndex:
    """A ``wids-shard-index-v1`` file (a path or URL): counts always, seek offsets when
    fastshard wrote it (checked for length here, decoded and checked for order when each
    shard is first read)."""
    path = os.fspath(index)
    if not _storage.is_url(path):
        path = os.path.abspath(_storage.local_path(path))
    doc = _load_json(path, storage)
    if not isinstance(doc, dict) or not isinstance(doc.get("shardlist"), list):
        raise ValueError(f"{path}: not a shard index (no 'shardlist'; expected {KIND!r})")
    kind = doc.get("__kind__", KIND)
    if kind != KIND:
        raise ValueError(f"{path}: __kind__ is {kind!r}, expected {KIND!r}")
    base = _storage.dirname(path)
    if isinstance(doc.get("base_path"), str):
        base = _resolve(doc["base_path"], base)
    paths = []
    sizes = []
    filesizes = []
    for i, entry in enumerate(doc["shardlist"]):
        if not isinstance(entry, dict) or "url" not in entry or "nsamples" not in entry:
            raise ValueError(f"{path}: shardlist[{i}] needs 'url' and 'nsamples', got {entry!r}")
        n = entry["nsamples"]
        if type(n) is not int or n < 0:
            raise ValueError(f"{path}: shardlist[{i}]['nsamples'] must be an int >= 0, got {n!r}")
        paths.append(_resolve(str(entry["url"]), base))
        sizes.append(n)
        size = entry.get("filesize")
        filesizes.append(size if type(size) is int and size >= 0 else -1)
    counts = np.asarray(sizes, dtype=np.int64)
    fsizes = np.asarray(filesizes, dtype=np.int64)
    extra = doc.get("fastshard")
    if isinstance(extra, dict) and extra.get("format") == FORMAT_FILE:
        every, name = extra.get("index_every"), extra.get("offsets")
        if type(every) is not int or every < 1 or not isinstance(name, str) or not name:
            raise ValueError(f"{path}: the 'fastshard' offsets are malformed")
        where = _resolve(name, _storage.dirname(path))
        found = TarOffsetsFile(counts, every, where, fsizes, storage, path)
        return TarIndex(paths, counts, every, found, fsizes)
    if not isinstance(extra, dict) or extra.get("format") != FORMAT:
        return TarIndex(paths, counts, 0, None, fsizes)
    shards = extra.get("shards")
    every = extra.get("index_every")
    if (
        not isinstance(shards, list)
        or len(shards) != len(paths)
        or type(every) is not int
        or every < 1
    ):
        raise ValueError(f"{path}: the 'fastshard' offsets do not match the shardlist")
    try:
        encoded = [s["offsets"] for s in shards]
        ends = np.asarray([s["end"] for s in shards], dtype=np.int64)
        if not all(type(t) is str for t in encoded):
            raise TypeError
    except (TypeError, KeyError, ValueError, OverflowError):
        raise ValueError(f"{path}: the 'fastshard' offsets are malformed") from None
    for s, end in enumerate(ends.tolist()):
        # An end past the file would be read as one block (a bare MemoryError at 2**62).
        if end < 0 or (fsizes[s] >= 0 and end > fsizes[s]):
            raise ValueError(
                f"{path}: shard {s}'s end {end} lies outside its file of {int(fsizes[s])} "
                "bytes: the index is damaged; write it again"
            )
    # Each shard's number of offsets follows from its count; the text's length must agree.
    # (In Python: NumPy's first floor_divide and cumsum in a process cost 0.1 ms.)
    per_shard = (-(-n // every) for n in sizes)
    bounds = np.fromiter(accumulate(per_shard, initial=0), dtype=np.int64, count=len(sizes) + 1)
    for s, text in enumerate(encoded):
        have = _decoded_length(text)
        if have != 8 * int(bounds[s + 1] - bounds[s]):
            raise ValueError(f"{path}: shard {s} has {sizes[s]} samples but {have // 8} offsets")
    offsets = TarOffsets(bounds, np.zeros(int(bounds[-1]), dtype=np.int64), ends, encoded, path)
    return TarIndex(paths, counts, every, offsets, fsizes)


# -- counting once per job ---------------------------------------------------------------------
def shared(compute: Callable[[], T], what: Sequence[str], enabled: bool) -> T:
    """``compute()`` on rank 0 of an initialised process group of 2+ ranks, its result
    broadcast to the others (every rank must call this at the same point); ``compute()``
    locally without a group, inside DataLoader workers, or when ``enabled`` is false.

    ``what`` (the paths) must be the same on every rank: each rank compares its own with rank
    0's, and all raise together when any differs. An error on rank 0 is raised on every rank.
    """
    from . import _distributed

    if not enabled or _distributed._world_size() < 2:
        return compute()
    import torch
    import torch.distributed as dist

    digest = hashlib.blake2b(json.dumps(list(what)).encode(), digest_size=16).hexdigest()
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            payload = [(digest, None, compute())]
        except Exception as err:  # every rank raises it, none waits for the broadcast
            payload = [(digest, err, None)]
    dist.broadcast_object_list(payload, src=0)
    theirs, error, result = payload[0]
    flag = torch.tensor([int(theirs != digest)], dtype=torch.int64, device=_distributed._device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if error is not None:
        raise error
    if int(flag.item()):
        raise ValueError(
            f"the {dist.get_world_size()} ranks passed different shard lists: rank 0 counts "
            "the shards for every rank, so every rank must pass the same paths in the same "
            "order (or pass share_counts=False on every rank to count locally)"
        )
    return result  # type: ignore[no-any-return]
