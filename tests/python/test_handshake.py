"""WebSocket upgrade handshake: valid variants, and each malformed upgrade."""

from __future__ import annotations

import base64

import pytest

from rawws import OP_TEXT, accept_key, assert_json_error, http_exchange, upgrade_request, ws_connect
from wsutil import run, ws_connect as client_connect


def test_valid_handshake_returns_101_with_accept(shared_server):
    c = ws_connect(shared_server.port)  # asserts 101 + Sec-WebSocket-Accept
    try:
        resp = c.handshake_response
        assert (resp.header("upgrade") or "").lower() == "websocket", resp
        assert "upgrade" in (resp.header("connection") or "").lower(), resp
        c.send_frame(OP_TEXT, b"hi")
        assert c.read_message() == (OP_TEXT, b"hi")
    finally:
        c.close()


def test_rfc_sample_key_accept_value(shared_server):
    # RFC 6455 section 1.3 sample nonce.
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    req, _ = upgrade_request(host="127.0.0.1", key=key)
    from rawws import RawConn

    with RawConn(shared_server.port) as c:
        c.send(req)
        resp = c.read_http_response()
    assert resp.status == 101, resp
    assert resp.header("sec-websocket-accept") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", resp


def test_handshake_on_root_path(shared_server):
    c = ws_connect(shared_server.port, path="/")
    try:
        c.send_frame(OP_TEXT, b"root")
        assert c.read_message() == (OP_TEXT, b"root")
    finally:
        c.close()


def test_headers_case_insensitive_and_connection_list(shared_server):
    port = shared_server.port
    key = base64.b64encode(b"0123456789abcdef").decode()
    req = (
        f"GET /echo HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nUPGRADE: WebSocket\r\n"
        f"connection: keep-alive, Upgrade\r\nsec-websocket-key: {key}\r\nSEC-WEBSOCKET-VERSION: 13\r\n\r\n"
    ).encode()
    from rawws import RawConn

    with RawConn(port) as c:
        c.send(req)
        resp = c.read_http_response()
        assert resp.status == 101, resp
        assert resp.header("sec-websocket-accept") == accept_key(key), resp
        c.send_frame(OP_TEXT, b"case")
        assert c.read_message() == (OP_TEXT, b"case")


def test_permessage_deflate_offer_is_declined(shared_server):
    c = ws_connect(
        shared_server.port,
        extra=[("Sec-WebSocket-Extensions", "permessage-deflate; client_max_window_bits")],
    )
    try:
        assert c.handshake_response.header("sec-websocket-extensions") is None, c.handshake_response
        c.send_frame(OP_TEXT, b"plain")
        assert c.read_message() == (OP_TEXT, b"plain")
    finally:
        c.close()


def test_websockets_client_offering_compression_gets_no_extension(shared_server):
    async def main():
        async with client_connect(shared_server.url(), compression="deflate") as ws:
            assert ws.response.status_code == 101
            assert "Sec-WebSocket-Extensions" not in ws.response.headers
            await ws.send("uncompressed")
            assert await ws.recv() == "uncompressed"

    run(main())


BAD_UPGRADES = {
    "missing-key": (dict(key=None), "Sec-WebSocket-Key"),
    "key-not-base64": (dict(key="not base64!!"), "Sec-WebSocket-Key"),
    "key-15-bytes": (dict(key=base64.b64encode(b"x" * 15).decode()), "Sec-WebSocket-Key"),
    "key-17-bytes": (dict(key=base64.b64encode(b"x" * 17).decode()), "Sec-WebSocket-Key"),
    "connection-without-upgrade-token": (dict(connection="keep-alive"), "Connection"),
    "missing-connection": (dict(connection=None), "Connection"),
    "upgrade-not-websocket": (dict(upgrade="h2c"), "Upgrade"),
    "missing-version": (dict(version=None), "Sec-WebSocket-Version"),
    "http-1.0": (dict(http_version="HTTP/1.0"), "HTTP/1.1"),
    "missing-host": (dict(host=None), "Host"),
}


@pytest.mark.parametrize("case", list(BAD_UPGRADES), ids=list(BAD_UPGRADES))
def test_malformed_upgrade_is_400_naming_the_header(shared_server, case):
    kwargs, needle = BAD_UPGRADES[case]
    req, _ = upgrade_request(**kwargs)
    resp = http_exchange(shared_server.port, req)
    assert_json_error(resp, 400, needle)


@pytest.mark.parametrize(
    "garbage",
    [b"hello there\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"GET\r\n\r\n"],
    ids=["two-words", "tls-clienthello", "method-only"],
)
def test_non_http_garbage_is_400_malformed(shared_server, garbage):
    resp = http_exchange(shared_server.port, garbage)
    assert_json_error(resp, 400, "malformed")


def test_version_12_is_426_with_version_13_header(shared_server):
    req, _ = upgrade_request(version="12")
    resp = http_exchange(shared_server.port, req)
    assert_json_error(resp, 426)
    assert (resp.header("sec-websocket-version") or "").strip() == "13", resp
