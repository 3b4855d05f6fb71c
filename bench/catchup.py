#!/usr/bin/env python3
"""Catch-up: how fast a WebSocket subscriber coming back N messages behind is given
them. Publishes N messages (32 B) to one channel over a kept-alive HTTP connection,
then opens `/ws/catchup?since=0` (raw) on a plain socket and times the replay from
the upgrade request to the last replayed frame. Prints one line, and keeps the run in
bench/results/catchup-STAMP.json (UTC stamp; with the provenance: commit, dirty tree,
machine, command line; the binary, the settings and the figures) and catchup-STAMP.md.

Usage: bench/catchup.py [--messages 10000] [--bin target/release/throng] [--out bench/results]
"""
from __future__ import annotations

import argparse
import base64
import http.client
import os
import socket
import sys
import time

import provenance
import throng_server


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=10000)
    ap.add_argument("--bin", default=throng_server.DEFAULT_BIN)
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR), help="where the raw JSON and .md go")
    args = ap.parse_args()
    prov = provenance.provenance()
    n = args.messages
    flags = ("--history-size", str(n), "--max-queue", "16MiB")
    with throng_server.running(args.bin, *flags) as (_server, port):
        api = http.client.HTTPConnection("127.0.0.1", port)
        payload = b"x" * 32
        for _ in range(n):
            api.request("POST", "/api/publish/catchup", body=payload, headers={"Content-Type": "text/plain"})
            api.getresponse().read()
        sock = socket.create_connection(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        started = time.perf_counter()
        sock.sendall(
            f"GET /ws/catchup?since=0 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += sock.recv(65536)
        buf = buf.split(b"\r\n\r\n", 1)[1]
        frames = 0
        while frames < n:
            # Server frames are unmasked; these are all under 126 bytes.
            while len(buf) >= 2 and len(buf) >= 2 + buf[1]:
                buf = buf[2 + buf[1]:]
                frames += 1
            if frames < n:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise SystemExit(f"connection closed after {frames} of {n} frames")
                buf += chunk
        elapsed = time.perf_counter() - started
        line = (f"catch-up of {frames} messages (32 B, raw): {elapsed * 1000:.1f} ms, "
                f"{frames / elapsed:,.0f} messages/s ({os.uname().release}, {os.cpu_count()} cores)")
        print(line)
        sock.close()
    doc = {"provenance": prov, "binary": provenance.binary(args.bin),
           "settings": {"messages": n, "message_size": 32, "channel": "catchup", "format": "raw",
                        "server_flags": list(flags), "publish": "POST /api/publish/catchup, one kept-alive connection",
                        "timed": "from the upgrade request of /ws/catchup?since=0 to the last replayed frame"},
           "frames": frames, "elapsed_ms": elapsed * 1000, "messages_per_sec": frames / elapsed}
    md = provenance.md_header("catch-up (bench/catchup.py)", prov) + "\n    " + line
    path = provenance.write_raw(provenance.raw_path("catchup", out_dir=args.out), doc, md)
    print(f"wrote {path}", file=sys.stderr)


main()
