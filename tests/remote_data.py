"""Shards for the remote tests and the guides' object-storage blocks: tar in webdataset's
layout and MDS as Mosaic's MDSWriter lays it out, written here without either library."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import tarfile
from pathlib import Path

import numpy as np


def payload(k: int) -> bytes:
    return bytes([k % 251]) * (50 + (k * 97) % 1500)


def write_tar(path: Path, first: int, n: int) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for k in range(first, first + n):
            for ext, data in (("id", str(k).encode()), ("bin", payload(k))):
                info = tarfile.TarInfo(f"s/{k:07d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


def write_mds(folder: Path, counts: list[int]) -> None:
    """Uncompressed MDS shards as Mosaic's MDSWriter lays them out: a ``uint32`` count, the
    ``count + 1`` offsets of the samples, then each sample (``uint32`` sizes of its
    variable-size columns, then the columns); ``index.json`` beside them."""
    shards = []
    k = 0
    for s, n in enumerate(counts):
        samples = []
        for _ in range(n):
            data = payload(k)
            samples.append(struct.pack("<I", len(data)) + data + struct.pack("<q", k))
            k += 1
        head = 4 + 4 * (n + 1)
        offsets = np.cumsum([head] + [len(x) for x in samples]).astype("<u4")
        name = f"shard.{s:05d}.mds"
        raw = struct.pack("<I", n) + offsets.tobytes() + b"".join(samples)
        (folder / name).write_bytes(raw)
        shards.append(
            {
                "column_encodings": ["bytes", "int"],
                "column_names": ["data", "id"],
                "column_sizes": [None, 8],
                "compression": None,
                "format": "mds",
                "hashes": ["sha1"],
                "raw_data": {
                    "basename": name,
                    "bytes": len(raw),
                    "hashes": {"sha1": hashlib.sha1(raw).hexdigest()},
                },
                "samples": n,
                "size_limit": 1 << 26,
                "version": 2,
                "zip_data": None,
            }
        )
    (folder / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))
