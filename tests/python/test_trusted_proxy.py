"""--trusted-proxy: X-Forwarded-For is believed only from the named peers, and the
client it names is who the publish rule and the per-IP limit see. Straight to
throng with the header written by hand, and through nginx with deploy/nginx.conf
(which sets the header), clients coming from different loopback addresses."""

from __future__ import annotations

import socket

from procs import Nginx
from rawws import RawConn, http_request, upgrade_request
from support.nginx import fronting

SPOOFED = [("X-Forwarded-For", "203.0.113.7")]


def publish_status(port: int, headers: list[tuple[str, str]]) -> int:
    resp = http_request(
        port, "POST", "/api/publish/news", b"hi", headers + [("Content-Type", "text/plain")]
    )
    return resp.status


def test_the_header_counts_only_from_a_trusted_peer(start_server):
    plain = start_server()
    # Not trusted: the header is ignored, a loopback peer may publish.
    assert publish_status(plain.port, SPOOFED) == 200
    trusting = start_server("--trusted-proxy", "127.0.0.1")
    # From the trusted proxy, the client it names is not loopback: no publishing
    # without --api-key.
    resp = http_request(
        trusting.port, "POST", "/api/publish/news", b"hi", SPOOFED + [("Content-Type", "text/plain")]
    )
    assert resp.status == 403, resp
    assert "loopback" in resp.json()["error"], resp
    # Without the header the proxy itself is the client.
    assert publish_status(trusting.port, []) == 200
    # A peer that is not the trusted one is not believed.
    other = http_request(
        trusting.port, "POST", "/api/publish/news", b"hi",
        SPOOFED + [("Content-Type", "text/plain")], source="127.0.0.9",
    )
    assert other.status == 200, other


def test_a_bad_trusted_proxy_is_a_clear_error(start_server):
    srv = start_server("--trusted-proxy", "10.0.0.0/33", wait=False)
    assert srv.proc.wait(timeout=30) != 0
    err = srv.stderr()
    assert "10.0.0.0/33" in err and "not an IP address or network" in err, err


def open_ws(port: int, source: str) -> tuple[socket.socket, int]:
    """A WebSocket upgrade to `port` from `source`; returns the socket and status."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    conn = RawConn.__new__(RawConn)
    conn.sock, conn.buf, conn.timeout = sock, b"", 10
    req, _ = upgrade_request(path="/ws/room", host=f"127.0.0.1:{port}")
    conn.send(req)
    return sock, conn.read_http_response(timeout=10).status


def test_behind_nginx_the_per_ip_limit_counts_each_client(start_server):
    node = start_server("--trusted-proxy", "127.0.0.1", "--max-conns-per-ip", "1")
    proxy = Nginx(fronting([node.port]))
    held = []
    try:
        for source in ("127.0.0.5", "127.0.0.6"):
            sock, status = open_ws(proxy.port, source)
            held.append(sock)
            assert status == 101, (source, status, proxy.describe())
        # A second connection of one client is over its limit.
        sock, status = open_ws(proxy.port, "127.0.0.5")
        held.append(sock)
        assert status == 429, status
    finally:
        for sock in held:
            sock.close()
        proxy.stop()
