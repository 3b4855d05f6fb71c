#!/usr/bin/env python3
"""Userspace memory per held SSE stream or waiting long-poll: server VmRSS before
and after opening N `GET /sse/{channel}` streams (each read up to its first
complete block: throng's `retry:` line) or N `GET /poll/{channel}?timeout=60`
polls (counted waiting in /api/stats), spread over source addresses
127.0.0.2-254 and --channels (100) channels, then held. Prints one line, and keeps
the run in bench/results/comet-memory-STAMP.json (UTC stamp; the provenance: commit,
dirty tree, machine, command line; the binary and server flags, the settings, on how
many channels the connections were held, and every figure) and comet-memory-STAMP.md.
--no-record keeps nothing (bench/nchan.sh, which keeps the figures in its own file).

Usage: bench/comet_memory.py [--transport sse|poll] [--conns 15000] [--channels 100]
                             [--bin target/release/throng] [--out bench/results] [--no-record]

Another server, already running (bench/nchan.sh measures Nchan this way):
  bench/comet_memory.py --port PORT --pids PID[,PID...] [--path '/sse/{channel}']
                        [--status-path /nchan_status] [--channels 100] [--json]
--port: the server on 127.0.0.1:PORT (none is started); --pids: the processes whose
memory is summed (master and workers: VmRSS and, fairer for shared pages, Pss from
/proc/PID/smaps_rollup); --path: the request path, {channel} becoming held-0 ..
held-(channels-1); --status-path: fetched while the streams are held and put in
the output as it came; --json: one JSON object instead of the line. SSE requests
carry `Accept: text/event-stream` (Nchan answers 403 without it).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import sys
import time
from pathlib import Path

import provenance
import throng_server


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def pss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def kib_fields(path: str, names: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path(path).read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in names:
                out[key] = int(rest.split()[0])
    except OSError:
        pass
    return out


def memory(pids: list[int]) -> dict:
    """VmRSS and Pss (KiB) summed over pids; pss None if any is unreadable."""
    pss = [pss_kib(p) for p in pids]
    return {"rss_kib": sum(rss_kib(p) for p in pids),
            "pss_kib": None if None in pss else sum(pss)}


def breakdown(pids: list[int]) -> dict:
    """Anonymous, file-backed and shared-memory parts of VmRSS and Pss (KiB), summed."""
    out: dict[str, int] = {}
    for p in pids:
        for key, v in {**kib_fields(f"/proc/{p}/status", ("RssAnon", "RssFile", "RssShmem")),
                       **kib_fields(f"/proc/{p}/smaps_rollup", ("Pss_Anon", "Pss_File", "Pss_Shmem"))}.items():
            out[key] = out.get(key, 0) + v
    return out


async def open_stream(port: int, index: int, held: list, args) -> None:
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind((f"127.0.0.{2 + index % 253}", 0))
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    path = args.path.replace("{channel}", f"held-{index % args.channels}")
    if args.transport == "sse":
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".encode())
        status = await reader.readline()
        if b" 200 " not in status:
            writer.close()
            raise RuntimeError(f"answered {status.decode(errors='replace').strip()!r}")
        while (await reader.readline()) not in (b"\r\n", b"\n"):   # headers
            pass
        seen = False
        while True:   # the first complete block: "retry: 2000" (throng), ": hi" (Nchan)
            line = await reader.readline()
            if not line:
                raise RuntimeError("closed before the first block")
            if line.strip():
                seen = True
            elif seen:
                break
    else:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
    held.append((writer, index % args.channels))


def http_get(port: int, path: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.split(b"\r\n\r\n", 1)[1].decode(errors="replace")


def waiting_polls(port: int) -> int:
    return json.loads(http_get(port, "/api/stats"))["connections"]["poll"]


async def measure(port: int, pids: list[int], args) -> dict:
    before = memory(pids)
    before_parts = breakdown(pids)
    held: list = []
    failures: dict[str, int] = {}
    for start in range(0, args.conns, 500):
        batch = range(start, min(args.conns, start + 500))
        results = await asyncio.gather(*(open_stream(port, i, held, args) for i in batch),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                key = f"{type(r).__name__}: {r}"[:120]
                failures[key] = failures.get(key, 0) + 1
    if args.transport == "poll":
        for _ in range(100):
            if waiting_polls(port) >= len(held):
                break
            await asyncio.sleep(0.1)
        held_count = waiting_polls(port)
    else:
        held_count = len(held)
    await asyncio.sleep(args.settle)
    after = memory(pids)
    after_parts = breakdown(pids)
    status = http_get(port, args.status_path) if args.status_path else None
    channels_held = len({channel for _, channel in held})
    for w, _ in held:
        w.close()
    per = {k: None if before[k] is None or after[k] is None or held_count == 0
           else (after[k] - before[k]) * 1024 / held_count for k in before}
    return {"transport": args.transport, "conns": args.conns, "held": held_count,
            "failed": sum(failures.values()), "failures": failures,
            "channels": args.channels, "channels_held": channels_held, "path": args.path, "pids": pids,
            "rss_before_kib": before["rss_kib"], "rss_after_kib": after["rss_kib"],
            "pss_before_kib": before["pss_kib"], "pss_after_kib": after["pss_kib"],
            "rss_bytes_per_conn": per["rss_kib"], "pss_bytes_per_conn": per["pss_kib"],
            "parts_before_kib": before_parts, "parts_after_kib": after_parts,
            "settle_secs": args.settle, "status": status,
            "kernel": os.uname().release, "cores": os.cpu_count()}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=15000)
    ap.add_argument("--transport", choices=["sse", "poll"], default="sse")
    ap.add_argument("--bin", default=throng_server.DEFAULT_BIN)
    ap.add_argument("--port", type=int, help="measure the server already on 127.0.0.1:PORT")
    ap.add_argument("--pids", help="with --port: comma-separated pids whose memory is summed")
    ap.add_argument("--path", help="request path; {channel} is held-N (default /sse/{channel} "
                    "or /poll/{channel}?since=0&timeout=60)")
    ap.add_argument("--channels", type=int, default=100)
    ap.add_argument("--status-path", help="GET while held, included in the output")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between opening and measuring")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR), help="where the raw JSON and .md go")
    ap.add_argument("--no-record", action="store_true", help="write no raw file (the caller keeps the figures)")
    args = ap.parse_args()
    prov = None if args.no_record else provenance.provenance()
    if args.path is None:
        args.path = "/sse/{channel}" if args.transport == "sse" else "/poll/{channel}?since=0&timeout=60"
    if (args.port is None) != (args.pids is None):
        ap.error("--port and --pids go together")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server_flags = ("--ping-interval", "0")
    if args.port is not None:
        result = await measure(args.port, [int(p) for p in args.pids.split(",") if p], args)
    else:
        with throng_server.running(args.bin, *server_flags) as (server, port):
            time.sleep(1)
            result = await measure(port, [server.pid], args)
    what = "SSE streams held" if args.transport == "sse" else "long-polls waiting"
    per = result["rss_bytes_per_conn"]
    line = (f"{result['held']} {what}: server RSS {result['rss_before_kib']} -> "
            f"{result['rss_after_kib']} KiB, {per if per is None else format(per, '.0f')} B each "
            f"({result['kernel']}, {result['cores']} cores)")
    if args.json:
        print(json.dumps(result))
    else:
        print(line)
        if result["failed"]:
            print(f"{result['failed']} failed: {result['failures']}", file=sys.stderr)
    if prov is not None:
        if args.port is None:
            server = {"started_here": True, "binary": provenance.binary(args.bin),
                      "serve_flags": ["--stats-interval", "0", *server_flags]}
        else:
            server = {"started_here": False, "port": args.port}
        doc = {"provenance": prov, "server": server,
               "settings": {"transport": args.transport, "conns": args.conns, "channels": args.channels,
                            "path": args.path, "settle_secs": args.settle, "status_path": args.status_path,
                            "source_ips": "127.0.0.2-127.0.0.254", "open_batch": 500},
               "result": result}
        md = (provenance.md_header(f"comet memory: {args.transport} (bench/comet_memory.py)", prov)
              + f"- {result['held']} held over {result['channels_held']} channels ({args.channels} asked)\n\n    "
              + line)
        path = provenance.write_raw(provenance.raw_path("comet-memory", out_dir=args.out), doc, md)
        print(f"wrote {path}", file=sys.stderr)


asyncio.run(main())
