"""throng on a real Redis Cluster (`--broker redis-cluster://…`): three masters with a
replica each (Debian's redis-server, `redis-cli --cluster create`, free ports,
stopped by pid). Channels spread over every master; each node SSUBSCRIBEs only on
the masters of its channels' slots (sharded pub/sub, so a message is carried by one
shard, not copied to every Redis node); every subscriber on both nodes gets every
message once in seq order; what another program SPUBLISHes is delivered; a master
killed and replaced by its replica, and a slot moved to another master under load,
lose no subscriber, and no seq is ever delivered with two payloads."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from rawws import channel_info, http_request, publish
from support.cluster import RedisCluster
from support.pusher import APP
from support.webhooks import presence_and_occupancy_across
from support.wait import wait_healthy, wait_until
from wsutil import recv_json, run, ws_connect

CHANNELS = [f"room{i}" for i in range(24)]


@pytest.fixture(scope="module")
def shared_cluster():
    """One Cluster (7 s to start) for the tests of this module that leave its
    topology alone, each on channels of its own (`prefix`, or a name no other
    test here uses); they run one at a time on an xdist worker."""
    c = RedisCluster(masters=3, replicas=1)
    yield c
    c.stop()


@pytest.fixture
def redis_cluster():
    """A Cluster of the test's own: it fails a master over or migrates a slot."""
    c = RedisCluster(masters=3, replicas=1)
    yield c
    c.stop()


@pytest.fixture
def wait_replicas():
    """--redis-wait-replicas of the nodes (a test may parametrize it)."""
    return "0"


def two_nodes(start_server, cluster, wait_replicas):
    a = start_server("--broker", cluster.url, "--redis-wait-replicas", wait_replicas)
    b = start_server("--broker", cluster.url, "--redis-wait-replicas", wait_replicas)
    for node in (a, b):
        wait_healthy(node.port, timeout=20)
    return a, b


@pytest.fixture
def nodes(start_server, redis_cluster, wait_replicas):
    """Two nodes on the test's own Cluster."""
    return two_nodes(start_server, redis_cluster, wait_replicas)


@pytest.fixture
def shared_nodes(start_server, shared_cluster, wait_replicas):
    """Two nodes on the module's shared Cluster."""
    return two_nodes(start_server, shared_cluster, wait_replicas)


def publish_retrying(port: int, channel: str, data: str, deadline: float) -> int:
    """Publishes until a 200 (a failover answers 503 for a while); its seq."""
    while True:
        resp = publish(port, channel, data)
        if resp.status == 200:
            return resp.json()["seq"]
        assert resp.status == 503, resp
        assert time.monotonic() < deadline, f"publishes still refused: {resp.body!r}"
        time.sleep(0.05)


@pytest.mark.parametrize("wait_replicas", ["0", "1"])
def test_channels_on_every_master_reach_every_subscriber_once_in_order(shared_nodes, shared_cluster, wait_replicas, prefix):
    # With --redis-wait-replicas 1 each message is held on its master until that
    # master's replica has it (WAIT), then released: the same order, nothing left held.
    a, b = shared_nodes
    redis_cluster = shared_cluster
    # The Cluster is shared: channels no other test names, and only theirs looked at.
    channels = [f"{prefix}{c}" for c in CHANNELS]
    mine_only = f"throng:ch:{{{prefix}*"
    masters = {redis_cluster.master_of(f"throng:{{{c}}}:seq").port for c in channels}
    assert len(masters) == 3, "the test channels should land on every master"

    async def main():
        subs = {}
        for c in channels:
            subs[c] = [await ws_connect(n.url(f"/ws/{c}?format=json")) for n in (a, b)]
        try:
            for c in channels:
                wait_until(lambda c=c: channel_info(a.port, c)["subscribers"] == 2, what=f"{c} subscribed")
            # Each master carries only its own channels, as shard channels.
            for m in redis_cluster.masters():
                shard = set(m.cli("PUBSUB", "SHARDCHANNELS", mine_only).split())
                mine = {f"throng:ch:{{{c}}}" for c in channels if redis_cluster.master_of(c).port == m.port}
                assert shard == mine, (m.port, shard, mine)
                assert m.cli("PUBSUB", "CHANNELS", f"throng:ch:{prefix}*") == "", "no classic subscriptions"
            for i in range(5):
                for j, c in enumerate(channels):
                    node = (a, b)[(i + j) % 2]
                    resp = publish(node.port, c, f"{c}-{i}")
                    assert resp.status == 200 and resp.json()["seq"] == i + 1, resp
            for c in channels:
                for ws in subs[c]:
                    got = [await recv_json(ws, timeout=10) for _ in range(5)]
                    assert [(m["seq"], m["data"]) for m in got] == [(i + 1, f"{c}-{i}") for i in range(5)], got
            released = set()
            for m in redis_cluster.masters():
                assert m.cli("KEYS", f"throng:{{{prefix}*:held") == "", "nothing left held"
                released |= set(m.cli("KEYS", f"throng:{{{prefix}*:released").split())
            assert released == ({f"throng:{{{c}}}:released" for c in channels} if wait_replicas == "1" else set())
            # Another program's SPUBLISH on the shard channel: delivered, no seq.
            c = channels[0]
            redis_cluster.master_of(c).cli("SPUBLISH", f"throng:ch:{{{c}}}", "from-outside")
            for ws in subs[c]:
                got = await recv_json(ws, timeout=10)
                assert got["data"] == "from-outside" and "seq" not in got, got
        finally:
            for pair in subs.values():
                for ws in pair:
                    await ws.close()

    run(main(), timeout=120)
    # The last subscriber gone, the node leaves the shard channel.
    wait_until(lambda: all(m.cli("PUBSUB", "SHARDCHANNELS", mine_only) == "" for m in redis_cluster.masters()),
             timeout=10, what="shard channels left")


