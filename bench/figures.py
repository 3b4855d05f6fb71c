#!/usr/bin/env python3
"""Figures today: docs/FIGURES.md, generated from the raw results in bench/results/.

    python3 bench/figures.py            # writes docs/FIGURES.md
    python3 bench/figures.py --out F    # writes F instead (tests/python/test_figures.py)

Reads every `bench/results/*.json` (never changing one), takes from each what it
measured (one extractor per result kind, below) and where it came from (its
`provenance` block: commit, dirty, date, command), and writes one table per topic:
the figure, its ratio to every peer measured in the same file, the date, the commit
and the raw file.

Which run is "today": for each topic, scenario and figure, the newest run (by its
provenance date) that measured throng itself. Not today:
  - a file whose only servers are throng (`throng` against `throng-base`,
    `throng-base-tls`: another build; `throng1`: --threads 1): an A/B; its pairs go
    to the A/B table;
  - a run of another throng build than the one of its interleaved series: the
    build named by THRONG_BASE_BIN, a `--label before...`, a binary called
    `...base...` or `...before...`, or a `/tmp/throng-SHA` whose commit is an
    ancestor of another build measured from the same checkout (git decides).
Another throng is never a peer. Files without provenance are skipped and counted.

The output is deterministic (sorted; no time of generation), so running it again
without new results changes nothing. docs/BENCHMARKS.md says how and why each
figure was measured.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_OUT = ROOT / "docs" / "FIGURES.md"

# Server names that are throng too: another build (`throng-base`, `throng-base-tls`:
# THRONG_BASE_BIN) or another setting (`throng1`: --threads 1). One side of an A/B,
# never a peer.
def is_other_throng(name: str, subject: str) -> bool:
    return name.startswith("throng") and name != subject


@dataclass
class Measure:
    """One figure of one scenario in one raw file."""

    topic: str
    scenario: str
    figure: str
    unit: str
    throng: float
    peers: dict[str, float] = field(default_factory=dict)
    ab: dict[str, float] = field(default_factory=dict)


@dataclass
class Run:
    """One raw file: where it came from and what it measured."""

    path: str
    kind: str
    commit: str | None
    dirty: bool
    date: str
    command: str
    build: str | None  # the throng binary this run measured, when it names one
    measures: list[Measure]


def kind_of(name: str) -> str:
    return re.sub(r"-20\d{6}.*$", "", name.removesuffix(".json"))


def num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def dig(obj, *keys):
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def add(out: list[Measure], topic, scenario, figure, unit, values: dict[str, float | None], subject: str):
    """One Measure from a {server: value} map: `subject` is throng, another throng
    is the A/B side, everything else is a peer."""
    mine = values.get(subject)
    if mine is None:
        return
    peers = {n: v for n, v in values.items() if not n.startswith("throng") and v is not None}
    ab = {n: v for n, v in values.items() if is_other_throng(n, subject) and v is not None}
    out.append(Measure(topic, scenario, figure, unit, mine, peers, ab))


def by_server(servers) -> dict[str, dict]:
    if isinstance(servers, list):
        return {s["name"]: s for s in servers if isinstance(s, dict) and "name" in s}
    if isinstance(servers, dict):
        return {n: s for n, s in servers.items() if isinstance(s, dict)}
    return {}


# Topics two extractors share.
TLS_TOPIC = "TLS: wss:// and https:// (`bench/tls.py`, `bench/tls_idle.py`)"
PUSHER_TOPIC = "Pusher protocol (`bench/pusher.py`, `bench/webhooks.py`)"


# ---- extractors: one per result kind, each returns the Measures of one file ----


def engine(d) -> list[Measure]:
    out: list[Measure] = []
    srv = by_server(d.get("servers"))
    params = d.get("params", {})
    t = "Engine: idle memory, echo, handshakes (`bench/engine.sh`)"
    idle = {n: num(dig(s, "idle", "server_rss_bytes_per_conn")) for n, s in srv.items()}
    add(out, t, f"idle, {params.get('conns_idle')} connections", "server RSS per idle connection", "B", idle, "throng")
    conns = sorted({c for s in srv.values() for c in (s.get("echo") or {}) if isinstance(s.get("echo"), dict)}, key=int)
    for c in conns:
        cpu = {n: num(dig(s, "echo", c, "server_cpu_us_per_msg")) for n, s in srv.items()}
        add(out, t, f"echo, {c} connections", "server CPU per message", "µs", cpu, "throng")
    hs = {n: num(dig(s, "handshakes", "server_cpu_us_per_conn")) for n, s in srv.items()}
    add(out, t, f"handshakes, {params.get('handshake_conns')}", "server CPU per handshake", "µs", hs, "throng")
    return out


def fanout(d) -> list[Measure]:
    out: list[Measure] = []
    srv = by_server(d.get("servers"))
    t = "Fan-out over WebSocket (`bench/fanout.sh`)"
    for sc in ("A", "B", "C"):
        p = dig(d, "params", sc) or {}
        rows = {n: s.get(sc) for n, s in srv.items() if isinstance(s.get(sc), dict) and "error" not in s.get(sc)}
        if not rows:
            continue
        rate = f", {p['publish_rate']} publishes/s" if "publish_rate" in p else ""
        channels = f"{p.get('channels')} channel" + ("" if p.get("channels") == 1 else "s")
        scenario = f"{sc}: {p.get('subscribers')} subscribers on {channels}{rate}"
        if all(r.get("mode") == "idle" for r in rows.values()):
            # Scenario C holds subscribers and publishes nothing: a memory figure.
            rss = {n: num(r.get("server_rss_bytes_per_conn")) for n, r in rows.items()}
            add(out, t, scenario, "server RSS per idle subscriber", "B", rss, "throng")
            continue
        cpu = {n: num(r.get("server_cpu_us_per_delivery")) for n, r in rows.items()}
        add(out, t, scenario, "server CPU per delivery", "µs", cpu, "throng")
        p99 = {n: (num(dig(r, "latency_us", "p99")) or 0) / 1000 or None for n, r in rows.items()}
        add(out, t, scenario, "delivery latency p99", "ms", p99, "throng")
    return out


def tls(d) -> list[Measure]:
    out: list[Measure] = []
    srv = by_server(d.get("servers"))
    srv.pop("throng", None)  # plain ws:// throng: the same build without TLS, not a peer
    a = d.get("args", {})
    t = TLS_TOPIC
    s = "throng-tls"
    add(out, t, f"idle, {a.get('idle_conns')} connections", "server RSS per idle connection", "B",
        {n: num(dig(v, "idle", "bytes_per_conn")) for n, v in srv.items()}, s)
    add(out, t, f"echo, {a.get('echo_conns')} connections", "server CPU per message", "µs",
        {n: num(dig(v, "echo", "cpu_us_per_message")) for n, v in srv.items()}, s)
    fan = f"fan-out, {a.get('fanout_conns')} subscribers, {a.get('fanout_rate')} publishes/s"
    add(out, t, fan, "server CPU per delivery", "µs",
        {n: num(dig(v, "fanout", "cpu_us_per_delivery")) for n, v in srv.items()}, s)
    add(out, t, fan, "delivery latency p99", "ms",
        {n: (num(dig(v, "fanout", "fanload", "latency_us", "p99")) or 0) / 1000 or None for n, v in srv.items()}, s)
    kinds = sorted({k for v in srv.values() for k in (v.get("handshakes") or {})})
    for k in kinds:
        add(out, t, f"handshakes {k}, {a.get('handshakes')}", "server CPU per handshake", "µs",
            {n: num(dig(v, "handshakes", k, "server_cpu_us_per_handshake")) for n, v in srv.items()}, s)
    return out


def deflate(d) -> list[Measure]:
    out: list[Measure] = []
    srv = by_server(d.get("servers"))
    a = d.get("args", {})
    t = "permessage-deflate (`bench/deflate.py`)"
    base = f"{a.get('subscribers')} subscribers, {a.get('messages')} messages"
    for subject, label in (("throng-deflate", "compressed"), ("throng", "plain")):
        group = {n: v for n, v in srv.items() if n.endswith("-deflate") == (label == "compressed")}
        scenario = f"{label}, {base}"
        add(out, t, scenario, "server CPU per delivery", "µs",
            {n: num(dig(v, "summary", "server_cpu_us_per_delivery")) for n, v in group.items()}, subject)
        add(out, t, scenario, "wire bytes per delivery", "B",
            {n: num(dig(v, "summary", "wire_bytes_per_delivery")) for n, v in group.items()}, subject)
    return out


def pusher(d) -> list[Measure]:
    out: list[Measure] = []
    t = PUSHER_TOPIC
    acc: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in d.get("rounds", []):
        server, phase = r.get("server"), r.get("phase")
        body = r.get(phase) if isinstance(r.get(phase), dict) else {}
        argv = body.get("bench_argv") or []
        prefix = argv[argv.index("--channel-prefix") + 1] if "--channel-prefix" in argv[:-1] else ""
        if phase == "idle":
            scenario = f"idle, {body.get('conns')} connections on {body.get('channels')} `{prefix}` channels"
            for fig, unit, key in (("server RSS per idle connection", "B", "rss_bytes_per_conn"),
                                   ("server CPU while idle", "% of a core", "idle_cpu_pct_of_core")):
                if num(body.get(key)) is not None:
                    acc[(scenario, fig, unit)][server].append(num(body[key]))
        elif phase == "fanout":
            scenario = f"fan-out, {body.get('subscribers')} subscribers, {body.get('msg_rate')} events/s"
            for fig, unit, key, scale in (("server CPU per delivery", "µs", "cpu_us_per_delivery", 1),
                                          ("delivery latency p99", "ms", "latency_p99_us", 1000)):
                if num(body.get(key)) is not None:
                    acc[(scenario, fig, unit)][server].append(num(body[key]) / scale)
    for (scenario, fig, unit), servers in sorted(acc.items()):
        # Several rounds: the median, as docs/BENCHMARKS.md quotes them.
        add(out, t, scenario, fig, unit, {n: statistics.median(v) for n, v in servers.items()}, "throng")
    return out


def redis_scale(d) -> list[Measure]:
    out: list[Measure] = []
    t = "Past one Redis: Cluster, WAIT, failover, memory (`bench/redis_scale.py`)"
    keys = " with idempotency keys" if "--idempotency-keys" in d["provenance"].get("command", "") else ""
    for part in ("throughput", "wait"):
        setups = dig(d, part, "setups") or {}
        for name in sorted(setups):
            for mode in ("max", "paced"):
                m = dig(setups, name, mode)
                if not isinstance(m, dict):
                    continue
                scenario = f"{name}, {mode}{keys}"
                for fig, unit, key in (("publishes per second", "/s", "publishes_per_sec"),
                                       ("throng CPU per publish", "µs", "throng_cpu_us_per_publish"),
                                       ("delivery p99", "ms", "delivery_p99_ms")):
                    if mode == "paced" and key == "publishes_per_sec":
                        continue  # paced: the rate asked for, not a figure
                    add(out, t, scenario, fig, unit, {"throng": num(m.get(key))}, "throng")
    rounds = dig(d, "failover", "rounds") or []
    if rounds:
        fig = "first accepted publish after the master's kill (median of rounds)"
        add(out, t, f"failover, {len(rounds)} rounds", fig, "ms",
            {"throng": statistics.median(num(r.get("first_ok_publish_after_kill_ms")) or 0 for r in rounds)}, "throng")
        add(out, t, f"failover, {len(rounds)} rounds", "lost without a gap told", "messages",
            {"throng": sum(num(r.get("lost_untold")) or 0 for r in rounds)}, "throng")
    for p in dig(d, "memory", "points") or []:
        add(out, t, f"memory, {p.get('channels')} channels, history {p.get('history_size')}",
            "Redis memory per channel", "B", {"throng": num(p.get("bytes_per_channel"))}, "throng")
    return out


def million(d) -> list[Measure]:
    out: list[Measure] = []
    s, st = d.get("summary") or {}, d.get("settings") or {}
    t = "A million WebSockets (`bench/million.py`)"
    # Before --socket-table existed every run used the host's table: `host`.
    table = st.get("socket_table") or "host"
    scenario = f"{st.get('conns')} connections, socket table `{table}`"
    for fig, unit, key in (("connections opened", "", "connections_opened"),
                           ("server userspace memory per connection", "B", "server_userspace_bytes_per_conn"),
                           ("kernel memory per socket", "B", "kernel_bytes_per_socket"),
                           ("broadcast to all, slowest", "ms", "broadcast_to_all_max_ms"),
                           ("server CPU per delivery", "µs", "server_cpu_us_per_delivery"),
                           ("lost", "messages", "lost")):
        add(out, t, scenario, fig, unit, {"throng": num(s.get(key))}, "throng")
    return out


def workers(d) -> list[Measure]:
    st = d.get("settings") or {}
    t = "One port, several processes (`bench/workers.py`)"
    extra = (", TLS" if st.get("tls") else "") + (
        f", {st['pusher_presence_channels']} Pusher presence channels" if st.get("pusher_presence_channels") else "")
    scenario = f"{st.get('workers')} workers, {st.get('conns')} connections{extra}"
    out: list[Measure] = []
    add(out, t, scenario, "connections held", "", {"throng": num(d.get("opened"))}, "throng")
    add(out, t, scenario, "connect time for all", "s", {"throng": num(d.get("connect_secs"))}, "throng")
    add(out, t, scenario, "RSS growth per connection", "B",
        {"throng": num(dig(d, "all_held", "rss_growth_bytes_per_conn"))}, "throng")
    return out


def comet_memory(d) -> list[Measure]:
    r, out = d.get("result") or {}, []
    add(out, "SSE and long-poll memory (`bench/comet_memory.py`)",
        f"{r.get('transport')}, {r.get('conns')} held on {r.get('channels')} channels",
        "server RSS per held connection", "B", {"throng": num(r.get("rss_bytes_per_conn"))}, "throng")
    return out


def catchup(d) -> list[Measure]:
    out: list[Measure] = []
    add(out, "History: catch-up and memory (`bench/catchup.py`, `bench/history.sh`)",
        f"catch-up of {dig(d, 'settings', 'messages')} kept messages", "time to the last frame", "ms",
        {"throng": num(d.get("elapsed_ms"))}, "throng")
    return out


def history(d) -> list[Measure]:
    out: list[Measure] = []
    st = d.get("settings") or {}
    for r in d.get("runs") or []:
        rss = num(r.get("server_rss_after_kib"))
        add(out, "History: catch-up and memory (`bench/catchup.py`, `bench/history.sh`)",
            f"{st.get('messages')} messages over {st.get('channels')} channels, history {r.get('history_size')}",
            "server RSS after", "MiB", {"throng": rss / 1024 if rss else None}, "throng")
    return out


def feed_cost(d) -> list[Measure]:
    out: list[Measure] = []
    t = "What observing costs (`bench/feed_cost.py`, `bench/scrape_cost.py`)"
    sc = f"dashboard feed, {dig(d, 'settings', 'conns')} connections"
    add(out, t, sc, "feed CPU, not watched", "ms/s", {"throng": num(d.get("feed_cpu_ms_per_sec_idle"))}, "throng")
    add(out, t, sc, "feed CPU, watched", "ms/s", {"throng": num(d.get("feed_cpu_ms_per_sec_watched"))}, "throng")
    return out


def scrape_cost(d) -> list[Measure]:
    out: list[Measure] = []
    for conns, cell in sorted((d.get("cells") or {}).items(), key=lambda kv: int(kv[0])):
        for path in ("/metrics", "/healthz"):
            rounds = cell.get(path) if isinstance(cell, dict) else None
            vals = [num(r.get("cpu_us_per_request")) for r in rounds or [] if isinstance(r, dict)]
            vals = [v for v in vals if v is not None]
            if vals:
                add(out, "What observing costs (`bench/feed_cost.py`, `bench/scrape_cost.py`)",
                    f"`{path}` with {conns} WebSockets open", "server CPU per request (median of rounds)", "µs",
                    {"throng": statistics.median(vals)}, "throng")
    return out


def webhooks(d) -> list[Measure]:
    out: list[Measure] = []
    by_case: dict[str, list[float]] = defaultdict(list)
    for r in d.get("rows") or []:
        if num(r.get("server_cpu_us_per_conn")) is not None:
            by_case[str(r.get("case"))].append(num(r["server_cpu_us_per_conn"]))
    for case, vals in sorted(by_case.items()):
        add(out, PUSHER_TOPIC, f"webhooks `{case}`, {dig(d, 'settings', 'conns')} connections",
            "server CPU per connection (median of rounds)", "µs", {"throng": statistics.median(vals)}, "throng")
    return out


def tls_idle(d) -> list[Measure]:
    out: list[Measure] = []
    for r in d.get("runs") or []:
        total = r.get("total_bytes_per_conn") or {}
        add(out, TLS_TOPIC,
            f"idle TLS session on the heap, {r.get('version')} ({r.get('provider')})", "bytes per connection", "B",
            {"throng": num(total.get("throng_session")), "rustls buffered": num(total.get("rustls_buffered"))},
            "throng")
    return out


def memory_pinning(d) -> list[Measure]:
    out: list[Measure] = []
    t = "What one anonymous client can pin (`bench/memory_pinning.py`)"
    flags = " ".join(d.get("serve_flags") or [])
    add(out, t, f"chat rooms, serve `{flags}`", "RssAnon after", "KiB",
        {"throng": num(dig(d, "chat", "after_kib", "RssAnon"))}, "throng")
    add(out, t, f"stalled replays, serve `{flags}`", "RssAnon peak", "KiB",
        {"throng": num(dig(d, "replay", "peak_kib", "RssAnon"))}, "throng")
    return out


def abuse(d) -> list[Measure]:
    out: list[Measure] = []
    t = "Abuse: slowloris, floods, slow consumers (`bench/abuse.py`)"
    sl = d.get("slowloris") or {}
    add(out, t, f"slowloris, {sl.get('sockets')} sockets", "connect latency under load (median)", "ms",
        {"throng": num(dig(sl, "connect_loaded_ms", "median"))}, "throng")
    ch = d.get("churn") or {}
    add(out, t, f"churn, {ch.get('connections')} connections", "connections per second", "/s",
        {"throng": num(ch.get("rate"))}, "throng")
    return out


def publish_redis(d) -> list[Measure]:
    """One scenario per (topology, added Redis latency); a file from before
    --latency-ms and --cluster (no `topology`, no `latency_ms`) measured one Redis
    reached directly: +0 ms, no proxy."""
    out: list[Measure] = []
    t = "Publishing through Redis (`bench/publish_redis.sh`)"
    publishers = dig(d, "settings", "publishers")
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for s in d.get("servers") or []:
        if not isinstance(s, dict) or "name" not in s:
            continue
        ms = s.get("latency_ms")
        groups[(s.get("topology") or "single", ms)][s["name"]] = s
    for (topology, ms), srv in sorted(groups.items(), key=lambda kv: (kv[0][0] != "single", kv[0][1] or 0)):
        redis = "one Redis" if topology == "single" else "a 3-master Redis Cluster"
        added = "+0 ms, no proxy" if ms is None else f"+{ms} ms through Toxiproxy"
        scenario = f"{publishers} publishers, {redis}, {added}"
        for fig, unit, get in (
            ("publishes per second", "/s", lambda v: num(dig(v, "pubload", "publishes_per_s"))),
            ("publish answer p50", "ms", lambda v: (num(dig(v, "pubload", "latency_us", "p50")) or 0) / 1000 or None),
            ("publish answer p99", "ms", lambda v: (num(dig(v, "pubload", "latency_us", "p99")) or 0) / 1000 or None),
            ("Redis CPU per publish", "µs", lambda v: num(v.get("redis_cpu_us_per_publish"))),
            ("server CPU per publish", "µs", lambda v: num(v.get("server_cpu_us_per_publish"))),
        ):
            add(out, t, scenario, fig, unit, {n: get(v) for n, v in srv.items()}, "throng")
    return out


EXTRACTORS = {
    "engine": engine, "fanout": fanout, "tls": tls, "deflate": deflate, "pusher": pusher,
    "redis-scale": redis_scale, "million": million, "workers": workers, "comet-memory": comet_memory,
    "catchup": catchup, "history": history, "feed-cost": feed_cost, "scrape-cost": scrape_cost,
    "webhooks": webhooks, "tls-idle": tls_idle, "abuse": abuse,
    "memory-pinning": memory_pinning, "publish_redis": publish_redis,
}
# Kinds read but not tabulated, and why (a footnote says so).
NOT_TABULATED = {
    "sends-profile": "profiles (strace, perf): where time goes, not a figure",
    "million-tally": "a derived table of the million runs, read in docs/BENCHMARKS.md",
    "deflate-levels": "a grid of levels by message sizes for tuning `--deflate-level`, in its .md beside the .json",
}
# Kinds whose raw files all predate provenance: where the journal has their figures.
OLDER_KINDS = {
    "burst": "§18", "cluster": "§8", "million-nchan": "§18", "nchan": "§7",
    "nchan-cluster": "§9", "restart": "§8", "transports": "§7",
}
# The order of the topics on the page.
TOPIC_ORDER = ["Engine", "Fan-out", "TLS", "permessage", "A million", "Past one Redis", "Publishing through Redis",
               "Pusher", "One port",
               "SSE and", "History", "What one", "Abuse", "What observing"]


def provenance_of(d) -> dict | None:
    """The provenance block, or the same fields written at the top level (the
    memory-pinning files); None for a file from before provenance."""
    if not isinstance(d, dict):
        return None
    p = d.get("provenance")
    if isinstance(p, dict) and p.get("date") and p.get("commit"):
        return p
    if all(d.get(k) for k in ("commit", "date", "command")):
        return d
    return None


def build_of(d, prov: dict) -> str | None:
    """The throng binary a single-build run measured, when its command names one."""
    try:
        argv = shlex.split(prov.get("command", ""))
    except ValueError:
        argv = []
    if "--bin" in argv[:-1]:
        return argv[argv.index("--bin") + 1]
    for word in argv:
        if word.startswith("THRONG_BIN="):
            return word.split("=", 1)[1]
    return None


def env_of(prov: dict, name: str) -> str | None:
    m = re.search(rf"(?:^|\s){name}=(\S+)", prov.get("command", ""))
    return m.group(1) if m else None


def load(results: Path) -> tuple[list[Run], Counter, Counter]:
    runs: list[Run] = []
    skipped: Counter = Counter()
    untabulated: Counter = Counter()
    for path in sorted(results.glob("*.json")):
        kind = kind_of(path.name)
        if kind.startswith("memory-pinning"):
            kind = "memory-pinning"
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            skipped[kind] += 1
            continue
        prov = provenance_of(d)
        if prov is None:
            skipped[kind] += 1
            continue
        if kind not in EXTRACTORS:
            untabulated[kind] += 1
            continue
        try:
            measures = EXTRACTORS[kind](d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # A new shape of result: say which file, rather than leave its figures out.
            raise SystemExit(f"bench/figures.py: cannot read {path.name} as a {kind} result: {e!r}") from e
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        runs.append(Run(rel, kind, prov.get("commit"), bool(prov.get("dirty")), prov["date"],
                        prov.get("command", ""), build_of(d, prov), measures))
    return runs, skipped, untabulated


class GitCannotSay(RuntimeError):
    """git could not tell which of two builds is the older: the page would differ."""


def git_is_ancestor(old: str, new: str) -> bool:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", old, new],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise GitCannotSay(f"git merge-base --is-ancestor {old} {new}: {e}") from e
    if r.returncode not in (0, 1):  # 1: not an ancestor; anything else: git does not know
        raise GitCannotSay(f"git merge-base --is-ancestor {old} {new}: {r.stderr.strip()}")
    return r.returncode == 0


SHA_BUILD = re.compile(r"throng-([0-9a-f]{7,40})$")


def measured_another_build(run: Run, siblings: list[Run], label: str | None) -> bool:
    """True when a run measured the older build of an interleaved series."""
    build = run.build
    base = env_of_run(run, "THRONG_BASE_BIN")
    if build is None:
        return False
    if base and build == base:
        return True
    name = Path(build).name + " " + str(Path(build).parent)
    if "base" in name or "before" in name or (label or "").startswith("before"):
        return True
    m = SHA_BUILD.search(Path(build).name)
    if not m:
        return False
    mine = m.group(1)
    if run.commit and run.commit.startswith(mine):
        return False
    # Another build measured from the same checkout that descends from this one.
    others = {SHA_BUILD.search(Path(s.build).name).group(1) for s in siblings
              if s.build and SHA_BUILD.search(Path(s.build).name)}
    return any(o != mine and git_is_ancestor(mine, o) for o in sorted(others))


def env_of_run(run: Run, name: str) -> str | None:
    return env_of({"command": run.command}, name)


def label_of(run: Run) -> str | None:
    argv = run.command.split()
    return argv[argv.index("--label") + 1] if "--label" in argv[:-1] else None


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def ratio(r: float) -> str:
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


def ratios(mine: float, others: dict[str, float]) -> str:
    parts = [f"{ratio(mine / v)} {n}" for n, v in sorted(others.items()) if v]
    return ", ".join(parts) if parts else "—"


def when(run: Run) -> str:
    return run.date[:16].replace("T", " ")


def commit_cell(run: Run) -> str:
    c = f"`{run.commit[:7]}`" if run.commit else "?"
    if run.dirty:
        c += " (dirty)"
    if run.build and SHA_BUILD.search(Path(run.build).name):
        sha = SHA_BUILD.search(Path(run.build).name).group(1)
        if not (run.commit or "").startswith(sha):
            c += f", binary of `{sha[:7]}`"
    return c


def natural(text: str) -> list:
    """Sort key: numbers in a label compare as numbers (1000 before 10000)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def topic_rank(topic: str) -> tuple[int, str]:
    for i, prefix in enumerate(TOPIC_ORDER):
        if topic.startswith(prefix):
            return i, topic
    return len(TOPIC_ORDER), topic


