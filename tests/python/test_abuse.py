"""Abuse and faults: what hostile or broken clients do to the server, and that it
shrugs them off. Slowloris (thousands of half-sent upgrades), slow consumers of
64 KiB messages, ping floods, 1-byte fragments, maximum-size frames back to back,
garbage instead of HTTP, half-closed sockets, and connections opened and dropped
as fast as a client can.

Every test ends the same way (`assert_healthy_and_clean`): /healthz answers 200,
a fresh subscriber gets a published message, and the server's open connections
(/api/stats) and file descriptors (/proc/PID/fd) are back where they were before
the abuse. The big versions, with figures, are in bench/abuse.py."""

from __future__ import annotations

import os
import random
import selectors
import socket
import struct
import threading
import time

import pytest

from conftest import can_bind, vm_rss_kb
from rawws import (
    OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, Closed, RawConn, encode_frame,
    http_request, metric, parse_close, publish_ok, upgrade_request, wait_subscribers,
)
from rawws import ws_connect as raw_connect
from support.wait import wait_until

# Runs alone: it measures the server's resident memory and floods it.
pytestmark = pytest.mark.serial

# Client source addresses for tests that open thousands of sockets (loopback /8).
SOURCES = [f"127.0.0.{i}" for i in range(2, 255)]


needs_sources = pytest.mark.skipif(not can_bind("127.0.0.2"), reason="127.0.0.2 not usable as a source address")


def source_socket(i: int, timeout: float = 5.0) -> socket.socket:
    """A TCP socket bound to the i-th source address (round robin over SOURCES)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((SOURCES[i % len(SOURCES)], 0))
    s.settimeout(timeout)
    return s


# ---------------------------------------------------------------- looking at the server


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def stats(port: int) -> dict:
    resp = http_request(port, "GET", "/api/stats")
    assert resp.status == 200, resp
    return resp.json()


def subscribers_now(port: int, channel: str) -> int:
    """The channel's subscriber count now (wait_subscribers waits for one)."""
    resp = http_request(port, "GET", f"/api/channels/{channel}")
    assert resp.status == 200, resp
    return resp.json()["subscribers"]


TIMEOUTS = 'throng_handshake_failures_total{reason="timeout"}'
BAD_REQUESTS = 'throng_handshake_failures_total{reason="bad_request"}'
SLOW_CONSUMERS = "throng_slow_consumer_disconnects_total"


class Baseline:
    def __init__(self, connections: dict, fds: int):
        self.connections = connections
        self.fds = fds


_round_trips = iter(range(1, 1 << 30))


def round_trip(port: int) -> None:
    """A normal client: subscribes over WebSocket, a message is published, it gets it."""
    n = next(_round_trips)
    channel = f"health-{n}"
    c = raw_connect(port, path=f"/ws/{channel}", timeout=10)
    try:
        wait_subscribers(port, channel, 1)
        body = f"still serving {n}"
        publish_ok(port, channel, body)
        assert c.read_message(timeout=10) == (OP_TEXT, body.encode()), "the normal subscriber got something else"
    finally:
        c.close()


def baseline(srv) -> Baseline:
    """After one warm-up round trip: the open connections and the fewest fds the
    server holds (the probes' sockets may take a moment to go)."""
    assert http_request(srv.port, "GET", "/healthz").status == 200
    round_trip(srv.port)
    wait_until(lambda: sum(stats(srv.port)["connections"].values()) == 0, 10, "warm-up connection still open")
    fds = fd_count(srv.pid)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        fds = min(fds, fd_count(srv.pid))
        time.sleep(0.05)
    return Baseline(stats(srv.port)["connections"], fds)


def assert_healthy_and_clean(srv, before: Baseline) -> None:
    """Alive, /healthz 200, a subscribe + publish round trip, and nothing left
    behind: connections by transport and the fd count back to the baseline."""
    assert srv.proc.poll() is None, f"the server exited with {srv.proc.returncode}"
    resp = http_request(srv.port, "GET", "/healthz")
    assert (resp.status, resp.body) == (200, b"ok"), resp
    round_trip(srv.port)
    wait_until(
        lambda: stats(srv.port)["connections"] == before.connections,
        10,
        lambda: f"open connections {stats(srv.port)['connections']}, before the abuse {before.connections}",
    )
    wait_until(
        lambda: fd_count(srv.pid) <= before.fds,
        10,
        lambda: f"server holds {fd_count(srv.pid)} fds, {before.fds} before the abuse: a leak",
    )


