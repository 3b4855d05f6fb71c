#!/usr/bin/env python3
"""TLS servers side by side (issue 27), same machine, same run, same clients:

  throng        plain ws:// (the baseline every TLS row is compared with)
  throng-tls    throng serve --tls-cert/--tls-key (wss://)
  throng-base-tls  the same with another build, $THRONG_BASE_BIN (not in the
                default list): an A/B of two builds over TLS
  nginx-tls     nginx terminating wss:// in front of plain throng
  uws-tls       uWebSockets' echo peer on uWS::SSLApp (OpenSSL), and its hub
                peer for the fan-out, when built (bench/peers/uws/build.sh --tls;
                skipped with the reason if not)

For each: idle bytes per connection (the Go gorilla client bench/clients/wsload
holds --idle-conns idle connections; the RSS of every process of the server, its
children and, for nginx, the throng behind it, before and after), echo CPU per
message (wsload echo: --echo-conns connections, one 32-byte message in flight
each, --echo-seconds), fan-out CPU per delivery (bench/clients/fanload:
--fanout-conns subscribers of one channel, --fanout-rate messages/s published
over the same scheme), and for the TLS servers full and resumed handshakes per
server CPU-second under TLS 1.3 and 1.2 (bench/clients/tlshs: connect,
handshake, GET /healthz, close).

Results: bench/results/tls-STAMP.json (raw, with provenance) and .md (table).
Every load is bounded in count and time; servers are stopped by pid.

Usage: bench/tls.py [--idle-conns 10000] [--echo-conns 100] [--echo-seconds 10]
                    [--handshakes 3000] [--servers throng,throng-tls,nginx-tls,uws-tls]
                    [--only idle,echo,fanout,handshakes]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from common import free_port, stop_all, tree, wait_port  # noqa: E402  (bench/common.py)

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
THRONG = REPO / "target/release/throng"
SOURCE_IPS = "127.0.0.2-127.0.0.254"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_kb(pids: list[int], field: str = "VmRSS") -> int:
    """The processes' resident memory (VmRSS), or one part of it (RssAnon:
    what they allocated, without the binary's and libraries' pages)."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                total += int(line.split()[1])
    return total


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def median_rss(pids: list[int], samples: int = 5, field: str = "VmRSS") -> int:
    values = []
    for _ in range(samples):
        values.append(rss_kb(pids, field))
        time.sleep(0.2)
    return sorted(values)[len(values) // 2]


def go_build(name: str) -> Path:
    out = BENCH / "clients" / name / name
    subprocess.run(["go", "build", "-o", str(out), f"./{name}"], cwd=BENCH / "clients", check=True)
    return out


def make_cert(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-addext", "basicConstraints=critical,CA:FALSE",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


NGINX_CONF = """
worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
worker_rlimit_nofile 19000;
events {{ worker_connections 19000; }}
http {{
    access_log off;
    ssl_session_cache shared:SSL:10m;
    ssl_session_tickets on;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    upstream throng {{ server 127.0.0.1:{upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {{
            proxy_pass http://throng;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 3600s;
            proxy_buffering off;
        }}
    }}
}}
"""


class Server:
    """One server under test: its processes, its port, its scheme."""

    def __init__(self, name: str, work: Path, cert: Path, key: Path, threads: int):
        self.name, self.work, self.cert, self.key = name, work, cert, key
        self.procs: list[subprocess.Popen] = []
        self.port = free_port()
        self.tls = name != "throng"
        flags = ["--threads", str(threads), "--stats-interval", "0", "--idle-timeout", "0"]
        if name in ("throng", "throng-tls", "throng-base-tls"):
            extra = ["--tls-cert", str(cert), "--tls-key", str(key)] if self.tls else []
            binary = THRONG
            if name == "throng-base-tls":
                base = os.environ.get("THRONG_BASE_BIN")
                if not base or not Path(base).is_file():
                    raise SystemExit("throng-base-tls needs THRONG_BASE_BIN, the other build's binary")
                binary = Path(base)
            self.spawn([str(binary), "serve", "--listen", f"127.0.0.1:{self.port}", *flags, *extra], self.port)
        elif name == "nginx-tls":
            upstream = free_port()
            self.spawn([str(THRONG), "serve", "--listen", f"127.0.0.1:{upstream}", *flags], upstream)
            conf = work / f"nginx-{self.port}.conf"
            conf.write_text(NGINX_CONF.format(workers=threads, dir=work, upstream=upstream, port=self.port,
                                              cert=cert, key=key))
            self.spawn(["nginx", "-c", str(conf), "-g", "daemon off;"], self.port)
        elif name in ("uws-tls", "uws-hub-tls"):
            binary = BENCH / "peers/uws/bin" / ("uws-echo-tls" if name == "uws-tls" else "uws-hub-tls")
            self.spawn([str(binary), "--addr", f"127.0.0.1:{self.port}", "--cert", str(cert), "--key", str(key)],
                       self.port)
        else:
            raise SystemExit(f"unknown server {name}")

    def spawn(self, cmd: list[str], port: int) -> None:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        wait_port(port, proc, cmd[0])

    def pids(self) -> list[int]:
        return [p for proc in self.procs for p in tree(proc.pid)]

    def url(self, path: str = "/echo") -> str:
        return f"{'wss' if self.tls else 'ws'}://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        stop_all(self.procs)


def run_json(cmd: list[str], timeout: float) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-2000:]}


