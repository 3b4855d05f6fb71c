"""Slow consumers on a channel: a subscriber that stops reading is cut off
(close 1008 "slow consumer", or at least the server drops its connection) once
its outbound queue passes --max-queue, the server's memory stays bounded, and
the other subscribers of the same channel still get every message in order. A
returning subscriber's replay (since=) bigger than --max-queue does not count
against it while it is written; live messages piling up on top of it still do."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import warnings

import pytest

from conftest import vm_rss_kb
from rawws import (
    OP_CLOSE, OP_PING, OP_TEXT, Closed, channel_info, http_request, parse_close, publish_ok, wait_subscribers,
)
from rawws import ws_connect as raw_connect
from wsutil import run, ws_connect

# Runs alone: it measures the server's resident memory.
pytestmark = pytest.mark.serial

N_MESSAGES = 2000
MSG_SIZE = 10 * 1024
RSS_LIMIT_KB = 100 * 1024
# The publisher never runs more than WINDOW messages (100 KiB) ahead of the slower
# of the two reading subscribers, so they stay far below --max-queue whatever the
# speed of this Python process: only the stalled subscriber may overflow.
WINDOW = 10


def payload(i: int) -> str:
    head = f"{i:06d}|"
    return head + "x" * (MSG_SIZE - len(head))


def test_slow_raw_subscriber_is_cut_off_while_others_get_everything(start_server):
    srv = start_server("--max-queue", "256KiB")
    channel = "firehose"
    # Tiny receive buffer, and it never reads: the server's outbound queue must grow.
    slow = raw_connect(srv.port, path=f"/ws/{channel}", rcvbuf=4096, timeout=10)
    rss_samples: list[int] = []

    async def main():
        good_json = await ws_connect(srv.url(f"/ws/{channel}?format=json"))
        good_raw = await ws_connect(srv.url(f"/ws/{channel}"))
        try:
            wait_subscribers(srv.port, channel, 3)
            rss_samples.append(vm_rss_kb(srv.pid))
            received = {"json": 0, "raw": 0}

            async def read_json():
                for i in range(N_MESSAGES):
                    m = json.loads(await asyncio.wait_for(good_json.recv(), 20))
                    assert m["seq"] == i + 1, f"json subscriber: message {i} has seq {m['seq']} (gap or reorder)"
                    assert m["data"] == payload(i + 1), f"json subscriber: wrong data at seq {i + 1}"
                    received["json"] = i + 1

            async def read_raw():
                for i in range(N_MESSAGES):
                    got = await asyncio.wait_for(good_raw.recv(), 20)
                    assert got == payload(i + 1), f"raw subscriber: message {i} is {got[:7]!r}..., want {i + 1:06d}"
                    received["raw"] = i + 1

            readers = [asyncio.create_task(read_json()), asyncio.create_task(read_raw())]

            def publish_all():
                for i in range(1, N_MESSAGES + 1):
                    deadline = time.monotonic() + 20
                    while min(received.values()) < i - WINDOW:
                        if any(r.done() for r in readers):
                            return  # a reader failed: gather() below reports why
                        if time.monotonic() > deadline:
                            raise AssertionError(f"subscribers stuck before message {i - WINDOW}: {received}")
                        time.sleep(0.0005)
                    seq = publish_ok(srv.port, channel, payload(i))
                    assert seq == i, f"publish {i} answered seq {seq}"
                    if i % 100 == 0:
                        rss_samples.append(vm_rss_kb(srv.pid))

            loop = asyncio.get_running_loop()
            t0 = time.monotonic()
            await loop.run_in_executor(None, publish_all)
            await asyncio.wait_for(asyncio.gather(*readers), 60)
            elapsed = time.monotonic() - t0
            rss_samples.append(vm_rss_kb(srv.pid))

            # The slow subscriber has been dropped by the server: only the two good ones remain.
            info = wait_subscribers(srv.port, channel, 2, timeout=10)
            assert info["last_seq"] == N_MESSAGES, info
            return elapsed
        finally:
            await good_json.close()
            await good_raw.close()

    try:
        elapsed = run(main(), timeout=120)

        peak = max(rss_samples)
        assert peak < RSS_LIMIT_KB, (
            f"server VmRSS peaked at {peak} kB (limit {RSS_LIMIT_KB} kB) with one stalled subscriber "
            f"and --max-queue 256KiB; samples: {rss_samples}"
        )

        # Now read what the slow socket got: data frames (in order), then a close
        # frame 1008 "slow consumer" and/or the end of the TCP connection.
        last, frames, code, reason = 0, 0, None, b""
        deadline = time.monotonic() + 20
        try:
            while True:
                _fin, _rsv, op, data = slow.read_frame(timeout=max(0.01, deadline - time.monotonic()))
                if op == OP_CLOSE:
                    code, reason = parse_close(data)
                    break
                if op == OP_PING:
                    continue
                assert op == OP_TEXT, f"unexpected opcode {op}"
                n = int(data[:6])
                assert n > last, f"slow subscriber got message {n} after {last}: out of order"
                last, frames = n, frames + 1
        except Closed as e:
            warnings.warn(
                f"slow consumer: connection ended ({e}) without a close frame after {frames} messages (last {last})"
            )
        except TimeoutError:
            raise AssertionError(
                f"slow subscriber was not cut off: after {N_MESSAGES} x {MSG_SIZE} B with --max-queue 256KiB it "
                f"got {frames} messages (last {last}) and then nothing for 20s, no close, no EOF"
            )
        if code is not None:
            assert code == 1008, f"expected close 1008, got {code} {reason!r}"
            assert b"slow consumer" in reason.lower(), f"reason should say 'slow consumer': {reason!r}"
            # after the close frame the server ends the TCP connection
            try:
                rest = slow.read_to_eof(timeout=10)
            except TimeoutError:
                raise AssertionError("server sent close 1008 but did not close the TCP connection within 10s")
            assert rest == b"", f"bytes after the close frame: {rest[:50]!r}"
        assert last < N_MESSAGES, f"the stalled subscriber was not cut off: it got all {N_MESSAGES} messages"
    finally:
        slow.close()
    # The server is still healthy and publishing still works.
    assert publish_ok(srv.port, channel, "after") == N_MESSAGES + 1
    assert channel_info(srv.port, channel)["subscribers"] == 0
    print(
        f"slow consumer: publish+deliver {elapsed:.1f}s; stalled socket got {frames} messages (last {last}), "
        f"close {code} {reason!r}; server RSS samples kB {rss_samples}"
    )


CATCH_UP_SIZE = 60 * 1024


def kernel_send_buffer_max() -> int:
    """The most a TCP socket's send buffer grows to (on loopback it starts near it)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


