"""Two throng nodes joined through a real Redis (`--broker redis://…`, Debian's
redis-server: the worker's shared one under a `--redis-prefix` of the test's own,
or, for a test that stops it or reads it whole, one started here on a free port
and stopped by its pid): a message published on either node reaches every
subscriber on both, over WebSocket, SSE and long-poll, with one seq and one epoch everywhere; a subscriber that moves from one
node to the other with since= gets exactly what it missed; chat presence and
/api/channels are cluster-wide; what another program PUBLISHes into Redis is
delivered without a seq; Redis going away gives 503s (never a 200 for a lost
message), and a node cut off from Redis fills in what it missed once it is back;
deployments under different prefixes on one Redis see nothing of each other."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import threading
import time

import pytest

from conftest import free_port
from rawws import channel_info, http_request, publish, publish_ok
from support.streams import EventReader
from wsutil import recv_json, run, ws_connect
from support.redis import Redis
from support.streams import poll
from support.wait import wait_healthy, wait_until


def two_nodes(start_server, broker: tuple[str, ...], mode: str):
    a = start_server(*broker, "--redis-subscribe", mode)
    b = start_server(*broker, "--redis-subscribe", mode)
    for node in (a, b):
        wait_healthy(node.port)
    return a, b


@pytest.fixture(params=["channels", "pattern"])
def cluster(request, start_server, redis_args):
    """Two nodes on the worker's shared Redis under the test's own
    --redis-prefix (its channels, counts and pattern its own), subscribed per
    channel or by pattern."""
    return two_nodes(start_server, redis_args, request.param)


@pytest.fixture(params=["channels", "pattern"])
def own_cluster(request, start_server, redis):
    """Two nodes on a Redis of the test's own, under the default names: for the
    tests that stop it, PUBLISH into it on `throng:ch:NAME` as another program
    would, or count every subscription it holds (PUBSUB NUMPAT is the whole
    Redis')."""
    return two_nodes(start_server, ("--broker", redis.url), request.param)


def test_every_subscriber_on_both_nodes_gets_every_message_once_in_order(cluster):
    a, b = cluster
    n = 20

    async def main():
        ws_a = await ws_connect(a.url("/ws/news?format=json"))
        ws_b = await ws_connect(b.url("/ws/news?format=json"))
        sse_b = EventReader(f"http://127.0.0.1:{b.port}/sse/news")
        try:
            wait_until(lambda: channel_info(a.port, "news")["subscribers"] == 3, what="3 subscribers seen")
            seqs = [publish_ok((a if i % 2 else b).port, "news", f"m{i}") for i in range(n)]
            assert seqs == list(range(1, n + 1)), seqs
            for ws in (ws_a, ws_b):
                got = [await recv_json(ws) for _ in range(n)]
                assert [(m["seq"], m["data"]) for m in got] == [(i + 1, f"m{i}") for i in range(n)], got
            events = sse_b.wait(n)
            epoch = channel_info(b.port, "news")["epoch"]
            assert events == [{"id": f"{i + 1}:{epoch}", "data": f"m{i}"} for i in range(n)], events
        finally:
            await ws_a.close()
            await ws_b.close()
            sse_b.close()
        # A long-poll on either node sees the same history, seqs and epoch.
        for node in (a, b):
            answer = poll(node.port, "news", since=n - 3)
            assert [m["seq"] for m in answer["messages"]] == [n - 2, n - 1, n], answer
            assert answer["epoch"] == epoch and answer["next"] == n, answer

    run(main())
    epoch = channel_info(a.port, "news")["epoch"]
    for node in (a, b):
        info = channel_info(node.port, "news")
        assert (info["last_seq"], info["history_len"], info["epoch"]) == (n, n, epoch), info


def test_a_waiting_poll_on_one_node_is_answered_by_a_publish_on_the_other(cluster):
    a, b = cluster
    publish_ok(a.port, "lp", "before")
    result = {}

    def waiter():
        result["answer"] = poll(b.port, "lp", since=1, timeout=10)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.5)
    assert publish_ok(a.port, "lp", "after") == 2
    t.join(15)
    assert result["answer"]["messages"] == [{"seq": 2, "data": "after"}], result


def test_a_subscriber_moving_to_the_other_node_gets_exactly_what_it_missed(cluster):
    a, b = cluster

    async def main():
        ws = await ws_connect(a.url("/ws/move?format=json"))
        for i in range(5):
            publish_ok(a.port, "move", f"m{i}")
        got = [await recv_json(ws) for _ in range(5)]
        assert [m["seq"] for m in got] == [1, 2, 3, 4, 5]
        await ws.close()
        epoch = channel_info(a.port, "move")["epoch"]
        for i in range(5, 10):
            publish_ok(b.port, "move", f"m{i}")
        ws = await ws_connect(b.url(f"/ws/move?format=json&since=5&epoch={epoch}"))
        try:
            first = await recv_json(ws)
            assert first == {"channel": "move", "event": "epoch", "epoch": epoch, "last_seq": 10}, first
            missed = [await recv_json(ws) for _ in range(5)]
            assert [(m["seq"], m["data"]) for m in missed] == [(i + 1, f"m{i}") for i in range(5, 10)]
            publish_ok(a.port, "move", "live")
            live = await recv_json(ws)
            assert (live["seq"], live["data"]) == (11, "live"), live
        finally:
            await ws.close()

    run(main())