def measure_idle(srv: Server, wsload: Path, conns: int) -> dict:
    pids = srv.pids()
    before, anon_before = median_rss(pids), median_rss(pids, field="RssAnon")
    hold = 6.0
    cmd = [str(wsload), "-mode", "idle", "-url", srv.url(), "-conns", str(conns), "-rate", "2000",
           "-duration", f"{hold:.0f}s", "-settle", "1s", "-source-ips", SOURCE_IPS, "-rss-samples", "1"]
    if srv.tls:
        cmd += ["-ca", str(srv.cert)]
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # Sample while the connections are held: wsload opens them (rate 2000/s),
    # then holds them for `hold` seconds.
    time.sleep(conns / 2000 + 3.0)
    pids = srv.pids()
    after, anon_after = median_rss(pids), median_rss(pids, field="RssAnon")
    out, _ = client.communicate(timeout=conns / 2000 + hold + 60)
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        report = {"error": "wsload printed no JSON"}
    opened = report.get("opened", 0)
    return {
        "opened": opened, "failed": report.get("failed"), "dial_errors": report.get("dial_errors"),
        "rss_before_kb": before, "rss_after_kb": after, "processes": len(pids),
        "bytes_per_conn": round((after - before) * 1024 / opened, 1) if opened else None,
        # VmRSS counts the binary's pages too, which two builds touch differently.
        "rss_anon_before_kb": anon_before, "rss_anon_after_kb": anon_after,
        "anon_bytes_per_conn": round((anon_after - anon_before) * 1024 / opened, 1) if opened else None,
    }


def measure_echo(srv: Server, wsload: Path, conns: int, seconds: int) -> dict:
    pids = srv.pids()
    cmd = [str(wsload), "-mode", "echo", "-url", srv.url(), "-conns", str(conns), "-rate", "2000",
           "-duration", f"{seconds}s", "-warmup", "1s", "-size", "32", "-source-ips", SOURCE_IPS]
    if srv.tls:
        cmd += ["-ca", str(srv.cert)]
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # wsload opens the connections, warms up 1 s, then measures `seconds`:
    # the server's CPU is read over the middle of that window by us, for every
    # process involved (nginx and the throng behind it together).
    time.sleep(conns / 2000 + 1.5 + 1.0)
    t0, c0 = time.monotonic(), cpu_ticks(pids)
    time.sleep(seconds - 2)
    t1, c1 = time.monotonic(), cpu_ticks(pids)
    out, _ = client.communicate(timeout=seconds + 60)
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        report = {"error": "wsload printed no JSON"}
    rate = report.get("msgs_per_sec") or 0
    cpu = (c1 - c0) / CLK_TCK
    window = t1 - t0
    return {
        "wsload": {k: v for k, v in report.items() if k not in ("per_second",)},
        "server_cpu_seconds": round(cpu, 3), "window_seconds": round(window, 3),
        "cpu_us_per_message": round(cpu * 1e6 / (rate * window), 2) if rate else None,
    }


