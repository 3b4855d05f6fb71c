"""GET /metrics: the Prometheus text exposition format, read with prometheus_client's
own parser (never a regex), and values that follow what the server does: connections
by transport, publishes and deliveries (HTTP API and chat), bytes sent, slow
consumers cut off, refused handshakes by reason, the delivery-latency histogram,
the broker's health, and counters that only ever grow."""

from __future__ import annotations

import json
import os
import time

from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port
from rawws import (
    OP_TEXT, Closed, RawConn, channel_info, http_exchange, http_request, publish_ok, upgrade_request,
    wait_subscribers,
)
from rawws import ws_connect as raw_connect

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Every family the page shows: its name (as exposed) and type.
FAMILIES = {
    "throng_connections": "gauge",
    "throng_messages_published_total": "counter",
    "throng_messages_delivered_total": "counter",
    "throng_bytes_sent_total": "counter",
    "throng_deflate_plain_bytes_total": "counter",
    "throng_deflate_wire_bytes_total": "counter",
    "throng_slow_consumer_disconnects_total": "counter",
    "throng_broker_deadlines_missed_total": "counter",
    "throng_broker_answers_late_total": "counter",
    "throng_handshake_failures_total": "counter",
    "throng_broker_up": "gauge",
    "throng_io_uring_receivers": "gauge",
    "throng_io_uring_sends_total": "counter",
    "throng_io_uring_send_calls_total": "counter",
    "throng_delivery_latency_seconds": "histogram",
    "throng_loop_turn_seconds": "histogram",
    "throng_loop_turn_slowest_seconds": "gauge",
    "throng_channels": "gauge",
    "throng_history_bytes": "gauge",
    "throng_uptime_seconds": "gauge",
    "process_resident_memory_bytes": "gauge",
    "process_open_fds": "gauge",
}
REASONS = {"bad_request", "unsupported_version", "max_conns", "max_conns_per_ip", "timeout", "broker_unavailable", "unauthorized", "origin", "tls"}
HISTOGRAM = "throng_delivery_latency_seconds"


