"""A slow or half-cut Redis holds up only what needs Redis (issue 46).

While Redis is slow (a Toxiproxy latency toxic on Redis -> node) or half cut (an
iptables rule in the network namespace Redis runs in drops what it sends to the
node), the HTTP publishes to a node wait for it, and nothing else on that node
does: an echo and an already-subscribed client's ping are answered while every
publish is still unanswered, and /healthz and /api/stats are answered. Those nodes
run one event
loop (`--threads 1`), so the publishes and the echo share the loop: before issue
46 the loop itself waited on Redis and the echo was answered only after a
publish. Whether a publish was answered is read from its socket (readable or not, the
bytes the kernel holds), so "before" is the order the node wrote in, not the
order this process happened to look in. A drain (SIGTERM) answers a publish
waiting on Redis before the node exits.

And one channel published from many keep-alive connections on two nodes at once
(each request waiting for the last one's answer, or pipelined) keeps one seq
order, seen the same on both nodes, each connection's messages in its order."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import tcp_connectable
from procs import stop_process
from rawws import RawConn, wait_subscribers
from support import netns
from support.pusher import APP, APP_ID, signed
from support.wait import wait_healthy, wait_until
from wsutil import recv_json, run, ws_connect

# How late Redis' answers are in the slow-Redis test (Toxiproxy latency, Redis -> node):
# the case, and below the 1 s a Redis command may take before Redis counts as
# down (timing::REDIS_TIMEOUT), so every held publish is published and answered 200.
LATENCY_MS = 500
# How many /api/publish requests are held up at once (plus one Pusher trigger).
HELD_PUBLISHES = 6
# How long a publish may take to be answered at all (it is not a speed check: a
# bound so that a hung node fails the test instead of hanging it).
ANSWER_BOUND = 30.0


# -- publishes held open on raw sockets ---------------------------------------

def send_publish(port: int, channel: str, data: str) -> RawConn:
    """Sends POST /api/publish/{channel} and returns the connection unread."""
    body = data.encode()
    conn = RawConn(port, timeout=ANSWER_BOUND)
    conn.send(f"POST /api/publish/{channel} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
              f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return conn


def send_trigger(port: int, channel: str, data: str) -> RawConn:
    """Sends a signed Pusher HTTP API trigger (POST /apps/ID/events), unread."""
    body = json.dumps({"name": "held", "channel": channel, "data": data}).encode()
    target = signed("POST", f"/apps/{APP_ID}/events", body)
    conn = RawConn(port, timeout=ANSWER_BOUND)
    conn.send(f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return conn


def answered(conn: RawConn) -> bool:
    """Whether the node has written anything (or closed) on this connection yet:
    readable now, by a zero-timeout select (a recv would wait out the socket's
    timeout first, whatever its flags)."""
    readable, _, _ = select.select([conn.sock], [], [], 0)
    return bool(readable)


def seq_in_redis(cli, redis_prefix: str, channel: str) -> int:
    return int(cli("GET", f"{redis_prefix}:{{{channel}}}:seq") or 0)


def hold_publishes(node, channel: str, trigger_channel: str):
    """HELD_PUBLISHES publishes and one trigger sent. The checks that need no Redis
    start at once (on a loaded machine, anything slow here could outlast Redis'
    delay): the node has one loop, and it reads sockets written before the echo's
    no later than the echo, so a loop that waited on Redis would answer the echo
    after a publish. That Redis ran them is checked after."""
    held = [send_publish(node.port, channel, f"held-{i}") for i in range(HELD_PUBLISHES)]
    held.append(send_trigger(node.port, trigger_channel, "held-trigger"))
    return held


async def answered_without_redis(node, echo, subscriber, held: list[RawConn]) -> list[str]:
    """What a node answers from memory: an echo and the pong to an
    already-subscribed client's ping, both before any held publish is answered
    (the node runs one loop: had it waited on Redis, they would have come after);
    then /healthz (it may say 503: the broker is failing) and /api/stats, which
    need only be answered (on a loaded machine they may take longer than Redis's
    timeout, which answers the publishes 503)."""
    done = []
    await echo.send("still here")
    assert await asyncio.wait_for(echo.recv(), ANSWER_BOUND) == "still here"
    done.append("echo")
    await asyncio.wait_for(await subscriber.ping(), ANSWER_BOUND)
    done.append("subscriber's pong")
    assert_none_answered(held, done)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.port}", trust_env=False,
                                 timeout=ANSWER_BOUND) as http:
        health = await http.get("/healthz")
        assert health.status_code in (200, 503), health
        done.append(f"/healthz {health.status_code}")
        stats = await http.get("/api/stats")
        assert stats.status_code == 200 and isinstance(stats.json(), dict), stats
        done.append("/api/stats")
    return done


def assert_none_answered(held: list[RawConn], done: list[str]) -> None:
    early = [i for i, conn in enumerate(held) if answered(conn)]
    assert not early, (f"publishes {early} (of {len(held)}; the last is the Pusher trigger) were answered "
                       f"before {done} were: they waited behind the broker")


async def held_behind_redis(node, echo, subscriber, cli, redis_prefix: str, channel: str,
                            trigger_channel: str) -> list:
    """Publishes (and a trigger) held up by Redis after the warm-up's seq 1, the
    node's memory-only answers given while none of them is answered, then their
    answers once they come."""
    held = hold_publishes(node, channel, trigger_channel)
    try:
        await answered_without_redis(node, echo, subscriber, held)
        # Read from Redis itself, not through the node: they were in its hands.
        await asyncio.to_thread(wait_until, lambda: seq_in_redis(cli, redis_prefix, channel) > 1,
                                timeout=10, what="Redis ran none of the held publishes")
        return await asyncio.to_thread(read_answers, held)
    finally:
        for conn in held:
            conn.close()


def read_answers(held: list[RawConn]) -> list:
    answers = []
    for conn in held:
        with conn:
            answers.append(conn.read_http_response(timeout=ANSWER_BOUND))
    return answers


def publish_until_ok(port: int, channel: str, data: str, timeout: float = 30.0) -> int:
    """Publishes until one is answered 200 (the broker may fail fast for a while
    after Redis is back) and returns its seq."""
    def attempt():
        resp = httpx.post(f"http://127.0.0.1:{port}/api/publish/{channel}", content=data,
                          headers={"Content-Type": "text/plain"}, timeout=10, trust_env=False)
        return resp.json()["seq"] if resp.status_code == 200 else None
    return wait_until(attempt, timeout=timeout, interval=0.2, ignore=(httpx.TransportError,),
                      what=f"no publish on {port} answered 200 within {timeout}s")


async def receive_seq(subscriber, seq: int) -> str:
    """The data of message `seq` (an earlier attempt answered 503 may have been
    published too, and arrives first)."""
    while True:
        message = await recv_json(subscriber, timeout=ANSWER_BOUND)
        if message.get("seq") == seq:
            return message["data"]
        assert message.get("seq", 0) < seq, message


# -- a slow Redis ---------------------------------------------------------------

def test_a_slow_redis_holds_up_the_publishes_and_nobody_else(start_server, shared_redis, redis_prefix, prefix,
                                                           toxiproxy):
    """Before issue 46 it failed at assert_none_answered: the one loop waited on
    Redis for each publish, and every publish was answered before the echo. Now
    each is answered 200 with its own seq once Redis answers."""
    proxy = toxiproxy.add_proxy("redis", f"127.0.0.1:{shared_redis.port}")
    node = start_server("--broker", f"redis://127.0.0.1:{proxy.port}", "--redis-prefix", redis_prefix,
                        "--threads", "1", "--pusher-app", APP)
    wait_healthy(node.port)
    channel, quiet, pusher_channel = f"{prefix}slow", f"{prefix}quiet", f"{prefix}trig"
    # The first publish opens the pooled connection and loads the scripts: the
    # held ones below then each need one command, and Redis runs it at once.
    assert publish_until_ok(node.port, channel, "warm-up", timeout=10) == 1

    async def main():
        async with ws_connect(node.url(f"/ws/{quiet}?format=json")) as subscriber, \
                ws_connect(node.url("/echo")) as echo:
            wait_subscribers(node.port, quiet, 1)
            proxy.add_latency(LATENCY_MS)
            answers = await held_behind_redis(node, echo, subscriber, shared_redis.cli, redis_prefix,
                                              channel, pusher_channel)
            proxy.remove_toxic()
            # The subscriber subscribed before Redis slowed down is still served.
            seq = await asyncio.to_thread(publish_until_ok, node.port, quiet, "after")
            assert await receive_seq(subscriber, seq) == "after"
        return answers

    answers = run(main(), timeout=120)
    assert {a.status for a in answers} == {200}, answers
    # Each held publish got its own seq, after the warm-up's 1.
    api_answers = answers[:HELD_PUBLISHES]
    assert sorted(a.json()["seq"] for a in api_answers) == list(range(2, HELD_PUBLISHES + 2)), answers


def test_a_drain_answers_the_publish_waiting_on_redis_before_it_closes(start_server, shared_redis, redis_prefix,
                                                                       prefix, toxiproxy):
    """SIGTERM while a publish waits on a slow Redis: the drain closes idle HTTP
    connections after its grace, but not one waiting on the broker; it gets its
    answer (200 with its seq, and Connection: close), then the node exits."""
    proxy = toxiproxy.add_proxy("redis", f"127.0.0.1:{shared_redis.port}")
    node = start_server("--broker", f"redis://127.0.0.1:{proxy.port}", "--redis-prefix", redis_prefix,
                        "--threads", "1")
    wait_healthy(node.port)
    channel = f"{prefix}drained"
    assert publish_until_ok(node.port, channel, "warm-up", timeout=10) == 1
    proxy.add_latency(LATENCY_MS)
    with send_publish(node.port, channel, "while draining") as conn:
        wait_until(lambda: seq_in_redis(shared_redis.cli, redis_prefix, channel) > 1, timeout=10,
                   what="Redis ran the held publish")
        node.signal(signal.SIGTERM)
        answer = conn.read_http_response(timeout=ANSWER_BOUND)
    assert answer.status == 200 and answer.json()["seq"] == 2, answer
    assert (answer.header("connection") or "").lower() == "close", answer.headers
    assert node.wait(timeout=30) == 0, node.describe()


def test_a_client_that_half_closes_after_its_publish_still_gets_the_answer(start_server, shared_redis,
                                                                           redis_prefix, prefix, toxiproxy):
    """A client that sends its publish and shuts down its sending side (as
    `printf ... | nc` does) while Redis is slow: the node answers it once Redis
    answers, then closes."""
    proxy = toxiproxy.add_proxy("redis", f"127.0.0.1:{shared_redis.port}")
    node = start_server("--broker", f"redis://127.0.0.1:{proxy.port}", "--redis-prefix", redis_prefix,
                        "--threads", "1")
    wait_healthy(node.port)
    channel = f"{prefix}halfclosed"
    assert publish_until_ok(node.port, channel, "warm-up", timeout=10) == 1
    proxy.add_latency(LATENCY_MS)
    with send_publish(node.port, channel, "then done") as conn:
        conn.sock.shutdown(socket.SHUT_WR)
        answer = conn.read_http_response(timeout=ANSWER_BOUND)
    assert answer.status == 200 and answer.json()["seq"] == 2, answer


# -- a half-cut Redis ------------------------------------------------------------

def free_subnet() -> str:
    """A 10.215.X.Y/30 whose addresses this host does not have: "10.215.X.Y" (Y % 4 == 0)."""
    taken = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=10).stdout
    for _ in range(100):
        net = f"10.215.{secrets.randbelow(256)}.{4 * secrets.randbelow(64)}"
        if net.rsplit(".", 1)[0] + "." not in taken:
            return net
    raise AssertionError("no free 10.215.X.Y/30")


@pytest.fixture
def redis_in_a_namespace():
    """A redis-server inside a network namespace of the test's own (joined to this
    host by a veth pair, like a Redis on another machine), and a switch that drops
    every packet it sends to this host, one direction only. Names are unique to
    this run (pid and random), so it may run beside other tests; the namespace
    and the host's end of the pair are always removed."""
    tag = f"{os.getpid() % 10000}{secrets.token_hex(2)}"
    ns, host_if, ns_if = f"thrcut{tag}", f"tc{tag}a", f"tc{tag}b"
    net, last = free_subnet().rsplit(".", 1)
    host_ip, ns_ip = f"{net}.{int(last) + 1}", f"{net}.{int(last) + 2}"
    port = 6379  # the namespace's own port space: nothing else is there
    workdir = tempfile.TemporaryDirectory(prefix="throng-redis-ns-")
    proc = None
    rule = ["OUTPUT", "-p", "tcp", "--sport", str(port), "-d", host_ip, "-j", "DROP"]
    try:
        netns.join(ns, host_if, ns_if, host_ip, ns_ip)
        # `ip netns exec` execs redis-server: proc.pid is Redis' own pid. The node
        # comes from outside the namespace's loopback: protected mode would refuse it.
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, "redis-server", "--port", str(port), "--bind", ns_ip, "127.0.0.1",
             "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", workdir.name],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: tcp_connectable(port, ns_ip), timeout=10, what="redis-server in the namespace")

        def cli(*args: str) -> str:
            """redis-cli from inside the namespace, over its loopback: not cut."""
            out = subprocess.run(["ip", "netns", "exec", ns, "redis-cli", "-p", str(port), *args],
                                 capture_output=True, timeout=10, check=True)
            return out.stdout.decode().strip()

        def cut(on: bool) -> None:
            netns.sh("ip", "netns", "exec", ns, "iptables", "-A" if on else "-D", *rule)

        yield f"redis://{ns_ip}:{port}", cli, cut
    finally:
        if proc is not None:
            stop_process(proc)
        netns.remove(ns, host_if)
        workdir.cleanup()


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("iptables")),
                    reason="needs root, ip and iptables to cut a network namespace's Redis")
