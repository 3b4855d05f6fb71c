#!/usr/bin/env python3
"""Pusher Channels servers compared on this machine: throng (`serve --pusher-app`)
and Sockudo (crates.io `sockudo`, bench/peers/sockudo: install.sh builds it,
config.toml is its configuration), both driven by `throng bench --protocol pusher`
(subscribers speaking protocol 7 over WebSocket; events published through the
signed `POST /apps/ID/events`).

For each round, and each server in turn (the order alternates by round; every
measurement starts a fresh server on a free loopback port and stops it by its pid):
  (a) idle: --idle-conns connections (10,000), each subscribed to one of
      --channels channels (100), from source addresses 127.0.0.2-127.0.0.254;
      once all are subscribed and --settle seconds have passed, the server's VmRSS
      (median of 3, /proc/PID/status) less its VmRSS before = bytes per
      connection, and its utime+stime (/proc/PID/stat) over --idle-window
      seconds (10) = idle CPU in % of one core;
  (b) fan-out: --subscribers (10,000) on one channel, --messages M (600)
      published at --msg-rate (20/s) through the signed API; the server's
      utime+stime from the moment all are subscribed to the end of the load plus
      --grace = CPU µs per delivery; deliveries/s, p50 and p99 latency (publish
      to receipt, the bench's clock on both ends), lost, duplicated, out of order.
The raw JSON (every bench report, every sample, the servers' binaries and
configuration, provenance) goes to bench/results/pusher-STAMP.json and a table to
pusher-STAMP.md. The whole run stops starting measurements after --time-limit.

Usage: bench/pusher.py [--servers throng,sockudo] [--rounds 1] [--idle-conns 10000]
                       [--channels 100] [--subscribers 10000] [--messages 600]
                       [--msg-rate 20] [--size 64] [--connect-rate 2000]
                       [--bin target/release/throng] [--sockudo-bin PATH]
                       [--time-limit 3600] [--out bench/results] [--no-record]
Sockudo is in the default list only when bench/peers/sockudo/.install/bin/sockudo
exists. Its log goes to a file in a scratch directory, at its shipped default
level unless --sockudo-rust-log sets RUST_LOG; the scratch directory (configs,
server logs) is removed at the end unless KEEP_SCRATCH=1. Each server's log tail
is in the JSON. The exit status is 1 if any measurement failed (recorded too).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import provenance
from common import free_port  # (bench/common.py)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_BIN = ROOT / "target/release/throng"
SOCKUDO_DIR = HERE / "peers/sockudo"
SOCKUDO_BIN = SOCKUDO_DIR / ".install/bin/sockudo"
APP_ID, APP_KEY, APP_SECRET = "1", "bench-key", "bench-secret"
APP = f"{APP_ID}:{APP_KEY}:{APP_SECRET}"
SOURCE_IPS = "127.0.0.2-127.0.0.254"
TICK = os.sysconf("SC_CLK_TCK")


# -- the server's figures ----------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"pid {pid}: no VmRSS")


def rss_median_kib(pid: int) -> int:
    samples = []
    for _ in range(3):
        samples.append(rss_kib(pid))
        time.sleep(0.2)
    return int(statistics.median(samples))


def cpu_secs(pid: int) -> float:
    """utime + stime of every thread of pid, in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# -- the servers -------------------------------------------------------------------


class Server:
    """One server process on 127.0.0.1:port, stopped by its pid."""

    def __init__(self, name: str, argv: list[str], port: int, cwd: str, env: dict, log: Path):
        self.name, self.argv, self.port, self.log = name, argv, port, log
        self._log_file = open(log, "ab")
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log_file, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{name} not listening on {port} after 30 s: {self.log_tail()}")
                time.sleep(0.1)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log_file.close()


