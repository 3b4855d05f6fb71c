#!/usr/bin/env python3
"""Faults in a cluster, with nothing lost: Redis (append-only, fsync always), two
throng nodes on it, nginx in front (deploy/nginx.conf, round-robin), and three
`throng bench push` processes through nginx, one per transport (WebSocket, SSE,
long-poll), each with its own channel and its own publisher; the publish rates add
up to --rate messages/s. Every process is started here on free loopback ports and
stopped by its pid. While the load runs, one scenario:

  rolling  SIGTERM node A (it closes its clients with 1001 and drains), start it
           again; --gap seconds later the same for node B.
  sigkill  SIGKILL node A (its clients see their sockets reset); start it again
           --gap seconds later.
  redis    SIGKILL redis-server under load; start it again --gap seconds later
           (on its append-only file). Publishes get 503 while it is away.

The subscribers are the bench's own: let go with a "come back" signal, they come
back through nginx after a full-jitter backoff (--backoff, doubling per failed try
up to --backoff-cap) and resume (WebSocket: since= and epoch=, SSE: Last-Event-ID,
poll: since=). The load goes on for --backoff-cap plus a few seconds after the
fault is over (a subscriber refused all through it may be in its longest wait
when it ends), then each bench is stopped (SIGINT, which ends its load as its
--duration would). Each bench then checks every seq its publisher was
acknowledged: lost, duplicated, out of order, and the reconnect curve (lost /
connect attempts / back per 100 ms). Also printed: publish failures by reason,
and each node's RSS before the load and after.

Usage (needs redis-server and nginx; scripts/test.sh installs both):
  tests/python/.venv/bin/python bench/restart.py [--scenario rolling,sigkill,redis]
      [--ws 400] [--sse 100] [--poll 30] [--rate 200] [--gap 6] [--backoff 500ms]
      [--backoff-cap 15s] [--history 2000]
      [--bin target/release/throng] [--server-arg ARG ...] [--json FILE]
Writes every figure (and the reconnect curves), the settings and the run's provenance
(bench/provenance.py: commit, dirty tree, machine, command line) to --json, by default
bench/results/restart-STAMP.json, with the printed table beside it as .md.
Exit status 1 if any subscriber lost or duplicated a message.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
from conftest import free_port, tcp_connectable  # noqa: E402
from procs import Nginx, stop_process  # noqa: E402
from rawws import http_request  # noqa: E402
from support.nginx import fronting  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
import provenance  # noqa: E402  (bench/provenance.py)

TRANSPORTS = ("ws", "sse", "poll")
# Steady load before the first fault, so that it strikes a run in full flow.
LEAD_SECS = 3.0
# After the fault is over and the longest backoff wait (--backoff-cap) has passed,
# this long for the last subscribers back to catch up from history.
CATCH_UP_SECS = 5.0
# The benches' own --duration is only a backstop: they are stopped with SIGINT
# once the tail after the fault is over. It allows this long for the faults'
# own steps (a drain, a restart, the nodes finding Redis again).
FAULT_STEPS_ALLOWANCE_SECS = 120.0


def duration_secs(text: str) -> float:
    """A duration as the bench takes one (`500ms`, `15s`, `1m`, `0`), in seconds."""
    m = re.fullmatch(r"(\d+)(ms|s|m)", text.strip())
    if text.strip() == "0":
        return 0.0
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 500ms, 15s or 1m")
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def duration_text(text: str) -> str:
    """argparse type: checks a duration, keeps it as written (the bench parses it)."""
    duration_secs(text)
    return text


class Redis:
    """redis-server with an append-only file fsynced on every write: what it
    acknowledged survives a SIGKILL."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.TemporaryDirectory(prefix="throng-restart-redis-")
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", self.dir.name],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: tcp_connectable(self.port), 10, "redis-server listening")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)
        self.dir.cleanup()