def test_a_half_cut_redis_holds_up_the_publishes_and_nobody_else(start_server, redis_in_a_namespace, prefix):
    """Publishes during the cut end in 503 (the broker's deadline), after the echo.
    On main's binary (before issue 46) it fails at assert_none_answered."""
    url, cli, cut = redis_in_a_namespace
    redis_prefix = prefix.rstrip("-")
    node = start_server("--broker", url, "--redis-prefix", redis_prefix, "--threads", "1",
                        "--pusher-app", APP)
    wait_healthy(node.port)
    channel, quiet, pusher_channel = f"{prefix}cut", f"{prefix}quiet", f"{prefix}trig"
    assert publish_until_ok(node.port, channel, "before the cut", timeout=10) == 1

    async def main():
        async with ws_connect(node.url(f"/ws/{quiet}?format=json")) as subscriber, \
                ws_connect(node.url("/echo")) as echo:
            wait_subscribers(node.port, quiet, 1)
            cut(True)
            answers = await held_behind_redis(node, echo, subscriber, cli, redis_prefix, channel,
                                              pusher_channel)
            # Redis ran them, but the node never heard back: none of them may say 200.
            assert [a.status for a in answers] == [503] * (HELD_PUBLISHES + 1), answers
            cut(False)
            seq = await asyncio.to_thread(publish_until_ok, node.port, quiet, "after the cut")
            assert await receive_seq(subscriber, seq) == "after the cut"

    run(main(), timeout=120)


