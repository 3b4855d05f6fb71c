"""The cluster as deployed: Redis, two throng nodes on it, and nginx in front with
deploy/nginx.conf (its upstream pointed at the two nodes; ip_hash taken out, since
every test client comes from 127.0.0.1 and would land on one node; round-robin
spreads them over both). Subscribers over WebSocket, SSE and long-poll through
nginx, publishes through nginx and straight to each node: every subscriber gets
every message exactly once, in order, with the same seq everywhere."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from procs import Nginx
from rawws import channel_info, http_request, publish_ok
from support.streams import poll
from support.wait import wait_healthy, wait_until
from support.streams import EventReader
from wsutil import recv_json, run, ws_connect
from support.nginx import fronting

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CONF = ROOT / "deploy/nginx.conf"


@pytest.fixture
def fronted(start_server, shared_redis):
    a = start_server("--broker", shared_redis.url)
    b = start_server("--broker", shared_redis.url)
    for node in (a, b):
        wait_healthy(node.port)
    proxy = Nginx(fronting([a.port, b.port]))
    yield a, b, proxy
    proxy.stop()


def test_every_transport_through_nginx_gets_everything_once_in_order(fronted, prefix):
    a, b, proxy = fronted
    n = 30
    feed = f"{prefix}feed"  # the Redis is shared: a channel no other test names

    async def main():
        url = f"ws://127.0.0.1:{proxy.port}/ws/{feed}?format=json"
        sockets = [await ws_connect(url) for _ in range(4)]
        readers = [EventReader(f"http://127.0.0.1:{proxy.port}/sse/{feed}") for _ in range(4)]
        try:
            # Round-robin put them on both nodes.
            wait_until(lambda: channel_info(a.port, feed)["subscribers"] == 8, timeout=5, what="8 subscribers")
            local = [
                http_request(node.port, "GET", "/api/stats").json()["connections"] for node in (a, b)
            ]
            assert all(c["websocket"] > 0 and c["sse"] > 0 for c in local), local
            polled: list[dict] = []
            poller = threading.Thread(target=lambda: polled.extend(poll_all(proxy.port, feed, n)))
            poller.start()
            seqs = []
            for i in range(n):
                port = (proxy.port, a.port, b.port)[i % 3]
                seqs.append(publish_ok(port, feed, f"m{i}"))
            assert seqs == list(range(1, n + 1)), seqs
            for ws in sockets:
                got = [await recv_json(ws) for _ in range(n)]
                assert [(m["seq"], m["data"]) for m in got] == [(i + 1, f"m{i}") for i in range(n)]
            epoch = channel_info(proxy.port, feed)["epoch"]
            for reader in readers:
                assert reader.wait(n) == [{"id": f"{i + 1}:{epoch}", "data": f"m{i}"} for i in range(n)]
            poller.join(30)
            assert [(m["seq"], m["data"]) for m in polled] == [(i + 1, f"m{i}") for i in range(n)], polled
        finally:
            for ws in sockets:
                await ws.close()
            for reader in readers:
                reader.close()

    run(main(), timeout=60)


def poll_all(port: int, channel: str, n: int) -> list[dict]:
    """A long-poll client loop through nginx: since=next until n messages came."""
    got: list[dict] = []
    since = 0
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        answer = poll(port, channel, since=since, timeout=10)
        got.extend(answer["messages"])
        since = answer["next"]
    return got
