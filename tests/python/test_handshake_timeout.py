"""--handshake-timeout: connections that never finish the upgrade request are dropped."""

from __future__ import annotations

import select
import time

from rawws import OP_TEXT, RawConn, metric, settled, ws_connect

# The handshake timeout under test, and every other limit far above it, so that
# only the handshake timeout can end these connections.
FLAGS = ("--handshake-timeout", "1s", "--idle-timeout", "600s")
# How long to wait for the close on a slow, shared machine: generous, since the
# close itself (with no response, and counted as a timeout) is what is checked.
PATIENCE = 30.0
TIMEOUTS = 'throng_handshake_failures_total{reason="timeout"}'


def handshake_timeouts(port: int) -> float:
    return metric(port, TIMEOUTS)


def _assert_dropped_without_response(c, started):
    try:
        data = c.wait_closed(timeout=PATIENCE)
    except TimeoutError:
        raise AssertionError(f"connection still open {PATIENCE}s after connecting (handshake timeout 1s)")
    elapsed = time.monotonic() - started
    assert data == b"", f"expected no response, got {data!r}"
    assert elapsed >= 0.5, f"closed too early ({elapsed:.2f}s) for a 1s handshake timeout"


def _assert_counted_as_timeout(port: int, n: int = 1):
    """A request begun and not finished is counted as a handshake timeout (the
    count is published at the end of a loop turn, so it may lag the close)."""
    got = settled(lambda: handshake_timeouts(port), lambda v: v == n, timeout=PATIENCE)
    assert got == n, f"{TIMEOUTS} is {got}, expected {n}"


def test_partial_request_is_closed_after_handshake_timeout(start_server):
    srv = start_server(*FLAGS)
    with RawConn(srv.port) as c:
        t0 = time.monotonic()
        c.send(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
        _assert_dropped_without_response(c, t0)
    _assert_counted_as_timeout(srv.port)


def test_silent_connection_is_closed_after_handshake_timeout(start_server):
    srv = start_server(*FLAGS)
    with RawConn(srv.port) as c:
        t0 = time.monotonic()
        _assert_dropped_without_response(c, t0)


def test_slowloris_trickle_is_still_closed(start_server):
    """Sending a byte now and then must not extend the handshake deadline: the
    server closes the connection while the bytes are still coming, a byte every
    0.1 s (well inside the 1 s timeout), the request never finished."""
    srv = start_server(*FLAGS)
    with RawConn(srv.port) as c:
        t0 = time.monotonic()
        c.send(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        sent = 0
        closed = False
        while not closed and time.monotonic() - t0 < PATIENCE:
            try:
                c.send(b"a")
                sent += 1
            except OSError:
                closed = True
                break
            # Readable means the server closed (or answered, checked below).
            closed = bool(select.select([c.sock], [], [], 0.1)[0])
        assert closed, (
            f"still open after trickling {sent} header bytes for {PATIENCE}s, a byte every "
            "0.1 s: each byte extends the 1s handshake deadline"
        )
        _assert_dropped_without_response(c, t0)
    _assert_counted_as_timeout(srv.port)


def test_completed_handshake_is_not_affected_by_handshake_timeout(start_server):
    srv = start_server("--handshake-timeout", "1s", "--idle-timeout", "30s")
    c = ws_connect(srv.port)
    try:
        time.sleep(2.0)
        c.send_frame(OP_TEXT, b"after 2s")
        assert c.read_message(timeout=5) == (OP_TEXT, b"after 2s")
    finally:
        c.close()
