#!/usr/bin/env python3
"""permessage-deflate side by side (issue 28), same machine, same run, same clients.

Servers (--servers, in this order by default):

  throng          throng serve, plain (the baseline of the ratios)
  throng-deflate  throng serve --permessage-deflate (plus --throng-deflate-flags)
  uws-deflate     uWebSockets' hub peer with uWS::SHARED_COMPRESSOR, every publish
                  sent compressed (bench/peers/uws/bin/uws-hub-deflate, built here
                  by bench/peers/uws/build.sh --deflate)
  uws             the plain uws-hub, for reference (build.sh)
  nchan-deflate   Nchan with nchan_deflate_message_for_websocket on
                  (bench/peers/nchan/nginx-deflate.conf.template)
  nchan           Nchan plain, for reference (bench/peers/nchan/nginx.conf.template)

Each server is started on a free loopback port (a fresh process for each of the two
measurements) and stopped by pid:

  fan-out  --subscribers WebSockets subscribe to one channel (ws://.../ws/CHANNEL),
           then --messages messages are published to it at --publish-rate/s over
           HTTP POST /api/publish/CHANNEL, one request at a time (the client
           bench/clients/fanload in its burst mode, -payload-file). The messages are
           realistic JSON of 1-2 KB, generated here from --seed: market-tick batches
           and chat-line batches (symbols, prices, sizes, timestamps, user names,
           sentences from a word list), each different, the same sequence for every
           server. The subscribers of a *-deflate row offer permessage-deflate
           (gorilla's Dialer.EnableCompression: "permessage-deflate;
           server_no_context_takeover; client_no_context_takeover"); the rows
           without, don't. Measured:
             - whether the server accepted the extension, and its exact
               Sec-WebSocket-Extensions answer (a *-deflate row whose server did not
               negotiate says so, and gives no ratio);
             - wire bytes per delivery: every byte the subscribers read from their
               sockets from the first publish to the last delivery, over the
               deliveries (frame headers included; handshakes not);
             - server CPU per delivery: utime+stime (/proc/PID/stat) of the server
               and its child processes (Nchan's workers) over the same window,
               over the deliveries;
             - deliveries received vs expected (published with a 2xx answer x
               subscribers), lost, duplicated, closed by the server, malformed;
               each message is inflated and compared whole with what was
               published (payload_mismatch; --verify-every N: every Nth
               subscriber only, the others read its first 64 bytes).
  idle     --idle-conns WebSockets held open (bench/clients/wsload -mode idle, to
           /ws/idle), offering permessage-deflate for the *-deflate rows; the RSS
           (and Pss) of all the server's processes before and after: bytes per
           idle connection, with deflate negotiated vs plain.

Ratios (the goals of issue 28): throng-deflate bytes/delivery / throng, goal <= 0.4;
throng-deflate CPU/delivery / throng, goal <= 1.15; and throng-deflate's CPU per
delivery against each peer's compressed row.

Results: bench/results/deflate-STAMP.json (raw, with provenance) and .md (table).
Every load is bounded in count and time.

The publish rate is one for all servers, what the slowest keeps up with: at 10,000
subscribers on 2 cores, uws-deflate (which deflates each message for each subscriber,
~40 us a delivery on its one thread) takes ~0.4 s per message, so 2/s; the Go client
inflating every delivery takes ~30 us a delivery of the other core.

Usage: bench/deflate.py [--subscribers 10000] [--messages 100] [--publish-rate 2]
                        [--idle-conns 10000] [--servers throng,throng-deflate,...]
Quick check (not a record): bench/deflate.py --subscribers 1000 --messages 40
                        --publish-rate 10 --idle-conns 1000
Env: THRONG_BIN (default target/release/throng; copied before the run).
"""
from __future__ import annotations

import argparse
import grp
import hashlib
import json
import os
import pwd
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from common import children, free_port, stop_all, tree, wait_port  # noqa: E402  (bench/common.py)

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
UWS = BENCH / "peers/uws"
NCHAN_TEMPLATES = {"nchan": BENCH / "peers/nchan/nginx.conf.template",
                   "nchan-deflate": BENCH / "peers/nchan/nginx-deflate.conf.template"}
SOURCE_IPS = "127.0.0.2-127.0.0.254"
CLK_TCK = os.sysconf("SC_CLK_TCK")
ALL_SERVERS = ["throng", "throng-deflate", "uws-deflate", "uws", "nchan-deflate", "nchan"]
CHANNEL = "deflate-0"
BUSY_CORES = 0.25  # other processes' CPU in a fan-out window above this: the table says the machine was busy
MIN_TICKS = 200  # a CPU ratio from fewer clock ticks (of one server, all rounds) is not judged

# ---------------------------------------------------------------- payloads

SYMBOLS = ["AAPL", "MSFT", "NVDA", "AMZN", "GOOGL", "META", "TSLA", "BRK.B", "AVGO", "JPM", "LLY", "V", "UNH",
           "XOM", "MA", "JNJ", "PG", "HD", "COST", "ABBV", "MRK", "CVX", "CRM", "AMD", "NFLX", "PEP", "KO",
           "ADBE", "TMO", "WMT", "BAC", "ACN", "MCD", "CSCO", "ABT", "LIN", "ORCL", "INTC", "DIS", "QCOM"]