def measure_fanout(srv: Server, fanload: Path, conns: int, rate: int, seconds: int) -> dict:
    pids = srv.pids()
    cmd = [str(fanload), "-addr", f"127.0.0.1:{srv.port}", "-conns", str(conns), "-channels", "1",
           "-publish-rate", str(rate), "-duration", f"{seconds}s", "-warmup", "1s", "-settle", "1s",
           "-rate", "2000", "-source-ips", SOURCE_IPS]
    if srv.tls:
        cmd += ["-tls", "-ca", str(srv.cert)]
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # Opening (2000/s), settle 1 s, warm-up 1 s, then `seconds` of publishing:
    # the CPU of every process involved is read over the middle of that window.
    time.sleep(conns / 2000 + 1.0 + 1.0 + 1.5)
    t0, c0 = time.monotonic(), cpu_ticks(pids)
    time.sleep(seconds - 2)
    t1, c1 = time.monotonic(), cpu_ticks(pids)
    out, _ = client.communicate(timeout=seconds + conns / 1000 + 60)
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        report = {"error": "fanload printed no JSON"}
    per_sec = report.get("deliveries_per_sec") or 0
    cpu = (c1 - c0) / CLK_TCK
    keep = ("opened", "failed", "published_ok", "deliveries", "expected_deliveries", "deliveries_per_sec", "lost",
            "duplicated", "out_of_order", "latency_us", "subscribers_closed_by_server")
    return {
        "fanload": {k: report.get(k) for k in keep},
        "server_cpu_seconds": round(cpu, 3), "window_seconds": round(t1 - t0, 3),
        "cpu_us_per_delivery": round(cpu * 1e6 / (per_sec * (t1 - t0)), 3) if per_sec else None,
    }


