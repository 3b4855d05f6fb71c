"""Pusher webhooks (issue 26): what throng POSTs to an app's webhook URL when its
channels fill and empty, its presence users come and go and its clients send
client events. The receiver is a real HTTP server here; every request it gets
is checked by the official Pusher server SDKs, Python's `validate_webhook` and
Node's `webhook().isValid()`, as an app's server would check it. The events
come from pusher-js clients; on two nodes through a real Redis a channel held
on both is occupied and vacated once for the cluster."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import throng_bin
from rawws import http_request
from support.pusher import APP, APP_ID, eventually, KEY, sdk, SECRET, user
from support.wait import wait_healthy
from support.webhooks import named, Receiver

# The tests that wait on the server's timers (webhook retries, the Redis keeper
# and node TTL) run them at a tenth (--test-time-scale, testing only): retries
# after 0.1 s and 0.2 s, a keeper tick of 0.1 s, a node TTL of 3 s.
TIME_SCALE = 0.1
SCALED = ("--test-time-scale", str(TIME_SCALE))
KEEPER_TICK = 1.0 * TIME_SCALE


def test_occupancy_presence_and_client_events_reach_the_webhook_signed(start_server, receiver, clients):
    srv = start_server("--pusher-app", APP, "--pusher-webhook", receiver.url, "--pusher-client-events", "on")
    ann = clients(srv.port, user=user("ann"))
    socket_ann = ann.connected()
    ann.subscribe("presence-room")
    receiver.event(named("channel_occupied", channel="presence-room"))
    receiver.event(named("member_added", channel="presence-room", user_id="ann"))
    ben = clients(srv.port, user=user("ben"))
    ben.connected()
    ben.subscribe("presence-room")
    receiver.event(named("member_added", user_id="ben"))
    ann.send(op="trigger", channel="presence-room", event="client-typing", data={"on": True})
    hook = receiver.event(named("client_event", event="client-typing"))
    assert hook == {"name": "client_event", "channel": "presence-room", "event": "client-typing",
                    "data": '{"on":true}', "socket_id": socket_ann, "user_id": "ann"}
    ben.close()
    receiver.event(named("member_removed", user_id="ben"))
    ann.close()
    receiver.event(named("member_removed", user_id="ann"))
    receiver.event(named("channel_vacated", channel="presence-room"))
    events = receiver.drain()
    names = [e["name"] for e in events]
    assert names.count("channel_occupied") == 1 and names.count("channel_vacated") == 1, events
    assert names.index("channel_occupied") < names.index("channel_vacated")
    stats = json.loads(http_request(srv.port, "GET", "/api/stats").body)
    assert stats["pusher_webhooks"]["delivered"] == len(events)
    assert stats["pusher_webhooks"]["dropped"] == 0


def test_a_failing_endpoint_is_retried_and_the_server_goes_on(start_server, clients):
    receiver = Receiver(fail_first=2)
    try:
        srv = start_server("--pusher-app", APP, "--pusher-webhook", receiver.url, *SCALED)
        c = clients(srv.port)
        c.connected()
        c.subscribe("news")
        # Serving goes on while the webhook waits out its back-off.
        sdk(srv.port).trigger("news", "tick", "1")
        assert c.event("news", "tick")["data"] == 1
        receiver.event(named("channel_occupied", channel="news"), timeout=15)
        assert receiver.answered[:3] == [500, 500, 200], receiver.answered
        metrics = http_request(srv.port, "GET", "/metrics").body.decode()
        assert "throng_pusher_webhook_retries_total 2" in metrics, metrics
        assert 'throng_pusher_webhook_events_total{outcome="delivered"} 1' in metrics
    finally:
        receiver.close()


def test_an_endpoint_that_is_down_disturbs_nothing(start_server, clients):
    srv = start_server("--pusher-app", APP, "--pusher-webhook", "http://127.0.0.1:9/nobody-listens")
    c = clients(srv.port)
    c.connected()
    for i in range(5):
        c.subscribe(f"ch{i}")
        sdk(srv.port).trigger(f"ch{i}", "e", str(i))
        assert c.event(f"ch{i}", "e")["data"] == i
    eventually(lambda: http_request(srv.port, "GET", "/metrics").body.decode(),
               lambda m: "throng_pusher_webhook_retries_total 0" not in m, timeout=10)


def test_an_apps_own_webhooks_and_settings_come_from_the_config_file(start_server, receiver, clients, tmp_path):
    config = tmp_path / "throng.toml"
    config.write_text(f"""
