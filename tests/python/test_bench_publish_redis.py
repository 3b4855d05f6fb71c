"""bench/publish_redis.sh (issue 46's benchmark) in a tiny configuration: throng alone
(Centrifugo takes minutes to build; its config is the script's), +0 and +20 ms, one
Redis and a 3-master Cluster, every Redis process behind its own Toxiproxy proxy.
What a recorded run relies on (counts and causality, never speed):

- one row per (topology, latency), in order, each with publishes and no errors;
- the server was given the proxies' addresses, never the Redis processes' own, and a
  cluster row read INFO and CPU from its three masters;
- the +20 ms toxic is on the path of every publish, in the cluster too (whose slot
  map must then name the proxies): no publish can be answered before one Redis
  reply has waited 20 ms in the proxy, so the median answer is at least 20 ms
  (20, not 1: on a busy box a publish without the toxic can take 1 ms, and the
  check would then not tell a missing toxic);
- throng's loop-turn histogram is a well-formed difference (cumulative buckets that
  never go down, the last one the count) with turns in the window, and server CPU
  was counted;
- the raw JSON, its Markdown tables and bench/figures.py's reading of it agree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import throng_bin

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/publish_redis.sh"

pytestmark = [
    pytest.mark.serial,  # the bench measures CPU; and its Go builds are best not run twice at once
    pytest.mark.skipif(not all(shutil.which(t) for t in ("redis-server", "redis-cli", "go", "jq", "curl")),
                       reason="needs redis-server, redis-cli, go, jq and curl"),
]


def test_latency_and_cluster_rows(tmp_path):
    env = {**os.environ, "THRONG_BIN": str(throng_bin())}
    run = subprocess.run(
        [str(SCRIPT), "--servers", "throng", "--latency-ms", "0,20", "--cluster", "--duration", "1",
         "--publishers", "4", "--channels", "4", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    ctx = f"exit {run.returncode}\nstdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, ctx
    [path] = tmp_path.glob("publish_redis-*.json")
    doc = json.loads(path.read_text())
    assert doc["skipped"] == [], ctx
    assert doc["settings"]["latencies_ms"] == [0, 20] and doc["settings"]["topologies"] == ["single", "cluster"]

    rows = doc["servers"]
    assert [(r["name"], r["topology"], r["latency_ms"]) for r in rows] == [
        ("throng", "single", 0), ("throng", "single", 20), ("throng", "cluster", 0), ("throng", "cluster", 20)], ctx
    for r in rows:
        c = json.dumps({k: v for k, v in r.items() if k != "pubload"}) + json.dumps(
            {k: v for k, v in r["pubload"].items() if k != "redis_commandstats_delta"})
        p = r["pubload"]
        assert p["published"] > 0 and p["errors"] == 0, c
        nodes = 3 if r["topology"] == "cluster" else 1
        proxies, own = r["broker_addrs"].split(","), r["redis_addrs"].split(",")
        assert len(proxies) == len(own) == nodes and not set(proxies) & set(own), c
        scheme = "redis-cluster://" if nodes == 3 else "redis://"
        assert f"--broker {scheme}{r['broker_addrs']} " in r["command"] + " ", c
        assert p["redis_processes"] == nodes, c
        # Every publish counted in the window ran its Redis commands between the two
        # INFO reads (it started after the first and was answered before the second).
        assert sum(s["calls"] for s in p["redis_commandstats_delta"].values()) >= p["published"], c
        assert p["server_cpu_ticks"] >= 0 and p["redis_cpu_ticks"] >= 0 and p["proxy_cpu_ticks"] >= 0, c
        if r["latency_ms"] == 20:
            # pubload's histogram reports a bucket's lower edge (~1.6% below the value).
            assert p["latency_us"]["p50"] >= 20_000 * 0.98, c
        turns = p["loop_turns"]
        counts = [b["turns"] for b in turns["buckets_delta"]]
        assert turns["buckets_delta"][-1]["le"] == "+Inf" and counts == sorted(counts), c
        assert counts[0] >= 0 and counts[-1] == turns["count_delta"] > 0, c
        assert turns["slowest_secs_after"] >= turns["slowest_secs_before"] > 0, c

    md = path.with_suffix(".md").read_text()
    for topology, ms in (("single", 0), ("single", 20), ("cluster", 0), ("cluster", 20)):
        assert md.count(f"| {topology} | +{ms} | throng |") == 2, md  # the main table and the commands'
        assert md.count(f"| {topology} | +{ms} | ") >= 3, md  # and the loop turns'

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import figures
    finally:
        sys.path.pop(0)
    measures = figures.publish_redis(doc)
    scenarios = sorted({m.scenario for m in measures})
    assert scenarios == sorted([
        "4 publishers, one Redis, +0 ms through Toxiproxy", "4 publishers, one Redis, +20 ms through Toxiproxy",
        "4 publishers, a 3-master Redis Cluster, +0 ms through Toxiproxy",
        "4 publishers, a 3-master Redis Cluster, +20 ms through Toxiproxy"]), scenarios
    rate = {m.scenario: m.throng for m in measures if m.figure == "publishes per second"}
    assert rate["4 publishers, one Redis, +20 ms through Toxiproxy"] == rows[1]["pubload"]["publishes_per_s"]