def test_sse_resumes_on_the_other_node_from_last_event_id(cluster):
    a, b = cluster
    for i in range(4):
        publish_ok(a.port, "ev", f"e{i}")
    epoch = channel_info(a.port, "ev")["epoch"]
    reader = EventReader(f"http://127.0.0.1:{b.port}/sse/ev", headers={"Last-Event-ID": f"2:{epoch}"})
    try:
        events = reader.wait(2)
        assert events == [{"id": f"3:{epoch}", "data": "e2"}, {"id": f"4:{epoch}", "data": "e3"}], events
    finally:
        reader.close()


def test_chat_rooms_span_nodes_with_cluster_wide_counts(cluster):
    a, b = cluster

    async def main():
        first = await ws_connect(a.url("/ws/chat:lobby?format=json"))
        welcome = await recv_json(first)
        assert welcome["event"] == "welcome" and welcome["count"] == 1, welcome
        second = await ws_connect(b.url("/ws/chat:lobby?format=json"))
        try:
            welcome = await recv_json(second)
            assert welcome["event"] == "welcome" and welcome["count"] == 2, welcome
            joined = await recv_json(first)
            assert (joined["event"], joined["count"]) == ("join", 2), joined
            await second.send("hello from b")
            for ws in (first, second):
                msg = await recv_json(ws)
                assert (msg.get("seq"), msg.get("data"), msg.get("from")) == (1, "hello from b", welcome["client"]), msg
        finally:
            await second.close()
        left = await recv_json(first)
        assert (left["event"], left["count"]) == ("leave", 1), left
        await first.close()

    run(main())


def test_channel_info_counts_subscribers_on_every_node(cluster):
    a, b = cluster

    async def main():
        socks = [await ws_connect(a.url("/ws/count")) for _ in range(2)]
        socks += [await ws_connect(b.url("/ws/count")) for _ in range(3)]
        try:
            for node in (a, b):
                wait_until(lambda: channel_info(node.port, "count")["subscribers"] == 5, what="5 subscribers")
        finally:
            for ws in socks:
                await ws.close()
        for node in (a, b):
            wait_until(lambda: channel_info(node.port, "count")["subscribers"] == 0, what="0 subscribers")

    run(main())


def test_what_another_program_publishes_into_redis_is_delivered_without_a_seq(own_cluster, redis):
    a, b = own_cluster

    async def main():
        ws = await ws_connect(b.url("/ws/outside?format=json"))
        raw = await ws_connect(a.url("/ws/outside"))
        sse = EventReader(f"http://127.0.0.1:{a.port}/sse/outside")
        try:
            publish_ok(a.port, "outside", "sequenced")
            assert int(redis.cli("PUBLISH", "throng:ch:outside", "from redis-cli")) == 2
            assert (await recv_json(ws))["seq"] == 1
            assert await recv_json(ws) == {"channel": "outside", "data": "from redis-cli"}
            assert await asyncio.wait_for(raw.recv(), 5) == "sequenced"
            assert await asyncio.wait_for(raw.recv(), 5) == "from redis-cli"
            events = sse.wait(2)
            assert events[1] == {"data": "from redis-cli"}, events
        finally:
            await ws.close()
            await raw.close()
            sse.close()
        # Not kept, and it used no seq.
        assert channel_info(a.port, "outside")["last_seq"] == 1

    run(main())


