"""TLS on the server's own listeners (--tls-cert, --tls-key), with clients throng
did not write: Python's ssl module under websockets and httpx, curl and
openssl s_client. Every transport, both TLS versions, session resumption, the
bad inputs (plain HTTP, garbage, a truncated or stalled ClientHello, a client
that never reads), and SIGHUP reloads, one of them under load."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import websockets

import rawws
from conftest import free_port
from support.tls import client_context, der, https_get, make_cert, served_cert
from support.wait import wait_until


@pytest.fixture
def tls_server(start_server, tmp_path):
    """start(*flags) -> (server, cert, key): a server speaking TLS with a fresh certificate."""

    def start(*flags, key_type="ec"):
        cert, key = make_cert(tmp_path, "served", key_type)
        srv = start_server("--tls-cert", cert, "--tls-key", key, *flags)
        return srv, cert, key

    return start


def scrape(port: int, cert: Path) -> str:
    return httpx.get(f"https://127.0.0.1:{port}/metrics", verify=client_context(cert), timeout=5).text


def metric(port: int, cert: Path, series: str) -> float:
    for line in scrape(port, cert).splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in /metrics")


def tls_failures(port: int, cert: Path) -> float:
    return metric(port, cert, 'throng_handshake_failures_total{reason="tls"}')


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_websocket_echo_and_a_published_message_over_both_versions(tls_server, version):
    srv, cert, _ = tls_server()
    ctx = client_context(cert, version)

    async def run():
        async with websockets.connect(f"wss://127.0.0.1:{srv.port}/echo", ssl=ctx) as ws:
            ssl_object = ws.transport.get_extra_info("ssl_object")
            assert ssl_object.version() == {"TLSv1_2": "TLSv1.2", "TLSv1_3": "TLSv1.3"}[version.name]
            for i in range(5):
                await ws.send(f"hello {i}")
                assert await ws.recv() == f"hello {i}"
            # Larger than one TLS record (16 KiB): split and sealed in several.
            big = "x" * 60_000
            await ws.send(big)
            assert await ws.recv() == big
        async with websockets.connect(f"wss://127.0.0.1:{srv.port}/ws/news", ssl=ctx) as sub:
            async with httpx.AsyncClient(verify=ctx) as api:
                r = await api.post(f"https://127.0.0.1:{srv.port}/api/publish/news", content="over tls")
                assert r.status_code == 200, r.text
            assert await asyncio.wait_for(sub.recv(), 5) in ("over tls", b"over tls")

    asyncio.run(run())


def test_an_rsa_key_serves_too(tls_server):
    srv, cert, _ = tls_server(key_type="rsa")
    r = httpx.get(f"https://127.0.0.1:{srv.port}/healthz", verify=client_context(cert), timeout=5)
    assert r.status_code == 200


def test_sse_and_long_poll_over_tls(tls_server):
    srv, cert, _ = tls_server()
    ctx = client_context(cert)
    base = f"https://127.0.0.1:{srv.port}"
    with httpx.Client(verify=ctx, timeout=10) as client:
        with client.stream("GET", f"{base}/sse/feed") as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.iter_lines()
            assert next(lines).startswith("retry:")
            with httpx.Client(verify=ctx, timeout=5) as api:
                assert api.post(f"{base}/api/publish/feed", content="sse over tls", headers={"content-type": "text/plain"}).status_code == 200
            for line in lines:
                if line.startswith("data:"):
                    assert line == "data: sse over tls"
                    break
        # The message is in history: a long-poll from the start gets it at once.
        r = client.get(f"{base}/poll/feed", params={"since": "0"})
        assert r.status_code == 200, r.text
        assert "sse over tls" in r.text


def test_curl_and_openssl_s_client(tls_server):
    srv, cert, _ = tls_server()
    out = subprocess.run(
        ["curl", "-sS", "--cacert", str(cert), "-w", "\n%{http_code} %{http_version}",
         f"https://localhost:{srv.port}/healthz", "--resolve", f"localhost:{srv.port}:127.0.0.1"],
        capture_output=True, text=True, timeout=20,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("200 1.1"), out.stdout
    for flag, name in (("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")):
        s = subprocess.run(
            ["openssl", "s_client", "-connect", f"127.0.0.1:{srv.port}", "-servername", "localhost",
             "-CAfile", str(cert), "-alpn", "http/1.1", flag],
            input="", capture_output=True, text=True, timeout=20,
        )
        text = s.stdout + s.stderr
        assert "Verify return code: 0 (ok)" in text, text
        assert f"New, {name}, Cipher is" in text, text
        assert "ALPN protocol: http/1.1" in text, text


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_a_reconnect_resumes_its_session(tls_server, version):
    srv, cert, _ = tls_server()
    ctx = client_context(cert, version)

    session, reused = https_get(srv.port, ctx)
    assert not reused
    assert session is not None
    for _ in range(3):
        session, reused = https_get(srv.port, ctx, session)
        assert reused, "the ticket from the last connection did not resume"


def test_plain_http_to_the_tls_port_is_told_so_and_counted(tls_server):
    srv, cert, _ = tls_server()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"https://" in answer
    assert wait_until(lambda: tls_failures(srv.port, cert) == 1, fail=False)


def client_hello() -> bytes:
    """A real ClientHello, from Python's ssl over memory buffers."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def closed_within(s: socket.socket, seconds: float) -> bool:
    """True once the server closed (EOF or reset) within `seconds`."""
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_broken_and_stalled_hellos_close_only_their_own_connection(tls_server):
    srv, cert, _ = tls_server("--handshake-timeout", "1s")
    hello = client_hello()
    ctx = client_context(cert)

    async def echo_meanwhile():
        async with websockets.connect(f"wss://127.0.0.1:{srv.port}/echo", ssl=ctx) as ws:
            for i in range(20):
                await ws.send(str(i))
                assert await ws.recv() == str(i)
                await asyncio.sleep(0.05)

    # A ClientHello cut short that never goes on: closed by the handshake timeout.
    stalled = socket.create_connection(("127.0.0.1", srv.port))
    stalled.sendall(hello[: len(hello) // 2])
    # A handshake record with garbage inside: refused at once.
    garbage = socket.create_connection(("127.0.0.1", srv.port))
    garbage.sendall(b"\x16\x03\x01\x00\x40" + os.urandom(64))
    # A record header claiming more than TLS allows.
    oversized = socket.create_connection(("127.0.0.1", srv.port))
    oversized.sendall(b"\x16\x03\x01\xff\xff" + b"\x00" * 100)
    asyncio.run(echo_meanwhile())
    assert closed_within(garbage, 5)
    assert closed_within(oversized, 5)
    assert closed_within(stalled, 5)
    for s in (stalled, garbage, oversized):
        s.close()
    assert wait_until(lambda: tls_failures(srv.port, cert) == 3, fail=False), scrape(srv.port, cert)


def test_a_subscriber_that_never_reads_is_dropped_and_the_others_get_everything(tls_server):
    srv, cert, _ = tls_server("--max-queue", "64KiB")
    ctx = client_context(cert)
    # A TLS subscriber that completes its upgrade and then reads nothing more.
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", srv.port))
    stuck = ctx.wrap_socket(raw, server_hostname="localhost")
    stuck.sendall(
        b"GET /ws/wide HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    assert stuck.recv(4096).startswith(b"HTTP/1.1 101")
    payload = "y" * 30_000

    async def run():
        async with websockets.connect(f"wss://127.0.0.1:{srv.port}/ws/wide", ssl=ctx, max_size=None) as good:
            async with httpx.AsyncClient(verify=ctx) as api:
                # Bounded: the kernel's buffers take some megabytes before the
                # server's own queue fills; far fewer rounds are needed.
                for i in range(600):
                    r = await api.post(f"https://127.0.0.1:{srv.port}/api/publish/wide", content=f"{i}:{payload}",
                                       headers={"content-type": "text/plain"})
                    assert r.status_code == 200
                    got = await asyncio.wait_for(good.recv(), 5)
                    assert got.split(":")[0] == str(i)
                    if i % 50 == 49 and "throng_slow_consumer_disconnects_total 1" in (
                        await api.get(f"https://127.0.0.1:{srv.port}/metrics")
                    ).text:
                        return i
        return None

    sent = asyncio.run(run())
    assert sent is not None, "the subscriber that never reads was never dropped"
    assert closed_within(stuck, 5)
    stuck.close()


def test_sighup_reloads_the_certificate_for_new_handshakes_only(tls_server, tmp_path):
    srv, cert, key = tls_server()
    first = der(cert)
    assert served_cert(srv.port) == first
    ctx_old = client_context(cert)

    async def run():
        async with websockets.connect(f"wss://127.0.0.1:{srv.port}/echo", ssl=ctx_old) as before:
            # New files in place, then SIGHUP.
            new_cert, new_key = make_cert(tmp_path, "renewed")
            cert.write_bytes(new_cert.read_bytes())
            key.write_bytes(new_key.read_bytes())
            srv.signal(signal.SIGHUP)
            assert await asyncio.to_thread(wait_until, lambda: served_cert(srv.port) == der(new_cert), fail=False)
            # The connection from before the reload goes on with its keys.
            await before.send("still here")
            assert await before.recv() == "still here"
            # A bad file keeps the pair that works, and the log says why.
            key.write_text("not a key")
            srv.signal(signal.SIGHUP)
            assert await asyncio.to_thread(wait_until, lambda: "TLS reload failed" in srv.stderr() + srv.stdout(), fail=False)
            assert served_cert(srv.port) == der(new_cert)
            await before.send("and here")
            assert await before.recv() == "and here"

    asyncio.run(run())
    log = srv.stderr() + srv.stdout()
    assert "TLS certificate and key reloaded" in log, log


def test_reloads_under_load_lose_no_connection(tls_server, tmp_path):
    srv, cert, key = tls_server()
    ctx = client_context(cert)
    conns, rounds = 40, 30

    async def run():
        # Every client is connected (trusting the first certificate) before the
        # first reload, and echoes until the last reload is done: a reload serves
        # another self-signed certificate, which a handshake made after it would
        # rightly refuse.
        connected = asyncio.Event()
        reloaded = asyncio.Event()
        count = 0

        async def client(i: int):
            nonlocal count
            async with websockets.connect(f"wss://127.0.0.1:{srv.port}/echo", ssl=ctx) as ws:
                count += 1
                if count == conns:
                    connected.set()
                n = 0
                while n < rounds or not reloaded.is_set():
                    await ws.send(f"{i}/{n}")
                    assert await ws.recv() == f"{i}/{n}"
                    await asyncio.sleep(0.02)
                    n += 1
                return True

        async def reloads():
            await asyncio.wait_for(connected.wait(), 60)
            for n in range(5):
                await asyncio.sleep(0.1)
                # The same pair rewritten: every reload reads the files anew. Each
                # rewrite waits until the server has read the last pair (it reloads
                # on its own time after the signal): rewriting files it is still
                # reading would hand it half a key, which it refuses, keeping the
                # old pair.
                c, k = make_cert(tmp_path, f"r{n}")
                cert.write_bytes(c.read_bytes())
                key.write_bytes(k.read_bytes())
                srv.signal(signal.SIGHUP)
                for _ in range(200):
                    if len(re.findall("SIGHUP: TLS", srv.stderr())) > n:
                        break
                    await asyncio.sleep(0.05)
            reloaded.set()

        results = await asyncio.gather(reloads(), *(client(i) for i in range(conns)))
        return results[1:]

    assert asyncio.run(run()) == [True] * conns
    log = srv.stderr() + srv.stdout()
    assert len(re.findall("TLS certificate and key reloaded", log)) == 5, log


def test_a_missing_key_file_stops_the_start_with_the_reason(tmp_path):
    from conftest import throng_bin

    cert, _ = make_cert(tmp_path, "lonely")
    out = subprocess.run(
        [str(throng_bin()), "serve", "--listen", f"127.0.0.1:{free_port()}",
         "--tls-cert", str(cert), "--tls-key", str(tmp_path / "missing.key")],
        capture_output=True, text=True, timeout=20,
    )
    assert out.returncode != 0
    assert "missing.key" in out.stderr, out.stderr
    half = subprocess.run(
        [str(throng_bin()), "serve", "--listen", f"127.0.0.1:{free_port()}", "--tls-cert", str(cert)],
        capture_output=True, text=True, timeout=20,
    )
    assert half.returncode != 0
    assert "--tls-key" in half.stderr, half.stderr


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_servers_sharing_a_ticket_key_resume_each_others_sessions(start_server, tmp_path, version):
    cert, key = make_cert(tmp_path, "shared")
    ticket_key = tmp_path / "ticket.key"
    ticket_key.write_bytes(os.urandom(48))
    flags = ["--tls-cert", cert, "--tls-key", key]
    first = start_server(*flags, "--tls-ticket-key", ticket_key)
    second = start_server(*flags, "--tls-ticket-key", ticket_key)
    alone = start_server(*flags)
    ctx = client_context(cert, version)
    session, reused = https_get(first.port, ctx)
    assert not reused
    # Another process (another worker, node, or this one after a restart).
    _, reused = https_get(second.port, ctx, session)
    assert reused, "a ticket sealed by a server with the same key was not taken"
    # A server with its own in-memory keys does a full handshake instead.
    _, reused = https_get(alone.port, ctx, session)
    assert not reused


def test_a_short_ticket_key_file_stops_the_start(tmp_path):
    from conftest import throng_bin

    cert, key = make_cert(tmp_path, "short")
    ticket_key = tmp_path / "ticket.key"
    ticket_key.write_bytes(b"too short")
    out = subprocess.run(
        [str(throng_bin()), "serve", "--listen", f"127.0.0.1:{free_port()}", "--tls-cert", str(cert),
         "--tls-key", str(key), "--tls-ticket-key", str(ticket_key)],
        capture_output=True, text=True, timeout=20,
    )
    assert out.returncode != 0
    assert "ticket key needs at least 32" in out.stderr, out.stderr


def upgraded_with_a_small_buffer(port: int, ctx: ssl.SSLContext, path: str) -> rawws.RawConn:
    """A wss connection upgraded at `path` whose socket asked for a 4 KiB
    receive buffer: while it does not read, the server's socket fills soon."""
    conn = rawws.RawConn(port, rcvbuf=4096, timeout=20)
    conn.sock = ctx.wrap_socket(conn.sock, server_hostname="localhost")
    conn.send(
        f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    assert conn.read_http_response(body=False).status == 101
    return conn


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_a_tls_fan_out_goes_through_the_send_ring_and_a_full_socket_gets_the_rest_in_order(tls_server, version):
    """Each TLS subscriber's records are sealed into the loop's batch and sent
    with the others through the send ring (counted in /api/stats). A subscriber
    whose socket is full takes part of its records or none: the rest is kept as
    ciphertext it owes and reaches it, in order and decryptable, once it reads."""
    from io_uring_probe import io_uring_unavailable

    if why := io_uring_unavailable():
        pytest.skip(f"io_uring unavailable here ({why}): no send ring to go through")
    srv, cert, _ = tls_server("--threads", "1", "--max-queue", "16MiB")
    ctx = client_context(cert, version)
    stalled = upgraded_with_a_small_buffer(srv.port, ctx, "/ws/wide")
    # 6 MB for the stalled one: more than its socket's send buffer can grow to
    # (net.ipv4.tcp_wmem's most, 4 MiB), so a send through the ring meets a full
    # socket while its queue is still empty (the first one to, since it takes
    # the ring while nothing is owed) and takes part of the records or none.
    messages, good = 500, 3
    payload = "z" * 12_000  # under the 16 KiB a batch seals per subscriber

    def stats() -> dict:
        return httpx.get(f"https://127.0.0.1:{srv.port}/api/stats", verify=ctx, timeout=5).json()

    before = stats()

    async def run() -> None:
        subscribers = [
            await websockets.connect(f"wss://127.0.0.1:{srv.port}/ws/wide", ssl=ctx, max_size=None)
            for _ in range(good)
        ]
        try:
            async with httpx.AsyncClient(verify=ctx) as api:
                for i in range(messages):
                    r = await api.post(f"https://127.0.0.1:{srv.port}/api/publish/wide", content=f"{i}:{payload}",
                                       headers={"content-type": "text/plain"})
                    assert r.status_code == 200, r.text
                    for ws in subscribers:
                        got = await asyncio.wait_for(ws.recv(), 5)
                        assert got == f"{i}:{payload}"
        finally:
            for ws in subscribers:
                await ws.close()

    asyncio.run(run())
    after = stats()
    ring_sends = after["io_uring_sends"] - before["io_uring_sends"]
    assert ring_sends >= good * messages, (before, after, srv.describe())
    # Each message's fan-out went to 3 or more sockets per system call (the
    # publish's answers go through the ring too, one each).
    calls = after["io_uring_send_calls"] - before["io_uring_send_calls"]
    assert 0 < calls <= ring_sends - 2 * messages, (before, after)
    # The stalled subscriber gets every message now, each record intact.
    for i in range(messages):
        opcode, data = stalled.read_message(timeout=10)
        assert opcode == rawws.OP_TEXT and data == f"{i}:{payload}".encode(), (i, opcode, data[:40])
    stalled.close()
    assert "panicked" not in srv.stderr(), srv.describe()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_tls_echoes_are_held_to_the_turns_end_and_a_full_socket_gets_them_in_order(tls_server, version):
    """A TLS connection's replies are held like a plain one's and sealed when
    the turn's end offers them through the send ring. A client that sends and
    does not read fills its socket: the held echo that meets it is taken in
    part or not at all, the rest is kept as ciphertext owed, and every echo
    reaches it in order, each record intact, once it reads."""
    from io_uring_probe import io_uring_unavailable

    if why := io_uring_unavailable():
        pytest.skip(f"io_uring unavailable here ({why}): no send ring to go through")
    srv, cert, _ = tls_server("--threads", "1", "--max-queue", "16MiB")
    ctx = client_context(cert, version)

    def stats() -> dict:
        return httpx.get(f"https://127.0.0.1:{srv.port}/api/stats", verify=ctx, timeout=5).json()

    before = stats()

    async def busy() -> None:
        async def one(k: int) -> None:
            async with websockets.connect(f"wss://127.0.0.1:{srv.port}/echo", ssl=ctx) as ws:
                for i in range(50):
                    await ws.send(f"{k}:{i}")
                    assert await ws.recv() == f"{k}:{i}"

        await asyncio.gather(*(one(k) for k in range(8)))

    asyncio.run(busy())
    after = stats()
    assert after["io_uring_sends"] - before["io_uring_sends"] >= 8 * 50, (before, after, srv.describe())

    # 4.8 MB of echoes to a 4 KiB receive buffer: more than the server's
    # socket can take (net.ipv4.tcp_wmem's most is 4 MiB) before it reads.
    stalled = upgraded_with_a_small_buffer(srv.port, ctx, "/echo")
    # The server reads on while its answers wait (up to --max-queue), so
    # everything can be sent before anything is read. One at a time, so that
    # each echo is held alone in its turn (a second one in the same turn is
    # queued behind it and its writer sends both) and it is a held one, sent
    # through the ring, that meets the full socket.
    messages, body = 400, b"e" * 12_000
    for i in range(messages):
        stalled.send(rawws.encode_frame(rawws.OP_TEXT, b"%d:" % i + body))
        time.sleep(0.003)
    time.sleep(0.5)  # the server echoes into a socket nobody reads
    for i in range(messages):
        opcode, data = stalled.read_message(timeout=20)
        assert opcode == rawws.OP_TEXT and data == b"%d:" % i + body, (i, opcode, data[:40])
    stalled.close()
    assert "panicked" not in srv.stderr(), srv.describe()
