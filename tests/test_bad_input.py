"""Bad shards, indexes and command lines (issue 47): every parser has a bound, every count is
checked where it meets the data, nothing the library writes destroys input, and every error
names what to fix.

Each case here failed before its fix: a hang, silent wrong data, an overwritten shard or an
error that did not say which file was at fault.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fastshard
from fastshard import _core, readers


# -- tars built by hand -------------------------------------------------------------------------
def add(tar: tarfile.TarFile, name: str, data: bytes = b"") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_tar(path: Path, n: int, data_size: int = 100) -> str:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for r in range(n):
            add(tar, f"r{r:05d}.txt", str(r).encode())
            add(tar, f"r{r:05d}.bin", bytes([r % 256]) * data_size)
    return str(path)


def header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytearray:
    """A ustar header block whose size field holds ``size`` in base-256 when it does not fit
    in octal (as GNU tar writes large sizes), with a valid checksum."""
    info = tarfile.TarInfo(name)
    info.type = kind
    block = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    block[124:136] = b"\x80" + size.to_bytes(11, "big")
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return block


def child(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter: a hang in C++ with the GIL released cannot be
    interrupted from this process, but the child can be killed."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tempfile.gettempdir(),
    )


def tarfile_refuses(path: str) -> bool:
    try:
        with tarfile.open(path, "r:") as tar:
            tar.getmembers()
    except Exception:  # ReadError, or the OverflowError of a seek past 2**63
        return True
    return False


# -- 1: a size that wraps the scanner's offset -------------------------------------------------
@pytest.mark.parametrize("variant", ["global", "alternating", "huge"])
def test_a_size_that_wraps_the_offset_is_refused_not_looped(tmp_path: Path, variant: str) -> None:
    if variant == "global":  # a 'g' pax header whose data would end at 2**64: back to byte 0
        data = header("a.txt", 0) + header("g", 2**64 - 1024, tarfile.XGLTYPE) + bytes(1024)
    elif variant == "alternating":  # two members, each leading back to the other
        data = header("a.txt", 0) + header("b.txt", 2**64 - 1024) + bytes(1024)
    else:  # a size far past the end of the file, short of wrapping
        data = header("a.txt", 2**62) + bytes(1024)
    p = tmp_path / "bad.tar"
    p.write_bytes(bytes(data))
    assert tarfile_refuses(str(p))
    proc = child(
        f"""
        from fastshard import readers, _core
        import io, os
        path = {str(p)!r}
        for call in (
            lambda: readers.tar_shards([path]),
            lambda: readers.tar_shards([path], opener=lambda q: open(q, "rb")),
            lambda: readers.write_tar_index([path], path + ".json"),
            lambda: _core.tar_skip(os.open(path, os.O_RDONLY), 0, 5, path),
            lambda: _core.tar_samples(open(path, "rb").read(), path, path),
        ):
            try:
                call()
            except ValueError as err:
                assert path in str(err), err
                print("refused:", err)
            else:
                raise AssertionError("read")
        """,
        timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("refused:") == 5


# -- 8: a tar cut inside a member's data ------------------------------------------------------
def test_a_tar_cut_inside_a_member_is_refused_up_front(tmp_path: Path) -> None:
    whole = Path(write_tar(tmp_path / "whole.tar", 13, data_size=700))
    data = whole.read_bytes()
    last_data = data.rfind(b"\x0c" * 700)  # the 13th sample's .bin (r = 12)
    for cut in (last_data + 300, last_data + 700, last_data + 1024 - 1):
        p = tmp_path / f"cut{cut}.tar"
        p.write_bytes(data[:cut])
        assert tarfile_refuses(str(p)), cut
        for kw in ({}, {"opener": lambda q: open(q, "rb")}):
            with pytest.raises(ValueError, match=rf"{p}.*ends inside the data of member 'r00012"):
                readers.tar_shards([p], **kw)
        with pytest.raises(ValueError, match=rf"{p}.*ends inside"):
            readers.write_tar_index([p], tmp_path / "index.json")
        # Counts given (no scan up front): the read that reaches the cut says so.
        _, read = readers.tar_shards([p], sizes=[13], index_every=4)
        with pytest.raises(ValueError, match=rf"{p}.*ends inside"):
            list(read(0, 0, 13))
    # Cut at the end of a member's padded data (no end-of-archive blocks): whole, as tarfile.
    end = last_data + 1024
    p = tmp_path / "no_trailer.tar"
    p.write_bytes(data[:end])
    assert not tarfile_refuses(str(p))
    assert readers.tar_shards([p]).sizes.tolist() == [13]
