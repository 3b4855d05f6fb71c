"""Idempotency keys on publishes: `Idempotency-Key` on POST /api/publish/{channel},
`"idempotency_key"` in a Pusher API event. A retry with the same key gets the first
publish's seq back (and `Idempotent-Replayed: true`), and subscribers get the
message once; on Redis the key is remembered in Redis, so a retry through another
node counts too. The forced timeout: Redis paused (`CLIENT PAUSE`) under a
publish, the publisher's HTTP client gives up, the publish lands once Redis wakes,
and the retry with the same key publishes nothing more."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from rawws import channel_info, publish, wait_subscribers
from support.pusher import APP, APP_ID, post_signed, PusherJs, sdk
from support.sentinel import SentinelSet
from support.redis import Redis
from support.wait import wait_healthy, wait_until
from wsutil import expect_silence, recv_json, run, ws_connect


def keyed(port: int, channel: str, data: str, key: str, timeout: float = 5.0):
    return publish(port, channel, data, headers=[("Idempotency-Key", key)], timeout=timeout)


def test_a_retry_with_the_same_key_gets_the_first_seq_and_is_delivered_once(start_server):
    node = start_server()

    async def main():
        ws = await ws_connect(node.url("/ws/orders?format=json"))
        other = await ws_connect(node.url("/ws/invoices?format=json"))
        try:
            wait_subscribers(node.port, "orders", 1)
            wait_subscribers(node.port, "invoices", 1)
            first = keyed(node.port, "orders", "created 17", "order-17")
            assert first.status == 200 and first.json() == {"seq": 1}, first
            assert first.header("idempotent-replayed") is None, first
            again = keyed(node.port, "orders", "created 17", "order-17")
            assert again.status == 200 and again.json() == {"seq": 1}, again
            assert again.header("idempotent-replayed") == "true", again
            assert (await recv_json(ws))["data"] == "created 17"
            await expect_silence(ws, 0.5)
            # Another key is another publish; the same key on another channel too.
            assert keyed(node.port, "orders", "created 18", "order-18").json() == {"seq": 2}
            assert keyed(node.port, "invoices", "for 17", "order-17").json() == {"seq": 1}
            assert (await recv_json(ws))["data"] == "created 18"
            assert (await recv_json(other))["data"] == "for 17"
            # Without a key nothing is remembered.
            assert publish(node.port, "orders", "plain").json() == {"seq": 3}
            assert publish(node.port, "orders", "plain").json() == {"seq": 4}
            assert channel_info(node.port, "orders")["last_seq"] == 4
        finally:
            await ws.close()
            await other.close()

    run(main())


@pytest.mark.parametrize(("key", "says"), [
    ("", "1 to 128 bytes, not 0"),
    ("k" * 129, "not 129"),
    ("two words", "visible ASCII"),
])
def test_a_bad_key_is_refused_and_nothing_is_published(start_server, key, says):
    node = start_server()
    resp = keyed(node.port, "orders", "x", key)
    assert resp.status == 400 and says in resp.json()["error"], resp
    assert resp.json()["error"].startswith("Idempotency-Key: "), resp
    assert channel_info(node.port, "orders")["last_seq"] == 0


def test_a_key_counts_across_nodes_on_redis(start_server, shared_redis, prefix):
    redis = shared_redis
    orders = f"{prefix}orders"  # the Redis is shared: a channel no other test names
    a = start_server("--broker", redis.url)
    b = start_server("--broker", redis.url)
    for node in (a, b):
        wait_healthy(node.port)

    async def main():
        subs = [await ws_connect(n.url(f"/ws/{orders}?format=json")) for n in (a, b)]
        try:
            for n in (a, b):
                wait_until(lambda n=n: channel_info(n.port, orders)["subscribers"] == 2, what="subscribed")
            assert keyed(a.port, orders, "created 17", "order-17").json() == {"seq": 1}
            again = keyed(b.port, orders, "created 17", "order-17")
            assert again.status == 200 and again.json() == {"seq": 1}, again
            assert again.header("idempotent-replayed") == "true", again
            for ws in subs:
                assert (await recv_json(ws))["data"] == "created 17"
                await expect_silence(ws, 0.5)
            # Remembered in the channel's slot, for as long as the server says.
            ttl = int(redis.cli("TTL", f"throng:{{{orders}}}:idem:order-17"))
            assert 290 <= ttl <= 300, ttl
        finally:
            for ws in subs:
                await ws.close()

    run(main())


def test_a_retry_after_a_forced_timeout_is_delivered_once(start_server):
    # Redis paused under the publish: the publisher's client gives up after
    # 0.3 s, although the publish goes on and lands when Redis wakes. Its retry,
    # with the same key, publishes nothing more.
    redis = Redis()
    try:
        node = start_server("--broker", redis.url)
        wait_healthy(node.port)

        async def main():
            ws = await ws_connect(node.url("/ws/orders?format=json"))
            try:
                wait_subscribers(node.port, "orders", 1)
                assert redis.cli("CLIENT", "PAUSE", "800", "WRITE") == "OK"
                with pytest.raises((socket.timeout, TimeoutError)):
                    keyed(node.port, "orders", "created 17", "order-17", timeout=0.3)
                got = await recv_json(ws, timeout=10)
                assert (got["seq"], got["data"]) == (1, "created 17"), got
                deadline = time.monotonic() + 10
                while True:
                    retry = keyed(node.port, "orders", "created 17", "order-17")
                    if retry.status == 200:
                        break
                    # A node that saw its command time out retries Redis first.
                    assert retry.status == 503 and time.monotonic() < deadline, retry
                    await asyncio.sleep(0.1)
                assert retry.json() == {"seq": 1} and retry.header("idempotent-replayed") == "true", retry
                await expect_silence(ws, 0.5)
                assert channel_info(node.port, "orders")["last_seq"] == 1
            finally:
                await ws.close()

        run(main())
    finally:
        redis.stop()
        redis.dir.cleanup()


def test_pusher_events_with_an_idempotency_key_are_delivered_once(start_server, clients):
    # Sockudo's field: "idempotency_key" in an event, here through a signed
    # request and through the official Python SDK's trigger_batch.
    node = start_server("--pusher-app", APP)
    js: PusherJs = clients(node.port)
    js.connected()
    assert js.subscribe("orders")["type"] == "subscribed"
    event = {"name": "created", "channel": "orders", "data": json.dumps({"id": 17}),
             "idempotency_key": "order-17"}
    for _ in range(2):
        resp = post_signed(node.port, f"/apps/{APP_ID}/events", json.dumps(event).encode())
        assert resp.status == 200, resp
    api = sdk(node.port)
    for _ in range(2):
        api.trigger_batch([{"channel": "orders", "name": "paid", "data": "17", "idempotency_key": "paid-17"}])
    api.trigger("orders", "done", "")
    js.event("orders", "done")
    assert [e["data"] for e in js.got("created")] == [{"id": 17}], js.log
    assert [e["data"] for e in js.got("paid")] == [17], js.log
    bad = dict(event, idempotency_key=17)
    resp = post_signed(node.port, f"/apps/{APP_ID}/events", json.dumps(bad).encode())
    assert resp.status == 400 and "idempotency_key is a string" in resp.json()["error"], resp


def test_a_held_publish_retried_with_its_key_is_released_once(start_server):
    # --redis-wait-replicas 1 with the replica held back: the publish is held in
    # Redis and answered 503. Its retry with the same key, once the replica has
    # caught up, WAITs again and releases that same message: one delivery, the
    # first seq. A blind retry would have published it a second time.
    with SentinelSet() as sentinels:
        node = start_server("--broker", sentinels.url, "--redis-wait-replicas", "1")
        wait_healthy(node.port)
        master, replica = sentinels.master_port(), sentinels.replica_port()

        async def main():
            ws = await ws_connect(node.url("/ws/orders?format=json"))
            try:
                wait_subscribers(node.port, "orders", 1)
                sentinels.hold_replication()
                first = keyed(node.port, "orders", "created 17", "order-17")
                assert first.status == 503 and "NOTPUBLISHED" in first.json()["error"], first
                await expect_silence(ws, 0.5)
                sentinels.release_replication()
                wait_until(lambda: sentinels.offset(replica) == sentinels.offset(master), timeout=10, what="caught up")
                retry = keyed(node.port, "orders", "created 17", "order-17")
                assert retry.status == 200 and retry.json() == {"seq": 1}, retry
                assert retry.header("idempotent-replayed") == "true", retry
                got = await recv_json(ws)
                assert (got["seq"], got["data"]) == (1, "created 17"), got
                # Released now: a third try answers at once, and nothing more comes.
                assert keyed(node.port, "orders", "created 17", "order-17").json() == {"seq": 1}
                await expect_silence(ws, 0.5)
                assert sentinels.redis_command(master, "EXISTS", "throng:{orders}:held") == 0
            finally:
                await ws.close()

        run(main(), timeout=60)
