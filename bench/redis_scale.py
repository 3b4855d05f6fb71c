#!/usr/bin/env python3
"""Past one Redis (issue 29): what one Redis and a 3-master Redis Cluster cost per
publish, what WAIT costs, what a master's failover looks like to a subscriber, and
what a channel's history costs in Redis memory. One run, one machine.

Every server is started here on free loopback ports and stopped by its pid:
redis-server (Debian's; plain, with a replica, or a cluster through
tests/python/support/cluster.py's RedisCluster: --cluster-node-timeout 1000) and two
`throng serve --threads T --broker URL` nodes on consecutive ports.

  throughput  1 Redis against a 3-master cluster (no replicas in either). Two
              `throng bench push` processes, one per node: each subscribes
              --subscribers-per-channel WebSockets (json) to each of its
              --channels-per-node channels, spread over both nodes (--ports: the
              channel count is odd, so every channel has subscribers on both), and
              publishes through its own node's HTTP API (kept-alive, --publishers
              threads, 64-byte payloads carrying the send time). Two phases per
              setup:
                max    the publishers as fast as they are answered (closed loop:
                       the highest rate this box sustains; nothing queues up)
                paced  --paced-rate publishes/s in all, the same for every setup
              Measured over a window inside the load (after --warmup): publishes/s
              (the nodes' throng_messages_published_total), delivery latency p50/p99
              (publish to receive, from the benches: p50 weighted over the two,
              p99 the higher), CPU per publish of every redis-server process
              (utime+stime, /proc/PID/stat) and of both nodes, and per master: its
              CPU over the (S)PUBLISH calls it ran (INFO commandstats). A probe
              thread here publishes --probe-rate/s one at a time on a channel of
              its own through node 1 and times each HTTP round trip.
  wait        1 Redis with one replica, --redis-wait-replicas 0 against 1, the
              same two phases: publishes/s, the probe's round trip p50/p99, the
              replica's CPU too.
  failover    --failover-rounds times, a fresh 3-master cluster with a replica
              each: --failover-subscribers raw WebSocket subscribers (json) of one
              channel on each node; a publisher here sends a message every
              --failover-interval ms (alternating the nodes, 8 kept-alive
              connections so one slow answer does not stop the schedule); after
              1 s the channel's master gets SIGKILL. Per subscriber: the time from
              the kill to the first message it got afterwards; publishes answered
              503 (and other failures) from the kill on; acknowledged publishes a
              subscriber never got, told by a {"event":"gap"} after them or not
              (the honesty check: "lost untold" must be 0); when the replica said
              role:master.
  memory      For each HISTORY:CHANNELS of --memory-points: a fresh Redis and one
              node with --history-size HISTORY; used_memory (INFO memory) before
              and after publishing max(HISTORY,1) 64-byte messages to each of
              CHANNELS channels through the node's API (pipelined): bytes per
              channel, keys per channel, and MEMORY USAGE of one channel's keys.
  sentinel    --failover-rounds times, what failover does through Sentinel
              (--broker redis-sentinel://): a fresh master, its replica and one
              Sentinel (tests/python/support/sentinel.py's SentinelSet,
              down-after-milliseconds 400), the same subscribers and publisher;
              the master gets SIGKILL. Also when Sentinel named the new master.
              With --redis-wait-replicas 0 the promotion starts a new epoch: each
              subscriber expects a {"event":"gap"}.

This box has 2 cores for everything: the cluster's 3 masters, both nodes and the
load generators share them, so the cluster cannot be faster here than one Redis;
what a capacity plan takes from it is the CPU each master spends per publish.

Results: bench/results/redis-scale-STAMP.json (raw, with provenance) and .md.
Every load is bounded in count and time; every process is stopped by its pid.

Usage: python3 bench/redis_scale.py [--parts throughput,wait,failover,memory,sentinel]
Quick check (not a record): python3 bench/redis_scale.py --duration 4 --failover-rounds 1
                             --memory-points 0:1000,10:1000
Env: THRONG_BIN (default target/release/throng; copied before the run).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO / "tests/python"))
import provenance  # noqa: E402  (bench/provenance.py)
import common  # noqa: E402  (bench/common.py)
from common import connectable, free_port  # noqa: E402
import rawws  # noqa: E402  (tests/python/rawws.py: the WebSocket handshake)
from support.cluster import RedisCluster  # noqa: E402  (tests/python/support/cluster.py)
from support.sentinel import RespError, SentinelSet  # noqa: E402  (tests/python/support/sentinel.py)

CLK_TCK = os.sysconf("SC_CLK_TCK")
PARTS = ["throughput", "wait", "failover", "memory", "sentinel"]
BUSY_CORES = 0.25  # other processes' CPU in a window above this: the table says the machine was busy


# ---------------------------------------------------------------- processes, /proc


# A part records a failed wait in its row and goes on to the next round.
wait_until = functools.partial(common.wait_until, fail=RuntimeError)


def free_port_pair() -> int:
    """p such that p and p+1 are both free (the bench's --ports takes a range)."""
    for _ in range(200):
        p = random.randint(20000, 32000)  # below the ephemeral range
        socks = []
        try:
            for q in (p, p + 1):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no two consecutive free ports")


def stop_pid(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM by pid, then SIGKILL after `timeout`."""
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def ticks(pid: int) -> int:
    """utime+stime of a process (all its threads), clock ticks; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of the whole machine, /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(v[:8])
    return total - v[3] - v[4], total


# ---------------------------------------------------------------- Redis


def resp_command(port: int, *args: str, timeout: float = 5.0):
    """One Redis command over a plain socket (RESP); returns the decoded answer."""
    out = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(out)
        buf = b""

        def need(n: int) -> None:
            nonlocal buf
            while len(buf) < n:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("redis closed")
                buf += chunk

        def line() -> bytes:
            nonlocal buf
            while b"\r\n" not in buf:
                need(len(buf) + 1)
            head, _, buf = buf.partition(b"\r\n")
            return head

        def value():
            nonlocal buf
            head = line()
            kind, rest = head[:1], head[1:]
            if kind in (b"+",):
                return rest.decode()
            if kind == b"-":
                raise RuntimeError(rest.decode())
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                need(n + 2)
                data, buf = buf[:n], buf[n + 2:]
                return data.decode(errors="replace")
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [value() for _ in range(n)]
            raise RuntimeError(f"unexpected RESP {head!r}")

        return value()


def info(port: int, section: str) -> dict:
    text = resp_command(port, "INFO", section) or ""
    out = {}
    for raw in text.splitlines():
        k, sep, v = raw.partition(":")
        if sep and not raw.startswith("#"):
            out[k.strip()] = v.strip()
    return out


def command_stats(port: int) -> dict[str, tuple[int, int]]:
    """INFO commandstats: command -> (calls, usec). Commands a script runs count
    (so one publish is an EVALSHA and, inside it, a PUBLISH or SPUBLISH, ...)."""
    out = {}
    for name, v in info(port, "commandstats").items():
        fields = dict(kv.split("=", 1) for kv in v.split(","))
        out[name.removeprefix("cmdstat_")] = (int(fields["calls"]), int(fields["usec"]))
    return out


def publish_calls(stats: dict[str, tuple[int, int]]) -> int:
    """PUBLISH + SPUBLISH calls in a command_stats()."""
    return sum(stats.get(name, (0, 0))[0] for name in ("publish", "spublish"))


class Redis:
    """A plain redis-server (no persistence), optionally a replica of `master`."""

    def __init__(self, work: Path, name: str, master: "Redis | None" = None) -> None:
        self.port = free_port()
        self.name = name
        self.dir = work / f"redis-{name}-{self.port}"
        self.dir.mkdir()
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(self.dir)]
        if master is not None:
            cmd += ["--replicaof", "127.0.0.1", str(master.port)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: connectable(self.port) or self.proc.poll() is not None, 10, f"redis {name}")
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server {name} exited at start")
            if master is not None:
                wait_until(lambda: info(self.port, "replication").get("master_link_status") == "up", 15,
                           f"replica {name} linked")
                # --redis-wait-replicas counts a replica only once its master has
                # it online (the first sync done on that side too).
                wait_until(lambda: any("state=online" in str(v) for k, v in info(master.port, "replication").items()
                                       if k.startswith("slave")), 15, f"replica {name} online at its master")
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_pid(self.proc)


class Cluster:
    """tests/python/support/cluster.py's RedisCluster, with what a measurement needs."""

    def __init__(self, masters: int, replicas: int) -> None:
        self.c = RedisCluster(masters, replicas)
        try:
            # The fixture waits for cluster_state:ok, not for the replicas' first
            # sync; a replica that never synced does not take over (its data's age
            # is unknown), so a failover measurement waits for every link.
            wait_until(self.replicas_linked, 30, "every replica linked to its master")
        except BaseException:
            self.c.stop()
            raise

    def replicas_linked(self) -> bool:
        for n in self.c.running():
            rep = info(n.port, "replication")
            if rep.get("role") == "slave" and rep.get("master_link_status") != "up":
                return False
        return True

    @property
    def url(self) -> str:
        return self.c.url

    def redis_ports(self) -> list[tuple[str, int, int]]:
        """(role, port, pid) of each running node."""
        out = []
        for n in self.c.running():
            role = info(n.port, "replication").get("role", "?")
            out.append((role, n.port, n.proc.pid))
        return out

    def stop(self) -> None:
        self.c.stop()


# ---------------------------------------------------------------- throng


class Node:
    """One `throng serve` on `port`, stopped by its pid."""

    def __init__(self, throng: Path, work: Path, port: int, broker: str, threads: int, *flags: str) -> None:
        self.port = port
        self.log = work / f"node-{port}.log"
        self.cmd = [str(throng), "serve", "--listen", f"127.0.0.1:{port}", "--threads", str(threads),
                    "--broker", broker, "--stats-interval", "0", *flags]
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=open(self.log, "wb"),
                                     stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: self.healthy() or self.proc.poll() is not None, 20, f"node {port} healthy")
            if self.proc.poll() is not None:
                raise RuntimeError(f"throng serve exited at start: {self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    def healthy(self) -> bool:
        try:
            return rawws.http_request(self.port, "GET", "/healthz", timeout=2).status == 200
        except (OSError, rawws.Closed, TimeoutError, AssertionError):
            return False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metric(self, series: str) -> float | None:
        try:
            return rawws.metric(self.port, series)
        except (OSError, rawws.Closed, TimeoutError, AssertionError):
            return None

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        stop_pid(self.proc)


# ---------------------------------------------------------------- HTTP, kept alive


class Http:
    """An HTTP/1.1 connection kept alive, for publishing: one request at a time, or
    a batch pipelined (the answers come in order)."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.port = port
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buf = b""

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock, self.buf = None, b""

    def _connect(self) -> None:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = b""

    def _read_response(self) -> tuple[int, bytes]:
        assert self.sock is not None
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before an answer")
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length, close = 0, False
        for h in lines[1:]:
            k, _, v = h.partition(":")
            k = k.strip().lower()
            if k == "content-length":
                length = int(v.strip())
            elif k == "connection" and v.strip().lower() == "close":
                close = True
        while len(self.buf) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed inside an answer")
            self.buf += chunk
        body, self.buf = self.buf[:length], self.buf[length:]
        if close:
            self.close()
        return status, body

    @staticmethod
    def publish_request(channel: str, body: bytes) -> bytes:
        return (f"POST /api/publish/{channel} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    def publish(self, channel: str, body: bytes) -> tuple[int, bytes]:
        """One publish; raises OSError/ConnectionError (the connection is then closed)."""
        try:
            self._connect()
            assert self.sock is not None
            self.sock.sendall(self.publish_request(channel, body))
            return self._read_response()
        except (OSError, ConnectionError, ValueError):
            self.close()
            raise

    def pipeline(self, requests: list[bytes]) -> list[int]:
        """Sends the requests in one write and reads their answers: the statuses."""
        try:
            self._connect()
            assert self.sock is not None
            self.sock.sendall(b"".join(requests))
            return [self._read_response()[0] for _ in requests]
        except (OSError, ConnectionError, ValueError):
            self.close()
            raise


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))]


class Probe(threading.Thread):
    """Publishes one message at a time every 1/rate s on a channel of its own and
    times each HTTP round trip (perf_counter); keeps (start, rtt, status)."""

    def __init__(self, port: int, channel: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.port, self.channel, self.interval = port, channel, 1.0 / rate
        self.stop_event = threading.Event()
        self.samples: list[tuple[float, float, int]] = []
        self.errors = 0

    def run(self) -> None:
        http = Http(self.port)
        body = b"probe " + b"x" * 58
        nxt = time.monotonic()
        while not self.stop_event.is_set():
            now = time.monotonic()
            if now < nxt:
                time.sleep(min(nxt - now, 0.05))
                continue
            nxt += self.interval
            if nxt < now:  # fell behind (a slow answer): no catching up in a burst
                nxt = now + self.interval
            t0 = time.perf_counter()
            try:
                status, _ = http.publish(self.channel, body)
            except (OSError, ConnectionError, ValueError):
                self.errors += 1
                continue
            self.samples.append((now, (time.perf_counter() - t0) * 1e3, status))
        http.close()

    def summary(self, t0: float, t1: float) -> dict:
        rtts = [r for (t, r, st) in self.samples if t0 <= t <= t1 and st == 200]
        return {"samples": len(rtts), "non_200": sum(1 for (t, _, st) in self.samples if t0 <= t <= t1 and st != 200),
                "errors": self.errors,
                "rtt_p50_ms": percentile(rtts, 50), "rtt_p99_ms": percentile(rtts, 99),
                "rtt_max_ms": max(rtts) if rtts else None}


# ---------------------------------------------------------------- a load phase


class Bench:
    """One `throng bench push` process; notices its "opened ..." line."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.cmd = cmd
        self.opened = threading.Event()
        self.err_lines: list[str] = []
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.log = log
        self.reader = threading.Thread(target=self._read_err, daemon=True)
        self.reader.start()
        self.out = b""
        self.out_reader = threading.Thread(target=self._read_out, daemon=True)
        self.out_reader.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            text = raw.decode(errors="replace").rstrip()
            self.err_lines.append(text)
            if text.startswith("opened "):
                self.opened.set()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.read()

    def finish(self, timeout: float) -> dict:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_pid(self.proc, timeout=5)
        self.out_reader.join(5)
        self.reader.join(5)
        self.log.write_text("\n".join(self.err_lines) + "\n")
        try:
            return json.loads(self.out)
        except ValueError:
            return {"error": f"no JSON from the bench (exit {self.proc.returncode}): "
                             + " | ".join(self.err_lines[-5:])}


def snapshot(groups: dict[str, list[int]], nodes: list[Node], redis_ports: dict[str, int]) -> dict:
    busy, total = machine_ticks()
    return {
        "t": time.monotonic(),
        "machine_busy": busy, "machine_total": total,
        "ticks": {g: {str(p): ticks(p) for p in pids} for g, pids in groups.items()},
        "self": ticks(os.getpid()),
        "published": [n.metric("throng_messages_published_total") for n in nodes],
        "redis_commands": {name: command_stats(port) for name, port in redis_ports.items()},
    }


def window_figures(s0: dict, s1: dict, redis_roles: dict[str, str]) -> dict:
    secs = s1["t"] - s0["t"]
    d_group = {g: sum(s1["ticks"][g][p] - s0["ticks"][g][p] for p in s0["ticks"][g]) for g in s0["ticks"]}
    published = None
    if all(v is not None for v in s0["published"] + s1["published"]):
        published = sum(b - a for a, b in zip(s0["published"], s1["published"]))
    redis_ticks = {p: s1["ticks"]["redis"][p] - s0["ticks"]["redis"][p] for p in s0["ticks"]["redis"]}
    ours = sum(d_group.values()) + (s1["self"] - s0["self"])
    busy = s1["machine_busy"] - s0["machine_busy"]
    machine_cores = busy / CLK_TCK / secs
    out = {
        "window_secs": round(secs, 3),
        "published": published,
        "publishes_per_sec": round(published / secs, 1) if published else None,
        "cores": {g: round(v / CLK_TCK / secs, 3) for g, v in d_group.items()},
        "other_cores": round(max(0.0, busy - ours) / CLK_TCK / secs, 3),
        "machine_cores": round(machine_cores, 3),
    }
    if published:
        out["throng_cpu_us_per_publish"] = round(d_group["nodes"] / CLK_TCK / published * 1e6, 2)
        out["redis_cpu_us_per_publish"] = round(d_group["redis"] / CLK_TCK / published * 1e6, 2)
        out["client_cpu_us_per_publish"] = round(d_group["benches"] / CLK_TCK / published * 1e6, 2)
    per = []
    for name, pid in sorted(redis_roles.items()):
        role = name.split("@")[0]
        c0, c1 = s0["redis_commands"][name], s1["redis_commands"][name]
        calls = publish_calls(c1) - publish_calls(c0)
        t = redis_ticks.get(str(pid), 0)
        # What Redis itself timed of each command in the window (usec: inside the
        # command, not the network and parsing around it), per publish it ran.
        commands = {}
        for cmd, (n1, u1) in c1.items():
            n0, u0 = c0.get(cmd, (0, 0))
            if n1 > n0:
                commands[cmd] = {"calls": n1 - n0, "usec": u1 - u0,
                                 "usec_per_publish": round((u1 - u0) / calls, 2) if calls else None}
        per.append({"redis": name, "role": role, "pid": pid, "cores": round(t / CLK_TCK / secs, 3),
                    "publish_calls": calls, "publish_calls_per_sec": round(calls / secs, 1) if calls else None,
                    "cpu_us_per_publish_call": round(t / CLK_TCK / calls * 1e6, 2) if calls else None,
                    "cpu_ticks": t, "commands": dict(sorted(commands.items(), key=lambda kv: -kv[1]["usec"]))})
    out["per_redis"] = per
    return out


def idle_redis_cores(pids: list[int], seconds: float = 2.0) -> float:
    """CPU of these redis-servers doing nothing asked of them (a cluster's bus gossip,
    replication pings): the baseline a capacity figure may take out."""
    a = sum(ticks(p) for p in pids)
    time.sleep(seconds)
    return round((sum(ticks(p) for p in pids) - a) / CLK_TCK / seconds, 3)


def load_phase(label: str, throng: Path, work: Path, nodes: list[Node], redis_named: dict[str, tuple[int, int]],
               rate_total: float | None, args) -> dict:
    """Two `throng bench push` processes (one publishing through each node) for
    --warmup + --duration + 1 s; the figures over the --duration window."""
    p0 = nodes[0].port
    k = args.channels_per_node
    conns = k * args.subscribers_per_channel
    load_secs = args.warmup + args.duration + 1.0
    per_bench_rate = (rate_total / 2) if rate_total else 1_000_000
    benches = []
    probe = Probe(nodes[0].port, f"{label}-probe", args.probe_rate)
    try:
        for j, node in enumerate(nodes):
            cmd = [str(throng), "bench", "push", "--url", f"ws://127.0.0.1:{p0}/ws/{{channel}}?format=json",
                   "--ports", f"{p0}-{p0 + 1}", "--conns", str(conns), "--channels", str(k),
                   "--channel-prefix", f"{label}-n{j + 1}-", "--publish-url", f"http://127.0.0.1:{node.port}",
                   "--publish-rate", f"{per_bench_rate:g}", "--publishers", str(args.publishers),
                   "--size", "64", "--threads", "1", "--rate", "0", "--duration", f"{load_secs:g}s",
                   "--grace", "2s", "--interval", "0", "--connect-timeout", "10s", "--json"]
            if args.idempotency_keys:
                cmd.append("--idempotency-keys")
            benches.append(Bench(cmd, work / f"bench-{label}-{j + 1}.log"))
        for b in benches:
            if not b.opened.wait(30):
                raise RuntimeError(f"bench {label}: not connected after 30 s: {' | '.join(b.err_lines[-3:])}")
        probe.start()
        time.sleep(args.warmup)
        groups = {"nodes": [n.pid for n in nodes], "redis": [pid for _, pid in redis_named.values()],
                  "benches": [b.proc.pid for b in benches]}
        ports = {name: port for name, (port, _) in redis_named.items()}
        s0 = snapshot(groups, nodes, ports)
        time.sleep(args.duration)
        s1 = snapshot(groups, nodes, ports)
        probe.stop_event.set()
        reports = [b.finish(timeout=load_secs + 40) for b in benches]
    finally:
        probe.stop_event.set()
        for b in benches:
            stop_pid(b.proc, timeout=5)
    fig = window_figures(s0, s1, {name: pid for name, (_, pid) in redis_named.items()})
    fig["probe"] = probe.summary(s0["t"], s1["t"])
    # The probe's publishes are counted with the benches' (they are publishes too).
    fig["target_publishes_per_sec"] = rate_total + args.probe_rate if rate_total else None
    fig["benches"] = [{"command": b.cmd, "report": slim(r)} for b, r in zip(benches, reports)]
    lat = [r.get("latency") or {} for r in reports]
    n = sum(x.get("samples", 0) for x in lat)
    fig["delivery_p50_ms"] = round(sum(x.get("median_us", 0) * x.get("samples", 0) for x in lat) / n / 1e3, 3) if n else None
    fig["delivery_p99_ms"] = round(max(x.get("p99_us", 0) for x in lat) / 1e3, 3) if n else None
    push = [r.get("push") or {} for r in reports]
    fig["deliveries"] = {k2: sum(p.get(k2, 0) for p in push)
                         for k2 in ("published", "publish_errors", "expected_deliveries", "delivered", "lost",
                                    "duplicated", "out_of_order", "server_reported_gaps")}
    fig["connections"] = {"opened": sum(r.get("opened", 0) for r in reports),
                          "failed": sum(r.get("failed", 0) for r in reports),
                          "dropped": sum(r.get("dropped", 0) for r in reports)}
    if rate_total and fig.get("publishes_per_sec"):
        fig["sustained"] = fig["publishes_per_sec"] >= 0.97 * fig["target_publishes_per_sec"]
    return fig


def slim(report: dict) -> dict:
    """The bench's JSON less its per-second timeline's bulk (kept: its figures)."""
    r = dict(report)
    if isinstance(r.get("push"), dict):
        r["push"] = {k: v for k, v in r["push"].items() if k != "comeback"}
    return r


# ---------------------------------------------------------------- the parts


def record_error(row: dict, e: BaseException, log) -> None:
    """A failed setup or round: its error in its row and the log; the part goes on."""
    row["error"] = f"{type(e).__name__}: {e}"
    log(f"  error: {row['error']}")


def max_then_paced(row: dict, name: str, what: str, throng: Path, work: Path, nodes: list[Node],
                   named: dict[str, tuple[int, int]], args, log) -> None:
    """A setup's load at full speed, then at --paced-rate: row["max"], row["paced"]."""
    for phase, rate in (("max", None), ("paced", args.paced_rate)):
        log(f"{what} {phase}")
        row[phase] = load_phase(f"{name}-{phase}", throng, work, nodes, named, rate, args)
        log(f"  {brief(row[phase])}")


def stop_nodes(nodes: list[Node], row: dict) -> None:
    """A load setup's nodes stopped, the first one's log tail kept in its row."""
    for n in nodes:
        n.stop()
    row["node_log_tail"] = nodes[0].log_tail(600) if nodes else ""


def part_throughput(throng: Path, work: Path, args, log) -> dict:
    out: dict = {"setups": {}}
    for setup in ("redis-1", "cluster-3"):
        row: dict = {}
        out["setups"][setup] = row
        redis_list: list[Redis] = []
        cluster = None
        nodes: list[Node] = []
        try:
            if setup == "redis-1":
                redis_list.append(Redis(work, "single"))
                broker = redis_list[0].url
                named = {"master@" + str(redis_list[0].port): (redis_list[0].port, redis_list[0].pid)}
            else:
                cluster = Cluster(args.cluster_masters, 0)
                broker = cluster.url
                named = {f"{role}@{port}": (port, pid) for role, port, pid in cluster.redis_ports()}
            row["redis"] = sorted(named)
            row["idle_redis_cores"] = idle_redis_cores([pid for _, pid in named.values()])
            p = free_port_pair()
            nodes = [Node(throng, work, p + i, broker, args.node_threads) for i in range(2)]
            row["node_command"] = nodes[0].cmd
            max_then_paced(row, f"t-{setup}", f"throughput {setup}", throng, work, nodes, named, args, log)
        except (RuntimeError, subprocess.SubprocessError, AssertionError, OSError) as e:
            record_error(row, e, log)
        finally:
            stop_nodes(nodes, row)
            for r in redis_list:
                r.stop()
            if cluster:
                cluster.stop()
    return out


def part_wait(throng: Path, work: Path, args, log) -> dict:
    out: dict = {"setups": {}}
    for wait in (0, 1):
        setup = f"wait-{wait}"
        row: dict = {}
        out["setups"][setup] = row
        master = replica = None
        nodes: list[Node] = []
        try:
            master = Redis(work, f"w{wait}-master")
            replica = Redis(work, f"w{wait}-replica", master)
            named = {f"master@{master.port}": (master.port, master.pid),
                     f"replica@{replica.port}": (replica.port, replica.pid)}
            row["redis"] = sorted(named)
            row["idle_redis_cores"] = idle_redis_cores([master.pid, replica.pid])
            p = free_port_pair()
            nodes = [Node(throng, work, p + i, master.url, args.node_threads, "--redis-wait-replicas", str(wait))
                     for i in range(2)]
            row["node_command"] = nodes[0].cmd
            max_then_paced(row, f"w{wait}", f"wait {wait}", throng, work, nodes, named, args, log)
            row["short_waits"] = [n.metric("throng_redis_short_waits_total") for n in nodes]
        except (RuntimeError, subprocess.SubprocessError, AssertionError, OSError) as e:
            record_error(row, e, log)
        finally:
            stop_nodes(nodes, row)
            for r in (replica, master):
                if r:
                    r.stop()
    return out


def brief(fig: dict) -> str:
    return (f"{fig.get('publishes_per_sec')} pub/s, delivery p50 {fig.get('delivery_p50_ms')} / p99 "
            f"{fig.get('delivery_p99_ms')} ms, throng {fig.get('throng_cpu_us_per_publish')} us/pub, redis "
            f"{fig.get('redis_cpu_us_per_publish')} us/pub, probe p50 {fig['probe'].get('rtt_p50_ms')} / p99 "
            f"{fig['probe'].get('rtt_p99_ms')} ms, other {fig.get('other_cores')} cores, lost "
            f"{fig['deliveries'].get('lost')}")


# ---------------------------------------------------------------- failover


class Subscriber(threading.Thread):
    """A raw WebSocket subscriber (json): keeps (monotonic time, message) of each
    text frame it reads, answers pings."""

    def __init__(self, port: int, channel: str) -> None:
        super().__init__(daemon=True)
        self.conn = rawws.ws_connect(port, f"/ws/{channel}?format=json", timeout=5)
        self.port = port
        self.got: list[tuple[float, dict]] = []
        self.closed: str | None = None
        self.stop_event = threading.Event()

    def run(self) -> None:
        c = self.conn
        buf = c.buf
        c.sock.settimeout(0.2)
        while not self.stop_event.is_set():
            # Whole frames only, from the buffer (a timeout never splits one).
            while len(buf) >= 2:
                b0, b1 = buf[0], buf[1]
                n, off = b1 & 0x7F, 2
                if n == 126:
                    if len(buf) < 4:
                        break
                    n, off = int.from_bytes(buf[2:4], "big"), 4
                elif n == 127:
                    if len(buf) < 10:
                        break
                    n, off = int.from_bytes(buf[2:10], "big"), 10
                if len(buf) < off + n:
                    break
                op, payload, buf = b0 & 0x0F, buf[off:off + n], buf[off + n:]
                now = time.monotonic()
                if op == rawws.OP_PING:
                    try:
                        c.send(rawws.encode_frame(rawws.OP_PONG, payload))
                    except OSError:
                        pass
                elif op == rawws.OP_TEXT:
                    try:
                        self.got.append((now, json.loads(payload)))
                    except ValueError:
                        self.got.append((now, {"unparsed": payload[:200].decode(errors="replace")}))
                elif op == rawws.OP_CLOSE:
                    self.closed = f"close {payload[:2].hex()} {payload[2:100].decode(errors='replace')}"
                    return
            try:
                chunk = c.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as e:
                self.closed = f"socket: {e}"
                return
            if not chunk:
                self.closed = "EOF"
                return
            buf += chunk

    def stop(self) -> None:
        self.stop_event.set()
        self.join(2)
        try:
            self.conn.send_close(1000)
        except OSError:
            pass
        self.conn.close()


class SchedulePublisher:
    """Publishes message i at t0 + i * interval (payload "fo I NANOS"), handing each
    to one of `workers` threads with kept-alive connections to the nodes (worker w
    publishes through nodes[w % len(nodes)]), so a slow answer holds one worker,
    not the schedule. Keeps per message: node, due, sent, answered, status, seq."""

    def __init__(self, ports: list[int], channel: str, interval: float, workers: int = 8) -> None:
        self.ports, self.channel, self.interval = ports, channel, interval
        self.queue: queue.Queue = queue.Queue()
        self.records: dict[int, dict] = {}
        self.stop_event = threading.Event()
        self.workers = [threading.Thread(target=self._work, args=(w,), daemon=True) for w in range(workers)]
        self.dispatcher = threading.Thread(target=self._dispatch, daemon=True)

    def start(self) -> None:
        self.t0 = time.monotonic()
        for w in self.workers:
            w.start()
        self.dispatcher.start()

    def _dispatch(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            due = self.t0 + i * self.interval
            now = time.monotonic()
            if due > now:
                time.sleep(min(due - now, 0.01))
                continue
            self.queue.put((i, due))
            i += 1

    def _work(self, w: int) -> None:
        port = self.ports[w % len(self.ports)]
        http = Http(port, timeout=5.0)
        while True:
            item = self.queue.get()
            if item is None:
                break
            i, due = item
            rec = {"node": port, "due": due, "sent": time.monotonic()}
            body = f"fo {i} {time.time_ns()} ".encode().ljust(64, b"x")
            try:
                status, answer = http.publish(self.channel, body)
                rec["status"] = status
                if status == 200:
                    rec["seq"] = json.loads(answer).get("seq")
            except (OSError, ConnectionError, ValueError) as e:
                rec["status"] = None
                rec["error"] = type(e).__name__
            rec["answered"] = time.monotonic()
            self.records[i] = rec
        http.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.dispatcher.join(2)
        # What is still queued is not sent: taken out, then one stop per worker.
        try:
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass
        for _ in self.workers:
            self.queue.put(None)
        for w in self.workers:
            w.join(10)


def watch_promotion(port: int, stop: threading.Event, out: dict) -> None:
    """Polls a replica's role every 20 ms; notes when it says master."""
    while not stop.is_set():
        try:
            if info(port, "replication").get("role") == "master":
                out["promoted_at"] = time.monotonic()
                return
        except (OSError, RuntimeError, ConnectionError):
            pass
        time.sleep(0.02)


def start_subscribers(subs: list[Subscriber], nodes: list[Node], channel: str, per_node: int) -> None:
    """per_node subscribers of channel on each node, appended to subs as they are made
    (so that the round's `finally` stops every one made before a failure)."""
    for node in nodes:
        for _ in range(per_node):
            subs.append(Subscriber(node.port, channel))
    for s in subs:
        s.start()


def warm_then_publish(subs: list[Subscriber], nodes: list[Node], channel: str, args) -> SchedulePublisher:
    """Every subscriber hears a message before the measured publishing starts; then
    the schedule starts over every node and runs 1 s before the kill."""
    warm = Http(nodes[0].port)
    deadline = time.monotonic() + 15
    while not all(any(m.get("data", "").startswith("warm") for _, m in s.got) for s in subs):
        if time.monotonic() > deadline:
            raise RuntimeError("subscribers not all hearing the channel after 15 s")
        warm.publish(channel, b"warm")
        time.sleep(0.1)
    warm.close()
    time.sleep(0.2)
    pub = SchedulePublisher([n.port for n in nodes], channel, args.failover_interval / 1000)
    pub.start()
    time.sleep(1.0)
    return pub


def wait_for_comeback(pub: SchedulePublisher, subs: list[Subscriber], t_kill: float, args) -> None:
    """Until every subscriber has heard a message published after the kill and
    --failover-after s more have passed; at most --failover-max s. Then stops pub."""
    deadline = t_kill + args.failover_max
    back_all = None
    while time.monotonic() < deadline:
        if back_all is None and all(any(t > t_kill and str(m.get("data", "")).startswith("fo ")
                                        and pub.records.get(int(m["data"].split()[1]), {}).get("sent", 0) > t_kill
                                        for t, m in s.got) for s in subs):
            back_all = time.monotonic()
        if back_all is not None and time.monotonic() > back_all + args.failover_after:
            break
        time.sleep(0.05)
    pub.stop()


def stop_round(pub: SchedulePublisher | None, subs: list[Subscriber], nodes: list[Node], row: dict) -> None:
    """A round's `finally`: the publisher, subscribers and nodes stopped, each node's
    log tail kept in the row (the Redis side is stopped by the caller)."""
    if pub is not None and not pub.stop_event.is_set():
        pub.stop()
    for s in subs:
        s.stop()
    for n in nodes:
        n.stop()
    row["node_log_tail"] = [n.log_tail(1200) for n in nodes]


def failover_round(k: int, throng: Path, work: Path, args, log) -> dict:
    row: dict = {"round": k}
    cluster = None
    nodes: list[Node] = []
    subs: list[Subscriber] = []
    pub = None
    channel = f"fo-{k}"
    try:
        cluster = Cluster(args.cluster_masters, 1)
        victim = cluster.c.master_of("{%s}" % channel)
        replicas = [n for n in cluster.c.running()
                    if info(n.port, "replication").get("master_port") == str(victim.port)]
        row["victim_master"] = victim.addr
        row["its_replicas"] = [n.addr for n in replicas]
        p = free_port_pair()
        nodes = [Node(throng, work, p + i, cluster.url, args.node_threads,
                      "--redis-wait-replicas", str(args.failover_wait_replicas)) for i in range(2)]
        row["node_command"] = nodes[0].cmd
        start_subscribers(subs, nodes, channel, args.failover_subscribers)
        pub = warm_then_publish(subs, nodes, channel, args)
        promoted: dict = {}
        watch_stop = threading.Event()
        watchers = [threading.Thread(target=watch_promotion, args=(r.port, watch_stop, promoted), daemon=True)
                    for r in replicas]
        for w in watchers:
            w.start()
        t_kill = time.monotonic()
        os.kill(victim.proc.pid, signal.SIGKILL)
        row["killed_pid"] = victim.proc.pid
        victim.proc.wait(10)
        victim.proc = None
        log(f"failover {k}: killed master {victim.addr} (channel {channel})")
        wait_for_comeback(pub, subs, t_kill, args)
        watch_stop.set()
        time.sleep(1.5)  # the last deliveries
        row.update(failover_figures(pub, subs, t_kill, promoted.get("promoted_at"), nodes))
        row["new_epochs"] = [n.metric("throng_redis_new_epochs_total") for n in nodes]
        log(f"  {json.dumps({k2: row[k2] for k2 in ('first_after_kill_ms', 'publishes_503', 'lost_untold', 'lost_told_by_gap', 'promoted_after_ms')})}")
    except (RuntimeError, subprocess.SubprocessError, AssertionError, OSError) as e:
        record_error(row, e, log)
    finally:
        stop_round(pub, subs, nodes, row)
        if cluster:
            cluster.stop()
    return row


def failover_figures(pub: SchedulePublisher, subs: list[Subscriber], t_kill: float,
                     promoted_at: float | None, nodes: list[Node]) -> dict:
    recs = pub.records
    after = {i: r for i, r in recs.items() if r["sent"] >= t_kill or r["answered"] >= t_kill}
    acked = {i for i, r in recs.items() if r.get("status") == 200}
    statuses: dict[str, int] = {}
    for r in after.values():
        key = str(r.get("status")) if r.get("status") is not None else f"error {r.get('error')}"
        statuses[key] = statuses.get(key, 0) + 1
    ok_after = sorted(r["answered"] for r in after.values() if r.get("status") == 200 and r["sent"] >= t_kill)
    per_sub = []
    for s in subs:
        got_ids: dict[int, int] = {}
        first_after = first_after_published_after = None
        gaps = []
        for t, m in s.got:
            if m.get("event") == "gap":
                gaps.append((t, m))
                continue
            data = str(m.get("data", ""))
            if not data.startswith("fo "):
                continue
            i = int(data.split()[1])
            got_ids[i] = got_ids.get(i, 0) + 1
            if t > t_kill and first_after is None:
                first_after = t
            if t > t_kill and first_after_published_after is None and recs.get(i, {}).get("sent", 0) > t_kill:
                first_after_published_after = t
        missing = sorted(acked - set(got_ids))
        # A missing acknowledged message is told when a gap came to this subscriber
        # after that message was sent (the gap says its seqs are gone).
        told = [i for i in missing if any(t >= recs[i]["sent"] for t, _ in gaps)]
        untold = [i for i in missing if i not in told]
        per_sub.append({
            "node": s.port,
            "first_after_kill_ms": round((first_after - t_kill) * 1e3, 1) if first_after else None,
            "first_published_after_kill_ms": (round((first_after_published_after - t_kill) * 1e3, 1)
                                              if first_after_published_after else None),
            "received": sum(got_ids.values()), "duplicates": sum(v - 1 for v in got_ids.values() if v > 1),
            "gaps": [dict(m, at_ms=round((t - t_kill) * 1e3, 1)) for t, m in gaps],
            "acked_missing": len(missing), "lost_told_by_gap": len(told), "lost_untold": len(untold),
            "lost_untold_ids": untold[:20], "closed": s.closed,
        })
    firsts = [p["first_after_kill_ms"] for p in per_sub]
    return {
        "publishes": len(recs), "acked": len(acked),
        "publishes_from_kill": len(after), "answers_from_kill": statuses,
        "publishes_503": statuses.get("503", 0),
        "publishes_failed_other": sum(v for k, v in statuses.items() if k not in ("200", "503")),
        "first_ok_publish_after_kill_ms": round((ok_after[0] - t_kill) * 1e3, 1) if ok_after else None,
        "slowest_answer_ms": round(max((r["answered"] - r["sent"]) * 1e3 for r in recs.values()), 1) if recs else None,
        "promoted_after_ms": round((promoted_at - t_kill) * 1e3, 1) if promoted_at else None,
        "subscribers": per_sub,
        "first_after_kill_ms": firsts,
        "first_published_after_kill_ms": [p["first_published_after_kill_ms"] for p in per_sub],
        "lost_untold": sum(p["lost_untold"] for p in per_sub),
        "lost_told_by_gap": sum(p["lost_told_by_gap"] for p in per_sub),
        "duplicates": sum(p["duplicates"] for p in per_sub),
    }


def part_failover(throng: Path, work: Path, args, log) -> dict:
    return {"rounds": [failover_round(k + 1, throng, work, args, log) for k in range(args.failover_rounds)]}


# ---------------------------------------------------------------- memory


def fill_channels(port: int, prefix: str, channels: int, per_channel: int, batch: int = 200) -> dict:
    """Publishes per_channel 64-byte messages to each channel, pipelined `batch` at
    a time over one kept-alive connection; returns the count of each status."""
    http = Http(port, timeout=30)
    body = b"m" * 64
    reqs = [Http.publish_request(f"{prefix}{c}", body) for _ in range(per_channel) for c in range(channels)]
    statuses: dict[int, int] = {}
    t0 = time.monotonic()
    for i in range(0, len(reqs), batch):
        for st in http.pipeline(reqs[i:i + batch]):
            statuses[st] = statuses.get(st, 0) + 1
    http.close()
    return {"statuses": statuses, "secs": round(time.monotonic() - t0, 2)}


def used_memory(port: int) -> int:
    vals = []
    for _ in range(3):
        vals.append(int(info(port, "memory")["used_memory"]))
        time.sleep(0.1)
    return sorted(vals)[1]


def part_memory(throng: Path, work: Path, args, log) -> dict:
    out: dict = {"points": []}
    for point in args.memory_points.split(","):
        history, _, n = point.partition(":")
        history, n = int(history), int(n)
        row: dict = {"history_size": history, "channels": n, "messages_per_channel": max(history, 1)}
        out["points"].append(row)
        redis = node = None
        try:
            redis = Redis(work, f"mem{history}")
            node = Node(throng, work, free_port(), redis.url, args.node_threads, "--history-size", str(history))
            row["node_command"] = node.cmd
            Http(node.port).publish("warm", b"w" * 64)  # scripts loaded, the node's own keys written
            time.sleep(0.3)
            before, keys0 = used_memory(redis.port), resp_command(redis.port, "DBSIZE")
            log(f"memory: history {history}, {n} channels")
            row["fill"] = fill_channels(node.port, "mem-", n, max(history, 1))
            time.sleep(0.5)
            after, keys1 = used_memory(redis.port), resp_command(redis.port, "DBSIZE")
            sample = {}
            for key in resp_command(redis.port, "KEYS", "throng:{mem-7}:*") or []:
                sample[key] = {"type": resp_command(redis.port, "TYPE", key),
                               "memory_usage": resp_command(redis.port, "MEMORY", "USAGE", key, "SAMPLES", "0")}
            row.update({"used_memory_before": before, "used_memory_after": after,
                        "bytes_per_channel": round((after - before) / n, 1),
                        "keys_per_channel": round((keys1 - keys0) / n, 2),
                        "sample_channel_keys": sample,
                        "sample_channel_memory_usage": sum(v["memory_usage"] or 0 for v in sample.values())})
            log(f"  {row['bytes_per_channel']} B/channel, {row['keys_per_channel']} keys/channel")
        except (RuntimeError, subprocess.SubprocessError, AssertionError, OSError) as e:
            record_error(row, e, log)
        finally:
            if node:
                node.stop()
            if redis:
                redis.stop()
    return out


# ---------------------------------------------------------------- Sentinel


def watch_sentinel(sets, old_port: int, stop: threading.Event, out: dict) -> None:
    """Polls Sentinel every 20 ms; notes when it names a master other than old_port."""
    while not stop.is_set():
        try:
            if sets.master_port() != old_port:
                out["switched_at"] = time.monotonic()
                return
        except (OSError, RuntimeError, ConnectionError, ValueError, TypeError, RespError):
            pass
        time.sleep(0.02)


def sentinel_round(k: int, throng: Path, work: Path, args, log) -> dict:
    """failover_round through Sentinel: a master, its replica and one Sentinel
    (tests/python/support/sentinel.py's SentinelSet); the master gets SIGKILL."""
    row: dict = {"round": k}
    sets = None
    nodes: list[Node] = []
    subs: list[Subscriber] = []
    pub = None
    channel = f"se-{k}"
    try:
        sets = SentinelSet()
        row["sentinel_url"] = sets.url
        old = sets.master_port()
        replica_port = sets.replica_port()
        row["master_port"], row["replica_port"] = old, replica_port
        p = free_port_pair()
        nodes = [Node(throng, work, p + i, sets.url, args.node_threads,
                      "--redis-wait-replicas", str(args.failover_wait_replicas)) for i in range(2)]
        row["node_command"] = nodes[0].cmd
        start_subscribers(subs, nodes, channel, args.failover_subscribers)
        pub = warm_then_publish(subs, nodes, channel, args)
        promoted: dict = {}
        switched: dict = {}
        watch_stop = threading.Event()
        watchers = [threading.Thread(target=watch_promotion, args=(replica_port, watch_stop, promoted), daemon=True),
                    threading.Thread(target=watch_sentinel, args=(sets, old, watch_stop, switched), daemon=True)]
        for w in watchers:
            w.start()
        victim = sets.redis[old]
        row["killed_pid"] = victim.proc.pid
        t_kill = time.monotonic()
        sets.kill_master()  # SIGKILL, then waits for the process
        log(f"sentinel {k}: killed master 127.0.0.1:{old} (channel {channel})")
        wait_for_comeback(pub, subs, t_kill, args)
        watch_stop.set()
        time.sleep(1.5)  # the last deliveries
        row.update(failover_figures(pub, subs, t_kill, promoted.get("promoted_at"), nodes))
        at = switched.get("switched_at")
        row["sentinel_switched_after_ms"] = round((at - t_kill) * 1e3, 1) if at else None
        row["new_epochs"] = [n.metric("throng_redis_new_epochs_total") for n in nodes]
        row["gap_events"] = sum(len(sp["gaps"]) for sp in row["subscribers"])
        log(f"  {json.dumps({k2: row[k2] for k2 in ('first_after_kill_ms', 'publishes_503', 'lost_untold', 'lost_told_by_gap', 'promoted_after_ms', 'sentinel_switched_after_ms', 'gap_events')})}")
    except (RuntimeError, subprocess.SubprocessError, AssertionError, OSError, RespError) as e:
        record_error(row, e, log)
    finally:
        stop_round(pub, subs, nodes, row)
        if sets:
            sets.close()
    return row


def part_sentinel(throng: Path, work: Path, args, log) -> dict:
    """What `failover` measures, through Sentinel (`--broker redis-sentinel://`):
    --failover-rounds rounds, each a fresh master + replica + one Sentinel
    (down-after-milliseconds 400) from tests/python/support/sentinel.py; SIGKILL of
    the master; per subscriber the time to its first message published after the
    kill, the 503s meanwhile, lost told/untold, when the replica said role:master
    and when Sentinel named it."""
    return {"rounds": [sentinel_round(k + 1, throng, work, args, log) for k in range(args.failover_rounds)]}


# ---------------------------------------------------------------- report


def fmt(v, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else "n/a"


def ratio_table(title: str, new: dict, old: dict, keys, get) -> list[str]:
    """The Markdown rows of new ÷ old for each (key, label) at max and at paced
    load; get(row, phase, key) reads one figure of a setup's row."""
    rows = [f"| {title} | max | paced |", "|---|---:|---:|"]
    for key, label in keys:
        rows.append(f"| {label} | {ratio(get(new, 'max', key), get(old, 'max', key))} | "
                    f"{ratio(get(new, 'paced', key), get(old, 'paced', key))} |")
    return rows


def table(results: dict) -> str:
    prov, args = results["provenance"], results["args"]
    lines = [provenance.md_header("Past one Redis (bench/redis_scale.py)", prov),
             f"- redis-server: {results['versions'].get('redis')}; throng: {results['versions']['throng'].get('version')}",
             f"- nodes: 2 × `throng serve --threads {args['node_threads']}`; load: 2 × `throng bench push` "
             f"({args['channels_per_node']} channels each, {args['subscribers_per_channel']} WebSocket subscribers "
             f"per channel over both nodes, {args['publishers']} publisher threads each, 64 B payloads, through "
             f"its own node{', each publish with an Idempotency-Key of its own' if args.get('idempotency_keys') else ''}); "
             f"window {args['duration']} s after {args['warmup']} s; probe {args['probe_rate']:g}/s",
             "- the 2 cores are shared by every Redis process, both nodes and the load generators: "
             "a cluster's 3 masters are not 3 machines here",
             ""]
    busy = []

    def load_rows(section: str, title: str) -> None:
        part = results.get(section)
        if not part:
            return
        lines.extend([f"## {title}", "",
                      "| setup | phase | publishes/s (target) | delivery p50 / p99 ms | publish RTT p50 / p99 ms | "
                      "throng µs/publish | Redis µs/publish | client µs/publish | lost / dup | other cores |",
                      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"])
        for setup, row in part["setups"].items():
            if row.get("error") and not row.get("max"):
                lines.append(f"| {setup} | error: {row['error']} | | | | | | | | |")
                continue
            for phase in ("max", "paced"):
                f = row.get(phase)
                if not f:
                    continue
                tgt = f"({fmt(f['target_publishes_per_sec'], 0)}{'' if f.get('sustained', True) else ', NOT sustained'})" \
                    if f.get("target_publishes_per_sec") else "(as fast as answered)"
                d = f["deliveries"]
                lines.append(
                    f"| {setup} | {phase} | {fmt(f.get('publishes_per_sec'), 0)} {tgt} | "
                    f"{fmt(f.get('delivery_p50_ms'), 2)} / {fmt(f.get('delivery_p99_ms'), 2)} | "
                    f"{fmt(f['probe'].get('rtt_p50_ms'), 2)} / {fmt(f['probe'].get('rtt_p99_ms'), 2)} | "
                    f"{fmt(f.get('throng_cpu_us_per_publish'), 1)} | {fmt(f.get('redis_cpu_us_per_publish'), 1)} | "
                    f"{fmt(f.get('client_cpu_us_per_publish'), 1)} | {d.get('lost')} / {d.get('duplicated')} | "
                    f"{fmt(f.get('other_cores'), 2)} |")
                if (f.get("other_cores") or 0) > BUSY_CORES:
                    busy.append(f"{section} {setup} {phase}: {f['other_cores']:.2f}")
        lines.append("")
        lines.extend(["Per Redis process (window of each phase): its CPU per (S)PUBLISH it ran, "
                      "and its idle CPU before the load (cluster bus, replication):", "",
                      "| setup | phase | redis | cores | publishes/s it ran | µs CPU per publish | idle cores (all) |",
                      "|---|---|---|---:|---:|---:|---:|"])
        for setup, row in part["setups"].items():
            for phase in ("max", "paced"):
                f = row.get(phase)
                if not f:
                    continue
                for r in f["per_redis"]:
                    lines.append(f"| {setup} | {phase} | {r['redis']} | {fmt(r['cores'], 3)} | "
                                 f"{fmt(r.get('publish_calls_per_sec'), 0)} | {fmt(r.get('cpu_us_per_publish_call'), 1)} "
                                 f"| {fmt(row.get('idle_redis_cores'), 3)} |")
        lines.append("")
        lines.extend(["What Redis timed inside each command (INFO commandstats usec, the scripts' own commands "
                      "counted inside EVALSHA too), per publish, at max:", ""])
        for setup, row in part["setups"].items():
            f = row.get("max")
            for r in (f or {}).get("per_redis", []):
                if r.get("publish_calls"):
                    top = list(r["commands"].items())[:6]
                    lines.append(f"- {setup} {r['redis']}: " + ", ".join(
                        f"{cmd} {v['usec_per_publish']} µs ({v['calls'] / r['publish_calls']:.2f}×)" for cmd, v in top))
        lines.append("")

    load_rows("throughput", "1 Redis against a 3-master cluster")
    t = (results.get("throughput") or {}).get("setups", {})
    a, b = t.get("redis-1", {}), t.get("cluster-3", {})
    if a.get("max") and b.get("max"):
        lines += ratio_table("cluster-3 ÷ redis-1", b, a,
                             (("publishes_per_sec", "publishes/s"), ("delivery_p99_ms", "delivery p99"),
                              ("throng_cpu_us_per_publish", "throng CPU per publish"),
                              ("redis_cpu_us_per_publish", "Redis CPU per publish (all masters)")),
                             lambda row, phase, key: (row.get(phase) or {}).get(key))
        lines.append("")
    load_rows("wait", "WAIT: 1 Redis with one replica, --redis-wait-replicas 0 against 1")
    w = (results.get("wait") or {}).get("setups", {})
    w0, w1 = w.get("wait-0", {}), w.get("wait-1", {})
    if w0.get("max") and w1.get("max"):
        def get(row, phase, key):
            f = row.get(phase) or {}
            return f.get(key) if key in f else (f.get("probe") or {}).get(key)
        lines += ratio_table("wait-1 ÷ wait-0", w1, w0,
                             (("publishes_per_sec", "publishes/s"), ("rtt_p50_ms", "publish RTT p50"),
                              ("rtt_p99_ms", "publish RTT p99"), ("delivery_p99_ms", "delivery p99")), get)
        lines.append(f"\nshort waits (WAIT answered with fewer replicas), per node: "
                     f"{w1.get('short_waits')}\n")
    fo = results.get("failover")
    if fo:
        lines += ["## Failover: SIGKILL of the channel's master (cluster, a replica per master)", "",
                  f"A message every {args['failover_interval']} ms through both nodes in turn; "
                  f"{args['failover_subscribers']} subscribers per node; times from the SIGKILL.", "",
                  "| round | replica says master | first delivery after the kill, per subscriber, of a message "
                  "published after it (ms) | "
                  "first 200 after the kill | publishes from the kill: 503 / other failures / all | "
                  "slowest answer | acked lost: told by gap / untold | duplicates |",
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        for r in fo["rounds"]:
            if r.get("error"):
                lines.append(f"| {r['round']} | error: {r['error']} | | | | | | |")
                continue
            firsts = ", ".join(fmt(x, 0) for x in r["first_published_after_kill_ms"])
            early = [a for a, b in zip(r["first_after_kill_ms"], r["first_published_after_kill_ms"])
                     if a is not None and a != b]
            if early:  # a message published before the kill, delivered after it
                firsts += f" (any message: {', '.join(fmt(x, 0) for x in r['first_after_kill_ms'])})"
            lines.append(f"| {r['round']} | {fmt(r.get('promoted_after_ms'), 0)} ms | {firsts} | "
                         f"{fmt(r.get('first_ok_publish_after_kill_ms'), 0)} ms | {r['publishes_503']} / "
                         f"{r['publishes_failed_other']} / {r['publishes_from_kill']} | "
                         f"{fmt(r.get('slowest_answer_ms'), 0)} ms | {r['lost_told_by_gap']} / "
                         f"**{r['lost_untold']}** | {r['duplicates']} |")
        lines.append("")
    mem = results.get("memory")
    if mem:
        lines += ["## Redis memory per channel with history (64-byte messages)", "",
                  "| --history-size | channels | messages each | used_memory growth | bytes per channel | "
                  "keys per channel | MEMORY USAGE of one channel's keys |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for p in mem["points"]:
            if p.get("error"):
                lines.append(f"| {p['history_size']} | {p['channels']} | error: {p['error']} | | | | |")
                continue
            lines.append(f"| {p['history_size']} | {p['channels']:,} | {p['messages_per_channel']} | "
                         f"{fmt(p['used_memory_after'] - p['used_memory_before'])} B | "
                         f"{fmt(p['bytes_per_channel'], 0)} | {p['keys_per_channel']} | "
                         f"{fmt(p['sample_channel_memory_usage'])} B |")
        lines.append("")
    se = results.get("sentinel")
    if se:
        lines += ["## Sentinel: SIGKILL of the master (a replica, one Sentinel, down-after 400 ms)", "",
                  f"A message every {args['failover_interval']} ms through both nodes in turn; "
                  f"{args['failover_subscribers']} subscribers per node; --redis-wait-replicas "
                  f"{args['failover_wait_replicas']}; times from the SIGKILL.", "",
                  "| round | replica says master | Sentinel names it | first delivery after the kill, per "
                  "subscriber, of a message published after it (ms) | first 200 after the kill | "
                  "publishes from the kill: 503 / other failures / all | slowest answer | "
                  "acked lost: told by gap / untold | gap events | duplicates |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
        for r in se.get("rounds", []):
            if r.get("error"):
                lines.append(f"| {r['round']} | error: {r['error']} | | | | | | | | |")
                continue
            firsts = ", ".join(fmt(x, 0) for x in r["first_published_after_kill_ms"])
            lines.append(f"| {r['round']} | {fmt(r.get('promoted_after_ms'), 0)} ms | "
                         f"{fmt(r.get('sentinel_switched_after_ms'), 0)} ms | {firsts} | "
                         f"{fmt(r.get('first_ok_publish_after_kill_ms'), 0)} ms | {r['publishes_503']} / "
                         f"{r['publishes_failed_other']} / {r['publishes_from_kill']} | "
                         f"{fmt(r.get('slowest_answer_ms'), 0)} ms | {r['lost_told_by_gap']} / "
                         f"**{r['lost_untold']}** | {r['gap_events']} | {r['duplicates']} |")
        if se.get("skipped"):
            lines.append(f"- {se['skipped']}")
        lines.append("")
    if busy:
        lines += ["**The machine was not quiet**: other processes used " + "; ".join(busy)
                  + " cores. The CPU and latency figures are less reliable; a record wants a quiet machine.", ""]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def main() -> int:
    class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {','.join(PARTS)}")
    ap.add_argument("--node-threads", type=int, default=1, help="throng serve --threads of each node")
    ap.add_argument("--channels-per-node", type=int, default=101,
                    help="channels each bench publishes to through its node (odd, so --ports puts every "
                         "channel's subscribers on both nodes)")
    ap.add_argument("--subscribers-per-channel", type=int, default=4)
    ap.add_argument("--publishers", type=int, default=8, help="publisher threads per bench (one request each)")
    ap.add_argument("--paced-rate", type=float, default=2000, help="paced phase: publishes/s in all")
    ap.add_argument("--duration", type=float, default=10, help="measured window of a load phase, s")
    ap.add_argument("--warmup", type=float, default=2, help="load before the window, s")
    ap.add_argument("--probe-rate", type=float, default=100, help="probe publishes/s (one at a time)")
    ap.add_argument("--cluster-masters", type=int, default=3)
    ap.add_argument("--failover-rounds", type=int, default=3)
    ap.add_argument("--failover-subscribers", type=int, default=2, help="subscribers per node")
    ap.add_argument("--failover-interval", type=float, default=10, help="ms between publishes")
    ap.add_argument("--failover-after", type=float, default=2, help="s of publishing once all heard again")
    ap.add_argument("--failover-max", type=float, default=40,
                    help="s after the kill at most (a shard connection silent for 20 s is taken for dead: see the docs)")
    ap.add_argument("--idempotency-keys", action="store_true",
                    help="the load's publishes each carry an Idempotency-Key (what remembering keys costs)")
    ap.add_argument("--failover-wait-replicas", type=int, default=0, help="the nodes' --redis-wait-replicas")
    ap.add_argument("--memory-points", default="0:10000,10:10000,100:1000",
                    help="HISTORY:CHANNELS,... (max(HISTORY,1) messages published to each channel)")
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR), help="results directory")
    args = ap.parse_args()

    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        ap.error(f"unknown part(s) {set(parts) - set(PARTS)} (known: {','.join(PARTS)})")
    if args.channels_per_node % 2 == 0 or not 1 <= args.channels_per_node <= 2001:
        ap.error("--channels-per-node must be odd, 1..2001 (see its help)")
    if not (1 <= args.subscribers_per_channel <= 20 and args.channels_per_node * args.subscribers_per_channel <= 8000):
        ap.error("--subscribers-per-channel 1..20, and at most 8,000 connections per bench")
    if not (1 <= args.duration <= 120 and 0 <= args.warmup <= 30 and 1 <= args.publishers <= 32):
        ap.error("--duration 1..120 s, --warmup 0..30 s, --publishers 1..32")
    if not (0 < args.paced_rate <= 100_000 and 1 <= args.probe_rate <= 1000):
        ap.error("--paced-rate 0..100000, --probe-rate 1..1000")
    if not (1 <= args.failover_rounds <= 10 and 1 <= args.failover_subscribers <= 50
            and 1 <= args.failover_interval <= 1000 and 5 <= args.failover_max <= 60):
        ap.error("--failover-rounds 1..10, --failover-subscribers 1..50, --failover-interval 1..1000 ms, "
                 "--failover-max 5..60 s")
    total = 0
    for point in args.memory_points.split(","):
        h, sep, n = point.partition(":")
        if not (sep and h.isdigit() and n.isdigit() and 1 <= int(n) <= 100_000):
            ap.error(f"--memory-points: {point!r} is not HISTORY:CHANNELS (channels 1..100000)")
        total += max(int(h), 1) * int(n)
    if total > 1_000_000:
        ap.error("--memory-points: at most 1,000,000 publishes in all")
    for tool in ("redis-server", "redis-cli"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed (scripts/test.sh installs it)")

    prov = provenance.provenance()
    throng_src = Path(os.environ.get("THRONG_BIN", REPO / "target/release/throng"))
    if not throng_src.exists():
        raise SystemExit(f"{throng_src} not found (cargo build --release)")
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[redis_scale {time.strftime('%H:%M:%S')} +{time.monotonic() - started:5.0f}s] {line}",
              file=sys.stderr, flush=True)

    results: dict = {"provenance": prov, "args": vars(args)}
    with tempfile.TemporaryDirectory(prefix="throng-redis-scale-") as tmp:
        work = Path(tmp)
        throng = work / "throng"
        shutil.copy2(throng_src, throng)  # the real one may be rebuilt meanwhile
        results["versions"] = {
            "throng": provenance.binary(throng),
            "throng_from": str(throng_src),
            "redis": subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip(),
        }
        for part, fn in (("throughput", part_throughput), ("wait", part_wait), ("failover", part_failover),
                         ("memory", part_memory), ("sentinel", part_sentinel)):
            if part in parts:
                results[part] = fn(throng, work, args, log)
    results["run_secs"] = round(time.monotonic() - started, 1)
    md = table(results)
    path = provenance.write_raw(provenance.raw_path("redis-scale", out_dir=args.out), results, md)
    print(md)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
