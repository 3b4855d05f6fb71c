"""POST /api/publish/{channel}: API key (401/200), loopback-only without a key,
413 over --max-message-size, 405 on GET, 400 on bad names / non-UTF-8 text,
and GET /api/stats."""

from __future__ import annotations

import asyncio

import pytest

from conftest import can_bind
from rawws import assert_json_error, channel_info, http_exchange, http_request, publish, publish_ok, settled, wait_subscribers
from wsutil import expect_silence, run, ws_connect


# ---------------------------------------------------------------- API key


def test_api_key_missing_wrong_and_right(start_server):
    srv = start_server("--api-key", "s3cret-KEY")

    async def main():
        async with ws_connect(srv.url("/ws/keyed")) as ws:
            wait_subscribers(srv.port, "keyed", 1)
            # missing
            assert_json_error(publish(srv.port, "keyed", "no key"), 401)
            # wrong key
            assert_json_error(publish(srv.port, "keyed", "wrong", api_key="nope"), 401)
            # right key with a different scheme
            resp = publish(srv.port, "keyed", "basic", headers=[("Authorization", "Basic s3cret-KEY")])
            assert_json_error(resp, 401)
            # key as a prefix / with extra characters
            assert_json_error(publish(srv.port, "keyed", "prefix", api_key="s3cret"), 401)
            assert_json_error(publish(srv.port, "keyed", "longer", api_key="s3cret-KEYX"), 401)
            # right key
            resp = publish(srv.port, "keyed", "authorized", api_key="s3cret-KEY")
            assert resp.status == 200, resp
            assert resp.json() == {"seq": 1}, f"rejected publishes must not take a seq: {resp!r}"
            assert await asyncio.wait_for(ws.recv(), 5) == "authorized"
            await expect_silence(ws)

    run(main())


def test_api_key_from_env(start_server):
    srv = start_server(env={"THRONG_API_KEY": "envkey"})
    assert_json_error(publish(srv.port, "e", "x"), 401)
    assert publish_ok(srv.port, "e", "x", api_key="envkey") == 1


def test_no_api_key_loopback_allowed(start_server):
    srv = start_server()
    resp = publish(srv.port, "open", "from 127.0.0.1")
    assert resp.status == 200, resp
    assert resp.json() == {"seq": 1}
    assert (resp.header("content-type") or "").lower().startswith("application/json"), resp
    # A bearer header is harmless when the server has no key.
    assert publish_ok(srv.port, "open", "with header", api_key="whatever") == 2


@pytest.mark.skipif(not can_bind("127.0.0.2"), reason="127.0.0.2 not usable as a source address")
def test_no_api_key_any_127_address_is_loopback(start_server):
    srv = start_server()
    resp = http_request(
        srv.port, "POST", "/api/publish/open", b"hi", [("Content-Type", "text/plain")], source="127.0.0.2"
    )
    assert resp.status == 200, resp


# ---------------------------------------------------------------- body rules


def test_body_over_max_message_size_is_413(start_server):
    srv = start_server("--max-message-size", "1024")

    async def main():
        async with ws_connect(srv.url("/ws/size")) as ws:
            wait_subscribers(srv.port, "size", 1)
            assert publish_ok(srv.port, "size", b"x" * 1024) == 1, "exactly the limit is allowed"
            assert_json_error(publish(srv.port, "size", b"y" * 1025), 413)
            assert_json_error(publish(srv.port, "size", "z" * 2000), 413)
            assert await asyncio.wait_for(ws.recv(), 5) == b"x" * 1024
            await expect_silence(ws)
            assert channel_info(srv.port, "size")["last_seq"] == 1

    run(main())


def test_body_over_default_64kib_is_413(start_server):
    srv = start_server()
    assert publish_ok(srv.port, "big", b"a" * 65536) == 1
    assert_json_error(publish(srv.port, "big", b"a" * 65537), 413)


def test_get_on_publish_is_405(shared_server):
    resp = http_request(shared_server.port, "GET", "/api/publish/news")
    assert_json_error(resp, 405)


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
def test_other_methods_on_publish_are_405(shared_server, method):
    resp = http_request(shared_server.port, method, "/api/publish/news", b"")
    assert_json_error(resp, 405)


@pytest.mark.parametrize(
    "name",
    ["a%20b", "a" * 201, "caf%C3%A9", "100%", "a%2Fb", "a*b"],
    ids=["space", "201-bytes", "non-ascii", "percent", "slash-encoded", "star"],
)
def test_publish_bad_channel_name_is_400(shared_server, name):
    resp = publish(shared_server.port, name, "x")
    assert_json_error(resp, 400, "channel name")


def test_publish_empty_channel_name_is_400(shared_server):
    resp = http_request(shared_server.port, "POST", "/api/publish/", b"x", [("Content-Type", "text/plain")])
    assert resp.status in (400, 404), resp
    assert_json_error(resp, resp.status)


def test_text_body_that_is_not_utf8_is_400(shared_server):
    resp = publish(shared_server.port, "utf", b"\xff\xfe bad", content_type="text/plain")
    assert_json_error(resp, 400)
    # the same bytes as binary are fine
    resp = publish(shared_server.port, "utf", b"\xff\xfe bad", content_type="application/octet-stream")
    assert resp.status == 200, resp


def test_chunked_body_without_content_length_is_rejected(shared_server):
    """Content-Length is required: a chunked body must be refused (4xx, e.g. 411),
    not published (as an empty or a garbled message)."""
    port = shared_server.port
    req = (
        f"POST /api/publish/chunky HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: text/plain\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    ).encode()
    resp = http_exchange(port, req)
    assert 400 <= resp.status < 500, f"chunked body without Content-Length must be refused: {resp!r}"
    assert_json_error(resp, resp.status)
    assert channel_info(port, "chunky")["last_seq"] == 0, "nothing may be published"


def test_empty_body_publish(start_server):
    srv = start_server()

    async def main():
        async with ws_connect(srv.url("/ws/empty")) as ws:
            wait_subscribers(srv.port, "empty", 1)
            assert publish_ok(srv.port, "empty", "") == 1
            assert await asyncio.wait_for(ws.recv(), 5) == ""

    run(main())


# ---------------------------------------------------------------- stats


def test_api_stats_shape(start_server):
    srv = start_server()

    async def main():
        async with ws_connect(srv.url("/ws/s1")) as a, ws_connect(srv.url("/ws/s2?format=json")) as b:
            wait_subscribers(srv.port, "s1", 1)
            wait_subscribers(srv.port, "s2", 1)
            publish_ok(srv.port, "s1", "x")
            await asyncio.wait_for(a.recv(), 5)
            resp = settled(lambda: http_request(srv.port, "GET", "/api/stats"),
                           lambda r: r.status == 200 and r.json().get("messages_out", 0) >= 1)
            assert resp.status == 200, resp
            st = resp.json()
            assert st.get("connections", {}).get("websocket") == 2, st
            assert st.get("broker") == "memory", st
            for key in ("channels", "messages_in", "messages_out", "uptime_seconds"):
                assert isinstance(st.get(key), (int, float)), f"{key} missing or not a number: {st}"
            assert st["channels"] >= 2, st
            assert st["messages_out"] >= 1, st
            assert st["uptime_seconds"] >= 0, st
            del b

    run(main())
