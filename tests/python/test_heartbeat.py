"""Server pings (--ping-interval) and idle disconnects (--idle-timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from rawws import OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, Closed, ws_connect as raw_connect
from wsutil import PingCountingConnection, run, ws_connect

FLAGS = ("--ping-interval", "500ms", "--idle-timeout", "1500ms")
# How long to wait for what should come in a second or two, on a slow shared
# machine: the waits end as soon as it comes, the checks are on what came.
PATIENCE = 30.0


def test_client_that_never_answers_pings_is_closed_idle(start_server):
    srv = start_server(*FLAGS)
    c = raw_connect(srv.port)
    try:
        t0 = time.monotonic()
        pings = 0
        close = None
        while True:
            try:
                fin, rsv, op, payload = c.read_frame(timeout=max(0.01, t0 + PATIENCE - time.monotonic()))
            except Closed:
                break  # TCP closed
            except TimeoutError:
                raise AssertionError(f"still open after {PATIENCE}s (pings seen: {pings}); idle timeout is 1.5s")
            if op == OP_PING:
                pings += 1  # deliberately not answered
                assert fin and len(payload) <= 125
            elif op == OP_CLOSE:
                close = payload
                # The server should drop the TCP connection after its close frame.
                try:
                    c.wait_closed(timeout=PATIENCE)
                except TimeoutError:
                    raise AssertionError(f"server sent close but kept TCP open for {PATIENCE}s")
                break
            else:
                raise AssertionError(f"unexpected frame opcode {op:#x}")
        elapsed = time.monotonic() - t0
        assert pings >= 1, "server never sent a ping frame (opcode 0x9)"
        # Not before the idle timeout; how long after it is the machine's business,
        # the reason in the close frame says it was the idle timeout.
        assert elapsed >= 1.0, f"closed after {elapsed:.2f}s, idle timeout is 1.5s"
        assert close is not None, "TCP closed without a close frame"
        code = int.from_bytes(close[:2], "big")
        assert code == 1001, f"expected close 1001, got {code} {close[2:]!r}"
        assert b"idle timeout" in close[2:].lower(), close
    finally:
        c.close()


def test_raw_client_sees_regular_pings(start_server):
    # The idle timeout far above the wait: the client never answers, and only
    # pings may come meanwhile.
    srv = start_server("--ping-interval", "300ms", "--idle-timeout", "600s")
    c = raw_connect(srv.port)
    try:
        t0 = time.monotonic()
        pings = 0
        # Not one ping but a ping again and again, with nothing from the client.
        while pings < 3:
            try:
                fin, rsv, op, payload = c.read_frame(timeout=max(0.01, t0 + PATIENCE - time.monotonic()))
            except TimeoutError:
                raise AssertionError(f"only {pings} pings in {PATIENCE}s with --ping-interval 300ms")
            assert op == OP_PING, f"unexpected opcode {op:#x}"
            assert fin and len(payload) <= 125
            pings += 1
    finally:
        c.close()


def test_client_answering_pings_stays_open(start_server):
    srv = start_server(*FLAGS)

    async def main():
        async with ws_connect(srv.url(), create_connection=PingCountingConnection) as ws:
            # Stay passive (no data frames) for well past the idle timeout (three
            # times it), and until the server has pinged a few times: only the
            # pongs keep the connection open.
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4.5 or ws.pings_received < 3:
                if time.monotonic() - t0 > PATIENCE:
                    raise AssertionError(f"only {ws.pings_received} server pings in {PATIENCE}s at 500ms")
                try:
                    msg = await asyncio.wait_for(ws.recv(), 0.5)
                    raise AssertionError(f"unexpected message {msg!r}")
                except asyncio.TimeoutError:
                    pass
            await ws.send("still here")
            assert await asyncio.wait_for(ws.recv(), PATIENCE) == "still here"

    run(main(), timeout=2 * PATIENCE)


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


def _pause(pid: int) -> None:
    """SIGSTOP, and wait until every thread of the server has stopped: from then
    on it writes nothing."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + PATIENCE
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue
        if states and all(st in ("T", "t") for st in states):
            return
        assert time.monotonic() < deadline, f"server threads not stopped: {states}"
        time.sleep(0.01)


def _read_pings(by_fd: dict, counts: dict[int, int], wait: float, answer: bool = False) -> bool:
    """Reads the pings waiting now (or within `wait`), counted per connection,
    and pongs them if `answer`."""
    import select

    ready, _, _ = select.select(list(by_fd), [], [], wait)
    for fd in ready:
        data = by_fd[fd].sock.recv(65536)
        assert data, "the server closed a connection"
        # Each ping is a 2-byte header and a payload under 126 bytes.
        buf = data
        while len(buf) >= 2:
            assert buf[0] & 0x0F != OP_CLOSE, f"the server closed a connection: {buf[2:]!r}"
            assert buf[0] & 0x0F == OP_PING, f"unexpected frame {buf[:2]!r}"
            size = buf[1] & 0x7F
            counts[fd] = counts.get(fd, 0) + 1
            if answer:
                by_fd[fd].send_frame(OP_PONG, buf[2 : 2 + size])
            buf = buf[2 + size :]
    return bool(ready)


