#!/usr/bin/env python3
"""What a `/metrics` scrape costs the server, with no connections and with 15,000
idle WebSockets open, next to `/healthz` (the cheapest request).

Starts `throng serve --threads 2 --stats-interval 0` on a free loopback port. For
each cell (0 connections first; then 15,000 idle WebSockets held by
`throng bench idle --source-ips 127.0.0.2-127.0.0.254`, counted in /metrics'
throng_connections{transport="websocket"}), and each path (/metrics, /healthz),
--rounds rounds of:

  --requests GETs over one kept-alive connection (python http.client), each timed
  from its request to the end of its body (the round trip); the server's CPU over
  the batch from /proc/PID/task/*/schedstat (every thread's time on a CPU, ns);
  then as long again with no requests, whose CPU (the idle loops', the pings') is
  taken out: CPU per request = ((batch) - (idle)) / requests.

So the CPU is the whole request as the server does it (waking its loop, parsing,
the handler, writing the body), not the handler alone, which cannot be timed from
outside. The client shares the machine's cores with the server.

Keeps the run in bench/results/scrape-cost-STAMP.json (UTC stamp; the provenance:
commit, dirty tree, machine, command line; the binary, the settings, every round's
figures and round-trip times' percentiles) and scrape-cost-STAMP.md. Bounded: the
bench holds its connections for at most --hold seconds and is stopped by its pid
when the rounds are done, as is the server.

Usage: bench/scrape_cost.py [--conns 15000] [--rounds 3] [--requests 5000]
                            [--bin target/release/throng] [--out bench/results]
Python standard library only.
"""
from __future__ import annotations

import argparse
import http.client
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402  (bench/provenance.py)
from common import free_port  # noqa: E402  (bench/common.py)
import throng_server  # noqa: E402  (bench/throng_server.py: DEFAULT_BIN)

PATHS = ("/metrics", "/healthz")


def cpu_ns(pid: int) -> int:
    """Every thread's time on a CPU so far (the first field of schedstat), ns."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass   # a thread that ended meanwhile
    return total


def metric(body: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def get(conn: http.client.HTTPConnection, path: str) -> bytes:
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        raise SystemExit(f"GET {path}: {r.status}")
    return body


def pct(sorted_us: list[float], p: float) -> float:
    return sorted_us[min(len(sorted_us) - 1, int(p / 100 * len(sorted_us)))]


def measure(pid: int, conn: http.client.HTTPConnection, path: str, n: int) -> dict:
    """One round: n requests timed one by one, the server CPU over them, and over
    as long again without requests."""
    times: list[float] = []
    c0 = cpu_ns(pid)
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        body = get(conn, path)
        times.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    c1 = cpu_ns(pid)
    time.sleep(wall)
    c2 = cpu_ns(pid)
    busy, idle = c1 - c0, c2 - c1
    us = sorted(x * 1e6 for x in times)
    return {"requests": n, "wall_secs": wall, "cpu_busy_ns": busy, "cpu_idle_ns": idle,
            "cpu_us_per_request": (busy - idle) / n / 1000,
            "rtt_us": {"median": statistics.median(us), "p90": pct(us, 90), "p99": pct(us, 99),
                       "max": us[-1], "mean": statistics.fmean(us)},
            "body_bytes": len(body)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=15000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--hold", type=int, default=120, help="most seconds the bench holds its connections")
    ap.add_argument("--bin", default=throng_server.DEFAULT_BIN)
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR), help="where the raw JSON and .md go")
    args = ap.parse_args()
    prov = provenance.provenance()
    printed: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        printed.append(line)

    port = free_port()
    serve_cmd = [args.bin, "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2", "--stats-interval", "0"]
    server = subprocess.Popen(serve_cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    bench = None
    cells: dict[str, dict] = {}
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the server is not listening after 10 s")
                time.sleep(0.05)
        bench_cmd = [args.bin, "bench", "idle", "--url", f"ws://127.0.0.1:{port}/", "--conns", str(args.conns),
                     "--rate", "5000", "--duration", f"{args.hold}s", "--source-ips", "127.0.0.2-127.0.0.254",
                     "--interval", "0", "--allow-failures"]
        for label, conns in (("0", 0), (str(args.conns), args.conns)):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            if conns:
                bench = subprocess.Popen(bench_cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
                deadline = time.monotonic() + 60
                while True:
                    open_ws = metric(get(conn, "/metrics").decode(), 'throng_connections{transport="websocket"}')
                    if open_ws is not None and open_ws >= conns:
                        break
                    if time.monotonic() > deadline or bench.poll() is not None:
                        raise SystemExit(f"{open_ws} of {conns} WebSockets open after 60 s")
                    time.sleep(0.5)
                time.sleep(2)   # the opening's work done
            body = get(conn, "/metrics").decode()
            state = {"websockets": metric(body, 'throng_connections{transport="websocket"}'),
                     "process_open_fds": metric(body, "process_open_fds"),
                     "process_resident_memory_bytes": metric(body, "process_resident_memory_bytes"),
                     "metrics_body_bytes": len(body)}
            say(f"{label} connections: {state['websockets']:.0f} WebSockets open, process_open_fds "
                f"{state['process_open_fds']:.0f}, /metrics body {len(body):,} B")
            cell: dict = {"state": state}
            for path in PATHS:
                rounds = [measure(server.pid, conn, path, args.requests) for _ in range(args.rounds)]
                cell[path] = rounds
                cpu = [r["cpu_us_per_request"] for r in rounds]
                med = [r["rtt_us"]["median"] for r in rounds]
                p99 = [r["rtt_us"]["p99"] for r in rounds]
                say(f"  {path:9} server CPU per request {', '.join(f'{c:.1f}' for c in cpu)} µs; "
                    f"round trip median {', '.join(f'{m:.0f}' for m in med)} µs, "
                    f"p99 {', '.join(f'{p:.0f}' for p in p99)} µs")
            cells[label] = cell
            conn.close()
        if bench.poll() is not None:
            say(f"note: the bench exited ({bench.returncode}) before the rounds ended")
        doc = {"provenance": prov, "binary": provenance.binary(args.bin),
               "settings": {"conns": args.conns, "rounds": args.rounds, "requests_per_round": args.requests,
                            "paths": list(PATHS), "serve_command": serve_cmd, "bench_command": bench_cmd,
                            "client": "python http.client, one kept-alive connection per cell",
                            "cpu": "sum of /proc/PID/task/*/schedstat first field over the batch, minus the "
                                   "same over as long again without requests, divided by the requests"},
               "cells": cells}
        md = provenance.md_header("what a /metrics scrape costs (bench/scrape_cost.py)", prov) + "\n" + "\n".join(
            "    " + line for line in printed)
        path = provenance.write_raw(provenance.raw_path("scrape-cost", out_dir=args.out), doc, md)
        print(f"wrote {path}", file=sys.stderr)
        return 0
    finally:
        if bench and bench.poll() is None:
            bench.terminate()
            bench.wait(timeout=15)
        server.terminate()
        server.wait(timeout=15)


if __name__ == "__main__":
    sys.exit(main())
