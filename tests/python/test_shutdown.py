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
    srv = start_server("--drain-timeout", "5s")

    async def main():
        clients = [await ws_connect(srv.url()) for _ in range(6)]
        for i, ws in enumerate(clients):
            await ws.send(f"hello {i}")
            assert await ws.recv() == f"hello {i}"
        t0 = time.monotonic()
        srv.signal(sig)
        excs = await asyncio.gather(*(expect_closed(ws, timeout=8) for ws in clients))
        codes = [received_close_code(e) for e in excs]
        assert codes == [1001] * len(clients), f"close codes seen by clients: {codes}"
        rc = await asyncio.get_running_loop().run_in_executor(None, srv.wait, 10)
        elapsed = time.monotonic() - t0
        assert rc is not None, "server did not exit within 10s of the signal (drain timeout 5s)"
        assert rc == 0, f"exit code {rc}"
        assert elapsed < 8, f"exit took {elapsed:.1f}s with --drain-timeout 5s"

    run(main())


def test_shutdown_with_no_clients_exits_0_quickly(start_server):
    srv = start_server("--drain-timeout", "5s")
    t0 = time.monotonic()
    srv.signal(signal.SIGTERM)
    rc = srv.wait(8)
    assert rc == 0, f"exit code {rc} (None = still running after 8s)"
    assert time.monotonic() - t0 < 4, "idle server should not wait for the drain timeout"


def test_unresponsive_client_does_not_block_exit_past_drain_timeout(start_server):
    """A client that never reads nor answers the close cannot hold the server
    beyond --drain-timeout."""
    srv = start_server("--drain-timeout", "2s")
    c = raw_connect(srv.port, rcvbuf=4096)
    try:
        c.send_frame(OP_TEXT, b"x")  # make it a real, active connection; never read again
        time.sleep(0.2)
        t0 = time.monotonic()
        srv.signal(signal.SIGTERM)
        rc = srv.wait(10)
        elapsed = time.monotonic() - t0
        assert rc is not None, "server still running 10s after SIGTERM with --drain-timeout 2s"
        assert rc == 0, f"exit code {rc}"
        assert elapsed < 6, f"exit took {elapsed:.1f}s with --drain-timeout 2s"
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
