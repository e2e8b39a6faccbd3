"""A real S3-API server on loopback with a fault-injecting proxy in front, for the remote tests
and bench/streams_remote.py.

``S3Server()`` starts moto's server (``python -m moto.server``) and this file's proxy, each a
subprocess in its own session on a free loopback port, and ends both by their process groups.
The proxy forwards HTTP/1.1 to moto and can add latency to every request, answer a share of
requests with 503, reset a share of connections mid-body, and cut a share of bodies short.
It counts at the server what clients fetched: requests by method and every GET's byte range
and body bytes sent. Its control endpoint is ``/__proxy__/...`` on the same port.

Run as a script, it is the proxy: ``python s3_server.py UPSTREAM_PORT PORT``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

CONTROL = "/__proxy__/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


def _die_with_parent() -> None:
    # Run in the child before exec: a test process killed outright takes its servers along.
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


class S3Server:
    """moto's S3 server behind the fault proxy; ``endpoint`` is the proxy's URL."""

    KEY = "testing"
    SECRET = "testing"

    def __init__(self) -> None:
        self.moto_port = free_port()
        self.port = free_port()
        env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
        self.moto: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.moto_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env=env,
        )
        self.proxy: subprocess.Popen[bytes] | None = None
        try:
            _wait_port(self.moto_port, self.moto)
            self.proxy = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), str(self.moto_port), str(self.port)],
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
            _wait_port(self.port, self.proxy)
        except BaseException:
            self.close()
            raise
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.direct = f"http://127.0.0.1:{self.moto_port}"

    # -- what clients need ---------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment variables a client reads to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.KEY,
            "AWS_SECRET_ACCESS_KEY": self.SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self) -> Any:
        """A boto3 client straight to moto (setting up data bypasses the proxy's counts)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.direct,
            aws_access_key_id=self.KEY,
            aws_secret_access_key=self.SECRET,
            region_name="us-east-1",
        )

    def upload(self, bucket: str, files: dict[str, str]) -> None:
        """Create ``bucket`` (if new) and upload ``{key: local path}``."""
        c = self.client()
        try:
            c.create_bucket(Bucket=bucket)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        for key, path in files.items():
            c.upload_file(path, bucket, key)

    # -- the proxy's control -----------------------------------------------------------------
    def _control(self, what: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.endpoint}{CONTROL}{what}", data=data)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def faults(self, **config: Any) -> None:
        """Set the proxy's faults: latency (s), fail (share answered 503), reset (share
        reset mid-body), truncate (share cut short), seed."""
        self._control("config", config)

    def stats(self) -> dict[str, Any]:
        """What the proxy served since the last reset: ``requests`` by method, ``gets`` as
        ``[key, start, stop, bytes sent]``, ``bytes`` of GET bodies sent, ``faults``."""
        return self._control("stats")  # type: ignore[no-any-return]

    def reset(self) -> None:
        self._control("reset", {})

    def stop_upstream(self) -> None:
        """Stop moto (the proxy then answers nothing useful): a server gone mid-job."""
        _kill(self.moto)

    def close(self) -> None:
        _kill(self.proxy)
        _kill(self.moto)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- the proxy (runs as a script) ---------------------------------------------------------------
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class _Proxy:
    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.config: dict[str, Any] = {
            "latency": 0.0,
            "fail": 0.0,
            "reset": 0.0,
            "truncate": 0.0,
            "seed": 0,
        }
        self.rng = random.Random(0)
        self.reset()

    def reset(self) -> None:
        self.requests: dict[str, int] = {}
        self.gets: list[list[Any]] = []
        self.bytes = 0
        self.faults = {"fail": 0, "reset": 0, "truncate": 0}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif headers.get("transfer-encoding", "").lower() == "chunked":
                    body = await _read_chunked(reader)
                    head = _dechunk_head(head, len(body))
                if target.startswith(CONTROL):
                    await self.control(writer, target[len(CONTROL) :], body)
                    continue
                self.requests[method] = self.requests.get(method, 0) + 1
                cfg = self.config
                if cfg["latency"]:
                    await asyncio.sleep(cfg["latency"])
                if self.rng.random() < cfg["fail"]:
                    self.faults["fail"] += 1
                    msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    writer.write(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg)
                    )
                    await writer.drain()
                    continue
                if up is None:
                    up = await asyncio.open_connection("127.0.0.1", self.upstream)
                up[1].write(head + body)
                await up[1].drain()
                status_head = await up[0].readuntil(b"\r\n\r\n")
                rlines = status_head.decode("latin-1").split("\r\n")
                rheaders = {}
                for line in rlines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        rheaders[k.strip().lower()] = v.strip()
                status = int(rlines[0].split(" ")[1])
                if method == "HEAD" or status in (204, 304):
                    rbody = b""
                elif "content-length" in rheaders:
                    rbody = await up[0].readexactly(int(rheaders["content-length"]))
                elif rheaders.get("transfer-encoding", "").lower() == "chunked":
                    rbody = await _read_chunked(up[0])
                    status_head = _dechunk_head(status_head, len(rbody))
                else:
                    rbody = await up[0].read()
                    up[1].close()
                    up = None
                if rheaders.get("connection", "").lower() == "close" and up is not None:
                    up[1].close()
                    up = None
                if method == "GET" and status in (200, 206):
                    key = target.split("?", 1)[0]
                    m = _RANGE.match(headers.get("range", ""))
                    start = int(m.group(1)) if m else 0
                    roll = self.rng.random()
                    if len(rbody) > 1 and roll < cfg["reset"]:
                        self.faults["reset"] += 1
                        cut = len(rbody) // 2
                        self._count(key, start, cut)
                        writer.write(status_head + rbody[:cut])
                        await writer.drain()
                        writer.transport.abort()  # an RST, as a broken connection gives
                        return
                    if len(rbody) > 1 and roll < cfg["reset"] + cfg["truncate"]:
                        self.faults["truncate"] += 1
                        cut = len(rbody) // 3
                        self._count(key, start, cut)
                        writer.write(status_head + rbody[:cut])
                        await writer.drain()
                        writer.close()  # a clean close before Content-Length bytes
                        return
                    self._count(key, start, len(rbody))
                writer.write(status_head + rbody)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            if up is not None:
                up[1].close()
            try:
                writer.close()
            except Exception:
                pass

    def _count(self, key: str, start: int, sent: int) -> None:
        self.gets.append([key, start, start + sent, sent])
        self.bytes += sent

    async def control(self, writer: asyncio.StreamWriter, what: str, body: bytes) -> None:
        if what == "config":
            self.config.update(json.loads(body or b"{}"))
            self.rng = random.Random(self.config["seed"])
            out: Any = self.config
        elif what == "reset":
            self.reset()
            out = {}
        else:
            out = {
                "requests": self.requests,
                "gets": self.gets,
                "bytes": self.bytes,
                "faults": self.faults,
            }
        data = json.dumps(out).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(data), data)
        )
        await writer.drain()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(out)
        out.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _dechunk_head(head: bytes, n: int) -> bytes:
    lines = [
        line
        for line in head.split(b"\r\n")
        if not line.lower().startswith(b"transfer-encoding:") and line
    ]
    return b"\r\n".join([*lines, b"Content-Length: %d" % n, b"", b""])


async def _serve(upstream: int, port: int) -> None:
    proxy = _Proxy(upstream)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", port, limit=1 << 24)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), int(sys.argv[2])))
