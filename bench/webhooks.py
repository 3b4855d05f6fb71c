#!/usr/bin/env python3
"""What Pusher webhooks cost throng, and that a slow endpoint holds nothing up.

For each case a fresh `throng serve --pusher-app 1:bench-key:bench-secret` on a
free loopback port, then

  throng bench idle --protocol pusher --conns C --channels C --rate R --duration D

(every connection subscribes to a channel of its own, so each one makes a
`channel_occupied`, and each close a `channel_vacated`). The cases:

- none: no webhook;
- receiver: `--pusher-webhook` to an HTTP server in this script that answers 200
  at once and counts the events it gets (signatures not checked here: the tests do);
- stalled: `--pusher-webhook` to a socket that accepts and never answers (each
  request waits out the 10 s timeout, then the back-off).

Recorded per case: the bench's open time and failures, the server's CPU seconds
from before the bench to the end of the webhooks' delivery (or of the bench, for
none and stalled), the events the receiver got and when the last came, and the
server's webhook counters from /metrics. Everything started here is stopped by
its pid; every wait is bounded.

Keeps the run in bench/results/webhooks-STAMP.json and .md (provenance: commit,
dirty tree, machine, command line).

Usage: bench/webhooks.py [--conns 10000] [--rate 2000] [--duration 3s] [--rounds 1]
                         [--bin target/release/throng] [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402  (bench/provenance.py)
from common import connectable, free_port, wait_until  # noqa: E402  (bench/common.py)
import throng_server  # noqa: E402  (bench/throng_server.py: DEFAULT_BIN)

APP = "1:bench-key:bench-secret"


def cpu_secs(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics(port: int) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    text = data.decode(errors="replace")
    out = {}
    for name, value in re.findall(r'^throng_pusher_webhook_(\S+) (\d+)$', text, re.M):
        out[name] = int(value)
    return out


class Receiver:
    """Answers 200 at once; counts events and notes when the last came."""

    def __init__(self) -> None:
        self.events = 0
        self.requests = 0
        self.last_at = 0.0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                n = len(json.loads(body)["events"])
                with receiver.lock:
                    receiver.events += n
                    receiver.requests += 1
                    receiver.last_at = time.monotonic()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/hooks"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


class Stalled:
    """Accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hooks"
        self.held: list[socket.socket] = []
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self.stop = True
        for c in self.held:
            c.close()
        self.sock.close()


def run_case(case: str, args) -> dict:
    target = {"none": None, "receiver": Receiver(), "stalled": Stalled()}[case]
    port = free_port()
    serve = [args.bin, "serve", "--listen", f"127.0.0.1:{port}", "--pusher-app", APP, "--threads", "1",
             "--stats-interval", "0"]
    if target:
        serve += ["--pusher-webhook", target.url]
    server = subprocess.Popen(serve, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})
    try:
        wait_until(lambda: connectable(port), 20, "the server listening")
        time.sleep(0.5)
        cpu0 = cpu_secs(server.pid)
        bench_cmd = [args.bin, "bench", "idle", "--protocol", "pusher", "--pusher-app", APP, "--url",
                     f"ws://127.0.0.1:{port}/", "--conns", str(args.conns), "--channels", str(args.conns),
                     "--channel-prefix", "own-", "--rate", str(args.rate), "--duration", args.duration,
                     "--interval", "0", "--json", "--allow-failures"]
        started = time.monotonic()
        bench = subprocess.run(bench_cmd, capture_output=True, timeout=args.conns / args.rate + 120)
        bench_end = time.monotonic()
        report = json.loads(bench.stdout)
        expected = 2 * report["opened"]
        if isinstance(target, Receiver):
            # Every occupied and vacated delivered, or 30 s without progress.
            last_seen, last_change = -1, time.monotonic()
            while target.events < expected and time.monotonic() - last_change < 30:
                if target.events != last_seen:
                    last_seen, last_change = target.events, time.monotonic()
                time.sleep(0.1)
            done_at = target.last_at or bench_end
        else:
            time.sleep(1)
            done_at = bench_end
        cpu1 = cpu_secs(server.pid)
        counters = metrics(port)
        row = {
            "case": case, "conns": args.conns, "opened": report["opened"], "failed": report["failed"],
            "dropped": report["dropped"], "connect_secs": report["connect_secs"],
            "server_cpu_secs": round(cpu1 - cpu0, 3),
            "server_cpu_us_per_conn": round((cpu1 - cpu0) * 1e6 / max(report["opened"], 1), 1),
            "webhook_counters": counters, "bench_command": bench_cmd, "serve_command": serve,
        }
        if isinstance(target, Receiver):
            row.update({"events_received": target.events, "requests_received": target.requests,
                        "events_expected": expected,
                        "last_event_after_bench_end_secs": round(done_at - bench_end, 3),
                        "events_per_request": round(target.events / max(target.requests, 1), 1)})
        row["wall_secs"] = round(time.monotonic() - started, 2)
        return row
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)
        if target:
            target.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--duration", default="3s")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--bin", default=throng_server.DEFAULT_BIN)
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR))
    args = ap.parse_args()
    prov = provenance.provenance()
    rows = []
    for r in range(args.rounds):
        for case in ("none", "receiver", "stalled"):
            row = run_case(case, args)
            row["round"] = r + 1
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("command")}), flush=True)
    lines = ["| round | case | opened | failed | dropped | open s | server CPU µs/conn | events got/expected | "
             "per request | last after bench end s | delivered | failed | dropped | retries |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    delivered, failed, dropped = (f'events_total{{outcome="{o}"}}' for o in ("delivered", "failed", "dropped"))
    for row in rows:
        c = row["webhook_counters"]
        got = f"{row['events_received']:,}/{row['events_expected']:,}" if "events_received" in row else ""
        lines.append(
            f"| {row['round']} | {row['case']} | {row['opened']:,} | {row['failed']} | {row['dropped']} | "
            f"{row['connect_secs']:.2f} | {row['server_cpu_us_per_conn']:.1f} | {got} | "
            f"{row.get('events_per_request', '')} | {row.get('last_event_after_bench_end_secs', '')} | "
            f"{c.get(delivered, '')} | {c.get(failed, '')} | {c.get(dropped, '')} | {c.get('retries_total', '')} |")
    doc = {"provenance": prov, "binary": provenance.binary(args.bin),
           "settings": {"conns": args.conns, "rate": args.rate, "duration": args.duration, "rounds": args.rounds},
           "rows": rows}
    md = provenance.md_header("Pusher webhooks: cost and a stalled endpoint (bench/webhooks.py)", prov) \
        + "\n" + "\n".join(lines) + "\n"
    path = provenance.write_raw(provenance.raw_path("webhooks", out_dir=args.out), doc, md)
    print("\n".join(lines))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
