"""Limits: --max-message-size (1009), --max-conns (503), --max-conns-per-ip (429),
--max-queue (1008 slow consumer)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import warnings

import pytest
from websockets.exceptions import InvalidStatus

from conftest import can_bind
from rawws import OP_BINARY, OP_CONT, OP_TEXT, Closed, encode_frame, http_exchange, ws_connect as raw_connect
from wsutil import expect_closed, received_close_code, run, ws_connect


# ---------------------------------------------------------------- message size


def test_message_under_max_size_is_echoed(start_server):
    srv = start_server("--max-message-size", "1024")

    async def main():
        async with ws_connect(srv.url()) as ws:
            msg = "a" * 1000
            await ws.send(msg)
            assert await ws.recv() == msg
            exact = b"b" * 1024
            await ws.send(exact)
            assert await ws.recv() == exact, "a message of exactly the limit is allowed"

    run(main())


def test_message_over_max_size_gets_1009(start_server):
    srv = start_server("--max-message-size", "1024")

    async def main():
        async with ws_connect(srv.url()) as ws:
            await ws.send("a" * 2000)
            exc = await expect_closed(ws)
            assert received_close_code(exc) == 1009, f"expected close 1009, got {exc!r}"

    run(main())


def test_binary_over_max_size_gets_1009(start_server):
    srv = start_server("--max-message-size", "1024")

    async def main():
        async with ws_connect(srv.url()) as ws:
            await ws.send(os.urandom(1025))
            exc = await expect_closed(ws)
            assert received_close_code(exc) == 1009, f"expected close 1009, got {exc!r}"

    run(main())


def test_fragmented_total_over_max_size_gets_1009(start_server):
    """Each fragment is under the limit; their total is not."""
    srv = start_server("--max-message-size", "1024")
    c = raw_connect(srv.port)
    try:
        c.send_frame(OP_TEXT, b"a" * 500, fin=False)
        c.send_frame(OP_CONT, b"b" * 500, fin=False)
        try:
            c.send_frame(OP_CONT, b"c" * 500, fin=True)
        except OSError:
            pass  # server may already have closed
        code, reason = c.expect_close(timeout=5)
        assert code == 1009, f"expected 1009, got {code} {reason!r}"
    finally:
        c.close()


def test_max_message_size_accepts_kib_suffix(start_server):
    srv = start_server("--max-message-size", "2KiB")

    async def main():
        async with ws_connect(srv.url()) as ws:
            await ws.send("x" * 2048)
            assert len(await ws.recv()) == 2048
            await ws.send("x" * 2049)
            exc = await expect_closed(ws)
            assert received_close_code(exc) == 1009

    run(main())


def test_default_max_message_size_is_64kib(server):
    async def main():
        async with ws_connect(server.url()) as ws:
            await ws.send(b"z" * 65536)
            assert len(await ws.recv()) == 65536
            await ws.send(b"z" * 65537)
            exc = await expect_closed(ws)
            assert received_close_code(exc) == 1009

    run(main())


# ---------------------------------------------------------------- connection limits


async def _expect_status(url, status, **kw):
    try:
        async with ws_connect(url, **kw):
            pass
    except InvalidStatus as e:
        got = e.response.status_code
        assert got == status, f"expected HTTP {status}, got {got}: {e.response.body!r}"
        return e.response
    raise AssertionError(f"handshake succeeded, expected HTTP {status}")


def test_max_conns_rejects_extra_handshake_with_503(start_server):
    srv = start_server("--max-conns", "3")

    async def main():
        clients = [await ws_connect(srv.url()) for _ in range(3)]
        try:
            for i, ws in enumerate(clients):
                await ws.send(f"c{i}")
                assert await ws.recv() == f"c{i}"
            resp = await _expect_status(srv.url(), 503)
            assert b'"status"' in resp.body and b"503" in resp.body, resp.body
            # Existing connections are unaffected.
            await clients[0].send("still")
            assert await clients[0].recv() == "still"
            # Freeing a slot lets a new client in (the server may need a moment to notice).
            await clients.pop().close()
            deadline = time.monotonic() + 5
            while True:
                try:
                    ws = await ws_connect(srv.url())
                    clients.append(ws)
                    break
                except InvalidStatus as e:
                    assert e.response.status_code == 503
                    if time.monotonic() > deadline:
                        raise AssertionError("slot not freed 5s after a client closed")
                    await asyncio.sleep(0.1)
            await ws.send("new")
            assert await ws.recv() == "new"
        finally:
            for ws in clients:
                await ws.close()

    run(main())


def test_max_conns_does_not_limit_plain_http(start_server):
    srv = start_server("--max-conns", "1")

    async def main():
        async with ws_connect(srv.url()) as ws:
            resp = http_exchange(srv.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert resp.status == 200, resp
            await _expect_status(srv.url(), 503)
            await ws.send("ok")
            assert await ws.recv() == "ok"

    run(main())


def test_max_conns_per_ip_rejects_third_with_429(start_server):
    srv = start_server("--max-conns-per-ip", "2")

    async def main():
        clients = [await ws_connect(srv.url()) for _ in range(2)]
        try:
            resp = await _expect_status(srv.url(), 429)
            assert b"429" in resp.body, resp.body
            await clients[1].send("alive")
            assert await clients[1].recv() == "alive"
        finally:
            for ws in clients:
                await ws.close()

    run(main())


@pytest.mark.skipif(not can_bind("127.0.0.2"), reason="127.0.0.2 not usable as a source address")
def test_max_conns_per_ip_counts_each_ip_separately(start_server):
    srv = start_server("--max-conns-per-ip", "1")

    async def main():
        a = await ws_connect(srv.url(), local_addr=("127.0.0.1", 0))
        try:
            await _expect_status(srv.url(), 429, local_addr=("127.0.0.1", 0))
            async with ws_connect(srv.url(), local_addr=("127.0.0.2", 0)) as b:
                await b.send("other ip")
                assert await b.recv() == "other ip"
        finally:
            await a.close()

    run(main())


# ---------------------------------------------------------------- slow consumer


def test_slow_consumer_exceeding_max_queue_gets_1008(start_server):
    """A client that sends a lot but never reads makes the server's outbound
    queue grow past --max-queue; the server must cut it off (close 1008
    "slow consumer") instead of buffering without bound, and keep serving others.

    A client that does not read cannot always receive the close frame (it sits
    behind the queued echoes, and a server that drops the socket while the
    client is still sending causes a TCP reset), so: if a close frame arrives it
    must be 1008; if the TCP connection ends without one, that is reported as a
    warning; if the connection is still open after 32 MiB sent, the test fails."""
    srv = start_server("--max-queue", "65536")
    c = raw_connect(srv.port, rcvbuf=4096)
    try:
        msg = encode_frame(OP_BINARY, b"q" * 16384)
        sent = 0
        send_error = None
        c.sock.settimeout(2.0)
        try:
            while sent < 32 * 1024 * 1024:
                c.sock.sendall(msg)
                sent += len(msg)
        except (socket.timeout, OSError) as e:
            send_error = e  # server stopped reading or closed: expected
        try:
            code, reason = c.expect_close(timeout=15)
        except Closed as e:
            warnings.warn(
                f"slow consumer: TCP ended ({e}) without a readable close frame "
                f"(sent {sent} bytes, send stopped by {send_error!r}, read {len(c.skipped)} echoes first)"
            )
            code = None
        except TimeoutError:
            raise AssertionError(
                f"slow consumer was not cut off: sent {sent} bytes with --max-queue 64KiB, "
                f"send stopped by {send_error!r}, read {len(c.skipped)} echoes, no close within 15s"
            )
        if code is not None:
            assert code == 1008, f"expected 1008, got {code} {reason!r}"
            assert b"slow" in reason.lower(), reason
    finally:
        c.close()
    resp = http_exchange(srv.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.status == 200, resp
