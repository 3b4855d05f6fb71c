"""`throng bench push|idle --protocol pusher` against `throng serve --pusher-app`:
subscribers speak Pusher Channels protocol 7 (/app/KEY, connection_established,
pusher:subscribe, subscription_succeeded, events), the publisher signs every
`POST /apps/ID/events`, and the usual completeness checks (loss, duplicates,
order from the count the payload carries) and latency hold. Private channels are
signed with the app's secret; a wrong secret is refused and the run fails.

Report fields used (src/bench/report.rs): transport, attempted, opened, failed,
dropped, failures, sockets, messages_total, errors, latency, push {published,
publish_errors, expected_deliveries, delivered, lost, duplicated, out_of_order}.
"""

from __future__ import annotations

from rawws import channel_info
from support.bench import assert_clean, assert_latency_sane, assert_no_panic, run_bench, short

APP_ID, KEY, SECRET = "1", "k", "s"
APP = f"{APP_ID}:{KEY}:{SECRET}"


def pusher_push(srv, *extra, conns: int, channels: int, rate: int, app: str = APP,
                duration: str = "1s"):
    return run_bench(
        "push", "--protocol", "pusher", "--pusher-app", app, "--url", srv.url("/"),
        "--conns", conns, "--channels", channels, "--publish-rate", rate, "--grace", "1s",
        *extra, *short(duration=duration),
    )


def assert_all_delivered(r: dict, conns: int, channels: int, ctx: str) -> dict:
    assert r["transport"] == "pusher", ctx
    assert_clean(r, conns, ctx)
    p = r["push"]
    assert p["publish_errors"] == 0 and p["publish_errors_by_reason"] == {}, ctx
    assert p["published"] > 0, ctx
    assert p["expected_deliveries"] == (conns // channels) * p["published"], ctx
    assert p["delivered"] == p["expected_deliveries"], ctx
    assert (p["lost"], p["duplicated"], p["out_of_order"]) == (0, 0, 0), ctx
    assert r["lost_messages"] == 0 and r["errors"] == 0, ctx
    # Only events count as messages: not the greeting, nor subscription_succeeded.
    assert r["messages_total"] == p["delivered"], ctx
    assert_latency_sane(r["latency"], ctx)
    return p


def test_pusher_fan_out_delivers_every_event_once_and_in_order(start_server):
    srv = start_server("--pusher-app", APP)
    conns, channels, rate = 50, 1, 20
    run = pusher_push(srv, conns=conns, channels=channels, rate=rate)
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    p = assert_all_delivered(r, conns, channels, ctx)
    # ~20 events in 1 s of load (loose: a busy machine paces imperfectly).
    assert 8 <= p["published"] <= 35, ctx
    # The server saw exactly the events the bench says it published, on the
    # app's namespace of throng's channels.
    assert channel_info(srv.port, f"{APP_ID}:bench-0")["last_seq"] == p["published"], ctx


def test_pusher_private_channels_are_signed_also_from_child_processes(start_server):
    srv = start_server("--pusher-app", APP)
    conns, channels = 20, 2
    run = pusher_push(
        srv, "--channel-prefix", "private-bp-", "--procs", 2,
        conns=conns, channels=channels, rate=30,
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["processes"] == 2, ctx
    p = assert_all_delivered(r, conns, channels, ctx)
    last = [channel_info(srv.port, f"{APP_ID}:private-bp-{i}")["last_seq"] for i in range(channels)]
    assert sum(last) == p["published"], (last, ctx)


def test_pusher_wrong_secret_is_refused_and_the_run_fails(start_server):
    srv = start_server("--pusher-app", APP)
    conns = 4
    run = pusher_push(
        srv, "--channel-prefix", "private-x-", conns=conns, channels=1, rate=10,
        app=f"{APP_ID}:{KEY}:wrong",
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 1, ctx
    r = run.report()
    assert r["opened"] == 0 and r["failed"] == conns, ctx
    # One reason for all (numbers such as socket ids are written N).
    assert len(r["failures"]) == 1, ctx
    (reason, count), = r["failures"].items()
    assert reason.startswith("pusher:subscription_error 401") and count == conns, ctx
    # The publisher signed with the wrong secret too: every publish refused.
    assert r["push"]["published"] == 0 and r["push"]["publish_errors"] > 0, ctx


def test_pusher_idle_connections_are_open_once_subscribed(start_server):
    srv = start_server("--pusher-app", APP)
    conns, channels = 30, 3
    run = run_bench(
        "idle", "--protocol", "pusher", "--pusher-app", APP, "--url", srv.url("/"),
        "--conns", conns, "--channels", channels, "--channel-prefix", "idle-", *short(),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["transport"] == "pusher", ctx
    assert_clean(r, conns, ctx)
    assert r["messages_total"] == 0 and r["errors"] == 0, ctx


def test_pusher_unknown_key_fails_every_connection_with_pushers_code(start_server):
    srv = start_server("--pusher-app", APP)
    run = run_bench(
        "idle", "--protocol", "pusher", "--pusher-app", f"{APP_ID}:nokey:{SECRET}",
        "--url", srv.url("/"), "--conns", 3, *short(),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 1, ctx
    r = run.report()
    assert r["opened"] == 0 and r["failed"] == 3, ctx
    assert len(r["failures"]) == 1, ctx
    assert next(iter(r["failures"])).startswith("pusher:error 4001"), ctx


def test_pusher_presence_channels_make_each_connection_a_member(start_server):
    """A presence- prefix: every connection joins as a user of its own (u<index>,
    signed with its channel_data), from two processes; member events are not
    counted as deliveries, the published events all arrive."""
    srv = start_server("--pusher-app", APP)
    conns, channels = 40, 2
    run = pusher_push(
        srv, "--channel-prefix", "presence-bp-", "--procs", 2,
        conns=conns, channels=channels, rate=20,
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    assert_all_delivered(run.report(), conns, channels, ctx)


def test_pusher_presence_beyond_the_member_limit_is_refused_with_the_reason(start_server):
    srv = start_server("--pusher-app", APP, "--pusher-max-presence-members", "5")
    run = pusher_push(srv, "--channel-prefix", "presence-full-", conns=8, channels=1, rate=10)
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 1, ctx
    r = run.report()
    assert r["opened"] == 5 and r["failed"] == 3, ctx
    (reason, count), = r["failures"].items()
    assert reason.startswith("pusher:subscription_error") and count == 3, ctx
