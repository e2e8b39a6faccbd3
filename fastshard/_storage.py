"""Bytes from anywhere: the one module of fastshard that knows a URL.

The readers (tar, Parquet, MDS) turn a lane's stretch of samples into byte ranges of a shard;
this module turns byte ranges into reads: ``os.pread`` for a local path, ranged GETs for an
object in a bucket or on a web server. Nothing above it knows a client library, a retry or a
URL scheme.

- ``s3://bucket/key``: botocore (credentials, profiles, ``AWS_ENDPOINT_URL``,
  ``AWS_REGION``/``AWS_DEFAULT_REGION`` as the AWS tools read them).
- ``http://`` and ``https://``: urllib3, with ``Range`` requests.
- any other fsspec protocol (``gs://``, ``az://``, ``abfs://``, ``hf://``, ...): fsspec.

Clients are made per process, after a fork too (a client is never used across a fork), and are
never pickled: a DataLoader worker makes its own. Every read is retried with exponential backoff
and full jitter on 5xx, 429, timeouts, connection resets and short bodies, and resumes from the
last byte it received; past ``retries`` attempts it raises :class:`RemoteReadError` naming the
URL and the last failure. Nothing here waits without a timeout.

A :class:`Fetcher` (one per process and configuration) reads ahead: a reader tells it the byte
ranges it will read, in the order it will read them (``expect``), and takes each as a
sequential stream when it gets there (``take``). At most ``max_requests`` requests are in flight
and at most ``max_inflight_bytes`` fetched and not yet consumed (a stream's next block is always
allowed, so a bound below one block slows a read but never stops it).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
import queue
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, NamedTuple

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")

# Defaults of the remote reads (docs/streams.md, "Object storage").
MAX_INFLIGHT_BYTES = 128 << 20  # fetched and not yet read, per process
MAX_REQUESTS = 16  # concurrent requests per process
BLOCK_BYTES = 8 << 20  # the largest single GET
MIN_BLOCK_BYTES = 64 << 10  # the smallest GET a stream is cut into
RETRIES = 8  # attempts after the first, per range
BACKOFF = 0.05  # seconds before the first retry; doubled each attempt, capped at BACKOFF_CAP
BACKOFF_CAP = 5.0
PRESIGN_FOR = 3600  # seconds a presigned s3 GET URL is valid; renewed after half of it
TIMEOUT = 30.0  # seconds: connect and read timeout of one request


class RemoteReadError(OSError):
    """A remote read that failed for good: a status that no retry mends (403, 404, ...) or
    ``retries`` failed attempts. The message names the URL, the byte range and the last
    failure."""


class _Retryable(Exception):
    """One failed attempt that another may mend (5xx, 429, timeout, reset, short body)."""


def is_url(path: str) -> bool:
    """Whether ``path`` names an object by a URL (``scheme://...``; ``file://`` counts as
    local)."""
    m = _SCHEME.match(path)
    return m is not None and m.group(1).lower() != "file"


def local_path(path: str) -> str:
    """A local path for ``path`` (a ``file://`` URL's path)."""
    if path[:7].lower() == "file://":
        return urllib.parse.unquote(urllib.parse.urlparse(path).path)
    return path


def join(base: str, name: str) -> str:
    """``name`` relative to the folder URL or path ``base`` (absolute names stay)."""
    if is_url(name) or name.startswith("/"):
        return name
    if is_url(base):
        parsed = urllib.parse.urlsplit(base)
        path = parsed.path if parsed.path.endswith("/") else parsed.path + "/"
        parts: list[str] = []
        for part in (path + name).split("/"):
            if part == "..":
                if parts and parts[-1]:
                    parts.pop()
            elif part != ".":
                parts.append(part)
        return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, "/".join(parts), "", ""))
    return os.path.normpath(os.path.join(base, name))


def dirname(url: str) -> str:
    """The folder of a URL (with its trailing slash) or of a path."""
    if is_url(url):
        return url[: url.rfind("/") + 1]
    return os.path.dirname(os.path.abspath(url))


class Options(NamedTuple):
    """How remote objects are read: the client's own options (``storage_options``, passed
    through) and fastshard's bounds. Picklable; the clients it makes are per process."""

    storage_options: tuple[tuple[str, Any], ...] = ()
    max_inflight_bytes: int = MAX_INFLIGHT_BYTES
    max_requests: int = MAX_REQUESTS
    block_bytes: int = BLOCK_BYTES
    retries: int = RETRIES
    timeout: float = TIMEOUT
    cache_dir: str | None = None
    cache_bytes: int = 0

    @property
    def client_options(self) -> dict[str, Any]:
        return dict(self.storage_options)


