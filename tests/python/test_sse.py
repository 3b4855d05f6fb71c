"""GET /sse/{channel}: a text/event-stream read with httpx (lines parsed by hand) and
curl -N: headers that stop proxy buffering, `retry:`, `id: SEQ:EPOCH` per message,
multi-line and binary payloads, resuming from Last-Event-ID or since=, the gap event,
heartbeat comments, no idle timeout, a reader that stops reading closed at --max-queue,
and clear errors for bad requests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest

from rawws import assert_json_error, channel_info, http_request, publish_ok, wait_subscribers
from wsutil import recv_json, run, ws_connect
from support.streams import EventReader


def seq_of(event: dict) -> int:
    return int(event["id"].split(":")[0])


def test_stream_headers_retry_and_one_event_per_message(start_server):
    srv = start_server()
    reader = EventReader(f"http://127.0.0.1:{srv.port}/sse/news")
    try:
        assert reader.status == 200
        assert reader.headers["content-type"] == "text/event-stream"
        assert reader.headers["cache-control"] == "no-cache"
        assert reader.headers["x-accel-buffering"] == "no"
        wait_subscribers(srv.port, "news", 1)
        publish_ok(srv.port, "news", "hello")
        publish_ok(srv.port, "news", "two\nlines")
        publish_ok(srv.port, "news", b"\x00\xff", content_type="application/octet-stream")
        events = reader.wait(3)
        epoch = channel_info(srv.port, "news")["epoch"]
        assert events[0] == {"id": f"1:{epoch}", "data": "hello"}, events
        assert events[1] == {"id": f"2:{epoch}", "data": "two\nlines"}, events
        assert events[2] == {"id": f"3:{epoch}", "event": "binary", "data": "AP8="}, events
        assert reader.retry == 2000
        stats = http_request(srv.port, "GET", "/api/stats").json()
        assert stats["connections"] == {"websocket": 0, "sse": 1, "poll": 0, "pusher": 0}, stats
    finally:
        reader.close()


@pytest.mark.parametrize("how", ["last-event-id", "since"])
def test_a_returning_reader_gets_what_it_missed_then_live(start_server, how):
    srv = start_server()
    for i in range(5):
        publish_ok(srv.port, "back", f"m{i}")
    epoch = channel_info(srv.port, "back")["epoch"]
    if how == "last-event-id":
        reader = EventReader(f"http://127.0.0.1:{srv.port}/sse/back?since=0", {"Last-Event-ID": f"2:{epoch}"})
    else:
        reader = EventReader(f"http://127.0.0.1:{srv.port}/sse/back?since=2&epoch={epoch}")
    try:
        missed = reader.wait(3)
        assert [seq_of(e) for e in missed] == [3, 4, 5], missed
        assert [e["data"] for e in missed] == ["m2", "m3", "m4"], missed
        publish_ok(srv.port, "back", "live")
        live = reader.wait(4)[3]
        assert (seq_of(live), live["data"]) == (6, "live"), live
    finally:
        reader.close()


def test_chat_messages_are_the_payload_alone_live_and_replayed(start_server):
    srv = start_server()
    room = "chat:streamed"
    said = []

    async def say(text):
        async with ws_connect(srv.url(f"/ws/{room}?format=json")) as member:
            await recv_json(member)  # the welcome
            await member.send(text)
            said.append(await recv_json(member))

    run(say("before"))
    assert said[0].get("from"), said
    reader = EventReader(f"http://127.0.0.1:{srv.port}/sse/{room}?since=0")
    try:
        replayed = reader.wait(1)[0]
        assert (seq_of(replayed), replayed["data"]) == (1, "before"), replayed
        run(say("after"))
        live = [e for e in reader.wait(4) if "id" in e]
        assert [e["data"] for e in live] == ["before", "after"], reader.events
    finally:
        reader.close()


def test_a_reader_too_far_behind_gets_a_gap_event(start_server):
    srv = start_server("--history-size", "2")
    for i in range(6):
        publish_ok(srv.port, "gap", f"m{i}")
    reader = EventReader(f"http://127.0.0.1:{srv.port}/sse/gap", {"Last-Event-ID": "1"})
    try:
        events = reader.wait(3)
        assert events[0]["event"] == "gap", events
        import json

        gap = json.loads(events[0]["data"])
        assert (gap["from"], gap["to"], gap["reason"]) == (2, 4, "too old"), gap
        assert [seq_of(e) for e in events[1:]] == [5, 6], events
    finally:
        reader.close()


def test_heartbeat_comments_keep_an_idle_stream_open_past_the_idle_timeout(start_server):
    srv = start_server("--ping-interval", "300ms", "--idle-timeout", "1s")
    reader = EventReader(f"http://127.0.0.1:{srv.port}/sse/quiet")
    try:
        reader.wait_comments(3, timeout=5)
        time.sleep(1.5)
        assert channel_info(srv.port, "quiet")["subscribers"] == 1
        publish_ok(srv.port, "quiet", "still here")
        assert reader.wait(1)[0]["data"] == "still here"
    finally:
        reader.close()


def test_curl_reads_the_stream(start_server):
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed (scripts/test.sh installs it)")
    srv = start_server()
    proc = subprocess.Popen(
        [curl, "-sN", "--max-time", "3", f"http://127.0.0.1:{srv.port}/sse/curl"],
        stdout=subprocess.PIPE,
    )
    try:
        wait_subscribers(srv.port, "curl", 1)
        publish_ok(srv.port, "curl", "via curl")
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.decode()
    assert text.startswith("retry: 2000\n\n"), text
    assert "data: via curl\n\n" in text, text


def test_a_reader_that_stops_reading_is_closed_at_max_queue(start_server):
    srv = start_server("--max-queue", "64KiB")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", srv.port))
    sock.sendall(b"GET /sse/slow HTTP/1.1\r\nHost: x\r\n\r\n")
    other = EventReader(f"http://127.0.0.1:{srv.port}/sse/slow")
    try:
        wait_subscribers(srv.port, "slow", 2)
        body = "x" * 60_000
        for i in range(200):
            # The next only once the reading one has all before it: its queue never
            # holds more than one event (60 KB < 64 KiB) however slow this process
            # reads, so only the stalled reader can overflow (12 MB in all).
            other.wait(i, timeout=10)
            publish_ok(srv.port, "slow", body)
        # The stalled reader is dropped; the one reading gets everything.
        wait_subscribers(srv.port, "slow", 1, timeout=10)
        assert len(other.wait(200, timeout=10)) == 200
    finally:
        other.close()
        sock.close()


def test_bad_requests_get_clear_errors(shared_server):
    port = shared_server.port
    resp = http_request(port, "POST", "/sse/x")
    assert_json_error(resp, 405, "use GET")
    resp = http_request(port, "GET", "/sse/a%20b")
    assert_json_error(resp, 400, "channel name")
    resp = http_request(port, "GET", "/sse/x", headers=[("Last-Event-ID", "soon")])
    assert_json_error(resp, 400, "Last-Event-ID")
    resp = http_request(port, "GET", "/sse/x?since=-3")
    assert_json_error(resp, 400, "since must be a seq")
