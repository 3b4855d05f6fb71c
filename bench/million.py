#!/usr/bin/env python3
"""A million concurrent WebSockets on this machine, server and load generator both.

One process here may hold at most 20,000 open files (a hard limit root cannot raise:
docs/TUNE.md), so the server runs as `throng serve --workers W` joined through a
Redis started here, and the load as `throng bench push --procs P`, client source
addresses spread over 127.0.0.x. Every subscriber joins one channel over
`/ws/{channel}?format=json`, answers the server's pings, and gets the broadcasts
the bench publishes (one when all are open, one --broadcast-every later): the
bench checks each one reached every subscriber exactly once.

While it runs, this script samples once a second: the server's and the bench's
processes (RSS, CPU), /proc/meminfo (Slab, SUnreclaim), /proc/net/sockstat (TCP
sockets in use, TCP memory pages). It writes, in --out:

  million-STAMP.json   the settings, the bench's JSON, the samples and the summary
  million-STAMP.csv    the samples
  million-STAMP.svg    a chart: connections, server RSS and kernel slab over the run
  million-STAMP.html   the bench's own HTML report (latency, timeline, failures)
  million-STAMP-serve.log  the server's log (and -error.log: nginx's, with --server nchan)

Only the JSON (and a Markdown write-up, if any) is kept in git: the rest is
git-ignored. The CSV and SVG are drawn from the JSON again by `--summarize FILE.json`;
the HTML report and the logs exist only where the run ran.

and prints the summary as a Markdown table (docs/SCALE.md).

Before loading it runs `throng tune --conns N --loopback --apply`, which raises the
/proc/sys values a million connections need (tcp_mem above all) and says what it
cannot (the open-files limit: hence --workers and --procs).

The kernel's established-socket table is sized at boot: this VM's has 262,144
buckets, so 2,000,000 sockets make chains of 8 that every packet walks, and that walk
was one of the two costliest kernel functions during a broadcast. A box tuned for a million
boots with `thash_entries=` as `throng tune` advises; this one cannot be rebooted
with it. So with `--socket-table auto` (the default), when the table holds fewer
than half the run's sockets, the whole run (redis, server, bench) goes into a
network namespace of its own, made with a table of the size tune asks for
(net.ipv4.tcp_child_ehash_entries, put back at once), and tune itself runs on the
host, whose tcp_mem the namespace shares. `--socket-table host` runs where it is
started, as every run before 2026-11-27 did. The JSON's settings say which.

`--server nchan` runs the same load against Nchan instead (Debian's nginx-light and
libnginx-mod-nchan from scripts/test.sh's installs): nginx with as many worker
processes as throng would have workers (each holds at most 19,000 connections, as
throng's do), from bench/peers/nchan/nginx.conf.template, pinging each WebSocket
every --ping-interval as throng does. The bench subscribes to `/ws/{channel}` (Nchan
sends the body as published, so the bench numbers its messages: `--seq-from
payload`) and publishes to `/pub/{channel}`. Only Nchan of the peers can be measured
at this size here: it spreads over processes, the others are one process each.

Usage (as root; redis-server, nginx and Nchan from scripts/test.sh's installs):
  python3 bench/million.py [--conns 1000000] [--workers auto] [--procs auto]
      [--rate 25000] [--max-opening 4000] [--hold 50s] [--broadcast-every 40s] [--ping-interval 25s]
      [--server throng|nchan] [--socket-table auto|host] [--bin target/release/throng] [--out bench/results]
Exit status: the bench's (1 if any connection failed or dropped, a message was lost
or a publish failed), 2 for a usage or setup error.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from provenance import provenance
from common import connectable, free_port  # (bench/common.py)

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def wait_for(check, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def http_get(port: int, path: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def duration_secs(text: str) -> float:
    for suffix, mult in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * mult
    return float(text)


def tree(pid: int) -> list[int]:
    """pid and every descendant."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def rss_and_ticks(pids: list[int]) -> tuple[int, int]:
    rss_kib = ticks = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss_kib += int(line.split()[1])
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return rss_kib, ticks


def meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0])
    return out


def box_cpu() -> dict[str, float]:
    """The whole machine's CPU seconds so far by kind, from /proc/stat's first line.
    Softirq (the loopback's receive side, mostly) is counted here and in no
    process's own times, and io_uring's waits show as iowait: both matter when
    the box, not the server, is what a broadcast waits for."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return {"box_user_secs": (user + nice) / TICK, "box_system_secs": system / TICK,
            "box_softirq_secs": (irq + softirq) / TICK, "box_idle_secs": (idle + iowait) / TICK,
            "box_steal_secs": steal / TICK}


BOX_KINDS = ("user", "system", "softirq", "idle", "steal")


def sockstat() -> tuple[int, int]:
    """TCP sockets in use, TCP memory in pages."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                parts = line.split()
                vals = dict(zip(parts[1::2], parts[2::2]))
                return int(vals["inuse"]), int(vals["mem"])
    return 0, 0


