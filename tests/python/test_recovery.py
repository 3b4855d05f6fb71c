"""Coming back with since=SEQ on /ws/{channel}: exactly the messages missed, in order,
then live ones; a publish racing the replay is neither lost nor doubled; replayed chat
messages keep their sender (`from`) for json clients; json clients learn the epoch and
are told of a gap (too old, or a new epoch); bad since/epoch: 400."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rawws import assert_json_error, channel_info, http_exchange, publish_ok, upgrade_request
from wsutil import expect_silence, recv_json, run, ws_connect


async def recv_seqs(ws, n: int) -> list[int]:
    return [(await recv_json(ws))["seq"] for _ in range(n)]


def test_json_subscriber_gets_exactly_what_it_missed_then_live(start_server):
    srv = start_server()

    async def main():
        ws = await ws_connect(srv.url("/ws/back?format=json"))
        for i in range(2):
            publish_ok(srv.port, "back", f"m{i}")
        assert await recv_seqs(ws, 2) == [1, 2]
        await ws.close()
        epoch = channel_info(srv.port, "back")["epoch"]
        for i in range(2, 7):
            publish_ok(srv.port, "back", f"m{i}")
        ws = await ws_connect(srv.url(f"/ws/back?format=json&since=2&epoch={epoch}"))
        try:
            first = await recv_json(ws)
            assert first == {"channel": "back", "event": "epoch", "epoch": epoch, "last_seq": 7}, first
            missed = [await recv_json(ws) for _ in range(5)]
            assert [m["seq"] for m in missed] == [3, 4, 5, 6, 7], missed
            assert [m["data"] for m in missed] == ["m2", "m3", "m4", "m5", "m6"], missed
            publish_ok(srv.port, "back", "live")
            live = await recv_json(ws)
            assert (live["seq"], live["data"]) == (8, "live"), live
            await expect_silence(ws, 0.3)
        finally:
            await ws.close()

    run(main())


def test_raw_subscriber_gets_the_missed_payloads(start_server):
    srv = start_server()

    async def main():
        publish_ok(srv.port, "rawback", "one")
        publish_ok(srv.port, "rawback", b"\x00\x01", content_type="application/octet-stream")
        publish_ok(srv.port, "rawback", "three")
        ws = await ws_connect(srv.url("/ws/rawback?since=1"))
        try:
            got = [await asyncio.wait_for(ws.recv(), 5) for _ in range(2)]
            assert got == [b"\x00\x01", "three"], got
            publish_ok(srv.port, "rawback", "four")
            assert await asyncio.wait_for(ws.recv(), 5) == "four"
            await expect_silence(ws, 0.3)
        finally:
            await ws.close()

    run(main())


def test_a_publish_racing_the_replay_is_neither_lost_nor_doubled(start_server):
    total = 600
    srv = start_server("--history-size", "1000")

    def publisher():
        for i in range(total):
            publish_ok(srv.port, "race", f"r{i}")

    async def main():
        thread = threading.Thread(target=publisher)
        thread.start()
        clients = []
        try:
            # Subscribers come back at different moments while publishes go on.
            for _ in range(6):
                await asyncio.sleep(0.05)
                clients.append(await ws_connect(srv.url("/ws/race?format=json&since=0")))
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
            for ws in clients:
                seqs = []
                while len(seqs) < total:
                    m = await recv_json(ws, timeout=10)
                    if "event" in m:
                        assert m["event"] == "epoch", m
                        continue
                    seqs.append(m["seq"])
                assert seqs == list(range(1, total + 1)), f"lost, doubled or reordered: {seqs[:20]}..."
                await expect_silence(ws, 0.2)
        finally:
            thread.join()
            for ws in clients:
                await ws.close()

    run(main())


def test_a_returning_json_member_sees_who_sent_each_chat_message(start_server):
    srv = start_server()
    room = "chat:again"

    async def main():
        talker = await ws_connect(srv.url(f"/ws/{room}?format=json"))
        try:
            welcome = await recv_json(talker)
            assert welcome["event"] == "welcome", welcome
            me = welcome["client"]
            for text in ["hello", "again"]:
                await talker.send(text)
                echoed = await recv_json(talker)
                assert (echoed["data"], echoed.get("from")) == (text, me), echoed
            publish_ok(srv.port, room, "from the API")
            assert "from" not in await recv_json(talker)
        finally:
            await talker.close()
        back = await ws_connect(srv.url(f"/ws/{room}?format=json&since=0"))
        try:
            replayed = []
            while len(replayed) < 3:
                m = await recv_json(back)
                if "event" not in m:
                    replayed.append(m)
            assert [(m["seq"], m["data"], m.get("from")) for m in replayed] == [
                (1, "hello", me),
                (2, "again", me),
                (3, "from the API", None),
            ], replayed
            assert "from" not in replayed[2], replayed[2]
        finally:
            await back.close()
        # Raw clients get the payloads alone, replayed as live.
        raw = await ws_connect(srv.url(f"/ws/{room}?since=1"))
        try:
            got = [await asyncio.wait_for(raw.recv(), 5) for _ in range(2)]
            assert got == ["again", "from the API"], got
        finally:
            await raw.close()

    run(main())


def test_a_seq_older_than_history_gets_a_gap_then_what_is_kept(start_server):
    srv = start_server("--history-size", "3")

    async def main():
        for i in range(10):
            publish_ok(srv.port, "old", f"m{i}")
        ws = await ws_connect(srv.url("/ws/old?format=json&since=2"))
        try:
            epoch = await recv_json(ws)
            assert epoch["event"] == "epoch", epoch
            gap = await recv_json(ws)
            assert gap == {
                "channel": "old",
                "event": "gap",
                "from": 3,
                "to": 7,
                "reason": "too old",
                "epoch": epoch["epoch"],
            }, gap
            assert await recv_seqs(ws, 3) == [8, 9, 10]
        finally:
            await ws.close()

    run(main())


def test_a_restarted_server_reports_a_new_epoch(start_server):
    first = start_server()
    for i in range(3):
        publish_ok(first.port, "epoch", f"old{i}")
    old_epoch = channel_info(first.port, "epoch")["epoch"]
    first.stop()
    second = start_server()

    async def main():
        publish_ok(second.port, "epoch", "new0")
        ws = await ws_connect(second.url(f"/ws/epoch?format=json&since=3&epoch={old_epoch}"))
        try:
            epoch = await recv_json(ws)
            assert epoch["event"] == "epoch" and epoch["epoch"] != old_epoch, epoch
            gap = await recv_json(ws)
            assert (gap["event"], gap["reason"], gap["from"], gap["to"]) == ("gap", "new epoch", 1, 0), gap
            m = await recv_json(ws)
            assert (m["seq"], m["data"]) == (1, "new0"), m
        finally:
            await ws.close()

    run(main())


def test_a_since_beyond_the_last_seq_is_a_new_epoch_not_an_error(start_server):
    srv = start_server()

    async def main():
        publish_ok(srv.port, "ahead", "a")
        ws = await ws_connect(srv.url("/ws/ahead?format=json&since=50"))
        try:
            await recv_json(ws)  # the epoch
            gap = await recv_json(ws)
            assert (gap["event"], gap["reason"]) == ("gap", "new epoch"), gap
            assert (await recv_json(ws))["seq"] == 1
        finally:
            await ws.close()

    run(main())


@pytest.mark.parametrize(
    "query, reason",
    [
        ("since=abc", "since must be a seq"),
        ("since=-1", "since must be a seq"),
        ("since=1&epoch=nothex!", "epoch must be 16 hex digits"),
        ("epoch=0123456789abcdef", "epoch goes with since"),
    ],
)
def test_bad_since_or_epoch_is_400(shared_server, query, reason):
    request, _key = upgrade_request(f"/ws/x?{query}")
    resp = http_exchange(shared_server.port, request)
    assert_json_error(resp, 400, reason)
