"""Channels: /ws/{channel} subscriptions (raw and json), per-channel seq,
push-only 1008, channel-name and format validation (400), /api/channels."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from rawws import (
    assert_json_error,
    channel_info,
    http_exchange,
    publish,
    publish_ok,
    upgrade_request,
    wait_subscribers,
    without_epoch,
)
from wsutil import expect_closed, expect_silence, received_close_code, recv_json, run, ws_connect




# ---------------------------------------------------------------- raw / json delivery


def test_raw_subscriber_gets_text_and_binary_payloads(start_server):
    srv = start_server()

    async def main():
        async with ws_connect(srv.url("/ws/news")) as raw, ws_connect(srv.url("/ws/news?format=raw")) as raw2:
            wait_subscribers(srv.port, "news", 2)
            assert publish_ok(srv.port, "news", "hello ✓") == 1
            assert publish_ok(srv.port, "news", b"\x00\x01\xff binary") == 2
            # No Content-Type at all => binary.
            assert publish_ok(srv.port, "news", b"no type", content_type=None) == 3
            # Any text/* type => text.
            assert publish_ok(srv.port, "news", b"<b>html</b>", content_type="text/html") == 4
            # Non-text types => binary, even if the bytes are valid UTF-8.
            assert publish_ok(srv.port, "news", b'{"a":1}', content_type="application/json") == 5
            expected = ["hello ✓", b"\x00\x01\xff binary", b"no type", "<b>html</b>", b'{"a":1}']
            for ws in (raw, raw2):
                for want in expected:
                    got = await asyncio.wait_for(ws.recv(), 5)
                    assert type(got) is type(want) and got == want, f"raw subscriber: got {got!r}, want {want!r}"
                await expect_silence(ws)

    run(main())


def test_json_subscriber_gets_envelopes_text_and_base64(start_server):
    srv = start_server()

    async def main():
        async with ws_connect(srv.url("/ws/feed.v1?format=json")) as ws:
            wait_subscribers(srv.port, "feed.v1", 1)
            publish_ok(srv.port, "feed.v1", 'text "quoted" ✓')
            payload = bytes(range(256))
            publish_ok(srv.port, "feed.v1", payload)

            m = await recv_json(ws)
            assert m == {"channel": "feed.v1", "seq": 1, "data": 'text "quoted" ✓'}, m
            m = await recv_json(ws)
            assert set(m) == {"channel", "seq", "data", "encoding"}, m
            assert m["channel"] == "feed.v1" and m["seq"] == 2 and m["encoding"] == "base64", m
            assert base64.b64decode(m["data"], validate=True) == payload, m
            await expect_silence(ws)

    run(main())


def test_seq_increases_by_one_for_every_subscriber(start_server):
    n = 60
    srv = start_server()

    async def main():
        raws = [await ws_connect(srv.url("/ws/ticks")) for _ in range(2)]
        jsons = [await ws_connect(srv.url("/ws/ticks?format=json")) for _ in range(2)]
        try:
            wait_subscribers(srv.port, "ticks", 4)
            seqs = []
            for i in range(n):
                data = f"tick {i}" if i % 3 else f"bin {i}".encode()
                seqs.append(publish_ok(srv.port, "ticks", data))
            assert seqs == list(range(1, n + 1)), f"publish answers must be seq 1..{n}: {seqs}"
            for ws in raws:
                for i in range(n):
                    got = await asyncio.wait_for(ws.recv(), 5)
                    want = f"tick {i}" if i % 3 else f"bin {i}".encode()
                    assert got == want, f"raw message {i}: got {got!r}, want {want!r}"
            for ws in jsons:
                for i in range(n):
                    m = await recv_json(ws)
                    assert m["seq"] == i + 1, f"json message {i}: seq {m.get('seq')}, want {i + 1} (no gaps): {m}"
                    if i % 3:
                        assert m["data"] == f"tick {i}" and "encoding" not in m, m
                    else:
                        assert m.get("encoding") == "base64", m
                        assert base64.b64decode(m["data"]) == f"bin {i}".encode(), m
            info = channel_info(srv.port, "ticks")
            assert without_epoch(info) == {
                "channel": "ticks",
                "subscribers": 4,
                "last_seq": n,
                "history_len": min(n, 100),
            }, info
        finally:
            for ws in raws + jsons:
                await ws.close()

    run(main())


def test_seq_is_per_channel_and_channels_are_isolated(start_server):
    srv = start_server()

    async def main():
        async with ws_connect(srv.url("/ws/alpha?format=json")) as a, ws_connect(srv.url("/ws/beta?format=json")) as b:
            wait_subscribers(srv.port, "alpha", 1)
            wait_subscribers(srv.port, "beta", 1)
            assert publish_ok(srv.port, "alpha", "a1") == 1
            assert publish_ok(srv.port, "alpha", "a2") == 2
            assert publish_ok(srv.port, "beta", "b1") == 1, "seq is per channel"
            assert publish_ok(srv.port, "gamma", "nobody listens") == 1
            assert publish_ok(srv.port, "alpha", "a3") == 3
            got_a = [await recv_json(a) for _ in range(3)]
            assert [(m["channel"], m["seq"], m["data"]) for m in got_a] == [
                ("alpha", 1, "a1"),
                ("alpha", 2, "a2"),
                ("alpha", 3, "a3"),
            ], got_a
            m = await recv_json(b)
            assert (m["channel"], m["seq"], m["data"]) == ("beta", 1, "b1"), m
            await expect_silence(a)
            await expect_silence(b)

    run(main())


def test_late_subscriber_gets_only_new_messages(start_server):
    srv = start_server()
    publish_ok(srv.port, "late", "before")

    async def main():
        async with ws_connect(srv.url("/ws/late?format=json")) as ws:
            wait_subscribers(srv.port, "late", 1)
            publish_ok(srv.port, "late", "after")
            m = await recv_json(ws)
            assert m == {"channel": "late", "seq": 2, "data": "after"}, m

    run(main())


# ---------------------------------------------------------------- push-only


@pytest.mark.parametrize(
    "path,frame",
    [
        ("/ws/news", "text"),
        ("/ws/news", b"binary"),
        ("/ws/news?format=json", "json text"),
        ("/ws/notchat:room", "a colon is not the chat namespace"),
        ("/ws/chatroom", "prefix without colon is not chat"),
    ],
)
def test_data_frame_on_push_only_channel_gets_1008(start_server, path, frame):
    srv = start_server()

    async def main():
        async with ws_connect(srv.url(path)) as ws:
            await ws.send(frame)
            exc = await expect_closed(ws)
            assert received_close_code(exc) == 1008, f"expected close 1008, got {exc!r}"
            assert "push-only" in exc.rcvd.reason.lower(), f"reason should mention push-only: {exc.rcvd.reason!r}"

    run(main())


def test_push_only_violation_does_not_affect_other_subscribers(start_server):
    srv = start_server()

    async def main():
        async with ws_connect(srv.url("/ws/news")) as bad, ws_connect(srv.url("/ws/news")) as good:
            wait_subscribers(srv.port, "news", 2)
            await bad.send("not allowed")
            exc = await expect_closed(bad)
            assert received_close_code(exc) == 1008, exc
            wait_subscribers(srv.port, "news", 1)
            publish_ok(srv.port, "news", "still here")
            assert await asyncio.wait_for(good.recv(), 5) == "still here"

    run(main())


def test_ping_on_push_only_channel_is_fine(start_server):
    """Control frames are not data frames: a ping must be answered, not punished."""
    srv = start_server()

    async def main():
        async with ws_connect(srv.url("/ws/news")) as ws:
            pong = await ws.ping(b"hi")
            await asyncio.wait_for(pong, 5)
            wait_subscribers(srv.port, "news", 1)
            publish_ok(srv.port, "news", "after ping")
            assert await asyncio.wait_for(ws.recv(), 5) == "after ping"

    run(main())


# ---------------------------------------------------------------- handshake validation


def _upgrade(port, path: str | bytes):
    """Raw upgrade request to `path` (bytes are inserted verbatim, e.g. non-ASCII)."""
    req, _ = upgrade_request(path="/PATH_PLACEHOLDER", host=f"127.0.0.1:{port}")
    p = path if isinstance(path, bytes) else path.encode("ascii")
    return http_exchange(port, req.replace(b"/PATH_PLACEHOLDER", p))


VALID_CHARS = "AZaz09_-.:@"


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/ws/", id="empty"),
        pytest.param("/ws/" + "a" * 201, id="201-bytes"),
        pytest.param("/ws/a%20b", id="space-encoded"),
        pytest.param("/ws/a/b", id="slash"),
        pytest.param("/ws/a%2Fb", id="slash-encoded"),
        pytest.param("/ws/100%", id="percent"),
        pytest.param("/ws/caf%C3%A9", id="non-ascii-encoded"),
        pytest.param("/ws/café".encode("utf-8"), id="non-ascii-raw-utf8"),
        pytest.param("/ws/a+b", id="plus"),
        pytest.param("/ws/a*b", id="star"),
        pytest.param("/ws/a!b", id="bang"),
        pytest.param("/ws/a#b", id="hash"),
        pytest.param("/ws/a~b", id="tilde"),
        pytest.param("/ws/a$b", id="dollar"),
        pytest.param("/ws/a%00b", id="nul-encoded"),
    ],
)
def test_bad_channel_name_is_400(shared_server, path):
    resp = _upgrade(shared_server.port, path)
    assert_json_error(resp, 400, "channel name")


@pytest.mark.parametrize(
    "name", ["a" * 200, "a,b;c=d", "x", VALID_CHARS, "chat:room-1", "user@example.com", "a.b.c", "--", "::", "@"]
)
def test_valid_channel_names_are_accepted(shared_server, name):
    resp = _upgrade(shared_server.port, f"/ws/{name}")
    assert resp.status == 101, resp


@pytest.mark.parametrize("fmt", ["xml", "RAWX", "jsonp", ""])
def test_bad_format_is_400(shared_server, fmt):
    resp = _upgrade(shared_server.port, f"/ws/news?format={fmt}")
    assert_json_error(resp, 400, "format must be raw or json")


@pytest.mark.parametrize("fmt", ["raw", "json"])
def test_good_formats_are_accepted(shared_server, fmt):
    resp = _upgrade(shared_server.port, f"/ws/news?format={fmt}")
    assert resp.status == 101, resp


# ---------------------------------------------------------------- /api/channels


def test_channel_info_for_unused_channel_is_zero(shared_server):
    assert channel_info(shared_server.port, "never-used-anywhere") == {
        "channel": "never-used-anywhere",
        "subscribers": 0,
        "last_seq": 0,
        "history_len": 0,
        "epoch": None,
    }


def test_channel_info_counts_subscribers_and_last_seq(start_server):
    srv = start_server()

    async def main():
        a = await ws_connect(srv.url("/ws/info"))
        b = await ws_connect(srv.url("/ws/info?format=json"))
        try:
            info = wait_subscribers(srv.port, "info", 2)
            epoch = info["epoch"]
            assert without_epoch(info) == {"channel": "info", "subscribers": 2, "last_seq": 0, "history_len": 0}, info
            for i in range(3):
                publish_ok(srv.port, "info", f"m{i}")
            for ws in (a, b):
                for _ in range(3):
                    await asyncio.wait_for(ws.recv(), 5)
            info = channel_info(srv.port, "info")
            assert info == {"channel": "info", "subscribers": 2, "last_seq": 3, "history_len": 3, "epoch": epoch}, info
            await a.close()
            info = wait_subscribers(srv.port, "info", 1)
            assert info["last_seq"] == 3, info
            await b.close()
            info = wait_subscribers(srv.port, "info", 0)
            assert info == {"channel": "info", "subscribers": 0, "last_seq": 3, "history_len": 3, "epoch": epoch}, info
        finally:
            await a.close()
            await b.close()

    run(main())


def test_channel_info_publish_without_subscribers_advances_last_seq(start_server):
    srv = start_server()
    for i in range(5):
        publish_ok(srv.port, "lonely", f"{i}")
    info = channel_info(srv.port, "lonely")
    assert without_epoch(info) == {"channel": "lonely", "subscribers": 0, "last_seq": 5, "history_len": 5}, info


def test_channel_info_bad_name_is_400(shared_server):
    from rawws import http_request

    resp = http_request(shared_server.port, "GET", "/api/channels/a%20b")
    assert_json_error(resp, 400, "channel name")


def test_channel_info_body_is_json(shared_server):
    from rawws import http_request

    resp = http_request(shared_server.port, "GET", "/api/channels/x")
    assert resp.status == 200, resp
    assert (resp.header("content-type") or "").lower().startswith("application/json"), resp
    json.loads(resp.body)