@contextlib.contextmanager
def _stalling(pid: int, conns: list):
    """Gives the connections by socket descriptor, non-blocking for
    `_read_pings`; whatever the test did to the server with SIGSTOP, it is
    resumed after, and the connections closed."""
    try:
        for c in conns:
            c.sock.setblocking(False)
        yield {c.sock.fileno(): c for c in conns}
    finally:
        os.kill(pid, signal.SIGCONT)
        for c in conns:
            c.close()


def _drain(by_fd: dict, counts: dict[int, int], answer: bool = False) -> None:
    """The server is paused: read everything it wrote."""
    while _read_pings(by_fd, counts, 0.2, answer=answer):
        pass


def _until_all_pinged(by_fd: dict, counts: dict[int, int], since: float, at_least: float = 0.0) -> None:
    """Reads and answers pings until every connection has one in `counts` and
    `at_least` seconds have passed since `since`."""
    while time.monotonic() - since < at_least or len(counts) < len(by_fd):
        assert time.monotonic() - since < PATIENCE, f"{len(counts)} of {len(by_fd)} pinged in {PATIENCE}s"
        _read_pings(by_fd, counts, 0.05, answer=True)


def test_pings_keep_their_spread_after_a_stalled_loop(start_server):
    """A loop that stalls (a huge fan-out on a loaded box, a paused process) owes
    every connection a ping when it wakes. It skips those (once: a client that
    pongs misses one beat), rather than sending them all at once on a machine
    that is busy already, and the pings after go back to each connection's own
    phase: they must not all fall due together one interval later, or every later
    ping round is a storm that lands on whatever else the server is doing (at a
    million, the next broadcast).

    The server is paused (SIGSTOP) until every connection's ping is over a second
    late, let run for less than an interval, and paused again; only then are its
    pings counted. Kept in phase, most connections get their next ping in that
    time; bunched, none can (theirs fall due a whole interval after the resume).
    Skipped, none gets two (the owed one and the next); sent, most would. What the
    server wrote while it ran is decided by its own clock, however late this
    process reads it."""
    import pytest

    interval = 2.0
    srv = start_server("--ping-interval", "2s", "--idle-timeout", "600s", "--threads", "1")
    conns = [raw_connect(srv.port) for _ in range(300)]
    want = len(conns) // 4
    with _stalling(srv.pid, conns) as by_fd:
        time.sleep(interval + 0.5)  # every connection has had its first ping
        counts: dict[int, int] = {}
        for _attempt in range(3):
            _pause(srv.pid)
            _drain(by_fd, {})
            # Every connection's next ping falls due, and is over a second late
            # at the resume.
            time.sleep(interval + 1.5)
            counts = {}
            resumed = time.monotonic()
            os.kill(srv.pid, signal.SIGCONT)
            try:
                while time.monotonic() - resumed < interval - 0.5:
                    _read_pings(by_fd, counts, 0.05)
            finally:
                _pause(srv.pid)
            ran = time.monotonic() - resumed
            _drain(by_fd, counts)
            os.kill(srv.pid, signal.SIGCONT)
            # Bunched pings fall due an interval after the resume, and so would
            # a connection's second ping after the skip: conclusive if the
            # server was paused again before then.
            if ran < interval - 0.1:
                break
        else:
            pytest.skip(f"could not pause the server again within {interval - 0.1}s of resuming it, 3 tries")
        assert len(counts) >= want, (
            f"{len(counts)} of {len(conns)} connections got their next ping within "
            f"{ran:.2f}s of the resume (interval {interval}s): the pings bunched one interval after it"
        )
        twice = [n for n in counts.values() if n >= 2]
        assert not twice, (
            f"{len(twice)} connections got two pings within {ran:.2f}s of the resume: "
            "the pings the stall owed were sent, not skipped"
        )


