#!/usr/bin/env python3
"""Abuse and faults at scale: the big versions of tests/python/test_abuse.py, with
figures. Each scenario starts its own throng on a free loopback port (stopped by its
pid), abuses it, and prints what it measured; client sockets are spread over the
source addresses 127.0.0.2-127.0.0.254.

  slowloris  N sockets send half a WebSocket upgrade and stall. Meanwhile a normal
             client connects, subscribes and gets a published message every 0.25 s:
             its connect time (TCP + 101) and round trip, against the same without
             load. Server RSS and fds before, while held, after; when the stalled
             sockets were dropped (seconds after their request began) and the
             server's timeout counter.
  slow       S subscribers stop reading (4 KiB receive buffers) while 64 KiB
             messages are published at 10/s for T seconds (--history-size 0, so the
             RSS is the queues'); R normal readers on the same channel must get
             every one. RSS before / peak / after against --max-queue x S, when the
             stalled ones were cut (1008).
  churn      C connections opened and dropped as fast as one client can (FIN, RST,
             half a request, a whole upgrade): the rate, then the server's open
             connections and fds back to the baseline.
  floods     one connection each: a ping flood in one write (every pong back), a
             64 KiB message in 1-byte fragments, max-size frames back to back, and
             garbage instead of HTTP on many connections.

Usage (the venv has nothing this needs beyond the standard library and the
tests' rawws.py):
  tests/python/.venv/bin/python bench/abuse.py [--bin target/release/throng]
      [--only slowloris,slow,churn,floods] [--slowloris 10000] [--handshake-timeout 10]
      [--stalled 100] [--readers 10] [--seconds 30] [--max-queue 1MiB]
      [--churn 20000] [--json FILE]

Keeps the run in bench/results/abuse-STAMP.json (UTC stamp), or in --json FILE: the
provenance (bench/provenance.py: commit, dirty tree, machine, command line), the
binary, the settings and every scenario's figures; what it printed goes beside it as
.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import selectors
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

import provenance
import throng_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
from rawws import (  # noqa: E402  (the tests' raw WebSocket / HTTP client)
    OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, Closed, RawConn, encode_frame, http_request,
    parse_close, publish_ok, upgrade_request,
)
from rawws import ws_connect as raw_connect  # noqa: E402

SOURCES = [f"127.0.0.{i}" for i in range(2, 255)]


def source_socket(i: int, timeout: float = 10.0) -> socket.socket:
    s = socket.socket()
    s.bind((SOURCES[i % len(SOURCES)], 0))
    s.settimeout(timeout)
    return s


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def stats(port: int) -> dict:
    return http_request(port, "GET", "/api/stats", timeout=10).json()


def metric(port: int, series: str) -> float:
    for line in http_request(port, "GET", "/metrics", timeout=10).body.decode().splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    raise RuntimeError(f"no {series}")


def subscribers(port: int, channel: str) -> int:
    return http_request(port, "GET", f"/api/channels/{channel}", timeout=10).json()["subscribers"]


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def settle(pid: int, port: int, seconds: float = 1.0) -> tuple[dict, int]:
    """Open connections and the fewest fds over `seconds` (probe sockets go away)."""
    low = fds(pid)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        low = min(low, fds(pid))
        time.sleep(0.05)
    return stats(port)["connections"], low


def back_to(pid: int, port: int, conns: dict, fd0: int, timeout: float = 30) -> tuple[float, dict, int]:
    """Waits until the server's connections and fds are back to the baseline;
    returns (seconds it took, connections, fds)."""
    t0 = time.monotonic()
    while True:
        c, f = stats(port)["connections"], fds(pid)
        if (c == conns and f <= fd0) or time.monotonic() - t0 > timeout:
            return time.monotonic() - t0, c, f
        time.sleep(0.1)


_probe = iter(range(1 << 30))


def probe(port: int) -> tuple[float, float]:
    """A normal client: (connect time = TCP connect + 101, round trip = publish
    until the subscriber has the message)."""
    n = next(_probe)
    channel = f"probe-{n}"
    t0 = time.perf_counter()
    # since=0: a message published before the subscription is registered is replayed.
    c = raw_connect(port, path=f"/ws/{channel}?since=0", timeout=10)
    t1 = time.perf_counter()
    try:
        publish_ok(port, channel, f"probe {n}", timeout=10)
        got = c.read_message(timeout=10)
        t2 = time.perf_counter()
        if got != (OP_TEXT, f"probe {n}".encode()):
            raise RuntimeError(f"probe got {got!r}")
    finally:
        c.close()
    return t1 - t0, t2 - t1


def healthy(port: int) -> bool:
    try:
        ok = http_request(port, "GET", "/healthz", timeout=10).status == 200
        probe(port)
        return ok
    except Exception as e:  # reported as unhealthy
        print(f"  health check failed: {e!r}")
        return False


# ---------------------------------------------------------------- slowloris


def slowloris(args) -> dict:
    n, timeout = args.slowloris, args.handshake_timeout
    flags = ("--handshake-timeout", f"{timeout:g}s")
    print(f"\n## slowloris: {n:,} half upgrades, --handshake-timeout {timeout:g}s")
    with throng_server.running(args.bin, *flags) as (server, port):
        pid = server.pid
        quiet = [probe(port) for _ in range(20)]
        conns0, fd0 = settle(pid, port)
        rss0 = rss_kib(pid)
        timeouts0 = metric(port, 'throng_handshake_failures_total{reason="timeout"}')
        req, _ = upgrade_request(path="/ws/lobby")
        half = req[: req.index(b"Sec-WebSocket-Key")]
        socks: list[tuple[socket.socket, float]] = []
        t_open = time.monotonic()
        for i in range(n):
            s = source_socket(i)
            s.connect(("127.0.0.1", port))
            s.sendall(half)
            s.setblocking(False)
            socks.append((s, time.monotonic()))
        opened_in = time.monotonic() - t_open
        while fds(pid) < fd0 + n and time.monotonic() - t_open < timeout / 2:
            time.sleep(0.05)
        held = fds(pid) - fd0
        rss_held = rss_kib(pid)
        # Normal clients while the stalled sockets are held (until the first drop).
        sel = selectors.DefaultSelector()
        for s, t in socks:
            sel.register(s, selectors.EVENT_READ, t)
        loaded: list[tuple[float, float]] = []
        first_drop = t_open + timeout
        while time.monotonic() < socks[0][1] + timeout * 0.9:
            loaded.append(probe(port))
            if sel.select(0):
                break
            time.sleep(0.25)
        # The drops.
        closed: list[float] = []
        answered = 0
        deadline = time.monotonic() + timeout + 30
        while len(closed) < n and time.monotonic() < deadline:
            for key, _ in sel.select(1):
                try:
                    data = key.fileobj.recv(4096)
                except ConnectionResetError:
                    data = b""
                answered += bool(data)
                closed.append(time.monotonic() - key.data)
                if len(closed) == 1:
                    first_drop = time.monotonic()
                sel.unregister(key.fileobj)
        drop_window = time.monotonic() - first_drop
        sel.close()
        for s, _ in socks:
            s.close()
        timeouts = metric(port, 'throng_handshake_failures_total{reason="timeout"}') - timeouts0
        back_in, conns1, fd1 = back_to(pid, port, conns0, fd0)
        rss_after = rss_kib(pid)
        ok = healthy(port)
    qc, qr = [c for c, _ in quiet], [r for _, r in quiet]
    lc, lr = [c for c, _ in loaded], [r for _, r in loaded]
    print(f"opened {n:,} half upgrades in {opened_in:.2f}s from {min(n, len(SOURCES))} source addresses; "
          f"server holds {held:,} of them")
    print(f"normal client without load ({len(quiet)}): connect median {ms(statistics.median(qc))}, "
          f"max {ms(max(qc))}; publish->receive median {ms(statistics.median(qr))}")
    print(f"normal client while {n:,} are held ({len(loaded)}): connect median {ms(statistics.median(lc))}, "
          f"p90 {ms(pct(lc, 90))}, max {ms(max(lc))}; publish->receive median {ms(statistics.median(lr))}, "
          f"max {ms(max(lr))}")
    print(f"RSS: before {rss0:,} KiB, while held {rss_held:,} KiB "
          f"({(rss_held - rss0) * 1024 / max(1, n):.0f} B per stalled socket), after {rss_after:,} KiB")
    print(f"dropped {len(closed):,} of {n:,} ({answered} got bytes first), {min(closed):.2f}s / "
          f"{statistics.median(closed):.2f}s / {max(closed):.2f}s (min/median/max) after their request began; "
          f"all within {drop_window:.2f}s; timeout counter +{timeouts:g}")
    print(f"after: connections {conns1} (before {conns0}), fds {fd1} (before {fd0}) in {back_in:.2f}s; "
          f"healthy: {ok}")
    return {
        "sockets": n, "handshake_timeout_s": timeout, "opened_in_s": opened_in, "held": held,
        "connect_quiet_ms": {"median": statistics.median(qc) * 1e3, "max": max(qc) * 1e3},
        "connect_loaded_ms": {"median": statistics.median(lc) * 1e3, "p90": pct(lc, 90) * 1e3, "max": max(lc) * 1e3,
                              "probes": len(lc)},
        "roundtrip_loaded_ms": {"median": statistics.median(lr) * 1e3, "max": max(lr) * 1e3},
        "rss_kib": {"before": rss0, "held": rss_held, "after": rss_after},
        "dropped": len(closed), "answered": answered,
        "drop_after_s": {"min": min(closed), "median": statistics.median(closed), "max": max(closed)},
        "drop_window_s": drop_window, "timeout_counter": timeouts,
        "after": {"connections": conns1, "fds": fd1, "fds_before": fd0, "settled_in_s": back_in}, "healthy": ok,
    }


# ---------------------------------------------------------------- slow consumers

MSG = 64 * 1024


def numbered(i: int) -> str:
    head = f"{i:06d}|"
    return head + "x" * (MSG - len(head))


def parse_size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "b": 1}
    t = text.strip().lower()
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * m)
    return int(t)


def slow_consumers(args) -> dict:
    s_count, r_count, seconds = args.stalled, args.readers, args.seconds
    max_queue = parse_size(args.max_queue)
    print(f"\n## slow consumers: {s_count} stalled + {r_count} reading subscribers, 64 KiB x 10/s for {seconds}s, "
          f"--max-queue {args.max_queue}")
    channel = "firehose"
    # No history: the RSS is then the queues' (100 kept 64 KiB messages would add 6.4 MiB).
    flags = ("--max-queue", str(max_queue), "--history-size", "0")
    with throng_server.running(args.bin, *flags) as (server, port):
        pid = server.pid
        conns0, fd0 = settle(pid, port)
        rss0 = rss_kib(pid)
        stalled = []
        for i in range(s_count):
            s = source_socket(i)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            c = RawConn.__new__(RawConn)
            c.sock, c.buf, c.timeout = s, b"", 10
            req, _ = upgrade_request(path=f"/ws/{channel}", host=f"127.0.0.1:{port}")
            c.send(req)
            assert c.read_http_response(timeout=10).status == 101
            stalled.append(c)
        readers = [raw_connect(port, path=f"/ws/{channel}", timeout=30) for _ in range(r_count)]
        while subscribers(port, channel) != s_count + r_count:
            time.sleep(0.05)
        rss_subscribed = rss_kib(pid)
        got = [0] * r_count
        errors: list[str] = []

        def read(k: int) -> None:
            try:
                while True:
                    op, data = readers[k].read_message(timeout=30)
                    if op == "close" or data == b"end":
                        if op == "close":
                            errors.append(f"reader {k} closed {data}")
                        return
                    n = int(data[:6])
                    if n != got[k] + 1:
                        errors.append(f"reader {k}: {n} after {got[k]}")
                        return
                    got[k] = n
            except Exception as e:
                errors.append(f"reader {k}: {e!r}")

        threads = [threading.Thread(target=read, args=(k,), daemon=True) for k in range(r_count)]
        for t in threads:
            t.start()
        samples: list[tuple[float, int, int]] = []  # (t, rss, subscribers)
        cut: dict[str, float] = {}
        drained: list = [None] * s_count
        drains: list[threading.Thread] = []

        def drain(k: int) -> None:
            c, last, code = stalled[k], 0, None
            try:
                while True:
                    _f, _r, op, data = c.read_frame(timeout=15)
                    if op == OP_CLOSE:
                        code = parse_close(data)
                        break
                    if op in (OP_TEXT, OP_BINARY):
                        last = int(data[:6])
            except (Closed, TimeoutError, OSError) as e:
                code = repr(e)
            drained[k] = (last, code)

        t0 = time.monotonic()
        total = int(seconds * 10)
        for i in range(1, total + 1):
            publish_ok(port, channel, numbered(i), timeout=10)
            subs = subscribers(port, channel)
            now = time.monotonic() - t0
            samples.append((now, rss_kib(pid), subs))
            if subs < s_count + r_count and "first" not in cut:
                cut["first"], cut["first_msg"] = now, i
            if subs == r_count and "last" not in cut:
                cut["last"], cut["last_msg"] = now, i
                for k in range(s_count):
                    t = threading.Thread(target=drain, args=(k,), daemon=True)
                    t.start()
                    drains.append(t)
            time.sleep(max(0.0, t0 + i * 0.1 - time.monotonic()))
        publish_ok(port, channel, "end")
        for t in threads:
            t.join(60)
        for t in drains:
            t.join(60)
        slow_total = metric(port, "throng_slow_consumer_disconnects_total")
        rss_end = rss_kib(pid)
        for c in stalled + readers:
            c.close()
        back_in, conns1, fd1 = back_to(pid, port, conns0, fd0)
        rss_after = rss_kib(pid)
        ok = healthy(port)
    peak = max(r for _, r, _ in samples)
    codes: dict[str, int] = {}
    for d in drained:
        key = str(d[1]) if d else "still reading"
        codes[key] = codes.get(key, 0) + 1
    stalled_last = [d[0] for d in drained if d]
    bound = rss_subscribed + s_count * max_queue // 1024
    print(f"RSS: before {rss0:,} KiB, subscribed {rss_subscribed:,} KiB, peak {peak:,} KiB, at the end {rss_end:,} KiB, "
          f"after {rss_after:,} KiB; --max-queue x stalled = {s_count * max_queue // 1024:,} KiB "
          f"(bound {bound:,} KiB)")
    if "first" in cut:
        print(f"stalled readers cut: first {cut['first']:.1f}s (message {cut['first_msg']}), "
              f"last {cut.get('last', float('nan')):.1f}s (message {cut.get('last_msg')}); "
              f"each got up to message {min(stalled_last, default=0)}-{max(stalled_last, default=0)}; "
              f"close: {codes}; slow-consumer counter {slow_total:g}")
    else:
        print("stalled readers were NOT cut off")
    print(f"normal readers: {sorted(set(got))} of {total} messages each, errors: {errors[:3] or 'none'}")
    print("RSS over time (s: KiB): " + ", ".join(f"{t:.1f}: {r:,}" for t, r, _ in samples[:: max(1, len(samples) // 10)]))
    print(f"after: connections {conns1} (before {conns0}), fds {fd1} (before {fd0}) in {back_in:.2f}s; healthy: {ok}")
    return {
        "stalled": s_count, "readers": r_count, "seconds": seconds, "messages": total, "max_queue": max_queue,
        "rss_kib": {"before": rss0, "subscribed": rss_subscribed, "peak": peak, "end": rss_end, "after": rss_after,
                    "bound": bound},
        "cut": cut, "close_codes": codes, "stalled_got": [min(stalled_last, default=0), max(stalled_last, default=0)],
        "slow_consumer_counter": slow_total, "readers_got": sorted(set(got)), "errors": errors,
        "after": {"connections": conns1, "fds": fd1, "fds_before": fd0, "settled_in_s": back_in}, "healthy": ok,
    }


# ---------------------------------------------------------------- churn


def churn(args) -> dict:
    n = args.churn
    print(f"\n## churn: {n:,} connections opened and dropped")
    with throng_server.running(args.bin) as (server, port):
        pid = server.pid
        conns0, fd0 = settle(pid, port)
        rss0 = rss_kib(pid)
        accepted0 = stats(port)["accepted"]
        upgrade, _ = upgrade_request(path="/ws/churn")
        half = upgrade[: upgrade.index(b"Sec-WebSocket-Key")]
        t0 = time.monotonic()
        for i in range(n):
            s = source_socket(i)
            try:
                s.connect(("127.0.0.1", port))
                kind = i % 4
                if kind == 1:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                elif kind == 2:
                    s.sendall(half)
                elif kind == 3:
                    s.sendall(upgrade)
                    if i % 8 == 7:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            finally:
                s.close()
        elapsed = time.monotonic() - t0
        peak_fds = fds(pid)
        back_in, conns1, fd1 = back_to(pid, port, conns0, fd0)
        accepted = stats(port)["accepted"] - accepted0
        rss_after = rss_kib(pid)
        ok = healthy(port)
    print(f"{n:,} connect+close in {elapsed:.2f}s ({n / elapsed:,.0f}/s) from {len(SOURCES)} source addresses "
          f"(FIN, RST, half a request, a whole upgrade); server accepted {accepted:,}")
    print(f"server fds right after: {peak_fds} (before {fd0}); back to {fd1} and connections {conns1} in {back_in:.2f}s; "
          f"RSS {rss0:,} -> {rss_after:,} KiB; healthy: {ok}")
    return {"connections": n, "seconds": elapsed, "rate": n / elapsed, "accepted": accepted, "fds_right_after": peak_fds,
            "rss_kib": {"before": rss0, "after": rss_after},
            "after": {"connections": conns1, "fds": fd1, "fds_before": fd0, "settled_in_s": back_in}, "healthy": ok}


# ---------------------------------------------------------------- floods


def floods(args) -> dict:
    print("\n## floods (one connection each)")
    out: dict = {}
    with throng_server.running(args.bin, "--max-queue", "64MiB") as (server, port):
        pid = server.pid
        conns0, fd0 = settle(pid, port)
        rss0 = rss_kib(pid)
        # Ping flood: 100,000 pings in one write; every pong back, in order.
        n = 100_000
        c = raw_connect(port, "/echo", timeout=30)
        flood = b"".join(encode_frame(OP_PING, struct.pack("!I", i)) for i in range(n))
        t0 = time.perf_counter()
        threading.Thread(target=c.send, args=(flood,), daemon=True).start()
        pongs = 0
        for i in range(n):
            _f, _r, op, data = c.read_frame(timeout=30)
            if op != OP_PONG or struct.unpack("!I", data)[0] != i:
                break
            pongs += 1
        t_ping = time.perf_counter() - t0
        c.close()
        print(f"ping flood: {n:,} pings ({len(flood):,} B) in one write: {pongs:,} pongs in order in {ms(t_ping)} "
              f"({pongs / t_ping:,.0f}/s, the client's parsing included)")
        out["ping_flood"] = {"pings": n, "pongs": pongs, "seconds": t_ping}
        # 1-byte fragments: a 64 KiB message as 65,536 frames.
        msg = random.Random(1).randbytes(64 * 1024)
        parts = [encode_frame(OP_BINARY if i == 0 else OP_CONT, msg[i:i + 1], fin=i == len(msg) - 1,
                              mask_key=b"\x01\x02\x03\x04") for i in range(len(msg))]
        stream = b"".join(parts)
        c = raw_connect(port, "/echo", timeout=30)
        t0 = time.perf_counter()
        threading.Thread(target=c.send, args=(stream,), daemon=True).start()
        op, data = c.read_message(timeout=30)
        t_frag = time.perf_counter() - t0
        c.close()
        print(f"1-byte fragments: a 64 KiB message in {len(parts):,} frames ({len(stream):,} B): "
              f"{'reassembled' if data == msg else 'WRONG'} and echoed in {ms(t_frag)}")
        out["fragments"] = {"frames": len(parts), "ok": data == msg, "seconds": t_frag}
        # Max-size frames back to back: 1,000 x 64 KiB in one write.
        n = 1000
        blocks = [random.Random(k).randbytes(64 * 1024) for k in range(4)]
        stream = b"".join(encode_frame(OP_BINARY, blocks[i % 4]) for i in range(n))
        c = raw_connect(port, "/echo", timeout=30)
        t0 = time.perf_counter()
        threading.Thread(target=c.send, args=(stream,), daemon=True).start()
        good = 0
        for i in range(n):
            op, data = c.read_message(timeout=30)
            if data != blocks[i % 4]:
                break
            good += 1
        t_big = time.perf_counter() - t0
        rss_big = rss_kib(pid)
        c.close()
        print(f"max-size frames: {n:,} x 64 KiB ({len(stream) / 2**20:.1f} MiB) in one write: {good:,} echoed intact "
              f"in {ms(t_big)} ({len(stream) / 2**20 / t_big:.0f} MiB/s each way); server RSS {rss_big:,} KiB "
              f"(--max-queue 64MiB here)")
        out["max_frames"] = {"frames": n, "intact": good, "seconds": t_big, "rss_kib": rss_big}
        # Garbage instead of HTTP, many connections at once.
        n = 5000
        garbage = [random.Random(i).randbytes(200) for i in range(16)]
        t0 = time.perf_counter()
        socks = []
        for i in range(n):
            s = source_socket(i)
            s.connect(("127.0.0.1", port))
            s.sendall(garbage[i % 16])
            socks.append(s)
        status: dict[str, int] = {}
        for s in socks:
            data = b""
            try:
                while chunk := s.recv(4096):
                    data += chunk
            except ConnectionResetError:
                pass
            key = data[:12].decode("latin-1") or "nothing"
            status[key] = status.get(key, 0) + 1
            s.close()
        t_garbage = time.perf_counter() - t0
        print(f"garbage: {n:,} connections sending 200 random bytes: {status} in {t_garbage:.2f}s")
        out["garbage"] = {"connections": n, "answers": status, "seconds": t_garbage}
        back_in, conns1, fd1 = back_to(pid, port, conns0, fd0)
        rss_after = rss_kib(pid)
        ok = healthy(port)
    print(f"after: connections {conns1} (before {conns0}), fds {fd1} (before {fd0}) in {back_in:.2f}s; "
          f"RSS {rss0:,} -> {rss_after:,} KiB; healthy: {ok}")
    out["after"] = {"connections": conns1, "fds": fd1, "fds_before": fd0, "settled_in_s": back_in,
                    "rss_kib": {"before": rss0, "after": rss_after}}
    out["healthy"] = ok
    return out


class Tee:
    """stdout that keeps a copy of what was printed (for the run's .md)."""

    def __init__(self, out) -> None:
        self.out, self.lines = out, []

    def write(self, text: str) -> int:
        self.lines.append(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("THRONG_BIN") or throng_server.DEFAULT_BIN)
    ap.add_argument("--only", default="slowloris,slow,churn,floods")
    ap.add_argument("--slowloris", type=int, default=10_000)
    ap.add_argument("--handshake-timeout", type=float, default=10.0)
    ap.add_argument("--stalled", type=int, default=100)
    ap.add_argument("--readers", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--max-queue", default="1MiB")
    ap.add_argument("--churn", type=int, default=20_000)
    ap.add_argument("--json", help="write the figures to this file (default bench/results/abuse-STAMP.json, UTC)")
    args = ap.parse_args()
    prov = provenance.provenance()   # taken as the run starts
    out_path = Path(args.json) if args.json else provenance.raw_path("abuse")
    printed = Tee(sys.stdout)
    sys.stdout = printed
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    machine = f"{os.cpu_count()} cores ({cpu}), kernel {platform.release()}, open-files limit {hard}"
    print(f"# throng abuse bench: {args.bin}\n{machine}; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    scenarios = {"slowloris": slowloris, "slow": slow_consumers, "churn": churn, "floods": floods}
    results = {"provenance": prov, "machine": machine, "binary": args.bin, "binary_info": provenance.binary(args.bin),
               "settings": vars(args), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for name in args.only.split(","):
        results[name] = scenarios[name](args)
    sys.stdout = printed.out
    md = (provenance.md_header("abuse and faults (bench/abuse.py)", prov) + "\n"
          + "\n".join("    " + line if line else "" for line in "".join(printed.lines).splitlines()))
    out_path = provenance.write_raw(out_path, results, md if out_path.suffix == ".json" else None)
    print(f"wrote {out_path}", file=sys.stderr)
    healthy_all = all(results[n].get("healthy") for n in args.only.split(","))
    sys.exit(0 if healthy_all else 1)


if __name__ == "__main__":
    main()
