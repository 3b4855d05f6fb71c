"""Shared pytest fixtures, registered for every test module by conftest.py
(`pytest_plugins`): a module asks for one by name and imports nothing.

- `redis`: a Redis of the test's own (it may stop, restart or FLUSH it);
- `shared_redis` + `prefix`: one Redis per xdist worker, and a name unique to the
  test to put in front of its channels (see `shared_redis`);
- `clients`: pusher-js clients, closed at the end;
- `receiver`: a Pusher webhook endpoint."""

from __future__ import annotations

import hashlib

import pytest

from support.pusher import PusherJs
from support.redis import Redis
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
    the tests that only need "a Redis". Such a test must not stop, restart or
    FLUSH it, and puts `prefix` in front of its channel names: throng's keys are
    `throng:{CHANNEL}:…` and its Pub/Sub channels `throng:ch:CHANNEL`, so
    distinct channel names are what keeps two tests' servers apart. What is not
    per channel is shared by every node on that Redis: the node registry
    (`throng:nodes`), the occupancy keeper's `throng:occupiers`, the channel
    list of /api/channels and Pusher's, and `--redis-subscribe pattern`'s
    PSUBSCRIBE throng:ch:*; a test that counts nodes, lists channels or kills
    a node keeps a Redis of its own (`redis`)."""
    r = Redis()
    yield r
    r.close()


@pytest.fixture
def prefix(request) -> str:
    """A channel-name prefix unique to this test within the run (its node id made
    safe for channel names, and short): `f"{prefix}news"`."""
    return "t" + hashlib.blake2s(request.node.nodeid.encode(), digest_size=5).hexdigest() + "-"


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
