"""What one anonymous client can make the server hold (security review, issue 44,
finding 4): history bytes bounded across every channel (--history-max-bytes),
chat messages bounded per connection (--chat-rate, --chat-burst), a returning
reader that never reads its replay let go within seconds, not ping intervals,
replays that are not copied per reader, and long-poll answers from history of a
bounded size."""

from __future__ import annotations

import socket
import time

import pytest

from rawws import OP_TEXT, Closed, channel_info, encode_frame, http_request, publish_ok, wait_subscribers
from rawws import ws_connect as raw_connect

# Runs alone: it measures the server's resident memory.
pytestmark = pytest.mark.serial

KIB = 1024


def stats(port: int) -> dict:
    return http_request(port, "GET", "/api/stats").json()


def poll_once(port: int, channel: str, since: int) -> dict:
    resp = http_request(port, "GET", f"/poll/{channel}?since={since}&timeout=1")
    assert resp.status == 200, resp
    return resp.json()


def poll_all(port: int, channel: str, since: int, last: int) -> tuple[list[dict], dict | None, int]:
    """Polls from `since` following `next` until seq `last` is in: every message,
    the first answer's gap, and how many answers it took."""
    messages: list[dict] = []
    answer = poll_once(port, channel, since)
    gap = answer.get("gap")
    answers = 1
    while True:
        messages += answer["messages"]
        if not answer["messages"] or answer["next"] >= last:
            return messages, gap, answers
        answer = poll_once(port, channel, answer["next"])
        answers += 1


