"""bench/burst.sh's client, `fanload -messages N` (Go, gorilla/websocket): a burst
of N messages published back to back to one channel, measured until every
subscriber has them. Run against throng and against Nchan (its WebSocket
subscriber and publisher locations in bench/peers/nchan/nginx.conf.template), so
the numbers the benchmark compares come from a client that counts both alike:
every accepted publish reaches every subscriber once, in order, and the server's
CPU includes nginx's worker processes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from procs import Nginx
from support.nginx import nchan_conf

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "bench/clients"


@pytest.fixture(scope="module")
def fanload(tmp_path_factory) -> Path:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = tmp_path_factory.mktemp("fanload") / "fanload"
    subprocess.run([go, "build", "-o", str(out), "./fanload"], cwd=CLIENTS, check=True, timeout=300)
    return out


def burst(fanload: Path, port: int, pid: int, subs: int, messages: int, *extra: str) -> dict:
    run = subprocess.run(
        [str(fanload), "-addr", f"127.0.0.1:{port}", "-server-pid", str(pid), "-conns", str(subs),
         "-channels", "1", "-publishers", "1", "-messages", str(messages), "-rate", "0",
         "-duration", "20s", "-grace", "10s", "-settle", "300ms", "-rss-samples", "1", *extra],
        capture_output=True, text=True, timeout=90,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def assert_every_message_everywhere(r: dict, subs: int, messages: int, ctx: str) -> None:
    assert r["mode"] == "burst", ctx
    assert r["opened"] == subs and r["failed"] == 0, ctx
    assert r["published_ok"] == messages and r["publish_failed"] == 0 and r["publish_skipped"] == 0, ctx
    assert r["expected_deliveries"] == subs * messages, ctx
    assert r["deliveries"] == subs * messages, ctx
    assert r["lost"] == 0 and r["duplicated"] == 0 and r["out_of_order"] == 0 and r["malformed"] == 0, ctx
    assert r["latency_us"]["count"] == subs * messages, ctx
    assert 0 < r["latency_us"]["p50"] <= r["latency_us"]["p99"] <= r["latency_us"]["max"], ctx
    assert r["window_seconds"] > 0 and r["deliveries_per_sec"] > 0, ctx


def test_a_burst_reaches_every_throng_subscriber(fanload, server):
    r = burst(fanload, server.port, server.proc.pid, subs=50, messages=40)
    ctx = json.dumps(r)[:3000] + "\n" + server.describe()
    assert_every_message_everywhere(r, 50, 40, ctx)
    # throng answers each publish with its seq, and it must be the client's.
    assert r["publish_seq_mismatch"] == 0, ctx


def test_kernel_receive_times_come_before_the_client_reads(fanload, server):
    """-rx-timestamps (bench/fanout.sh --rx-timestamps): every message also gets
    its latency to the kernel's receive time (SO_TIMESTAMPNS through recvmsg),
    which can only come after the publisher stamped it and before the client
    parsed it, so each of its percentiles lies between 0 and the client's."""
    r = burst(fanload, server.port, server.proc.pid, 50, 40, "-rx-timestamps")
    ctx = json.dumps(r)[:3000] + "\n" + server.describe()
    assert_every_message_everywhere(r, 50, 40, ctx)
    arrival, latency = r["arrival_us"], r["latency_us"]
    assert arrival["count"] == latency["count"] == 50 * 40, ctx
    for q in ("p50", "p90", "p99", "max"):
        assert 0 < arrival[q] <= latency[q], (q, ctx)
    # Without the flag the subscribers read as before and nothing is reported.
    plain = burst(fanload, server.port, server.proc.pid, 10, 5)
    assert "arrival_us" not in plain, json.dumps(plain)[:3000]


@pytest.fixture
def nchan():
    server = Nginx(nchan_conf)
    yield server
    server.stop()


def test_a_burst_against_nchan_counts_its_worker(fanload, nchan):
    subs, messages = 500, 100
    r = burst(fanload, nchan.port, nchan.proc.pid, subs=subs, messages=messages)
    ctx = json.dumps(r)[:3000] + "\n" + nchan.describe()
    assert_every_message_everywhere(r, subs, messages, ctx)
    # The 50,000 writes are done by nginx's worker, a child of the master whose
    # pid was given (the master itself stays idle): the server's CPU includes it.
    assert r["server_cpu_seconds"] > 0, ctx