class Metrics:
    """One scrape, parsed: families by exposed name, sample values by name and labels."""

    def __init__(self, text: str):
        self.text = text
        self.families = {}
        self.samples: dict[tuple[str, tuple], float] = {}
        for family in text_string_to_metric_families(text):
            # The parser names a counter family without its `_total`.
            exposed = family.name + "_total" if family.type == "counter" else family.name
            assert exposed not in self.families, f"family {exposed} twice"
            self.families[exposed] = family
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                assert key not in self.samples, f"sample {key} twice"
                self.samples[key] = s.value

    def value(self, name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        assert key in self.samples, f"no sample {key} in\n{self.text}"
        return self.samples[key]

    def monotonic(self) -> dict[tuple[str, tuple], float]:
        """Every sample that may only grow: counters and the histogram's series."""
        names = {
            s.name
            for f in self.families.values()
            if f.type in ("counter", "histogram")
            for s in f.samples
        }
        return {k: v for k, v in self.samples.items() if k[0] in names}

    def buckets(self, histogram: str = HISTOGRAM) -> list[tuple[float, float]]:
        """A histogram's (le, cumulative count), in the page's order."""
        family = self.families[histogram]
        return [(float(s.labels["le"]), s.value) for s in family.samples if s.name == histogram + "_bucket"]

    def connections(self) -> dict[str, float]:
        return {t: self.value("throng_connections", transport=t) for t in ("websocket", "sse", "poll")}


def scrape(port: int) -> Metrics:
    resp = http_request(port, "GET", "/metrics")
    assert resp.status == 200, resp
    assert resp.header("content-type") == CONTENT_TYPE, resp
    return Metrics(resp.body.decode("utf-8"))


def wait_metrics(port: int, predicate, what: str, timeout: float = 10.0) -> Metrics:
    """Scrapes until predicate(metrics) holds (loops publish their counts at the end
    of each turn, a moment after the client saw the effect)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(port)
        if predicate(m):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout}s; last scrape:\n{m.text}")
        time.sleep(0.02)


def fewest_fds(pid: int, samples: int = 5) -> int:
    """The fewest descriptors the process holds over a few samples: a readiness
    probe's or a scrape's socket may take a moment to go."""
    fewest = len(os.listdir(f"/proc/{pid}/fd"))
    for _ in range(samples - 1):
        time.sleep(0.05)
        fewest = min(fewest, len(os.listdir(f"/proc/{pid}/fd")))
    return fewest


def sse_open(port: int, channel: str) -> RawConn:
    c = RawConn(port, timeout=10)
    c.send(f"GET /sse/{channel} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = c.read_until(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert c.read_until(b"\n\n").startswith(b"retry:")
    return c


def sse_event(c: RawConn) -> bytes:
    """The data of the next event, skipping heartbeat comments."""
    while True:
        event = c.read_until(b"\n\n")
        if not event.startswith(b":"):
            lines = dict(line.split(b": ", 1) for line in event.strip().split(b"\n"))
            return lines[b"data"]


def assert_histogram_consistent(m: Metrics, histogram: str = HISTOGRAM) -> None:
    buckets = m.buckets(histogram)
    les = [le for le, _ in buckets]
    assert les == sorted(les) and les[-1] == float("inf"), les
    counts = [n for _, n in buckets]
    assert counts == sorted(counts), f"buckets are not cumulative: {buckets}"
    assert counts[-1] == m.value(histogram + "_count"), "+Inf bucket != _count"


def test_every_family_has_help_type_and_the_text_content_type(start_server):
    srv = start_server()
    m = scrape(srv.port)
    assert set(m.families) == set(FAMILIES), sorted(m.families)
    for name, kind in FAMILIES.items():
        family = m.families[name]
        assert family.type == kind, f"{name}: TYPE {family.type}, want {kind}"
        assert family.documentation, f"{name} has no HELP"
    assert {s.labels["reason"] for s in m.families["throng_handshake_failures_total"].samples} == REASONS
    assert m.value("throng_broker_up") == 1
    assert m.connections() == {"websocket": 0, "sse": 0, "poll": 0}
    assert m.value(HISTOGRAM + "_count") == 0
    assert_histogram_consistent(m)
    assert m.value("process_resident_memory_bytes") > 1 << 20
    fds = len(os.listdir(f"/proc/{srv.pid}/fd"))
    assert abs(m.value("process_open_fds") - fds) <= 2, (m.value("process_open_fds"), fds)
    # Only GET; and a kept-alive scraper can scrape again on the same connection.
    assert http_request(srv.port, "POST", "/metrics", b"").status == 405
    with RawConn(srv.port) as c:
        for _ in range(2):
            c.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            resp = c.read_http_response()
            assert resp.status == 200 and resp.header("connection") == "keep-alive", resp
            Metrics(resp.body.decode())


def test_connections_follow_each_transport(start_server):
    srv = start_server()
    fds_before = fewest_fds(srv.pid)
    opened = []
    try:
        opened.append(raw_connect(srv.port, "/echo"))
        opened.append(raw_connect(srv.port, "/ws/lobby"))
        opened.append(sse_open(srv.port, "lobby"))
        poll = RawConn(srv.port, timeout=10)
        opened.append(poll)
        poll.send(b"GET /poll/lobby?timeout=30 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        want = {"websocket": 2, "sse": 1, "poll": 1}
        m = wait_metrics(srv.port, lambda m: m.connections() == want, f"connections {want}")
        assert m.value("process_open_fds") >= fds_before + 4, (m.value("process_open_fds"), fds_before)
        assert m.value("throng_channels") == 1, "one channel, lobby"
    finally:
        for c in opened:
            c.close()
    wait_metrics(
        srv.port,
        lambda m: m.connections() == {"websocket": 0, "sse": 0, "poll": 0},
        "every connection gone",
    )


def test_publishes_and_deliveries_follow_a_fan_out(start_server):
    srv = start_server()
    n, channel = 25, "fan"
    raw = [raw_connect(srv.port, f"/ws/{channel}", timeout=10) for _ in range(2)]
    sse = sse_open(srv.port, channel)
    try:
        wait_subscribers(srv.port, channel, 3)
        before = scrape(srv.port)
        payloads = [f"message {i:03d}" for i in range(n)]
        for p in payloads:
            publish_ok(srv.port, channel, p)
        for c in raw:
            for p in payloads:
                assert c.read_message() == (OP_TEXT, p.encode())
        for p in payloads:
            assert sse_event(sse) == p.encode()

        def delivered(m):
            return m.value("throng_messages_delivered_total") - before.value("throng_messages_delivered_total")

        # Each message is timed once per loop holding subscribers (2 threads: 1 or 2
        # loops); loops publish their counts at the end of a turn, so wait for that too.
        def timed(m):
            return m.value(HISTOGRAM + "_count") - before.value(HISTOGRAM + "_count")

        after = wait_metrics(
            srv.port,
            lambda m: delivered(m) >= 3 * n and timed(m) in (n, 2 * n),
            f"{3 * n} deliveries, each message timed once per loop ({n} or {2 * n})",
        )
        assert delivered(after) == 3 * n, "each message once per subscriber"
        published = after.value("throng_messages_published_total") - before.value("throng_messages_published_total")
        assert published == n
        sent = after.value("throng_bytes_sent_total") - before.value("throng_bytes_sent_total")
        assert sent >= 3 * sum(len(p) for p in payloads), sent
        observed = timed(after)
        assert after.value(HISTOGRAM + "_sum") > before.value(HISTOGRAM + "_sum")
        assert after.value(HISTOGRAM + "_sum") < observed * 5.0, "a loopback delivery takes well under 5 s"
        assert_histogram_consistent(after)
    finally:
        for c in [*raw, sse]:
            c.close()


def test_a_chat_message_is_one_publish_delivered_to_every_member(start_server):
    srv = start_server()
    members = [raw_connect(srv.port, "/ws/chat:room", timeout=10) for _ in range(3)]
    try:
        wait_subscribers(srv.port, "chat:room", 3)
        before = scrape(srv.port)
        members[0].send_frame(OP_TEXT, b"hello room")
        for c in members:
            assert c.read_message() == (OP_TEXT, b"hello room")

        def grew(m, name):
            return m.value(name) - before.value(name)

        after = wait_metrics(
            srv.port, lambda m: grew(m, "throng_messages_delivered_total") >= 3, "3 chat deliveries"
        )
        assert grew(after, "throng_messages_published_total") == 1
        assert grew(after, "throng_messages_delivered_total") == 3
    finally:
        for c in members:
            c.close()


def test_a_slow_consumer_cut_off_counts_once(start_server):
    srv = start_server("--max-queue", "64KiB")
    channel = "firehose"
    # A tiny receive buffer, never read: the server's queue for it has to grow.
    slow = raw_connect(srv.port, f"/ws/{channel}", rcvbuf=4096, timeout=10)
    try:
        wait_subscribers(srv.port, channel, 1)
        before = scrape(srv.port).value("throng_slow_consumer_disconnects_total")
        payload = "x" * 10240
        for i in range(2000):  # 20 MB at most; kernel buffers take a few MB first
            publish_ok(srv.port, channel, payload)
            if i % 20 == 19 and channel_info(srv.port, channel)["subscribers"] == 0:
                break
        else:
            raise AssertionError("the stalled subscriber was never cut off")
        m = wait_metrics(
            srv.port,
            lambda m: m.value("throng_slow_consumer_disconnects_total") > before,
            "a slow consumer disconnect",
        )
        assert m.value("throng_slow_consumer_disconnects_total") == before + 1
    finally:
        slow.close()


def failures(m: Metrics) -> dict[str, float]:
    return {r: m.value("throng_handshake_failures_total", reason=r) for r in REASONS}


def test_refused_handshakes_are_counted_by_reason(start_server):
    srv = start_server("--max-conns-per-ip", "1", "--handshake-timeout", "1s")
    base = failures(scrape(srv.port))

    def expect(reason_counts: dict[str, int], what: str) -> None:
        want = {r: base[r] + reason_counts.get(r, 0) for r in REASONS}
        wait_metrics(srv.port, lambda m: failures(m) == want, what)

    req, _ = upgrade_request(path="/echo", key=None)
    assert http_exchange(srv.port, req).status == 400
    expect({"bad_request": 1}, "an upgrade without a key")
    req, _ = upgrade_request(path="/ws/news", version="8")
    assert http_exchange(srv.port, req).status == 426
    expect({"bad_request": 1, "unsupported_version": 1}, "WebSocket version 8")
    assert http_request(srv.port, "GET", "/sse/bad*name").status == 400
    expect({"bad_request": 2, "unsupported_version": 1}, "an SSE stream of a bad channel name")

    held = raw_connect(srv.port, "/echo")
    try:
        req, _ = upgrade_request(path="/echo")
        assert http_exchange(srv.port, req).status == 429
        expect({"bad_request": 2, "unsupported_version": 1, "max_conns_per_ip": 1}, "a second WebSocket from one IP")
    finally:
        held.close()

    # Timeouts: a request begun and never finished counts; a connection that sends
    # nothing, or a kept-alive one idle after its answer, does not.
    with RawConn(srv.port) as partial, RawConn(srv.port) as silent, RawConn(srv.port) as kept:
        partial.send(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
        kept.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert kept.read_http_response().status == 200
        for c in (partial, silent, kept):
            try:
                c.wait_closed(timeout=6)
            except Closed:
                pass
    expect(
        {"bad_request": 2, "unsupported_version": 1, "max_conns_per_ip": 1, "timeout": 1},
        "one handshake timeout",
    )


def test_over_max_conns_is_counted(start_server):
    srv = start_server("--max-conns", "1")
    held = raw_connect(srv.port, "/echo")
    try:
        req, _ = upgrade_request(path="/echo")
        assert http_exchange(srv.port, req).status == 503
        wait_metrics(
            srv.port,
            lambda m: m.value("throng_handshake_failures_total", reason="max_conns") == 1,
            "one refusal over --max-conns",
        )
    finally:
        held.close()


def test_broker_down_shows_in_broker_up_and_refused_subscriptions(start_server):
    # Nothing listens there: the node serves, unhealthy, and retries.
    srv = start_server("--broker", f"redis://127.0.0.1:{free_port()}/0")
    m = scrape(srv.port)
    assert m.value("throng_broker_up") == 0
    c = raw_connect(srv.port, "/ws/news")
    try:
        assert c.read_message()[0] == "close"
    finally:
        c.close()
    wait_metrics(
        srv.port,
        lambda m: m.value("throng_handshake_failures_total", reason="broker_unavailable") == 1,
        "a subscription the broker could not take",
    )


def test_counters_only_grow_across_scrapes(start_server):
    srv = start_server()
    seen = scrape(srv.port)
    sub = raw_connect(srv.port, "/ws/grow", timeout=10)
    try:
        wait_subscribers(srv.port, "grow", 1)
        for round_ in range(5):
            for i in range(10):
                publish_ok(srv.port, "grow", f"{round_}.{i}")
            for i in range(10):
                assert sub.read_message() == (OP_TEXT, f"{round_}.{i}".encode())
            echo = raw_connect(srv.port, "/echo")
            echo.close()
            req, _ = upgrade_request(path="/echo", version="7")
            http_exchange(srv.port, req)
            m = scrape(srv.port)
            for key, value in m.monotonic().items():
                assert value >= seen.samples.get(key, 0), f"{key} went from {seen.samples.get(key)} to {value}"
            assert_histogram_consistent(m)
            assert_histogram_consistent(m, "throng_loop_turn_seconds")
            assert m.value("throng_uptime_seconds") >= seen.value("throng_uptime_seconds")
            seen = m
        assert seen.value(HISTOGRAM + "_count") >= 50
        assert seen.value("throng_messages_published_total") == 50
    finally:
        sub.close()


def test_loop_turns_are_counted_and_agree_with_api_stats(start_server):
    """Every turn of an event loop lands in `throng_loop_turn_seconds`; the slowest
    is a gauge, and /api/stats says the same for the process."""
    srv = start_server("--threads", "2")
    for i in range(20):
        publish_ok(srv.port, "turns", str(i))
    m = scrape(srv.port)
    slowest = m.value("throng_loop_turn_slowest_seconds")
    total = m.value("throng_loop_turn_seconds_sum")
    if not 0 < slowest <= total:
        # The other loop can end a turn between the scrape's reads of its sum and
        # of its slowest: one more scrape.
        m = scrape(srv.port)
        slowest = m.value("throng_loop_turn_slowest_seconds")
        total = m.value("throng_loop_turn_seconds_sum")
    assert 0 < slowest <= total, (slowest, total)
    assert_histogram_consistent(m, "throng_loop_turn_seconds")
    turns = m.value("throng_loop_turn_seconds_count")
    # Each publish woke a loop at least once (and the scrape itself is a turn).
    assert turns >= 20, m.text
    # A loop turn that answers a publish on loopback takes far less than 10 s.
    assert m.buckets("throng_loop_turn_seconds")[-2] == (10.0, turns)
    stats = json.loads(http_request(srv.port, "GET", "/api/stats", b"").body)
    lt = stats["loop_turns"]
    assert set(lt) == {"count", "over_100ms", "over_1s", "slowest_ms"}, lt
    assert lt["count"] >= turns and lt["over_1s"] <= lt["over_100ms"] <= lt["count"], lt
    # Both carry whole nanoseconds; compare them as integers, since 0.000181914 * 1000
    # is 0.18191400000000002 in floating point.
    assert round(lt["slowest_ms"] * 1e6) >= round(slowest * 1e9), (lt, slowest)
