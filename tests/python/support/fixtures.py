"""Shared pytest fixtures, registered for every test module by conftest.py
(`pytest_plugins`): a module asks for one by name and imports nothing.

- `redis`: a Redis of the test's own (it may stop, restart or FLUSH it);
- `shared_redis` + `redis_args`: one Redis per xdist worker, and the flags that
  put a node on it under a `--redis-prefix` of the test's own (see
  `shared_redis`); `prefix`: a name unique to the test to put in front of its
  channels;
- `clients`: pusher-js clients, closed at the end;
- `receiver`: a Pusher webhook endpoint;
- `toxiproxy`: a Toxiproxy server of the test's own (support/toxiproxy.py), to
  put latency between a node and its Redis."""

from __future__ import annotations

import hashlib

import pytest

from support.pusher import PusherJs
from support.redis import Redis
from support.toxiproxy import Toxiproxy
from support.webhooks import Receiver


@pytest.fixture
def redis():
    """A Redis of the test's own: the test may stop, restart or FLUSH it."""
    r = Redis()
    yield r
    r.close()


@pytest.fixture(scope="session")
def shared_redis():
    """One Redis per xdist worker (a session there is one worker's run), shared by
    the tests that only need "a Redis". Such a test must not stop, restart,
    FLUSH, CONFIG SET or fail over it, nor count its commands (MONITOR): those
    keep a Redis of their own (`redis`). It starts its nodes with `redis_args`
    (`--broker URL --redis-prefix P`, P unique to the test): every key, the node
    registry, the occupancy keeper's lists, the channel lists of /api/channels
    and Pusher's, and the Pub/Sub channels (also `--redis-subscribe pattern`'s
    PSUBSCRIBE) are then the test's own, and it may count nodes or list
    channels. A test started with only `--broker URL` (the default prefix
    `throng`) shares all that with every other such test, and puts `prefix` in
    front of its channel names to keep its channels apart."""
    r = Redis()
    yield r
    r.close()


@pytest.fixture
def prefix(request) -> str:
    """A channel-name prefix unique to this test within the run (its node id made
    safe for channel names, and short): `f"{prefix}news"`."""
    return "t" + hashlib.blake2s(request.node.nodeid.encode(), digest_size=5).hexdigest() + "-"


@pytest.fixture
def redis_prefix(prefix) -> str:
    """A `--redis-prefix` unique to this test within the run (`prefix` without
    its dash); `f"{redis_prefix}-2"` makes another deployment of the same test."""
    return prefix.rstrip("-")


@pytest.fixture
def redis_args(shared_redis, redis_prefix) -> tuple[str, ...]:
    """The flags that put a node on `shared_redis` under the test's own
    `--redis-prefix`: `start_server(*redis_args)`."""
    return ("--broker", shared_redis.url, "--redis-prefix", redis_prefix)


@pytest.fixture
def clients():
    made: list[PusherJs] = []

    def make(port: int, **kw) -> PusherJs:
        c = PusherJs(port, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def toxiproxy():
    """A Toxiproxy server of the test's own; its proxies and toxics go with it."""
    t = Toxiproxy()
    yield t
    t.close()
