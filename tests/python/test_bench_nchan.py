"""`throng bench push` (over SSE and WebSocket) against a server that is not throng: Nchan
(Debian's nginx-light + libnginx-mod-nchan, which scripts/test.sh installs), run
from bench/peers/nchan/nginx.conf.template on a free port as its own nginx process
and stopped by its master's pid.

Nchan has no seqs (its event ids are `<unix seconds>:<n>`), so the bench numbers
its own messages (`--seq-from payload`) and publishes to `/pub/{channel}`. Nchan
resumes an EventSource from `Last-Event-ID`, so `--reconnect` is checked there too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from procs import Nginx
from support.bench import assert_clean, assert_latency_sane, assert_no_panic, run_bench, short
from support.nginx import nchan_conf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def nchan():
    server = Nginx(nchan_conf)
    yield server
    server.stop()


CONNS, CHANNELS = 10, 2


def push_against_nchan(nchan, url: str, *extra):
    """Runs `bench push` against Nchan (the bench numbers its messages, publishes to
    /pub/{channel}) and checks every published message reached every subscriber of
    its channel once, in order; returns the report's push section."""
    run = run_bench(
        "push", "--url", url, "--seq-from", "payload",
        "--publish-url", f"http://127.0.0.1:{nchan.port}/pub/{{channel}}",
        "--publishers", "1", "--conns", CONNS, "--channels", CHANNELS, "--publish-rate", 100,
        "--grace", "1s", *extra, *short(duration="2s"),
    )
    ctx = run.describe() + "\n" + nchan.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert_clean(r, CONNS, ctx)
    p = r["push"]
    assert p["publish_errors"] == 0 and p["published"] > 0, ctx
    assert p["expected_deliveries"] == (CONNS // CHANNELS) * p["published"], ctx
    assert p["delivered"] == p["expected_deliveries"], ctx
    assert (p["lost"], p["duplicated"], p["out_of_order"]) == (0, 0, 0), ctx
    assert_latency_sane(r["latency"], ctx)
    return p, ctx


@pytest.mark.parametrize("reconnect", [False, True], ids=["steady", "reconnecting"])
def test_push_over_sse_against_nchan(nchan, reconnect):
    extra = ["--reconnect", "0.5", "--reconnect-interval", "300ms"] if reconnect else []
    p, ctx = push_against_nchan(nchan, f"http://127.0.0.1:{nchan.port}/sse/{{channel}}", "--transport", "sse", *extra)
    if reconnect:
        assert p["reconnects"] >= 10, ctx


def test_push_over_websocket_against_nchan(nchan):
    """Nchan's WebSocket subscriber sends each published body as it is, no JSON
    envelope: with `--seq-from payload` the bench counts the body itself."""
    push_against_nchan(nchan, f"ws://127.0.0.1:{nchan.port}/ws/{{channel}}")
