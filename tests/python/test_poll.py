"""GET /poll/{channel}?since=SEQ&timeout=S, long-polling read with httpx and raw
sockets: at once when newer messages exist, waiting then woken by a publish, timing
out empty, 1,000 waiting polls answered by one publish, a loop following `next` that
misses nothing while publishes go on, a chat room's sender (`from`) live and from
history, the gap in the body, and 400s for bad input."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from rawws import assert_json_error, http_request, publish_ok
from wsutil import recv_json, ws_connect


def poll(port: int, channel: str, query: str = "", timeout: float = 70.0) -> dict:
    resp = httpx.get(f"http://127.0.0.1:{port}/poll/{channel}?{query}", timeout=timeout)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    return resp.json()


def wait_polls(port: int, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        polls = http_request(port, "GET", "/api/stats").json()["connections"]["poll"]
        if polls == n:
            return
        assert time.monotonic() < deadline, f"{polls} polls waiting, expected {n}"
        time.sleep(0.02)


def test_newer_messages_are_answered_at_once(start_server):
    srv = start_server()
    for i in range(3):
        publish_ok(srv.port, "now", f"m{i}")
    publish_ok(srv.port, "now", b"\x00\x01", content_type="application/octet-stream")
    body = poll(srv.port, "now", "since=1&timeout=30")
    assert body["messages"] == [
        {"seq": 2, "data": "m1"},
        {"seq": 3, "data": "m2"},
        {"seq": 4, "data": "AAE=", "encoding": "base64"},
    ], body
    assert body["next"] == 4 and len(body["epoch"]) == 16, body


def test_a_waiting_poll_is_woken_by_a_publish(start_server):
    srv = start_server()
    publish_ok(srv.port, "wake", "old")
    result = {}

    def waiter():
        result["body"] = poll(srv.port, "wake", "since=1&timeout=30")

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_polls(srv.port, 1)
    publish_ok(srv.port, "wake", "new")
    thread.join(10)
    assert not thread.is_alive(), "the poll was not answered"
    assert result["body"]["messages"] == [{"seq": 2, "data": "new"}], result
    assert result["body"]["next"] == 2
    wait_polls(srv.port, 0)


def test_a_poll_times_out_empty(start_server):
    srv = start_server()
    publish_ok(srv.port, "quiet", "x")
    started = time.monotonic()
    body = poll(srv.port, "quiet", "since=1&timeout=1")
    waited = time.monotonic() - started
    assert body["messages"] == [] and body["next"] == 1, body
    assert waited >= 0.9, f"answered after {waited:.2f}s, before its timeout"


def test_one_publish_answers_1000_waiting_polls(start_server):
    srv = start_server()
    n = 1000

    async def one_poll(i: int) -> bytes:
        source = (f"127.0.0.{2 + i % 200}", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port, local_addr=source)
        writer.write(b"GET /poll/many?since=0&timeout=30 HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        data = await reader.read()  # the answer closes the connection
        writer.close()
        return data

    async def main():
        tasks = [asyncio.create_task(one_poll(i)) for i in range(n)]
        await asyncio.get_running_loop().run_in_executor(None, wait_polls, srv.port, n)
        await asyncio.get_running_loop().run_in_executor(None, publish_ok, srv.port, "many", "all")
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 20)
        for raw in answers:
            head, _, body = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), raw[:200]
            assert json.loads(body)["messages"] == [{"seq": 1, "data": "all"}], body

    asyncio.run(main())


def test_a_loop_following_next_misses_nothing(start_server):
    srv = start_server("--history-size", "1000")
    total = 300

    def publisher():
        for i in range(total):
            publish_ok(srv.port, "loop", f"p{i}")

    thread = threading.Thread(target=publisher)
    thread.start()
    seen: list[int] = []
    since = 0
    deadline = time.monotonic() + 30
    while len(seen) < total and time.monotonic() < deadline:
        body = poll(srv.port, "loop", f"since={since}&timeout=5")
        seen += [m["seq"] for m in body["messages"]]
        since = body["next"]
    thread.join()
    assert seen == list(range(1, total + 1)), f"lost, doubled or reordered: {seen[:20]}..."


def test_a_poll_of_a_chat_room_says_who_sent_each_message(start_server):
    srv = start_server()
    room = "chat:polled"

    async def main():
        member = await ws_connect(srv.url(f"/ws/{room}?format=json"))
        try:
            me = (await recv_json(member))["client"]  # the welcome
            await member.send("kept")
            assert (await recv_json(member))["data"] == "kept"
            publish_ok(srv.port, room, "pushed")
            await recv_json(member)
            loop = asyncio.get_running_loop()
            # From history.
            body = await loop.run_in_executor(None, poll, srv.port, room, "since=0")
            assert body["messages"] == [
                {"seq": 1, "data": "kept", "from": me},
                {"seq": 2, "data": "pushed"},
            ], body
            # Live: a waiting poll answered by the member's next message.
            waiting = loop.run_in_executor(None, poll, srv.port, room, "since=2&timeout=30")
            await loop.run_in_executor(None, wait_polls, srv.port, 1)
            await member.send("live")
            body = await asyncio.wait_for(waiting, 10)
            assert body["messages"] == [{"seq": 3, "data": "live", "from": me}], body
            assert body["next"] == 3, body
        finally:
            await member.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_poll_too_far_behind_is_told_of_the_gap(start_server):
    srv = start_server("--history-size", "2")
    for i in range(5):
        publish_ok(srv.port, "gone", f"m{i}")
    body = poll(srv.port, "gone", "since=1")
    assert body["gap"] == {"from": 2, "to": 3, "reason": "too old"}, body
    assert [m["seq"] for m in body["messages"]] == [4, 5] and body["next"] == 5, body


@pytest.mark.parametrize(
    "query, reason",
    [
        ("timeout=61", "timeout must be whole seconds from 0 to 60"),
        ("timeout=abc", "timeout must be whole seconds"),
        ("since=-1", "since must be a seq"),
        ("since=1&epoch=zz", "epoch must be 16 hex digits"),
    ],
)
def test_bad_poll_parameters_are_400(shared_server, query, reason):
    assert_json_error(http_request(shared_server.port, "GET", f"/poll/x?{query}"), 400, reason)


def test_poll_needs_get(shared_server):
    assert_json_error(http_request(shared_server.port, "POST", "/poll/x"), 405, "use GET")
