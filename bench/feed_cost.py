#!/usr/bin/env python3
"""What the dashboard costs the server: CPU of the `throng-feed` thread (it samples
the counters once a second and, while a dashboard watches, builds and sends the
feed message, visiting every channel for the busiest ten), with nobody watching and
with one dashboard watching, at N subscribers spread over N channels (the worst
case for the busiest-channel walk). Also times `GET /api/stats/history`.

Usage: bench/feed_cost.py [--conns 15000] [--seconds 20]
Env:   THRONG_BIN (default <repo>/target/release/throng)
Needs: python3 with `websockets` (tests/python/.venv has it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import websockets

ROOT = Path(__file__).resolve().parent.parent
THRONG = os.environ.get("THRONG_BIN", str(ROOT / "target/release/throng"))
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    args = ap.parse_args()
    port = free_port()
    server = subprocess.Popen(
        [THRONG, "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2", "--stats-interval", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    bench = None
    try:
        for _ in range(50):
            try:
                get(port, "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        hold = args.seconds * 2 + 30
        bench = subprocess.Popen(
            [THRONG, "bench", "push", "--url", f"ws://127.0.0.1:{port}", "--conns", str(args.conns),
             "--channels", str(args.conns), "--publish-rate", "100", "--rate", "5000",
             "--duration", f"{int(hold)}s", "--source-ips", "127.0.0.2-127.0.0.20", "--json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        # Wait until every subscriber is in.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = get(port, "/api/stats")
            import json
            if json.loads(stats)["connections"]["websocket"] >= args.conns:
                break
            time.sleep(0.5)
        print(f"machine: {os.cpu_count()} cores, {platform.node()}, {platform.release()}; "
              f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
        print(f"{args.conns} subscribers over {args.conns} channels, 100 messages/s published")
        before = thread_cpu_seconds(server.pid, "throng-feed")
        time.sleep(args.seconds)
        idle = thread_cpu_seconds(server.pid, "throng-feed") - before
        print(f"nobody watching: feed thread {idle / args.seconds * 1000:.3f} ms CPU per second")
        before = thread_cpu_seconds(server.pid, "throng-feed")
        got = asyncio.run(watch(port, args.seconds))
        watched = thread_cpu_seconds(server.pid, "throng-feed") - before
        print(f"one dashboard watching: feed thread {watched / args.seconds * 1000:.3f} ms CPU per second "
              f"({got} feed messages in {args.seconds:.0f} s)")
        times = []
        for _ in range(20):
            t = time.perf_counter()
            body = get(port, "/api/stats/history")
            times.append(time.perf_counter() - t)
        times.sort()
        print(f"GET /api/stats/history: {len(body)} bytes, median {times[len(times) // 2] * 1000:.2f} ms round trip")
    finally:
        if bench:
            bench.terminate()
            bench.wait()
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
