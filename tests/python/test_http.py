"""Plain HTTP endpoints: /healthz, 404/405/426, JSON error bodies."""

from __future__ import annotations

import pytest

from rawws import assert_json_error, http_exchange


def get(port, path, method="GET", extra=""):
    req = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode()
    return http_exchange(port, req)




def test_healthz_returns_200_ok(shared_server):
    resp = get(shared_server.port, "/healthz")
    assert resp.status == 200, resp
    assert resp.body.strip() == b"ok", resp


def test_healthz_post_is_405_json(shared_server):
    resp = get(shared_server.port, "/healthz", method="POST", extra="Content-Length: 0\r\n")
    assert_json_error(resp, 405)


def test_echo_post_is_405_json(shared_server):
    resp = get(shared_server.port, "/echo", method="POST", extra="Content-Length: 0\r\n")
    assert_json_error(resp, 405)


@pytest.mark.parametrize("path", ["/nope", "/echo/extra", "/healthzz"])
def test_unknown_path_is_404_json(shared_server, path):
    resp = get(shared_server.port, path)
    assert_json_error(resp, 404)


def test_unknown_path_with_upgrade_is_404(shared_server):
    port = shared_server.port
    req = (
        f"GET /nope HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    resp = http_exchange(port, req)
    assert_json_error(resp, 404)


def test_get_echo_without_upgrade_is_426_with_upgrade_header(shared_server):
    resp = get(shared_server.port, "/echo")
    assert_json_error(resp, 426)
    assert (resp.header("upgrade") or "").lower() == "websocket", resp


def test_get_root_without_upgrade_is_the_dashboard(shared_server):
    resp = get(shared_server.port, "/")
    assert resp.status == 200, resp
    assert resp.header("content-type").startswith("text/html"), resp
    assert b"/throng.js" in resp.body, "the dashboard loads the browser client"


@pytest.mark.parametrize("path,kind", [("/chat", "text/html"), ("/throng.js", "text/javascript")])
def test_pages_are_served_with_their_types(shared_server, path, kind):
    resp = get(shared_server.port, path)
    assert resp.status == 200, resp
    assert resp.header("content-type").startswith(kind), resp
    resp = get(shared_server.port, path, method="POST")
    assert resp.status == 405, resp


def test_error_response_closes_connection(shared_server):
    from rawws import RawConn

    with RawConn(shared_server.port) as c:
        c.send(b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        resp = c.read_http_response()
        assert resp.status == 404
        rest = c.wait_closed(timeout=5)
        assert rest == b"", f"unexpected bytes after error response: {rest!r}"


@pytest.mark.parametrize("pieces", [1, 50])
def test_a_request_head_over_16_kib_is_431_however_it_arrives(shared_server, pieces):
    """100 KB of headers in one write or in 50 writes: 431 either way, never 200."""
    from rawws import RawConn

    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    with RawConn(shared_server.port) as c:
        step = -(-len(head) // pieces)
        try:
            for i in range(0, len(head), step):
                c.send(head[i : i + step])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before the last piece
        resp = c.read_http_response(timeout=5)
    assert resp.status == 431, resp