def rss_anon(pid: int) -> int:
    """The process's private resident memory, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * KIB
    raise AssertionError("no RssAnon")


def test_history_across_channels_stays_within_its_budget_and_resume_tells_the_gap(start_server):
    budget = 1024 * KIB
    # Given by its variable: a build without the budget starts too (and keeps all).
    srv = start_server(
        "--history-size", "100", "--max-message-size", "64KiB", env={"THRONG_HISTORY_MAX_BYTES": "1MiB"}
    )
    # Eight channels of 40 x 20 KiB: 6.4 MiB published, six times the budget.
    payload = "z" * (20 * KIB)
    for room in range(8):
        for _ in range(40):
            publish_ok(srv.port, f"pinned-{room}", payload)
    # The channel that grew past the budget lost its own oldest messages, and a
    # reader coming back for all of them is told exactly which seqs are gone.
    messages, gap, _ = poll_all(srv.port, "pinned-1", 0, 40)
    seqs = [m["seq"] for m in messages]
    assert gap, f"no gap: all {len(seqs)} messages kept, over a 1 MiB budget"
    assert seqs and seqs == list(range(seqs[0], 41)), seqs
    assert (gap["from"], gap["to"]) == (1, seqs[0] - 1), (gap, seqs[0])
    # Those that came with the budget full keep nothing until housekeeping makes
    # room, and say so.
    answer = poll_once(srv.port, "pinned-7", 0)
    assert answer["messages"] == [], answer["messages"][:1]
    assert (answer["gap"]["from"], answer["gap"]["to"]) == (1, 40), answer["gap"]
    assert channel_info(srv.port, "pinned-7")["last_seq"] == 40
    held = stats(srv.port)["history_bytes"]
    assert 0 < held <= budget, f"{held} history bytes held"


def test_a_chat_member_over_its_rate_is_closed_with_the_reason_and_not_published(start_server):
    srv = start_server()  # the defaults: 20/s, 40 at once
    room = "chat:flood"
    member = raw_connect(srv.port, path=f"/ws/{room}", timeout=5)
    try:
        wait_subscribers(srv.port, room, 1)
        member.send(b"".join(encode_frame(OP_TEXT, f"m{i}".encode()) for i in range(100)))
        code, reason = member.expect_close(timeout=5)
        assert code == 1008, (code, reason)
        assert reason == b"chat rate limit: at most 20/s, 40 at once", reason
    finally:
        member.close()
    # The burst (and what refilled meanwhile) went out; the rest did not.
    last = channel_info(srv.port, room)["last_seq"]
    assert 40 <= last <= 42, f"{last} of 100 messages published with a burst of 40"


def test_a_chat_member_within_its_rate_keeps_chatting(start_server):
    srv = start_server("--chat-rate", "5/s", "--chat-burst", "10")
    room = "chat:polite"
    member = raw_connect(srv.port, path=f"/ws/{room}", timeout=5)
    try:
        wait_subscribers(srv.port, room, 1)
        for i in range(10):
            member.send_frame(OP_TEXT, f"m{i}".encode())
        for i in range(10):
            assert member.read_message(timeout=5) == (OP_TEXT, f"m{i}".encode())
    finally:
        member.close()
    assert channel_info(srv.port, room)["last_seq"] == 10


REPLAY_SIZE = 60 * KIB
REPLAY_MESSAGES = 100


def stalled_reader(port: int, transport: str, channel: str) -> socket.socket:
    """A reader with a tiny receive buffer asking for the whole history, that never reads."""
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.settimeout(10)
    reader.connect(("127.0.0.1", port))
    if transport == "ws":
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        reader.sendall(
            (
                f"GET /ws/{channel}?since=0 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
    else:
        reader.sendall(f"GET /sse/{channel}?since=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return reader


def test_returning_readers_that_never_read_their_replay_are_let_go_within_seconds(start_server):
    # The default --ping-interval (25 s): the stall is found by its own watch.
    srv = start_server("--max-queue", "256KiB", "--history-size", str(REPLAY_MESSAGES))
    channel = "replayed"
    for i in range(REPLAY_MESSAGES):
        publish_ok(srv.port, channel, f"{i:06d}|" + "r" * (REPLAY_SIZE - 7))
    readers = [stalled_reader(srv.port, t, channel) for t in ("ws", "sse")]
    try:
        wait_subscribers(srv.port, channel, 2, timeout=5)
        t0 = time.monotonic()
        wait_subscribers(srv.port, channel, 0, timeout=12)
        waited = time.monotonic() - t0
        # Dropped, not closed behind the replay: the sockets end.
        for reader in readers:
            reader.settimeout(10)
            try:
                while reader.recv(1 << 16):
                    pass
            except (ConnectionResetError, Closed):
                pass
        assert stats(srv.port)["connections"]["sse"] == 0
        assert waited < 12
    finally:
        for reader in readers:
            reader.close()


def test_stalled_replays_are_not_copied_per_reader(start_server):
    # 100 x 60 KiB kept (5.9 MiB); sixty readers ask for all of it and never read.
    # Each once made its own copy of the whole replay, framed, and held it until
    # given up on: 60 x 5.9 MiB. Now a reader holds the kept messages by
    # reference and one slice of frames at a time.
    srv = start_server("--max-queue", "256KiB", "--history-size", str(REPLAY_MESSAGES))
    channel = "replayed-many"
    for i in range(REPLAY_MESSAGES):
        publish_ok(srv.port, channel, f"{i:06d}|" + "r" * (REPLAY_SIZE - 7))
    before = rss_anon(srv.pid)
    readers = [stalled_reader(srv.port, ("ws", "sse")[i % 2], channel) for i in range(60)]
    try:
        wait_subscribers(srv.port, channel, len(readers), timeout=10)
        grown = rss_anon(srv.pid) - before
        whole = len(readers) * REPLAY_MESSAGES * REPLAY_SIZE
        assert grown < whole / 8, f"{grown >> 20} MiB more held for {len(readers)} stalled readers"
    finally:
        for reader in readers:
            reader.close()


def test_a_poll_answer_from_history_is_bounded_and_the_next_poll_goes_on(start_server):
    srv = start_server("--history-size", str(REPLAY_MESSAGES))
    channel = "polled-long"
    for i in range(REPLAY_MESSAGES):
        publish_ok(srv.port, channel, f"{i:06d}|" + "p" * (REPLAY_SIZE - 7))
    first = poll_once(srv.port, channel, 0)
    carried = sum(len(m["data"]) for m in first["messages"])
    assert first["messages"] and carried <= 256 * KIB, f"{carried} bytes in one answer"
    assert first["next"] == first["messages"][-1]["seq"] < REPLAY_MESSAGES, first["next"]
    assert "gap" not in first
    # Following `next` gives every message once, in order, with nothing lost.
    messages, gap, answers = poll_all(srv.port, channel, 0, REPLAY_MESSAGES)
    assert [m["seq"] for m in messages] == list(range(1, REPLAY_MESSAGES + 1))
    assert [m["data"][:6] for m in messages] == [f"{i:06d}" for i in range(REPLAY_MESSAGES)]
    assert gap is None and answers > 1
    # One message longer than the bound still goes, alone.
    big = "b" * (300 * KIB)
    srv2 = start_server("--max-message-size", "1MiB")
    publish_ok(srv2.port, "polled-big", big)
    publish_ok(srv2.port, "polled-big", "small")
    answer = poll_once(srv2.port, "polled-big", 0)
    assert [m["seq"] for m in answer["messages"]] == [1] and answer["next"] == 1
    assert answer["messages"][0]["data"] == big
