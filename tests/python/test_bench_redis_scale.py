"""bench/redis_scale.py (issue 29's benchmark) in a tiny configuration: one Redis and
a 3-master cluster, WAIT 0 and 1, one failover round, two memory points, all real
servers started and stopped by the script. What a recorded run relies on (counts and
honesty, never times):

- every load phase published through both nodes and delivered everything it
  published to every subscriber, with CPU counted for the nodes and each Redis;
- each master of the cluster ran its share of the (S)PUBLISH calls, each publish
  of the cluster an SPUBLISH and of one Redis a PUBLISH (INFO commandstats), and
  --redis-wait-replicas 1 made a WAIT per publish;
- the failover round killed the channel's master, its replica took over, the
  subscribers heard the channel again, and no acknowledged publish was lost
  without a gap event;
- a channel with history costs Redis more memory than one without;
- the same through Sentinel: the master's SIGKILL, the replica promoted and named
  by Sentinel, every subscriber told of the new epoch by a gap event and hearing
  the channel again, nothing acknowledged lost untold;
- the raw JSON and the Markdown summary are written.
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
SCRIPT = ROOT / "bench/redis_scale.py"


needs_redis = pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server is not installed")

SMALL = ["--duration", "1", "--warmup", "0.5", "--channels-per-node", "3", "--subscribers-per-channel", "2",
         "--publishers", "2", "--paced-rate", "100", "--probe-rate", "20"]


def run_bench(tmp_path, *flags: str) -> tuple[dict, str, str]:
    """Runs the script with `flags`; returns its JSON, its Markdown and a context
    string for assertion messages."""
    env = {**os.environ, "THRONG_BIN": str(throng_bin())}
    run = subprocess.run([sys.executable, str(SCRIPT), *flags, "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    ctx = f"exit {run.returncode}\nstdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, ctx
    path = Path(run.stdout.strip().splitlines()[-1])
    assert path.parent == tmp_path and path.name.startswith("redis-scale-") and path.suffix == ".json", ctx
    doc = json.loads(path.read_text())
    assert doc["provenance"]["commit"] and doc["versions"]["throng"]["sha256"], ctx
    return doc, path.with_suffix(".md").read_text(), ctx


def check_load_part(doc: dict, part: str, setups: tuple[str, str], ctx: str) -> None:
    assert list(doc[part]["setups"]) == list(setups), ctx
    for setup in setups:
        row = doc[part]["setups"][setup]
        assert "error" not in row, (setup, row.get("error"), ctx)
        for phase in ("max", "paced"):
            f = row[phase]
            c = f"{setup} {phase}: " + json.dumps({k: v for k, v in f.items() if k != "benches"})[:3000]
            assert f["connections"] == {"opened": 12, "failed": 0, "dropped": 0}, c
            d = f["deliveries"]
            assert d["published"] > 0 and d["publish_errors"] == 0, c
            assert d["delivered"] == d["expected_deliveries"] == 2 * d["published"], c
            assert d["lost"] == d["duplicated"] == 0, c
            assert f["published"] > 0 and f["probe"]["samples"] > 0, c
            assert f["cores"]["nodes"] >= 0 and f["cores"]["redis"] >= 0, c
            masters = [r for r in f["per_redis"] if r["role"] == "master"]
            assert len(masters) == (3 if setup == "cluster-3" else 1), c
            # Each publish in the window is one (S)PUBLISH on the master of its slot.
            command = "spublish" if setup == "cluster-3" else "publish"
            calls = sum(r["commands"].get(command, {}).get("calls", 0) for r in masters)
            assert calls == sum(r["publish_calls"] for r in masters) > 0, c
            if setup == "cluster-3":
                assert all(r["publish_calls"] > 0 for r in masters), c  # 6 channels over 3 masters' slots
            if setup == "wait-1":
                m = masters[0]["commands"]
                # One WAIT per publish, between its two scripts (publish.lua holds
                # the message, release.lua publishes it once WAIT confirmed it); a
                # publish in flight at either edge of the window may have one of
                # the three on the other side.
                assert abs(m["wait"]["calls"] - calls) <= 2 * 2 * 2, c
                assert abs(m["evalsha"]["calls"] - 2 * calls) <= 2 * 2 * 2, c


@needs_redis
def test_one_redis_against_a_cluster(tmp_path):
    doc, md, ctx = run_bench(tmp_path, "--parts", "throughput", *SMALL)
    check_load_part(doc, "throughput", ("redis-1", "cluster-3"), ctx)
    assert "## 1 Redis against a 3-master cluster" in md and "cluster-3 ÷ redis-1" in md, ctx


@needs_redis
def test_wait_and_memory_per_channel(tmp_path):
    doc, md, ctx = run_bench(tmp_path, "--parts", "wait,memory", *SMALL,
                             "--memory-points", "0:50,10:50")
    check_load_part(doc, "wait", ("wait-0", "wait-1"), ctx)
    assert doc["wait"]["setups"]["wait-1"]["short_waits"] == [0.0, 0.0], ctx
    replica = [r for r in doc["wait"]["setups"]["wait-0"]["max"]["per_redis"] if r["role"] == "replica"]
    assert len(replica) == 1 and replica[0]["publish_calls"] > 0, ctx  # it replays each publish

    mem = {p["history_size"]: p for p in doc["memory"]["points"]}
    assert set(mem) == {0, 10}, ctx
    for p in mem.values():
        assert "error" not in p and p["fill"]["statuses"] == {"200": 50 * max(p["history_size"], 1)}, p
    assert mem[10]["keys_per_channel"] > mem[0]["keys_per_channel"], mem
    assert mem[10]["bytes_per_channel"] > mem[0]["bytes_per_channel"] > 0, mem

    assert "## WAIT" in md and "## Redis memory per channel" in md, ctx


@needs_redis
def test_a_master_failover_loses_nothing_untold(tmp_path):
    # One round of each: a cluster master's failover, and a Sentinel failover.
    doc, md, ctx = run_bench(tmp_path, "--parts", "failover,sentinel", "--failover-rounds", "1",
                             "--failover-subscribers", "1", "--failover-after", "0.5")
    for part in ("failover", "sentinel"):
        (rnd,) = doc[part]["rounds"]
        c = part + ": " + json.dumps({k: v for k, v in rnd.items() if k != "node_log_tail"})[:4000]
        assert "error" not in rnd, c
        # Messages published after the kill reached every subscriber, so the
        # replica took over (the 20 ms role poll that times it may miss the
        # moment under load; it is a figure, not what this checks).
        assert all(x is not None for x in rnd["first_published_after_kill_ms"]), c
        assert rnd["acked"] > 0 and rnd["lost_untold"] == 0 and rnd["duplicates"] == 0, c
    se = doc["sentinel"]["rounds"][0]
    c = json.dumps({k: v for k, v in se.items() if k != "node_log_tail"})[:4000]
    assert se["sentinel_switched_after_ms"] is not None, c
    # --redis-wait-replicas 0: the promotion starts a new epoch, and every
    # subscriber (one per node) is told so.
    assert len(se["subscribers"]) == 2, c
    assert all(any(g.get("reason") == "new epoch" for g in sp["gaps"]) for sp in se["subscribers"]), c
    assert "## Failover" in md and "## Sentinel" in md, ctx