def measure_handshakes(srv: Server, tlshs: Path, count: int) -> dict:
    out = {}
    for version in ("1.3", "1.2"):
        for resume in (False, True):
            pids = srv.pids()
            c0 = cpu_ticks(pids)
            cmd = [str(tlshs), "-addr", f"127.0.0.1:{srv.port}", "-ca", str(srv.cert), "-conns", str(count),
                   "-concurrency", "8", "-tls", version, "-source-ips", SOURCE_IPS]
            if resume:
                cmd.append("-resume")
            report = run_json(cmd, timeout=300)
            cpu = (cpu_ticks(pids) - c0) / CLK_TCK
            done = report.get("handshakes", 0)
            report["server_cpu_seconds"] = round(cpu, 3)
            report["handshakes_per_server_cpu_second"] = round(done / cpu) if cpu else None
            report["server_cpu_us_per_handshake"] = round(cpu * 1e6 / done, 1) if done else None
            out[f"tls{version}-{'resumed' if resume else 'full'}"] = report
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle-conns", type=int, default=10_000)
    ap.add_argument("--echo-conns", type=int, default=100)
    ap.add_argument("--echo-seconds", type=int, default=10)
    ap.add_argument("--handshakes", type=int, default=3000)
    ap.add_argument("--fanout-conns", type=int, default=2000)
    ap.add_argument("--fanout-rate", type=int, default=20, help="messages/s to the one channel")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--servers", default="throng,throng-tls,nginx-tls,uws-tls")
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR))
    ap.add_argument("--only", default="idle,echo,fanout,handshakes", help="the measurements to make")
    args = ap.parse_args()
    only = args.only.split(",")
    if unknown := set(only) - {"idle", "echo", "fanout", "handshakes"}:
        raise SystemExit(f"unknown measurement(s) in --only: {', '.join(sorted(unknown))}")
    prov = provenance.provenance()
    wsload, tlshs, fanload = go_build("wsload"), go_build("tlshs"), go_build("fanload")
    results: dict = {"provenance": prov, "args": vars(args), "servers": {}, "skipped": {}}
    with tempfile.TemporaryDirectory(prefix="throng-tls-bench-") as tmp:
        work = Path(tmp)
        cert, key = make_cert(work)
        for name in args.servers.split(","):
            if name == "uws-tls" and not (BENCH / "peers/uws/bin/uws-echo-tls").exists():
                results["skipped"][name] = "bench/peers/uws/bin/uws-echo-tls not built (bench/peers/uws/build.sh --tls)"
                continue
            if name == "nginx-tls" and not shutil.which("nginx"):
                results["skipped"][name] = "nginx not installed"
                continue
            row: dict = {}
            for what in ("idle", "echo", "fanout", "handshakes"):
                if what not in only:
                    continue
                if what == "handshakes" and name == "throng":
                    continue
                if what == "fanout" and name == "uws-tls" and not (BENCH / "peers/uws/bin/uws-hub-tls").exists():
                    row["fanout"] = {"skipped": "bench/peers/uws/bin/uws-hub-tls not built (build.sh --tls)"}
                    continue
                # uWebSockets' fan-out peer is its hub (its echo peer has no channels).
                srv = Server("uws-hub-tls" if (name, what) == ("uws-tls", "fanout") else name,
                             work, cert, key, args.threads)
                try:
                    if what == "idle":
                        row["idle"] = measure_idle(srv, wsload, args.idle_conns)
                    elif what == "echo":
                        row["echo"] = measure_echo(srv, wsload, args.echo_conns, args.echo_seconds)
                    elif what == "fanout":
                        row["fanout"] = measure_fanout(srv, fanload, args.fanout_conns, args.fanout_rate,
                                                       args.echo_seconds)
                    else:
                        row["handshakes"] = measure_handshakes(srv, tlshs, args.handshakes)
                except subprocess.TimeoutExpired as e:
                    row[what] = {"error": f"timed out: {e}"}
                finally:
                    srv.stop()
                print(name, what, json.dumps(row[what])[:300], file=sys.stderr)
            results["servers"][name] = row
    path = provenance.write_raw(provenance.raw_path("tls", out_dir=args.out), results, table(results))
    print(path)
    return 0


def table(results: dict) -> str:
    prov = results["provenance"]
    servers = results["servers"]
    base = servers.get("throng", {}).get("idle", {}).get("bytes_per_conn")
    lines = [
        provenance.md_header("TLS servers side by side (bench/tls.py)", prov),
        "| server | idle B/conn | beyond plain throng | echo CPU µs/msg | fan-out CPU µs/delivery | fan-out p99 ms | 1.3 full µs/hs | 1.3 resumed µs/hs | 1.2 full µs/hs | 1.2 resumed µs/hs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in servers.items():
        idle = row.get("idle", {}).get("bytes_per_conn")
        beyond = f"{idle - base:,.0f}" if idle is not None and base is not None and name != "throng" else ""
        echo = row.get("echo", {}).get("cpu_us_per_message")
        fan = row.get("fanout", {}).get("cpu_us_per_delivery")
        p99 = ((row.get("fanout", {}).get("fanload") or {}).get("latency_us") or {}).get("p99")
        hs = row.get("handshakes", {})

        def us(k):
            v = hs.get(k, {}).get("server_cpu_us_per_handshake")
            return f"{v:,.0f}" if v else ""

        # Not measured (--only) is blank; measured without a figure failed.
        idle_cell = f"{idle:,.0f}" if idle is not None else ("failed" if "idle" in row else "")
        lines.append(f"| {name} | {idle_cell} | {beyond} | {echo if echo is not None else ''} | "
                     f"{fan if fan is not None else ''} | {f'{p99 / 1000:.1f}' if p99 else ''} | "
                     f"{us('tls1.3-full')} | {us('tls1.3-resumed')} | {us('tls1.2-full')} | {us('tls1.2-resumed')} |")
    for name, why in results.get("skipped", {}).items():
        lines.append(f"| {name} | skipped: {why} | | | | | | | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