def options(
    storage_options: Mapping[str, Any] | None = None,
    *,
    max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
    max_requests: int = MAX_REQUESTS,
    retries: int = RETRIES,
    timeout: float = TIMEOUT,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> Options:
    """Checked :class:`Options` from a reader's keyword arguments."""

    def positive(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        return value

    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if cache_dir is None and cache_bytes is not None:
        raise ValueError("cache_limit needs cache_dir")
    if cache_dir is not None and cache_bytes is None:
        raise ValueError("cache_dir needs cache_limit, the cache's bound in bytes")
    items = tuple(sorted((str(k), v) for k, v in (storage_options or {}).items()))
    return Options(
        items,
        positive(max_inflight_bytes, "max_inflight_bytes"),
        positive(max_requests, "max_requests"),
        positive(block_bytes, "block_bytes"),
        retries,
        float(timeout),
        None if cache_dir is None else os.path.abspath(os.fspath(cache_dir)),
        0 if cache_bytes is None else positive(cache_bytes, "cache_limit"),
    )


DEFAULT = Options()


# -- clients, one kind per scheme ---------------------------------------------------------------
class _Client:
    """What each kind of store does: one attempt of each call. ``get`` passes the body to
    ``sink`` as it arrives (so an attempt broken mid-body keeps what it received) and raises
    :class:`_Retryable` for a failure another attempt may mend."""

    def get(self, key: str, start: int, stop: int, sink: Callable[[bytes], None]) -> None:
        raise NotImplementedError

    def size(self, key: str) -> int:
        raise NotImplementedError

    def whole(self, key: str, sink: Callable[[bytes], None]) -> int:
        """The whole object to ``sink``; returns its length."""
        n = self.size(key)
        self.get(key, 0, n, sink)
        return n

    def tail(self, key: str, n: int, sink: Callable[[bytes], None]) -> int:
        """The last ``n`` bytes (all of a shorter object) to ``sink``; returns the object's
        length. One request where the store takes a suffix range."""
        total = self.size(key)
        self.get(key, max(0, total - n), total, sink)
        return total

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot write")

    def list(self, prefix: str) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} cannot list")


_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


# botocore sessions by profile: kept across a fork (a session holds loaded configuration and
# service models, no connection), so that a DataLoader worker makes its client in about 10 ms
# instead of 140 ms.
_sessions: dict[Any, Any] = {}


def _session(profile: str | None) -> Any:
    import botocore.session

    found = _sessions.get(profile)
    if found is None:
        found = botocore.session.get_session()
        if profile:
            found.set_config_variable("profile", profile)
        _sessions[profile] = found
    return found


class _S3(_Client):
    def __init__(self, bucket: str, opts: Options) -> None:
        try:
            import botocore.config
        except ImportError as err:  # pragma: no cover - the `remote` extra brings it
            raise ImportError(
                "reading s3:// URLs needs botocore: pip install 'fastshard[remote]'"
            ) from err
        import botocore.exceptions as bex

        self.bex = bex
        so = opts.client_options
        session = _session(so.get("profile"))
        region = (
            so.get("region")
            or so.get("region_name")
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or session.get_config_variable("region")
            or "us-east-1"
        )
        endpoint = (
            so.get("endpoint_url")
            or so.get("endpoint")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        kw: dict[str, Any] = {}
        if so.get("anon"):
            from botocore import UNSIGNED

            kw["signature_version"] = UNSIGNED
        config = botocore.config.Config(
            retries={"total_max_attempts": 1},  # fastshard retries, resuming bodies
            max_pool_connections=opts.max_requests + 4,
            connect_timeout=opts.timeout,
            read_timeout=opts.timeout,
            s3={"addressing_style": "path"} if endpoint else {},
            **kw,
        )
        self.client = session.create_client(
            "s3",
            region_name=region,
            endpoint_url=endpoint,
            aws_access_key_id=so.get("key") or so.get("aws_access_key_id"),
            aws_secret_access_key=so.get("secret") or so.get("aws_secret_access_key"),
            aws_session_token=so.get("token") or so.get("aws_session_token"),
            config=config,
        )
        self.bucket = bucket
        self.urls: dict[str, tuple[str, float]] = {}  # presigned GET URLs by key
        self.http = _HTTP("", opts)
        self.errors = (
            bex.ConnectionError,
            bex.HTTPClientError,
            bex.ResponseStreamingError,
            bex.IncompleteReadError,
            bex.ReadTimeoutError,
            ConnectionError,
            TimeoutError,
        )

    def _status(self, err: Exception) -> tuple[int, str]:
        resp = getattr(err, "response", None) or {}
        status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        code = resp.get("Error", {}).get("Code", "")
        return status, f"HTTP {status} {code}".strip()

    def _call(self, fn: Callable[..., Any], **kw: Any) -> Any:
        try:
            return fn(Bucket=self.bucket, **kw)
        except self.bex.ClientError as err:
            status, text = self._status(err)
            if status in _RETRY_STATUS or status >= 500:
                raise _Retryable(text) from err
            raise RemoteReadError(text) from err
        except self.errors as err:
            raise _Retryable(f"{type(err).__name__}: {err}") from err

    def _url(self, key: str) -> str:
        found = self.urls.get(key)
        now = time.monotonic()
        if found is None or found[1] < now:
            url = self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=PRESIGN_FOR
            )
            found = self.urls[key] = (url, now + PRESIGN_FOR / 2)
        return found[0]

    def _signed(self, key: str, call: Callable[[str], Any]) -> Any:
        # A GET of the object's presigned URL, through urllib3: botocore's own get_object costs
        # 1.8 ms of CPU a request, this 0.6 ms (300 GETs of 40 kB, measured against moto),
        # which a 2-core machine that also decodes the samples feels. The URL is signed once
        # per object and renewed after half its life; a 403 (credentials that expired sooner)
        # signs it again and retries.
        try:
            return call(self._url(key))
        except RemoteReadError as err:
            if "HTTP 403" in str(err) and self.urls.pop(key, None) is not None:
                raise _Retryable(f"{err} (signing the URL again)") from err
            raise

    def get(self, key: str, start: int, stop: int, sink: Callable[[bytes], None]) -> None:
        self._signed(key, lambda url: self.http.get(url, start, stop, sink))

    def tail(self, key: str, n: int, sink: Callable[[bytes], None]) -> int:
        return int(self._signed(key, lambda url: self.http.tail(url, n, sink)))

    def whole(self, key: str, sink: Callable[[bytes], None]) -> int:
        return int(self._signed(key, lambda url: self.http.whole(url, sink)))

    def size(self, key: str) -> int:
        return int(self._call(self.client.head_object, Key=key)["ContentLength"])

    def put(self, key: str, data: bytes) -> None:
        self._call(self.client.put_object, Key=key, Body=data)

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        token: dict[str, str] = {}
        while True:
            resp = self._call(self.client.list_objects_v2, Prefix=prefix, **token)
            keys += [o["Key"] for o in resp.get("Contents", [])]
            if not resp.get("IsTruncated"):
                return keys
            token = {"ContinuationToken": resp["NextContinuationToken"]}


class _HTTP(_Client):
    def __init__(self, base: str, opts: Options) -> None:
        try:
            import urllib3
        except ImportError as err:  # pragma: no cover - the `remote` extra brings it
            raise ImportError(
                "reading http(s):// URLs needs urllib3: pip install 'fastshard[remote]'"
            ) from err
        self.urllib3 = urllib3
        self.base = base
        self.headers = dict(opts.client_options.get("headers", {}))
        self.pool = urllib3.PoolManager(
            maxsize=opts.max_requests + 4,
            retries=False,
            timeout=urllib3.Timeout(connect=opts.timeout, read=opts.timeout),
        )
        self.errors = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)

    def _request(self, method: str, key: str, headers: dict[str, str]) -> Any:
        try:
            resp = self.pool.request(
                method,
                self.base + key,
                headers={**self.headers, **headers},
                preload_content=False,
                decode_content=False,
            )
        except self.errors as err:
            raise _Retryable(f"{type(err).__name__}: {err}") from err
        if resp.status >= 400:
            resp.drain_conn()
            resp.release_conn()
            text = f"HTTP {resp.status}"
            if resp.status in _RETRY_STATUS or resp.status >= 500:
                raise _Retryable(text)
            raise RemoteReadError(text)
        return resp

    def get(self, key: str, start: int, stop: int, sink: Callable[[bytes], None]) -> None:
        resp = self._request("GET", key, {"Range": f"bytes={start}-{stop - 1}"})
        try:
            if resp.status != 206:
                # A server that ignores Range sends the whole object: skip to `start`.
                skip = start
                for chunk in resp.stream(1 << 20):
                    if skip >= len(chunk):
                        skip -= len(chunk)
                        continue
                    sink(chunk[skip:])
                    skip = 0
                return
            for chunk in resp.stream(1 << 20):
                sink(chunk)
        except self.errors as err:
            raise _Retryable(f"{type(err).__name__} mid-body: {err}") from err
        finally:
            resp.release_conn()

    def tail(self, key: str, n: int, sink: Callable[[bytes], None]) -> int:
        # A suffix range: one GET, and Content-Range gives the length (no HEAD).
        resp = self._request("GET", key, {"Range": f"bytes=-{n}"})
        try:
            total = None
            if resp.status == 206:
                crange = resp.headers.get("Content-Range", "")
                total = int(crange.rsplit("/", 1)[1]) if "/" in crange else None
            body = []
            for chunk in resp.stream(1 << 20):
                body.append(chunk)
        except self.errors as err:
            raise _Retryable(f"{type(err).__name__} mid-body: {err}") from err
        finally:
            resp.release_conn()
        data = b"".join(body)
        length = resp.headers.get("Content-Length")
        if length is not None and len(data) != int(length):
            raise _Retryable(f"short body: {len(data)} of {length} bytes")
        if total is None:  # a whole object (shorter than n, or no ranges): its last n bytes
            total, data = len(data), data[-n:]
        sink(data)
        return total

    def whole(self, key: str, sink: Callable[[bytes], None]) -> int:
        # One GET, no HEAD: the body is checked against its Content-Length.
        resp = self._request("GET", key, {})
        got = 0
        try:
            for chunk in resp.stream(1 << 20):
                sink(chunk)
                got += len(chunk)
        except self.errors as err:
            raise _Retryable(f"{type(err).__name__} mid-body: {err}") from err
        finally:
            resp.release_conn()
        length = resp.headers.get("Content-Length")
        if length is not None and got != int(length):
            raise _Retryable(f"short body: {got} of {length} bytes")
        return got

    def size(self, key: str) -> int:
        resp = self._request("HEAD", key, {})
        resp.release_conn()
        length = resp.headers.get("Content-Length")
        if length is None:
            raise RemoteReadError("HEAD gave no Content-Length")
        return int(length)