# -- ordering under pipelining -------------------------------------------------

PUBLISHERS, EACH = 8, 200
PIPELINES, PIPELINED = 4, 100


def publish_in_order(port: int, channel: str, publisher: int, count: int, start: threading.Barrier) -> list[int]:
    """One keep-alive httpx client publishing `count` messages one after the other;
    the seqs it was answered."""
    seqs = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=ANSWER_BOUND) as http:
        start.wait(timeout=ANSWER_BOUND)
        for i in range(count):
            resp = http.post(f"/api/publish/{channel}", content=f"p{publisher}-{i}",
                             headers={"Content-Type": "text/plain"})
            assert resp.status_code == 200, resp.text
            seqs.append(resp.json()["seq"])
    return seqs


def publish_pipelined(port: int, channel: str, publisher: int, count: int, start: threading.Barrier) -> list[int]:
    """One connection writing `count` publishes at once (HTTP/1.1 pipelining), then
    reading their answers, which must come in the order of the requests."""
    requests = b"".join(
        f"POST /api/publish/{channel} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(f'p{publisher}-{i}')}\r\n\r\np{publisher}-{i}".encode() for i in range(count))
    with RawConn(port, timeout=ANSWER_BOUND) as conn:
        start.wait(timeout=ANSWER_BOUND)
        conn.send(requests)
        answers = [conn.read_http_response(timeout=ANSWER_BOUND) for _ in range(count)]
    assert all(a.status == 200 for a in answers), [a for a in answers if a.status != 200][:3]
    return [a.json()["seq"] for a in answers]


