"""Failover honesty on a real Redis (Debian's redis-server on free ports, stopped by
pid): Redis replicates asynchronously and a restart may reload an older image, so a
Redis that may lack acknowledged publishes must never hand their seqs out again.
Each channel's epoch key carries the replication id of the Redis that wrote it
(src/broker/redis/origin.lua); another Redis starts a new epoch, and subscribers
that were live are told of it as a gap. `--redis-wait-replicas N` WAITs for
replicas before answering, and records whether they answered in time. The proof
under load: a Sentinel failover to a replica held back on purpose."""

from __future__ import annotations

import time

from procs import stop_process
from rawws import channel_info, http_request, metric, publish, publish_ok, settled, wait_subscribers
from support.sentinel import SETTLING, SentinelSet
from support.redis import Redis
from support.wait import wait_healthy, wait_until
from support.streams import EventReader
from wsutil import expect_silence, recv_json, run, ws_connect


def stamp(redis: Redis, channel: str) -> list[str]:
    """The channel's epoch key as (epoch, origin, waited)."""
    return redis.cli("GET", f"throng:{{{channel}}}:epoch").split(":")


def replid(redis: Redis) -> str:
    info = redis.cli("INFO", "replication")
    return next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("master_replid:"))


def test_a_redis_that_lost_its_data_starts_a_new_epoch_and_live_subscribers_are_told(start_server):
    redis = Redis()  # no persistence: a restart forgets everything
    try:
        a = start_server("--broker", redis.url)
        b = start_server("--broker", redis.url)
        for node in (a, b):
            wait_healthy(node.port)

        async def main():
            ws = await ws_connect(b.url("/ws/lost?format=json"))
            sse = EventReader(f"http://127.0.0.1:{b.port}/sse/lost")
            try:
                wait_until(lambda: channel_info(a.port, "lost")["subscribers"] == 2, what="2 subscribers")
                assert [publish_ok(a.port, "lost", f"m{i}") for i in range(3)] == [1, 2, 3]
                old = channel_info(a.port, "lost")["epoch"]
                assert stamp(redis, "lost") == [old, replid(redis), ""]
                got = [await recv_json(ws) for _ in range(3)]
                assert [m["seq"] for m in got] == [1, 2, 3], got
                redis.stop()
                redis.start()
                wait_healthy(a.port)
                wait_healthy(b.port)
                # The seqs start again, so the subscribers must hear of it first.
                assert publish_ok(a.port, "lost", "after") == 1
                new = channel_info(a.port, "lost")["epoch"]
                assert new != old
                gap = await recv_json(ws, timeout=10)
                assert gap == {"channel": "lost", "event": "gap", "from": 1, "to": 0,
                               "reason": "new epoch", "epoch": new}, gap
                after = await recv_json(ws)
                assert (after["seq"], after["data"]) == (1, "after"), after
                events = sse.wait(5, timeout=10)
                assert events[3]["event"] == "gap", events
                assert '"reason":"new epoch"' in events[3]["data"] and new in events[3]["data"], events
                assert events[4] == {"id": f"1:{new}", "data": "after"}, events
                assert metric(b.port, "throng_redis_new_epochs_total") == 1
            finally:
                await ws.close()
                sse.close()

        run(main(), timeout=60)
    finally:
        redis.stop()
        redis.dir.cleanup()


def test_a_restarted_redis_that_kept_everything_keeps_the_epoch(start_server):
    # appendfsync always: what Redis acknowledged is on disk, so a restart (a new
    # replication id) is trusted, and nobody is told of a gap.
    redis = Redis(persist=True)
    try:
        node = start_server("--broker", redis.url)
        wait_healthy(node.port)

        async def main():
            ws = await ws_connect(node.url("/ws/kept?format=json"))
            try:
                wait_until(lambda: channel_info(node.port, "kept")["subscribers"] == 1, what="subscribed")
                assert publish_ok(node.port, "kept", "before") == 1
                epoch = channel_info(node.port, "kept")["epoch"]
                assert (await recv_json(ws))["seq"] == 1
                first_id = replid(redis)
                redis.stop()
                redis.start()
                assert replid(redis) != first_id
                wait_healthy(node.port)
                assert publish_ok(node.port, "kept", "after") == 2
                assert channel_info(node.port, "kept")["epoch"] == epoch
                got = await recv_json(ws, timeout=10)
                assert (got["seq"], got["data"]) == (2, "after"), got
                assert stamp(redis, "kept")[1] == replid(redis)
            finally:
                await ws.close()

        run(main(), timeout=60)
    finally:
        redis.stop()
        redis.dir.cleanup()