class Sampler(threading.Thread):
    def __init__(self, server_pid: int) -> None:
        super().__init__(daemon=True)
        self.server_pid = server_pid
        self.bench_pid: int | None = None
        self.samples: list[dict] = []
        self.stop_flag = threading.Event()
        self.t0 = time.time()

    def sample(self) -> dict:
        srv_rss, srv_ticks = rss_and_ticks(tree(self.server_pid))
        b_rss, b_ticks = rss_and_ticks(tree(self.bench_pid)) if self.bench_pid else (0, 0)
        mi = meminfo()
        inuse, mem_pages = sockstat()
        return {
            "t": round(time.time() - self.t0, 2),
            "server_rss_kib": srv_rss,
            "server_cpu_secs": srv_ticks / TICK,
            "bench_rss_kib": b_rss,
            "bench_cpu_secs": b_ticks / TICK,
            "slab_kib": mi["Slab"],
            "sunreclaim_kib": mi["SUnreclaim"],
            "mem_available_kib": mi["MemAvailable"],
            "tcp_inuse": inuse,
            "tcp_mem_pages": mem_pages,
        } | box_cpu()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.samples.append(self.sample())
            self.stop_flag.wait(1.0)


def svg_chart(samples: list[dict], timeline: list[dict], t_load: float, title: str) -> str:
    """Connections (bench timeline), server RSS and kernel slab against time."""
    w, h, left, right, top, bottom = 900, 420, 70, 70, 40, 50
    pw, ph = w - left - right, h - top - bottom
    tmax = max(s["t"] for s in samples) or 1
    conns = [(t_load + p["t_secs"], p["open"]) for p in timeline]
    cmax = max([c for _, c in conns] + [1])
    slab0 = samples[0]["slab_kib"]
    mib = [(s["t"], s["server_rss_kib"] / 1024, (s["slab_kib"] - slab0) / 1024) for s in samples]
    mmax = max([max(r, k) for _, r, k in mib] + [1])

    def x(t: float) -> float:
        return left + pw * max(0.0, t) / tmax

    def line(points, ymax, color, dash=""):
        d = " ".join(f"{'M' if i == 0 else 'L'}{x(t):.1f},{top + ph - ph * v / ymax:.1f}"
                     for i, (t, v) in enumerate(points))
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        return f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2"{extra}/>'

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{left}" y="22" font-size="15" font-weight="bold">{title}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for i in range(6):
        y = top + ph - ph * i / 5
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#1f6feb">'
                     f'{cmax * i / 5 / 1000:,.0f}k</text>')
        parts.append(f'<text x="{left + pw + 6}" y="{y + 4:.1f}" fill="#b35900">{mmax * i / 5:,.0f}</text>')
    step = max(10, int(math.ceil(tmax / 10 / 10)) * 10)
    for t in range(0, int(tmax) + 1, step):
        parts.append(f'<text x="{x(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{t}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{h - 12}" text-anchor="middle">seconds since the bench started</text>')
    parts.append(f'<text x="14" y="{top + ph / 2}" fill="#1f6feb" transform="rotate(-90 14 {top + ph / 2})" '
                 f'text-anchor="middle">open connections (bench)</text>')
    parts.append(f'<text x="{w - 14}" y="{top + ph / 2}" fill="#b35900" transform="rotate(90 {w - 14} {top + ph / 2})" '
                 f'text-anchor="middle">MiB</text>')
    parts.append(line(conns, cmax, "#1f6feb"))
    parts.append(line([(t, k) for t, _, k in mib], mmax, "#b35900"))
    parts.append(line([(t, r) for t, r, _ in mib], mmax, "#2da44e", "6 3"))
    lx = left + 10
    for i, (label, color) in enumerate((("open connections", "#1f6feb"),
                                         ("kernel slab growth, MiB (both ends' sockets)", "#b35900"),
                                         ("server RSS, all workers, MiB", "#2da44e"))):
        y = top + 16 + 16 * i
        parts.append(f'<line x1="{lx}" x2="{lx + 20}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{lx + 26}" y="{y}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


NCHAN_TEMPLATE = ROOT / "bench/peers/nchan/nginx.conf.template"
NCHAN_MODULES = [Path("/usr/lib/nginx/modules/ngx_nchan_module.so"),
                 Path("/usr/share/nginx/modules/ngx_nchan_module.so")]


def nchan_command(directory: Path, module: Path, port: int, workers: int, ping_interval: str) -> list[str]:
    """Writes Nchan's nginx.conf into `directory` and returns the command that runs it
    in the foreground (its master is the process to sample and stop). Its WebSocket
    subscribers get a ping every `ping_interval`, as throng's do."""
    (directory / "tmp").mkdir(exist_ok=True)
    user = ""
    if os.geteuid() == 0:
        import grp
        import pwd
        user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};"
    conf = (NCHAN_TEMPLATE.read_text()
            .replace("@MODULE@", str(module)).replace("@WORKERS@", str(workers))
            .replace("@PORT@", str(port)).replace("@DIR@", str(directory)).replace("@USER@", user))
    ping = f"nchan_websocket_ping_interval {max(1, round(duration_secs(ping_interval)))};"
    marker = "nchan_subscriber websocket;"
    assert conf.count(marker) == 1, "the template's WebSocket location changed"
    conf = conf.replace(marker, f"{marker}\n            {ping}")
    (directory / "nginx.conf").write_text(conf)
    return ["nginx", "-p", f"{directory}/", "-c", "nginx.conf", "-e", str(directory / "error.log")]