VENUES = ["XNAS", "XNYS", "ARCX", "BATS", "IEXG", "EDGX"]
FIRST = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "niaj",
         "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter", "yasmin", "zoe", "omar", "lena",
         "marco", "priya", "kenji", "fatima", "lucas", "ingrid", "tomas"]
ROOMS = ["general", "trading-floor", "random", "support", "announcements", "dev-chat", "market-talk"]
WORDS = ("the a to and of in is it you that for on was with as are this be at have not but what all were we when "
         "your can said there use an each which she do how their if will up other about out many then them these "
         "so some her would make like him into time has look two more write go see number no way could people my "
         "than first water been call who oil its now find long down day did get come made may part price market "
         "buy sell order fill spread volume open close high low trend support resistance earnings report guidance "
         "rally dip breakout short long position hedge risk limit stop bid ask quote tick chart candle moving "
         "average signal alert deploy server latency websocket channel message queue broker release build test "
         "coffee lunch meeting tomorrow today tonight weekend thanks sure okay great nice agreed maybe later "
         "anyone seen news fed rates inflation jobs data yields bonds oil gold crypto bitcoin futures options "
         "calls puts expiry strike premium delta gamma theta vega").split()
REACTIONS = ["thumbs_up", "heart", "laugh", "rocket", "eyes", "fire", "check"]


MAX_PAYLOAD = 1960  # with fanload's 37-40 byte {"seq":N,"sent":NANOS, prefix: at most 2000 bytes


def fits(doc: dict, target: int) -> bool:
    """True when doc has reached target bytes (JSON), its last item dropped again
    if that made it longer than MAX_PAYLOAD."""
    n = len(json.dumps(doc, separators=(",", ":")))
    if n > MAX_PAYLOAD:
        doc["ticks" if "ticks" in doc else "messages"].pop()
        return True
    return n >= target


def generate_payloads(count: int, seed: int) -> list[str]:
    """`count` JSON objects of 1-2 KB each (compact, one line), from `seed`: batches
    of market ticks (prices walking per symbol) and of chat lines, mixed about 3:2.
    Every message differs; the redundancy is a real feed's (repeated keys, a few
    venues and symbols, prices close to the last, words from one vocabulary)."""
    rng = random.Random(seed)
    price = {s: round(rng.uniform(20, 900), 2) for s in SYMBOLS}
    volume = {s: rng.randrange(100_000, 5_000_000) for s in SYMBOLS}
    users = [f"{rng.choice(FIRST)}_{rng.randrange(10, 999)}" for _ in range(60)]
    t_ms = 1_764_190_800_000  # 2025-11-26T21:00:00Z, advancing
    msg_id = rng.randrange(1_000_000, 9_000_000)
    out = []
    for n in range(count):
        target = rng.randrange(1000, MAX_PAYLOAD)
        t_ms += rng.randrange(20, 400)
        if rng.random() < 0.6:
            venue = rng.choice(VENUES)
            doc = {"type": "ticks", "venue": venue, "batch": n + 1, "ts": t_ms, "ticks": []}
            for sym in rng.sample(SYMBOLS, len(SYMBOLS)):
                p = max(1.0, price[sym] * (1 + rng.gauss(0, 0.0008)))
                price[sym] = round(p, 2)
                spread = round(max(0.01, p * rng.uniform(0.00005, 0.0004)), 2)
                volume[sym] += rng.randrange(100, 20_000)
                tick = {"sym": sym, "bid": round(p - spread / 2, 2), "ask": round(p + spread / 2, 2),
                        "bid_size": rng.randrange(1, 50) * 100, "ask_size": rng.randrange(1, 50) * 100,
                        "last": price[sym], "volume": volume[sym],
                        "change_pct": round(rng.gauss(0, 1.2), 2), "t": t_ms - rng.randrange(0, 250)}
                doc["ticks"].append(tick)
                if fits(doc, target):
                    break
        else:
            doc = {"type": "chat", "room": rng.choice(ROOMS), "batch": n + 1, "ts": t_ms, "messages": []}
            while True:
                msg_id += rng.randrange(1, 40)
                user = rng.choice(users)
                words = [rng.choice(WORDS) for _ in range(rng.randrange(4, 28))]
                text = " ".join(words).capitalize() + rng.choice([".", "!", "?", "", " :)"])
                line = {"id": f"m-{msg_id}", "user": {"name": user, "display": user.split("_")[0].title()},
                        "text": text, "ts": t_ms - rng.randrange(0, 2000)}
                if rng.random() < 0.3:
                    line["reactions"] = {rng.choice(REACTIONS): rng.randrange(1, 12)}
                if rng.random() < 0.15:
                    line["reply_to"] = f"m-{msg_id - rng.randrange(1, 500)}"
                doc["messages"].append(line)
                if fits(doc, target):
                    break
        text = json.dumps(doc, separators=(",", ":"))
        out.append(text)
    return out