# A catch-up of kept 60 KiB messages far bigger than --max-queue (256 KiB) and than
# all the kernel can buffer, so most of it has to wait in the server: at least 40
# messages, and more than the send buffer's maximum plus 1 MiB (100 with 4 MiB).
CATCH_UP_MESSAGES = max(40, (kernel_send_buffer_max() + (1 << 20)) // CATCH_UP_SIZE + 1)
CATCH_UP_FLAGS = [
    "--max-queue",
    "256KiB",
    "--max-message-size",
    "64KiB",
    "--history-size",
    str(CATCH_UP_MESSAGES + 10),
]


def big_payload(i: int) -> str:
    head = f"{i:06d}|"
    return head + "y" * (CATCH_UP_SIZE - len(head))


def test_a_replay_bigger_than_max_queue_is_not_a_slow_consumer(start_server):
    srv = start_server(*CATCH_UP_FLAGS)
    channel = "catchup"
    for i in range(1, CATCH_UP_MESSAGES + 1):
        assert publish_ok(srv.port, channel, big_payload(i)) == i
    # A tiny receive buffer, and a second before it starts reading: nearly all of
    # the replay has to wait in the server.
    back = raw_connect(srv.port, path=f"/ws/{channel}?since=0", rcvbuf=4096, timeout=10)
    try:
        time.sleep(1.0)
        assert channel_info(srv.port, channel)["subscribers"] == 1, "the returning subscriber was dropped"
        for i in range(1, CATCH_UP_MESSAGES + 1):
            op, data = back.read_message(timeout=10)
            assert op == OP_TEXT, f"message {i}: opcode {op} {data!r:.80}"
            assert data.decode() == big_payload(i), f"message {i} is {data[:7]!r}..."
        # Caught up, it stays subscribed and gets live messages.
        publish_ok(srv.port, channel, "live")
        assert back.read_message(timeout=10) == (OP_TEXT, b"live")
        assert channel_info(srv.port, channel)["subscribers"] == 1
    finally:
        back.close()


def test_a_returning_subscriber_that_stops_reading_is_still_a_slow_consumer(start_server):
    srv = start_server(*CATCH_UP_FLAGS)
    channel = "catchup-stall"
    for i in range(1, CATCH_UP_MESSAGES + 1):
        publish_ok(srv.port, channel, big_payload(i))
    stalled = raw_connect(srv.port, path=f"/ws/{channel}?since=0", rcvbuf=4096, timeout=10)
    try:
        wait_subscribers(srv.port, channel, 1)
        # Live messages keep coming on top of its replay, and it reads nothing:
        # 20 x 60 KiB is far past --max-queue.
        total = CATCH_UP_MESSAGES + 20
        for i in range(CATCH_UP_MESSAGES + 1, total + 1):
            publish_ok(srv.port, channel, big_payload(i))
        wait_subscribers(srv.port, channel, 0, timeout=10)
        # What it gets: whole messages in order (the replay the server had started
        # to write), then close 1008 "slow consumer".
        last, code, reason = 0, None, b""
        try:
            while True:
                op, data = stalled.read_message(timeout=10)
                if op == "close":
                    code, reason = data
                    break
                n = int(data[:6])
                assert n == last + 1, f"message {n} after {last}"
                last = n
        except Closed as e:
            warnings.warn(f"stalled subscriber: connection ended ({e}) without a close frame after {last}")
        if code is not None:
            assert (code, reason) == (1008, b"slow consumer"), (code, reason)
        assert last < total, f"the stalled subscriber was not cut off: it got all {total} messages"
    finally:
        stalled.close()
    assert publish_ok(srv.port, channel, "after") == total + 1


def sse_connections(port: int) -> int:
    return http_request(port, "GET", "/api/stats").json()["connections"]["sse"]


def returning_sse_reader(srv, channel: str) -> socket.socket:
    """A channel's history filled with the big messages, and a reader with a tiny
    receive buffer coming back for all of it (since=0)."""
    for i in range(1, CATCH_UP_MESSAGES + 1):
        publish_ok(srv.port, channel, big_payload(i))
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.settimeout(10)
    reader.connect(("127.0.0.1", srv.port))
    reader.sendall(f"GET /sse/{channel}?since=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return reader


def test_a_returning_sse_reader_that_never_reads_its_replay_is_let_go(start_server):
    # SSE streams have no idle timeout, so a stalled replay must not be held
    # forever: a catch-up the reader takes nothing of for 5 s counts against
    # --max-queue from then on (whatever the ping interval).
    srv = start_server(*CATCH_UP_FLAGS, "--ping-interval", "1s")
    channel = "catchup-sse"
    stalled = returning_sse_reader(srv, channel)
    try:
        deadline = time.monotonic() + 2
        while sse_connections(srv.port) != 1:
            assert time.monotonic() < deadline, "the SSE stream never opened"
            time.sleep(0.05)
        # 5 s without the reader taking a byte, then it is dropped as a slow
        # consumer: it leaves the channel and its socket goes at once.
        wait_subscribers(srv.port, channel, 0, timeout=10)
        deadline = time.monotonic() + 10
        while sse_connections(srv.port) != 0:
            assert time.monotonic() < deadline, "a reader that takes nothing still holds its replay"
            time.sleep(0.1)
    finally:
        stalled.close()


def test_a_returning_sse_reader_that_reads_slowly_keeps_its_replay(start_server):
    # The other side of the rule: a reader that keeps taking its replay, however
    # slowly, is never cut off for it.
    srv = start_server(*CATCH_UP_FLAGS, "--ping-interval", "1s")
    channel = "catchup-sse-slow"
    reader = returning_sse_reader(srv, channel)
    got = b""
    try:
        want = f"{CATCH_UP_MESSAGES:06d}|".encode()
        t0 = time.monotonic()
        # Take a little every 100 ms for 3 s (three heartbeats), then the rest.
        while time.monotonic() - t0 < 3:
            got += reader.recv(16 * 1024)
            time.sleep(0.1)
        while want not in got:
            chunk = reader.recv(1 << 16)
            assert chunk, "the slow but steady reader was cut off"
            got += chunk
        assert sse_connections(srv.port) == 1
    finally:
        reader.close()
