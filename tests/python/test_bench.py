"""`throng bench MODE ...` (the load generator) as a black box.

Each run is short (1-4 s of load, a handful of connections) and uses `--json`:
stdout must then hold exactly one JSON object (the report), whatever the exit
status. Exit status 1 when connections failed or dropped, unless --allow-failures.

Report fields used here (src/bench/report.rs `Report`): mode, conns, processes,
attempted, opened, failed, dropped, failures {reason: count}, sockets (open at the
end), frames_total, messages_total (data messages received), messages_sent,
messages_received_in_load, pings, latency {samples, avg_us, median_us, p90_us,
p95_us, p99_us, max_us}, lost_messages, errors, error_rate_pct, and in push mode
push {published, publish_errors, expected_deliveries, delivered, lost,
duplicated, out_of_order, foreign_seqs}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_port, tcp_connectable
from rawws import channel_info
from support.bench import (
    assert_clean,
    assert_latency_sane,
    assert_no_panic,
    bench_cmd,
    bench_env,
    BENCH_TIMEOUT,
    BenchRun,
    run_bench,
    short,
)

HERE = Path(__file__).resolve().parent


# -- helpers -------------------------------------------------------------------


class ForeignEcho:
    """foreign_echo.py (the `websockets` library's server) in a subprocess, stopped by pid."""

    def __init__(self, ping_interval: float | None = None, ping_timeout: float | None = None):
        self.port = free_port()
        args = [sys.executable, str(HERE / "foreign_echo.py"), str(self.port)]
        if ping_interval is not None:
            args.append(str(ping_interval))
            if ping_timeout is not None:
                args.append(str(ping_timeout))
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=bench_env()
        )
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while not tcp_connectable(self.port):
            if self.proc.poll() is not None:
                out, err = self.proc.communicate(timeout=5)
                raise RuntimeError(f"foreign echo server exited with {self.proc.returncode}: {out!r} {err!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("foreign echo server not listening after 10 s")
            time.sleep(0.05)

    def url(self, path: str = "/") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.proc.stdout:
            self.proc.stdout.close()
        if self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture
def foreign_echo():
    servers: list[ForeignEcho] = []

    def start(ping_interval: float | None = None, ping_timeout: float | None = None) -> ForeignEcho:
        srv = ForeignEcho(ping_interval, ping_timeout)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


# -- against a real throng server ------------------------------------------------


def test_echo_against_throng(start_server):
    srv = start_server()
    conns = 10
    run = run_bench("echo", "--url", srv.url("/echo"), "--conns", conns, *short())
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["mode"] == "echo", ctx
    assert r["conns"] == conns and r["processes"] == 1, ctx
    assert_clean(r, conns, ctx)
    assert r["messages_sent"] > 0, ctx
    # Every message sent came back (one in flight per connection, all landed in the grace).
    assert r["messages_total"] == r["messages_sent"], ctx
    assert r["lost_messages"] == 0, ctx
    assert r["errors"] == 0 and r["error_rate_pct"] == 0, ctx
    assert r["messages_received_in_load"] > 0 and r["throughput_msgs_per_sec"] > 0, ctx
    # One round-trip sample per echo.
    assert r["latency"]["samples"] == r["messages_sent"], ctx
    assert_latency_sane(r["latency"], ctx)
    # The load lasted the 1 s asked for: at least that (a lower bound holds on a
    # slow machine), within the process's own lifetime, and not the 10 s default
    # (an upper bound with 9 s to spare, only to tell --duration was used).
    assert 0.9 <= r["duration_secs"] <= run.elapsed, ctx
    assert r["duration_secs"] < 10, ctx


def test_idle_against_throng_holds_connections_and_answers_pings(start_server):
    # Server pings every connection every 500 ms and would close one that never answers
    # after --idle-timeout; 2 s of idle load must see pings and no drops.
    srv = start_server("--ping-interval", "500ms", "--idle-timeout", "1500ms")
    conns = 20
    run = run_bench("idle", "--url", srv.url("/echo"), "--conns", conns, *short(duration="2s"))
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["mode"] == "idle", ctx
    assert_clean(r, conns, ctx)
    assert r["messages_sent"] == 0 and r["messages_total"] == 0, ctx
    # Each connection is pinged ~4 times in 2 s; at least once each.
    assert r["pings"] >= conns, ctx
    assert r["errors"] == 0, ctx


def test_push_against_throng_no_loss_no_dup_in_order(start_server):
    srv = start_server()
    conns, channels, rate = 10, 2, 50
    run = run_bench(
        "push", "--url", srv.url("/"), "--conns", conns, "--channels", channels,
        "--publish-rate", rate, "--grace", "1s", *short(),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["mode"] == "push", ctx
    assert_clean(r, conns, ctx)
    p = r.get("push")
    assert isinstance(p, dict), f"push report missing\n{ctx}"
    assert p["publish_errors"] == 0 and p["publish_errors_by_reason"] == {}, ctx
    # ~50 messages in 1 s of load (loose bounds: a busy machine paces imperfectly).
    assert 15 <= p["published"] <= 80, ctx
    assert p["foreign_seqs"] == 0, ctx
    assert p["delivered"] > 0, ctx
    assert p["lost"] == 0, ctx
    assert p["duplicated"] == 0, ctx
    assert p["out_of_order"] == 0, ctx
    # Subscribers are spread round-robin (5 per channel): every publish reaches 5.
    assert p["expected_deliveries"] == (conns // channels) * p["published"], ctx
    assert p["delivered"] == p["expected_deliveries"], ctx
    assert r["lost_messages"] == 0 and r["errors"] == 0, ctx
    # Raw data messages seen = deliveries (non-chat channels carry no events).
    assert r["messages_total"] == p["delivered"], ctx
    # Cross-check against the server: the channels' seqs account for every publish.
    last = [channel_info(srv.port, f"bench-{i}")["last_seq"] for i in range(channels)]
    assert all(s > 0 for s in last), (last, ctx)
    assert sum(last) == p["published"], (last, ctx)
    assert_latency_sane(r["latency"], ctx)


def test_chat_against_throng(start_server):
    srv = start_server()
    conns, room = 10, 5
    run = run_bench(
        "chat", "--url", srv.url("/"), "--conns", conns, "--room-size", room,
        "--grace", "1s", *short(duration="2s"),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["mode"] == "chat", ctx
    assert_clean(r, conns, ctx)
    # 2 rooms x 4 senders (0.8 of 5), each sends every 1 s: at least one each in 2 s.
    assert r["messages_sent"] >= 8, ctx
    assert r["messages_total"] > 0 and r["messages_received_in_load"] > 0, ctx
    # Each message is broadcast to the 5 members of its room (events come on top).
    assert r["messages_total"] >= r["messages_sent"] * room, ctx
    lat = r["latency"]
    for key in ("samples", "avg_us", "median_us", "p90_us", "p95_us", "p99_us", "max_us"):
        assert key in lat, (key, ctx)
    # Latency is measured from send to the sender's own copy of the broadcast.
    assert lat["samples"] == r["messages_sent"], ctx
    assert_latency_sane(lat, ctx)
    assert lat["median_us"] <= lat["p99_us"] <= lat["max_us"], ctx
    assert r["lost_messages"] == 0 and r["errors"] == 0, ctx


# -- against a foreign server ------------------------------------------------------


def test_echo_against_foreign_websockets_server(foreign_echo):
    srv = foreign_echo()
    conns = 5
    run = run_bench("echo", "--url", srv.url("/"), "--conns", conns, *short())
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert_clean(r, conns, ctx)
    assert r["messages_sent"] > 0, ctx
    assert r["messages_total"] == r["messages_sent"], ctx
    assert r["lost_messages"] == 0 and r["errors"] == 0, ctx
    assert r["latency"]["samples"] == r["messages_sent"], ctx
    assert srv.proc.poll() is None, "the foreign server died during the run"


def test_idle_against_foreign_server_answers_its_pings(foreign_echo):
    # The websockets server pings every 0.25 s and closes (1011) a client whose pong
    # is not back within 2.5 s (room for a busy machine): the bench must answer every
    # ping. A bench that did not would be closed 2.75 s in, well within the 4 s run.
    srv = foreign_echo(ping_interval=0.25, ping_timeout=2.5)
    conns = 5
    run = run_bench("idle", "--url", srv.url("/"), "--conns", conns, *short(duration="4s"))
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert_clean(r, conns, ctx)
    assert r["pings"] >= conns, ctx


# -- failures --------------------------------------------------------------------


def test_push_with_failed_publishes_exits_1(start_server):
    # Subscribers are fine, but every publish goes to a dead port: nothing was
    # measured, so the run must not pass.
    srv = start_server()
    dead = free_port()
    run = run_bench(
        "push", "--url", srv.url("/"), "--conns", 4, "--publish-rate", 20,
        "--publish-url", f"http://127.0.0.1:{dead}", "--grace", "0s", *short(),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 1, ctx
    r = run.report()
    assert r["failed"] == 0 and r["dropped"] == 0, ctx
    assert r["push"]["publish_errors"] > 0, ctx
    assert r["errors"] >= r["push"]["publish_errors"], ctx
    assert "failed publishes" in run.stderr, ctx


@pytest.mark.parametrize("procs", [1, 2])
def test_dead_port_exits_1_and_counts_refused(procs):
    port = free_port()  # nothing listens here
    conns = 4
    run = run_bench(
        "echo", "--url", f"ws://127.0.0.1:{port}/echo", "--conns", conns, "--procs", procs, *short()
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 1, ctx
    r = run.report()  # the report is still printed
    assert r["attempted"] == conns, ctx
    assert r["opened"] == 0 and r["failed"] == conns and r["dropped"] == 0, ctx
    assert r["failures"] == {"refused": conns}, ctx
    assert r["sockets"] == 0 and r["messages_sent"] == 0, ctx
    assert r["errors"] == conns and r["error_rate_pct"] == 100.0, ctx
    assert r["processes"] == procs, ctx
    assert "failed" in run.stderr, f"stderr should say why the exit status is 1\n{ctx}"


def test_dead_port_allow_failures_exits_0():
    port = free_port()
    run = run_bench(
        "idle", "--url", f"ws://127.0.0.1:{port}/", "--conns", 3, "--allow-failures", *short()
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["failed"] == 3 and r["failures"] == {"refused": 3}, ctx


def test_rejected_handshakes_are_counted_by_status(start_server):
    # --max-conns 5: the server answers the 6th and later upgrades with 503.
    srv = start_server("--max-conns", "5")
    conns = 10
    run = run_bench("idle", "--url", srv.url("/echo"), "--conns", conns, "--rate", 0, *short())
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 1, ctx
    r = run.report()
    assert r["attempted"] == conns and r["opened"] == 5 and r["failed"] == 5, ctx
    assert r["dropped"] == 0 and r["sockets"] == 5, ctx
    assert r["failures"] == {"handshake rejected with status 503": 5}, ctx


def test_server_shutdown_mid_run_counts_drops(start_server):
    """SIGTERM the server ~1.5 s into a 4 s idle run: it closes every client with 1001.
    Two benches run at once, one with --allow-failures."""
    srv = start_server()
    conns = 10
    procs = {}
    try:
        for name, extra in (("strict", []), ("allow", ["--allow-failures"])):
            cmd = bench_cmd("idle", "--url", srv.url("/echo"), "--conns", conns, *short(*extra, duration="4s"))
            procs[name] = (cmd, subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=bench_env()
            ))
        t0 = time.monotonic()
        time.sleep(1.5)
        for name, (_, p) in procs.items():
            assert p.poll() is None, f"bench {name} ended before the server went away"
        srv.signal(signal.SIGTERM)
        assert srv.wait(10) == 0, "server did not shut down cleanly"
        runs = {}
        for name, (cmd, p) in procs.items():
            out, err = p.communicate(timeout=BENCH_TIMEOUT)
            runs[name] = BenchRun(cmd, p.returncode, out.decode("utf-8", "replace"),
                                  err.decode("utf-8", "replace"), time.monotonic() - t0)
    finally:
        for _, p in procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=5)

    for name, run in runs.items():
        ctx = run.describe()
        assert_no_panic(run)
        assert run.returncode == (0 if name == "allow" else 1), ctx
        r = run.report()
        assert r["attempted"] == conns and r["opened"] == conns and r["failed"] == 0, ctx
        assert r["dropped"] == conns, ctx
        assert r["failures"] == {"closed with code 1001": conns}, ctx
        assert r["sockets"] == 0, ctx
        assert r["errors"] == conns, ctx
    assert "dropped" in runs["strict"].stderr, runs["strict"].describe()


# -- --procs -----------------------------------------------------------------------


def test_procs_echo_merges(start_server):
    srv = start_server()
    conns = 21  # uneven split: 11 + 10
    run = run_bench("echo", "--url", srv.url("/echo"), "--conns", conns, "--procs", 2, *short())
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["processes"] == 2 and r["conns"] == conns, ctx
    assert_clean(r, conns, ctx)
    assert r["messages_sent"] > 0, ctx
    assert r["messages_total"] == r["messages_sent"], ctx
    assert r["latency"]["samples"] == r["messages_sent"], ctx
    assert r["lost_messages"] == 0 and r["errors"] == 0, ctx
    assert_latency_sane(r["latency"], ctx)


def test_procs_push_merges_without_loss(start_server):
    srv = start_server()
    conns, channels = 21, 2  # channel 0: 11 subscribers, channel 1: 10 (split over 2 processes)
    run = run_bench(
        "push", "--url", srv.url("/"), "--conns", conns, "--procs", 2, "--channels", channels,
        "--publish-rate", 50, "--grace", "1s", *short(),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["processes"] == 2, ctx
    assert_clean(r, conns, ctx)
    p = r["push"]
    assert p["published"] > 0 and p["publish_errors"] == 0 and p["foreign_seqs"] == 0, ctx
    assert p["lost"] == 0 and p["duplicated"] == 0 and p["out_of_order"] == 0, ctx
    last = [channel_info(srv.port, f"bench-{i}")["last_seq"] for i in range(channels)]
    assert sum(last) == p["published"], (last, ctx)
    assert p["expected_deliveries"] == 11 * last[0] + 10 * last[1], (last, ctx)
    assert p["delivered"] == p["expected_deliveries"], ctx
    assert r["messages_total"] == p["delivered"], ctx


def test_procs_chat_rooms_spanning_processes(start_server):
    srv = start_server()
    # 20 connections over 3 processes (7 + 7 + 6): rooms 5-9 and 10-14 span two processes.
    conns, room = 20, 5
    run = run_bench(
        "chat", "--url", srv.url("/"), "--conns", conns, "--procs", 3, "--room-size", room,
        "--grace", "1s", *short(duration="2s"),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["processes"] == 3, ctx
    assert_clean(r, conns, ctx)
    assert r["messages_sent"] >= 16, ctx  # 4 rooms x 4 senders, at least once each
    assert r["messages_total"] >= r["messages_sent"] * room, ctx
    assert r["latency"]["samples"] == r["messages_sent"], ctx
    assert_latency_sane(r["latency"], ctx)
    assert r["lost_messages"] == 0 and r["errors"] == 0, ctx


# -- bad flags -----------------------------------------------------------------------


BAD_FLAGS = [
    (["flood"], "flood"),
    (["echo", "--conns", "0"], "--conns"),
    (["echo", "--conns", "2", "--procs", "3"], "--procs"),
    (["echo", "--procs", "0"], "--procs"),
    (["echo", "--url", "http://127.0.0.1:1/"], "http://127.0.0.1:1/"),
    (["echo", "--url", "https://127.0.0.1:1/"], "https://127.0.0.1:1/"),
    (["echo", "--duration", "ten"], "ten"),
    (["echo", "--duration", "0s"], "--duration"),
    (["echo", "--rate=-1"], "--rate"),
    (["echo", "--ports", "9-3"], "9-3"),
    (["echo", "--source-ips", "127.0.0.9-127.0.0.1"], "127.0.0.9-127.0.0.1"),
    (["chat", "--senders", "1.5"], "--senders"),
    (["chat", "--room-size", "0"], "--room-size"),
    (["push", "--publish-rate", "0"], "--publish-rate"),
    (["push", "--channels", "0"], "--channels"),
]


@pytest.mark.parametrize("args,mentions", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flags_fail_clearly(args, mentions):
    # An hour's load where the flags leave the duration alone: a run that got
    # past its flags would not end by itself within the generous timeout.
    hour = [] if "--duration" in args else ["--duration", "1h"]
    try:
        run = run_bench(*args, *hour, "--json", timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"bad flags must be rejected before anything runs: {args} still running after 60 s")
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode != 0, ctx
    assert run.returncode != 101, f"exit 101 is a Rust panic\n{ctx}"
    assert run.returncode > 0, f"killed by a signal\n{ctx}"
    assert "error" in run.stderr.lower(), ctx
    assert mentions in run.stderr, f"stderr should name {mentions!r}\n{ctx}"
    assert run.stdout.strip() == "", f"no report for a run that never started\n{ctx}"


@pytest.mark.parametrize("procs", [1, 2])
def test_ctrl_c_ends_the_load_early_and_still_reports(start_server, procs):
    srv = start_server()
    # An hour's load: only the interrupt can end it within the wait below.
    cmd = bench_cmd("echo", "--url", srv.url("/echo"), "--conns", 10, "--procs", procs,
                    "--duration", "1h", "--interval", "0", "--json")
    # Like a terminal's Ctrl-C: the signal goes to the whole process group.
    started = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=bench_env(), start_new_session=True)
    try:
        time.sleep(2.0)
        os.killpg(p.pid, signal.SIGINT)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("still running 60 s after SIGINT, with an hour's load asked for")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    lifetime = time.monotonic() - started
    assert p.returncode == 0, err.decode()
    assert b"interrupted" in err
    r = json.loads(out)
    assert r["opened"] == 10 and r["failed"] == 0
    assert r["messages_sent"] > 0 and r["messages_total"] > 0
    # The report gives the time the load really ran, not the hour asked for.
    assert 0 < r["duration_secs"] <= lifetime, (r["duration_secs"], lifetime)


# -- --max-opening: never more handshakes in flight than asked -------------------


class SlowUpgrader:
    """A WebSocket server (raw sockets, one thread per connection) that answers each
    upgrade only after `delay` seconds and then holds the connection, counting how
    many upgrades were waiting at once: the bench's in-flight opens as the server
    sees them."""

    def __init__(self, delay: float) -> None:
        import base64
        import hashlib
        import socket
        import threading

        self._b64, self._sha1, self._threading = base64, hashlib, threading
        self.delay = delay
        self.lock = threading.Lock()
        self.waiting = 0
        self.max_waiting = 0
        self.answered = 0
        self.conns: list = []
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.port = self.listener.getsockname()[1]
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            self._threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        with self.lock:
            self.waiting += 1
            self.max_waiting = max(self.max_waiting, self.waiting)
        time.sleep(self.delay)
        key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key:"))
        accept = self._b64.b64encode(
            self._sha1.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()).decode()
        with self.lock:
            self.waiting -= 1
            self.answered += 1
        conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n").encode())

    def stop(self) -> None:
        self.stopping = True
        self.listener.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("procs,max_opening", [(1, 3), (2, 4)])
def test_max_opening_caps_the_connections_opening_at_once(procs, max_opening):
    server = SlowUpgrader(delay=0.05)
    try:
        run = run_bench("idle", "--url", f"ws://127.0.0.1:{server.port}/", "--conns", 40, "--rate", 0,
                        "--max-opening", max_opening, "--procs", procs, *short())
        assert_no_panic(run)
        r = run.report()
        ctx = f"max waiting {server.max_waiting}\n{run.describe()}"
        assert run.returncode == 0, ctx
        assert_clean(r, 40, ctx)
        assert server.answered == 40, ctx
        # The cap held, and it was the cap (not one at a time) that paced the opens.
        assert 2 <= server.max_waiting <= max_opening, ctx
        # With --json there is no bar: the connect phase reports itself on stderr.
        assert "[connecting" in run.stderr or r["connect_secs"] < 1.0, ctx
    finally:
        server.stop()


def test_without_max_opening_every_connect_starts_at_once():
    server = SlowUpgrader(delay=0.3)
    try:
        run = run_bench("idle", "--url", f"ws://127.0.0.1:{server.port}/", "--conns", 40, "--rate", 0,
                        "--max-opening", 0, *short())
        r = run.report()
        ctx = f"max waiting {server.max_waiting}\n{run.describe()}"
        assert_clean(r, 40, ctx)
        assert server.max_waiting > 20, ctx
    finally:
        server.stop()