# ---------------------------------------------------------------- 1. slowloris

SLOWLORIS = 2000
SILENT = 50


def half_upgrade(path: str) -> bytes:
    """The first half of a WebSocket upgrade: request line, Host, Upgrade,
    Connection; no key, no version, no blank line."""
    req, _ = upgrade_request(path=path)
    return req[: req.index(b"Sec-WebSocket-Key")]


@needs_sources
def test_slowloris_does_not_stop_a_normal_client_and_is_dropped_at_the_handshake_timeout(start_server):
    # Opening 2,050 sockets and serving the normal client must fit before the first
    # stalled one times out, with room for a busy machine.
    timeout = 6.0
    srv = start_server("--handshake-timeout", f"{timeout:g}s")
    before = baseline(srv)
    timeouts0 = metric(srv.port, TIMEOUTS)
    half = half_upgrade("/ws/lobby")
    socks: list[tuple[socket.socket, float]] = []
    silent: list[socket.socket] = []
    try:
        for i in range(SLOWLORIS):
            s = source_socket(i)
            s.connect(("127.0.0.1", srv.port))
            s.sendall(half)
            socks.append((s, time.monotonic()))
        # A few that send nothing at all: dropped too, but not counted as a
        # timed-out request (README: only a request begun and not finished is).
        for i in range(SILENT):
            s = source_socket(SLOWLORIS + i)
            s.connect(("127.0.0.1", srv.port))
            silent.append(s)
        opened = SLOWLORIS + SILENT
        wait_until(
            lambda: fd_count(srv.pid) >= before.fds + opened,
            timeout / 2,
            lambda: f"the server holds {fd_count(srv.pid) - before.fds} of the {opened} stalled sockets",
        )

        # A normal client connects, subscribes and gets a published message while
        # every stalled socket is still held: it did not wait for them to go.
        round_trip(srv.port)
        sel = selectors.DefaultSelector()
        for s, t in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, t)
        early = sel.select(0)
        assert not early, (
            f"{len(early)} stalled sockets were already closed when the normal client was served: "
            f"it was served only after the slowloris went away (or they went too early)"
        )
        assert fd_count(srv.pid) >= before.fds + opened

        # Each one is closed at --handshake-timeout, with no answer at all.
        closed_after: list[float] = []
        answers: list[bytes] = []
        deadline = time.monotonic() + timeout + 10
        while len(closed_after) < SLOWLORIS:
            assert time.monotonic() < deadline, (
                f"only {len(closed_after)} of {SLOWLORIS} stalled sockets closed "
                f"within {timeout + 10:g}s (handshake timeout {timeout:g}s)"
            )
            for key, _ in sel.select(1):
                try:
                    data = key.fileobj.recv(4096)
                except ConnectionResetError:
                    data = b""
                if data:
                    answers.append(data)
                closed_after.append(time.monotonic() - key.data)
                sel.unregister(key.fileobj)
        sel.close()
        assert not answers, f"stalled sockets got an answer instead of being dropped: {answers[:3]!r}"
        assert min(closed_after) >= timeout / 2, (
            f"a stalled socket was closed {min(closed_after):.2f}s after its request began, "
            f"before the {timeout:g}s handshake timeout"
        )
        for s in silent:
            s.settimeout(10)
            try:
                assert s.recv(4096) == b"", "a silent connection got an answer"
            except ConnectionResetError:
                pass
            except socket.timeout:
                raise AssertionError("a silent connection was still open 10s after the handshake timeout")
        # A loop publishes its counts at the end of the turn that closed them, a
        # moment after the clients saw it: wait for them all, then none too many.
        def timed_out() -> float:
            return metric(srv.port, TIMEOUTS) - timeouts0

        def why() -> str:
            return (f'throng_handshake_failures_total{{reason="timeout"}} went up by '
                    f"{timed_out():g}, want {SLOWLORIS} (the half requests, not the silent ones)")

        wait_until(lambda: timed_out() >= SLOWLORIS, 5, why)
        assert timed_out() == SLOWLORIS, why()
    finally:
        for s, _ in socks:
            s.close()
        for s in silent:
            s.close()
    assert_healthy_and_clean(srv, before)
    print(
        f"slowloris: {SLOWLORIS} half upgrades closed {min(closed_after):.2f}-{max(closed_after):.2f}s "
        f"after they began (--handshake-timeout {timeout:g}s)"
    )


