#!/usr/bin/env python3
"""One port past one process's open-files ceiling: `throng serve --workers N` (a
master and N worker processes on one port, SO_REUSEPORT, joined through Redis)
holding more idle WebSockets than one process may open.

Starts redis-server and then `throng serve --listen 127.0.0.1:PORT --workers N
--threads 1 --broker redis://...` on free loopback ports, keeps the master's
"at most ~X connections each, ~Y in all" line, runs

  throng bench idle --url ws://127.0.0.1:PORT/ws/idle --conns C --procs 4
      --rate R --duration D --source-ips 127.0.0.2-127.0.0.254 --json

(its JSON: opened, failed, dropped, the time to open them all), counts each
worker's open descriptors while the connections are held, then sends the master
SIGTERM and records when each worker and the master were gone and what the master
logged. Everything started here is stopped by its pid; the whole run is bounded
(the bench by --connect-timeout and --duration plus a margin, the drain by
--drain-timeout plus a margin).

Keeps the run in bench/results/workers-STAMP.json (UTC stamp; the provenance:
commit, dirty tree, machine, command line; the binary, redis-server's version,
the settings, the master's log and every figure) and workers-STAMP.md.

With --pusher-presence-channels K the connections speak Pusher Channels instead:
the server gets --pusher-app 1:bench-key:bench-secret and the bench runs `idle
--protocol pusher --channels K --channel-prefix presence-w-`, so every connection
is a presence member (a user of its own, u<index>) of one of K presence channels,
its join written to Redis by whichever worker holds it. While the connections are
held the run asks the signed Pusher API (GET /apps/1/channels?filter_by_prefix=
presence-&info=user_count, through any worker) every 2 s, and keeps the most users
it counted across the cluster (all of them, in a good run), the workers' resident
memory at that moment (against before the bench: the cost of a connection with its
presence subscription) and Redis's used_memory.

With --tls the server gets a fresh self-signed certificate (--tls-cert, --tls-key)
and the bench connects with wss:// (--ca): every connection is a TLS connection.
In either mode, once the workers hold every connection, their resident memory is
sampled against before the bench: bytes per held connection.

Usage: bench/workers.py [--tls] [--workers 4] [--conns 40000] [--procs 4] [--rate 4000]
                        [--duration 5s] [--pusher-presence-channels 0]
                        [--bin target/release/throng] [--out bench/results]
Needs: redis-server (scripts/test.sh installs it); python3, standard library only.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402  (bench/provenance.py)
from common import connectable, free_port, wait_until  # noqa: E402  (bench/common.py)
import throng_server  # noqa: E402  (bench/throng_server.py: DEFAULT_BIN)

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return sorted(out)


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def open_files_limit(pid: int) -> dict | None:
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return {"soft": int(soft), "hard": int(hard)}
    except (OSError, ValueError):
        pass
    return None


class LogReader(threading.Thread):
    """Keeps every line a process writes (stdout and stderr merged), colour codes taken out."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.lines: list[tuple[float, str]] = []
        self.start()

    def run(self) -> None:
        for raw in self.stream:
            self.lines.append((time.monotonic(), ANSI.sub("", raw.decode(errors="replace")).rstrip()))

    def find(self, needle: str) -> str | None:
        return next((line for _, line in list(self.lines) if needle in line), None)