class _Fsspec(_Client):
    def __init__(self, protocol: str, opts: Options) -> None:
        try:
            import fsspec
        except ImportError as err:  # pragma: no cover - the `remote` extra brings it
            raise ImportError(
                f"reading {protocol}:// URLs needs fsspec and its {protocol} filesystem: "
                "pip install 'fastshard[remote]' and the filesystem's package (gcsfs, adlfs, "
                "huggingface_hub, ...)"
            ) from err
        self.fs = fsspec.filesystem(protocol, **opts.client_options)
        self.protocol = protocol

    def get(self, key: str, start: int, stop: int, sink: Callable[[bytes], None]) -> None:
        try:
            data = self.fs.cat_file(key, start=start, end=stop)
        except (FileNotFoundError, PermissionError) as err:
            raise RemoteReadError(f"{type(err).__name__}: {err}") from err
        except (OSError, TimeoutError, ConnectionError) as err:
            raise _Retryable(f"{type(err).__name__}: {err}") from err
        sink(bytes(data))

    def size(self, key: str) -> int:
        return int(self.fs.size(key))

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(key, data)

    def list(self, prefix: str) -> list[str]:
        return [str(p) for p in self.fs.find(prefix)]


class _Local(_Client):
    def get(self, key: str, start: int, stop: int, sink: Callable[[bytes], None]) -> None:
        with open(key, "rb") as f:
            f.seek(start)
            sink(f.read(stop - start))

    def size(self, key: str) -> int:
        return os.path.getsize(key)

    def put(self, key: str, data: bytes) -> None:
        tmp = key + ".partial"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, key)

    def list(self, prefix: str) -> list[str]:
        folder = prefix if os.path.isdir(prefix) else os.path.dirname(prefix)
        out = []
        for root, _, files in os.walk(folder):
            out += [
                os.path.join(root, f) for f in files if os.path.join(root, f).startswith(prefix)
            ]
        return sorted(out)