def test_pusher_presence_and_webhooks_span_nodes_on_a_cluster(start_server, shared_cluster, receiver, clients):
    # Presence users, member_added/removed between nodes (SPUBLISHed on the
    # channel's shard channel) and occupancy webhooks said once for the cluster.
    # On the shared Cluster: no other test of this module names presence-room.
    flags = ("--broker", shared_cluster.url, "--pusher-app", APP, "--pusher-webhook", receiver.url)
    a, b = start_server(*flags), start_server(*flags)
    for node in (a, b):
        wait_healthy(node.port, timeout=20)
    presence_and_occupancy_across(a, b, receiver, clients)


async def collect(ws, into: list, stop: asyncio.Event):
    while not stop.is_set():
        try:
            into.append(await recv_json(ws, timeout=0.5))
        except asyncio.TimeoutError:
            continue


def check_stream(got: list, acked: dict) -> None:
    """Seqs rise within an epoch (a gap event starts another), no (epoch, seq)
    twice, and every acknowledged publish arrived or a gap names it."""
    seen = {}
    epoch = None
    gaps = 0
    last = 0
    for m in got:
        if m.get("event") == "gap":
            gaps += 1
            epoch = m["epoch"]
            last = 0
            continue
        assert m["seq"] > last, (m, got[-20:])
        last = m["seq"]
        key = (epoch, m["seq"])
        assert key not in seen, f"seq {key} delivered twice: {seen[key]!r} and {m['data']!r}"
        seen[key] = m["data"]
    delivered = set(seen.values())
    missing = [d for d in acked if d not in delivered]
    assert not missing or gaps, f"acknowledged but never delivered, and no gap told: {missing[:10]}"


def test_a_master_failover_and_a_slot_migration_under_load_lose_no_subscriber(nodes, redis_cluster):
    a, b = nodes
    channel = CHANNELS[1]

    async def main():
        subs = [await ws_connect(n.url(f"/ws/{channel}?format=json")) for n in (a, b)]
        got = [[], []]
        stop = asyncio.Event()
        readers = [asyncio.create_task(collect(ws, got[i], stop)) for i, ws in enumerate(subs)]
        acked = {}
        try:
            wait_until(lambda: channel_info(a.port, channel)["subscribers"] == 2, what="subscribed")
            n = 0

            async def burst(count: int, deadline: float):
                nonlocal n
                for _ in range(count):
                    data = f"m{n}"
                    n += 1
                    seq = await asyncio.to_thread(publish_retrying, (a, b)[n % 2].port, channel, data, deadline)
                    acked[data] = seq

            await burst(20, time.monotonic() + 10)
            # 1) The channel's master dies; its replica takes over.
            master = redis_cluster.master_of(channel)
            master.kill()
            await burst(30, time.monotonic() + 30)
            redis_cluster.wait_ok()
            # 2) The channel's slot moves to another master while publishing.
            source = redis_cluster.master_of(channel)
            target = next(m for m in redis_cluster.masters() if m.port != source.port)
            slot = source.cli("CLUSTER", "KEYSLOT", channel)
            mover = asyncio.create_task(asyncio.to_thread(migrate_slot, redis_cluster, source, target, slot))
            await burst(30, time.monotonic() + 30)
            await mover
            await burst(20, time.monotonic() + 30)
            assert redis_cluster.master_of(channel).port == target.port
            # Everything acknowledged arrives (or a gap names it) on both nodes.
            last = f"m{n - 1}"
            deadline = time.monotonic() + 15
            while not all(any(m.get("data") == last for m in g) for g in got):
                assert time.monotonic() < deadline, "the last publish never arrived"
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.gather(*readers)
            for ws in subs:
                await ws.close()
        for g in got:
            check_stream(g, acked)

    run(main(), timeout=180)
    for node in (a, b):
        assert http_request(node.port, "GET", "/healthz").status == 200


def migrate_slot(cluster: RedisCluster, source, target, slot: str) -> None:
    """Moves one slot by hand, as `redis-cli --cluster reshard` does."""
    src_id = source.cli("CLUSTER", "MYID")
    dst_id = target.cli("CLUSTER", "MYID")
    target.cli("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    source.cli("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    while True:
        keys = source.cli("CLUSTER", "GETKEYSINSLOT", slot, "100").split()
        if not keys:
            break
        subprocess.run(["redis-cli", "-p", str(source.port), "MIGRATE", "127.0.0.1", str(target.port), "", "0",
                        "5000", "KEYS", *keys], capture_output=True, timeout=10, check=True)
    for node in cluster.masters():
        node.cli("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


@pytest.mark.parametrize(("flags", "says"), [
    (["--broker", "redis-cluster://127.0.0.1:1", "--redis-subscribe", "pattern"], b"sharded pattern"),
    (["--broker", "redis-cluster://127.0.0.1"], b"a cluster node must be host:port"),
    (["--broker", "redis-cluster://"], b"a cluster node must be host:port"),
])
def test_what_a_cluster_cannot_do_is_refused_at_start(flags, says):
    from conftest import free_port, throng_bin

    out = subprocess.run([str(throng_bin()), "serve", "--listen", f"127.0.0.1:{free_port()}", *flags],
                         capture_output=True, timeout=10)
    assert out.returncode != 0
    assert says in out.stderr, out.stderr
