"""Tiny raw-socket HTTP / WebSocket client used to send things a well-behaved
client library refuses to send (bad handshakes, unmasked frames, bad close codes...).

Everything here has a timeout: nothing may block forever.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import struct
import time

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONT = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA


class Closed(Exception):
    """The peer closed (EOF) or reset the TCP connection."""


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()


def new_key() -> str:
    return base64.b64encode(os.urandom(16)).decode()


def encode_frame(
    opcode: int,
    payload: bytes = b"",
    *,
    fin: bool = True,
    mask: bool = True,
    rsv: int = 0,
    mask_key: bytes | None = None,
) -> bytes:
    """Encode one WebSocket frame. Client frames are masked unless mask=False."""
    b0 = (0x80 if fin else 0) | ((rsv & 0x7) << 4) | (opcode & 0xF)
    n = len(payload)
    mbit = 0x80 if mask else 0
    if n < 126:
        head = struct.pack("!BB", b0, mbit | n)
    elif n < 65536:
        head = struct.pack("!BBH", b0, mbit | 126, n)
    else:
        head = struct.pack("!BBQ", b0, mbit | 127, n)
    if not mask:
        return head + payload
    key = mask_key if mask_key is not None else os.urandom(4)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if n < 4096 else _mask_fast(payload, key)
    return head + key + masked


def _mask_fast(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    k = int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(payload, "big") ^ k).to_bytes(n, "big")


def close_payload(code: int | None, reason: bytes = b"") -> bytes:
    if code is None:
        return b""
    return struct.pack("!H", code) + reason


class HTTPResponse:
    def __init__(self, status: int, reason: str, version: str, headers: list[tuple[str, str]], body: bytes):
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self) -> str:
        hs = "".join(f"\n  {k}: {v}" for k, v in self.headers)
        return f"<HTTP {self.version} {self.status} {self.reason}{hs}\n  body={self.body[:300]!r}>"


class RawConn:
    """A TCP connection with a receive buffer, able to speak HTTP/1.1 and raw WS frames."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0, rcvbuf: int | None = None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.buf = b""
        self.timeout = timeout

    # -- plumbing ---------------------------------------------------------
    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out waiting for data from server")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout as e:
            raise TimeoutError("timed out waiting for data from server") from e
        except (ConnectionResetError, BrokenPipeError) as e:
            raise Closed(f"connection reset: {e}") from e
        if not chunk:
            raise Closed("EOF")
        self.buf += chunk

    def read_exact(self, n: int, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while len(self.buf) < n:
            self._fill(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_until(self, marker: bytes, timeout: float | None = None, limit: int = 1 << 20) -> bytes:
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while marker not in self.buf:
            if len(self.buf) > limit:
                raise AssertionError(f"no {marker!r} within {limit} bytes: {self.buf[:200]!r}")
            self._fill(deadline)
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_to_eof(self, timeout: float | None = None) -> bytes:
        """Read until the server closes. Raises TimeoutError if it does not."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            try:
                self._fill(deadline)
            except Closed:
                out, self.buf = self.buf, b""
                return out

    def wait_closed(self, timeout: float) -> bytes:
        """Wait for EOF/reset; returns whatever bytes arrived before it."""
        return self.read_to_eof(timeout)

    # -- HTTP ---------------------------------------------------------------
    def read_http_response(self, timeout: float | None = None, body: bool = True) -> HTTPResponse:
        t = timeout if timeout is not None else self.timeout
        head = self.read_until(b"\r\n\r\n", timeout=t)
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0]
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise AssertionError(f"bad status line {status_line!r}")
        version, status = parts[0], int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = []
        for line in lines[1:]:
            if not line:
                continue
            k, _, v = line.partition(":")
            headers.append((k.strip(), v.strip()))
        resp = HTTPResponse(status, reason, version, headers, b"")
        if body and status != 101:
            cl = resp.header("content-length")
            if cl is not None:
                resp.body = self.read_exact(int(cl), timeout=t)
            elif (resp.header("transfer-encoding") or "").lower() == "chunked":
                resp.body = self._read_chunked(t)
            else:
                resp.body = self.read_to_eof(timeout=t)
        return resp

    def _read_chunked(self, timeout: float) -> bytes:
        out = b""
        while True:
            line = self.read_until(b"\r\n", timeout=timeout)
            size = int(line.strip().split(b";")[0], 16)
            if size == 0:
                self.read_until(b"\r\n", timeout=timeout)
                return out
            out += self.read_exact(size, timeout=timeout)
            self.read_exact(2, timeout=timeout)

    # -- WebSocket ------------------------------------------------------------
    def send_frame(self, opcode: int, payload: bytes = b"", **kw) -> None:
        self.send(encode_frame(opcode, payload, **kw))

    def send_close(self, code: int | None = 1000, reason: bytes = b"", **kw) -> None:
        self.send_frame(OP_CLOSE, close_payload(code, reason), **kw)

    def read_frame(self, timeout: float | None = None):
        """Return (fin, rsv, opcode, payload) of the next server frame.
        Asserts the server did not mask it (RFC 6455 5.1)."""
        t = timeout if timeout is not None else self.timeout
        deadline = time.monotonic() + t
        b0, b1 = self.read_exact(2, timeout=t)
        fin = bool(b0 & 0x80)
        rsv = (b0 >> 4) & 0x7
        opcode = b0 & 0xF
        masked = bool(b1 & 0x80)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self.read_exact(2, timeout=max(0.01, deadline - time.monotonic())))
        elif n == 127:
            (n,) = struct.unpack("!Q", self.read_exact(8, timeout=max(0.01, deadline - time.monotonic())))
        assert not masked, "server sent a masked frame"
        payload = self.read_exact(n, timeout=max(0.01, deadline - time.monotonic()))
        return fin, rsv, opcode, payload

    def read_message(self, timeout: float | None = None, answer_pings: bool = True):
        """Read one complete data message (opcode, payload), skipping/answering pings.
        Returns ('close', (code, reason)) if a close frame arrives instead."""
        t = timeout if timeout is not None else self.timeout
        deadline = time.monotonic() + t
        opcode = None
        data = b""
        while True:
            fin, _rsv, op, payload = self.read_frame(timeout=max(0.01, deadline - time.monotonic()))
            if op == OP_PING:
                if answer_pings:
                    self.send_frame(OP_PONG, payload)
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                return "close", parse_close(payload)
            if op != OP_CONT:
                opcode = op
            data += payload
            if fin:
                return opcode, data

    def expect_close(self, timeout: float = 5.0, answer_pings: bool = False):
        """Read frames until a close frame; return (code, reason). Data frames
        are collected into self.skipped. Raises Closed if TCP ends first."""
        deadline = time.monotonic() + timeout
        self.skipped = []
        while True:
            fin, _rsv, op, payload = self.read_frame(timeout=max(0.01, deadline - time.monotonic()))
            if op == OP_CLOSE:
                return parse_close(payload)
            if op == OP_PING and answer_pings:
                self.send_frame(OP_PONG, payload)
            self.skipped.append((op, len(payload)))


def parse_close(payload: bytes):
    if len(payload) < 2:
        return None, b""
    (code,) = struct.unpack("!H", payload[:2])
    return code, payload[2:]


def upgrade_request(
    path: str = "/echo",
    host: str | None = "127.0.0.1",
    key: str | None = "AUTO",
    version: str | None = "13",
    connection: str | None = "Upgrade",
    upgrade: str | None = "websocket",
    http_version: str = "HTTP/1.1",
    method: str = "GET",
    extra: list[tuple[str, str]] | None = None,
) -> tuple[bytes, str | None]:
    """Build an upgrade request. Pass None to omit a header. Returns (bytes, key)."""
    if key == "AUTO":
        key = new_key()
    lines = [f"{method} {path} {http_version}"]
    if host is not None:
        lines.append(f"Host: {host}")
    if upgrade is not None:
        lines.append(f"Upgrade: {upgrade}")
    if connection is not None:
        lines.append(f"Connection: {connection}")
    if key is not None:
        lines.append(f"Sec-WebSocket-Key: {key}")
    if version is not None:
        lines.append(f"Sec-WebSocket-Version: {version}")
    for k, v in extra or []:
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), key


def http_exchange(port: int, request: bytes, timeout: float = 5.0) -> HTTPResponse:
    """Send one raw request on a new connection and read one response."""
    with RawConn(port, timeout=timeout) as c:
        c.send(request)
        return c.read_http_response(timeout=timeout)


def ws_connect(port: int, path: str = "/echo", timeout: float = 5.0, **kw) -> RawConn:
    """Open a raw connection and complete a valid WebSocket handshake."""
    c = RawConn(port, timeout=timeout, rcvbuf=kw.pop("rcvbuf", None))
    req, key = upgrade_request(path=path, host=f"127.0.0.1:{port}", **kw)
    c.send(req)
    resp = c.read_http_response(timeout=timeout)
    if resp.status != 101:
        c.close()
        raise AssertionError(f"handshake failed: {resp!r}")
    assert resp.header("sec-websocket-accept") == accept_key(key), resp
    c.handshake_response = resp
    return c


# -- HTTP API helpers (channels / publish) --------------------------------------


def http_request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: list[tuple[str, str]] | None = None,
    timeout: float = 5.0,
    source: str | None = None,
) -> HTTPResponse:
    """One HTTP/1.1 request on a new connection. Content-Length is added when a
    body is given (pass body=None to send no body and no Content-Length).
    `source` binds the client socket to that local address (e.g. "127.0.0.2")."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    for k, v in headers or []:
        lines.append(f"{k}: {v}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    req = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + (body or b"")
    if source is None:
        return http_exchange(port, req, timeout=timeout)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    c = RawConn.__new__(RawConn)
    c.sock, c.buf, c.timeout = sock, b"", timeout
    with c:
        c.send(req)
        return c.read_http_response(timeout=timeout)


def publish(
    port: int,
    channel: str,
    data: bytes | str,
    content_type: str | None = "AUTO",
    api_key: str | None = None,
    headers: list[tuple[str, str]] | None = None,
    timeout: float = 5.0,
) -> HTTPResponse:
    """POST /api/publish/{channel}. A str is sent as text/plain; charset=utf-8,
    bytes as application/octet-stream (content_type=None: no Content-Type)."""
    if content_type == "AUTO":
        content_type = "text/plain; charset=utf-8" if isinstance(data, str) else "application/octet-stream"
    body = data.encode("utf-8") if isinstance(data, str) else data
    hs = list(headers or [])
    if content_type is not None:
        hs.append(("Content-Type", content_type))
    if api_key is not None:
        hs.append(("Authorization", f"Bearer {api_key}"))
    return http_request(port, "POST", f"/api/publish/{channel}", body, hs, timeout=timeout)


def publish_ok(port: int, channel: str, data: bytes | str, **kw) -> int:
    """Publish and assert 200 {"seq": N}; returns N."""
    resp = publish(port, channel, data, **kw)
    assert resp.status == 200, f"publish to {channel!r} failed: {resp!r}"
    seq = resp.json().get("seq")
    assert isinstance(seq, int), f"publish answer has no integer seq: {resp!r}"
    return seq


def metric(port: int, series: str) -> float:
    """The value of one /metrics series, named with its labels as printed
    (`throng_handshake_failures_total{reason="timeout"}`)."""
    resp = http_request(port, "GET", "/metrics")
    assert resp.status == 200, resp
    for line in resp.body.decode().splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    raise AssertionError(f"no series {series} in /metrics")


def channel_info(port: int, channel: str, timeout: float = 5.0) -> dict:
    """GET /api/channels/{channel} => dict (asserts 200)."""
    resp = http_request(port, "GET", f"/api/channels/{channel}", timeout=timeout)
    assert resp.status == 200, resp
    return resp.json()


def without_epoch(info: dict) -> dict:
    """The channel info without its epoch, after checking the epoch is 16 hex digits."""
    info = dict(info)
    epoch = info.pop("epoch")
    assert isinstance(epoch, str) and len(epoch) == 16 and int(epoch, 16) >= 0, f"epoch {epoch!r}: {info}"
    return info


def wait_subscribers(port: int, channel: str, n: int, timeout: float = 10.0) -> dict:
    """Poll /api/channels/{channel} until it reports exactly n subscribers."""
    deadline = time.monotonic() + timeout
    while True:
        info = channel_info(port, channel)
        if info.get("subscribers") == n:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"channel {channel!r}: expected {n} subscribers within {timeout}s, got {info}")
        time.sleep(0.02)


def assert_json_error(resp, status, substring=None):
    """A JSON error answer: the status, a human reason, and the status echoed in the body."""
    assert resp.status == status, resp
    ctype = (resp.header("content-type") or "").lower()
    assert ctype.startswith("application/json"), f"error Content-Type must be application/json: {resp!r}"
    body = resp.json()
    assert isinstance(body.get("error"), str) and body["error"], f"missing human reason: {resp!r}"
    assert body.get("status") == status, f"JSON status must equal HTTP status: {resp!r}"
    if substring is not None:
        assert substring.lower() in body["error"].lower(), f"reason should mention {substring!r}: {resp!r}"
    return body


def settled(fetch, ok, timeout: float = 5.0, every: float = 0.02):
    """Calls fetch() until ok(value) holds or `timeout` passes, and returns the last
    value for the caller to assert on. For counters an event loop publishes at the
    end of its turn, a moment after the client saw what it counts."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(every)