PUSHER_APP_ID, PUSHER_KEY, PUSHER_SECRET = "1", "bench-key", "bench-secret"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def redis_used_memory(port: int) -> int | None:
    """used_memory from INFO memory, over a plain socket (RESP)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"INFO memory\r\n")
            data = b""
            while b"used_memory:" not in data or not data.endswith(b"\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        m = re.search(rb"used_memory:(\d+)", data)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def pusher_users(port: int) -> int | None:
    """The users of every presence- channel, across the cluster, as the signed
    Pusher API counts them (GET /apps/ID/channels, info=user_count)."""
    path = f"/apps/{PUSHER_APP_ID}/channels"
    params = {"auth_key": PUSHER_KEY, "auth_timestamp": str(int(time.time())), "auth_version": "1.0",
              "filter_by_prefix": "presence-", "info": "user_count"}
    query = "&".join(f"{k}={params[k]}" for k in sorted(params))
    sig = hmac.new(PUSHER_SECRET.encode(), f"GET\n{path}\n{query}".encode(), hashlib.sha256).hexdigest()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(f"GET {path}?{query}&auth_signature={sig} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                      .encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            return None
        channels = json.loads(body)["channels"]
        return sum(c.get("user_count", 0) for c in channels.values())
    except (OSError, ValueError, KeyError):
        return None


def seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", text)
    if not m:
        raise SystemExit(f"not a duration: {text}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m.group(2)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--conns", type=int, default=40000)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rate", type=int, default=4000)
    ap.add_argument("--duration", default="5s")
    ap.add_argument("--connect-timeout", default="10s")
    ap.add_argument("--drain-timeout", default="10s")
    ap.add_argument("--pusher-presence-channels", type=int, default=0,
                    help="speak Pusher: every connection a member of one of this many presence channels")
    ap.add_argument("--tls", action="store_true", help="serve and connect with TLS (wss://)")
    ap.add_argument("--bin", default=throng_server.DEFAULT_BIN)
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR), help="where the raw JSON and .md go")
    args = ap.parse_args()
    if not shutil.which("redis-server"):
        raise SystemExit("redis-server is not installed (scripts/test.sh installs it)")
    prov = provenance.provenance()
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    printed: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        printed.append(line)

    redis_dir = tempfile.TemporaryDirectory(prefix="throng-workers-redis-")
    rport = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", redis_dir.name],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    master = bench = None
    try:
        wait_until(lambda: connectable(rport), 10, "redis-server listening")
        port = free_port()
        serve_cmd = [args.bin, "serve", "--listen", f"127.0.0.1:{port}", "--workers", str(args.workers),
                     "--threads", "1", "--broker", f"redis://127.0.0.1:{rport}", "--stats-interval", "0",
                     "--drain-timeout", args.drain_timeout]
        pusher_app = f"{PUSHER_APP_ID}:{PUSHER_KEY}:{PUSHER_SECRET}"
        presence = args.pusher_presence_channels > 0
        if presence:
            serve_cmd += ["--pusher-app", pusher_app]
        if args.tls:
            cert, key = Path(redis_dir.name) / "cert.pem", Path(redis_dir.name) / "key.pem"
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                            "-nodes", "-days", "2", "-subj", "/CN=localhost",
                            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                            "-addext", "basicConstraints=critical,CA:FALSE",
                            "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
            serve_cmd += ["--tls-cert", str(cert), "--tls-key", str(key)]
        scheme = "wss" if args.tls else "ws"
        master = subprocess.Popen(serve_cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
        log = LogReader(master.stdout)
        wait_until(lambda: len(children(master.pid)) == args.workers and connectable(port), 20,
                   f"{args.workers} workers and the port answering")
        workers = children(master.pid)
        # Every worker listening: each logs its "open-files limit" line once its listeners are up.
        wait_until(lambda: sum("open-files limit" in line for _, line in list(log.lines)) >= args.workers, 20,
                   "every worker's open-files line")
        plan = log.find("at most ~")
        say(f"master pid {master.pid}, workers {workers}; redis-server on port {rport} ({redis_version})")
        say(f"master: {plan.split(' INFO ', 1)[-1].strip() if plan else '(no plan line)'}")
        limits = open_files_limit(workers[0])
        say(f"a worker's open-files limit: {limits}")

        if presence:
            target = ["--protocol", "pusher", "--pusher-app", pusher_app, "--url", f"{scheme}://127.0.0.1:{port}/",
                      "--channels", str(args.pusher_presence_channels), "--channel-prefix", "presence-w-"]
        else:
            target = ["--url", f"{scheme}://127.0.0.1:{port}/ws/idle"]
        if args.tls:
            target += ["--ca", str(cert)]
        time.sleep(1)
        rss_before = {w: rss_kib(w) for w in workers}
        redis_before = redis_used_memory(rport)
        bench_cmd = [args.bin, "bench", "idle", *target, "--conns",
                     str(args.conns), "--procs", str(args.procs), "--rate", str(args.rate), "--duration",
                     args.duration, "--source-ips", "127.0.0.2-127.0.0.254", "--connect-timeout",
                     args.connect_timeout, "--interval", "0", "--json", "--allow-failures"]
        bound = args.conns / max(args.rate, 1) + seconds(args.connect_timeout) + seconds(args.duration) + 60
        started = time.monotonic()
        bench = subprocess.Popen(bench_cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        # While it runs: each worker's open descriptors, the most seen at once.
        peak: dict[int, int] = {w: 0 for w in workers}
        peak_total = 0
        held: dict | None = None
        last_ask = 0.0
        fds_before = sum(open_fds(w) or 0 for w in workers)
        all_held: dict | None = None
        while bench.poll() is None:
            if all_held is None and sum(open_fds(w) or 0 for w in workers) - fds_before >= args.conns:
                # Every connection is held: give the last handshakes a moment, then sample.
                time.sleep(1.0)
                rss = {w: rss_kib(w) for w in workers}
                all_held = {"at_secs": time.monotonic() - started,
                            "worker_rss_kib": {str(w): rss[w] for w in workers},
                            "worker_rss_kib_before": {str(w): rss_before[w] for w in workers},
                            "rss_growth_bytes_per_conn": (sum(rss.values()) - sum(rss_before.values()))
                            * 1024 / args.conns}
            if presence and time.monotonic() - last_ask > 2:
                last_ask = time.monotonic()
                users = pusher_users(port)
                if held and users == held["users_seen_by_api"]:
                    # Still all there: the latest moment of the hold, after the ramp's churn.
                    rss = {w: rss_kib(w) for w in workers}
                    held["late"] = {"at_secs": time.monotonic() - started,
                                    "worker_rss_kib": {str(w): rss[w] for w in workers},
                                    "rss_growth_bytes_per_conn": (sum(rss.values()) - sum(rss_before.values()))
                                    * 1024 / users,
                                    "redis_used_memory": redis_used_memory(rport)}
                elif users is not None and users > (held or {}).get("users_seen_by_api", 0):
                    rss = {w: rss_kib(w) for w in workers}
                    held = {"users_seen_by_api": users, "at_secs": time.monotonic() - started,
                            "worker_rss_kib": {str(w): rss[w] for w in workers},
                            "worker_rss_kib_before": {str(w): rss_before[w] for w in workers},
                            "rss_growth_bytes_per_conn": (sum(rss.values()) - sum(rss_before.values()))
                            * 1024 / users,
                            "redis_used_memory": redis_used_memory(rport),
                            "redis_used_memory_before": redis_before}
            if time.monotonic() - started > bound:
                bench.terminate()
                bench.wait(timeout=15)
                raise SystemExit(f"the bench ran past {bound:.0f} s: stopped")
            counts = {w: open_fds(w) or 0 for w in workers}
            for w, n in counts.items():
                peak[w] = max(peak[w], n)
            peak_total = max(peak_total, sum(counts.values()))
            time.sleep(0.25)
        out, err = bench.communicate()
        bench_secs = time.monotonic() - started
        result = json.loads(out)
        bench_line = next((line for line in err.decode(errors="replace").splitlines() if "opened" in line), "")
        say(f"bench: {bench_line.strip()}")
        say(f"opened {result['opened']:,} of {result['conns']:,} on one port in {result['connect_secs']:.1f} s; "
            f"failed {result['failed']}, dropped {result['dropped']}; held {result['duration_secs']:.1f} s")
        say("open descriptors per worker, most at once: " + ", ".join(f"{peak[w]:,}" for w in workers)
            + f" (sum of a moment's counts at most {peak_total:,})")
        if all_held:
            say(f"all {args.conns:,} held {all_held['at_secs']:.1f} s in: the workers' resident memory "
                f"{all_held['rss_growth_bytes_per_conn']:,.0f} B per connection above before the bench"
                + (" (TLS)" if args.tls else ""))
        if held:
            say(f"the Pusher API counted at most {held['users_seen_by_api']:,} presence users across the cluster "
                f"({held['at_secs']:.1f} s in); workers' resident memory then {held['rss_growth_bytes_per_conn']:,.0f} B "
                f"per user above before the bench; redis used_memory {held['redis_used_memory_before']:,} -> "
                f"{held['redis_used_memory']:,} B")
            if "late" in held:
                late = held["late"]
                say(f"still all there {late['at_secs']:.1f} s in: {late['rss_growth_bytes_per_conn']:,.0f} B per user; "
                    f"redis used_memory {late['redis_used_memory']:,} B")
        workers_alive_before = {w: alive(w) for w in workers}

        # SIGTERM the master: it passes it on; each worker drains; then the master exits.
        term_at = time.monotonic()
        master.send_signal(signal.SIGTERM)
        gone: dict[int, float] = {}
        deadline = term_at + seconds(args.drain_timeout) + 20
        while time.monotonic() < deadline and (len(gone) < len(workers) or master.poll() is None):
            for w in workers:
                if w not in gone and not alive(w):
                    gone[w] = time.monotonic() - term_at
            time.sleep(0.02)
        master_rc = master.poll()
        master_exit_secs = time.monotonic() - term_at if master_rc is not None else None
        still = [w for w in workers if alive(w)]
        if master_rc is None:
            master.kill()
            master.wait(timeout=10)
        for w in still:
            os.kill(w, signal.SIGKILL)
        say(f"SIGTERM to the master: workers gone after "
            + ", ".join(f"{gone[w]:.2f} s" if w in gone else "never" for w in workers)
            + (f"; master exited {master_rc} after {master_exit_secs:.2f} s" if master_rc is not None
               else "; master still running (killed)"))
        time.sleep(0.3)   # the reader thread takes the last lines
        stopped = log.find("all workers stopped")
        say(f"master's last words: {stopped.split(' INFO ', 1)[-1].strip() if stopped else '(none)'}")
        all_exited = not still and master_rc is not None and len(gone) == len(workers)

        doc = {"provenance": prov, "binary": provenance.binary(args.bin), "redis_server": redis_version,
               "settings": {"workers": args.workers, "threads_per_worker": 1, "conns": args.conns,
                            "pusher_presence_channels": args.pusher_presence_channels, "tls": args.tls,
                            "procs": args.procs, "rate": args.rate, "duration": args.duration,
                            "serve_command": serve_cmd, "bench_command": bench_cmd},
               "master_pid": master.pid, "worker_pids": workers, "worker_open_files_limit": limits,
               "master_plan_line": plan, "workers_alive_at_load_end": workers_alive_before,
               "bench": result, "bench_wall_secs": bench_secs,
               "pusher_presence": held if presence else None,
               "tls": args.tls, "all_held": all_held,
               "opened": result["opened"], "failed": result["failed"], "dropped": result["dropped"],
               "connect_secs": result["connect_secs"],
               "worker_open_fds_peak": {str(w): peak[w] for w in workers}, "open_fds_peak_sum": peak_total,
               "sigterm": {"worker_gone_secs": {str(w): gone.get(w) for w in workers},
                           "master_exit_code": master_rc, "master_exit_secs": master_exit_secs,
                           "all_exited": all_exited},
               "master_log": [line for _, line in log.lines]}
        md = provenance.md_header("one port, several workers (bench/workers.py)", prov) + "\n" + "\n".join(
            "    " + line for line in printed)
        path = provenance.write_raw(provenance.raw_path("workers", out_dir=args.out), doc, md)
        print(f"wrote {path}", file=sys.stderr)
        complete = held is not None and held["users_seen_by_api"] == args.conns if presence else True
        return 0 if all_exited and complete and result["failed"] == 0 and result["dropped"] == 0 else 1
    finally:
        if bench and bench.poll() is None:
            bench.terminate()
            bench.wait(timeout=15)
        if master and master.poll() is None:
            for w in children(master.pid):
                os.kill(w, signal.SIGKILL)
            master.kill()
            master.wait(timeout=10)
        redis.terminate()
        redis.wait(timeout=10)
        redis_dir.cleanup()


if __name__ == "__main__":
    sys.exit(main())