# Clients of this process by (kind, where, options); a forked child starts without them.
_clients: dict[tuple[Any, ...], _Client] = {}
_clients_pid = os.getpid()
_clients_lock = threading.Lock()


def _after_fork() -> None:
    # A lock that a thread of the parent held at the fork stays held in the child: new ones.
    global _clients_lock
    _clients_lock = threading.Lock()
    _clients.clear()
    _fetchers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _split(url: str) -> tuple[str, str, str]:
    """(scheme, where: bucket or base URL, key) of a URL."""
    m = _SCHEME.match(url)
    scheme = m.group(1).lower() if m else ""
    if scheme in ("s3", "s3a"):
        rest = url[m.end() :] if m else url
        bucket, _, key = rest.partition("/")
        return "s3", bucket, key
    if scheme in ("http", "https"):
        parsed = urllib.parse.urlsplit(url)
        return (
            scheme,
            f"{parsed.scheme}://{parsed.netloc}",
            url[len(parsed.scheme) + 3 + len(parsed.netloc) :],
        )
    if not scheme or scheme == "file":
        return "", "", local_path(url)
    return scheme, "", url


def client(url: str, opts: Options = DEFAULT) -> tuple[_Client, str]:
    """This process's client for ``url`` and the object's key in it."""
    global _clients_pid
    scheme, where, key = _split(url)
    with _clients_lock:
        if _clients_pid != os.getpid():  # forked: the parent's clients hold its connections
            _clients.clear()
            _clients_pid = os.getpid()
        ident = (scheme, where, opts.storage_options, opts.max_requests, opts.timeout)
        found = _clients.get(ident)
        if found is None:
            if scheme == "s3":
                found = _S3(where, opts)
            elif scheme in ("http", "https"):
                found = _HTTP(where, opts)
            elif scheme:
                found = _Fsspec(scheme, opts)
            else:
                found = _Local()
            _clients[ident] = found
    return found, key