def publish_from_both_nodes(start_server, redis_args, channel: str, publish, publishers: int, each: int):
    """Two nodes of one deployment, a json subscriber on each; `publishers` clients
    running `publish` at once, spread over both nodes. Returns both subscribers'
    (seq, data) and each publisher's answered seqs."""
    nodes = [start_server(*redis_args), start_server(*redis_args)]
    for node in nodes:
        wait_healthy(node.port)
    total = publishers * each

    async def receive_all(ws) -> list[tuple[int, str]]:
        return [(m["seq"], m["data"]) for m in [await recv_json(ws, timeout=ANSWER_BOUND) for _ in range(total)]]

    async def main():
        async with ws_connect(nodes[0].url(f"/ws/{channel}?format=json")) as ws_a, \
                ws_connect(nodes[1].url(f"/ws/{channel}?format=json")) as ws_b:
            for node in nodes:
                wait_subscribers(node.port, channel, 2)
            # A thread each (asyncio's default pool may have fewer), started together.
            start = threading.Barrier(publishers)
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(publishers) as pool:
                publishing = asyncio.gather(*[
                    loop.run_in_executor(pool, publish, nodes[p % 2].port, channel, p, each, start)
                    for p in range(publishers)])
                streams = await asyncio.gather(receive_all(ws_a), receive_all(ws_b))
                return streams, await publishing

    return run(main(), timeout=180)