def server_env(extra: dict | None = None) -> dict:
    """A plain environment: nothing of the caller's THRONG_* or Sockudo's settings."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env.update(extra or {})
    return env


def sockudo_config(port: int) -> str:
    text = (SOCKUDO_DIR / "config.toml").read_text()
    for key, value in {"@HOST@": "127.0.0.1", "@PORT@": str(port), "@APP_ID@": APP_ID,
                       "@APP_KEY@": APP_KEY, "@APP_SECRET@": APP_SECRET}.items():
        text = text.replace(key, value)
    return text


def start(name: str, args, scratch: Path, label: str) -> Server:
    port = free_port()
    log = scratch / f"{name}-{label}.log"
    if name == "throng":
        argv = [args.bin, "serve", "--listen", f"127.0.0.1:{port}", "--pusher-app", APP,
                "--stats-interval", "0"]
        srv = Server(name, argv, port, str(scratch), server_env(), log)
    else:
        # Its own directory: Sockudo also reads ./config/config.toml where it runs.
        home = scratch / f"sockudo-{label}"
        home.mkdir()
        config = home / "config.toml"
        config.write_text(sockudo_config(port))
        extra = {"RUST_LOG": args.sockudo_rust_log} if args.sockudo_rust_log else {}
        srv = Server(name, [args.sockudo_bin, "--config", str(config)], port, str(home),
                     server_env(extra), log)
    try:
        preflight(srv, args)
    except Exception:
        srv.stop()
        raise
    return srv


def bench_argv(args, mode: str, port: int, *extra) -> list[str]:
    return [str(args.bin), "bench", mode, "--protocol", "pusher", "--pusher-app", APP,
            "--url", f"ws://127.0.0.1:{port}/", "--source-ips", SOURCE_IPS, "--json",
            "--interval", "0", "--allow-failures", *[str(a) for a in extra]]


def preflight(srv: Server, args) -> None:
    """One subscriber must get through: the app is configured (Sockudo falls back to
    its defaults, without our app, when its config file does not load)."""
    run = subprocess.run(bench_argv(args, "idle", srv.port, "--conns", 1, "--duration", "200ms"),
                         capture_output=True, text=True, timeout=60, env=server_env())
    report = json.loads(run.stdout or "{}")
    if report.get("opened") != 1:
        raise RuntimeError(f"{srv.name}: a Pusher subscriber could not subscribe: "
                           f"{report.get('failures')} {run.stderr[-500:]} {srv.log_tail()}")


# -- one bench run beside the server --------------------------------------------------


class BenchRun:
    """`throng bench` in the background: `opened` is set once every connection is
    open (subscribed), when the bench says so on stderr."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True, env=server_env())
        self.opened = threading.Event()
        self.opened_at: float | None = None
        self.stderr: list[str] = []
        self.stdout = ""
        self._err = threading.Thread(target=self._read_stderr, daemon=True)
        self._out = threading.Thread(target=self._read_stdout, daemon=True)
        self._err.start()
        self._out.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip())
            if line.startswith("opened ") and not self.opened.is_set():
                self.opened_at = time.monotonic()
                self.opened.set()
        self.opened.set()   # ended: nobody waits forever

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()

    def finish(self, timeout: float) -> dict:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise RuntimeError(f"bench did not end within {timeout:.0f} s: {self.stderr[-5:]}")
        finally:
            self._out.join(timeout=10)
            self._err.join(timeout=10)
        try:
            return json.loads(self.stdout)
        except ValueError:
            raise RuntimeError(f"bench printed no report (exit {self.proc.returncode}): "
                               f"{self.stderr[-5:]}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def connect_budget(conns: int, args) -> float:
    return conns / max(args.connect_rate, 1) + 60


def measure_idle(srv: Server, args) -> dict:
    time.sleep(1)
    before = rss_median_kib(srv.pid)
    hold = args.settle + args.idle_window + 3
    run = BenchRun(bench_argv(args, "idle", srv.port, "--conns", args.idle_conns,
                              "--channels", args.channels, "--channel-prefix", args.idle_prefix,
                              "--rate", args.connect_rate, "--duration", f"{round(hold * 1000)}ms"))
    try:
        if not run.opened.wait(connect_budget(args.idle_conns, args)) or run.proc.poll() is not None:
            raise RuntimeError(f"idle: the bench did not get its connections open: {run.stderr[-5:]}")
        time.sleep(args.settle)
        after = rss_median_kib(srv.pid)
        c0, t0 = cpu_secs(srv.pid), time.monotonic()
        time.sleep(args.idle_window)
        c1, t1 = cpu_secs(srv.pid), time.monotonic()
        report = run.finish(hold + 60)
    finally:
        run.stop()
    subscribed = report["opened"]
    return {
        "conns": args.idle_conns, "channels": args.channels, "subscribed": subscribed,
        "failed": report["failed"], "dropped": report["dropped"], "failures": report["failures"],
        "rss_before_kib": before, "rss_after_kib": after,
        "rss_bytes_per_conn": round((after - before) * 1024 / subscribed, 1) if subscribed else None,
        "idle_window_secs": round(t1 - t0, 3), "idle_cpu_secs": round(c1 - c0, 3),
        "idle_cpu_pct_of_core": round(100 * (c1 - c0) / (t1 - t0), 2),
        "bench_argv": run.argv, "bench_report": report,
    }


def measure_fanout(srv: Server, args) -> dict:
    # The publisher sends message i at i / rate while the load lasts: a load of
    # (M - 1/2) / rate sends M (the report's count is what is recorded).
    duration = (args.messages - 0.5) / args.msg_rate
    run = BenchRun(bench_argv(args, "push", srv.port, "--conns", args.subscribers,
                              "--channels", 1, "--channel-prefix", "fanout-",
                              "--rate", args.connect_rate, "--publish-rate", args.msg_rate,
                              "--duration", f"{round(duration * 1000)}ms",
                              "--grace", f"{round(args.grace * 1000)}ms", "--size", args.size))
    try:
        if not run.opened.wait(connect_budget(args.subscribers, args)) or run.proc.poll() is not None:
            raise RuntimeError(f"fan-out: the bench did not get its subscribers: {run.stderr[-5:]}")
        c0, t0 = cpu_secs(srv.pid), time.monotonic()
        # The load, then the grace in which the last deliveries land.
        time.sleep(max(0.0, (run.opened_at or t0) + duration + args.grace - time.monotonic()))
        c1, t1 = cpu_secs(srv.pid), time.monotonic()
        report = run.finish(duration + args.grace + 120)
    finally:
        run.stop()
    push, lat = report.get("push") or {}, report["latency"]
    delivered = push.get("delivered", 0)
    load_secs = report.get("duration_secs") or duration
    return {
        "subscribers": args.subscribers, "subscribed": report["opened"],
        "failed": report["failed"], "dropped": report["dropped"], "failures": report["failures"],
        "messages_asked": args.messages, "msg_rate": args.msg_rate, "size": args.size,
        "published": push.get("published"), "publish_errors": push.get("publish_errors"),
        "expected_deliveries": push.get("expected_deliveries"), "delivered": delivered,
        "lost": push.get("lost"), "duplicated": push.get("duplicated"),
        "out_of_order": push.get("out_of_order"),
        "deliveries_per_sec": round(delivered / load_secs, 1) if load_secs else None,
        "cpu_window_secs": round(t1 - t0, 3), "cpu_secs": round(c1 - c0, 3),
        "cpu_us_per_delivery": round((c1 - c0) * 1e6 / delivered, 3) if delivered else None,
        "latency_p50_us": lat.get("median_us"), "latency_p99_us": lat.get("p99_us"),
        "latency_max_us": lat.get("max_us"),
        "bench_argv": run.argv, "bench_report": report,
    }


# -- the run -----------------------------------------------------------------------------


def version(name: str, args) -> dict:
    if name == "throng":
        return provenance.binary(args.bin)
    out = provenance.binary(args.sockudo_bin)
    try:
        out["install"] = subprocess.run([str(SOCKUDO_DIR / "install.sh"), "--version"],
                                        capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        out["install"] = repr(e)
    return out


def fmt(v, spec: str = ",.0f") -> str:
    return "–" if v is None else format(v, spec)


def median_of(rows: list[dict], key: str):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def markdown(doc: dict, prov: dict) -> str:
    s = doc["settings"]
    md = provenance.md_header("Pusher servers: throng and Sockudo (bench/pusher.py)", prov)
    for name, info in doc["servers"].items():
        md += f"- {name}: {info.get('install') or info.get('version')}\n"
    md += (f"- idle: {s['idle_conns']:,} connections over {s['channels']} channels; RSS after "
           f"{s['settle_secs']} s, CPU over {s['idle_window_secs']} s\n"
           f"- fan-out: {s['subscribers']:,} subscribers on one channel, {s['messages']} events of "
           f"{s['size']} B at {s['msg_rate']}/s; server CPU from all subscribed to the load's end "
           f"+ {s['grace_secs']} s\n- rounds: {s['rounds']} (medians shown; every round in the JSON)\n\n")
    md += ("| server | idle: subscribed | RSS B/conn | idle CPU % core | fan-out: delivered "
           "| lost | dup | deliveries/s | CPU µs/delivery | p50 ms | p99 ms |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for name in doc["servers"]:
        idle = [r["idle"] for r in doc["rounds"] if r["server"] == name and "idle" in r]
        fan = [r["fanout"] for r in doc["rounds"] if r["server"] == name and "fanout" in r]
        p50, p99 = median_of(fan, "latency_p50_us"), median_of(fan, "latency_p99_us")
        md += (f"| {name} | {fmt(median_of(idle, 'subscribed'))} "
               f"| {fmt(median_of(idle, 'rss_bytes_per_conn'))} "
               f"| {fmt(median_of(idle, 'idle_cpu_pct_of_core'), '.2f')} "
               f"| {fmt(median_of(fan, 'delivered'))} | {fmt(median_of(fan, 'lost'))} "
               f"| {fmt(median_of(fan, 'duplicated'))} | {fmt(median_of(fan, 'deliveries_per_sec'))} "
               f"| {fmt(median_of(fan, 'cpu_us_per_delivery'), '.3f')} "
               f"| {fmt(None if p50 is None else p50 / 1000, '.2f')} "
               f"| {fmt(None if p99 is None else p99 / 1000, '.2f')} |\n")
    errors = [f"- {r['server']} round {r['round']} {r['phase']}: {r['error']}"
              for r in doc["rounds"] if "error" in r]
    if errors:
        md += "\nErrors:\n" + "\n".join(errors) + "\n"
    if doc.get("stopped_early"):
        md += f"\nStopped early: {doc['stopped_early']}\n"
    return md


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_servers = "throng,sockudo" if SOCKUDO_BIN.exists() else "throng"
    ap.add_argument("--servers", default=default_servers)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--idle-conns", type=int, default=10_000)
    ap.add_argument("--channels", type=int, default=100)
    ap.add_argument("--idle-prefix", default="idle-",
                    help="idle connections' channel prefix: presence-… makes each a presence member (u<index>)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between subscribed and RSS")
    ap.add_argument("--idle-window", type=float, default=10.0, help="seconds of idle CPU")
    ap.add_argument("--subscribers", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=600)
    ap.add_argument("--msg-rate", type=float, default=20.0)
    ap.add_argument("--size", type=int, default=64, help="bytes of each event's data")
    ap.add_argument("--grace", type=float, default=2.0)
    ap.add_argument("--connect-rate", type=int, default=2000)
    ap.add_argument("--bin", default=str(DEFAULT_BIN))
    ap.add_argument("--sockudo-bin", default=str(SOCKUDO_BIN))
    ap.add_argument("--sockudo-rust-log", help="RUST_LOG for Sockudo (default: unset, its own)")
    ap.add_argument("--time-limit", type=float, default=3600.0,
                    help="seconds after which no new measurement starts")
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR))
    ap.add_argument("--no-record", action="store_true", help="print the table, write no file")
    args = ap.parse_args()
    servers = [s for s in args.servers.split(",") if s]
    for name in servers:
        if name not in ("throng", "sockudo"):
            ap.error(f"unknown server {name!r}")
    if "sockudo" in servers and not Path(args.sockudo_bin).exists():
        ap.error(f"{args.sockudo_bin} is missing: run bench/peers/sockudo/install.sh")
    if not Path(args.bin).exists():
        ap.error(f"{args.bin} is missing: cargo build --release")
    prov = provenance.provenance()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    started = time.monotonic()
    doc = {
        "provenance": prov,
        "servers": {name: version(name, args) for name in servers},
        "settings": {"servers": servers, "rounds": args.rounds, "idle_conns": args.idle_conns,
                     "channels": args.channels, "settle_secs": args.settle,
                     "idle_window_secs": args.idle_window, "subscribers": args.subscribers,
                     "messages": args.messages, "msg_rate": args.msg_rate, "size": args.size,
                     "grace_secs": args.grace, "connect_rate": args.connect_rate,
                     "source_ips": SOURCE_IPS, "open_files_limit": hard, "app": APP,
                     "throng_serve_flags": ["--pusher-app", APP, "--stats-interval", "0"],
                     "sockudo_config_template": (SOCKUDO_DIR / "config.toml").read_text()
                     if "sockudo" in servers else None,
                     "sockudo_rust_log": args.sockudo_rust_log},
        "rounds": [],
    }
    scratch = Path(tempfile.mkdtemp(prefix="pusher-bench-"))
    try:
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else list(reversed(servers))
            for phase, measure in (("idle", measure_idle), ("fanout", measure_fanout)):
                for name in order:
                    if time.monotonic() - started > args.time_limit:
                        doc["stopped_early"] = f"--time-limit {args.time_limit:.0f} s reached"
                        break
                    row = {"server": name, "round": rnd + 1, "phase": phase}
                    print(f"round {rnd + 1}: {name} {phase}", file=sys.stderr)
                    srv = None
                    try:
                        srv = start(name, args, scratch, f"{phase}-{rnd + 1}")
                        row[phase] = measure(srv, args)
                    except Exception as e:   # the run goes on; the error is recorded
                        row["error"] = str(e)[:2000]
                        print(f"  error: {row['error'][:300]}", file=sys.stderr)
                    finally:
                        if srv is not None:
                            srv.stop()
                            row["server_log_tail"] = srv.log_tail(1000)
                    doc["rounds"].append(row)
    finally:
        if os.environ.get("KEEP_SCRATCH"):
            print(f"scratch kept: {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    doc["elapsed_secs"] = round(time.monotonic() - started, 1)
    md = markdown(doc, prov)
    print(md)
    if not args.no_record:
        path = provenance.write_raw(provenance.raw_path("pusher", out_dir=args.out), doc, md)
        print(f"wrote {path} and {path.with_suffix('.md').name}", file=sys.stderr)
    return 1 if any("error" in r for r in doc["rounds"]) else 0


if __name__ == "__main__":
    sys.exit(main())