def test_wait_for_replicas_is_recorded_in_the_stamp(start_server):
    master = Redis()
    replica = Redis(replica_of=master)
    try:
        node = start_server("--broker", master.url, "--redis-wait-replicas", "1")
        wait_healthy(node.port)
        assert publish_ok(node.port, "w", "replicated") == 1
        assert stamp(master, "w")[2] == "w"
        # The replica has it too, as the WAIT said.
        wait_until(lambda: replica.cli("GET", "throng:{w}:seq") == "1", what="replicated")
        stop_process(replica.proc)
        wait_until(lambda: "connected_slaves:0" in master.cli("INFO", "replication"), what="replica gone")
        # No replica linked: nothing is written, and the publisher is told to retry
        # (a 503 for a message nobody can have).
        resp = publish(node.port, "w", "alone")
        assert resp.status == 503 and "NOREPLICAS" in resp.json()["error"], resp
        assert master.cli("GET", "throng:{w}:seq") == "1"
        assert metric(node.port, "throng_redis_short_waits_total") == 0
    finally:
        replica.stop()
        master.stop()
        replica.dir.cleanup()
        master.dir.cleanup()


def test_a_short_wait_holds_the_message_until_replicas_have_it(start_server):
    # A replica linked but held back: WAIT comes back after its 500 ms with none.
    # The message is held in Redis: the publisher is told it was not published,
    # and no subscriber, history or seq shows it. Once the replica has caught up,
    # the next publish's WAIT covers it too, and both go out in seq order.
    with SentinelSet() as sentinels:
        node = start_server("--broker", sentinels.url, "--redis-wait-replicas", "1")
        wait_healthy(node.port)
        master, replica = sentinels.master_port(), sentinels.replica_port()

        async def main():
            ws = await ws_connect(node.url("/ws/s?format=json"))
            try:
                wait_subscribers(node.port, "s", 1)
                assert publish_ok(node.port, "s", "first") == 1
                assert (await recv_json(ws))["data"] == "first"
                sentinels.hold_replication()
                began = time.monotonic()
                resp = publish(node.port, "s", "held")
                assert time.monotonic() - began >= 0.4
                error = resp.json()["error"]
                assert resp.status == 503 and "NOTPUBLISHED" in error and "seq 2" in error, resp
                assert metric(node.port, "throng_redis_short_waits_total") == 1
                await expect_silence(ws, 1.0)
                info = channel_info(node.port, "s")
                assert (info["last_seq"], info["history_len"]) == (1, 1), info
                sentinels.release_replication()
                wait_until(lambda: sentinels.offset(replica) == sentinels.offset(master), 10, "caught up", ignore=SETTLING)
                assert publish_ok(node.port, "s", "next") == 3
                got = [await recv_json(ws) for _ in range(2)]
                assert [(m["seq"], m["data"]) for m in got] == [(2, "held"), (3, "next")], got
                info = channel_info(node.port, "s")
                assert (info["last_seq"], info["history_len"]) == (3, 3), info
                assert sentinels.redis_command(master, "EXISTS", "throng:{s}:held") == 0
            finally:
                await ws.close()

        run(main(), timeout=60)


