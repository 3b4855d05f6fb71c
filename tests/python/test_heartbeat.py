"""Server pings (--ping-interval) and idle disconnects (--idle-timeout)."""

from __future__ import annotations

import asyncio
import os
import time

from rawws import OP_CLOSE, OP_PING, OP_TEXT, Closed, ws_connect as raw_connect
from wsutil import PingCountingConnection, run, ws_connect

FLAGS = ("--ping-interval", "500ms", "--idle-timeout", "1500ms")


def test_client_that_never_answers_pings_is_closed_idle(start_server):
    srv = start_server(*FLAGS)
    c = raw_connect(srv.port)
    try:
        t0 = time.monotonic()
        pings = 0
        close = None
        while True:
            try:
                fin, rsv, op, payload = c.read_frame(timeout=max(0.01, t0 + 8 - time.monotonic()))
            except Closed:
                break  # TCP closed
            except TimeoutError:
                raise AssertionError(f"still open after 8s (pings seen: {pings}); idle timeout is 1.5s")
            if op == OP_PING:
                pings += 1  # deliberately not answered
                assert fin and len(payload) <= 125
            elif op == OP_CLOSE:
                close = payload
                # The server should drop the TCP connection after its close frame.
                try:
                    c.wait_closed(timeout=5)
                except TimeoutError:
                    raise AssertionError("server sent close but kept TCP open for 5s")
                break
            else:
                raise AssertionError(f"unexpected frame opcode {op:#x}")
        elapsed = time.monotonic() - t0
        assert pings >= 1, "server never sent a ping frame (opcode 0x9)"
        assert 1.0 <= elapsed <= 6.0, f"closed after {elapsed:.2f}s, idle timeout is 1.5s"
        assert close is not None, "TCP closed without a close frame"
        code = int.from_bytes(close[:2], "big")
        assert code == 1001, f"expected close 1001, got {code} {close[2:]!r}"
        assert b"idle timeout" in close[2:].lower(), close
    finally:
        c.close()


def test_raw_client_sees_regular_pings(start_server):
    srv = start_server("--ping-interval", "300ms", "--idle-timeout", "10s")
    c = raw_connect(srv.port)
    try:
        t0 = time.monotonic()
        pings = 0
        while time.monotonic() - t0 < 2.0:
            try:
                fin, rsv, op, payload = c.read_frame(timeout=max(0.01, t0 + 2.0 - time.monotonic()))
            except TimeoutError:
                break
            assert op == OP_PING, f"unexpected opcode {op:#x}"
            pings += 1
        # 300ms interval over 2s: ~6 pings; be generous.
        assert pings >= 3, f"only {pings} pings in 2s with --ping-interval 300ms"
    finally:
        c.close()


def test_client_answering_pings_stays_open(start_server):
    srv = start_server(*FLAGS)

    async def main():
        async with ws_connect(srv.url(), create_connection=PingCountingConnection) as ws:
            # Stay passive (no data frames) for well past the idle timeout.
            try:
                msg = await asyncio.wait_for(ws.recv(), 4.5)
                raise AssertionError(f"unexpected message {msg!r}")
            except asyncio.TimeoutError:
                pass
            assert ws.pings_received >= 3, f"only {ws.pings_received} server pings in 4.5s at 500ms"
            await ws.send("still here")
            assert await asyncio.wait_for(ws.recv(), 5) == "still here"

    run(main())


def test_data_frames_alone_keep_connection_alive(start_server):
    """Any client frame counts as activity: a raw client that ignores pings but
    keeps sending data is not dropped."""
    srv = start_server(*FLAGS)
    c = raw_connect(srv.port)
    try:
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < 3.5:
            c.send_frame(OP_TEXT, f"beat{i}".encode())
            op, data = c.read_message(timeout=3, answer_pings=False)
            assert (op, data) == (OP_TEXT, f"beat{i}".encode()), (op, data)
            i += 1
            time.sleep(0.4)
    finally:
        c.close()


def test_pings_keep_their_spread_after_a_stalled_loop(start_server):
    """A loop that stalls (a huge fan-out on a loaded box, a paused process) sends
    every ping that came due at once when it wakes; the pings after that must go
    back to each connection's own phase, not all fall due together one interval
    later, or every later ping round is a storm that lands on whatever else the
    server is doing (at a million, the next broadcast)."""
    import select
    import signal

    interval = 2.0
    srv = start_server("--ping-interval", "2s", "--idle-timeout", "60s", "--threads", "1")
    conns = [raw_connect(srv.port) for _ in range(300)]
    try:
        for c in conns:
            c.sock.setblocking(False)
        by_fd = {c.sock.fileno(): c for c in conns}
        arrivals: list[tuple[float, int]] = []

        def read_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                ready, _, _ = select.select(list(by_fd), [], [], left)
                now = time.monotonic()
                for fd in ready:
                    data = by_fd[fd].sock.recv(65536)
                    assert data, "the server closed a connection"
                    # Each ping is a 2-byte header and a payload under 126 bytes.
                    buf = data
                    while len(buf) >= 2:
                        assert buf[0] & 0x0F == OP_PING, f"unexpected frame {buf[:2]!r}"
                        arrivals.append((now, fd))
                        buf = buf[2 + (buf[1] & 0x7F) :]

        read_for(interval + 0.5)  # every connection's first ping has come
        os.kill(srv.pid, signal.SIGSTOP)
        try:
            time.sleep(interval + 0.5)  # every connection's next ping falls due
        finally:
            os.kill(srv.pid, signal.SIGCONT)
        resumed = time.monotonic()
        arrivals.clear()
        read_for(interval + 1.0)
        # The overdue pings come in the first moments after the resume. The next
        # round follows each connection's phase, spread over the interval: most
        # connections are pinged again well before a whole interval has passed.
        early = {fd for t, fd in arrivals if 0.4 <= t - resumed <= 1.6}
        assert len(early) >= len(conns) // 4, (
            f"{len(early)} of {len(conns)} connections pinged 0.4-1.6 s after the "
            f"resume: the pings bunched one interval after it"
        )
    finally:
        for c in conns:
            c.close()
