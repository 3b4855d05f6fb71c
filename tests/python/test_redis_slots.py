"""Throng on a Redis Cluster (issue 29): one redis-server started here with
`--cluster-enabled yes`, alone in its cluster and owning all 16384 slots, so
nothing is MOVED and classic PUBLISH/SUBSCRIBE work. On a real cluster a Lua
script may touch only keys that it declared and that live in one slot (its
channel's, `{NAME}`): a key in another node's slot is refused ("Script attempted
to access a non local key"). Redis 7 lets scripts without a `#!lua` line reach
into other slots of the node they run on, so one node alone would not refuse
them: the tests watch every command each script runs (MONITOR) and check that it
touched only keys it declared, all in one slot. Two nodes plain `--broker
redis://` there share chat counts, Pusher presence and occupancy webhooks, and a
node killed without leaving stops counting once its heartbeat is older than the
node TTL (30 s; 3 s here, where the tests that wait on it run the nodes'
timers at a tenth, --test-time-scale)."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO
from rawws import channel_info, publish_ok
from support.pusher import APP, user
from support.webhooks import named
from support.redis import Redis
from support.wait import wait_healthy, wait_until as wait_for
from support.streams import EventReader
from wsutil import recv_json, run, ws_connect
from support.webhooks import presence_and_occupancy_across

# The keeper's failures are logged at debug: the nodes log them so that a command
# Redis refused shows in a failing test's report, and is asserted absent.
LOG = {"RUST_LOG": "info,throng::broker=debug"}
SLOT_ERRORS = ("do not hash to the same slot", "non local key", "CROSSSLOT")
# The tests that wait on the nodes' liveness timers run them at a tenth of their
# time (--test-time-scale, testing only): node TTL 3 s, a keeper tick of 0.1 s (a
# beat every 0.5 s, the keys refreshed every 6 s), key life 30 s, a gone node
# forgotten after 60 s. Every wait and bound on those timers below is scaled alike.
TIME_SCALE = 0.1
SCALED = ("--test-time-scale", str(TIME_SCALE))
SCRIPTS = {hashlib.sha1(p.read_bytes()).hexdigest(): p.name
           for p in sorted((REPO / "src" / "broker" / "redis").glob("*.lua"))}


class Resp:
    """Commands to Redis with byte arguments (redis-cli's argv cannot carry the
    NUL bytes of throng's messages)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = self.sock.makefile("rb")

    def call(self, *args: bytes | str):
        parts = [a.encode() if isinstance(a, str) else a for a in args]
        self.sock.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in parts))
        return self._read()

    def _read(self):
        line = self.reader.readline()[:-2]
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.reader.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise AssertionError(f"not RESP: {line!r}")

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def monitor_args(text: str) -> list[bytes]:
    """The quoted arguments of a MONITOR line, unescaped as Redis escaped them."""
    simple = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", "\\": b"\\", '"': b'"'}
    args, i = [], 0
    while i < len(text):
        if text[i] != '"':
            i += 1
            continue
        i += 1
        arg = bytearray()
        while text[i] != '"':
            if text[i] == "\\":
                if text[i + 1] == "x":
                    arg.append(int(text[i + 2:i + 4], 16))
                    i += 4
                else:
                    arg += simple[text[i + 1]]
                    i += 2
            else:
                arg += text[i].encode()
                i += 1
        args.append(bytes(arg))
        i += 1
    return args