def test_a_promoted_replica_that_lacks_nothing_keeps_the_epoch_only_after_wait(start_server):
    # Both nodes talk to the master; then the replica is promoted (REPLICAOF NO ONE)
    # and a node pointed at it publishes. Its replication id differs, its second
    # id is the master's: only a stamp made with WAIT is trusted there.
    for wait, kept in (("1", True), ("0", False)):
        master = Redis()
        replica = Redis(replica_of=master)
        try:
            node = start_server("--broker", master.url, "--redis-wait-replicas", wait)
            wait_healthy(node.port)
            for i in range(3):
                publish_ok(node.port, "p", f"m{i}")
            epoch = channel_info(node.port, "p")["epoch"]
            wait_until(lambda: replica.cli("GET", "throng:{p}:seq") == "3", what="replicated")
            replica.cli("REPLICAOF", "NO", "ONE")
            assert replid(replica) != replid(master)
            promoted = start_server("--broker", replica.url)
            wait_healthy(promoted.port)
            seq = publish_ok(promoted.port, "p", "after")
            info = channel_info(promoted.port, "p")
            if kept:
                assert (seq, info["epoch"]) == (4, epoch), (seq, info)
            else:
                assert seq == 1 and info["epoch"] != epoch, (seq, info)
        finally:
            replica.stop()
            master.stop()
            replica.dir.cleanup()
            master.dir.cleanup()


def test_a_sentinel_failover_to_a_lagging_replica_loses_nothing_silently_and_reuses_no_seq(start_server):
    # The replica replicates through a proxy that holds its bytes back, so the
    # publishes acknowledged while it is held are lost by the promotion, every time.
    # From the subscribers' side: every acknowledged message arrives or falls in
    # a gap they are told of, and no (epoch, seq) comes with two payloads.
    with SentinelSet() as sentinels:
        a = start_server("--broker", sentinels.url)
        b = start_server("--broker", sentinels.url)
        for node in (a, b):
            wait_healthy(node.port)
        master, replica = sentinels.master_port(), sentinels.replica_port()

        async def main():
            subs = [await ws_connect(n.url("/ws/lag?format=json")) for n in (a, b)]
            try:
                wait_until(lambda: channel_info(a.port, "lag")["subscribers"] == 2, what="2 subscribers")
                acked = {}
                for i in range(5):
                    acked[f"m{i}"] = publish_ok((a, b)[i % 2].port, "lag", f"m{i}")
                wait_until(lambda: sentinels.offset(replica) == sentinels.offset(master), 10, "in sync", ignore=SETTLING)
                sentinels.hold_replication()
                for i in range(5, 10):
                    acked[f"m{i}"] = publish_ok((a, b)[i % 2].port, "lag", f"m{i}")
                wait_until(lambda: sentinels.proxy.held_bytes() > 0, 10, "publishes held back", ignore=SETTLING)
                old_epoch = channel_info(a.port, "lag")["epoch"]
                got = [[await recv_json(ws, timeout=10) for _ in range(10)] for ws in subs]
                assert sentinels.kill_master() == master
                assert sentinels.wait_switched(master) == replica
                # The promoted replica lacks what was held: seqs 6-10 are gone there.
                assert sentinels.redis_command(replica, "GET", "throng:{lag}:seq") == "5"
                deadline = time.monotonic() + 30
                for i in range(10, 15):
                    while True:
                        resp = publish((a, b)[i % 2].port, "lag", f"m{i}")
                        if resp.status == 200:
                            acked[f"m{i}"] = resp.json()["seq"]
                            break
                        assert resp.status == 503 and time.monotonic() < deadline, resp
                        time.sleep(0.05)
                # A new epoch: the seqs start again instead of reusing 6-10.
                assert [acked[f"m{i}"] for i in range(10, 15)] == [1, 2, 3, 4, 5], acked
                for node in (a, b):
                    wait_healthy(node.port)
                new_epoch = channel_info(a.port, "lag")["epoch"]
                assert new_epoch != old_epoch
                for ws, stream in zip(subs, got):
                    stream += [await recv_json(ws, timeout=10) for _ in range(6)]
                    gap = stream[10]
                    assert (gap["event"], gap["reason"], gap["epoch"]) == ("gap", "new epoch", new_epoch), gap
                    data = [m["data"] for m in stream if "data" in m]
                    assert data == [f"m{i}" for i in range(15)], stream
                    seqs = [m["seq"] for m in stream if "seq" in m]
                    assert seqs == list(range(1, 11)) + list(range(1, 6)), seqs
                # A client resuming where it left off in the old epoch is told too.
                back = await ws_connect(b.url(f"/ws/lag?format=json&since=10&epoch={old_epoch}"))
                try:
                    first = await recv_json(back)
                    assert (first["event"], first["epoch"]) == ("epoch", new_epoch), first
                    told = await recv_json(back)
                    assert (told["event"], told["reason"]) == ("gap", "new epoch"), told
                finally:
                    await back.close()
            finally:
                for ws in subs:
                    await ws.close()

        run(main(), timeout=90)


