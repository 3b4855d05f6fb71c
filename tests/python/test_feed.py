"""The dashboard's data: chat names chosen with `name=`, the server's own `throng:`
namespace, the once-a-second `throng:stats` feed (over WebSocket and SSE) and
`/api/stats/history`."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from rawws import http_request, publish, publish_ok
from wsutil import recv_json, run, ws_connect


def test_chat_members_go_by_the_names_they_chose(start_server):
    srv = start_server()
    room = "chat:named"

    async def main():
        alice = await ws_connect(srv.url(f"/ws/{room}?format=json&name=alice"))
        welcome = await recv_json(alice)
        assert welcome == {"channel": room, "event": "welcome", "client": "alice", "count": 1}, welcome
        bob = await ws_connect(srv.url(f"/ws/{room}?format=json&name=Bob_2.0"))
        assert (await recv_json(bob))["client"] == "Bob_2.0"
        joined = await recv_json(alice)
        assert joined["event"] == "join" and joined["client"] == "Bob_2.0" and joined["count"] == 2, joined
        await alice.send("hello bob")
        for ws in (alice, bob):
            m = await recv_json(ws)
            assert m["data"] == "hello bob" and m["from"] == "alice", m
        await bob.close()
        left = await recv_json(alice)
        assert left["event"] == "leave" and left["client"] == "Bob_2.0" and left["count"] == 1, left
        await alice.close()
        # History keeps the chosen name as the sender.
        resp = httpx.get(f"http://127.0.0.1:{srv.port}/poll/{room}?since=0&timeout=0")
        assert resp.json()["messages"][0]["from"] == "alice", resp.text

    run(main())


@pytest.mark.parametrize("name", ["", "a%20b", "%3Cscript%3E", "x" * 33, "caf%C3%A9"])
def test_a_bad_chosen_name_is_refused_with_the_reason(start_server, name):
    srv = start_server()
    resp = http_request(
        srv.port,
        "GET",
        f"/ws/chat:x?format=json&name={name}",
        headers=[
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        ],
    )
    assert resp.status == 400, resp
    assert "name must be" in resp.json()["error"], resp


def test_nobody_publishes_to_the_servers_own_namespace(start_server):
    srv = start_server()
    resp = publish(srv.port, "throng:stats", "fake figures")
    assert resp.status == 403, resp
    assert "throng:" in resp.json()["error"], resp
    publish_ok(srv.port, "throngs", "a similar name is an ordinary channel")

    async def main():
        # A subscriber's frame on the feed closes it like any push-only channel.
        ws = await ws_connect(srv.url("/ws/throng:stats?format=json"))
        await ws.send("fake")
        with pytest.raises(Exception):
            for _ in range(5):
                await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 1008, ws.close_code

    run(main())


def test_the_feed_reports_this_node_every_second(start_server):
    srv = start_server()

    async def main():
        members = [await ws_connect(srv.url("/ws/news")) for _ in range(3)]
        other = await ws_connect(srv.url("/ws/sports"))
        feed = await ws_connect(srv.url("/ws/throng:stats?format=json"))
        for _ in range(4):
            publish_ok(srv.port, "news", "n")
        # Samples taken before the publishes landed (a slow machine) may come
        # first: read until one shows them (and at least three in all), however
        # long that takes, then check that one.
        frames = []
        deadline = time.monotonic() + 30
        while len(frames) < 3 or frames[-1]["totals"]["published"] < 4:
            assert time.monotonic() < deadline, f"no sample with the 4 publishes in 30 s: {frames}"
            m = await recv_json(feed, timeout=30)
            assert "seq" not in m and "event" not in m, f"the feed is unsequenced data: {m}"
            frames.append(json.loads(m["data"]))
        first, last = frames[0], frames[-1]
        # One a second on a fixed schedule: a late tick may come close to the next,
        # but three samples always span at least one interval (a lower bound: a
        # slow machine only makes the span longer).
        times = [f["time_ms"] for f in frames]
        assert times == sorted(set(times)), f"sample times not increasing: {times}"
        assert last["time_ms"] - first["time_ms"] >= 900, f"one message a second: {times}"
        assert last["connections"]["websocket"] == 5, last
        assert last["broker"] == {"url": "memory", "healthy": True}, last
        assert last["node"]["pid"] == srv.proc.pid and last["node"]["threads"] >= 1, last
        assert last["totals"]["published"] == 4, last
        busiest = last["busiest"]
        assert [b["channel"] for b in busiest] == ["news", "sports"], busiest
        assert busiest[0]["subscribers"] == 3 and busiest[0]["messages"] == 4, busiest
        for ws in [*members, other, feed]:
            await ws.close()

    run(main(), timeout=60)


def test_the_feed_reaches_an_event_stream_without_ids(start_server):
    srv = start_server()
    with httpx.stream("GET", f"http://127.0.0.1:{srv.port}/sse/throng:stats", timeout=10) as resp:
        assert resp.status_code == 200
        lines = []
        for line in resp.iter_lines():
            lines.append(line)
            if line.startswith("data:"):
                break
    assert not any(line.startswith("id:") for line in lines), lines
    figures = json.loads(lines[-1][len("data:"):])
    assert figures["connections"]["sse"] == 1, figures


def test_history_holds_a_sample_a_second_oldest_first(start_server):
    srv = start_server()
    publish_ok(srv.port, "news", "x")
    time.sleep(2.5)
    history = httpx.get(f"http://127.0.0.1:{srv.port}/api/stats/history").json()
    assert history["interval_ms"] == 1000
    samples = history["samples"]
    assert len(samples) >= 2, history
    times = [s["time_ms"] for s in samples]
    assert times == sorted(times) and len(set(times)) == len(times), times
    assert samples[-1]["totals"]["published"] == 1, samples[-1]
    assert set(samples[-1]["connections"]) == {"websocket", "sse", "poll", "pusher"}
