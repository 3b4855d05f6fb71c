"""Graceful shutdown on SIGTERM / SIGINT: close 1001 to everyone, exit 0 within --drain-timeout."""

from __future__ import annotations

import asyncio
import signal
import socket
import time

import pytest

from rawws import OP_TEXT, ws_connect as raw_connect
from wsutil import expect_closed, received_close_code, run, ws_connect


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_closes_all_clients_with_1001_and_exits_0(start_server, sig):
    # A drain timeout far beyond the wait below: an exit within the wait can only be
    # the server seeing every client gone, not the timeout running out.
    srv = start_server("--drain-timeout", "120s")

    async def main():
        clients = [await ws_connect(srv.url()) for _ in range(6)]
        for i, ws in enumerate(clients):
            await ws.send(f"hello {i}")
            assert await ws.recv() == f"hello {i}"
        srv.signal(sig)
        excs = await asyncio.gather(*(expect_closed(ws, timeout=30) for ws in clients))
        codes = [received_close_code(e) for e in excs]
        assert codes == [1001] * len(clients), f"close codes seen by clients: {codes}"
        rc = await asyncio.get_running_loop().run_in_executor(None, srv.wait, 60)
        assert rc is not None, "server still running 60s after the signal, every client gone (drain timeout 120s)"
        assert rc == 0, f"exit code {rc}"

    run(main())


def test_shutdown_with_no_clients_exits_0_quickly(start_server):
    # Exiting within the wait, far shorter than the drain timeout, is what shows the
    # idle server did not wait for it (however slow the machine, short of a minute).
    srv = start_server("--drain-timeout", "120s")
    srv.signal(signal.SIGTERM)
    rc = srv.wait(60)
    assert rc == 0, f"exit code {rc} (None = still running 60s after SIGTERM: waiting for the 120s drain timeout?)"


def test_unresponsive_client_does_not_block_exit_past_drain_timeout(start_server):
    """A client that never reads nor answers the close cannot hold the server
    beyond --drain-timeout."""
    srv = start_server("--drain-timeout", "2s")
    c = raw_connect(srv.port, rcvbuf=4096)
    try:
        c.send_frame(OP_TEXT, b"x")  # make it a real, active connection; never read again
        time.sleep(0.2)
        srv.signal(signal.SIGTERM)
        # The client never answers the close, so only the drain timeout can end the
        # drain: an exit at all shows it does (the deadline is generous, not a timing).
        rc = srv.wait(60)
        assert rc is not None, "server still running 60s after SIGTERM with --drain-timeout 2s"
        assert rc == 0, f"exit code {rc}"
    finally:
        c.close()


def test_raw_client_gets_close_1001_on_sigterm(start_server):
    srv = start_server("--drain-timeout", "5s")
    c = raw_connect(srv.port)
    try:
        srv.signal(signal.SIGTERM)
        code, reason = c.expect_close(timeout=5)
        assert code == 1001, f"expected 1001, got {code} {reason!r}"
        c.send_close(1001)  # complete the closing handshake
        try:
            c.wait_closed(timeout=5)
        except TimeoutError:
            raise AssertionError("server kept TCP open after the closing handshake")
        rc = srv.wait(8)
        assert rc == 0, f"exit code {rc}"
    finally:
        c.close()


def test_no_new_connections_after_shutdown(start_server):
    srv = start_server("--drain-timeout", "3s")

    async def main():
        async with ws_connect(srv.url()) as ws:
            srv.signal(signal.SIGTERM)
            exc = await expect_closed(ws, timeout=5)
            assert received_close_code(exc) == 1001
        rc = await asyncio.get_running_loop().run_in_executor(None, srv.wait, 8)
        assert rc == 0, f"exit code {rc}"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()

    run(main())


def read_http_answer(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes (an answer with Connection: close)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            raise AssertionError(f"connection reset after {data!r}")
        if not chunk:
            return data
        data += chunk


def kept_alive(port: int) -> socket.socket:
    """A plain HTTP connection the server has accepted and answered once."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(5)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "healthz"
    return sock


# A plain HTTP connection may still send a request this long after its loop starts
# draining (DRAIN_GRACE in src/server/event_loop.rs)...
DRAIN_GRACE = 0.25
# ...so a request sent this soon after the signal is inside it (the loop starts
# draining after the signal was sent), with room for the server's own turn.
SURELY_IN_GRACE = DRAIN_GRACE - 0.1
DRAIN_ATTEMPTS = 3


def answer_during_the_drain(start_server, request: bytes, check) -> None:
    """Sends `request` on a kept-alive connection as soon as the server is draining,
    and check(answer) asserts what it answered. One loop (--threads 1): the 1001 the
    held WebSocket gets says that loop is draining, and the request goes out at once,
    inside the DRAIN_GRACE it gives plain HTTP connections. A busy machine can stall
    this process past the grace: a wrong answer to a request that went out more than
    SURELY_IN_GRACE after the signal proves nothing, and a new server is tried."""
    for attempt in range(1, DRAIN_ATTEMPTS + 1):
        srv = start_server("--threads", "1", "--drain-timeout", "5s")
        holder = raw_connect(srv.port)  # keeps the drain going past the grace
        sock = kept_alive(srv.port)
        try:
            signalled = time.monotonic()
            srv.signal(signal.SIGTERM)
            code, reason = holder.expect_close(timeout=5)
            assert code == 1001, f"the held WebSocket got {code} {reason!r}, not 1001"
            sock.sendall(request)
            took = time.monotonic() - signalled
            try:
                check(read_http_answer(sock))
            except AssertionError:
                if took <= SURELY_IN_GRACE or attempt == DRAIN_ATTEMPTS:
                    raise
                continue  # sent too late to be sure it was inside the grace
        finally:
            sock.close()
            holder.close()
        assert srv.wait(10) == 0
        return


def test_a_request_on_a_kept_alive_connection_during_the_drain_is_answered(start_server):
    """A proxy's pooled connection that sends a publish as the node starts draining
    gets its answer (and Connection: close), not a reset a proxy could not retry."""

    def check(answer: bytes) -> None:
        head = answer.split(b"\r\n\r\n", 1)[0].lower()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b"connection: close" in head, answer

    answer_during_the_drain(
        start_server, b"POST /api/publish/drain HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", check
    )


@pytest.mark.parametrize("path", ["/sse/drain", "/poll/drain?timeout=5", "/ws/drain"])
def test_a_new_subscriber_during_the_drain_gets_503(start_server, path):
    upgrade = ("Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n") if path.startswith("/ws/") else ""

    def check(answer: bytes) -> None:
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"draining" in answer, answer

    answer_during_the_drain(start_server, f"GET {path} HTTP/1.1\r\nHost: x\r\n{upgrade}\r\n".encode(), check)


def test_an_idle_kept_alive_connection_is_closed_after_the_grace(start_server):
    """An idle pooled connection does not hold the drain up to --drain-timeout."""
    # A drain timeout far beyond the waits below: the server closing the connection
    # and exiting within them is the grace at work, not the timeout.
    srv = start_server("--drain-timeout", "120s")
    sock = kept_alive(srv.port)
    try:
        srv.signal(signal.SIGTERM)
        assert read_http_answer(sock, timeout=60) == b"", "the idle connection was not closed"
        assert srv.wait(60) == 0, "the idle connection held the drain (timeout 120s)"
    finally:
        sock.close()
