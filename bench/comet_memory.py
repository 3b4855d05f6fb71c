#!/usr/bin/env python3
"""Userspace memory per held SSE stream or waiting long-poll: server VmRSS before
and after opening N `GET /sse/{channel}` streams (each read up to its `retry:` line)
or N `GET /poll/{channel}?timeout=60` polls (counted waiting in /api/stats), spread
over source addresses 127.0.0.2-254 and 100 channels, then held. Prints one line.

Usage: bench/comet_memory.py [--transport sse|poll] [--conns 15000] [--bin target/release/throng]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import time
from pathlib import Path

import throng_server


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def open_stream(port: int, index: int, held: list, transport: str) -> None:
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind((f"127.0.0.{2 + index % 253}", 0))
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    if transport == "sse":
        writer.write(f"GET /sse/held-{index % 100} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        while not (await reader.readline()).startswith(b"retry:"):
            pass
    else:
        path = f"/poll/held-{index % 100}?since=0&timeout=60"
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
    held.append(writer)


def waiting_polls(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /api/stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return json.loads(data.split(b"\r\n\r\n", 1)[1])["connections"]["poll"]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=15000)
    ap.add_argument("--transport", choices=["sse", "poll"], default="sse")
    ap.add_argument("--bin", default=throng_server.DEFAULT_BIN)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with throng_server.running(args.bin, "--ping-interval", "0") as (server, port):
        time.sleep(1)
        before = rss_kib(server.pid)
        held: list = []
        for start in range(0, args.conns, 500):
            batch = range(start, min(args.conns, start + 500))
            await asyncio.gather(*(open_stream(port, i, held, args.transport) for i in batch))
        if args.transport == "poll":
            for _ in range(100):
                if waiting_polls(port) >= len(held):
                    break
                await asyncio.sleep(0.1)
            held_count = waiting_polls(port)
        else:
            held_count = len(held)
        await asyncio.sleep(2)
        after = rss_kib(server.pid)
        per = (after - before) * 1024 / held_count
        what = "SSE streams held" if args.transport == "sse" else "long-polls waiting"
        print(f"{held_count} {what}: server RSS {before} -> {after} KiB, {per:.0f} B each "
              f"({os.uname().release}, {os.cpu_count()} cores)")
        for w in held:
            w.close()


asyncio.run(main())
