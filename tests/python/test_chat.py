"""Chat rooms (`chat:<room>`): client frames are published to the room (sender
included), json members get welcome/join/leave events with counts and `from`
on messages, raw members get payloads only."""

from __future__ import annotations

import asyncio
import base64
import re

from rawws import channel_info, publish_ok, wait_subscribers
from wsutil import expect_silence, recv_json, run, ws_connect

CLIENT_ID = re.compile(r"^c\d+$")


def assert_event(m, event, room, client=None, count=None):
    assert m.get("event") == event, f"expected a {event!r} event, got {m}"
    assert m.get("channel") == room, m
    assert isinstance(m.get("client"), str) and CLIENT_ID.match(m["client"]), f"client must look like c<id>: {m}"
    if client is not None:
        assert m["client"] == client, f"{event} event for {m['client']}, expected {client}: {m}"
    if count is not None:
        assert m.get("count") == count, f"{event} event count {m.get('count')}, expected {count}: {m}"
    return m["client"]


async def join_json(url, room, count):
    """Connect a json member; its first frame must be the welcome. Returns (ws, client id)."""
    ws = await ws_connect(url)
    m = await recv_json(ws)
    cid = assert_event(m, "welcome", room, count=count)
    return ws, cid


def test_sender_receives_own_message_with_from(start_server):
    srv = start_server()
    room = "chat:solo"

    async def main():
        ws, me = await join_json(srv.url(f"/ws/{room}?format=json"), room, 1)
        try:
            await ws.send("talking to myself ✓")
            m = await recv_json(ws)
            assert m.get("data") == "talking to myself ✓", m
            assert m.get("from") == me, f"'from' must be the sender's id {me}: {m}"
            assert m.get("channel") == room and isinstance(m.get("seq"), int), m
            assert "event" not in m, m
            await ws.send("second")
            m2 = await recv_json(ws)
            assert m2.get("data") == "second" and m2.get("from") == me, m2
            assert m2["seq"] == m["seq"] + 1, f"seq must increase by one: {m['seq']} then {m2['seq']}"
        finally:
            await ws.close()

    run(main())


def test_raw_sender_receives_own_payload(start_server):
    srv = start_server()

    async def main():
        async with ws_connect(srv.url("/ws/chat:rawroom")) as ws:
            await ws.send("mine")
            assert await asyncio.wait_for(ws.recv(), 5) == "mine"
            await ws.send(b"\x00bin")
            assert await asyncio.wait_for(ws.recv(), 5) == b"\x00bin"

    run(main())


def test_chat_welcome_join_leave_counts_and_messages(start_server):
    srv = start_server()
    room = "chat:lobby"
    url = srv.url(f"/ws/{room}?format=json")

    async def main():
        opened = []
        try:
            # A joins alone.
            a, ida = await join_json(url, room, 1)
            opened.append(a)
            # B joins: B welcomed with 2, A told about B.
            b, idb = await join_json(url, room, 2)
            opened.append(b)
            assert_event(await recv_json(a), "join", room, client=idb, count=2)
            # C joins: C welcomed with 3, A and B told about C.
            c, idc = await join_json(url, room, 3)
            opened.append(c)
            assert len({ida, idb, idc}) == 3, f"client ids must be distinct: {ida} {idb} {idc}"
            for ws in (a, b):
                assert_event(await recv_json(ws), "join", room, client=idc, count=3)
            # R, a raw member, joins: it gets nothing, the json members see it join.
            r = await ws_connect(srv.url(f"/ws/{room}"))
            opened.append(r)
            idr = None
            for ws in (a, b, c):
                cid = assert_event(await recv_json(ws), "join", room, count=4)
                idr = idr or cid
                assert cid == idr, "all members must see the same id for the raw joiner"
            assert idr not in (ida, idb, idc), idr
            # The joiner does not get its own join event; nobody gets anything extra.
            for ws in (a, b, c):
                await expect_silence(ws, 0.2)
            await expect_silence(r, 0.2)

            # A speaks: everyone, A included, receives it; json with from=A, raw plain payload.
            await a.send("hello from A")
            seqs = set()
            for ws in (a, b, c):
                m = await recv_json(ws)
                assert m.get("data") == "hello from A" and m.get("from") == ida, m
                assert m.get("channel") == room and "event" not in m, m
                seqs.add(m.get("seq"))
            assert len(seqs) == 1 and isinstance(next(iter(seqs)), int), f"same seq for all members: {seqs}"
            first_seq = seqs.pop()
            assert await asyncio.wait_for(r.recv(), 5) == "hello from A"

            # R (raw) sends binary: json members get base64 with from=R.
            await r.send(b"\x01\x02\xffraw")
            for ws in (a, b, c):
                m = await recv_json(ws)
                assert m.get("from") == idr and m.get("encoding") == "base64", m
                assert base64.b64decode(m["data"]) == b"\x01\x02\xffraw", m
                assert m.get("seq") == first_seq + 1, m
            assert await asyncio.wait_for(r.recv(), 5) == b"\x01\x02\xffraw"

            # C leaves: A and B get leave with the count after; R gets no event.
            await c.close()
            for ws in (a, b):
                assert_event(await recv_json(ws), "leave", room, client=idc, count=3)
            await expect_silence(r, 0.2)
            # R leaves too.
            await r.close()
            for ws in (a, b):
                assert_event(await recv_json(ws), "leave", room, client=idr, count=2)

            # B speaks; A and B see it, from=B, seq continues.
            await b.send("B here")
            for ws in (a, b):
                m = await recv_json(ws)
                assert (m.get("data"), m.get("from"), m.get("seq")) == ("B here", idb, first_seq + 2), m

            info = channel_info(srv.port, room)
            assert info.get("subscribers") == 2 and info.get("last_seq") == first_seq + 2, info

            await b.close()
            assert_event(await recv_json(a), "leave", room, client=idb, count=1)
            await expect_silence(a, 0.2)
        finally:
            for ws in opened:
                await ws.close()

    run(main())