def test_with_wait_for_replicas_a_failover_to_lagging_replicas_shows_nothing_they_lost(start_server):
    # The window WAIT alone left open: the master dies holding publishes its
    # replicas lack. With --redis-wait-replicas those were never shown (held
    # until WAIT, answered 503), so the promoted replica rightly goes on from
    # the last seq anyone saw, in the same epoch, without a gap. Two replicas,
    # both held back, so the promoted one has the other to WAIT for.
    with SentinelSet(replicas=2) as sentinels:
        a = start_server("--broker", sentinels.url, "--redis-wait-replicas", "1")
        b = start_server("--broker", sentinels.url, "--redis-wait-replicas", "1")
        for node in (a, b):
            wait_healthy(node.port)
        master = sentinels.master_port()

        async def main():
            subs = [await ws_connect(n.url("/ws/lag?format=json")) for n in (a, b)]
            try:
                wait_until(lambda: channel_info(a.port, "lag")["subscribers"] == 2, what="2 subscribers")
                acked = {}
                for i in range(5):
                    acked[f"m{i}"] = publish_ok((a, b)[i % 2].port, "lag", f"m{i}")
                epoch = channel_info(a.port, "lag")["epoch"]
                sentinels.hold_replication()
                for i in range(5, 8):
                    resp = publish((a, b)[i % 2].port, "lag", f"held{i}")
                    assert resp.status == 503 and "NOTPUBLISHED" in resp.json()["error"], resp
                assert sentinels.redis_command(master, "GET", "throng:{lag}:seq") == "8"
                got = [[await recv_json(ws, timeout=10) for _ in range(5)] for ws in subs]
                for ws in subs:
                    await expect_silence(ws, 0.5)
                assert sentinels.kill_master() == master
                new = sentinels.wait_switched(master)
                assert sentinels.redis_command(new, "GET", "throng:{lag}:seq") == "5"
                # Until Sentinel has the other replica follow the new master, its
                # publishes are refused (NOREPLICAS) or held: each try carries its
                # own payload, so what a refused try left held is told apart.
                refused = []
                deadline = time.monotonic() + 60
                for i in range(8, 13):
                    attempt = 0
                    while True:
                        data = f"m{i}.{attempt}"
                        resp = publish((a, b)[i % 2].port, "lag", data)
                        if resp.status == 200:
                            acked[data] = resp.json()["seq"]
                            break
                        assert resp.status == 503 and time.monotonic() < deadline, resp
                        refused.append(data)
                        attempt += 1
                        time.sleep(0.1)
                for node in (a, b):
                    wait_healthy(node.port)
                # Asked of a node whose listener may be a moment from resubscribed.
                resp = settled(lambda: http_request(a.port, "GET", "/api/channels/lag"), lambda r: r.status == 200)
                assert resp.status == 200 and resp.json()["epoch"] == epoch, resp
                last = max(acked.values())
                for ws, stream in zip(subs, got):
                    while not stream or stream[-1].get("seq", 0) < last:
                        stream.append(await recv_json(ws, timeout=10))
                    assert not [m for m in stream if "event" in m and m["event"] == "gap"], stream
                    seqs = [m["seq"] for m in stream]
                    assert seqs == list(range(1, last + 1)), stream
                    data = [m["data"] for m in stream]
                    # Nothing the dead master held was shown; every acknowledged
                    # publish was, at the seq its publisher was told.
                    assert not [d for d in data if d.startswith("held")], stream
                    assert {d: s for d, s in zip(data, seqs) if d in acked} == acked, (stream, acked)
                    assert set(data) - set(acked) <= set(refused), (stream, acked, refused)
            finally:
                for ws in subs:
                    await ws.close()

        run(main(), timeout=120)
