#!/usr/bin/env python3
"""Measures the kernel memory of an idle TCP socket over loopback (docs/TUNE.md).

Opens N loopback pairs (a server process accepts, a client process connects; each
registers its sockets in an epoll set and exchanges a handshake-sized request and
answer, as a WebSocket does) and reads /proc/meminfo's Slab, /proc/slabinfo and
/proc/net/sockstat before and while all are held. Then the server sends one small
message on every socket that the client leaves unread (a broadcast not yet read),
and the TCP memory (`mem` in sockstat, in pages, what net.ipv4.tcp_mem limits) is
read again. Prints the kernel bytes per socket (a loopback pair is two sockets).

Usage (as root, for /proc/slabinfo): scripts/socket-cost.py [--pairs 10000] [--rounds 3]
Each of the two processes holds N descriptors: N must stay under `ulimit -n`.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import socket
import statistics
import sys
import time

REQUEST = b"G" * 200  # about an upgrade request
ANSWER = b"H" * 130  # about a 101 answer
MESSAGE = b"M" * 64  # one small broadcast, left unread by the client


def meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, rest = line.split(":", 1)
            out[key] = int(rest.split()[0]) * 1024
    return out


def sockstat() -> dict[str, int]:
    with open("/proc/net/sockstat") as f:
        text = f.read()
    tcp = re.search(r"TCP: inuse (\d+) orphan \d+ tw \d+ alloc (\d+) mem (\d+)", text)
    return {"used": int(re.search(r"sockets: used (\d+)", text).group(1)),
            "tcp_inuse": int(tcp.group(1)), "tcp_mem_pages": int(tcp.group(3))}


def slabinfo() -> dict[str, int]:
    """Bytes of active objects per slab cache (empty without root)."""
    try:
        with open("/proc/slabinfo") as f:
            lines = f.readlines()[2:]
    except OSError:
        return {}
    return {p[0]: int(p[1]) * int(p[3]) for p in (line.split() for line in lines)}


def snapshot() -> dict:
    return {"meminfo": meminfo(), "sockstat": sockstat(), "slab": slabinfo()}


def hold(ready_w: int, cmd_r: int, socks: list[socket.socket], send: bytes, expect: int) -> None:
    """In a child: register every socket in epoll, send `send` on each, read `expect`
    bytes from each (the server answers then), say ready, and hold them. On `w`
    send MESSAGE on every socket and say ready again; on `s` close all and exit."""
    ep = select.epoll()
    by_fd = {s.fileno(): s for s in socks}
    got = dict.fromkeys(by_fd, 0)
    for s in socks:
        s.setblocking(False)
        ep.register(s.fileno(), select.EPOLLIN)
        if send:
            s.send(send)
    pending = len(socks)
    while pending:
        for fd, _ in ep.poll(1.0):
            before = got[fd]
            got[fd] += len(by_fd[fd].recv(4096))
            if before < expect <= got[fd]:
                if not send:
                    by_fd[fd].send(ANSWER)
                pending -= 1
    os.write(ready_w, b"r")
    while (cmd := os.read(cmd_r, 1)) == b"w":
        for s in socks:
            s.send(MESSAGE)
        os.write(ready_w, b"r")
    for s in socks:
        s.close()
    os._exit(0)


def one_round(pairs: int) -> dict:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    port = listener.getsockname()[1]
    ready_r, ready_w = os.pipe()
    server_cmd_r, server_cmd_w = os.pipe()
    client_cmd_r, client_cmd_w = os.pipe()
    time.sleep(1.0)
    before = snapshot()

    server = os.fork()
    if server == 0:
        accepted = [listener.accept()[0] for _ in range(pairs)]
        listener.close()
        hold(ready_w, server_cmd_r, accepted, b"", len(REQUEST))
    client = os.fork()
    if client == 0:
        listener.close()
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(pairs)]
        hold(ready_w, client_cmd_r, conns, REQUEST, len(ANSWER))
    listener.close()
    os.read(ready_r, 1)
    os.read(ready_r, 1)
    time.sleep(1.0)
    held = snapshot()
    os.write(server_cmd_w, b"w")
    os.read(ready_r, 1)
    time.sleep(0.5)
    queued = snapshot()
    os.write(server_cmd_w, b"s")
    os.write(client_cmd_w, b"s")
    for pid in (server, client):
        os.waitpid(pid, 0)
    for fd in (ready_r, ready_w, server_cmd_r, server_cmd_w, client_cmd_r, client_cmd_w):
        os.close(fd)
    return {"before": before, "held": held, "queued": queued}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sockets = 2 * args.pairs
    per_socket, queued_pages = [], []
    for i in range(args.rounds):
        r = one_round(args.pairs)
        b, h, q = r["before"], r["held"], r["queued"]
        slab = h["meminfo"]["Slab"] - b["meminfo"]["Slab"]
        unreclaim = h["meminfo"]["SUnreclaim"] - b["meminfo"]["SUnreclaim"]
        objs = sum(h["slab"].get(k, 0) - v for k, v in b["slab"].items())
        idle_pages = h["sockstat"]["tcp_mem_pages"] - b["sockstat"]["tcp_mem_pages"]
        busy_pages = q["sockstat"]["tcp_mem_pages"] - b["sockstat"]["tcp_mem_pages"]
        per_socket.append(slab / sockets)
        queued_pages.append(busy_pages / args.pairs)
        print(f"round {i + 1}: {args.pairs} pairs, sockstat 'sockets: used' "
              f"{b['sockstat']['used']} -> {h['sockstat']['used']}: Slab +{slab // 1024} KiB = "
              f"{slab / sockets:.0f} B/socket (SUnreclaim {unreclaim / sockets:.0f}); active slab "
              f"objects {objs / sockets:.0f} B/socket; TCP mem +{idle_pages} pages idle, "
              f"+{busy_pages} with one unread message on each client socket "
              f"({busy_pages / args.pairs:.2f} pages per socket holding data)")
        if i == args.rounds - 1 and h["slab"]:
            grew = sorted(((h["slab"][k] - v, k) for k, v in b["slab"].items() if k in h["slab"]),
                          reverse=True)[:8]
            print("  caches that grew (bytes of active objects per socket): " +
                  ", ".join(f"{k} {d / sockets:.0f}" for d, k in grew if d > 0))
    print(f"kernel memory per idle loopback TCP socket (Slab, median of {args.rounds}): "
          f"{statistics.median(per_socket):.0f} B; per loopback pair: "
          f"{2 * statistics.median(per_socket):.0f} B; TCP memory per socket holding an "
          f"unread message: {statistics.median(queued_pages):.2f} pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