class ClusterRedis(Redis):
    """redis-server in cluster mode, alone in its cluster and owning every slot,
    with MONITOR recording what runs on it."""

    def __init__(self) -> None:
        super().__init__(cluster=True)

    def start(self) -> None:
        super().start()
        self.monitor_log = Path(self.dir.name) / "monitor.log"
        self.monitor = subprocess.Popen(
            ["redis-cli", "-p", str(self.port), "MONITOR"],
            stdin=subprocess.DEVNULL, stdout=open(self.monitor_log, "wb"), stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: self.monitor_log.read_bytes().startswith(b"OK"), what="MONITOR on")

    def stop(self) -> None:
        super().stop()
        if self.monitor.poll() is None:
            self.monitor.kill()
            self.monitor.wait(5)

    def script_runs(self) -> list[tuple[str, list[bytes], list[list[bytes]]]]:
        """Every script run so far: its file, the keys it declared and each
        command it ran."""
        marker = f"throng-test-{time.monotonic_ns()}"
        self.cli("ECHO", marker)
        wait_for(lambda: marker.encode() in self.monitor_log.read_bytes(), what="MONITOR caught up")
        runs = []
        for line in self.monitor_log.read_text(errors="surrogateescape").splitlines():
            source, sep, rest = line.partition("] ")
            if not sep:
                continue
            args = monitor_args(rest)
            if source.endswith(" lua"):
                runs[-1][2].append(args)
            elif args and args[0].upper() in (b"EVAL", b"EVALSHA"):
                body = args[1] if args[0].upper() == b"EVAL" else None
                sha = hashlib.sha1(body).hexdigest() if body else args[1].decode()
                n = int(args[2])
                runs.append((SCRIPTS.get(sha, f"script {sha}"), args[3:3 + n], []))
        return runs

    def assert_scripts_stay_in_their_slot(self) -> int:
        """Each script touched only keys it declared, all in one slot; how many ran."""
        resp = Resp(self.port)
        try:
            runs = self.script_runs()
            wrong = []
            for name, declared, commands in runs:
                slots = {resp.call("CLUSTER", "KEYSLOT", k) for k in declared}
                if len(slots) > 1:
                    wrong.append(f"{name} declared keys in slots {sorted(slots)}: {declared}")
                for command in commands:
                    keys = resp.call("COMMAND", "GETKEYS", *command)
                    for key in keys if isinstance(keys, list) else []:
                        if key not in declared:
                            wrong.append(f"{name} ran {command[0].decode()} on {key!r}, not in its KEYS {declared}")
            assert not wrong, f"{len(wrong)} commands out of their script's slot:\n" + "\n".join(wrong[:10])
            return len(runs)
        finally:
            resp.close()


@pytest.fixture
def cluster_redis():
    r = ClusterRedis()
    yield r
    r.stop()
    r.dir.cleanup()


def nodes(start_server, redis: Redis, *flags: str):
    a = start_server("--broker", redis.url, *flags, env=LOG)
    b = start_server("--broker", redis.url, *flags, env=LOG)
    for node in (a, b):
        wait_healthy(node.port)
    return a, b


def assert_no_slot_errors(*servers) -> None:
    for srv in servers:
        log = srv.stderr()
        refused = [line for line in log.splitlines() if any(e in line for e in SLOT_ERRORS)]
        assert not refused, f"Redis refused a script on node {srv.port}:\n" + "\n".join(refused[:5])


def test_the_check_catches_a_script_reaching_out_of_its_slot(cluster_redis):
    # What the other tests stand on: a run of the check that must find something.
    resp = Resp(cluster_redis.port)
    try:
        answer = resp.call("EVAL", "redis.call('HGETALL', KEYS[1]) return redis.call('EXISTS', ARGV[1])",
                           "1", "throng:{room}:members", "throng:node:elsewhere")
        assert answer == 0, answer
    finally:
        resp.close()
    with pytest.raises(AssertionError, match=r"EXISTS on b'throng:node:elsewhere', not in its KEYS"):
        cluster_redis.assert_scripts_stay_in_their_slot()


