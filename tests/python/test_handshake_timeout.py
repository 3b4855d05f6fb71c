"""--handshake-timeout: connections that never finish the upgrade request are dropped."""

from __future__ import annotations

import time

from rawws import OP_TEXT, RawConn, ws_connect


def _assert_dropped_without_response(c, started, limit=6.0):
    try:
        data = c.wait_closed(timeout=limit)
    except TimeoutError:
        raise AssertionError(f"connection still open {limit}s after connecting (handshake timeout 1s)")
    elapsed = time.monotonic() - started
    assert data == b"", f"expected no response, got {data!r}"
    assert elapsed >= 0.5, f"closed too early ({elapsed:.2f}s) for a 1s handshake timeout"
    return elapsed


def test_partial_request_is_closed_after_handshake_timeout(start_server):
    srv = start_server("--handshake-timeout", "1s")
    with RawConn(srv.port) as c:
        t0 = time.monotonic()
        c.send(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
        _assert_dropped_without_response(c, t0)


def test_silent_connection_is_closed_after_handshake_timeout(start_server):
    srv = start_server("--handshake-timeout", "1s")
    with RawConn(srv.port) as c:
        t0 = time.monotonic()
        _assert_dropped_without_response(c, t0)


def test_slowloris_trickle_is_still_closed(start_server):
    """Sending a byte now and then must not extend the handshake deadline."""
    srv = start_server("--handshake-timeout", "1s")
    with RawConn(srv.port) as c:
        t0 = time.monotonic()
        req = b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
        closed = False
        for b in req:
            try:
                c.send(bytes([b]))
            except OSError:
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - t0 > 6:
                break
        if not closed:
            _assert_dropped_without_response(c, t0, limit=max(0.5, 6.0 - (time.monotonic() - t0)))
        assert time.monotonic() - t0 < 6.5


def test_completed_handshake_is_not_affected_by_handshake_timeout(start_server):
    srv = start_server("--handshake-timeout", "1s", "--idle-timeout", "30s")
    c = ws_connect(srv.port)
    try:
        time.sleep(2.0)
        c.send_frame(OP_TEXT, b"after 2s")
        assert c.read_message(timeout=5) == (OP_TEXT, b"after 2s")
    finally:
        c.close()
