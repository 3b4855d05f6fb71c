"""Helpers around the `websockets` asyncio client."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import Opcode


def run(coro, timeout: float = 30.0):
    """Run an async test body with a hard timeout so nothing hangs forever."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def ws_connect(url: str, **kw):
    """websockets.connect with test-friendly defaults: no proxy, no client-side
    keepalive pings (they would count as client activity), bounded timeouts."""
    opts = dict(proxy=None, ping_interval=None, open_timeout=5, close_timeout=3, max_size=16 * 1024 * 1024)
    opts.update(kw)
    return connect(url, **opts)


async def expect_closed(ws, timeout: float = 5.0) -> ConnectionClosed:
    """Wait until the server closes the connection; return the ConnectionClosed raised.
    Data messages received meanwhile are ignored."""

    async def drain():
        while True:
            await ws.recv()

    try:
        await asyncio.wait_for(drain(), timeout)
    except ConnectionClosed as e:
        return e
    raise AssertionError("unreachable")


def received_close_code(exc: ConnectionClosed):
    return exc.rcvd.code if exc.rcvd is not None else None


class PingCountingConnection(ClientConnection):
    """ClientConnection that counts ping frames received from the server
    (websockets still answers them automatically)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pings_received = 0

    def process_event(self, event) -> None:
        if getattr(event, "opcode", None) is Opcode.PING:
            self.pings_received += 1
        super().process_event(event)


async def recv_json(ws, timeout: float = 5.0) -> dict:
    """Receive one frame, assert it is a text frame holding a JSON object, parse it."""
    import json

    msg = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(msg, str), f"expected a JSON text frame, got binary {msg[:100]!r}"
    obj = json.loads(msg)
    assert isinstance(obj, dict), f"expected a JSON object, got {msg!r}"
    return obj


async def expect_silence(ws, seconds: float = 0.3) -> None:
    """Assert nothing arrives on ws for `seconds`."""
    try:
        msg = await asyncio.wait_for(ws.recv(), seconds)
    except asyncio.TimeoutError:
        return
    raise AssertionError(f"expected no frame, got {msg!r}")