def test_chat_rooms_are_isolated(start_server):
    srv = start_server()

    async def main():
        a, ida = await join_json(srv.url("/ws/chat:one?format=json"), "chat:one", 1)
        b, idb = await join_json(srv.url("/ws/chat:two?format=json"), "chat:two", 1)
        try:
            assert ida != idb
            await a.send("in one")
            m = await recv_json(a)
            assert m.get("data") == "in one" and m.get("channel") == "chat:one", m
            await expect_silence(b, 0.3)
        finally:
            await a.close()
            await b.close()

    run(main())


def test_chat_messages_from_many_members_keep_seq_order(start_server):
    """Concurrent senders: every member sees the same sequence, seq without gaps."""
    srv = start_server()
    room = "chat:busy"
    per_member = 30

    async def main():
        members = []
        for i in range(3):
            ws, _ = await join_json(srv.url(f"/ws/{room}?format=json"), room, i + 1)
            members.append(ws)
        try:
            # Drain join events (member 0 saw 2 joins, member 1 saw 1).
            for _ in range(2):
                assert_event(await recv_json(members[0]), "join", room)
            assert_event(await recv_json(members[1]), "join", room)
            wait_subscribers(srv.port, room, 3)

            async def talk(i, ws):
                for j in range(per_member):
                    await ws.send(f"m{i}-{j}")

            await asyncio.gather(*(talk(i, ws) for i, ws in enumerate(members)))
            total = per_member * len(members)
            seen = []
            for ws in members:
                got = [await recv_json(ws) for _ in range(total)]
                seqs = [m["seq"] for m in got]
                assert seqs == list(range(seqs[0], seqs[0] + total)), f"seq must increase by one: {seqs}"
                seen.append([(m["seq"], m["data"], m["from"]) for m in got])
                # each sender's own messages arrive in the order it sent them
                for i in range(len(members)):
                    mine = [m["data"] for m in got if m["data"].startswith(f"m{i}-")]
                    assert mine == [f"m{i}-{j}" for j in range(per_member)], mine
            assert seen[0] == seen[1] == seen[2], "all members must see the same sequence"
        finally:
            for ws in members:
                await ws.close()

    run(main())


def test_http_publish_to_chat_room_reaches_members(start_server):
    srv = start_server()
    room = "chat:announce"

    async def main():
        a, _ = await join_json(srv.url(f"/ws/{room}?format=json"), room, 1)
        try:
            seq = publish_ok(srv.port, room, "from the API")
            m = await recv_json(a)
            assert m.get("data") == "from the API" and m.get("seq") == seq and m.get("channel") == room, m
        finally:
            await a.close()

    run(main())