def _fail(url: str, start: int, stop: int, why: str) -> RemoteReadError:
    return RemoteReadError(f"{url}: bytes [{start}, {stop}): {why}")


def fetch(url: str, start: int, stop: int, opts: Options = DEFAULT) -> bytes:
    """Bytes ``[start, stop)`` of the object at ``url``, retried and resumed (module doc)."""
    if stop <= start:
        return b""
    cli, key = client(url, opts)
    parts: list[bytes] = []
    got = 0
    want = stop - start
    failures = 0
    while True:
        before = got

        def sink(chunk: bytes) -> None:
            nonlocal got
            take = chunk[: want - got]  # never more than asked, whatever the server sends
            if take:
                parts.append(take)
                got += len(take)

        try:
            cli.get(key, start + got, stop, sink)
            if got == want:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            why = f"short body: {got} of {want} bytes"
            if got == before:  # nothing at all: the object is shorter than the range
                why += " (is the object shorter than the range?)"
        except _Retryable as err:
            why = str(err)
        except RemoteReadError as err:
            raise _fail(url, start, stop, str(err)) from None
        failures += 1
        _stats.retries += 1
        if failures > opts.retries:
            raise _fail(url, start, stop, f"{failures} attempts failed, the last: {why}")
        _backoff(failures)


def _backoff(failures: int) -> None:
    """Wait before attempt ``failures + 1``: exponential, capped, with full jitter (plus a
    quarter of the step, so that no retry comes at once)."""
    delay = min(BACKOFF_CAP, BACKOFF * 2 ** (failures - 1))
    time.sleep(random.uniform(0, delay) + delay / 4)


def _retried(url: str, opts: Options, call: Callable[[], Any]) -> Any:
    failures = 0
    while True:
        try:
            return call()
        except _Retryable as err:
            failures += 1
            if failures > opts.retries:
                raise RemoteReadError(
                    f"{url}: {failures} attempts failed, the last: {err}"
                ) from None
            _backoff(failures)
        except RemoteReadError as err:
            raise RemoteReadError(f"{url}: {err}") from None


def size(url: str, opts: Options = DEFAULT) -> int:
    """The length of the object at ``url`` (a HEAD request for a remote object)."""
    cli, key = client(url, opts)
    return int(_retried(url, opts, lambda: cli.size(key)))


def tail(url: str, n: int, opts: Options = DEFAULT) -> tuple[bytes, int]:
    """(the last ``n`` bytes of the object at ``url``, its length): one GET of a suffix range
    for s3:// and http(s):// (no HEAD), retried as :func:`fetch` is."""
    cli, key = client(url, opts)
    parts: list[bytes] = []

    def attempt() -> int:
        parts.clear()
        return cli.tail(key, n, parts.append)

    total = int(_retried(url, opts, attempt))
    _stats.requests += 1
    data = b"".join(parts)
    _stats.bytes += len(data)
    return data, total


def read_all(url: str, opts: Options = DEFAULT) -> bytes:
    """The whole object at ``url`` (an index, a footer's file): a local file is read as is."""
    if not is_url(url):
        with open(local_path(url), "rb") as f:
            return f.read()
    cli, key = client(url, opts)
    parts: list[bytes] = []

    def attempt() -> int:
        parts.clear()  # a failed attempt's bytes are not kept: the next reads it all again
        return cli.whole(key, parts.append)

    _retried(url, opts, attempt)
    return b"".join(parts)


def write_all(url: str, data: bytes, opts: Options = DEFAULT) -> None:
    """Write ``data`` as the object at ``url`` (whole, replacing it)."""
    cli, key = client(url, opts)
    _retried(url, opts, lambda: cli.put(key, data))


def list_prefix(prefix: str, opts: Options = DEFAULT) -> list[str]:
    """The URLs of the objects under ``prefix``, sorted."""
    cli, key = client(prefix, opts)
    keys = _retried(prefix, opts, lambda: cli.list(key))
    scheme, where, _ = _split(prefix)
    if scheme == "s3":
        return sorted(f"s3://{where}/{k}" for k in keys)
    if scheme in ("http", "https"):
        return sorted(where + k for k in keys)
    if scheme:
        return sorted(k if _SCHEME.match(k) else f"{scheme}://{k}" for k in keys)
    return sorted(keys)