def assert_one_order(stream_a, stream_b, answered_seqs: list[list[int]], each: int) -> None:
    """Seqs 1..N with no gap, in order, the same message at each seq on both
    nodes, each publisher's messages in the order it sent them, at the seqs it
    was answered."""
    assert [seq for seq, _ in stream_a] == list(range(1, len(stream_a) + 1)), stream_a[:20]
    assert stream_b == stream_a, [(x, y) for x, y in zip(stream_a, stream_b) if x != y][:10]
    seq_of = {data: seq for seq, data in stream_a}
    for p, seqs in enumerate(answered_seqs):
        mine = [data for _, data in stream_a if data.startswith(f"p{p}-")]
        assert mine == [f"p{p}-{i}" for i in range(each)], (p, mine[:20])
        assert seqs == [seq_of[f"p{p}-{i}"] for i in range(each)], (p, seqs[:20])


def test_one_channel_published_from_many_connections_keeps_one_order_on_every_node(start_server, redis_args,
                                                                                   prefix):
    (stream_a, stream_b), answered_seqs = publish_from_both_nodes(
        start_server, redis_args, f"{prefix}order", publish_in_order, PUBLISHERS, EACH)
    assert_one_order(stream_a, stream_b, answered_seqs, EACH)
    # The publishers did run at once: their messages are interleaved in the one order.
    authors = [data.split("-", 1)[0] for _, data in stream_a]
    assert sum(x != y for x, y in zip(authors, authors[1:])) > PUBLISHERS, "the publishes ran one client at a time"


def test_publishes_pipelined_on_one_connection_keep_its_order(start_server, redis_args, prefix):
    """A connection's pipelined publishes are answered, and published, in the order
    it wrote them, while other connections on both nodes do the same."""
    (stream_a, stream_b), answered_seqs = publish_from_both_nodes(
        start_server, redis_args, f"{prefix}pipe", publish_pipelined, PIPELINES, PIPELINED)
    assert_one_order(stream_a, stream_b, answered_seqs, PIPELINED)
