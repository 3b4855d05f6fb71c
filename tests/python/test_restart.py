"""Faults in a cluster lose nothing: Redis, two nodes, nginx in front, and the
bench's own subscribers over WebSocket, SSE and long-poll (bench/restart.py at a
small size). A rolling restart (each node SIGTERMed and started again), a node
SIGKILLed, and Redis SIGKILLed and started again on its append-only file: every
subscriber ends with every acknowledged seq exactly once; the ones let go come back
through nginx spread by their backoff, not all at once; while Redis is away,
publishes get 503 and nothing else fails."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import restart  # noqa: E402  (bench/restart.py)

from conftest import throng_bin  # noqa: E402


# The subscribers' longest backoff wait (the bench's --backoff-cap, 15 s by default):
# the load runs on for it (and a catch-up) after the fault, so a short one keeps the
# run short. From 500 ms it is reached on the third failed try, so the doubling is
# still exercised, and every subscriber must still come back.
BACKOFF_CAP = "2s"


def scenario(name: str) -> dict:
    args = argparse.Namespace(bin=str(throng_bin()), ws=60, sse=20, poll=10, rate=60.0, gap=6.0,
                              backoff="500ms", backoff_cap=BACKOFF_CAP, history=2000, server_args=[])
    return restart.run_scenario(args, name)


def check_exactly_once(result: dict) -> None:
    for transport, r in result["benches"].items():
        p = r["push"]
        ctx = f"{result['scenario']} {transport}: {p}"
        assert r["opened"] == result["subscribers"][transport] and r["failed"] == 0, ctx
        assert r["dropped"] == 0, ctx
        assert p["published"] > 0, ctx
        assert p["lost"] == 0 and p["duplicated"] == 0, ctx
        assert p["delivered"] == p["expected_deliveries"], ctx
        assert p["server_reported_gaps"] == 0, ctx
        assert p["comeback"]["away_at_end"] == 0, ctx


def test_rolling_restart_loses_nothing_and_every_client_comes_back():
    result = scenario("rolling")
    check_exactly_once(result)
    for transport in ("ws", "sse"):
        p = result["benches"][transport]["push"]
        cb = p["comeback"]
        ctx = f"{transport}: {cb}"
        # Every subscriber was on a restarted node at least once.
        assert cb["lost"] >= result["subscribers"][transport], ctx
        assert cb["back"] == cb["lost"], ctx
        # Nothing but "come back" signals: 1001 (WebSocket) or an ended stream (SSE).
        reasons = set(cb["reasons"])
        assert reasons <= {"closed with code 1001", "sse: the server ended the stream"}, ctx
        # Each came back by trying again, not by luck of a reconnect already open.
        assert cb["attempts"] >= cb["back"], ctx
        # How spread out the returns are (peak_attempts_per_100ms against lost) is
        # measured on this machine's clock: a client process starved for half a
        # second bunches any jitter into one slot. It is a benchmark figure that
        # bench/restart.py reports; it is not asserted here.
        assert p["publish_errors"] == 0, f"{transport}: {p['publish_errors_by_reason']}"


def test_a_node_killed_with_sigkill_its_clients_resume_on_the_other():
    result = scenario("sigkill")
    check_exactly_once(result)
    ws = result["benches"]["ws"]["push"]["comeback"]
    assert ws["lost"] > 0 and ws["back"] == ws["lost"], ws
    # Only a publish in flight on the killed node may fail (a proxy cannot retry a POST).
    for transport, r in result["benches"].items():
        assert r["push"]["publish_errors"] <= 2, f"{transport}: {r['push']['publish_errors_by_reason']}"


def test_redis_killed_and_restarted_publishes_get_503_and_nothing_is_lost():
    result = scenario("redis")
    check_exactly_once(result)
    for transport, r in result["benches"].items():
        p = r["push"]
        ctx = f"{transport}: {p['publish_errors_by_reason']}"
        assert p["publish_errors"] > 0, ctx
        assert set(p["publish_errors_by_reason"]) == {"status 503"}, ctx
    # The held WebSockets and streams stay up while Redis is away.
    for transport in ("ws", "sse"):
        cb = result["benches"][transport]["push"]["comeback"]
        assert cb["lost"] == 0, f"{transport}: {cb}"
    # Node memory stays flat through it (a few MiB of allowance for the load itself).
    for node, before in result["rss_kib_before"].items():
        assert result["rss_kib_after"][node] < before + 16 * 1024, result


@pytest.fixture(autouse=True)
def _needs_redis_and_nginx():
    for tool in ("redis-server", "nginx"):
        assert shutil.which(tool), f"{tool} is not installed (scripts/test.sh installs it)"