# -- what this process fetched (tests and the benchmark read it) --------------------------------
class _Stats:
    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.retries = 0
        self.cache_hits = 0


_stats = _Stats()


def stats() -> dict[str, int]:
    """Requests, bytes and retries of this process's remote reads so far."""
    return {
        "requests": _stats.requests,
        "bytes": _stats.bytes,
        "retries": _stats.retries,
        "cache_hits": _stats.cache_hits,
    }


# -- reading ahead ------------------------------------------------------------------------------
class _Threads:
    """A fixed set of daemon threads running calls from a queue. Not ThreadPoolExecutor: the
    interpreter joins its threads at exit, so a process would wait for every read it had
    fetched ahead (each up to its retries) before it could exit; daemon threads end with it."""

    def __init__(self, n: int) -> None:
        self.queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self.threads = [
            threading.Thread(target=self._run, name=f"fastshard-fetch-{i}", daemon=True)
            for i in range(n)
        ]
        for t in self.threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.queue.put((lambda: fn(*args), future))
        return future

    def map(self, fn: Callable[..., Any], items: Iterable[Any]) -> list[Any]:
        return [f.result() for f in [self.submit(fn, item) for item in items]]

    def _run(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            call, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as err:
                future.set_exception(err)
            else:
                future.set_result(result)


class _Block:
    __slots__ = ("data", "future", "hi", "lo", "submitted")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo = lo
        self.hi = hi
        self.future: Future[bytes] | None = None
        self.submitted = False
        self.data: bytes | None = None


class RangeStream:
    """Bytes ``[lo, hi)`` of one object, read front to back with :meth:`read`; its blocks are
    fetched ahead by the :class:`Fetcher` that made it."""

    def __init__(
        self, fetcher: Fetcher, url: str, lo: int, hi: int, key: float, rows: float = 1.0
    ) -> None:
        self.fetcher = fetcher
        self.url = url
        self.lo = lo
        self.hi = hi
        self.pos = lo
        self.blocks: list[_Block] = []
        size = fetcher.block_size()
        at = lo
        while at < hi:
            # A last piece shorter than a block joins the one before: no GET of a sliver.
            end = hi if hi - at < 2 * size else at + size
            self.blocks.append(_Block(at, end))
            at = end
        self.next = 0  # the block read next
        self.buffer = b""
        self.offset = 0  # of the buffer
        self.closed = False
        # Each block's place in the fetch order: the stream's key plus its share of the range,
        # so that streams read side by side are fetched side by side.
        span = max(hi - lo, 1)
        self.keys = [key + rows * (b.lo - lo) / span for b in self.blocks]

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer only at the end of the range)."""
        out: list[bytes] = []
        want = n
        while n > 0:
            if self.offset == len(self.buffer):
                if self.next == len(self.blocks):
                    break
                block = self.blocks[self.next]
                self.next += 1
                self.buffer = self.fetcher._wait(self, block)
                self.offset = 0
            take = self.buffer[self.offset : self.offset + n]
            self.offset += len(take)
            n -= len(take)
            out.append(take)
            if self.offset == len(self.buffer):
                self.buffer = b""
                self.offset = 0
        data = out[0] if len(out) == 1 else b"".join(out)
        self.pos += len(data)
        if want:
            self.fetcher._release(len(data))  # fetched bytes count until they are read
        return data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            held = len(self.buffer) - self.offset
            self.buffer = b""
            self.fetcher._drop(self, held)


class Fetcher:
    """The read-ahead of one process for one :class:`Options` (see the module doc)."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.pid = os.getpid()
        self.lock = threading.Condition()
        self.pool: _Threads | None = None
        self.heap: list[tuple[float, int, RangeStream, int]] = []
        self.seq = itertools.count()
        self.inflight = 0  # bytes requested or held, not yet read
        self.peak = 0  # the most of them at once (tests read it)
        self.running = 0  # requests in flight
        self.expected: dict[tuple[str, int, int], list[RangeStream]] = {}
        # How many streams a reader keeps open at once (its lanes), which splits the bound.
        self.concurrency = 1
        self.cache = None if opts.cache_dir is None else _Cache(opts.cache_dir, opts.cache_bytes)

    def block_size(self) -> int:
        """The GET size of a new stream: what fetched and unread bytes may hold (counted until
        read, each open stream holding part of its current block) split over twice the open
        streams, within [MIN_BLOCK_BYTES, block_bytes]."""
        share = self.opts.max_inflight_bytes // (2 * max(1, self.concurrency))
        return max(MIN_BLOCK_BYTES, min(self.opts.block_bytes, share))

    # The order of reads: expect() in the order a reader will take them, then take().
    def expect(self, url: str, lo: int, hi: int, key: float, rows: float = 1.0) -> None:
        """Start fetching ``[lo, hi)`` of ``url`` for a later :meth:`take`. ``key`` orders
        the blocks of all expected streams (smaller first): the row of its lane at which the
        reader reaches the range, which spans ``rows`` rows (lanes are read side by side)."""
        if hi <= lo:
            return
        stream = RangeStream(self, url, lo, hi, key, rows)
        with self.lock:
            self.expected.setdefault((url, lo, hi), []).append(stream)
            for i, k in enumerate(stream.keys):
                heapq.heappush(self.heap, (k, next(self.seq), stream, i))
            self._pump()

    def take(self, url: str, lo: int, hi: int) -> RangeStream:
        """The stream of ``[lo, hi)`` of ``url``: the expected one, or a new one fetched at
        once."""
        with self.lock:
            found = self.expected.get((url, lo, hi))
            if found:
                stream = found.pop(0)
                if not found:
                    del self.expected[(url, lo, hi)]
                return stream
        stream = RangeStream(self, url, lo, hi, -1.0)
        with self.lock:
            for i, k in enumerate(stream.keys):
                heapq.heappush(self.heap, (k, next(self.seq), stream, i))
            self._pump()
        return stream

    def forget(self, ranges: Iterable[tuple[str, int, int]]) -> None:
        """Drop the expected streams of ``ranges`` not taken yet (a pass that ended or was
        abandoned): their bytes stop counting against the bound."""
        streams = []
        with self.lock:
            for r in ranges:
                found = self.expected.pop(r, None)
                if found:
                    streams += found
        for stream in streams:
            stream.close()

    def threads(self) -> _Threads:
        """This fetcher's request threads (made at first use)."""
        with self.lock:
            if self.pool is None:
                self.pool = _Threads(self.opts.max_requests)
            return self.pool

    def fetch_many(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """Several small ranges at once (offset tables), on this fetcher's threads."""
        return self.threads().map(lambda r: self._get(*r), ranges)

    def _pump(self) -> None:
        # Under self.lock: submit blocks in key order while the bounds allow.
        opts = self.opts
        while self.heap and self.running < opts.max_requests:
            _, _, stream, i = self.heap[0]
            block = stream.blocks[i]
            if stream.closed or block.submitted:
                heapq.heappop(self.heap)
                continue
            size = block.hi - block.lo
            if self.inflight + size > opts.max_inflight_bytes and self.inflight > 0:
                return
            heapq.heappop(self.heap)
            self._submit(stream, block)

    def _submit(self, stream: RangeStream, block: _Block) -> None:
        block.submitted = True
        self.inflight += block.hi - block.lo
        self.peak = max(self.peak, self.inflight)
        self.running += 1
        block.future = self.threads().submit(self._get, stream.url, block.lo, block.hi)
        block.future.add_done_callback(self._done)

    def _get(self, url: str, lo: int, hi: int) -> bytes:
        cache = self.cache
        if cache is not None:
            return cache.read(url, lo, hi, self.opts)
        data = fetch(url, lo, hi, self.opts)
        _stats.requests += 1
        _stats.bytes += len(data)
        return data

    def _done(self, _: Future[bytes]) -> None:
        with self.lock:
            self.running -= 1
            self._pump()
            self.lock.notify_all()

    def _wait(self, stream: RangeStream, block: _Block) -> bytes:
        with self.lock:
            if not block.submitted:  # needed now: fetched whatever the bounds say
                self._submit(stream, block)
            future = block.future
        assert future is not None
        try:
            data = future.result()
        except BaseException:
            self._release(block.hi - block.lo)
            raise
        finally:
            block.future = None
        return data

    def _drop(self, stream: RangeStream, held: int) -> None:
        with self.lock:
            self.inflight -= held  # the unread rest of its current block
            for block in stream.blocks[stream.next :]:
                if block.submitted and block.future is not None:
                    # Its bytes stop counting once the request ends.
                    block.future.add_done_callback(
                        lambda _f, n=block.hi - block.lo: self._release(n)
                    )
                    block.future = None
            self._pump()

    def _release(self, n: int) -> None:
        with self.lock:
            self.inflight -= n
            self._pump()


_fetchers: dict[Options, Fetcher] = {}


def fetcher(opts: Options) -> Fetcher:
    """This process's :class:`Fetcher` for ``opts``."""
    found = _fetchers.get(opts)
    if found is None or found.pid != os.getpid():
        found = _fetchers[opts] = Fetcher(opts)
    return found


# -- a seekable file over ranged reads ----------------------------------------------------------
class RemoteFile:
    """A read-only, seekable binary file over an object (for pyarrow's footers and row groups
    and the tar header scan): reads are served from a buffer refilled ``readahead`` bytes at a
    time, so a front-to-back scan costs one GET per ``readahead`` bytes."""

    def __init__(
        self,
        url: str,
        opts: Options = DEFAULT,
        length: int | None = None,
        readahead: int = 4 << 20,
    ) -> None:
        self.url = url
        self.opts = opts
        self.length = size(url, opts) if length is None or length < 0 else length
        self.readahead = readahead
        self.pos = 0
        self.buf = b""
        self.buf_at = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def size(self) -> int:
        return self.length

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.length - self.pos
        n = max(0, min(n, self.length - self.pos))
        if n == 0:
            return b""
        lo = self.pos - self.buf_at
        if not (0 <= lo and lo + n <= len(self.buf)):
            stop = min(self.length, self.pos + max(n, self.readahead))
            data = fetch(self.url, self.pos, stop, self.opts)
            _stats.requests += 1
            _stats.bytes += len(data)
            if n >= self.readahead:  # a large read: nothing worth keeping around it
                self.pos += n
                return data
            self.buf, self.buf_at, lo = data, self.pos, 0
        self.pos += n
        return self.buf[lo : lo + n]

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.closed = True
        self.buf = b""

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- an optional disk cache ---------------------------------------------------------------------
CACHE_BLOCK = 1 << 20


class _Cache:
    """Fetched bytes kept on disk in aligned blocks of :data:`CACHE_BLOCK` bytes, at most
    ``max_bytes`` of them in the folder, whatever the number of processes that share it.

    A block is written under an exclusive lock of the folder (``fcntl.flock``) once the blocks
    least recently used were removed to make room, to a temporary name and then renamed: the
    folder never holds more than the bound, and a reader sees whole blocks only. A range
    larger than the bound is read through without being kept, so a shard larger than the
    cache still streams. Blocks are named by a hash of the URL and the block's number; a read
    touches the block's time, which orders the removals."""

    def __init__(self, folder: str, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        os.makedirs(folder, exist_ok=True)
        self.lockfile = os.path.join(folder, ".lock")
        self.lengths: dict[str, int] = {}

    def _name(self, url: str, block: int) -> str:
        return hashlib.blake2b(url.encode(), digest_size=12).hexdigest() + f".{block}.blk"

    def read(self, url: str, lo: int, hi: int, opts: Options) -> bytes:
        first, last = lo // CACHE_BLOCK, (hi - 1) // CACHE_BLOCK
        parts: list[bytes | None] = [self._get(self._name(url, b)) for b in range(first, last + 1)]
        missing = [first + i for i, p in enumerate(parts) if p is None]
        if missing:
            # One GET over the missing blocks (and the cached ones between them).
            a, z = missing[0] * CACHE_BLOCK, (missing[-1] + 1) * CACHE_BLOCK
            data = fetch(url, a, min(z, self._length(url, opts)), opts)
            _stats.requests += 1
            _stats.bytes += len(data)
            for b in missing:
                piece = data[(b - missing[0]) * CACHE_BLOCK : (b - missing[0] + 1) * CACHE_BLOCK]
                parts[b - first] = piece
                self._put(self._name(url, b), piece)
        else:
            _stats.cache_hits += 1
        whole = b"".join(p or b"" for p in parts)
        return whole[lo - first * CACHE_BLOCK : hi - first * CACHE_BLOCK]

    def _length(self, url: str, opts: Options) -> int:
        # Blocks are aligned, the object's end is not: its length, once per object (a HEAD).
        found = self.lengths.get(url)
        if found is None:
            found = self.lengths[url] = size(url, opts)
        return found

    def _get(self, name: str) -> bytes | None:
        path = os.path.join(self.folder, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
            os.utime(path)
        except FileNotFoundError:
            return None
        return data

    def _put(self, name: str, data: bytes) -> None:
        import fcntl

        if len(data) > self.max_bytes:
            return
        path = os.path.join(self.folder, name)
        with open(self.lockfile, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(path):
                return
            blocks = []
            total = 0
            with os.scandir(self.folder) as entries:
                for e in entries:
                    if e.name.endswith(".blk"):
                        st = e.stat()
                        blocks.append((st.st_mtime, e.path, st.st_size))
                        total += st.st_size
            blocks.sort()
            while blocks and total + len(data) > self.max_bytes:
                _, old, n = blocks.pop(0)
                _unlink(old)
                total -= n
            tmp = f"{path}.{os.getpid()}.partial"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