class Node:
    """One throng node on a fixed port, so it can be restarted where nginx looks."""

    def __init__(self, binary: str, broker: str, name: str, history: int,
                 extra: tuple[str, ...] = ()) -> None:
        self.binary, self.broker, self.name, self.history = binary, broker, name, history
        self.extra = extra
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--broker", self.broker,
             "--stats-interval", "0", "--drain-timeout", "5s", "--threads", "1",
             "--history-size", str(self.history), *self.extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(self.healthy, 10, f"node {self.name} healthy")

    def healthy(self) -> bool:
        try:
            return http_request(self.port, "GET", "/healthz", timeout=1).status == 200
        except OSError:
            return False

    def connections(self) -> int:
        try:
            held = http_request(self.port, "GET", "/api/stats", timeout=2).json()["connections"]
            return sum(int(n) for n in held.values())
        except (OSError, ValueError, KeyError, AttributeError):
            return 0

    def rss_kib(self) -> int:
        assert self.proc
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self, sig: int = signal.SIGTERM) -> float:
        """Signals the node and waits for it to exit; returns how long that took."""
        assert self.proc
        t0 = time.monotonic()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return time.monotonic() - t0


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_bench(args, proxy_port: int, transport: str, conns: int, rate: float, duration: float,
                scenario: str) -> subprocess.Popen:
    channel = f"{scenario}-{transport}-"
    url = {
        "ws": f"ws://127.0.0.1:{proxy_port}/ws/{{channel}}?format=json",
        "sse": f"http://127.0.0.1:{proxy_port}/sse/{{channel}}",
        "poll": f"http://127.0.0.1:{proxy_port}/poll/{{channel}}?timeout=30",
    }[transport]
    cmd = [args.bin, "bench", "push", "--url", url, "--transport", transport,
           "--conns", str(conns), "--channels", "1", "--channel-prefix", channel,
           "--publish-rate", f"{rate:g}", "--publish-url", f"http://127.0.0.1:{proxy_port}",
           "--duration", f"{duration:g}s", "--rate", "2000", "--backoff", args.backoff,
           "--backoff-cap", args.backoff_cap,
           "--threads", "1", "--json", "--allow-failures",
           # Redis fsyncs every write (appendfsync always), so one publish takes a
           # disk flush: one request at a time would cap a channel near 30/s.
           "--publishers", "4"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_scenario(args, scenario: str) -> dict:
    redis = Redis()
    nodes = [Node(args.bin, redis.url, name, args.history, tuple(args.server_args))
             for name in ("A", "B")]
    counts = {"ws": args.ws, "sse": args.sse, "poll": args.poll}
    total_conns = sum(counts.values())
    # Two nginx connections per subscriber (client and upstream), and room for the
    # publishers and the polls' reconnects.
    proxy = Nginx(fronting([n.port for n in nodes], worker_connections=2 * total_conns + 1000))
    events: list[tuple[float, str]] = []
    benches: dict[str, subprocess.Popen] = {}
    try:
        rss_before = {n.name: n.rss_kib() for n in nodes}
        active = [t for t in TRANSPORTS if counts[t] > 0]
        # The fault plays out within the load; it then runs on long enough for
        # everyone to come back and catch up: a subscriber refused all through the
        # fault may be in its longest backoff wait (--backoff-cap) when it ends.
        # That tail is timed from the fault's end (below); --duration only bounds it.
        faults = 2 if scenario == "rolling" else 1
        tail = duration_secs(args.backoff_cap) + CATCH_UP_SECS
        duration = LEAD_SECS + faults * args.gap + tail + FAULT_STEPS_ALLOWANCE_SECS
        for t in active:
            benches[t] = start_bench(args, proxy.port, t, counts[t], args.rate / len(active), duration,
                                     scenario)
        # Each bench says on stderr when all its subscribers are open and the load begins.
        loaded = {t: threading.Event() for t in benches}
        stderr_text = {t: [] for t in benches}

        def watch(t: str, proc: subprocess.Popen) -> None:
            assert proc.stderr
            for line in proc.stderr:
                stderr_text[t].append(line)
                if "load for" in line:
                    loaded[t].set()

        watchers = [threading.Thread(target=watch, args=(t, p), daemon=True) for t, p in benches.items()]
        for w in watchers:
            w.start()
        for t, ev in loaded.items():
            if not ev.wait(60):
                raise RuntimeError(f"bench {t} did not open its subscribers: {''.join(stderr_text[t])[-2000:]}")
        time.sleep(LEAD_SECS)

        def mark(what: str) -> None:
            events.append((time.time(), what))
            print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr)

        if scenario == "rolling":
            for i, node in enumerate(nodes):
                if i:
                    time.sleep(args.gap)
                mark(f"SIGTERM node {node.name}")
                took = node.stop(signal.SIGTERM)
                mark(f"node {node.name} exited after {took:.2f} s")
                node.start()
                mark(f"node {node.name} healthy again")
        elif scenario == "sigkill":
            node = nodes[0]
            mark(f"SIGKILL node {node.name}")
            node.stop(signal.SIGKILL)
            time.sleep(args.gap)
            node.start()
            mark(f"node {node.name} healthy again")
        elif scenario == "redis":
            mark("SIGKILL redis-server")
            redis.kill()
            time.sleep(args.gap)
            redis.start()
            mark("redis-server listening again")
            wait_until(lambda: all(n.healthy() for n in nodes), 30, "both nodes healthy on Redis")
            mark("both nodes healthy again")

        # The fault is over: the longest backoff wait, the catch-up, then the end.
        time.sleep(tail)
        for proc in benches.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        mark(f"load ended, {tail:g} s after the fault")

        results = {}
        for t, proc in benches.items():
            assert proc.stdout
            out = proc.stdout.read()
            proc.wait(timeout=duration + 120)
            try:
                results[t] = json.loads(out)
            except json.JSONDecodeError as e:
                raise RuntimeError(
                    f"bench {t} printed no JSON (exit {proc.returncode}): {''.join(stderr_text[t])[-2000:]}"
                ) from e
        rss_after = {n.name: n.rss_kib() for n in nodes}
        # What nginx logged, by kind (client and request details cut off).
        proxy_log: dict[str, int] = {}
        for line in proxy.log.read_text(errors="replace").splitlines():
            kind = re.sub(r"^\S+ \S+ \[\w+\] \d+#\d+: (\*\d+ )?", "", line).split(", client:")[0]
            proxy_log[kind] = proxy_log.get(kind, 0) + 1
        return {
            "scenario": scenario,
            "subscribers": counts,
            "rate": args.rate,
            "gap_secs": args.gap,
            "backoff": args.backoff,
            "backoff_cap": args.backoff_cap,
            "events": [[round(t * 1000), what] for t, what in events],
            "rss_kib_before": rss_before,
            "rss_kib_after": rss_after,
            "proxy_log": proxy_log,
            "benches": results,
        }
    finally:
        for proc in benches.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        proxy.stop()
        for n in nodes:
            n.stop()
        redis.stop()