def test_pings_a_second_stall_owes_are_put_off_not_sent_at_once(start_server):
    """A ping is skipped at most once in a row. After two stalls back to back,
    the pings the second one owes must be sent, and they are put off by as long
    as they were late (an interval at most): they go out at the pace they came
    due, not all at the resume, where they would land on a machine still busy
    with other loops' broadcasts. Nobody is closed meanwhile."""
    interval = 2.0
    srv = start_server("--ping-interval", "2s", "--idle-timeout", "600s", "--threads", "1")
    conns = [raw_connect(srv.port) for _ in range(200)]
    with _stalling(srv.pid, conns) as by_fd:
        time.sleep(interval + 0.5)  # every connection has had its first ping
        # First stall: every ping owed is over a second late, and skipped.
        _pause(srv.pid)
        _drain(by_fd, {}, answer=True)
        time.sleep(interval + 1.5)
        os.kill(srv.pid, signal.SIGCONT)
        time.sleep(0.1)
        # Second stall, right after: the next pings are owed again, late, and
        # may not be skipped twice.
        _pause(srv.pid)
        _drain(by_fd, {}, answer=True)
        time.sleep(interval + 1.5)
        counts: dict[int, int] = {}
        resumed = time.monotonic()
        os.kill(srv.pid, signal.SIGCONT)
        while time.monotonic() - resumed < 0.8:
            _read_pings(by_fd, counts, 0.05, answer=True)
        at_once = len(counts)
        _until_all_pinged(by_fd, counts, resumed)
        # The few on time after the first resume were not skipped, so may be
        # skipped now; the rest were put off by a second and a half or more.
        assert at_once <= len(conns) // 5, (
            f"{at_once} of {len(conns)} connections were pinged within 0.8 s of the resume: "
            "the pings the second stall owed went out at once"
        )


def test_a_client_whose_ping_a_stall_skipped_is_not_closed_as_silent(start_server):
    """Paused past its idle timeout, the server finds every client silent too
    long, but it never asked them: their pings were owed, and are skipped. Each
    must get its next ping and an interval to answer it, not be closed."""
    interval = 2.0
    srv = start_server("--ping-interval", "2s", "--idle-timeout", "3s", "--threads", "1")
    conns = [raw_connect(srv.port) for _ in range(20)]
    with _stalling(srv.pid, conns) as by_fd:
        counts: dict[int, int] = {}
        _until_all_pinged(by_fd, counts, time.monotonic())
        _pause(srv.pid)
        _drain(by_fd, counts, answer=True)
        time.sleep(interval + 1.5)  # silent past the idle timeout; pings owed
        os.kill(srv.pid, signal.SIGCONT)
        # Two intervals, answering every ping: nobody is closed (a closed
        # connection reads as empty and fails _read_pings), and everyone is
        # pinged again.
        counts = {}
        _until_all_pinged(by_fd, counts, time.monotonic(), at_least=2 * interval)


def test_a_subscriber_sent_messages_is_pinged_every_other_interval(start_server):
    """A message is the keep-alive a ping is: a subscriber a fan-out wrote to
    since its last ping skips the next one, but never two in a row: the one after
    a skip goes half an interval late (after messages), so it is still asked for a
    pong every two and a half intervals. A quiet subscriber on the same server
    gets every ping."""
    import select
    import threading

    from rawws import publish_ok

    srv = start_server("--ping-interval", "500ms", "--idle-timeout", "600s", "--threads", "1")
    busy = raw_connect(srv.port, path="/ws/busy")
    quiet = raw_connect(srv.port, path="/ws/quiet")
    pings = {"busy": 0, "quiet": 0}
    messages = 0
    stop = threading.Event()

    def publisher() -> None:
        while not stop.is_set():
            publish_ok(srv.port, "busy", "tick")
            stop.wait(0.1)

    thread = threading.Thread(target=publisher, daemon=True)
    try:
        named = {busy.sock.fileno(): ("busy", busy), quiet.sock.fileno(): ("quiet", quiet)}
        pending = {fd: b"" for fd in named}
        for _, c in named.values():
            c.sock.setblocking(False)
        thread.start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 6.0:
            ready, _, _ = select.select(list(named), [], [], 0.05)
            for fd in ready:
                name, c = named[fd]
                data = c.sock.recv(65536)
                assert data, f"the server closed the {name} connection"
                buf = pending[fd] + data
                # Pings and the short messages here have 7-bit lengths.
                while len(buf) >= 2 and len(buf) >= 2 + (buf[1] & 0x7F):
                    op, size = buf[0] & 0x0F, buf[1] & 0x7F
                    if op == OP_PING:
                        pings[name] += 1
                        c.send_frame(OP_PONG, buf[2 : 2 + size])
                    else:
                        assert (name, op) == ("busy", OP_TEXT), (name, buf[:2])
                        messages += 1
                    buf = buf[2 + size :]
                pending[fd] = buf
    finally:
        stop.set()
        thread.join(PATIENCE)
        busy.close()
        quiet.close()
    assert messages >= 20, f"only {messages} messages delivered in 6 s"
    # Twelve intervals: the quiet one is pinged about 12 times, the busy one
    # about 5 (each sent ping follows a skipped one, half an interval late),
    # and never not at all.
    assert pings["quiet"] >= 8, pings
    assert 3 <= pings["busy"] <= pings["quiet"] * 3 // 4, pings