def test_redis_down_gives_503_and_subscribers_stay_then_everything_resumes(own_cluster, redis, request):
    a, b = own_cluster

    async def main():
        ws = await ws_connect(b.url("/ws/fault?format=json"))
        try:
            assert publish_ok(a.port, "fault", "one") == 1
            assert (await recv_json(ws))["data"] == "one"
            redis.stop()
            resp = publish(a.port, "fault", "lost?")
            assert resp.status == 503, resp
            assert "redis" in resp.json()["error"], resp.json()
            wait_healthy(a.port, healthy=False)
            wait_healthy(b.port, healthy=False)
            # The subscriber is still connected while Redis is away.
            await ws.ping()
            # Channel lookups are told to come back (a 503, not a channel at seq 0);
            # so are new subscribers when joining needs Redis (per-channel
            # subscriptions: not an empty event stream or a bare EOF). With one
            # pattern subscription a node can take them in and wait.
            paths = ["/api/channels/fault"]
            if request.node.callspec.params["own_cluster"] == "channels":
                paths += ["/sse/fault", "/poll/fault?since=1&timeout=1", "/poll/fault?timeout=0"]
            for path in paths:
                resp = http_request(a.port, "GET", path)
                assert resp.status == 503, f"{path}: {resp.status} {resp.body[:200]!r}"
                assert "broker unavailable" in resp.json()["error"], f"{path}: {resp.json()}"
            redis.start()
            wait_healthy(a.port)
            wait_healthy(b.port)
            seq = publish_ok(a.port, "fault", "two")
            # Redis came back empty: the channel's history started afresh, and the
            # subscriber is told so before the new epoch's first message.
            gap = await recv_json(ws, timeout=10)
            assert (gap["event"], gap["reason"], gap["to"]) == ("gap", "new epoch", seq - 1), gap
            msg = await recv_json(ws, timeout=10)
            assert (msg["seq"], msg["data"]) == (seq, "two"), msg
        finally:
            await ws.close()

    run(main(), timeout=60)