def summary_rows(result: dict) -> list[list[str]]:
    rows = []
    t0 = result["events"][0][0] if result["events"] else 0
    for t, r in result["benches"].items():
        p = r["push"]
        cb = p["comeback"]
        # When the returns began and ended, relative to the first fault.
        slots = [row for row in cb["curve"] if row[2] or row[3]]
        spread = f"{(slots[0][0] - t0) / 1000:.1f}…{(slots[-1][0] - t0) / 1000:.1f} s" if slots else "-"
        rows.append([
            result["scenario"], t, f"{r['opened']:,}", f"{p['published']:,} ({p['published'] / r['duration_secs']:.0f}/s)",
            f"{p['publish_errors']:,}",
            f"{p['delivered']:,}", f"{p['expected_deliveries']:,}", str(p["lost"]), str(p["duplicated"]),
            str(p["server_reported_gaps"]), f"{cb['lost']:,} / {cb['back']:,}",
            f"{cb['away_median_ms']} / {cb['away_p99_ms']} / {cb['away_max_ms']}",
            f"{cb['attempts']:,}", str(cb["peak_attempts_per_100ms"]), spread,
        ])
    return rows


HEADER = ["scenario", "transport", "subscribers", "acked publishes (rate)", "publish failures", "delivered",
          "expected", "lost", "duplicated", "gaps told", "let go / back", "away ms p50 / p99 / max",
          "connect attempts", "peak attempts per 100 ms", "returns (from 1st fault)"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target/release/throng"))
    ap.add_argument("--scenario", default="rolling,sigkill,redis")
    ap.add_argument("--ws", type=int, default=400)
    ap.add_argument("--sse", type=int, default=100)
    ap.add_argument("--poll", type=int, default=30)
    ap.add_argument("--rate", type=float, default=200, help="publishes per second, all channels together")
    ap.add_argument("--gap", type=float, default=6, help="seconds between faults / before a restart")
    ap.add_argument("--backoff", default="500ms", type=duration_text,
                    help="a subscriber let go comes back after a random wait in [0, BACKOFF * 2^tries)")
    ap.add_argument("--backoff-cap", default="15s", type=duration_text,
                    help="the longest that wait grows to (the bench's --backoff-cap); the load runs "
                    f"on for it plus {CATCH_UP_SECS:g} s after the fault")
    ap.add_argument("--server-arg", dest="server_args", action="append", default=[], metavar="ARG",
                    help="one more argument for each node's `throng serve`, repeated for more "
                    "(written --server-arg=--flag when it starts with --)")
    ap.add_argument("--history", type=int, default=2000,
                    help="--history-size of the nodes: it must cover the longest time a subscriber is away")
    ap.add_argument("--json", help="write every figure (and the reconnect curves) here "
                    "(default bench/results/restart-STAMP.json, UTC)")
    args = ap.parse_args()
    if duration_secs(args.backoff) > 0 and duration_secs(args.backoff_cap) < duration_secs(args.backoff):
        ap.error(f"--backoff-cap {args.backoff_cap} must be at least --backoff {args.backoff}")
    prov = provenance.provenance()   # taken as the run starts
    out_path = Path(args.json) if args.json else provenance.raw_path("restart")
    scenarios = [s for s in args.scenario.split(",") if s]
    for s in scenarios:
        if s not in ("rolling", "sigkill", "redis"):
            ap.error(f"unknown scenario {s!r}")
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, Linux {platform.release()}", file=sys.stderr)
    results = []
    for s in scenarios:
        print(f"scenario {s}", file=sys.stderr)
        results.append(run_scenario(args, s))
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    bad = False
    for r in results:
        for row in summary_rows(r):
            lines.append("| " + " | ".join(row) + " |")
        for t, b in r["benches"].items():
            p = b["push"]
            bad |= p["lost"] > 0 or p["duplicated"] > 0 or p["comeback"]["away_at_end"] > 0
            for reason, n in p["publish_errors_by_reason"].items():
                lines.append(f"  {r['scenario']} {t} publish failed: {reason}: {n}")
        lines.append(f"  {r['scenario']}: node RSS KiB before {r['rss_kib_before']}, after {r['rss_kib_after']}")
        for kind, n in sorted(r["proxy_log"].items(), key=lambda kv: -kv[1]):
            lines.append(f"  {r['scenario']} nginx: {kind}: {n}")
    print("\n".join(lines))
    doc = {"provenance": prov, "binary": provenance.binary(args.bin), "settings": vars(args),
           "scenarios": results}
    md = provenance.md_header("restart: faults in a cluster (bench/restart.py)", prov) + "\n" + "\n".join(lines)
    out_path = provenance.write_raw(out_path, doc, md if out_path.suffix == ".json" else None)
    print(f"wrote {out_path}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