[[pusher-app]]
id = "{APP_ID}"
key = "{KEY}"
secret = "{SECRET}"
client-events = true
max-presence-members = 1
webhooks = [{{ url = "{receiver.url}", events = ["channel_vacated", "client_event"] }}]

[[pusher-app]]
id = "77"
key = "other-key"
secret = "other-secret"
""")
    srv = start_server("--config", str(config))
    ann = clients(srv.port, user=user("ann"))
    ann.connected()
    ann.subscribe("presence-small")
    ben = clients(srv.port, user=user("ben"))
    ben.connected()
    refused = ben.subscribe("presence-small")
    assert refused["type"] == "subscription_error", refused
    ann.send(op="trigger", channel="presence-small", event="client-hi", data="x")
    receiver.event(named("client_event", event="client-hi"))
    ann.close()
    receiver.event(named("channel_vacated", channel="presence-small"))
    names = {e["name"] for e in receiver.drain()}
    assert names == {"client_event", "channel_vacated"}, receiver.events
    # The second app has neither client events nor webhooks.
    other = clients(srv.port, key="other-key")
    other.connected()


@pytest.mark.parametrize("body,says", [
    ('webhooks = [{ url = "http://127.0.0.1:1/", events = ["occupied"] }]', "unknown webhook event 'occupied'"),
    ('webhooks = ["ftp://x"]', "webhook URL"),
    ("colour = 3", "unknown option 'colour'"),
])
def test_bad_app_settings_stop_the_server_with_the_reason(tmp_path, body, says):
    config = tmp_path / "bad.toml"
    config.write_text(f'[[pusher-app]]\nid = "1"\nkey = "k"\nsecret = "s"\n{body}\n')
    proc = subprocess.run([str(throng_bin()), "serve", "--config", str(config), "--listen", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr


def test_a_channel_on_two_nodes_is_occupied_and_vacated_once(start_server, receiver, clients, redis_args):
    # On the shared Redis under the test's own --redis-prefix: the occupiers
    # list and the node registry the keeper sweeps are this test's alone.
    flags = ("--pusher-app", APP, *redis_args, "--pusher-webhook", receiver.url, *SCALED)
    a = start_server(*flags)
    b = start_server(*flags)
    for node in (a, b):
        wait_healthy(node.port)
    on_a = clients(a.port, user=user("ann"))
    on_b = clients(b.port, user=user("ann"))
    on_a.connected()
    on_b.connected()
    on_a.subscribe("presence-both")
    receiver.event(named("channel_occupied", channel="presence-both"))
    on_b.subscribe("presence-both")
    # b's keeper writes its share within a tick: nothing more to say.
    time.sleep(5 * KEEPER_TICK)
    on_a.close()
    time.sleep(5 * KEEPER_TICK)
    on_b.close()
    receiver.event(named("channel_vacated", channel="presence-both"))
    # A node that dies holding a channel: the other vacates it for the cluster
    # once its heartbeat has expired (the node TTL, 3 s here).
    solo = clients(b.port)
    solo.connected()
    solo.subscribe("held-by-b")
    receiver.event(named("channel_occupied", channel="held-by-b"))
    b.proc.kill()
    receiver.event(named("channel_vacated", channel="held-by-b"), timeout=60)
    events = [e for e in receiver.drain() if e["channel"] == "presence-both"]
    names = [e["name"] for e in events]
    assert names.count("channel_occupied") == 1 and names.count("channel_vacated") == 1, events
    assert names.count("member_added") == 1 and names.count("member_removed") == 1, events