def row(run: Run, m: Measure, figure: str) -> str:
    unit = f" {m.unit}" if m.unit else ""
    return (f"| {m.scenario} | {figure} | {fmt(m.throng)}{unit} | {ratios(m.throng, m.peers)} | "
            f"{when(run)} | {commit_cell(run)} | `{run.path}` |")


def render(runs: list[Run], skipped: Counter, untabulated: Counter) -> str:
    by_commit: dict[str | None, list[Run]] = defaultdict(list)
    for r in runs:
        by_commit[r.commit].append(r)
    older_build = Counter()
    today: dict[tuple, tuple[Run, Measure]] = {}
    # Per scenario and peer, the newest run that had that peer in it.
    beside_peer: dict[tuple, dict[str, tuple[Run, Measure]]] = defaultdict(dict)
    ab: dict[tuple, tuple[Run, Measure]] = {}
    for run in sorted(runs, key=lambda r: (r.date, r.path)):
        other = measured_another_build(run, by_commit[run.commit], label_of(run))
        if other:
            older_build[run.kind] += 1
        for m in run.measures:
            key = (m.topic, m.scenario, m.figure)
            if m.ab:
                ab[key] = (run, m)  # sorted by date: the last one kept is the newest
            if other or (m.ab and not m.peers):
                continue
            today[key] = (run, m)
            for peer in m.peers:
                beside_peer[key][peer] = (run, m)

    lines = [
        "# Figures today",
        "",
        "<!-- Generated by `python3 bench/figures.py` from bench/results/*.json. Do not edit by hand:",
        "     change a result (a new run) or the script, and run it again. -->",
        "",
        "Generated by `python3 bench/figures.py` from the raw results in `bench/results/`; do not",
        "edit it by hand (`tests/python/test_figures.py` fails when it differs from what the script",
        "writes). How and why each figure was measured, on which machine, and what changed between",
        "runs: [BENCHMARKS.md](BENCHMARKS.md), the journal.",
        "",
        "Each row is the newest run of its scenario that measured throng itself. **ratio** is",
        "throng's figure divided by each peer's in the same file (below 1: throng needs less, for",
        "CPU, memory and latency); a peer is another server (uWebSockets `uws`, Nchan, Sockudo,",
        "nginx, ...), never another throng. When an older run had a peer the newest has not,",
        "the newest run with that peer follows, marked \"an older run\". The date is the run's",
        "(UTC); the commit is the checkout it was made from, `(dirty)` when that had uncommitted",
        "changes, and the binary's commit when the run names a `/tmp/throng-SHA` build. A/B runs",
        "of throng against another throng are in the last table.",
        "",
    ]
    # Per topic: (sort key, row). Today's row first; then, newest first, a row from
    # an older run for each peer the newest run has not, so that comparison stays.
    topics: dict[str, list[tuple[tuple, str]]] = defaultdict(list)
    for key, (run, m) in today.items():
        topics[m.topic].append(((natural(key[1]), key[2], 0), row(run, m, m.figure)))
        missing = sorted({p for p in beside_peer[key] if p not in m.peers})
        older = {beside_peer[key][p][0].path: beside_peer[key][p] for p in missing}
        for n, (r, om) in enumerate(sorted(older.values(), key=lambda e: e[0].date, reverse=True), 1):
            with_peers = ", ".join(p for p in missing if p in om.peers)
            figure = f"{om.figure} (an older run, with {with_peers})"
            topics[m.topic].append(((natural(key[1]), key[2], n), row(r, om, figure)))
    for topic in sorted(topics, key=topic_rank):
        lines += [f"## {topic}", "", "| scenario | figure | throng | ratio | date | commit | raw file |",
                  "|---|---|---|---|---|---|---|"]
        lines += [text for _, text in sorted(topics[topic])]
        lines.append("")

    lines += ["## A/B: throng against another throng", "",
              "The newest A/B of each scenario: `throng` is the build and setting under test;",
              "`throng-base` and `throng-base-tls` another build (THRONG_BASE_BIN in the run's",
              "command names it), `throng1` the same build with `--threads 1`. **ratio** is",
              "throng's figure divided by the other's, in the same file.", "",
              "| topic | scenario | figure | throng | ratio | date | commit | raw file |",
              "|---|---|---|---|---|---|---|---|"]
    for key, (run, m) in sorted(ab.items(), key=lambda kv: (topic_rank(kv[0][0]), natural(kv[0][1]), kv[0][2])):
        unit = f" {m.unit}" if m.unit else ""
        short = m.topic.split(" (")[0]
        lines.append(f"| {short} | {m.scenario} | {m.figure} | {fmt(m.throng)}{unit} | {ratios(m.throng, m.ab)} | "
                     f"{when(run)} | {commit_cell(run)} | `{run.path}` |")
    lines.append("")

    lines += ["## What is not here", "",
              "Raw JSON files skipped, per kind, because they have no provenance block (made before",
              "`bench/provenance.py`, or not a raw result: a derived summary); a kind with no file",
              "left says where docs/BENCHMARKS.md has its figures:", ""]
    tabulated = {r.kind for r in runs}
    for kind, n in sorted(skipped.items()):
        where = f"; its figures: BENCHMARKS.md {OLDER_KINDS[kind]}" if kind in OLDER_KINDS and kind not in tabulated else ""
        lines.append(f"- `{kind}`: {n}{where}")
    lines.append("")
    if older_build:
        lines += ["Runs of the older build of an interleaved series, counted and never today: "
                  + ", ".join(f"`{k}` {n}" for k, n in sorted(older_build.items())) + ".", ""]
    if untabulated:
        lines += ["Kinds read but not tabulated:", ""]
        for kind, n in sorted(untabulated.items()):
            lines.append(f"- `{kind}` ({n}): {NOT_TABULATED.get(kind, 'no extractor in bench/figures.py yet')}.")
        lines.append("")
    return "\n".join(lines)


def generate(results: Path = RESULTS_DIR) -> str:
    runs, skipped, untabulated = load(results)
    return render(runs, skipped, untabulated)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write (default docs/FIGURES.md)")
    args = ap.parse_args()
    args.out.write_text(generate())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
