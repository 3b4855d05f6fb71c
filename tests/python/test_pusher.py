"""The Pusher Channels protocol (issue 26), tested with clients throng did not
write: pusher-js 8 from npm (in Node, tests/node/pusher_client.mjs), the official
Node server SDK `pusher` signing private-channel auth, and the official Python SDK
`pusher` (PyPI) publishing and querying through the signed HTTP API. Bad input
comes from raw sockets and hand-signed requests: each gets Pusher's error and
disturbs nothing else. Two nodes through a real Redis deliver each other's events."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time

import pusher
import pytest

from browser import browser, pages  # noqa: F401 (fixtures)
from rawws import assert_json_error, http_request, publish_ok
from support.wait import wait_healthy
from wsutil import expect_closed, received_close_code, recv_json, run, ws_connect

# The nodes on Redis run the timers tests wait on (the keeper, the node TTL) at
# a tenth (--test-time-scale, testing only): a dead node's users leave after 3 s.
TIME_SCALE = 0.1
SCALED = ("--test-time-scale", str(TIME_SCALE))
from support.pusher import APP, APP_ID, eventually, KEY, NODE_DIR, post_signed, sdk, SECRET, signed, user


@pytest.fixture
def app_server(start_server):
    return start_server("--pusher-app", APP)


# ------------------------------------------------------------------ connecting


def test_pusher_js_connects_and_is_given_a_socket_id(app_server, clients):
    c = clients(app_server.port)
    socket_id = c.connected()
    assert re.fullmatch(r"\d+\.\d+", socket_id), socket_id


@pytest.mark.parametrize(
    "path,code",
    [("/app/no-such-key?protocol=7", 4001), (f"/app/{KEY}?protocol=4", 4007), (f"/app/{KEY}", 4007)],
    ids=["unknown-key", "old-protocol", "no-protocol"],
)
def test_refused_connections_get_pushers_error_code_and_close(app_server, path, code):
    async def body():
        async with ws_connect(f"ws://127.0.0.1:{app_server.port}{path}") as ws:
            error = await recv_json(ws)
            assert error["event"] == "pusher:error" and error["data"]["code"] == code, error
            closed = await expect_closed(ws)
            assert received_close_code(closed) == code

    run(body())


def test_pusher_ping_is_answered_and_bad_frames_get_errors_without_closing(app_server):
    async def body():
        async with ws_connect(f"ws://127.0.0.1:{app_server.port}/app/{KEY}?protocol=7") as ws:
            hello = await recv_json(ws)
            assert hello["event"] == "pusher:connection_established"
            data = json.loads(hello["data"])
            assert data["activity_timeout"] == 120 and re.fullmatch(r"\d+\.\d+", data["socket_id"])
            for bad, says in [("not json", "JSON object"), ("[1,2]", "JSON object"),
                              ('{"data":{}}', "event"), ('{"event":"nope:x"}', "unknown event"),
                              ('{"event":"pusher:subscribe","data":{}}', "data.channel"),
                              ('{"event":"client-x","channel":"private-a","data":{}}', "client events")]:
                await ws.send(bad)
                error = await recv_json(ws)
                assert error["event"] == "pusher:error" and says in error["data"]["message"], (bad, error)
            await ws.send(b"\x00\x01")
            error = await recv_json(ws)
            assert error["event"] == "pusher:error" and "binary" in error["data"]["message"]
            await ws.send(json.dumps({"event": "pusher:ping", "data": {}}))
            assert (await recv_json(ws))["event"] == "pusher:pong"

    run(body())


# ------------------------------------------------------------------ channels


def test_events_from_the_python_sdk_reach_pusher_js_on_public_and_private_channels(app_server, clients):
    c = clients(app_server.port)
    c.connected()
    assert c.subscribe("prices")["type"] == "subscribed"
    assert c.subscribe("private-orders")["type"] == "subscribed"
    api = sdk(app_server.port)
    assert api.trigger("prices", "tick", {"symbol": "ACME", "price": 12.5}) == {}
    assert c.event("prices", "tick")["data"] == {"symbol": "ACME", "price": 12.5}
    api.trigger(["prices", "private-orders"], "both", "plain text")
    assert c.event("prices", "both")["data"] == "plain text"
    assert c.event("private-orders", "both")["data"] == "plain text"
    api.trigger_batch([{"channel": "prices", "name": "b1", "data": "1"},
                       {"channel": "private-orders", "name": "b2", "data": "2"}])
    assert c.event("prices", "b1")["data"] == 1
    assert c.event("private-orders", "b2")["data"] == 2


def test_a_wrong_channel_signature_is_refused_and_the_connection_goes_on(app_server, clients):
    c = clients(app_server.port, bad_auth=True)
    c.connected()
    refused = c.subscribe("private-secret")
    assert refused["type"] == "subscription_error", refused
    assert refused["error"]["status"] == 401 and "signature" in refused["error"]["error"]
    assert c.subscribe("public")["type"] == "subscribed"
    sdk(app_server.port).trigger("public", "still", "here")
    assert c.event("public", "still")["data"] == "here"
    assert sdk(app_server.port).channel_info("private-secret", ["subscription_count"]) == {
        "occupied": False, "subscription_count": 0}


def test_unsubscribed_channels_get_nothing_more_and_counts_follow(app_server, clients):
    c = clients(app_server.port)
    c.connected()
    c.subscribe("a")
    c.subscribe("b")
    api = sdk(app_server.port)
    assert api.channel_info("a", ["subscription_count"])["subscription_count"] == 1
    c.send(op="unsubscribe", channel="a")
    c.expect(lambda r: r["type"] == "unsubscribed")
    eventually(lambda: api.channel_info("a", ["subscription_count"]), lambda v: v["subscription_count"] == 0)
    api.trigger("a", "late", "x")
    api.trigger("b", "marker", "y")
    c.event("b", "marker")
    assert not c.got("late")


def test_presence_members_come_and_go_once_per_user_however_many_connections(app_server, clients):
    port = app_server.port
    alice1 = clients(port, user=user("alice"))
    alice1.connected()
    joined = alice1.subscribe("presence-room")
    assert joined["type"] == "subscribed" and joined["members"] == {"alice": {"name": "Alice"}}
    assert joined["me"] == "alice"
    bob = clients(port, user=user("bob"))
    bob.connected()
    assert bob.subscribe("presence-room")["members"] == {"alice": {"name": "Alice"}, "bob": {"name": "Bob"}}
    assert alice1.expect(lambda r: r["type"] == "member_added")["id"] == "bob"
    alice2 = clients(port, user=user("alice"))
    alice2.connected()
    assert alice2.subscribe("presence-room")["count"] == 2
    api = sdk(port)
    assert api.channel_info("presence-room", ["user_count", "subscription_count"]) == {
        "occupied": True, "user_count": 2, "subscription_count": 3}
    assert sorted(u["id"] for u in api.users_info("presence-room")["users"]) == ["alice", "bob"]
    alice1.close()
    eventually(lambda: api.channel_info("presence-room", ["subscription_count"]),
            lambda v: v["subscription_count"] == 2)
    api.trigger("presence-room", "marker", "1")
    bob.event("presence-room", "marker")
    assert not [r for r in bob.log if r["type"] in ("member_added", "member_removed")]
    alice2.close()
    assert bob.expect(lambda r: r["type"] == "member_removed")["id"] == "alice"
    assert api.users_info("presence-room")["users"] == [{"id": "bob"}]


def test_a_full_presence_channel_refuses_a_new_user_but_not_a_known_ones_second_connection(start_server, clients):
    srv = start_server("--pusher-app", APP, "--pusher-max-presence-members", "2")
    for name in ("a", "b"):
        c = clients(srv.port, user=user(name))
        c.connected()
        assert c.subscribe("presence-small")["type"] == "subscribed"
    third = clients(srv.port, user=user("c"))
    third.connected()
    refused = third.subscribe("presence-small")
    assert refused["type"] == "subscription_error" and refused["error"]["status"] == 403, refused
    again = clients(srv.port, user=user("a"))
    again.connected()
    assert again.subscribe("presence-small")["count"] == 2


def test_presence_needs_signed_channel_data(app_server):
    async def body():
        ws, socket_id = await raw_pusher(app_server.port)
        data = json.dumps({"user_id": "u1"})
        cases = [
            ({"channel": "presence-x", "auth": channel_auth(socket_id, "presence-x")}, 401, "channel_data"),
            ({"channel": "presence-x", "auth": channel_auth(socket_id, "presence-x"), "channel_data": data},
             401, "signature"),
            ({"channel": "presence-x", "channel_data": "[]",
              "auth": channel_auth(socket_id, "presence-x:[]")}, 400, "JSON object"),
        ]
        for subscribe, status, says in cases:
            await ws.send(json.dumps({"event": "pusher:subscribe", "data": subscribe}))
            refused = await recv_json(ws)
            assert refused["event"] == "pusher:subscription_error", refused
            assert refused["data"]["status"] == status and says in refused["data"]["error"], refused
        good = {"channel": "presence-x", "channel_data": data, "auth": channel_auth(socket_id, f"presence-x:{data}")}
        await ws.send(json.dumps({"event": "pusher:subscribe", "data": good}))
        joined = await recv_json(ws)
        assert joined["event"] == "pusher_internal:subscription_succeeded"
        assert json.loads(joined["data"])["presence"] == {"count": 1, "ids": ["u1"], "hash": {"u1": None}}
        await ws.close()

    run(body())


# ------------------------------------------------------------------ client events and socket_id


def channel_auth(socket_id: str, channel: str) -> str:
    """`channel` is what is signed after the socket id: the name, and for a
    presence channel `name:channel_data`."""
    signature = hmac.new(SECRET.encode(), f"{socket_id}:{channel}".encode(), hashlib.sha256).hexdigest()
    return f"{KEY}:{signature}"


async def raw_pusher(port: int, private: str | None = None):
    """A raw Pusher connection (websockets), subscribed to `private` if given."""
    ws = await ws_connect(f"ws://127.0.0.1:{port}/app/{KEY}?protocol=7")
    hello = await recv_json(ws)
    socket_id = json.loads(hello["data"])["socket_id"]
    if private:
        await ws.send(json.dumps({"event": "pusher:subscribe",
                                  "data": {"channel": private, "auth": channel_auth(socket_id, private)}}))
        joined = await recv_json(ws)
        assert joined["event"] == "pusher_internal:subscription_succeeded", joined
    return ws, socket_id


@pytest.fixture
def events_server(start_server):
    return start_server("--pusher-app", APP, "--pusher-client-events", "on")


def test_client_events_reach_the_others_but_not_the_sender(events_server, clients):
    a, b = clients(events_server.port), clients(events_server.port)
    a.connected()
    b.connected()
    assert a.subscribe("private-chat")["type"] == "subscribed"
    assert b.subscribe("private-chat")["type"] == "subscribed"
    a.send(op="trigger", channel="private-chat", event="client-typing", data={"who": "a"})
    assert a.expect(lambda r: r["type"] == "triggered")["sent"] is True
    assert b.event("private-chat", "client-typing")["data"] == {"who": "a"}
    sdk(events_server.port).trigger("private-chat", "marker", "m")
    a.event("private-chat", "marker")
    assert not a.got("client-typing")


def test_client_events_on_presence_channels_say_who_sent_them(events_server, clients):
    ann = clients(events_server.port, user=user("ann"))
    ann.connected()
    ann.subscribe("presence-chat")

    async def body():
        ws, socket_id = await raw_pusher(events_server.port)
        data = json.dumps({"user_id": "ben"})
        await ws.send(json.dumps({"event": "pusher:subscribe", "data": {
            "channel": "presence-chat", "channel_data": data,
            "auth": channel_auth(socket_id, f"presence-chat:{data}")}}))
        assert (await recv_json(ws))["event"] == "pusher_internal:subscription_succeeded"
        ann.send(op="trigger", channel="presence-chat", event="client-hi", data={"text": "hello"})
        got = await recv_json(ws)
        assert got["event"] == "client-hi" and got["user_id"] == "ann", got
        assert json.loads(got["data"]) == {"text": "hello"}
        await ws.close()

    run(body())


def test_client_events_are_refused_where_pusher_refuses_them(start_server, events_server):
    off = start_server("--pusher-app", APP)

    async def body():
        ws, _ = await raw_pusher(off.port, private="private-x")
        await ws.send(json.dumps({"event": "client-x", "channel": "private-x", "data": {}}))
        assert "not enabled" in (await recv_json(ws))["data"]["message"]
        await ws.close()
        ws, _ = await raw_pusher(events_server.port, private="private-x")
        for channel, says in [("public", "only for private"), ("private-other", "not subscribed")]:
            await ws.send(json.dumps({"event": "client-x", "channel": channel, "data": {}}))
            error = await recv_json(ws)
            assert error["event"] == "pusher:error" and says in error["data"]["message"], error
        await ws.close()

    run(body())


def test_client_events_over_ten_a_second_are_refused_to_the_sender_never_lost_silently(events_server):
    async def body():
        sender, _ = await raw_pusher(events_server.port, private="private-rate")
        receiver, _ = await raw_pusher(events_server.port, private="private-rate")
        for i in range(25):
            await sender.send(json.dumps({"event": "client-n", "channel": "private-rate", "data": {"i": i}}))
        refused = delivered = 0
        while refused + delivered < 25:
            if refused < 25 - delivered:
                try:
                    error = await recv_json(sender, timeout=0.5)
                    assert error["event"] == "pusher:error" and error["data"]["code"] == 4301, error
                    refused += 1
                    continue
                except asyncio.TimeoutError:
                    pass
            got = await recv_json(receiver)
            assert got["event"] == "client-n"
            delivered += 1
        # Up to 10 in each second the burst touched: at most two seconds' worth.
        assert refused >= 5 and delivered <= 20, (refused, delivered)
        await sender.close()
        await receiver.close()

    run(body(), timeout=60)


def test_a_publish_naming_a_socket_id_leaves_that_connection_out(app_server, clients):
    a, b = clients(app_server.port), clients(app_server.port)
    socket_a = a.connected()
    b.connected()
    a.subscribe("room")
    b.subscribe("room")
    sdk(app_server.port).trigger("room", "not-for-a", {"x": 1}, socket_id=socket_a)
    assert b.event("room", "not-for-a")["data"] == {"x": 1}
    sdk(app_server.port).trigger("room", "marker", "m")
    a.event("room", "marker")
    assert not a.got("not-for-a")


# ------------------------------------------------------------------ user authentication


def test_a_signed_in_user_gets_send_to_user_events(app_server, clients):
    c = clients(app_server.port, signin_as={"id": "u-42", "name": "Zed"})
    c.connected()
    c.send(op="signin")
    assert c.expect(lambda r: r["type"] == "signed_in")["user_data"] == {"id": "u-42", "name": "Zed"}
    # The server joins the user's channel as it answers the sign-in.
    api = sdk(app_server.port)
    api.send_to_user("u-42", "hello", {"only": "you"})
    assert c.expect(lambda r: r["type"] == "user_event" and r["event"] == "hello")["data"] == {"only": "you"}


def test_sign_in_is_checked_and_terminate_connections_ends_a_users_connections(app_server):
    async def body():
        ws, socket_id = await raw_pusher(app_server.port)
        user_data = json.dumps({"id": "u1"})
        bad = {"user_data": user_data, "auth": f"{KEY}:{'0' * 64}"}
        await ws.send(json.dumps({"event": "pusher:signin", "data": bad}))
        error = await recv_json(ws)
        assert error["event"] == "pusher:error" and error["data"]["code"] == 4009, error
        assert received_close_code(await expect_closed(ws)) == 4009

        ws, socket_id = await raw_pusher(app_server.port)
        other, _ = await raw_pusher(app_server.port)
        await other.send(json.dumps({"event": "pusher:subscribe", "data": {"channel": "#server-to-user-u1"}}))
        refused = await recv_json(other)
        assert refused["event"] == "pusher:subscription_error" and refused["data"]["status"] == 403
        signature = hmac.new(SECRET.encode(), f"{socket_id}::user::{user_data}".encode(), hashlib.sha256).hexdigest()
        await ws.send(json.dumps({"event": "pusher:signin",
                                  "data": {"user_data": user_data, "auth": f"{KEY}:{signature}"}}))
        ok = await recv_json(ws)
        assert ok["event"] == "pusher:signin_success" and json.loads(json.loads(ok["data"])["user_data"]) == {"id": "u1"}
        joined = await recv_json(ws)
        assert joined == {"event": "pusher_internal:subscription_succeeded", "channel": "#server-to-user-u1",
                          "data": "{}"}
        sdk(app_server.port).terminate_user_connections("u1")
        error = await recv_json(ws)
        assert error["event"] == "pusher:error" and error["data"]["code"] == 4009, error
        assert received_close_code(await expect_closed(ws)) == 4009
        # Nobody else was touched.
        await other.send(json.dumps({"event": "pusher:ping", "data": {}}))
        assert (await recv_json(other))["event"] == "pusher:pong"
        await other.close()

    run(body())


# ------------------------------------------------------------------ one product


def test_pusher_events_reach_throngs_own_subscribers_and_back(app_server, clients):
    c = clients(app_server.port)
    c.connected()
    c.subscribe("news")

    async def body():
        url = f"ws://127.0.0.1:{app_server.port}/ws/{APP_ID}:news?format=json"
        async with ws_connect(url) as ws:
            eventually(lambda: sdk(app_server.port).channel_info("news", ["subscription_count"]),
                    lambda v: v["subscription_count"] == 2)
            sdk(app_server.port).trigger("news", "headline", {"title": "hello"})
            got = await recv_json(ws)
            assert got["channel"] == f"{APP_ID}:news" and got["name"] == "headline"
            assert json.loads(got["data"]) == {"title": "hello"}
            assert c.event("news", "headline")["data"] == {"title": "hello"}
            publish_ok(app_server.port, f"{APP_ID}:news?event=from-throng", "plain")
            assert (await recv_json(ws))["name"] == "from-throng"
            assert c.event("news", "from-throng")["data"] == "plain"
            publish_ok(app_server.port, f"{APP_ID}:news", "unnamed")
            assert c.event("news", "message")["data"] == "unnamed"

    run(body())


def test_laravel_echo_listens_joins_whispers_and_leaves(events_server, clients):
    port = events_server.port
    ann = clients(port, user=user("ann"), script="echo_client.mjs")
    ben = clients(port, user=user("ben"), script="echo_client.mjs")
    ann.connected()
    ben.connected()
    ann.send(op="private", channel="orders", event=".shipped")
    ann.expect(lambda r: r["type"] == "subscribed")
    sdk(port).trigger("private-orders", "shipped", {"order": 7})
    assert ann.expect(lambda r: r["type"] == "event")["data"] == {"order": 7}
    ann.send(op="join", channel="lobby")
    assert [u["name"] for u in ann.expect(lambda r: r["type"] == "here")["users"]] == ["Ann"]
    ben.send(op="join", channel="lobby")
    assert sorted(u["name"] for u in ben.expect(lambda r: r["type"] == "here")["users"]) == ["Ann", "Ben"]
    assert ann.expect(lambda r: r["type"] == "joining")["user"] == {"name": "Ben"}
    ben.send(op="whisper", channel="lobby", event="typing", data={"who": "ben"})
    assert ann.expect(lambda r: r["type"] == "whisper")["data"] == {"who": "ben"}
    ben.send(op="leave", channel="lobby")
    assert ann.expect(lambda r: r["type"] == "leaving")["user"] == {"name": "Ben"}


def test_pusher_js_in_chromium_subscribes_and_receives(app_server, browser, pages):
    page = pages.new("pusher-js")
    page.add_script_tag(path=str(NODE_DIR / "node_modules" / "pusher-js" / "dist" / "web" / "pusher.min.js"))
    page.evaluate("""([key, port]) => {
        window.seen = [];
        const pusher = new Pusher(key, {cluster: "local", wsHost: "127.0.0.1", wsPort: port,
                                        forceTLS: false, enabledTransports: ["ws"], disableStats: true});
        const channel = pusher.subscribe("browser-news");
        channel.bind("pusher:subscription_succeeded", () => window.seen.push("subscribed"));
        channel.bind("headline", (data) => window.seen.push(data.title));
    }""", [KEY, app_server.port])
    page.wait_for_function("window.seen.includes('subscribed')")
    sdk(app_server.port).trigger("browser-news", "headline", {"title": "from the SDK"})
    page.wait_for_function("window.seen.includes('from the SDK')")
    pages.screenshot(page, "pusher-js")


# ------------------------------------------------------------------ the HTTP API


def test_the_api_refuses_bad_signatures_stale_times_and_unknown_apps(app_server):
    port = app_server.port
    body = json.dumps({"name": "e", "channel": "c", "data": "{}"}).encode()
    with pytest.raises(pusher.errors.PusherBadAuth):
        sdk(port, secret="wrong").trigger("c", "e", {})
    assert_json_error(post_signed(port, f"/apps/{APP_ID}/events", body, secret="wrong"), 401, "signature")
    stale = post_signed(port, f"/apps/{APP_ID}/events", body, timestamp=int(time.time()) - 601)
    assert_json_error(stale, 401, "not within 600 s")
    unsigned = http_request(port, "POST", f"/apps/{APP_ID}/events", body, [("Content-Type", "application/json")])
    assert_json_error(unsigned, 401, "auth_key")
    tampered_path = signed("POST", f"/apps/{APP_ID}/events", body)
    tampered = http_request(port, "POST", tampered_path, body.replace(b'"c"', b'"d"'))
    assert_json_error(tampered, 401, "body_md5")
    assert_json_error(post_signed(port, "/apps/999/events", body), 404, "unknown app")
    assert post_signed(port, f"/apps/{APP_ID}/events", body).status == 200


@pytest.mark.parametrize(
    "event,status,says",
    [
        ("not json", 400, "not JSON"),
        ({"channel": "c", "data": "x"}, 400, "name"),
        ({"name": "e", "channel": "c", "data": {"not": "a string"}}, 400, "data"),
        ({"name": "e", "channel": "bad:name", "data": "x"}, 400, "channel name"),
        ({"name": "e", "channels": [f"c{i}" for i in range(101)], "data": "x"}, 400, "1 to 100"),
        ({"name": "e", "channel": "c", "data": "x", "socket_id": "1.2.3"}, 400, "socket_id"),
        ({"name": "e", "channel": "c", "data": "x" * 70_000}, 413, "event data"),
    ],
    ids=["not-json", "no-name", "data-not-string", "bad-channel", "101-channels", "socket-id", "oversized"],
)
def test_bad_events_get_pushers_status_and_the_reason(app_server, event, status, says):
    body = (event if isinstance(event, str) else json.dumps(event)).encode()
    assert_json_error(post_signed(app_server.port, f"/apps/{APP_ID}/events", body), status, says)


def test_a_batch_over_ten_is_refused_whole(app_server, clients):
    c = clients(app_server.port)
    c.connected()
    c.subscribe("batch")
    events = [{"channel": "batch", "name": f"e{i}", "data": "x"} for i in range(11)]
    body = json.dumps({"batch": events}).encode()
    assert_json_error(post_signed(app_server.port, f"/apps/{APP_ID}/batch_events", body), 400, "at most 10")
    sdk(app_server.port).trigger("batch", "marker", "m")
    c.event("batch", "marker")
    assert not [r for r in c.log if r["type"] == "event" and r["event"].startswith("e")]


def test_the_channel_list_names_occupied_channels_with_their_counts(app_server, clients):
    port = app_server.port
    a = clients(port, user=user("ann"))
    a.connected()
    for channel in ("news", "private-orders", "presence-room"):
        assert a.subscribe(channel)["type"] == "subscribed"
    api = sdk(port)
    assert api.channels_info() == {"channels": {"news": {}, "private-orders": {}, "presence-room": {}}}
    assert api.channels_info(prefix_filter="presence-", attributes=["user_count", "subscription_count"]) == {
        "channels": {"presence-room": {"user_count": 1, "subscription_count": 1}}}
    with pytest.raises(pusher.errors.PusherBadRequest):
        api.channels_info(prefix_filter="news", attributes=["user_count"])
    a.close()
    eventually(lambda: api.channels_info(), lambda v: v == {"channels": {}})


# ------------------------------------------------------------------ two nodes


@pytest.fixture
def redis_nodes(start_server, redis_args):
    """Two nodes on the worker's shared Redis under the test's own
    --redis-prefix: their node registry and channel list are theirs alone."""
    a = start_server("--pusher-app", APP, *redis_args, *SCALED)
    b = start_server("--pusher-app", APP, *redis_args, *SCALED)
    for node in (a, b):
        wait_healthy(node.port)
    return a, b


def test_an_event_published_through_node_b_reaches_node_as_pusher_clients(redis_nodes, clients):
    a, b = redis_nodes
    on_a = clients(a.port)
    on_b = clients(b.port)
    socket_a = on_a.connected()
    on_b.connected()
    on_a.subscribe("private-cluster")
    on_b.subscribe("private-cluster")
    eventually(lambda: sdk(b.port).channel_info("private-cluster", ["subscription_count"]),
            lambda v: v["subscription_count"] == 2, timeout=10)
    sdk(b.port).trigger("private-cluster", "across", {"n": 1})
    assert on_a.event("private-cluster", "across")["data"] == {"n": 1}
    assert on_b.event("private-cluster", "across")["data"] == {"n": 1}
    # socket_id names a connection on the other node: left out there too.
    sdk(b.port).trigger("private-cluster", "not-for-a", "x", socket_id=socket_a)
    assert on_b.event("private-cluster", "not-for-a")["data"] == "x"
    sdk(b.port).trigger("private-cluster", "marker", "m")
    on_a.event("private-cluster", "marker")
    assert not on_a.got("not-for-a")


def test_presence_is_one_list_across_nodes_and_a_dead_nodes_users_leave(redis_nodes, clients):
    a, b = redis_nodes
    ann = clients(a.port, user=user("ann"))
    ann.connected()
    assert ann.subscribe("presence-lobby")["members"] == {"ann": {"name": "Ann"}}
    ben = clients(b.port, user=user("ben"))
    ben.connected()
    assert set(ben.subscribe("presence-lobby")["members"]) == {"ann", "ben"}
    assert ann.expect(lambda r: r["type"] == "member_added")["id"] == "ben"
    ann_on_b = clients(b.port, user=user("ann"))
    ann_on_b.connected()
    assert ann_on_b.subscribe("presence-lobby")["count"] == 2
    assert sorted(u["id"] for u in sdk(a.port).users_info("presence-lobby")["users"]) == ["ann", "ben"]
    # Each node writes its subscriber counts every keeper tick: the list settles.
    eventually(lambda: sdk(a.port).channels_info(prefix_filter="presence-",
                                              attributes=["user_count", "subscription_count"]),
            lambda v: v == {"channels": {"presence-lobby": {"user_count": 2, "subscription_count": 3}}},
            timeout=10)
    ann.close()
    sdk(b.port).trigger("presence-lobby", "marker", "1")
    ben.event("presence-lobby", "marker")
    assert not [r for r in ben.log if r["type"] in ("member_added", "member_removed")]
    ann_on_b.close()
    assert ben.expect(lambda r: r["type"] == "member_removed")["id"] == "ann"
    # A node killed without leaving: its users go once its heartbeat has expired.
    cat = clients(a.port, user=user("cat"))
    cat.connected()
    cat.subscribe("presence-lobby")
    assert ben.expect(lambda r: r["type"] == "member_added")["id"] == "cat"
    a.proc.kill()
    assert ben.expect(lambda r: r["type"] == "member_removed", timeout=60)["id"] == "cat"
