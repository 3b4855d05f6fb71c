"""HTTP/1.1 keep-alive on the API: a publisher reuses one connection for many
requests (and may pipeline them); errors and HTTP/1.0 close the connection."""

from __future__ import annotations

import http.client
import socket
import time


def test_many_publishes_over_one_connection(start_server):
    srv = start_server()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    for i in range(1, 51):
        conn.request("POST", "/api/publish/ka", body=f"m{i}", headers={"Content-Type": "text/plain"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Connection") == "keep-alive"
        assert resp.read() == f'{{"seq":{i}}}'.encode()
    conn.request("GET", "/api/channels/ka")
    resp = conn.getresponse()
    assert resp.status == 200 and b'"last_seq":50' in resp.read()
    conn.close()


def test_pipelined_requests_are_answered_in_order(start_server):
    srv = start_server()
    one = b"POST /api/publish/pipe HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\na"
    last = b"GET /api/channels/pipe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(one * 3 + last)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 4, data
    for seq in (1, 2, 3):
        assert f'{{"seq":{seq}}}'.encode() in data
    assert data.index(b'{"seq":1}') < data.index(b'{"seq":2}') < data.index(b'{"seq":3}')
    assert data.endswith(b'"last_seq":3,"subscribers":0}')  # then the server closed


def test_errors_and_http10_close_the_connection(start_server):
    srv = start_server()
    for request in (
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(request)
            data = b""
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            assert b"Connection: close" in data, data


def test_idle_kept_alive_connection_is_closed_after_the_handshake_timeout(start_server):
    # --idle-timeout (120s) is far beyond the wait below: a close within it is the
    # handshake timeout's, however slow the machine.
    srv = start_server("--handshake-timeout", "1s", "--idle-timeout", "120s")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = s.recv(65536)
        assert b"200 OK" in first and b"keep-alive" in first
        s.settimeout(60)
        try:
            rest = s.recv(65536)  # blocks until the server closes the idle connection
        except TimeoutError:
            raise AssertionError("the idle kept-alive connection was still open 60s later (handshake timeout 1s)")
        assert rest == b""