def test_chat_and_subscriber_counts_span_nodes_on_a_cluster(start_server, cluster_redis):
    a, b = nodes(start_server, cluster_redis)

    async def main():
        first = await ws_connect(a.url("/ws/chat:lobby?format=json"))
        assert (await recv_json(first))["count"] == 1
        second = await ws_connect(b.url("/ws/chat:lobby?format=json"))
        welcome = await recv_json(second)
        assert (welcome["event"], welcome["count"]) == ("welcome", 2), welcome
        assert (await recv_json(first))["count"] == 2
        third = await ws_connect(a.url("/ws/chat:lobby?format=json"))
        try:
            welcome = await recv_json(third)
            assert (welcome["event"], welcome["count"]) == ("welcome", 3), welcome
            for ws in (first, second):
                joined = await recv_json(ws)
                assert (joined["event"], joined["count"]) == ("join", 3), joined
            await second.send("over the cluster")
            for ws in (first, second, third):
                msg = await recv_json(ws)
                assert (msg["seq"], msg["data"]) == (1, "over the cluster"), msg
            for node in (a, b):
                wait_for(lambda: channel_info(node.port, "chat:lobby")["subscribers"] == 3,
                         what="3 members on both nodes")
        finally:
            await second.close()
        for ws in (first, third):
            left = await recv_json(ws)
            assert (left["event"], left["count"]) == ("leave", 2), left
        await first.close()
        await third.close()
        # Plain channels: each node's share, written by its keeper, summed.
        socks = [await ws_connect(a.url("/ws/count")) for _ in range(2)]
        socks += [await ws_connect(b.url("/ws/count")) for _ in range(3)]
        try:
            for node in (a, b):
                wait_for(lambda: channel_info(node.port, "count")["subscribers"] == 5, what="5 subscribers")
            assert publish_ok(b.port, "count", "x") == 1
        finally:
            for ws in socks:
                await ws.close()
        for node in (a, b):
            wait_for(lambda: channel_info(node.port, "count")["subscribers"] == 0, what="0 subscribers")

    run(main(), timeout=60)
    assert_no_slot_errors(a, b)
    assert cluster_redis.assert_scripts_stay_in_their_slot() > 0


def test_presence_and_occupancy_are_said_once_for_a_cluster(start_server, cluster_redis, receiver, clients):
    a, b = nodes(start_server, cluster_redis, "--pusher-app", APP, "--pusher-webhook", receiver.url)
    presence_and_occupancy_across(a, b, receiver, clients)
    assert_no_slot_errors(a, b)
    assert cluster_redis.assert_scripts_stay_in_their_slot() > 0


def test_a_killed_nodes_members_users_and_channels_go_after_the_node_ttl(
        start_server, cluster_redis, receiver, clients):
    a, b = nodes(start_server, cluster_redis, *SCALED, "--pusher-app", APP, "--pusher-webhook", receiver.url)
    cat = clients(a.port, user=user("cat"))
    cat.connected()
    cat.subscribe("presence-lobby")
    solo = clients(a.port)
    solo.connected()
    solo.subscribe("held-by-a")
    ben = clients(b.port, user=user("ben"))
    ben.connected()
    assert set(ben.subscribe("presence-lobby")["members"]) == {"cat", "ben"}
    receiver.event(named("channel_occupied", channel="held-by-a"))

    async def main():
        on_a = await ws_connect(a.url("/ws/chat:room?format=json"))
        on_b = await ws_connect(b.url("/ws/chat:room?format=json"))
        try:
            assert (await recv_json(on_a))["count"] == 1
            assert (await recv_json(on_b))["count"] == 2
            wait_for(lambda: channel_info(b.port, "chat:room")["subscribers"] == 2, what="2 members")
            a.proc.kill()
            killed = time.monotonic()
            assert ben.expect(lambda r: r["type"] == "member_removed", timeout=60)["id"] == "cat"
            receiver.event(named("channel_vacated", channel="held-by-a"), timeout=60)
            wait_for(lambda: channel_info(b.port, "chat:room")["subscribers"] == 1, timeout=60,
                     what="the killed node's member no longer counted")
            # Its last heartbeat was at most 5 beats (0.5 s) before it was killed,
            # and its TTL is 3 s: it was not dropped while it could still have
            # been alive (20 s of the unscaled 30 s TTL, scaled).
            assert time.monotonic() - killed > 20 * TIME_SCALE
            late = await ws_connect(b.url("/ws/chat:room?format=json"))
            welcome = await recv_json(late)
            assert (welcome["event"], welcome["count"]) == ("welcome", 2), welcome
            await late.close()
        finally:
            await on_b.close()

    run(main(), timeout=120)
    receiver.event(named("member_removed", channel="presence-lobby", user_id="cat"))
    occupied = [e for e in receiver.drain() if e["channel"] == "held-by-a"]
    assert [e["name"] for e in occupied] == ["channel_occupied", "channel_vacated"], occupied
    assert_no_slot_errors(a, b)
    assert cluster_redis.assert_scripts_stay_in_their_slot() > 0