# ---------------------------------------------------------------- 2. slow consumers

STALLED = 12
MAX_QUEUE = 128 * 1024
MSG_SIZE = 64 * 1024
HISTORY = 4
PUBLISH_INTERVAL = 0.1  # ~10 messages/s
AFTER_CUT = 10  # messages published once every stalled reader is gone


def kernel_send_buffer_max() -> int:
    """The most a TCP socket's send buffer grows to (on loopback it starts near it)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


def numbered(i: int, size: int = MSG_SIZE) -> str:
    head = f"{i:06d}|"
    return head + "x" * (size - len(head))


def drain_stalled(c: RawConn, results: list, index: int) -> None:
    """Reads a stalled reader's socket to its end: (messages in order, close code,
    reason, or the error that ended it)."""
    last, code, reason, error = 0, None, b"", None
    try:
        while True:
            _fin, _rsv, op, data = c.read_frame(timeout=10)
            if op == OP_CLOSE:
                code, reason = parse_close(data)
                break
            if op == OP_PING:
                continue
            n = int(data[:6])
            if n != last + 1:
                error = f"message {n} after {last}"
                break
            last = n
    except (Closed, TimeoutError, OSError) as e:
        error = repr(e)
    results[index] = (last, code, reason, error)


def test_slow_consumers_of_64kib_messages_are_cut_at_max_queue_and_memory_stays_bounded(start_server):
    srv = start_server("--max-queue", str(MAX_QUEUE), "--history-size", str(HISTORY))
    before = baseline(srv)
    channel = "firehose"
    slow0 = metric(srv.port, SLOW_CONSUMERS)
    # Tiny receive buffers, and they never read: the server's queues must grow.
    stalled = [raw_connect(srv.port, path=f"/ws/{channel}", rcvbuf=4096, timeout=10) for _ in range(STALLED)]
    reader = raw_connect(srv.port, path=f"/ws/{channel}", timeout=10)
    drained: list = [None] * STALLED
    drains: list[threading.Thread] = []
    got = {"last": 0, "error": None}

    def read_all():
        try:
            while True:
                op, data = reader.read_message(timeout=20)
                if op == "close":
                    got["error"] = f"normal reader closed: {data}"
                    return
                if data == b"end":
                    return
                n = int(data[:6])
                if n != got["last"] + 1 or data.decode() != numbered(n):
                    got["error"] = f"normal reader: message {n} after {got['last']}"
                    return
                got["last"] = n
        except Exception as e:  # reported below
            got["error"] = repr(e)

    try:
        wait_subscribers(srv.port, channel, STALLED + 1)
        rss0 = vm_rss_kb(srv.pid)
        # Generous: every stalled reader's whole queue plus the message that passed
        # it, the history, and 16 MiB for the allocator. The messages are shared
        # between subscribers, so the server should need far less.
        bound = rss0 + (STALLED * (MAX_QUEUE + MSG_SIZE) + HISTORY * MSG_SIZE) // 1024 + 16 * 1024
        # What the kernel buffers for a reader that never reads (its send buffer;
        # the receive buffer is 4 KiB), then --max-queue: it must be cut off well
        # before twice that has been published.
        cap = 2 * (kernel_send_buffer_max() + MAX_QUEUE + MSG_SIZE) // MSG_SIZE + AFTER_CUT
        rss = [rss0]
        reading = threading.Thread(target=read_all, daemon=True)
        reading.start()
        cut_at = None
        i = 0
        while cut_at is None or i < cut_at + AFTER_CUT:
            i += 1
            assert i <= cap, (
                f"stalled readers not cut off after {cap} x 64 KiB with --max-queue {MAX_QUEUE}: "
                f"{subscribers_now(srv.port, channel)} subscribers left"
            )
            assert publish_ok(srv.port, channel, numbered(i)) == i
            rss.append(vm_rss_kb(srv.pid))
            if cut_at is None and subscribers_now(srv.port, channel) == 1:
                cut_at = i
                # Read what each got at once: a close that cannot be flushed within
                # the server's close timeout (5 s) is given up.
                for k, c in enumerate(stalled):
                    t = threading.Thread(target=drain_stalled, args=(c, drained, k), daemon=True)
                    t.start()
                    drains.append(t)
            time.sleep(PUBLISH_INTERVAL)
        publish_ok(srv.port, channel, "end")
        reading.join(20)
        for t in drains:
            t.join(20)
        rss.append(vm_rss_kb(srv.pid))

        assert got["error"] is None, got["error"]
        assert got["last"] == i, f"the normal reader got {got['last']} of {i} messages"
        assert max(rss) < bound, (
            f"server VmRSS peaked at {max(rss)} kB, bound {bound} kB ({rss0} kB + {STALLED} x "
            f"(--max-queue + one message) + history + 16 MiB); samples {rss}"
        )
        for k, result in enumerate(drained):
            assert result is not None, f"stalled reader {k}: still reading"
            last, code, reason, error = result
            assert (code, reason) == (1008, b"slow consumer"), (
                f"stalled reader {k}: got messages 1..{last} in order, then close {code} {reason!r} ({error})"
            )
            assert last < cut_at, f"stalled reader {k} got {last} messages: it was not cut off"
        assert metric(srv.port, SLOW_CONSUMERS) - slow0 == STALLED
    finally:
        for c in stalled:
            c.close()
        reader.close()
    assert_healthy_and_clean(srv, before)
    print(
        f"slow consumers: {STALLED} cut after message {cut_at} of {i}; normal reader got all {i}; "
        f"RSS {rss0} -> peak {max(rss)} kB (bound {bound} kB)"
    )


# ---------------------------------------------------------------- 3. floods

PINGS = 10_000


def test_ping_flood_in_one_write_gets_every_pong_in_order(start_server):
    srv = start_server()
    before = baseline(srv)
    c = raw_connect(srv.port, path="/echo", timeout=10)
    try:
        # Each ping carries its number and up to 121 more bytes (control frames: <= 125).
        payloads = [struct.pack("!I", i) + b"p" * (i % 122) for i in range(PINGS)]
        flood = b"".join(encode_frame(OP_PING, p) for p in payloads)
        # All the pongs together are less than --max-queue (1 MiB): however slowly
        # this client reads, it cannot be a slow consumer (see the next test).
        assert sum(2 + len(p) for p in payloads) < 1 << 20
        sender = threading.Thread(target=c.send, args=(flood,), daemon=True)
        sender.start()  # one write; read while it goes (the pongs outgrow the buffers)
        for i, want in enumerate(payloads):
            try:
                _fin, _rsv, op, data = c.read_frame(timeout=10)
            except (Closed, TimeoutError) as e:
                raise AssertionError(f"the flood ended after {i} of {PINGS} pongs: {e!r}")
            assert (op, data) == (OP_PONG, want), f"answer {i}: opcode {op} {data[:8]!r}, want pong {want[:8]!r}"
        sender.join(10)
        c.send_frame(OP_TEXT, b"after the flood")
        assert c.read_message(timeout=5) == (OP_TEXT, b"after the flood")
    finally:
        c.close()
    assert_healthy_and_clean(srv, before)


def test_ping_flood_from_a_client_that_reads_nothing_is_closed_as_a_slow_consumer(start_server):
    # The pongs are queued like any other output: a client that floods pings and
    # does not read them passes --max-queue and is closed 1008 "slow consumer".
    srv = start_server("--max-queue", "256KiB")
    before = baseline(srv)
    slow0 = metric(srv.port, SLOW_CONSUMERS)
    c = raw_connect(srv.port, path="/echo", rcvbuf=4096, timeout=10)
    try:
        ping = encode_frame(OP_PING, b"p" * 125, mask_key=b"abcd")
        chunk = ping * 8192  # 1 MiB of pings
        sent, stopped = 0, None
        c.sock.settimeout(3)
        try:
            while sent < 32 << 20:
                c.sock.sendall(chunk)
                sent += len(chunk)
        except OSError as e:
            stopped = e
        try:
            code, reason = c.expect_close(timeout=10)
        except (Closed, TimeoutError) as e:
            raise AssertionError(
                f"no close frame after a ping flood of {sent} bytes (send stopped by {stopped!r}), "
                f"{len(c.skipped)} frames read first: {e!r}"
            )
        assert (code, reason) == (1008, b"slow consumer"), (code, reason)
        assert {op for op, _ in c.skipped} <= {OP_PONG}, f"frames before the close: {set(c.skipped)}"
        assert len(c.skipped) < sent // len(ping), "every ping was answered: the client was never behind"
    finally:
        c.close()
    assert metric(srv.port, SLOW_CONSUMERS) - slow0 == 1
    assert_healthy_and_clean(srv, before)


def one_byte_fragments(message: bytes, opcode: int, ping_every: int = 0) -> bytes:
    """The message as len(message) frames of one byte (a ping between every
    ping_every fragments, which RFC 6455 allows)."""
    parts = []
    for i in range(len(message)):
        op = opcode if i == 0 else OP_CONT
        parts.append(encode_frame(op, message[i : i + 1], fin=i == len(message) - 1, mask_key=b"\x01\x02\x03\x04"))
        if ping_every and i % ping_every == ping_every - 1 and i != len(message) - 1:
            parts.append(encode_frame(OP_PING, struct.pack("!I", i)))
    return b"".join(parts)


def test_one_byte_fragments_of_a_max_size_message_are_reassembled(start_server):
    srv = start_server("--max-message-size", "64KiB")
    before = baseline(srv)
    c = raw_connect(srv.port, path="/echo", timeout=10)
    try:
        binary = random.Random(1).randbytes(64 * 1024)
        stream = one_byte_fragments(binary, OP_BINARY, ping_every=4096)
        threading.Thread(target=c.send, args=(stream,), daemon=True).start()
        pongs = 0
        while True:
            _fin, _rsv, op, data = c.read_frame(timeout=20)
            if op == OP_PONG:
                pongs += 1
                continue
            assert op == OP_BINARY, f"opcode {op}"
            assert data == binary, f"reassembled {len(data)} bytes, not the {len(binary)} sent"
            break
        assert pongs == 64 * 1024 // 4096 - 1, f"{pongs} pongs for the pings between the fragments"
        # Text: multi-byte UTF-8 characters are split between fragments.
        text = ("é€😀" * 7000).encode()  # 63,000 bytes
        c.send(one_byte_fragments(text, OP_TEXT))
        assert c.read_message(timeout=20) == (OP_TEXT, text)
    finally:
        c.close()
    assert_healthy_and_clean(srv, before)


def test_one_byte_fragments_past_max_message_size_get_1009(start_server):
    srv = start_server("--max-message-size", "64KiB")
    before = baseline(srv)
    c = raw_connect(srv.port, path="/echo", timeout=10)
    try:
        try:
            c.send(one_byte_fragments(b"f" * (64 * 1024 + 1), OP_BINARY))
        except OSError:
            pass  # the server may close before the last fragments
        code, reason = c.expect_close(timeout=10)
        assert code == 1009, f"expected 1009, got {code} {reason!r}"
        assert c.skipped == [], f"frames before the close: {c.skipped[:5]}"
    finally:
        c.close()
    assert_healthy_and_clean(srv, before)


MAX_FRAMES = 200


def test_max_size_frames_back_to_back_are_echoed_intact(start_server):
    # The server reads on while its answers wait (it does not push back by not
    # reading): a client that reads its echoes more slowly than it sends them is
    # a slow consumer once more than --max-queue waits for it (1008, as in
    # test_limits). So the queue here is bigger than all the echoes together, and
    # whatever this reader's pace, every frame must come back.
    srv = start_server("--max-message-size", "64KiB", "--max-queue", "16MiB")
    before = baseline(srv)
    rng = random.Random(2)
    blocks = [rng.randbytes(64 * 1024) for _ in range(4)]
    c = raw_connect(srv.port, path="/echo", timeout=10)
    try:
        stream = b"".join(encode_frame(OP_BINARY, blocks[i % 4]) for i in range(MAX_FRAMES))
        assert len(stream) < 16 << 20
        sender = threading.Thread(target=c.send, args=(stream,), daemon=True)
        sender.start()  # 12.5 MiB in one write, read while it goes
        for i in range(MAX_FRAMES):
            op, data = c.read_message(timeout=20)
            assert op == OP_BINARY and data == blocks[i % 4], f"echo {i}: opcode {op}, {len(data)} bytes, wrong data"
        sender.join(10)
        # The limit is still the limit.
        c.send_frame(OP_BINARY, b"z" * (64 * 1024 + 1))
        assert c.expect_close(timeout=10)[0] == 1009
    finally:
        c.close()
    assert_healthy_and_clean(srv, before)


def test_frame_headers_announcing_huge_lengths_are_refused_before_any_payload(start_server):
    srv = start_server()
    before = baseline(srv)
    rss0 = vm_rss_kb(srv.pid)
    cases = [
        (struct.pack("!BBQ", 0x82, 0xFF, (1 << 63) - 1), 1009),  # 8 EiB: too big
        (struct.pack("!BBQ", 0x82, 0xFF, 1 << 40), 1009),  # 1 TiB
        (struct.pack("!BBQ", 0x82, 0xFF, 1 << 63), 1002),  # the length's top bit must be 0
    ]
    for head, want in cases:
        c = raw_connect(srv.port, path="/echo", timeout=10)
        try:
            c.send(head + b"mask")
            code, reason = c.expect_close(timeout=5)
            assert code == want, f"header {head.hex()}: close {code} {reason!r}, want {want}"
        finally:
            c.close()
    assert vm_rss_kb(srv.pid) < rss0 + 16 * 1024, "the server allocated for an announced length"
    assert_healthy_and_clean(srv, before)


GARBAGE = [
    random.Random(3).randbytes(300),
    bytes.fromhex("160301020001000200030368") + random.Random(4).randbytes(200),  # a TLS ClientHello
    b"SSH-2.0-OpenSSH_9.6\r\n",
    b"\x00" * 100,
    b"hello world\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + bytes(range(256)) * 4 + b"\r\n\r\n",  # binary header bytes
    struct.pack("!BB", 0x81, 0x85) + b"mask" + b"hello",  # a WebSocket frame without a handshake
]


def test_garbage_instead_of_http_gets_400_and_close(start_server):
    srv = start_server()
    before = baseline(srv)
    bad0 = metric(srv.port, BAD_REQUESTS)
    for garbage in GARBAGE:
        with RawConn(srv.port, timeout=5) as c:
            c.send(garbage)
            resp = c.read_http_response(timeout=5)
            assert resp.status == 400, f"{garbage[:20]!r}...: {resp!r}"
            assert resp.json()["status"] == 400 and resp.json()["error"], resp
            assert (resp.header("connection") or "").lower() == "close", resp
            try:
                rest = c.read_to_eof(timeout=5)
            except TimeoutError:
                raise AssertionError(f"{garbage[:20]!r}...: still open after the 400")
            assert rest == b"", rest[:100]
    # A head that never ends: refused at 16 KiB, not buffered on.
    with RawConn(srv.port, timeout=5) as c:
        try:
            c.send(b"GET /" + b"A" * (64 * 1024))
        except OSError:
            pass
        resp = c.read_http_response(timeout=5)
        assert resp.status == 431, resp
    assert metric(srv.port, BAD_REQUESTS) - bad0 == len(GARBAGE) + 1
    assert_healthy_and_clean(srv, before)


@needs_sources
def test_many_garbage_connections_at_once_all_get_400(start_server):
    srv = start_server()
    before = baseline(srv)
    n = 500
    socks = []
    try:
        for i in range(n):
            s = source_socket(i, timeout=10)
            s.connect(("127.0.0.1", srv.port))
            s.sendall(GARBAGE[i % len(GARBAGE)])
            socks.append(s)
        for i, s in enumerate(socks):
            data = b""
            while True:
                try:
                    chunk = s.recv(4096)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                data += chunk
            assert data.startswith(b"HTTP/1.1 400 "), f"connection {i}: {data[:100]!r}"
    finally:
        for s in socks:
            s.close()
    assert_healthy_and_clean(srv, before)


# ---------------------------------------------------------------- half-closed sockets
#
# What a client's FIN means to the server: it is gone. A WebSocket subscriber,
# an SSE stream or a waiting long-poll whose client shuts down its write side is
# dropped at once (nothing more is delivered to it: a WebSocket client that can
# no longer answer pings or close properly has left), and its subscription is
# released. A request the client completed before its FIN is still answered.


def _read_to_eof(s: socket.socket, timeout: float = 5.0) -> bytes:
    s.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = s.recv(1 << 16)
        except ConnectionResetError:
            return out
        except socket.timeout:
            raise AssertionError(f"still open {timeout:g}s after the half-close; got {out[:200]!r}")
        if not chunk:
            return out
        out += chunk


def test_half_closed_websocket_subscriber_is_released_and_others_still_get_messages(start_server):
    srv = start_server()
    before = baseline(srv)
    channel = "half"
    half = raw_connect(srv.port, path=f"/ws/{channel}", timeout=5)
    other = raw_connect(srv.port, path=f"/ws/{channel}", timeout=5)
    try:
        wait_subscribers(srv.port, channel, 2)
        half.sock.shutdown(socket.SHUT_WR)
        wait_subscribers(srv.port, channel, 1, timeout=5)
        assert _read_to_eof(half.sock) == b"", "the half-closed subscriber was sent something"
        publish_ok(srv.port, channel, "for those still here")
        assert other.read_message(timeout=5) == (OP_TEXT, b"for those still here")
    finally:
        half.close()
        other.close()
    assert_healthy_and_clean(srv, before)


def test_half_closed_sse_stream_and_waiting_poll_are_released(start_server):
    srv = start_server()
    before = baseline(srv)
    sse = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    poll = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    try:
        sse.sendall(b"GET /sse/half-sse HTTP/1.1\r\nHost: x\r\n\r\n")
        poll.sendall(b"GET /poll/half-poll?timeout=30 HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: stats(srv.port)["connections"] == {**before.connections, "sse": 1, "poll": 1}, 5,
                 lambda: f"stream and poll not open: {stats(srv.port)['connections']}")
        sse.shutdown(socket.SHUT_WR)
        poll.shutdown(socket.SHUT_WR)
        wait_until(lambda: stats(srv.port)["connections"] == before.connections, 5,
                 lambda: f"half-closed stream and poll still held: {stats(srv.port)['connections']}")
        head = _read_to_eof(sse)
        assert head.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in head, head[:200]
        assert _read_to_eof(poll) == b"", "the dropped poll was answered"
        publish_ok(srv.port, "half-sse", "nobody")
        publish_ok(srv.port, "half-poll", "nobody")
    finally:
        sse.close()
        poll.close()
    assert_healthy_and_clean(srv, before)


def test_a_request_completed_before_the_half_close_is_answered(start_server):
    srv = start_server()
    before = baseline(srv)
    for path, check in (("/healthz", lambda b: b.endswith(b"\r\n\r\nok")),
                        ("/api/stats", lambda b: b'"connections"' in b)):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        try:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            s.shutdown(socket.SHUT_WR)
            answer = _read_to_eof(s)
            assert answer.startswith(b"HTTP/1.1 200 ") and check(answer), answer[:300]
        finally:
            s.close()
    # A WebSocket client that sends its close frame and half-closes at once gets
    # the server's close frame.
    c = raw_connect(srv.port, path="/echo", timeout=5)
    try:
        c.send_close(1000, b"bye")
        c.sock.shutdown(socket.SHUT_WR)
        assert c.expect_close(timeout=5) == (1000, b"")
        assert c.read_to_eof(timeout=5) == b""
    finally:
        c.close()
    assert_healthy_and_clean(srv, before)


BIG_ANSWER_MESSAGE = 60 * 1024
# A long-poll answer from history bigger than all the kernel can buffer for the
# connection (the client's receive buffer is 4 KiB), so part of it has to wait in
# the server.
BIG_ANSWER_MESSAGES = (kernel_send_buffer_max() + (2 << 20)) // BIG_ANSWER_MESSAGE + 1


def big_poll_answer(srv, channel: str, half_close: bool) -> tuple[int, int]:
    """Fills the channel's history, asks a long-poll for all of it from a client
    with a 4 KiB receive buffer (shutting down its write side right after the
    request if half_close), reads to EOF: (body bytes received, Content-Length)."""
    for i in range(1, BIG_ANSWER_MESSAGES + 1):
        publish_ok(srv.port, channel, numbered(i, BIG_ANSWER_MESSAGE))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", srv.port))
        s.sendall(f"GET /poll/{channel}?since=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        if half_close:
            s.shutdown(socket.SHUT_WR)
        answer = _read_to_eof(s, timeout=20)
    finally:
        s.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head[:200]
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    return len(body), length


def test_a_big_answer_arrives_whole_to_a_slow_reader(start_server):
    # The control for the next test: the same answer, no half-close.
    srv = start_server("--history-size", str(BIG_ANSWER_MESSAGES))
    before = baseline(srv)
    got, length = big_poll_answer(srv, "big-answer", half_close=False)
    assert got == length, f"the answer was cut short: {got} of its {length} bytes"
    assert_healthy_and_clean(srv, before)


def test_a_big_answer_to_a_request_completed_before_the_half_close_is_not_cut_short(start_server):
    srv = start_server("--history-size", str(BIG_ANSWER_MESSAGES))
    before = baseline(srv)
    got, length = big_poll_answer(srv, "big-answer", half_close=True)
    assert got == length, f"the answer was cut short: {got} of its {length} bytes"
    assert_healthy_and_clean(srv, before)


# ---------------------------------------------------------------- connect and drop

CHURN = 5000


@needs_sources
def test_connections_opened_and_dropped_fast_leave_nothing_behind(start_server):
    srv = start_server()
    before = baseline(srv)
    accepted0 = stats(srv.port)["accepted"]
    upgrade, _ = upgrade_request(path="/ws/churn")
    half = half_upgrade("/ws/churn")
    t0 = time.monotonic()
    for i in range(CHURN):
        s = source_socket(i)
        try:
            s.connect(("127.0.0.1", srv.port))
            kind = i % 4
            if kind == 1:
                # Reset instead of FIN.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif kind == 2:
                s.sendall(half)
            elif kind == 3:
                # A whole upgrade, gone before (or just after) the server's 101.
                s.sendall(upgrade)
                if i % 8 == 7:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        finally:
            s.close()
    elapsed = time.monotonic() - t0
    # The listener accepts a connection once it has sent something (TCP_DEFER_ACCEPT):
    # one reset before sending anything (kind 1) may never reach accept at all.
    sent_something = CHURN - CHURN // 4
    wait_until(lambda: stats(srv.port)["accepted"] - accepted0 >= sent_something, 10,
             lambda: f"the server accepted {stats(srv.port)['accepted'] - accepted0} of the {sent_something} "
                     f"connections that sent bytes or a FIN")
    wait_until(lambda: subscribers_now(srv.port, "churn") == 0, 10, "churned subscribers still subscribed")
    assert_healthy_and_clean(srv, before)
    print(f"churn: {CHURN} connections opened and dropped in {elapsed:.2f}s")


def test_a_connection_is_accepted_with_its_first_bytes_and_a_silent_one_still_times_out(start_server):
    """The listener defers accept until a connection's first bytes (TCP_DEFER_ACCEPT,
    about a second at most): a silent connection costs the server nothing meanwhile,
    one that speaks is accepted and answered at once, and a silent one is accepted
    after the deferral and then closed at --handshake-timeout like any other."""
    handshake_timeout = 2.0
    srv = start_server("--handshake-timeout", f"{handshake_timeout:g}s")
    upgrade, _ = upgrade_request(path="/ws/deferred")
    for attempt in range(3):
        accepted0 = stats(srv.port)["accepted"]
        silent = source_socket(attempt * 2)
        silent.connect(("127.0.0.1", srv.port))
        connected = time.monotonic()
        speaker = source_socket(attempt * 2 + 1)
        speaker.connect(("127.0.0.1", srv.port))
        speaker.sendall(upgrade)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = speaker.recv(4096)
            assert chunk, f"the speaker was closed after {head!r}"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head
        accepted = stats(srv.port)["accepted"] - accepted0
        checked_after = time.monotonic() - connected
        # The kernel hands the silent one over after its first SYN-ACK retransmission
        # (1 s); a check made later than that proves nothing, so try again. So does a
        # count that took in a connection from before accepted0 (the fixture's readiness
        # probe, whose FIN another loop may accept only now): a silent socket accepted
        # early would show in every attempt, a late probe in the first only.
        if (checked_after < 0.8 and accepted == 2) or attempt == 2:
            break
        for s in (speaker, silent):  # reset: a FIN would get the silent one accepted later
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
    # The speaker and the stats request were accepted; the silent socket was not.
    assert accepted == 2, (
        f"{accepted} accepted {checked_after:.3f}s after the silent connection's connect: "
        "it was accepted before it sent anything"
    )
    silent.settimeout(handshake_timeout + 10)
    assert silent.recv(1) == b"", "the silent connection got bytes instead of being closed"
    took = time.monotonic() - connected
    assert took >= handshake_timeout, f"a silent connection was closed after {took:.2f}s"
    speaker.close()
    silent.close()
