#!/usr/bin/env python3
"""What the dashboard costs the server: CPU of the `throng-feed` thread (it samples
the counters once a second and, while a dashboard watches, builds and sends the
feed message, visiting every channel for the busiest ten), with nobody watching and
with one dashboard watching, at N subscribers spread over N channels (the worst
case for the busiest-channel walk). Also times `GET /api/stats/history`.

Keeps the run in bench/results/feed-cost-STAMP.json (UTC stamp; the provenance:
commit, dirty tree, machine, command line; the binary, settings and figures) and
feed-cost-STAMP.md.

Usage: bench/feed_cost.py [--conns 15000] [--seconds 20] [--out bench/results]
Env:   THRONG_BIN (default <repo>/target/release/throng)
Needs: python3 with `websockets` (tests/python/.venv has it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402  (bench/provenance.py)
from common import free_port  # noqa: E402  (bench/common.py)

ROOT = Path(__file__).resolve().parent.parent
THRONG = os.environ.get("THRONG_BIN", str(ROOT / "target/release/throng"))
TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int, name: str) -> float:
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip() == name:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / TICKS
    raise SystemExit(f"no thread {name} in {pid}")


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read()


async def watch(port: int, seconds: float) -> int:
    got = 0
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws/throng:stats?format=json", max_size=None) as ws:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(ws.recv(), deadline - time.monotonic())
                got += 1
            except asyncio.TimeoutError:
                break
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=15000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR), help="where the raw JSON and .md go")
    args = ap.parse_args()
    prov = provenance.provenance()
    printed: list[str] = []

    def say(line: str) -> None:
        print(line)
        printed.append(line)

    port = free_port()
    serve_cmd = [THRONG, "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2", "--stats-interval", "0"]
    server = subprocess.Popen(serve_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bench = None
    try:
        for _ in range(50):
            try:
                get(port, "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        hold = args.seconds * 2 + 30
        bench_cmd = [THRONG, "bench", "push", "--url", f"ws://127.0.0.1:{port}", "--conns", str(args.conns),
                     "--channels", str(args.conns), "--publish-rate", "100", "--rate", "5000",
                     "--duration", f"{int(hold)}s", "--source-ips", "127.0.0.2-127.0.0.20", "--json"]
        bench = subprocess.Popen(bench_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Wait until every subscriber is in.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = get(port, "/api/stats")
            if json.loads(stats)["connections"]["websocket"] >= args.conns:
                break
            time.sleep(0.5)
        subscribed = json.loads(stats)["connections"]["websocket"]
        say(f"machine: {os.cpu_count()} cores, {platform.node()}, {platform.release()}; "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
        say(f"{args.conns} subscribers over {args.conns} channels, 100 messages/s published")
        before = thread_cpu_seconds(server.pid, "throng-feed")
        time.sleep(args.seconds)
        idle = thread_cpu_seconds(server.pid, "throng-feed") - before
        say(f"nobody watching: feed thread {idle / args.seconds * 1000:.3f} ms CPU per second")
        before = thread_cpu_seconds(server.pid, "throng-feed")
        got = asyncio.run(watch(port, args.seconds))
        watched = thread_cpu_seconds(server.pid, "throng-feed") - before
        say(f"one dashboard watching: feed thread {watched / args.seconds * 1000:.3f} ms CPU per second "
            f"({got} feed messages in {args.seconds:.0f} s)")
        times = []
        for _ in range(20):
            t = time.perf_counter()
            body = get(port, "/api/stats/history")
            times.append(time.perf_counter() - t)
        times.sort()
        say(f"GET /api/stats/history: {len(body)} bytes, median {times[len(times) // 2] * 1000:.2f} ms round trip")
        doc = {"provenance": prov, "binary": provenance.binary(THRONG),
               "settings": {"conns": args.conns, "channels": args.conns, "publish_rate": 100, "seconds": args.seconds,
                            "serve_command": serve_cmd, "bench_command": bench_cmd},
               "subscribed": subscribed,
               "feed_cpu_ms_per_sec_idle": idle / args.seconds * 1000,
               "feed_cpu_ms_per_sec_watched": watched / args.seconds * 1000, "feed_messages_watched": got,
               "stats_history_bytes": len(body), "stats_history_ms": [t * 1000 for t in times],
               "stats_history_median_ms": times[len(times) // 2] * 1000}
        md = provenance.md_header("dashboard feed cost (bench/feed_cost.py)", prov) + "\n" + "\n".join(
            "    " + line for line in printed)
        path = provenance.write_raw(provenance.raw_path("feed-cost", out_dir=args.out), doc, md)
        print(f"wrote {path}", file=sys.stderr)
    finally:
        if bench:
            bench.terminate()
            bench.wait()
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
