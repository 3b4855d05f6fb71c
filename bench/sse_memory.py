#!/usr/bin/env python3
"""Userspace memory per held SSE stream: server VmRSS before and after opening N
`GET /sse/{channel}` streams (spread over source addresses 127.0.0.2-254), each read
up to its `retry:` line and then held idle. Prints one line.

Usage: bench/sse_memory.py [--conns 15000] [--bin target/release/throng]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import time
from pathlib import Path


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def open_stream(port: int, index: int, held: list) -> None:
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind((f"127.0.0.{2 + index % 253}", 0))
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"GET /sse/held-{index % 100} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    while not (await reader.readline()).startswith(b"retry:"):
        pass
    held.append(writer)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=15000)
    ap.add_argument("--bin", default=str(Path(__file__).resolve().parent.parent / "target/release/throng"))
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [args.bin, "serve", "--listen", f"127.0.0.1:{port}", "--stats-interval", "0", "--ping-interval", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1)
        before = rss_kib(server.pid)
        held: list = []
        for start in range(0, args.conns, 500):
            await asyncio.gather(*(open_stream(port, i, held) for i in range(start, min(args.conns, start + 500))))
        await asyncio.sleep(2)
        after = rss_kib(server.pid)
        per = (after - before) * 1024 / len(held)
        print(f"{len(held)} SSE streams held: server RSS {before} -> {after} KiB, {per:.0f} B per stream "
              f"({os.uname().release}, {os.cpu_count()} cores)")
        for w in held:
            w.close()
    finally:
        server.terminate()
        server.wait(timeout=15)


asyncio.run(main())
