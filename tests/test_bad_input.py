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
import pickle
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fastshard
from fastshard import readers


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


# -- 9: no shards at all -----------------------------------------------------------------------
def test_an_empty_list_of_shards_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"no shard paths.*matched nothing"):
        readers.tar_shards([])
    with pytest.raises(ValueError, match="no shard paths"):
        readers.write_tar_index([], "index.json")
    pytest.importorskip("pyarrow")
    with pytest.raises(ValueError, match=r"no shard paths.*matched nothing"):
        readers.parquet_shards([])


# -- 4 and 12: the index command ---------------------------------------------------------------
def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastshard", "index", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_the_index_never_overwrites_a_shard(tmp_path: Path) -> None:
    paths = [write_tar(tmp_path / f"s{i}.tar", 3 + i) for i in range(3)]
    before = [Path(p).read_bytes() for p in paths]
    # `-o shards/*.tar`: the shell makes the first shard the output.
    proc = cli("-o", *paths, cwd=tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.startswith("fastshard: error: ") and proc.stderr.count("\n") == 1
    assert paths[0] in proc.stderr and "not a shard index" in proc.stderr
    # The output one of the inputs.
    proc = cli(*paths, "-o", paths[1], cwd=tmp_path)
    assert proc.returncode != 0 and "is one of the shards" in proc.stderr, proc.stderr
    assert [Path(p).read_bytes() for p in paths] == before
    for out in (paths[0], paths[2]):
        with pytest.raises(ValueError, match=r"one of the shards|not a shard index"):
            readers.write_tar_index(paths[1:], out)
    # Through another spelling of the same file (a symlink): still refused.
    link = tmp_path / "link.tar"
    link.symlink_to(paths[1])
    with pytest.raises(ValueError, match="is one of the shards"):
        readers.write_tar_index(paths, link)
    assert [Path(p).read_bytes() for p in paths] == before
    # An existing index is written again, as before.
    out = tmp_path / "index.json"
    readers.write_tar_index(paths, out)
    readers.write_tar_index(paths[:2], out)
    assert readers.tar_shards(index=out).sizes.tolist() == [3, 4]


def test_index_command_user_errors_are_one_line(tmp_path: Path) -> None:
    good = write_tar(tmp_path / "good.tar", 2)
    cases = {
        "missing shard": ([str(tmp_path / "missing.tar"), "-o", "o.json"], "missing.tar"),
        "missing folder": ([good, "-o", str(tmp_path / "nope" / "i.json")], "nope"),
        "not a tar": ([str(tmp_path / "i.json"), "-o", "j.json"], "not an uncompressed tar"),
        "bad every": ([good, "-o", "o.json", "--index-every", "0"], "index_every"),
    }
    (tmp_path / "i.json").write_text("{}")
    for label, (args, needle) in cases.items():
        proc = cli(*args, cwd=tmp_path)
        assert proc.returncode != 0, label
        assert proc.stderr.startswith("fastshard: error: "), (label, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert needle in proc.stderr, (label, proc.stderr)


# -- 11 and 13: damaged tar indexes ------------------------------------------------------------
@pytest.fixture
def indexed(tmp_path: Path) -> tuple[list[str], Path, dict[str, object]]:
    paths = [write_tar(tmp_path / f"s{i}.tar", n) for i, n in enumerate([20, 7])]
    out = tmp_path / "index.json"
    readers.write_tar_index(paths, out, index_every=4)
    return paths, out, json.loads(out.read_text())


@pytest.mark.parametrize("text", ["", "{", "[1, 2", "\xff\xfe", "null"])
def test_malformed_index_json_names_the_file(indexed, text: str) -> None:
    _, out, _ = indexed
    out.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{out}: not (valid JSON|a shard index)"):
        readers.tar_shards(index=out)


def _offsets(values: list[int]) -> str:
    import base64

    return base64.b64encode(np.asarray(values, dtype="<i8").tobytes()).decode()


@pytest.mark.parametrize(
    "damage",
    ["negative offset", "offsets out of order", "offset past end", "huge end", "negative end"],
)
def test_damaged_index_offsets_blame_the_index(indexed, damage: str) -> None:
    paths, out, doc = indexed
    shard = doc["fastshard"]["shards"][1]  # type: ignore[index]
    offs = np.frombuffer(__import__("base64").b64decode(shard["offsets"]), "<i8").tolist()
    if damage == "negative offset":
        offs[1] = -512
    elif damage == "offsets out of order":
        offs[0], offs[1] = offs[1], offs[0]
    elif damage == "offset past end":
        offs[1] = shard["end"] + 512
    elif damage == "huge end":
        shard["end"] = 2**62
    else:
        shard["end"] = -1
    shard["offsets"] = _offsets(offs)
    out.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=rf"{out}.*(shard 1|{paths[1]})"):
        _, read = readers.tar_shards(index=out)
        list(read(1, 0, 7))


@pytest.mark.parametrize("wrong", [9, 5])
def test_an_index_count_that_differs_from_the_shard_names_both(indexed, wrong: int) -> None:
    paths, out, doc = indexed
    # Counts only (a webdataset index): the scan at the first read finds the shard's own count.
    doc.pop("fastshard")
    doc["shardlist"][1]["nsamples"] = wrong  # type: ignore[index]
    out.write_text(json.dumps(doc))
    _, read = readers.tar_shards(index=out)
    with pytest.raises(
        ValueError,
        match=rf"{paths[1]}: holds 7 samples, but the shard index "
        rf"{out} says {wrong}",
    ):
        list(read(1, 0, min(wrong, 7)))


def test_an_index_count_larger_than_the_shard_blames_the_index(indexed) -> None:
    paths, out, doc = indexed
    doc["shardlist"][1]["nsamples"] = 8  # type: ignore[index]  # 2 offsets, as for 7
    out.write_text(json.dumps(doc))
    sizes, read = readers.tar_shards(index=out)
    with pytest.raises(ValueError, match=rf"{paths[1]}: holds 7 samples.*index {out} says 8"):
        list(read(1, 0, 8))
    # ... in DataLoader workers too.
    import torch

    stream = fastshard.ShardedStream(sizes, read, batch_size=4, num_replicas=1, rank=0)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
    with pytest.raises(ValueError, match=r"holds 7 samples.*says 8"):
        list(loader)


def test_sizes_that_differ_from_the_shard_name_both(tmp_path: Path) -> None:
    p = write_tar(tmp_path / "s.tar", 7)
    for wrong in (9, 5):
        _, read = readers.tar_shards([p], sizes=[wrong])
        with pytest.raises(ValueError, match=rf"{p}: holds 7 samples, but sizes= says {wrong}"):
            list(read(0, 0, 5))


# -- 2: a Parquet file with fewer rows than counted --------------------------------------------
@pytest.mark.parametrize("rows", [40, 100])
def test_a_parquet_file_that_changed_is_named_not_spun_on(tmp_path: Path, rows: int) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": list(range(64))}), p, row_group_size=16)
    _sizes, read = readers.parquet_shards([p])
    pq.write_table(pa.table({"x": list(range(rows))}), p, row_group_size=16)  # rewritten
    # A copy as a DataLoader worker gets it (it opens and parses the file afresh; the
    # process that counted keeps the footer it parsed then).
    worker_read = pickle.loads(pickle.dumps(read))
    with pytest.raises(ValueError, match=rf"{p}: {rows} rows, but 64 were counted"):
        list(worker_read(0, 0, 64))
    # In DataLoader workers (forked after the rewrite), the same error rather than a busy loop.
    proc = child(
        f"""
        import torch, fastshard
        from fastshard import readers
        import pyarrow as pa, pyarrow.parquet as pq
        p = {str(p)!r}
        pq.write_table(pa.table({{"x": list(range(64))}}), p, row_group_size=16)
        sizes, read = readers.parquet_shards([p])
        pq.write_table(pa.table({{"x": list(range({rows}))}}), p, row_group_size=16)
        stream = fastshard.ShardedStream(sizes, read, batch_size=4, num_replicas=1, rank=0)
        loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
        try:
            list(loader)
        except ValueError as err:
            print("refused:", err)
        """,
        timeout=60,
    )
    assert "refused:" in proc.stdout and "were counted" in proc.stdout, proc.stderr[-2000:]


# -- 10: MDS index.json against its shard ------------------------------------------------------
def write_mds(d: Path, n: int, claim: int | None = None, drop: str | None = None) -> Path:
    """An uncompressed MDS shard of ``n`` samples (columns: key str, n int) and its
    index.json, which claims ``claim`` samples (default n) and lacks key ``drop``."""
    rows = [f"k{i}".encode() for i in range(n)]
    samples = [np.uint32(len(r)).tobytes() + r + np.int64(i).tobytes() for i, r in enumerate(rows)]
    start = 4 + 4 * (n + 1)
    offsets = np.cumsum([start] + [len(s) for s in samples]).astype("<u4")
    (d / "shard.00000.mds").write_bytes(
        np.uint32(n).tobytes() + offsets.tobytes() + b"".join(samples)
    )
    shard = {
        "format": "mds",
        "version": 2,
        "compression": None,
        "hashes": [],
        "size_limit": 1 << 26,
        "column_names": ["key", "n"],
        "column_encodings": ["str", "int"],
        "column_sizes": [None, 8],
        "samples": n if claim is None else claim,
        "raw_data": {"basename": "shard.00000.mds", "bytes": 0, "hashes": {}},
        "zip_data": None,
    }
    if drop is not None:
        del shard[drop]
    (d / "index.json").write_text(json.dumps({"version": 2, "shards": [shard]}))
    return d / "index.json"


def test_mds_index_against_its_shard(tmp_path: Path) -> None:
    index = write_mds(tmp_path, 10)
    _, read = readers.mds_shards(index)
    assert [r["key"] for r in read(0, 0, 10)] == [f"k{i}" for i in range(10)]
    for claim in (12, 8):
        index = write_mds(tmp_path, 10, claim=claim)
        _sizes, read = readers.mds_shards(index)
        shard = tmp_path / "shard.00000.mds"
        want = rf"{shard}: holds 10 samples, but {index} says {claim}"
        with pytest.raises(ValueError, match=want):
            list(read(0, 0, claim))
    for key in ("samples", "column_names", "column_sizes"):
        index = write_mds(tmp_path, 10, drop=key)
        with pytest.raises(ValueError, match=rf"{index}: shard 0 has no '{key}'"):
            readers.mds_shards(index)
    (tmp_path / "index.json").write_text("{")
    with pytest.raises(ValueError, match=r"index\.json: not valid JSON"):
        readers.mds_shards(tmp_path / "index.json")
    # A damaged offsets table: an error naming the shard, not a read of 4 GiB.
    index = write_mds(tmp_path, 10)
    raw = bytearray((tmp_path / "shard.00000.mds").read_bytes())
    raw[4 + 4 * 3 : 4 + 4 * 4] = np.uint32(2**32 - 1).tobytes()
    (tmp_path / "shard.00000.mds").write_bytes(bytes(raw))
    _, read = readers.mds_shards(index)
    with pytest.raises(ValueError, match=r"shard\.00000\.mds: .*offsets"):
        list(read(0, 0, 10))


def test_parquet_row_groups_changed_under_the_same_count_do_not_loop(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": list(range(64))}), p, row_group_size=16)
    _, read = readers.parquet_shards([p])
    pq.write_table(pa.table({"x": list(range(64))}), p, row_group_size=10)  # same 64 rows
    worker_read = pickle.loads(pickle.dumps(read))  # as a DataLoader worker: a fresh footer
    proc_code = f"""
        import pickle
        read = pickle.loads({pickle.dumps(worker_read)!r})
        try:
            list(read(0, 0, 64))
        except ValueError as err:
            print("refused:", err)
        """
    proc = child(proc_code, timeout=30)  # a busy loop would run past the timeout
    assert "refused:" in proc.stdout and "row group 0 ends early" in proc.stdout, proc.stderr