def test_gone_nodes_stop_counting_forgotten_ones_are_swept_and_unknown_ones_count(
        start_server, cluster_redis, receiver, clients):
    # Left in Redis by nodes before this one: a node gone a minute ago, one gone
    # for 11 minutes (past being forgotten) that was an occupier nobody swept,
    # and a share of a node that never beat (just started, as far as anyone can
    # tell).
    r = cluster_redis
    seconds, micros = r.cli("TIME").split()
    now = int(seconds) * 1000 + int(micros) // 1000
    r.cli("ZADD", "throng:nodes", str(now - 60_000), "gone", str(now - 660_000), "forgotten")
    r.cli("HSET", "throng:{count}:members", "gone", "3", "newborn", "4")
    r.cli("SADD", "throng:occupiers", "forgotten")
    r.cli("SADD", "throng:occupied-by:forgotten", "4242:ghost-room")
    r.cli("SADD", "throng:{4242:ghost-room}:occupants", "forgotten")
    a = start_server("--broker", r.url, "--pusher-app", APP, "--pusher-webhook", receiver.url, env=LOG)
    wait_healthy(a.port)
    assert channel_info(a.port, "count")["subscribers"] == 4
    assert r.cli("HKEYS", "throng:{count}:members") == "newborn"
    assert r.cli("ZSCORE", "throng:nodes", "forgotten") == ""
    assert r.cli("ZSCORE", "throng:nodes", "gone") != ""
    receiver.event(named("channel_vacated", channel="ghost-room"))
    assert r.cli("SMEMBERS", "throng:occupiers") == ""
    ann = clients(a.port)
    ann.connected()
    ann.subscribe("ghost-room")
    receiver.event(named("channel_occupied", channel="ghost-room"))
    assert_no_slot_errors(a)
    assert cluster_redis.assert_scripts_stay_in_their_slot() > 0


def test_a_quiet_channels_shares_are_kept_alive_and_rid_of_gone_nodes(
        start_server, cluster_redis, clients):
    # Nothing changes on the channels for a keeper minute (60 ticks, 6 s
    # scaled): the keeper's refresh alone (once every 60 ticks) must keep their
    # shares from expiring (key life 5 minutes, 30 s scaled), and what keeps
    # them alive takes a gone node out, or its share could outlive the node's
    # being forgotten and count again. The gone node's last beat: a keeper
    # minute ago, past its TTL, not yet forgotten.
    r = cluster_redis
    seconds, _ = r.cli("TIME").split()
    r.cli("ZADD", "throng:nodes", str(int(seconds) * 1000 - int(60_000 * TIME_SCALE)), "gone")
    r.cli("HSET", "throng:{quiet}:members", "gone", "3")
    a = start_server("--broker", r.url, "--pusher-app", APP, *SCALED, env=LOG)
    wait_healthy(a.port)
    ann = clients(a.port, user=user("ann"))
    ann.connected()
    ann.subscribe("presence-quiet")
    # An SSE subscriber: it has no pings to answer while the test waits.
    sse = EventReader(f"http://127.0.0.1:{a.port}/sse/quiet")
    try:
        members = "throng:{quiet}:members"
        wait_for(lambda: r.cli("HEXISTS", members, "gone") == "0" and r.cli("HLEN", members) == "1",
                 timeout=75, what="the gone node's count taken out")
        users = [f"throng:{{4242:presence-quiet}}:{k}" for k in ("users", "userconns", "nodeconns")]
        r.cli("HSET", members, "gone", "3")
        # A third of the key life left (100 s of 300 unscaled): only a refresh
        # brings it back above that.
        left = str(int(100 * TIME_SCALE))
        for key in [members, *users]:
            assert r.cli("EXPIRE", key, left) == "1", key
        wait_for(lambda: all(int(r.cli("TTL", key)) > int(left) for key in [members, *users]), timeout=75,
                 what="the keys kept alive")
        wait_for(lambda: r.cli("HEXISTS", members, "gone") == "0", what="the gone node taken out again")
    finally:
        sse.close()
    assert_no_slot_errors(a)