def payload_stats(lines: list[str]) -> dict:
    """Sizes of the messages as published (with fanload's {"seq":N,"sent":NANOS,
    prefix, 37-38 bytes here) and what zlib's raw deflate makes of each one alone
    (no context takeover: what a server that compresses without context
    takeover can reach), at a few levels and windows."""
    msgs = [('{"seq":%d,"sent":1764190800123456789,' % (i + 1) + s[1:]).encode() for i, s in enumerate(lines)]
    sizes = sorted(len(m) for m in msgs)

    def deflated(level: int, wbits: int) -> float:
        total = 0
        for m in msgs:
            c = zlib.compressobj(level, zlib.DEFLATED, -wbits)
            out = c.compress(m) + c.flush(zlib.Z_SYNC_FLUSH)
            total += len(out) - 4  # RFC 7692: the 00 00 ff ff tail is dropped
        return round(total / len(msgs), 1)

    return {
        "count": len(msgs), "bytes_min": sizes[0], "bytes_max": sizes[-1],
        "bytes_mean": round(sum(sizes) / len(sizes), 1), "bytes_median": sizes[len(sizes) // 2],
        "kinds": {k: sum(1 for s in lines if s.startswith('{"type":"%s"' % k)) for k in ("ticks", "chat")},
        "zlib_raw_deflate_mean_bytes": {"level1_window15": deflated(1, 15), "level6_window15": deflated(6, 15),
                                        "level9_window15": deflated(9, 15), "level6_window10": deflated(6, 10)},
    }


# ---------------------------------------------------------------- processes


def mem_kb(pids: list[int]) -> tuple[int, int]:
    """(VmRSS, Pss) summed over pids, KiB."""
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            pass
    return rss, pss


def median_mem(pids: list[int], samples: int = 5) -> tuple[int, int]:
    values = []
    for _ in range(samples):
        values.append(mem_kb(pids))
        time.sleep(0.2)
    rss = sorted(v[0] for v in values)[len(values) // 2]
    pss = sorted(v[1] for v in values)[len(values) // 2]
    return rss, pss


def run_out(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({cmd[0]}: {e})"
    return (p.stdout + p.stderr).strip()


def go_build(name: str) -> Path:
    out = BENCH / "clients" / name / name
    subprocess.run(["go", "build", "-o", str(out), f"./{name}"], cwd=BENCH / "clients", check=True)
    return out


def nchan_module() -> str | None:
    for f in ("/usr/lib/nginx/modules/ngx_nchan_module.so", "/usr/share/nginx/modules/ngx_nchan_module.so"):
        if Path(f).exists():
            return f
    return None


class Server:
    """One server under test: its processes and its port."""

    def __init__(self, name: str, work: Path, throng: Path, threads: int, throng_deflate_flags: list[str]):
        self.name = name
        self.port = free_port()
        self.procs: list[subprocess.Popen] = []
        self.log = work / f"{name}-{self.port}.log"
        if name in ("throng", "throng-deflate"):
            cmd = [str(throng), "serve", "--listen", f"127.0.0.1:{self.port}", "--threads", str(threads),
                   "--stats-interval", "0", "--idle-timeout", "0", "--ping-interval", "0"]
            if name == "throng-deflate":
                cmd += ["--permessage-deflate", *throng_deflate_flags]
        elif name in ("uws", "uws-deflate"):
            cmd = [str(UWS / "bin" / ("uws-hub-deflate" if name == "uws-deflate" else "uws-hub")),
                   "--addr", f"127.0.0.1:{self.port}"]
        elif name in NCHAN_TEMPLATES:
            d = work / f"{name}-{self.port}"
            (d / "tmp").mkdir(parents=True)
            # As root, nginx's workers would drop to `nobody`: keep the invoking user (bench/lib.sh does too).
            user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};" \
                if os.getuid() == 0 else ""
            conf = NCHAN_TEMPLATES[name].read_text()
            for k, v in {"@MODULE@": nchan_module() or "ngx_nchan_module.so", "@WORKERS@": str(threads),
                         "@PORT@": str(self.port), "@DIR@": str(d), "@USER@": user}.items():
                conf = conf.replace(k, v)
            (d / "nginx.conf").write_text(conf)
            cmd = [shutil.which("nginx") or "/usr/sbin/nginx", "-p", f"{d}/", "-c", "nginx.conf",
                   "-e", str(d / "error.log")]
            self.log = d / "error.log"
        else:
            raise SystemExit(f"unknown server {name}")
        self.cmd = cmd
        with open(work / f"{name}-{self.port}.out", "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        wait_port(self.port, proc, name, tries=150, fail=RuntimeError)
        if name in NCHAN_TEMPLATES:  # wait for the workers
            for _ in range(50):
                if len(children(proc.pid)) >= threads:
                    break
                time.sleep(0.1)

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    def pids(self) -> list[int]:
        return [p for proc in self.procs for p in tree(proc.pid)]

    def stop(self) -> None:
        stop_all(self.procs)


def last_json(out: str) -> dict:
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": "no JSON from the client"}


# ---------------------------------------------------------------- measurements


def measure_fanout(srv: Server, fanload: Path, args, payload_file: Path, deflate: bool) -> dict:
    publish_s = args.messages / args.publish_rate
    cmd = [str(fanload), "-addr", f"127.0.0.1:{srv.port}", "-conns", str(args.subscribers), "-channels", "1",
           "-channel-prefix", CHANNEL[:-1], "-messages", str(args.messages), "-publish-rate", str(args.publish_rate),
           "-publishers", "1", "-duration", f"{publish_s + 30:.0f}s", "-grace", "10s", "-settle", "1s",
           "-rate", str(args.open_rate), "-source-ips", SOURCE_IPS, "-payload-file", str(payload_file),
           "-verify-every", str(args.verify_every), "-server-pid", str(srv.pid), "-clk-tck", str(CLK_TCK),
           "-rss-samples", "1", "-label", srv.name]
    if deflate:
        cmd.append("-deflate")
    timeout = args.subscribers / args.open_rate + publish_s + 30 + 10 + 60
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    report = last_json(proc.stdout)
    if "error" in report:
        report["stderr"] = proc.stderr[-3000:]
        report["exit"] = proc.returncode
    report["client_seconds"] = round(time.monotonic() - t0, 1)
    if srv.name.startswith("throng"):
        report["throng_metrics"] = throng_deflate_metrics(srv.port)
    return report


def throng_deflate_metrics(port: int) -> dict:
    """throng's own permessage-deflate counters (GET /metrics) after a fan-out."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError as e:
        return {"error": repr(e)}
    out = {}
    for line in text.splitlines():
        if line.startswith(("throng_deflate_plain_bytes_total", "throng_deflate_wire_bytes_total")):
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def measure_idle(srv: Server, wsload: Path, conns: int, rate: int, deflate: bool, hold: float) -> dict:
    pids = srv.pids()
    before = median_mem(pids)
    cmd = [str(wsload), "-mode", "idle", "-url", f"ws://127.0.0.1:{srv.port}/ws/idle", "-conns", str(conns),
           "-rate", str(rate), "-duration", f"{hold:.0f}s", "-settle", "1s", "-source-ips", SOURCE_IPS,
           "-rss-samples", "1"]
    if deflate:
        cmd.append("-deflate")
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # wsload opens the connections (at `rate`/s), then holds them `hold` seconds:
    # sample (1 s) in that hold.
    time.sleep(conns / rate + min(2.5, hold - 1.5))
    pids = srv.pids()
    after = median_mem(pids)
    try:
        out, err = client.communicate(timeout=conns / rate + hold + 60)
    except subprocess.TimeoutExpired:
        client.kill()
        out, err = client.communicate()
    report = last_json(out)
    opened = report.get("opened", 0)
    res = {
        "opened": opened, "failed": report.get("failed"), "dial_errors": report.get("dial_errors"),
        "closed_by_peer_during_hold": report.get("closed_by_peer_during_hold"),
        "deflate": report.get("deflate"), "processes": len(pids),
        "rss_before_kb": before[0], "rss_after_kb": after[0], "pss_before_kb": before[1], "pss_after_kb": after[1],
        "rss_bytes_per_conn": round((after[0] - before[0]) * 1024 / opened, 1) if opened else None,
        "pss_bytes_per_conn": round((after[1] - before[1]) * 1024 / opened, 1) if opened else None,
    }
    if "error" in report:
        res["error"] = report["error"]
        res["stderr"] = err[-2000:]
    return res


def fanout_summary(name: str, f: dict) -> dict:
    """The figures of one fan-out run the table and the ratios use."""
    deflate_row = name.endswith("-deflate")
    d = f.get("deflate") or {}
    opened = f.get("opened") or 0
    negotiated = d.get("negotiated", 0) if deflate_row else None
    payload = f.get("payload_bytes_mean")
    wire = f.get("wire_bytes_per_delivery")
    s = {
        "opened": opened, "deliveries": f.get("deliveries"), "expected": f.get("expected_deliveries"),
        "lost": f.get("lost"), "closed_by_server": f.get("subscribers_closed_by_server"),
        "malformed": f.get("malformed"), "payload_mismatch": f.get("payload_mismatch"),
        "verified": f.get("verified_deliveries"), "read_errors": f.get("read_errors"),
        "published_ok": f.get("published_ok"), "publish_failed": f.get("publish_failed"),
        "publish_skipped": f.get("publish_skipped"),
        "payload_bytes_mean": payload, "wire_bytes_per_delivery": round(wire, 1) if wire else None,
        "server_cpu_seconds": f.get("server_cpu_seconds"),
        "server_cpu_ticks": round((f.get("server_cpu_seconds") or 0) * CLK_TCK),
        # the kernel's part (stime): on loopback it includes much of the sockets' work
        "server_cpu_sys_us_per_delivery": round(f["server_cpu_sys_seconds"] * 1e6 / f["deliveries_in_window"], 3)
        if f.get("server_cpu_sys_seconds") is not None and f.get("deliveries_in_window") else None,
        # 0 when the window was shorter than a clock tick of CPU (tiny runs)
        "server_cpu_us_per_delivery": round(float(f["server_cpu_us_per_delivery"]), 3)
        if f.get("server_cpu_us_per_delivery") is not None and f.get("deliveries") else None,
        "window_seconds": round(f.get("window_seconds") or 0, 2),
        "latency_us": f.get("latency_us"),
        "latency_p50_ms": round(f["latency_us"]["p50"] / 1000, 1) if f.get("latency_us") else None,
        "latency_p99_ms": round(f["latency_us"]["p99"] / 1000, 1) if f.get("latency_us") else None,
        # CPU of the machine's other processes in the window (other sessions on a shared machine)
        "other_cores": round(f["other_cores"], 2) if f.get("other_cores") is not None else None,
        "client_cpu_us_per_delivery": round(f["client_cpu_us_per_delivery"], 2)
        if f.get("client_cpu_us_per_delivery") is not None else None,
        "extensions": d.get("extensions") if deflate_row else None,
        # throng's own counters over the server's life (the fan-out's subscribers only)
        "metrics_wire_bytes": (f.get("throng_metrics") or {}).get("throng_deflate_wire_bytes_total"),
        "metrics_plain_bytes": (f.get("throng_metrics") or {}).get("throng_deflate_plain_bytes_total"),
        "negotiated": negotiated,
    }
    problems = []
    if deflate_row:
        if not negotiated:
            problems.append("permessage-deflate NOT negotiated: plain figures")
        elif negotiated < opened:
            problems.append(f"permessage-deflate negotiated on {negotiated} of {opened} only")
        elif wire and payload and wire >= payload:
            problems.append("negotiated, but the frames were not smaller than the payload (not compressed?)")
    if f.get("error"):
        problems.append(f"error: {f['error']}")
    if s["expected"] is not None and s["deliveries"] is not None and (s["lost"] or s["deliveries"] < s["expected"]):
        problems.append(f"lost {s['lost']} of {s['expected']}")
    for k in ("closed_by_server", "malformed", "payload_mismatch", "publish_failed", "publish_skipped"):
        if s.get(k):
            problems.append(f"{k.replace('_', ' ')}: {s[k]}")
    if s["read_errors"]:
        problems.append(f"read errors: {s['read_errors']}")
    # When every delivery went compressed (throng's plain-equivalent count is each
    # payload plus its 4-byte header, per delivery) and there were no pings, throng's
    # count of the compressed frames' bytes is the bytes its subscribers read.
    all_compressed = (s["metrics_plain_bytes"] is not None and f.get("published_bytes_ok") and not s["lost"]
                      and s["metrics_plain_bytes"] == f["published_bytes_ok"] * opened + 4 * (s["deliveries"] or 0))
    if name == "throng-deflate" and negotiated == opened and all_compressed and f.get("wire_bytes_read") \
            and s["metrics_wire_bytes"] != f["wire_bytes_read"]:
        problems.append(f"throng_deflate_wire_bytes_total {s['metrics_wire_bytes']:.0f} != "
                        f"{f['wire_bytes_read']} bytes read by the subscribers")
    if opened < (f.get("conns_requested") or 0):
        problems.append(f"opened {opened} of {f.get('conns_requested')}")
    s["problems"] = problems
    # The figures are usable for a ratio when the row is what it says it is.
    s["comparable"] = bool(opened and s["deliveries"] and not (deflate_row and (not negotiated or negotiated < opened)))
    return s


def median(values: list) -> float | None:
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def merge_rounds(rounds: list[dict]) -> dict:
    """One server's fan-out rounds as one summary: counts summed, the per-delivery
    figures the median of the rounds (each round's kept under "rounds"), every
    round's problems (prefixed by its number when there are several)."""
    if len(rounds) == 1:
        return {**rounds[0], "rounds": 1}
    out = dict(rounds[-1])
    for k in ("opened", "deliveries", "expected", "lost", "closed_by_server", "malformed", "payload_mismatch",
              "verified", "published_ok", "publish_failed", "publish_skipped", "negotiated", "server_cpu_ticks",
              "metrics_wire_bytes", "metrics_plain_bytes"):
        vals = [r.get(k) for r in rounds]
        out[k] = None if all(v is None for v in vals) else sum(v or 0 for v in vals)
    for k in ("wire_bytes_per_delivery", "server_cpu_us_per_delivery", "server_cpu_sys_us_per_delivery",
              "payload_bytes_mean", "window_seconds", "latency_p50_ms", "latency_p99_ms", "other_cores",
              "client_cpu_us_per_delivery"):
        m = median([r.get(k) for r in rounds])
        out[k] = round(m, 3) if m is not None else None
        out[k + "_rounds"] = [r.get(k) for r in rounds]
    exts: dict = {}
    for r in rounds:
        for e, n in (r.get("extensions") or {}).items():
            exts[e] = exts.get(e, 0) + n
    out["extensions"] = exts or rounds[-1].get("extensions")
    out["read_errors"] = [r.get("read_errors") for r in rounds if r.get("read_errors")] or None
    out["latency_us"] = [r.get("latency_us") for r in rounds]
    out["problems"] = [f"round {i + 1}: {p}" for i, r in enumerate(rounds) for p in r["problems"]]
    out["comparable"] = all(r["comparable"] for r in rounds)
    out["rounds"] = len(rounds)
    return out


def ratios(summaries: dict) -> dict:
    out: dict = {}

    def ratio(a: str, b: str, key: str) -> float | None:
        x, y = summaries.get(a), summaries.get(b)
        if not x or not y or not x["comparable"] or not y["comparable"] or not x[key] or not y[key]:
            return None
        return round(x[key] / y[key], 3)

    out["throng-deflate/throng bytes per delivery"] = {
        "value": ratio("throng-deflate", "throng", "wire_bytes_per_delivery"), "goal": "<= 0.4"}
    out["throng-deflate/throng CPU per delivery"] = {
        "value": ratio("throng-deflate", "throng", "server_cpu_us_per_delivery"), "goal": "<= 1.15"}
    for peer in ("uws-deflate", "nchan-deflate"):
        if peer in summaries:
            out[f"throng-deflate/{peer} CPU per delivery"] = {
                "value": ratio("throng-deflate", peer, "server_cpu_us_per_delivery"), "goal": None}
            out[f"throng-deflate/{peer} bytes per delivery"] = {
                "value": ratio("throng-deflate", peer, "wire_bytes_per_delivery"), "goal": None}
    for k, v in out.items():
        if v["goal"] and v["value"] is not None:
            v["met"] = v["value"] <= float(v["goal"].split()[-1])
        if "CPU" in k and v["value"] is not None:
            a, b = k.split(" ")[0].split("/")
            if min(summaries[a]["server_cpu_ticks"], summaries[b]["server_cpu_ticks"]) < MIN_TICKS:
                v["note"] = f"under {MIN_TICKS} clock ticks of server CPU: too short a run to judge"
                v.pop("met", None)
    return out


# ---------------------------------------------------------------- main


def versions(throng: Path, names: list[str]) -> dict:
    v = {"throng": provenance.binary(throng), "go": run_out(["go", "version"]),
         "gorilla_websocket": next((line.split()[-1] for line in (BENCH / "clients/go.mod").read_text().splitlines()
                                    if "gorilla/websocket" in line), None)}
    if any(n.startswith("uws") for n in names):
        v["uws"] = run_out([str(UWS / "build.sh"), "--version"])
        v["uws-deflate"] = run_out([str(UWS / "build.sh"), "--deflate", "--version"])
    if any(n.startswith("nchan") for n in names):
        v["nginx"] = run_out([shutil.which("nginx") or "/usr/sbin/nginx", "-v"])
        v["nchan"] = run_out(["dpkg-query", "-W", "-f", "${Package} ${Version}", "libnginx-mod-nchan"])
    return v


def main() -> int:
    class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    ap.add_argument("--servers", default=",".join(ALL_SERVERS),
                    help=f"comma-separated, from {','.join(ALL_SERVERS)}")
    ap.add_argument("--subscribers", type=int, default=10_000, help="fan-out: WebSocket subscribers of the channel")
    ap.add_argument("--messages", type=int, default=100, help="fan-out: messages published (bounded count)")
    ap.add_argument("--publish-rate", type=float, default=2.0,
                    help="fan-out: messages per second (one request at a time; see above)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="fan-out rounds per server, the servers in turn; per-delivery figures are the median "
                         "of the rounds (one round's CPU figure varies by some 5-10%% on this machine)")
    ap.add_argument("--idle-conns", type=int, default=10_000, help="idle: connections held for the RSS figure")
    ap.add_argument("--idle-hold", type=float, default=6.0,
                    help="idle: seconds the connections are held once open (the RSS is sampled in it)")
    ap.add_argument("--open-rate", type=int, default=2000, help="connections opened per second")
    ap.add_argument("--verify-every", type=int, default=1,
                    help="every Nth subscriber inflates and compares each message whole; the others read 64 bytes")
    ap.add_argument("--seed", type=int, default=28, help="seed of the payload sequence")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                    help="throng --threads and Nchan's worker_processes (uWS: one thread)")
    ap.add_argument("--throng-deflate-flags", default="",
                    help="more throng serve flags for throng-deflate, e.g. '--deflate-level 1'")
    ap.add_argument("--skip", default="", help="measurements to leave out: idle and/or fanout (comma-separated)")
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR), help="results directory")
    ap.add_argument("--write-payloads", metavar="FILE",
                    help="only write the payload sequence (one JSON per line) to FILE and exit")
    args = ap.parse_args()

    if args.write_payloads:
        Path(args.write_payloads).write_text("\n".join(generate_payloads(args.messages, args.seed)) + "\n")
        return 0
    names = [n for n in args.servers.split(",") if n]
    for n in names:
        if n not in ALL_SERVERS:
            ap.error(f"unknown server {n!r} (known: {','.join(ALL_SERVERS)})")
    skip = {s for s in args.skip.split(",") if s}
    if skip - {"idle", "fanout"}:
        ap.error("--skip takes idle and/or fanout")
    if not (1 <= args.subscribers <= 19000 and 1 <= args.idle_conns <= 19000):
        ap.error("--subscribers and --idle-conns must be 1..19000 (one client process each)")
    if not (1 <= args.messages <= 100_000 and 0 < args.publish_rate <= 10_000):
        ap.error("--messages must be 1..100000 and --publish-rate 0..10000")
    if not 1 <= args.rounds <= 10:
        ap.error("--rounds must be 1..10")
    if not 3 <= args.idle_hold <= 60:
        ap.error("--idle-hold must be 3..60 s")
    if args.messages / args.publish_rate > 600:
        ap.error("--messages / --publish-rate must be at most 600 s")

    prov = provenance.provenance()
    throng_src = Path(os.environ.get("THRONG_BIN", REPO / "target/release/throng"))
    results: dict = {"provenance": prov, "args": vars(args), "servers": {}, "skipped": {}}
    fanload, wsload = go_build("fanload"), go_build("wsload")
    with tempfile.TemporaryDirectory(prefix="throng-deflate-bench-") as tmp:
        work = Path(tmp)
        throng = work / "throng"
        if throng_src.exists():
            shutil.copy2(throng_src, throng)  # the real one may be rebuilt meanwhile
        results["versions"] = versions(throng if throng.exists() else throng_src, names)
        lines = generate_payloads(args.messages, args.seed)
        payload_file = work / "payloads.jsonl"
        payload_file.write_text("\n".join(lines) + "\n")
        results["payloads"] = {"seed": args.seed, "sha256": hashlib.sha256(payload_file.read_bytes()).hexdigest(),
                               "first": lines[0][:300], **payload_stats(lines)}
        serve_help = run_out([str(throng), "serve", "--help"]) if throng.exists() else ""
        if any(n.startswith("uws") for n in names):
            for flag, n in (([], "uws"), (["--deflate"], "uws-deflate")):
                if n in names:
                    b = subprocess.run([str(UWS / "build.sh"), *flag], capture_output=True, text=True)
                    if b.returncode != 0:
                        results["skipped"][n] = f"bench/peers/uws/build.sh {' '.join(flag)} failed: {b.stderr[-300:]}"
        runnable = []
        for name in names:
            if name in results["skipped"]:
                continue
            if name.startswith("throng") and not throng.exists():
                results["skipped"][name] = f"{throng_src} not found (cargo build --release)"
            elif name == "throng-deflate" and "--permessage-deflate" not in serve_help:
                results["skipped"][name] = "this throng serve has no --permessage-deflate"
            elif name.startswith("nchan") and not (shutil.which("nginx") and nchan_module()):
                results["skipped"][name] = ("nginx or the Nchan module not installed "
                                            "(apt-get install nginx-light libnginx-mod-nchan)")
            else:
                runnable.append(name)
                results["servers"][name] = {}
        # Idle once per server, then the fan-out --rounds times, the servers in turn
        # in each round (a disturbance of the machine spreads over all of them).
        plan = [(name, "idle", 0) for name in runnable if "idle" not in skip]
        if "fanout" not in skip:
            plan += [(name, "fanout", k) for k in range(args.rounds) for name in runnable]
        for name, what, k in plan:
            row = results["servers"][name]
            deflate = name.endswith("-deflate")
            try:
                srv = Server(name, work, throng, args.threads, shlex.split(args.throng_deflate_flags))
            except RuntimeError as e:
                out = {"error": str(e)}
            else:
                row.setdefault("command", srv.cmd)
                try:
                    if what == "idle":
                        out = measure_idle(srv, wsload, args.idle_conns, args.open_rate, deflate, args.idle_hold)
                    else:
                        out = measure_fanout(srv, fanload, args, payload_file, deflate)
                except subprocess.TimeoutExpired as e:
                    out = {"error": f"timed out: {e}"}
                finally:
                    srv.stop()
                    try:
                        log = srv.log.read_text(errors="replace") if srv.log.exists() else ""
                    except OSError:
                        log = ""
                    if log.strip():
                        row.setdefault("server_log_tail", {})[f"{what}-{k}"] = log[-1500:]
            if what == "idle":
                row["idle"] = out
            else:
                row.setdefault("fanout_rounds", []).append(out)
                row["summary"] = merge_rounds([fanout_summary(name, f) for f in row["fanout_rounds"]])
            print(name, what, k, json.dumps(row["summary"] if what == "fanout" else out)[:400], file=sys.stderr)
    results["ratios"] = ratios({n: r["summary"] for n, r in results["servers"].items() if "summary" in r})
    path = provenance.write_raw(provenance.raw_path("deflate", out_dir=args.out), results, table(results))
    print(table(results))
    print(path)
    return 0


def fmt(v, digits: int = 1) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def table(results: dict) -> str:
    prov, args, p = results["provenance"], results["args"], results.get("payloads", {})
    z = p.get("zlib_raw_deflate_mean_bytes", {})
    lines = [
        provenance.md_header("permessage-deflate side by side (bench/deflate.py)", prov),
        f"- fan-out: {args['subscribers']:,} subscribers of one channel, {args['messages']} messages at "
        f"{args['publish_rate']:g}/s (HTTP POST, one at a time); idle: {args['idle_conns']:,} connections; "
        f"throng --threads / Nchan workers {args['threads']}; {args['rounds']} fan-out round(s) per server, "
        "the servers in turn (per-delivery figures: the median of the rounds, CPU range in brackets)"
        + (f"; throng-deflate also `{args['throng_deflate_flags']}`" if args.get("throng_deflate_flags") else ""),
        f"- payloads: seed {p.get('seed')}, {p.get('count')} JSON messages ({p.get('kinds')}), "
        f"{p.get('bytes_min')}-{p.get('bytes_max')} B, mean {p.get('bytes_mean')} B; zlib raw deflate of each alone: "
        f"level 1 {z.get('level1_window15')} B, level 6 {z.get('level6_window15')} B, "
        f"level 6 window 2^10 {z.get('level6_window10')} B (mean)",
        "- wire B/delivery: bytes the subscribers read (frames, after the handshake) / deliveries; "
        "CPU: utime+stime of the server's processes from the first publish to the last delivery / deliveries "
        "(sys: the stime part; on loopback it carries much of the sockets' work)",
        "- latency: publish to read by the Go client (which inflates every message: ~25 µs a delivery for it, "
        "~9 plain); other load: CPU cores used by the machine's other processes in the window "
        "(other sessions on a shared machine)",
        "",
        "| server | deflate | delivered / expected | wire B/delivery | ÷ payload | server CPU µs/delivery | "
        "of which sys | latency p50 / p99 ms | other load | idle B/conn (RSS) | idle B/conn (Pss) | problems |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in results["servers"].items():
        s = row.get("summary", {})
        idle = row.get("idle", {})
        if name.endswith("-deflate"):
            neg = s.get("negotiated") if s else (idle.get("deflate") or {}).get("negotiated")
            opened = s.get("opened") if s else idle.get("opened")
            deflate = "no" if not neg else ("yes" if neg == opened else f"{neg} of {opened}")
        else:
            deflate = "not offered"
        payload, wire = s.get("payload_bytes_mean"), s.get("wire_bytes_per_delivery")
        problems = list(s.get("problems", []))
        if idle.get("error"):
            problems.append(f"idle: {idle['error']}")
        if idle.get("failed"):
            problems.append(f"idle: {idle['failed']} dials failed")
        if name.endswith("-deflate") and idle.get("deflate") and idle["deflate"].get("negotiated") != idle.get("opened"):
            problems.append(f"idle: deflate negotiated on {idle['deflate'].get('negotiated')} of {idle.get('opened')}")
        cpu = fmt(s.get("server_cpu_us_per_delivery"), 2)
        spread = [v for v in s.get("server_cpu_us_per_delivery_rounds") or [] if v is not None]
        if len(spread) > 1:
            cpu += f" ({min(spread):.2f}-{max(spread):.2f})"
        lines.append(
            f"| {name} | {deflate} | {fmt(s.get('deliveries'))} / {fmt(s.get('expected'))} | {fmt(wire)} | "
            f"{fmt(wire / payload, 3) if wire and payload else ''} | {cpu} | "
            f"{fmt(s.get('server_cpu_sys_us_per_delivery'), 2)} | "
            f"{fmt(s.get('latency_p50_ms'), 0)} / {fmt(s.get('latency_p99_ms'), 0)} | {fmt(s.get('other_cores'), 2)} | "
            f"{fmt(idle.get('rss_bytes_per_conn'), 0)} | {fmt(idle.get('pss_bytes_per_conn'), 0)} | "
            f"{'; '.join(problems)} |")
    for name, why in results.get("skipped", {}).items():
        lines.append(f"| {name} | skipped: {why} | | | | | | | | | | |")
    busy = {n: r["summary"]["other_cores"] for n, r in results["servers"].items()
            if (r.get("summary") or {}).get("other_cores") and r["summary"]["other_cores"] > BUSY_CORES}
    if busy:
        lines += ["", "**The machine was not quiet**: other processes used "
                  + ", ".join(f"{v:.2f} cores during {n}'s fan-out" for n, v in busy.items())
                  + " (median of the rounds). The CPU figures are less reliable; a record wants a quiet machine."]
    lines += ["", "| ratio | value | goal |", "|---|---:|---|"]
    for k, v in results.get("ratios", {}).items():
        met = "" if v.get("met") is None else (" (met)" if v["met"] else " (NOT met)")
        met += f" ({v['note']})" if v.get("note") else ""
        lines.append(f"| {k} | {fmt(v['value'], 3) if v['value'] is not None else 'n/a'} | "
                     f"{(v['goal'] or '') + met} |")
    td = results["servers"].get("throng-deflate", {}).get("summary")
    if td and td.get("metrics_wire_bytes") is not None and td.get("deliveries"):
        lines += ["", f"throng-deflate's own counters: throng_deflate_wire_bytes_total / deliveries = "
                      f"{td['metrics_wire_bytes'] / td['deliveries']:,.1f} B (the subscribers read "
                      f"{fmt(td.get('wire_bytes_per_delivery'))}), throng_deflate_plain_bytes_total / deliveries = "
                      f"{(td.get('metrics_plain_bytes') or 0) / td['deliveries']:,.1f} B"]
    lines += ["", "Extension answers (Sec-WebSocket-Extensions of the 101, to the offer "
              "`permessage-deflate; server_no_context_takeover; client_no_context_takeover`; "
              "subscriber connections of all rounds):", ""]
    for name, row in results["servers"].items():
        if name.endswith("-deflate"):
            ext = (row.get("summary") or {}).get("extensions") or (row.get("idle", {}).get("deflate") or {}).get("extensions")
            lines.append(f"- {name}: " + (", ".join(f"`{k}` ×{v:,}" for k, v in ext.items()) if ext else "n/a"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
