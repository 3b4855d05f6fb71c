#!/usr/bin/env python3
"""What one anonymous client can make a throng server hold (security review,
issue 44, finding 4), measured from the server's /proc/PID/status.

Two attacks on one fresh server (the release binary, a free loopback port):

1. chat: one client sends 100 x 60 KB into each of eight chat rooms (a
   WebSocket per room, as fast as it can, reading what the room sends back,
   stopping where the server closes it), waits for the room's seq to settle and
   leaves. Recorded: what each room published (its last_seq), the history
   bytes the server says it holds (/api/stats, where it tells), and VmRSS and
   RssAnon right after and --hold seconds later.
2. replay: a push channel filled with 100 x 60 KB through the HTTP API, then
   --readers readers on each of WebSocket, SSE and long-poll ask for all of it
   (since=0) with a 4 KiB receive buffer and never read. Recorded: VmRSS and
   RssAnon every 0.5 s for --watch seconds (90) while the readers stay, their
   peak, and the first sample
   from which RssAnon stays within 32 MiB of what it was before the readers came
   (how long the replays stay pinned).

  python3 bench/memory_pinning.py [--bin target/release/throng] [--readers 50]
      [--label before] [-- extra serve flags]

Writes bench/results/memory-pinning-STAMP.json (raw, with bench/provenance.py's
commit, machine, command and date); it is never edited after the run.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import struct
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import binary, provenance, raw_path, write_raw  # noqa: E402
from throng_server import DEFAULT_BIN, running  # noqa: E402

MESSAGE = 60 * 1000
MESSAGES = 100
ROOMS = 8


def status(pid: int) -> dict:
    """VmRSS and RssAnon of `pid`, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "RssAnon"):
                out[key] = int(line.split()[1])
    return out


def get_json(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def publish(port: int, channel: str, data: bytes) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/publish/{channel}", data=data, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def upgrade(port: int, path: str, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    return s


def client_frame(payload: bytes) -> bytes:
    """A masked text frame with an all-zero key (legal, and nothing to XOR)."""
    head = b"\x81" + bytes([0x80 | 127]) + struct.pack("!Q", len(payload))
    return head + b"\0\0\0\0" + payload


def drain(s: socket.socket) -> None:
    """Reads and drops what the server sends (a chat room echoes to its sender too)."""
    try:
        while s.recv(1 << 16):
            pass
    except OSError:
        pass


def last_seq(port: int, channel: str) -> int:
    return get_json(port, f"/api/channels/{channel}").get("last_seq") or 0


def chat_attack(pid: int, port: int, hold: float) -> dict:
    """Each room: one connection sends its 100 frames as fast as the socket takes
    them (reading what comes back on a thread), waits until the room's seq stops
    moving (or the server closed it), and leaves."""
    import threading

    frame = client_frame(b"c" * MESSAGE)
    sent = []
    for room in range(ROOMS):
        channel = f"chat:pin{room}"
        s = upgrade(port, f"/ws/{channel}")
        reader = threading.Thread(target=drain, args=(s,), daemon=True)
        reader.start()
        n = 0
        try:
            for _ in range(MESSAGES):
                s.sendall(frame)
                n += 1
        except OSError:
            pass
        sent.append(n)
        seen, still = -1, time.monotonic()
        while time.monotonic() - still < 1.0 and seen < MESSAGES:
            now = last_seq(port, channel)
            if now != seen:
                seen, still = now, time.monotonic()
            time.sleep(0.05)
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        reader.join(timeout=5)
        s.close()
    time.sleep(1.0)
    published = [last_seq(port, f"chat:pin{r}") for r in range(ROOMS)]
    stats = get_json(port, "/api/stats")
    after = status(pid)
    time.sleep(hold)
    return {
        "frames_sent": sent,
        "published": published,
        "history_bytes": stats.get("history_bytes"),
        "after_kib": after,
        f"after_{hold:g}s_kib": status(pid),
    }


def stalled(port: int, transport: str, channel: str) -> socket.socket:
    if transport == "ws":
        return upgrade(port, f"/ws/{channel}?since=0", rcvbuf=4096)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    path = f"/sse/{channel}?since=0" if transport == "sse" else f"/poll/{channel}?since=0"
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


def replay_attack(pid: int, port: int, readers: int, watch: float) -> dict:
    channel = "pinned"
    payload = b"p" * MESSAGE
    for _ in range(MESSAGES):
        publish(port, channel, payload)
    time.sleep(0.5)
    before = status(pid)
    socks = []
    t0 = time.monotonic()
    for transport in ("ws", "sse", "poll"):
        for _ in range(readers):
            socks.append(stalled(port, transport, channel))
    opened = time.monotonic() - t0
    samples = []
    try:
        while time.monotonic() - t0 < watch:
            samples.append({"t": round(time.monotonic() - t0, 2), **status(pid)})
            time.sleep(0.5)
    finally:
        for s in socks:
            s.close()
    peak = max(samples, key=lambda x: x["RssAnon"])
    released = None
    for i, sample in enumerate(samples):
        if all(x["RssAnon"] - before["RssAnon"] < 32 * 1024 for x in samples[i:]):
            released = sample["t"]
            break
    return {
        "readers_per_transport": readers,
        "opened_in_s": round(opened, 2),
        "before_kib": before,
        "peak_kib": {"VmRSS": max(x["VmRSS"] for x in samples), "RssAnon": peak["RssAnon"], "t": peak["t"]},
        "pinned_until_s": released,
        "samples": samples,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("THRONG_BIN", DEFAULT_BIN))
    ap.add_argument("--readers", type=int, default=50)
    ap.add_argument("--hold", type=float, default=5.0)
    ap.add_argument("--watch", type=float, default=90.0)
    ap.add_argument("--label", default="")
    ap.add_argument("flags", nargs="*", help="extra `serve` flags (after --)")
    args = ap.parse_args()
    prov = provenance()
    flags = ["--max-message-size", "64KiB", *args.flags]
    doc: dict = {"bench": "memory_pinning", "label": args.label, **prov,
                 "binary": binary(args.bin), "serve_flags": flags}
    with running(args.bin, *flags) as (server, port):
        doc["idle_kib"] = status(server.pid)
        doc["chat"] = chat_attack(server.pid, port, args.hold)
    with running(args.bin, *flags) as (server, port):
        doc["replay_idle_kib"] = status(server.pid)
        doc["replay"] = replay_attack(server.pid, port, args.readers, args.watch)
    name = "memory-pinning" + (f"-{args.label}" if args.label else "")
    path = write_raw(raw_path(name), doc)
    chat, replay = doc["chat"], doc["replay"]
    print(f"{path}")
    print(f"chat: published {chat['published']}, history_bytes {chat['history_bytes']}, "
          f"RssAnon {chat['after_kib']['RssAnon']} KiB (idle {doc['idle_kib']['RssAnon']})")
    print(f"replay: RssAnon before {replay['before_kib']['RssAnon']} KiB, peak {replay['peak_kib']['RssAnon']} KiB "
          f"at {replay['peak_kib']['t']} s, back within 32 MiB from {replay['pinned_until_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
