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


# -- the tar scanner under random mutations ------------------------------------------------------
def _fuzz_bases() -> list[tuple[bytes, list[int]]]:
    """Small valid tars of each format tarfile writes, with the offsets of their header blocks
    (extension headers included)."""
    out = []
    for fmt, long in [
        (tarfile.USTAR_FORMAT, False),
        (tarfile.GNU_FORMAT, True),
        (tarfile.PAX_FORMAT, True),
    ]:
        buf = io.BytesIO()
        headers = {"comment": "g"} if fmt == tarfile.PAX_FORMAT else None
        with tarfile.open(fileobj=buf, mode="w", format=fmt, pax_headers=headers) as tar:
            for r in range(5):
                stem = ("d" * 120 + "/" if long and r % 2 else "") + f"s{r}"
                add(tar, f"{stem}.txt", b"t" * r)
                add(tar, f"{stem}.bin", bytes([r]) * (300 * r))
        data = buf.getvalue()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            blocks = sorted(
                {at for m in tar.getmembers() for at in range(m.offset, m.offset_data, 512)}
            )
        out.append((data, blocks))
    return out


_BASES: list[tuple[bytes, list[int]]] = []


def _checksum(data: bytearray, at: int) -> None:
    block = data[at : at + 512]
    if len(block) == 512:
        block[148:156] = b" " * 8
        data[at + 148 : at + 156] = b"%06o\0 " % sum(block)


def _reference(path: str) -> list[dict[str, object]] | None:
    from .test_stream_readers import public, reference_samples

    try:
        return [public(s) for s in reference_samples(path)]
    except Exception:  # tarfile refuses it (or its grouping has a field twice)
        return None


def _ours(path: str) -> tuple[list[object], list[object]] | None:
    try:
        sizes, read = readers.tar_shards([path], index_every=3)
        n = int(sizes[0])
        return list(read(0, 0, n)), list(read(0, n // 2, n))
    except ValueError as err:
        assert path in str(err), err
        return None


def test_tar_scanner_fuzz(tmp_path: Path) -> None:
    """Random mutations of valid tars: each reads exactly as tarfile reads it (grouped as
    webdataset groups members), or is refused with an error that names the shard, within a
    second. Mutations hit header fields (sizes in octal and base-256, up to 2**88, types,
    names), with or without a valid checksum, and cut the file anywhere. The examples are fixed
    (derandomized) unless FUZZ_N is set: FUZZ_N=5000 runs that many fresh random ones."""
    import faulthandler

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    if not _BASES:
        _BASES.extend(_fuzz_bases())
    path = str(tmp_path / "fuzz.tar")
    field = st.sampled_from([0, 1, 99, 124, 130, 135, 148, 156, 157, 257, 345, 400])
    size = st.one_of(
        st.integers(0, 4096),
        st.integers(0, 2**88 - 1),
        st.integers(2**64 - 8192, 2**64 + 8192),
    )
    op = st.one_of(
        st.tuples(st.just("byte"), st.integers(0, 10**6), field, st.integers(0, 255)),
        st.tuples(st.just("size"), st.integers(0, 10**6), size, st.booleans()),
        st.tuples(st.just("type"), st.integers(0, 10**6), st.sampled_from(b"0125LKxgS7\0A")),
    )

    @settings(
        max_examples=int(os.environ.get("FUZZ_N", 300)),
        deadline=1000,
        derandomize=not os.environ.get("FUZZ_N"),
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        base=st.integers(0, len(_BASES) - 1),
        ops=st.lists(op, min_size=1, max_size=4),
        fix=st.booleans(),
        cut=st.one_of(st.none(), st.integers(0, 10**6)),
    )
    def check(base: int, ops: list[tuple[object, ...]], fix: bool, cut: int | None) -> None:
        data, blocks = _BASES[base]
        b = bytearray(data)
        touched = set()
        for kind, which, *args in ops:
            at = blocks[int(which) % len(blocks)]  # type: ignore[call-overload]
            touched.add(at)
            if kind == "byte":
                b[at + int(args[0])] = int(args[1])  # type: ignore[call-overload]
            elif kind == "size":
                value, octal = int(args[0]), bool(args[1])  # type: ignore[call-overload]
                if octal and value < 8**11:
                    b[at + 124 : at + 136] = b"%011o\0" % value
                else:
                    b[at + 124 : at + 136] = b"\x80" + value.to_bytes(11, "big")
            else:
                b[at + 156] = int(args[0])  # type: ignore[call-overload]
        if fix:
            for at in touched:
                _checksum(b, at)
        if cut is not None:
            del b[cut % (len(b) + 1) :]
        with open(path, "wb") as f:
            f.write(b)
        ref = _reference(path)
        got = _ours(path)
        if ref is None:
            assert got is None, "tarfile refuses this archive, fastshard read it"
        elif got is not None:
            n = len(ref)
            assert got == (ref, ref[n // 2 :])

    # A hang in C++ (the GIL released) cannot be interrupted: end the run with the stacks.
    faulthandler.dump_traceback_later(120, exit=True)
    try:
        check()
    finally:
        faulthandler.cancel_dump_traceback_later()
