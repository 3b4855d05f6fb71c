"""`throng bench push --transport ws|sse|poll` and `--reconnect`, against a real
throng server: the same completeness checks (loss, duplicates, order from seq)
over every transport, subscribers that drop and resume mid-run without losing or
doubling anything, and runs that must fail when the server cannot give back what
a resuming subscriber missed (no history).

Report fields used (src/bench/report.rs): transport, opened, failed, dropped,
errors, latency, push {published, expected_deliveries, delivered, lost,
duplicated, out_of_order, reconnects, server_reported_gaps}.
"""

from __future__ import annotations

import pytest

from rawws import channel_info
from support.bench import assert_clean, assert_latency_sane, assert_no_panic, run_bench, short

TRANSPORTS = ["ws", "sse", "poll"]


def push_run(srv, transport: str, *extra, conns: int = 12, channels: int = 3, rate: int = 150,
             prefix: str | None = None, duration: str = "2s"):
    prefix = prefix or f"bc-{transport}-"
    return run_bench(
        "push", "--url", f"{'ws' if transport == 'ws' else 'http'}://127.0.0.1:{srv.port}",
        "--transport", transport,
        "--conns", conns, "--channels", channels, "--channel-prefix", prefix,
        "--publish-rate", rate, "--grace", "1s", *extra, *short(duration=duration),
    )


def assert_complete(r: dict, conns: int, channels: int, ctx: str) -> dict:
    assert_clean(r, conns, ctx)
    p = r["push"]
    assert p["publish_errors"] == 0, ctx
    assert p["published"] > 0 and p["foreign_seqs"] == 0, ctx
    assert p["expected_deliveries"] == (conns // channels) * p["published"], ctx
    assert p["delivered"] == p["expected_deliveries"], ctx
    assert (p["lost"], p["duplicated"], p["out_of_order"]) == (0, 0, 0), ctx
    assert r["errors"] == 0 and r["lost_messages"] == 0, ctx
    assert_latency_sane(r["latency"], ctx)
    return p


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_push_over_each_transport_is_complete(start_server, transport):
    srv = start_server()
    conns, channels = 12, 3
    run = push_run(srv, transport, conns=conns, channels=channels)
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["transport"] == transport, ctx
    p = assert_complete(r, conns, channels, ctx)
    assert p["reconnects"] == 0, ctx
    # The server's own count: every publish of the run, on every channel.
    last = [channel_info(srv.port, f"bc-{transport}-{i}")["last_seq"] for i in range(channels)]
    assert sum(last) == p["published"], (last, ctx)
    # Every message received was a delivery (no events on push channels).
    assert r["messages_total"] == p["delivered"], ctx


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_reconnecting_subscribers_resume_without_loss_or_duplicates(start_server, transport):
    srv = start_server()
    conns, channels = 12, 3
    run = push_run(
        srv, transport, "--reconnect", "0.5", "--reconnect-interval", "200ms",
        conns=conns, channels=channels, rate=300,
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    p = assert_complete(r, conns, channels, ctx)
    # 6 reconnecting subscribers, each every 200 ms after the first 200 ms of 2 s.
    assert p["reconnects"] >= 20, ctx
    assert p["server_reported_gaps"] == 0, ctx


def test_reconnects_over_sse_in_child_processes(start_server):
    srv = start_server()
    conns, channels = 12, 2
    run = push_run(
        srv, "sse", "--procs", "2", "--reconnect", "0.5", "--reconnect-interval", "200ms",
        conns=conns, channels=channels, rate=200,
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["processes"] == 2, ctx
    p = assert_complete(r, conns, channels, ctx)
    assert p["reconnects"] >= 10, ctx


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_without_history_reconnects_lose_messages_and_the_run_fails(start_server, transport):
    # The check must be able to fail: with no history the server cannot give a
    # resuming subscriber what it missed, says so (gap), and the bench counts it.
    # (A long-poll loses messages between its polls too, reconnecting or not.)
    srv = start_server("--history-size", "0")
    run = push_run(
        srv, transport, "--reconnect", "1", "--reconnect-interval", "100ms",
        conns=10, channels=1, rate=500,
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 1, ctx
    r = run.report()
    p = r["push"]
    assert p["reconnects"] > 0, ctx
    assert p["lost"] > 0 and r["errors"] >= p["lost"], ctx
    assert p["server_reported_gaps"] > 0, ctx
    assert p["duplicated"] == 0, ctx


BAD = [
    (["echo", "--transport", "sse"], "--transport"),
    (["push", "--reconnect", "2"], "--reconnect"),
    (["push", "--url", "http://127.0.0.1:1"], "http://"),
    (["push", "--transport", "ws", "--seq-from", "payload", "--reconnect", "0.1"], "--seq-from payload"),
    (["push", "--transport", "carrier-pigeon"], "carrier-pigeon"),
]


@pytest.mark.parametrize("args,mentions", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_transport_flags_fail_clearly(args, mentions):
    run = run_bench(*args, "--json", timeout=15)
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode not in (0, 101), ctx
    assert mentions in run.stderr, ctx
    assert run.stdout.strip() == "", ctx


def test_poll_does_not_count_what_history_held_before_the_run(start_server):
    # A second run on the same channels: history is full of the first run's
    # messages, and the first poll of each subscriber would get them at once.
    srv = start_server()
    first = push_run(srv, "poll", "--size", "1500", conns=20, channels=2, rate=200, prefix="again-")
    assert first.returncode == 0, first.describe()
    run = run_bench(
        "push", "--url", f"http://127.0.0.1:{srv.port}", "--transport", "poll", "--rate", "0",
        "--conns", 600, "--channels", 2, "--channel-prefix", "again-", "--publish-rate", 100,
        "--size", "1500", "--grace", "1s", *short(duration="2s"),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    p = assert_complete(r, 600, 2, ctx)
    # Only this run's messages: none from before its load began.
    assert r["messages_total"] == p["delivered"], ctx
    assert r["latency"]["max_us"] < 2_000_000, ctx


def test_payload_numbering_with_several_publishers_keeps_each_channel_in_order(start_server):
    srv = start_server()
    conns, channels = 10, 2
    run = push_run(
        srv, "sse", "--seq-from", "payload", "--publishers", "4",
        conns=conns, channels=channels, rate=2000,
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    assert_complete(run.report(), conns, channels, ctx)


def test_a_refused_first_poll_is_a_failed_connection(start_server):
    srv = start_server()
    run = run_bench(
        "push", "--url", f"http://127.0.0.1:{srv.port}/no-such-path/{{channel}}",
        "--transport", "poll", "--conns", 5, *short(),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 1, ctx
    r = run.report()
    assert (r["opened"], r["failed"], r["dropped"]) == (0, 5, 0), ctx
    assert r["failures"] == {"poll: status 404": 5}, ctx