NETNS_ENV = "THRONG_MILLION_NETNS"
HOST_NETNS_ENV = "THRONG_MILLION_HOST_NETNS"
EHASH = Path("/proc/sys/net/ipv4/tcp_ehash_entries")
CHILD_EHASH = Path("/proc/sys/net/ipv4/tcp_child_ehash_entries")


def socket_table(sockets: int) -> dict:
    """This network namespace's established-socket table against `sockets`:
    slow when its chains would average over 2 (throng tune's SLOW)."""
    if not EHASH.exists():   # before Linux 6.1: neither shown nor settable per namespace
        return {}
    entries = int(EHASH.read_text())
    needed = 1 << max(sockets - 1, 1).bit_length()
    return {"entries": entries, "needed": needed, "slow": entries * 2 < sockets}


def in_own_namespace(entries: int) -> int:
    """Runs this same command again inside a network namespace made with a socket
    table of `entries` buckets, then removes the namespace."""
    name = f"throng-million-{os.getpid()}"
    saved = CHILD_EHASH.read_text()
    try:
        CHILD_EHASH.write_text(str(entries))
        subprocess.run(["ip", "netns", "add", name], check=True)
    finally:
        CHILD_EHASH.write_text(saved)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        print(f"socket table: running in network namespace {name} ({entries:,} buckets; "
              f"this one has {int(EHASH.read_text()):,}): --socket-table host runs here", file=sys.stderr)
        env = os.environ | {NETNS_ENV: name, HOST_NETNS_ENV: f"/proc/{os.getpid()}/ns/net"}
        return subprocess.run(["ip", "netns", "exec", name, sys.executable, str(Path(__file__).resolve()),
                               *sys.argv[1:]], env=env).returncode
    finally:
        subprocess.run(["ip", "netns", "del", name])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target/release/throng"))
    ap.add_argument("--conns", type=int, default=1_000_000)
    ap.add_argument("--workers", default="auto", help="server processes (auto: what throng tune plans)")
    ap.add_argument("--procs", default="auto", help="bench processes (auto: what throng tune plans)")
    ap.add_argument("--rate", type=int, default=25_000, help="new connections per second, all together")
    ap.add_argument("--max-opening", type=int, default=4000,
                    help="connections opening at once, all bench processes together")
    ap.add_argument("--hold", default="50s", help="how long the load runs once every connection is open")
    ap.add_argument("--broadcast-every", default="40s", help="one broadcast when all are open, then one this often")
    ap.add_argument("--ping-interval", default="25s")
    ap.add_argument("--server", choices=["throng", "nchan"], default="throng",
                    help="the server under load (nchan: Nchan in nginx, the same load and bench)")
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    ap.add_argument("--socket-table", choices=["auto", "host"], default="auto",
                    help="auto: run in a network namespace with a socket table sized for the run's "
                         "sockets when this one's is less than half that (see above); host: run here")
    ap.add_argument("--summarize", metavar="FILE.json", help="print a saved run's summary again (the run's file untouched; bench/derive_million.py keeps it) and write its CSV and chart again")
    args = ap.parse_args()
    if args.summarize:
        return resummarize(Path(args.summarize))
    table = socket_table(2 * args.conns)
    if args.socket_table == "auto" and NETNS_ENV not in os.environ and table.get("slow"):
        return in_own_namespace(table["needed"])

    binary = Path(args.bin)
    if not binary.exists():
        print(f"no throng binary at {binary}: cargo build --release", file=sys.stderr)
        return 2
    redis_bin = shutil.which("redis-server")
    if args.server == "throng" and not redis_bin:
        print("redis-server is needed (scripts/test.sh installs it)", file=sys.stderr)
        return 2
    nchan_module = next((m for m in NCHAN_MODULES if m.exists()), None)
    if args.server == "nchan" and not (shutil.which("nginx") and nchan_module):
        print("nginx and Nchan are needed (scripts/test.sh installs nginx-light and libnginx-mod-nchan)",
              file=sys.stderr)
        return 2
    prov = provenance()   # the commit and tree the run starts from, and its command line
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = ("nchan-" if args.server == "nchan" else "") + time.strftime("%Y%m%d-%H%M%S")

    # In a namespace of its own, tune runs on the host: tcp_mem is the host's.
    on_host = ["nsenter", f"--net={os.environ[HOST_NETNS_ENV]}"] if NETNS_ENV in os.environ else []
    tune = subprocess.run([*on_host, str(binary), "tune", "--conns", str(args.conns), "--loopback", "--apply",
                           "--json"], capture_output=True, text=True)
    plan = json.loads(tune.stdout)
    print(f"tune --apply: {json.dumps(plan.get('applied'))}", file=sys.stderr)
    p = plan.get("plan") or {}
    workers = int(p.get("workers", 1)) if args.workers == "auto" else int(args.workers)
    procs = int(p.get("procs", 1)) if args.procs == "auto" else int(args.procs)
    # One source address reaches one server port from the ephemeral range. Spread
    # the client sockets over all of 127.0.0.2-254: connect() looks for a free port
    # by trying ports in turn (the kernel's __inet_check_established), so an
    # address whose range is half used makes every connect scan; at a million over
    # 36 addresses that scan took a third of both cores.
    source_ips = "127.0.0.2-127.0.0.254"

    port, redis_port = free_port(), free_port()
    tmp = tempfile.TemporaryDirectory(prefix="throng-million-")
    procs_to_stop: list[subprocess.Popen] = []
    try:
        if args.server == "nchan":
            assert nchan_module
            serve_cmd = nchan_command(Path(tmp.name), nchan_module, port, workers, args.ping_interval)
        else:
            redis = subprocess.Popen([redis_bin, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", tmp.name],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            procs_to_stop.append(redis)
            wait_for(lambda: connectable(redis_port, timeout=0.5), 10, "redis-server")
            serve_cmd = [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--workers", str(workers),
                         "--threads", "1", "--broker", f"redis://127.0.0.1:{redis_port}",
                         "--ping-interval", args.ping_interval, "--stats-interval", "0",
                         "--history-size", "10"]
        server = subprocess.Popen(serve_cmd, stdout=subprocess.DEVNULL, stderr=open(Path(tmp.name) / "serve.log", "w"),
                                  stdin=subprocess.DEVNULL)
        procs_to_stop.append(server)
        wait_for(lambda: connectable(port, timeout=0.5) and http_get(port, "/healthz")[0] == 200, 60, "the server's workers")
        wait_for(lambda: len(tree(server.pid)) >= workers + 1, 60, "every worker")
        time.sleep(2)
        sampler = Sampler(server.pid)
        base = sampler.sample()
        sampler.start()

        hold = duration_secs(args.hold)
        every = duration_secs(args.broadcast_every)
        report_html = out_dir / f"million-{stamp}.html"
        if args.server == "nchan":
            target = ["--url", f"ws://127.0.0.1:{port}/ws/{{channel}}", "--seq-from", "payload",
                      "--publish-url", f"http://127.0.0.1:{port}/pub/{{channel}}"]
        else:
            target = ["--url", f"ws://127.0.0.1:{port}/ws/{{channel}}?format=json"]
        bench_cmd = [str(binary), "bench", "push", *target,
                     "--conns", str(args.conns), "--procs", str(procs), "--source-ips", source_ips,
                     "--rate", str(args.rate), "--max-opening", str(args.max_opening), "--channels", "1", "--channel-prefix", "million-",
                     "--publish-rate", f"{1 / every:g}", "--publishers", "1", "--duration", f"{hold:g}s",
                     "--connect-timeout", "30s", "--grace", "15s", "--interval", "5s",
                     "--json", "--report", str(report_html)]
        print("$ " + " ".join(serve_cmd), file=sys.stderr)
        print("$ " + " ".join(bench_cmd), file=sys.stderr)
        t_bench = time.time() - sampler.t0
        bench = subprocess.Popen(bench_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs_to_stop.append(bench)
        sampler.bench_pid = bench.pid
        stderr_lines: list[str] = []
        t_loaded = [0.0]

        def watch() -> None:
            assert bench.stderr
            for line in bench.stderr:
                stderr_lines.append(line)
                sys.stderr.write("  bench: " + line)
                if "load for" in line and not t_loaded[0]:
                    t_loaded[0] = time.time() - sampler.t0

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        # stdout only: stderr is the watcher's (communicate() would read it too,
        # and a line it took never reached the watcher).
        assert bench.stdout
        out = bench.stdout.read()
        bench_status = bench.wait()
        watcher.join(5)
        sampler.stop_flag.set()
        sampler.join(5)
        try:
            result = json.loads(out)
        except json.JSONDecodeError:
            print("the bench printed no JSON:\n" + "".join(stderr_lines[-40:]), file=sys.stderr)
            return 2
    finally:
        for proc in reversed(procs_to_stop):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for name in ("serve.log", "error.log"):  # error.log: nginx's, with --server nchan
            log = Path(tmp.name) / name
            if log.exists() and log.stat().st_size > 0:
                shutil.copy(log, out_dir / f"million-{stamp}-{name}")

    machine = {"host": platform.node(), "cores": os.cpu_count(), "kernel": platform.release(),
               "mem_total_kib": meminfo()["MemTotal"]}
    doc = {"provenance": prov, "settings": vars(args) | {"workers": workers, "procs": procs, "source_ips": source_ips,
                                                         "netns": os.environ.get(NETNS_ENV),
                                                         "tcp_ehash_entries": table.get("entries")},
           "commands": {"serve": serve_cmd, "bench": bench_cmd}, "machine": machine,
           "t_bench_start": t_bench, "t_all_open": t_loaded[0] or t_bench, "base": base,
           "samples": sampler.samples, "bench": result,
           "slow_turns": slow_turns(out_dir / f"million-{stamp}-serve.log")}
    summary, rows = summarize(doc)
    doc["summary"] = summary
    (out_dir / f"million-{stamp}.json").write_text(json.dumps(doc, indent=1))
    write_copies(doc, out_dir / f"million-{stamp}.json")
    print_rows(f"million-{stamp}", rows)
    # The bench's own verdict: failed or dropped connections, lost messages, failed publishes.
    return 0 if bench_status == 0 else 1


def slow_turns(log: Path) -> dict:
    """The server's slow event-loop turns (250 ms or longer, each logged with its
    worker's pid), per worker: how many, and the longest (ms)."""
    per: dict[str, list[int]] = {}
    if not log.exists():
        return per
    for line in log.read_text(errors="replace").splitlines():
        if "slow event loop turn" not in line:
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "took_ms" in fields:
            entry = per.setdefault(fields.get("pid", "?"), [0, 0])
            entry[0] += 1
            entry[1] = max(entry[1], int(fields["took_ms"]))
    return per


def write_copies(doc: dict, path: Path) -> None:
    """The run's samples as CSV and its chart as SVG, beside its JSON. Both are drawn
    from the JSON alone (so new ones are git-ignored): `--summarize FILE.json` draws
    them again. A copy already there is left as it is (the copies runs made before
    2026-11-26 are kept in git as they were written)."""
    csv_path, svg_path = path.with_suffix(".csv"), path.with_suffix(".svg")
    if csv_path.exists() or svg_path.exists():
        print(f"{csv_path.name} / {svg_path.name} exist: left as they are", file=sys.stderr)
        return
    with open(csv_path, "x", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(doc["samples"][0].keys()))
        wr.writeheader()
        wr.writerows(doc["samples"])
    svg_path.write_text(chart(doc))


def chart(doc: dict) -> str:
    n = doc["bench"]["opened"]
    title = (f"{n:,} WebSockets: {doc['settings']['workers']} throng workers, "
             f"{doc['settings']['procs']} bench processes, {doc['machine']['cores']} cores")
    return svg_chart(doc["samples"], doc["bench"].get("timeline", []), doc["t_all_open"], title)


def rate(samples: list[dict], key: str, t_from: float, t_to: float) -> float | None:
    """The per-second rate of a cumulative sampled figure between two moments."""
    window = [s for s in samples if t_from <= s["t"] <= t_to and key in s]
    if len(window) < 2 or window[-1]["t"] <= window[0]["t"]:
        return None
    return (window[-1][key] - window[0][key]) / (window[-1]["t"] - window[0]["t"])


def load_seconds(timeline: list[dict]) -> list[dict]:
    """The bench's timeline seconds once every connection is open, from benches that
    count pings per second."""
    return [p for p in timeline if p["t_secs"] > 0 and "pings_per_sec" in p]


def pings_between_broadcasts(timeline: list[dict]) -> tuple[float, float] | None:
    """Pings per second between the two broadcasts, from the bench's timeline: the
    lowest 3-second mean and the highest second, from 3 s after the first
    broadcast's last delivery (the pings it held up are sent then) to the second's
    first. None when the timeline has no such stretch."""
    load = load_seconds(timeline)
    i = 0
    while i < len(load) and load[i]["received_per_sec"] == 0:
        i += 1
    while i < len(load) and load[i]["received_per_sec"] > 0:
        i += 1
    j = i
    while j < len(load) and load[j]["received_per_sec"] == 0:
        j += 1
    window = [p["pings_per_sec"] for p in load[i + 3:j]]
    if len(window) < 3 or j == len(load):
        return None
    lowest = min(sum(window[k:k + 3]) / 3 for k in range(len(window) - 2))
    return lowest, max(window)


def reach_curve(timeline: list[dict], n: int, every: float, broadcasts: int) -> list[list[float | None]]:
    """Per broadcast, the seconds after it left by which the bench had read 50%,
    90%, 99% and all of its n deliveries (to the bench timeline's second): how the
    time to reach all splits into the bulk and the tail."""
    out = []
    for b in range(broadcasts):
        t0, got, marks = b * every, 0.0, []
        want = [0.5 * n, 0.9 * n, 0.99 * n, n - 0.5]
        prev_t = t0
        for p in load_seconds(timeline):
            if not t0 < p["t_secs"] <= t0 + every:
                continue
            got += p["received_per_sec"] * (p["t_secs"] - prev_t)
            prev_t = p["t_secs"]
            while len(marks) < len(want) and got >= want[len(marks)]:
                marks.append(round(p["t_secs"] - t0, 1))
        out.append(marks + [None] * (len(want) - len(marks)))
    return out


def summarize(doc: dict) -> tuple[dict, list[tuple[str, str]]]:
    samples, result, base = doc["samples"], doc["bench"], doc.get("base") or doc["samples"][0]
    t_load = doc["t_all_open"]
    every = duration_secs(doc["settings"]["broadcast_every"])
    hold = duration_secs(doc["settings"]["hold"])
    ping_every = duration_secs(doc["settings"]["ping_interval"])
    n = result["opened"]
    load_pings = [p["pings_per_sec"] for p in load_seconds(result.get("timeline", []))]
    between = pings_between_broadcasts(result.get("timeline", []))
    full = [s for s in samples if s["t"] >= t_load]
    at_full = full[0] if full else samples[-1]
    # The first broadcast leaves when every connection is open; the idle window is
    # from the second after it has reached everyone (no message received in a
    # timeline second) to 2 s before the next one.
    delivered_by = next((t_load + p["t_secs"] for p in result.get("timeline", [])
                         if p["t_secs"] > 0 and p["received_per_sec"] == 0), t_load + every / 2)
    idle_from, idle_to = delivered_by + 1, t_load + min(every, hold) - 2
    busy_from, busy_to = t_load, delivered_by
    peak_slab = max(s["slab_kib"] for s in samples)
    deliveries = result["push"]["delivered"]
    broadcasts = result["push"]["published"]
    server_busy = rate(samples, "server_cpu_secs", busy_from, busy_to)
    server_idle = rate(samples, "server_cpu_secs", idle_from, idle_to)
    # A broadcast's own CPU: the window's CPU less what the pings cost meanwhile;
    # only over a window long enough for once-a-second samples to resolve it.
    reach_secs = result["latency"]["max_us"] / 1e6
    per_delivery = None
    if server_busy is not None and server_idle is not None and delivered_by - t_load >= 5:
        per_delivery = (server_busy - server_idle) * (delivered_by - t_load) / n * 1e6
    summary = {
        "connections_opened": n,
        "failed": result["failed"],
        "dropped": result["dropped"],
        "connect_secs": result["connect_secs"],
        "connects_per_sec": n / result["connect_secs"] if result["connect_secs"] else None,
        "server_rss_base_kib": base["server_rss_kib"],
        "server_rss_at_full_kib": at_full["server_rss_kib"],
        "server_rss_peak_kib": max(s["server_rss_kib"] for s in samples),
        "server_userspace_bytes_per_conn": (at_full["server_rss_kib"] - base["server_rss_kib"]) * 1024 / max(n, 1),
        "bench_rss_at_full_kib": at_full["bench_rss_kib"],
        "slab_at_full_kib": at_full["slab_kib"] - base["slab_kib"],
        "kernel_bytes_per_socket": (at_full["slab_kib"] - base["slab_kib"]) * 1024 / max(2 * n, 1),
        "slab_peak_kib": peak_slab - base["slab_kib"],
        "tcp_inuse_peak": max(s["tcp_inuse"] for s in samples),
        "tcp_mem_peak_pages": max(s["tcp_mem_pages"] for s in samples),
        "pings_received": result["pings"],
        "pings_per_sec_held": n / ping_every,
        # Measured by the bench, second by second over the load: the mean, and the
        # busiest second (a server whose heartbeats bunch shows it here).
        "pings_per_sec_measured": (sum(load_pings) / len(load_pings)) if load_pings else None,
        "pings_per_sec_peak_second": max(load_pings) if load_pings else None,
        # Between the broadcasts (from 3 s after the first has reached everyone to
        # the second): the quietest 3 s and the busiest second. A gap then a storm
        # is pings bunched by the first broadcast's stall.
        "pings_per_sec_between_min_3s": between[0] if between else None,
        "pings_per_sec_between_max": between[1] if between else None,
        "broadcasts": broadcasts,
        "deliveries": deliveries,
        "expected_deliveries": result["push"]["expected_deliveries"],
        "lost": result["push"]["lost"],
        "duplicated": result["push"]["duplicated"],
        "broadcast_to_all_max_ms": result["latency"]["max_us"] / 1000,
        "delivery_p50_ms": result["latency"]["median_us"] / 1000,
        "delivery_p99_ms": result["latency"]["p99_us"] / 1000,
        "deliveries_per_sec_broadcast": n / reach_secs if reach_secs > 0 else None,
        "server_cpu_cores_broadcast": server_busy,
        "server_cpu_us_per_delivery": per_delivery,
        "idle_window_secs": [round(idle_from - t_load, 1), round(idle_to - t_load, 1)],
        "server_idle_cpu_cores": server_idle,
        "bench_idle_cpu_cores": rate(samples, "bench_cpu_secs", idle_from, idle_to),
        "bench_cpu_cores_broadcast": rate(samples, "bench_cpu_secs", busy_from, busy_to),
        # The whole machine by kind (cores), while idle and while the first
        # broadcast went out; absent from runs made before it was sampled.
        "reach_50_90_99_all_secs": reach_curve(result.get("timeline", []), n, every, broadcasts),
        "box_cores_idle": {k: rate(samples, f"box_{k}_secs", idle_from, idle_to) for k in BOX_KINDS},
        "box_cores_broadcast": {k: rate(samples, f"box_{k}_secs", busy_from, busy_to) for k in BOX_KINDS},
        "mem_available_min_kib": min(s["mem_available_kib"] for s in samples),
        # How long each broadcast's publish waited for its answer (a publish that
        # got none within the bench's 5 s is a publish error).
        "publish_answer_max_ms": result["push"].get("publish_answer_max_ms"),
        "publish_answers_over_1s": result["push"].get("publish_answers_over_1s"),
        "publish_errors": result["push"].get("publish_errors"),
    }
    turns = doc.get("slow_turns")
    if turns is not None:
        longest = sorted(m for _, m in turns.values())
        summary["slow_turns"] = sum(n for n, _ in turns.values())
        summary["slow_turn_workers"] = len(turns)
        summary["slow_turn_longest_ms"] = longest[-1] if longest else 0
        summary["slow_turn_longest_median_worker_ms"] = longest[len(longest) // 2] if longest else 0

    def fmt(v, unit="", digits=0):
        return "-" if v is None else f"{v:,.{digits}f}{unit}"

    def box_row(cores: dict) -> str:
        return " / ".join(fmt(cores.get(k), "", 2) for k in BOX_KINDS)

    workers, procs = doc["settings"]["workers"], doc["settings"]["procs"]
    rows = [
        ("connections open", f"{n:,} of {doc['settings']['conns']:,}; failed {result['failed']}, "
                             f"dropped {result['dropped']}"),
        ("time to open all", f"{fmt(result['connect_secs'], ' s', 1)} ({fmt(summary['connects_per_sec'], '/s')})"),
        ("server processes / bench processes", f"{workers} / {procs}"),
        ("server RSS, all workers: before / all open / peak",
         f"{fmt(base['server_rss_kib'] / 1024, ' MiB', 1)} / {fmt(at_full['server_rss_kib'] / 1024, ' MiB', 1)} / "
         f"{fmt(summary['server_rss_peak_kib'] / 1024, ' MiB', 1)}"),
        ("server userspace per connection (RSS growth / connections)",
         fmt(summary["server_userspace_bytes_per_conn"], " B")),
        ("kernel slab, all open (both ends' sockets) / peak",
         f"{fmt(summary['slab_at_full_kib'] / 1024 / 1024, ' GiB', 2)} = "
         f"{fmt(summary['kernel_bytes_per_socket'], ' B')} per socket / "
         f"{fmt(summary['slab_peak_kib'] / 1024 / 1024, ' GiB', 2)}"),
        ("TCP sockets in use, peak (sockstat)", f"{summary['tcp_inuse_peak']:,}"),
        ("pings held", f"{fmt(summary['pings_per_sec_held'], '/s')} ({n:,} every {doc['settings']['ping_interval']}); "
                       f"{result['pings']:,} received and answered over the run; measured over the load: "
                       f"{fmt(summary['pings_per_sec_measured'], '/s')} mean, "
                       f"{fmt(summary['pings_per_sec_peak_second'], '/s')} in the busiest second; between the "
                       f"broadcasts {fmt(summary['pings_per_sec_between_min_3s'], '/s')} in the quietest 3 s, "
                       f"{fmt(summary['pings_per_sec_between_max'], '/s')} in the busiest second"),
        ("broadcasts; deliveries / expected; lost; duplicated",
         f"{broadcasts}; {deliveries:,} / {summary['expected_deliveries']:,}; "
         f"{summary['lost']}; {summary['duplicated']}"),
        ("a broadcast reaches all: max / p50 / p99 of deliveries",
         f"{fmt(summary['broadcast_to_all_max_ms'] / 1000, ' s', 1)} / {fmt(summary['delivery_p50_ms'] / 1000, ' s', 1)} / "
         f"{fmt(summary['delivery_p99_ms'] / 1000, ' s', 1)}"),
        ("each broadcast: seconds to reach 50% / 90% / 99% / all (bench timeline, 1 s resolution)",
         "; ".join(" / ".join(fmt(v, "", 1) for v in marks) for marks in summary["reach_50_90_99_all_secs"])),
        ("a broadcast: deliveries/s (connections ÷ time to reach all); server CPU per delivery, pings' share taken out",
         f"{fmt(summary['deliveries_per_sec_broadcast'], '/s')}; "
         f"{fmt(summary['server_cpu_us_per_delivery'], ' µs', 1)} "
         f"(server {fmt(summary['server_cpu_cores_broadcast'], ' cores', 2)} while the first went out)"),
        (f"CPU while idle (pings only, s {summary['idle_window_secs'][0]}..{summary['idle_window_secs'][1]} of the load):"
         " server / bench",
         f"{fmt(summary['server_idle_cpu_cores'], ' cores', 2)} / {fmt(summary['bench_idle_cpu_cores'], ' cores', 2)}"),
        ("the whole machine, cores: user / system / softirq / idle (incl. iowait) / steal",
         f"while idle {box_row(summary['box_cores_idle'])}; while the first broadcast went out "
         f"{box_row(summary['box_cores_broadcast'])} (bench processes then "
         f"{fmt(summary['bench_cpu_cores_broadcast'], ' cores', 2)})"),
        ("lowest MemAvailable", fmt(summary["mem_available_min_kib"] / 1024 / 1024, " GiB", 1)),
        ("event-loop turns of 250 ms or more: in all; workers with any; the longest; the median worker's longest",
         "-" if turns is None else
         f"{summary['slow_turns']:,}; {summary['slow_turn_workers']} of {workers}; "
         f"{summary['slow_turn_longest_ms']:,} ms; {summary['slow_turn_longest_median_worker_ms']:,} ms"),
        ("a broadcast's publish: slowest answer; answered after over 1 s; not answered in 5 s",
         f"{fmt(summary['publish_answer_max_ms'], ' ms')}; {fmt(summary['publish_answers_over_1s'])}; "
         f"{fmt(summary['publish_errors'])}"),
    ]
    return summary, rows


def print_rows(name: str, rows: list[tuple[str, str]]) -> None:
    print(f"| {name} | |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")


def resummarize(path: Path) -> int:
    """Prints the summary of a saved run again, as this script computes it today,
    and writes its CSV and chart again. The run's own file is never rewritten;
    bench/derive_million.py keeps such a summary in STAMP.derived.json."""
    doc = json.loads(path.read_text())
    _, rows = summarize(doc)
    write_copies(doc, path)
    print_rows(path.stem, rows)
    print(f"to keep this summary beside the run: python3 bench/derive_million.py {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