class CuttableProxy:
    """A TCP proxy in front of Redis for one node: `cut()` drops every proxied
    connection and refuses new ones until `restore()`, as a network partition
    between that node and Redis would."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        self.open = False
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def restore(self):
        self.open = True

    def close(self):
        self.cut()
        self.listener.close()


@pytest.mark.parametrize("mode", ["channels", "pattern"])
def test_a_node_cut_off_from_redis_fills_in_what_it_missed(start_server, redis, mode):
    proxy = CuttableProxy(redis.port)
    a = start_server("--broker", redis.url, "--redis-subscribe", mode)
    b = start_server("--broker", f"redis://127.0.0.1:{proxy.port}", "--redis-subscribe", mode)
    for node in (a, b):
        wait_healthy(node.port)

    async def main():
        ws = await ws_connect(b.url("/ws/gap?format=json"))
        try:
            publish_ok(a.port, "gap", "m0")
            assert (await recv_json(ws))["seq"] == 1
            # Node b loses Redis; node a goes on publishing (acknowledged) ...
            proxy.cut()
            wait_healthy(b.port, healthy=False)
            seqs = [publish_ok(a.port, "gap", f"m{i}") for i in range(1, 30)]
            assert seqs == list(range(2, 31))
            # ... and b's subscriber, still connected, gets all of it once b is back.
            proxy.restore()
            wait_healthy(b.port)
            got = [await recv_json(ws, timeout=10) for _ in range(29)]
            assert [(m["seq"], m["data"]) for m in got] == [(i + 1, f"m{i}") for i in range(1, 30)]
            publish_ok(a.port, "gap", "live")
            assert (await recv_json(ws, timeout=10))["seq"] == 31
        finally:
            await ws.close()
            proxy.close()

    run(main(), timeout=60)


def test_acknowledged_messages_survive_a_persistent_redis_restart(start_server):
    # With an append-only Redis, a 200 means kept: after Redis restarts, a client
    # resuming on either node gets every acknowledged message, same epoch.
    redis = Redis(persist=True)
    try:
        a = start_server("--broker", redis.url)
        b = start_server("--broker", redis.url)
        for node in (a, b):
            wait_healthy(node.port)
        acked = [publish_ok(a.port, "kept", f"k{i}") for i in range(5)]
        epoch = channel_info(a.port, "kept")["epoch"]
        redis.stop()
        assert publish(a.port, "kept", "refused").status == 503
        redis.start()
        wait_healthy(a.port)
        wait_healthy(b.port)
        answer = poll(b.port, "kept", since=0)
        assert answer["epoch"] == epoch, answer
        assert [(m["seq"], m["data"]) for m in answer["messages"]] == [
            (seq, f"k{i}") for i, seq in enumerate(acked)
        ], answer
        assert publish_ok(b.port, "kept", "after") == 6
    finally:
        redis.stop()
        redis.dir.cleanup()


def test_a_node_starts_without_redis_and_says_so(start_server):
    dead = free_port()
    node = start_server("--broker", f"redis://127.0.0.1:{dead}")
    assert http_request(node.port, "GET", "/healthz").status == 503
    resp = publish(node.port, "x", "hi")
    assert resp.status == 503, resp
    stats = http_request(node.port, "GET", "/api/stats").json()
    assert stats["broker"] == f"redis://127.0.0.1:{dead}", stats


def test_a_node_subscribes_in_redis_only_to_its_channels(own_cluster, redis):
    a, b = own_cluster

    async def main():
        ws = await ws_connect(b.url("/ws/only-b"))
        try:
            subscribed = redis.cli("PUBSUB", "CHANNELS", "throng:ch:*").split()
            patterns = int(redis.cli("PUBSUB", "NUMPAT"))
            if patterns:  # pattern mode: the nodes' one pattern, no channels
                assert (patterns, subscribed) == (1, []), (patterns, subscribed)
            else:
                assert subscribed == ["throng:ch:only-b"], subscribed
        finally:
            await ws.close()
        if not patterns:
            wait_until(lambda: redis.cli("PUBSUB", "CHANNELS", "throng:ch:*") == "", what="unsubscribed")

    run(main())


def test_a_bad_broker_is_refused_at_start():
    from conftest import throng_bin

    out = subprocess.run(
        [str(throng_bin()), "serve", "--listen", f"127.0.0.1:{free_port()}", "--broker", "postgres://x"],
        capture_output=True, timeout=10,
    )
    assert out.returncode != 0
    assert b"memory, redis://" in out.stderr, out.stderr


def test_redis_prefixes_keep_deployments_on_one_redis_apart(start_server, shared_redis, redis_prefix):
    """Two nodes under one --redis-prefix and one under another, on one Redis:
    the same channel name is two channels (seqs, messages, counts, Pusher's
    channel list), and every key is under one of the prefixes."""
    from support.pusher import APP, APP_ID, sdk

    mine, theirs = f"{redis_prefix}-a", f"{redis_prefix}-b"
    a1, a2, b = (start_server("--broker", shared_redis.url, "--redis-prefix", p, "--pusher-app", APP)
                 for p in (mine, mine, theirs))
    for node in (a1, a2, b):
        wait_healthy(node.port)
    stats = http_request(b.port, "GET", "/api/stats").json()
    assert stats["broker"] == f"{shared_redis.url} (prefix {theirs})", stats
    app_channel = f"{APP_ID}:room"

    async def main():
        socks = {}
        for name, node in (("a1", a1), ("a2", a2), ("b", b)):
            socks[name] = await ws_connect(node.url("/ws/news?format=json"))
        b_room = await ws_connect(b.url(f"/ws/{app_channel}"))
        try:
            wait_until(lambda: channel_info(a1.port, "news")["subscribers"] == 2, what="a's two subscribers")
            assert channel_info(b.port, "news")["subscribers"] == 1
            assert publish_ok(a1.port, "news", "from a") == 1
            assert publish_ok(b.port, "news", "from b") == 1, "b's channel has its own seqs"
            assert publish_ok(a2.port, "news", "a again") == 2
            for name, expected in (("a1", ["from a", "a again"]), ("a2", ["from a", "a again"]), ("b", ["from b"])):
                got = [(await recv_json(socks[name]))["data"] for _ in expected]
                assert got == expected, (name, got)
            publish_ok(b.port, "news", "b marker")
            assert (await recv_json(socks["b"]))["data"] == "b marker", "nothing of a's came to b"
            # Pusher's channel list (the members' hashes SCANned) is each prefix's own.
            listed = lambda node: sorted(sdk(node.port).channels_info()["channels"])  # noqa: E731
            wait_until(lambda: listed(b) == ["room"], what="b lists its room")
            assert listed(a1) == [], listed(a1)
            assert channel_info(a2.port, app_channel)["subscribers"] == 0
            subscribed = sorted(shared_redis.cli("PUBSUB", "CHANNELS", f"{theirs}:ch:*").split())
            assert subscribed == [f"{theirs}:ch:{app_channel}", f"{theirs}:ch:news"], subscribed
        finally:
            for ws in (*socks.values(), b_room):
                await ws.close()

    run(main())
    # Every key on the Redis is under a prefix; this test's under its two (the
    # other tests on the default prefix put theirs in front of channel names).
    keys = shared_redis.cli("KEYS", "*").split()
    assert all(re.match(r"[A-Za-z0-9_.-]+:", k) for k in keys), keys
    ours = [k for k in keys if k.startswith(redis_prefix)]
    assert any(k.startswith(f"{mine}:") for k in ours) and any(k.startswith(f"{theirs}:") for k in ours), ours
    assert all(k.startswith((f"{mine}:", f"{theirs}:")) for k in ours), ours
    strays = [k for k in keys if k.startswith(("throng:{news}", f"throng:{{{app_channel}}}"))]
    assert strays == [], strays
    nodes = lambda p: int(shared_redis.cli("ZCARD", f"{p}:nodes"))  # noqa: E731
    assert (nodes(mine), nodes(theirs)) == (2, 1)


def test_a_bad_redis_prefix_is_refused_at_start():
    from conftest import throng_bin

    out = subprocess.run(
        [str(throng_bin()), "serve", "--listen", f"127.0.0.1:{free_port()}", "--redis-prefix", "a{b}"],
        capture_output=True, timeout=10,
    )
    assert out.returncode != 0
    assert b"--redis-prefix" in out.stderr and b"only letters, digits" in out.stderr, out.stderr
