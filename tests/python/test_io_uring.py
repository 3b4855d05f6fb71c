"""--io-uring: both ways a loop receives (io_uring multishot receives, and epoll
with recv) carry the same traffic: large messages over many buffers, many
connections at once (more than the buffer pool has at start), pipelined HTTP,
publish to subscribers, and closes that must reach the client."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import httpx
import pytest

import rawws
from io_uring_probe import io_uring_unavailable
from rawws import RawConn
from wsutil import run, ws_connect

# Runs alone: it counts the server's system calls.
pytestmark = pytest.mark.serial

MODES = ["auto", "off"]


def uses_io_uring(pid: int) -> bool:
    """Whether the process holds an io_uring instance (a ring's descriptor)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if "io_uring" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                return True
        except OSError:
            continue
    return False


def kernel_has_io_uring() -> bool:
    return io_uring_unavailable() is None


def start_in_mode(start_server, mode: str, *flags: str):
    """The server with `--io-uring mode`. In auto mode where io_uring cannot be
    made the loops receive through epoll, as `off` does, and the case would prove
    nothing about the ring: it is skipped with the reason."""
    if mode == "auto" and (why := io_uring_unavailable()):
        pytest.skip(f"io_uring unavailable here ({why}): auto mode would only repeat off")
    return start_server("--io-uring", mode, *flags)


def assert_ring_as_asked(srv, mode: str) -> None:
    """auto made its rings (and did not fall back to epoll); off made none."""
    if mode == "off":
        assert not uses_io_uring(srv.pid), srv.describe()
        return
    # The loops make their rings as they start; the port answers just before.
    deadline = time.monotonic() + 30
    while not uses_io_uring(srv.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uses_io_uring(srv.pid), f"no io_uring instance in the server\n{srv.describe()}"
    assert "io_uring unavailable" not in srv.stderr(), srv.describe()


@pytest.mark.parametrize("mode", MODES)
def test_mode_decides_whether_a_ring_is_made(start_server, mode):
    srv = start_in_mode(start_server, mode, "--threads", "2")
    assert_ring_as_asked(srv, mode)


def test_bad_mode_is_refused(start_server):
    srv = start_server("--io-uring", "sometimes", wait=False)
    assert srv.wait(10) not in (None, 0)
    assert "not auto or off" in srv.stderr()


@pytest.mark.parametrize("mode", MODES)
def test_large_messages_span_many_receives(start_server, mode):
    srv = start_in_mode(start_server, mode, "--max-message-size", "1MiB")

    async def main():
        async with ws_connect(srv.url(), max_size=2**21) as ws:
            for size in [1, 2047, 2048, 2049, 40_000, 700_000]:
                msg = os.urandom(size)
                await ws.send(msg)
                assert await ws.recv() == msg

    run(main())
    assert_ring_as_asked(srv, mode)


@pytest.mark.parametrize("mode", MODES)
def test_many_connections_sending_at_once(start_server, mode):
    """300 clients send together, more than the 64 buffers a pool starts with."""
    srv = start_in_mode(start_server, mode, "--threads", "1")

    async def client(i, ready, go):
        async with ws_connect(srv.url()) as ws:
            ready.release()
            await go.wait()
            msgs = [f"{i}:{n}:" + "x" * 3000 for n in range(5)]
            for m in msgs:
                await ws.send(m)
            for m in msgs:
                assert await asyncio.wait_for(ws.recv(), 20) == m

    async def main():
        n = 300
        ready = asyncio.Semaphore(0)
        go = asyncio.Event()
        tasks = [asyncio.create_task(client(i, ready, go)) for i in range(n)]
        for _ in range(n):
            await asyncio.wait_for(ready.acquire(), 20)
        go.set()
        await asyncio.gather(*tasks)

    run(main(), timeout=60)
    assert_ring_as_asked(srv, mode)


@pytest.mark.parametrize("mode", MODES)
def test_echoes_to_a_reader_that_stopped_reading_wait_and_arrive_in_order(start_server, mode):
    """Replies are held to the end of a turn and sent through the send ring
    (auto): a client with a tiny receive buffer that reads nothing while it
    sends 1,600 messages of 8 KB (12.8 MB, past what the kernel buffers) fills its socket, so the ring's sends of its
    held echoes come back short or EAGAIN and the rest waits in its queue.
    Another client's echoes go on meanwhile; once the first one reads, it gets
    every echo, whole and in order."""
    srv = start_in_mode(start_server, mode, "--threads", "1", "--max-queue", "64MiB")
    count, size = 1600, 8000
    msgs = [f"{n:05}:".encode() + bytes([97 + n % 26]) * (size - 6) for n in range(count)]
    with rawws.ws_connect(srv.port, rcvbuf=4096, timeout=20) as slow:
        slow.send(b"".join(rawws.encode_frame(rawws.OP_TEXT, m) for m in msgs))

        async def other():
            async with ws_connect(srv.url()) as ws:
                for n in range(50):
                    await ws.send(f"other {n}")
                    assert await asyncio.wait_for(ws.recv(), 5) == f"other {n}"

        run(other())
        for n, want in enumerate(msgs):
            opcode, payload = slow.read_message(timeout=20)
            assert (opcode, len(payload), payload[:6]) == (rawws.OP_TEXT, size, want[:6]), n
            assert payload == want, n
    assert_ring_as_asked(srv, mode)
    stats = httpx.get(f"http://127.0.0.1:{srv.port}/api/stats", timeout=5).json()
    if mode == "off":
        assert stats["io_uring_sends"] == stats["io_uring_send_calls"] == 0, stats
    else:
        # The echoes went through the send ring, many to a system call at times.
        assert stats["io_uring_sends"] >= 50, stats
        assert 0 < stats["io_uring_send_calls"] <= stats["io_uring_sends"], stats


@pytest.mark.parametrize("mode", MODES)
def test_a_client_that_sends_then_shuts_its_side_still_gets_its_echoes(start_server, mode):
    """Messages and the FIN in one breath: the echoes (held for the turn's end
    with io_uring) go out before the server lets the connection go."""
    srv = start_in_mode(start_server, mode)
    for attempt in range(20):
        with rawws.ws_connect(srv.port) as c:
            msgs = [f"last words {attempt}.{n}".encode() for n in range(3)]
            c.send(b"".join(rawws.encode_frame(rawws.OP_TEXT, m) for m in msgs))
            c.sock.shutdown(socket.SHUT_WR)
            for m in msgs:
                assert c.read_message(timeout=5) == (rawws.OP_TEXT, m), attempt
    assert_ring_as_asked(srv, mode)


@pytest.mark.parametrize("mode", MODES)
def test_pipelined_requests_and_publish_to_a_subscriber(start_server, mode):
    srv = start_in_mode(start_server, mode)

    async def main():
        async with ws_connect(srv.url("/ws/pipe")) as ws:
            await asyncio.sleep(0.2)
            requests = b"".join(
                b"POST /api/publish/pipe HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"
                + f"{i:02}".encode()
                for i in range(20)
            )
            with socket.create_connection(("127.0.0.1", srv.port)) as s:
                s.sendall(requests)
                s.settimeout(5)
                answers = b""
                while answers.count(b"HTTP/1.1 ") < 20:
                    chunk = s.recv(65536)
                    assert chunk, "closed before every answer"
                    answers += chunk
            got = []
            for _ in range(20):
                got.append(await asyncio.wait_for(ws.recv(), 5))
            assert [g if isinstance(g, str) else g.decode() for g in got] == [f"{i:02}" for i in range(20)]

    run(main())
    assert_ring_as_asked(srv, mode)


@pytest.mark.parametrize("mode", MODES)
def test_a_connection_the_server_drops_is_closed_for_the_client(start_server, mode):
    """With io_uring the armed receive holds the socket until it is cancelled."""
    srv = start_in_mode(start_server, mode, "--handshake-timeout", "1s")
    with RawConn(srv.port) as c:
        c.send(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert c.wait_closed(timeout=30) == b""
    # The descriptor's number is reused at once; the next connection works.
    r = httpx.get(f"http://127.0.0.1:{srv.port}/healthz", timeout=5)
    assert r.status_code == 200
    assert_ring_as_asked(srv, mode)


@pytest.mark.parametrize("mode", MODES)
def test_clients_closing_release_their_connections(start_server, mode):
    srv = start_in_mode(start_server, mode)

    async def main():
        for _ in range(3):
            conns = [await ws_connect(srv.url()).__aenter__() for _ in range(50)]
            for ws in conns:
                await ws.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            stats = httpx.get(f"http://127.0.0.1:{srv.port}/api/stats", timeout=5).json()
            if stats["connections"]["websocket"] == 0:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"connections left open: {stats['connections']}")

    run(main())
    assert_ring_as_asked(srv, mode)


def ring_receivers(port: int) -> int:
    stats = httpx.get(f"http://127.0.0.1:{port}/api/stats", timeout=5).json()
    return stats["io_uring_receivers"]


def wait_for_receivers(port: int, want, timeout: float = 8.0) -> int:
    deadline = time.monotonic() + timeout
    n = ring_receivers(port)
    while not want(n) and time.monotonic() < deadline:
        time.sleep(0.1)
        n = ring_receivers(port)
    return n


async def most_receivers_while(port: int, work, want: int, after: float = 8.0) -> int:
    """The most ring receivers /api/stats shows while `work` runs, or in the `after`
    seconds that follow until `want` is seen. The figure is published at each sweep
    (once a second) and a quiet second moves them back, so the moment to see them
    all may fall in the burst or just after it, however slow this process is."""
    seen = [0]
    done = asyncio.Event()

    async def watch():
        deadline = None
        while True:
            seen.append(await asyncio.to_thread(ring_receivers, port))
            if done.is_set():
                deadline = deadline or time.monotonic() + after
                if max(seen) >= want or time.monotonic() > deadline:
                    return
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        await work
    except BaseException:
        watcher.cancel()
        raise
    done.set()
    await watcher
    return max(seen)


@pytest.mark.skipif(not kernel_has_io_uring(), reason=f"io_uring unavailable here: {io_uring_unavailable()}")
def test_busy_connections_move_to_the_ring_and_quiet_ones_back(start_server):
    """A connection starts on epoll; sending a lot moves its receive to the ring,
    a quiet second moves it back, and no byte is lost or reordered either way,
    even when a move falls in the middle of a frame."""
    srv = start_server("--io-uring", "auto", "--threads", "1", "--max-message-size", "1MiB")
    port = srv.port

    async def burst(ws, tag, count):
        msgs = [f"{tag}:{n}:" + "y" * (n % 7 * 500) for n in range(count)]
        # One at a time, a read each (reads, not messages, make a connection busy),
        # then pipelined: frames queue in the socket while its receive moves.
        for m in msgs[: count // 2]:
            await ws.send(m)
            assert await asyncio.wait_for(ws.recv(), 10) == m
        for m in msgs[count // 2 :]:
            await ws.send(m)
        for m in msgs[count // 2 :]:
            assert await asyncio.wait_for(ws.recv(), 10) == m

    async def main():
        quiet = [await ws_connect(srv.url()).__aenter__() for _ in range(10)]
        busy = [await ws_connect(srv.url()).__aenter__() for _ in range(20)]
        for ws in quiet:
            await burst(ws, "hello", 1)
        assert await asyncio.to_thread(ring_receivers, port) == 0
        for cycle in range(3):
            bursts = asyncio.gather(*(burst(ws, f"{cycle}-{i}", 60) for i, ws in enumerate(busy)))
            n = await most_receivers_while(port, bursts, 20)
            assert n == 20, f"cycle {cycle}: at most {n} received through the ring"
            # A frame over many ring buffers.
            big = os.urandom(300_000)
            await busy[0].send(big)
            assert await asyncio.wait_for(busy[0].recv(), 10) == big
            n = await asyncio.to_thread(wait_for_receivers, port, lambda n: n == 0)
            assert n == 0, f"cycle {cycle}: {n} still in the ring after going quiet"
            # Back on epoll: a frame of many reads (loopback hands over 64 KiB at
            # most), so the move to the ring falls inside it.
            big = os.urandom(900_000)
            await busy[1].send(big)
            assert await asyncio.wait_for(busy[1].recv(), 10) == big
        for ws in quiet:
            await burst(ws, "bye", 3)
        for ws in quiet + busy:
            await ws.close()
        metrics = await asyncio.to_thread(
            lambda: httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        )
        assert "throng_io_uring_receivers 0" in metrics

    run(main(), timeout=90)


@pytest.mark.skipif(not kernel_has_io_uring(), reason=f"io_uring unavailable here: {io_uring_unavailable()}")
def test_a_busy_connection_closed_by_its_peer_is_released(start_server):
    srv = start_server("--io-uring", "auto", "--threads", "1")

    async def main():
        for _ in range(3):
            conns = [await ws_connect(srv.url()).__aenter__() for _ in range(30)]
            for ws in conns:
                for n in range(20):
                    await ws.send(str(n))
                for n in range(20):
                    assert await asyncio.wait_for(ws.recv(), 5) == str(n)
            for ws in conns:
                await ws.close()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            stats = await asyncio.to_thread(
                lambda: httpx.get(f"http://127.0.0.1:{srv.port}/api/stats", timeout=5).json()
            )
            conns = stats["connections"]
            if conns["websocket"] == 0 and stats["io_uring_receivers"] == 0:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"left open: {conns}")

    run(main(), timeout=60)
