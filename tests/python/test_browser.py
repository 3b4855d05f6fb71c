"""The web pages in a real browser (headless Chromium through Playwright, see
browser.py), against the real binary with the pages it embeds (THRONG_WEB_DIR is
never passed to the servers started here).

- chat (`/chat?room=R&name=N`): two members see each other join, one's message
  reaches the other with its name, and the other's leaving is shown;
- reconnect (throng.js under the chat page): after an in-memory server restarts on
  the same port the page says in words that history was reset (a `.gap` line),
  then shows what was published since; with a Redis broker (history survives the
  node), what was published through another node while the page's node was down
  is shown and no gap is;
- dashboard (`/`): the `throng:stats` feed shows connections opened by
  `throng bench idle`, a publish rate, the busiest channel, and the drop when the
  load ends;
- the HTML report of `throng bench` renders its charts with no script errors;
- `/throng.js` is JavaScript and defines `window.Throng`; a subscription gets
  each seq once even when every frame reaches the page twice (the page's
  WebSocket routed through Playwright).

A page that logs a console error or throws fails its test (browser.py); the
screenshots are in target/test-artifacts/screenshots/. Nothing here measures
speed: every wait is for a state of the page, with a timeout.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading

from playwright.sync_api import expect

from browser import browser, pages  # noqa: F401  (fixtures)
from procs import stop_process
from rawws import channel_info, http_request, publish_ok, wait_subscribers
from support.bench import assert_no_panic, bench_cmd, bench_env, run_bench
from support.wait import wait_healthy

# Network errors Chromium logs while a test has killed the server under a page.
NETWORK_ERRORS = [
    r"WebSocket connection to '.*' failed",
    r"Failed to load resource: net::ERR_CONNECTION_(REFUSED|RESET|CLOSED)",
    r"net::ERR_CONNECTION_(REFUSED|RESET|CLOSED)",
]
# What #messages holds, in order: one {kind, from, text, all} per child.
MESSAGES_JS = """() => Array.from(document.querySelectorAll('#messages > *')).map(el => ({
    kind: el.classList.contains('message') ? 'message'
        : el.classList.contains('gap') ? 'gap'
        : el.classList.contains('event') ? 'event' : el.className,
    from: el.querySelector('.from') ? el.querySelector('.from').textContent.trim() : null,
    text: el.querySelector('.text') ? el.querySelector('.text').textContent.trim() : null,
    all: el.textContent.trim(),
}))"""
# Records every data-state #status takes from now on, in window.__states.
RECORD_STATES_JS = """() => {
    const el = document.getElementById('status');
    window.__states = [el.getAttribute('data-state')];
    new MutationObserver(() => {
        const s = el.getAttribute('data-state');
        if (window.__states[window.__states.length - 1] !== s) window.__states.push(s);
    }).observe(el, {attributes: true, attributeFilter: ['data-state']});
}"""


def origin(srv) -> str:
    return f"http://127.0.0.1:{srv.port}"


def restart_on(start_server, port: int, *flags):
    """A new server on the same port as one that was stopped."""
    return start_server("--listen", f"127.0.0.1:{port}", *flags, ports=[port])


def open_chat(pages, srv, room: str, name: str):
    page = pages.new(name)
    page.goto(f"{origin(srv)}/chat?room={room}&name={name}")
    expect(page.locator("#status")).to_have_attribute("data-state", "open")
    return page


def messages(page) -> list[dict]:
    return page.evaluate(MESSAGES_JS)


def texts(page) -> list[str]:
    return [m["text"] for m in messages(page) if m["kind"] == "message"]


def wait_texts(page, want: list[str], timeout_ms: int = 15_000) -> None:
    """Wait until the .message texts end with `want`."""
    try:
        page.wait_for_function(
            """want => {
                const t = Array.from(document.querySelectorAll('#messages .message .text'))
                    .map(e => e.textContent.trim());
                return t.length >= want.length && want.every((w, i) => t[t.length - want.length + i] === w);
            }""",
            arg=want,
            timeout=timeout_ms,
        )
    except Exception as e:
        raise AssertionError(f"messages {want} not shown; #messages: {messages(page)}") from e


# -- chat ------------------------------------------------------------------------


def test_chat_two_members_see_each_other(start_server, pages):
    srv = start_server()
    room = "lobby"
    a = open_chat(pages, srv, room, "alice")
    b = open_chat(pages, srv, room, "bob")
    expect(b.locator("#count")).to_have_text("2")
    expect(a.locator("#count")).to_have_text("2")
    expect(a.locator("#room-title")).to_contain_text(room)
    info = channel_info(srv.port, f"chat:{room}")
    assert info["subscribers"] == 2, info

    text = "hello bob, this is alice"
    a.fill("#text", text)
    a.click("#send")
    for page in (b, a):  # the sender gets its own message back, with its name
        mine = page.locator("#messages .message", has_text=text)
        expect(mine).to_have_count(1)
        expect(mine.locator(".from")).to_have_text("alice")
        expect(mine.locator(".text")).to_have_text(text)
    expect(a.locator("#text")).to_have_value("")  # the compose box is cleared once sent
    pages.screenshot(a, "alice")
    pages.screenshot(b, "bob")

    b.close()
    expect(a.locator("#count")).to_have_text("1")
    # alice's page has a line for bob joining, then one for bob leaving.
    bob_events = a.locator("#messages .event", has_text="bob")
    expect(bob_events).to_have_count(2)
    last = bob_events.nth(1).text_content()
    assert "left" in last.lower() or "leave" in last.lower(), (last, messages(a))
    pages.screenshot(a, "alice-after-bob-left")
    wait_subscribers(srv.port, f"chat:{room}", 1)
    pages.assert_no_errors()


# -- reconnect -------------------------------------------------------------------


def test_reconnect_after_an_in_memory_restart_shows_the_gap_then_the_new_messages(start_server, pages):
    for pattern in NETWORK_ERRORS:
        pages.allow(pattern)
    srv = start_server()
    port = srv.port
    room = "restart"
    channel = f"chat:{room}"
    page = open_chat(pages, srv, room, "carol")
    # Two messages before the restart: the page's last seq is 2 in the old epoch,
    # so a client that kept it would drop the new epoch's seqs 1 and 2 as duplicates.
    before = ["before one", "before two"]
    for t in before:
        publish_ok(port, channel, t)
    wait_texts(page, before)
    old_epoch = channel_info(port, channel)["epoch"]
    page.evaluate(RECORD_STATES_JS)

    srv.stop()  # SIGTERM by pid, waits for the exit
    expect(page.locator("#status")).to_have_attribute("data-state", "reconnecting")
    srv2 = restart_on(start_server, port)
    after = ["after one", "after two", "after three"]
    seqs = [publish_ok(port, channel, t) for t in after]
    assert seqs == [1, 2, 3], seqs  # the new server's history starts afresh
    assert channel_info(port, channel)["epoch"] != old_epoch

    expect(page.locator("#status")).to_have_attribute("data-state", "open", timeout=20_000)
    wait_texts(page, after)
    shown = messages(page)
    kinds = [m["kind"] for m in shown]
    assert kinds.count("gap") == 1, shown
    gap_at = kinds.index("gap")
    gap = shown[gap_at]["all"]
    # The reason is said in words, not as a code.
    assert "restart" in gap.lower() or "reset" in gap.lower(), gap
    assert [m["text"] for m in shown if m["kind"] == "message"] == before + after, shown
    after_gap = [m["text"] for m in shown[gap_at:] if m["kind"] == "message"]
    assert after_gap == after, shown
    states = page.evaluate("() => window.__states")
    assert "reconnecting" in states and states[-1] == "open", states
    assert states.index("reconnecting") < len(states) - 1, states
    pages.screenshot(page, "after-restart")
    wait_subscribers(srv2.port, channel, 1)
    pages.assert_no_errors()


def test_reconnect_through_redis_loses_nothing(start_server, pages, shared_redis, prefix):
    for pattern in NETWORK_ERRORS:
        pages.allow(pattern)
    redis = shared_redis
    one = start_server("--broker", redis.url)
    two = start_server("--broker", redis.url)
    for node in (one, two):
        wait_healthy(node.port)
    room = f"{prefix}durable"  # the Redis is shared: a room no other test names
    channel = f"chat:{room}"
    page = open_chat(pages, one, room, "dave")
    before = ["kept one"]
    publish_ok(one.port, channel, before[0])
    wait_texts(page, before)
    epoch = channel_info(one.port, channel)["epoch"]
    page.evaluate(RECORD_STATES_JS)

    port = one.port
    one.stop()
    expect(page.locator("#status")).to_have_attribute("data-state", "reconnecting")
    # Published through the other node while the page's node is down.
    after = ["missed one", "missed two", "missed three"]
    seqs = [publish_ok(two.port, channel, t) for t in after]
    assert seqs == [2, 3, 4], seqs
    one2 = restart_on(start_server, port, "--broker", redis.url)
    wait_healthy(one2.port)
    assert channel_info(one2.port, channel)["epoch"] == epoch

    expect(page.locator("#status")).to_have_attribute("data-state", "open", timeout=20_000)
    wait_texts(page, after)
    shown = messages(page)
    assert [m for m in shown if m["kind"] == "gap"] == [], shown
    assert [m["text"] for m in shown if m["kind"] == "message"] == before + after, shown
    states = page.evaluate("() => window.__states")
    assert "reconnecting" in states and states[-1] == "open", states
    # And live again: a message published now arrives once.
    publish_ok(two.port, channel, "live again")
    wait_texts(page, after + ["live again"])
    assert texts(page) == before + after + ["live again"], messages(page)
    pages.screenshot(page, "after-node-restart")
    pages.assert_no_errors()


# -- dashboard -------------------------------------------------------------------


def number(page, selector: str) -> float:
    return float(page.locator(selector).text_content().strip().replace(",", ""))


def wait_number(page, selector: str, op: str, value: float, timeout_ms: int = 20_000) -> None:
    js = f"""([sel, v]) => {{
        const el = document.querySelector(sel);
        if (!el) return false;
        const n = parseFloat(el.textContent.replace(/,/g, ''));
        return !isNaN(n) && n {op} v;
    }}"""
    try:
        page.wait_for_function(js, arg=[selector, value], timeout=timeout_ms)
    except Exception as e:
        text = page.locator(selector).text_content() if page.locator(selector).count() else None
        raise AssertionError(f"{selector} never became {op} {value} (now {text!r})") from e


def test_dashboard_shows_connections_rates_and_channels(start_server, pages):
    srv = start_server()
    page = pages.new("dashboard")
    page.goto(origin(srv) + "/")
    expect(page.locator("#feed")).to_have_attribute("data-state", "open")
    expect(page.locator("#broker-state")).to_have_attribute("data-state", "up")
    expect(page.locator("#node")).to_contain_text(str(srv.pid))
    wait_number(page, "#conn-websocket", ">=", 1)  # the dashboard's own feed

    conns = 50
    channel = "dash-load"
    bench = subprocess.Popen(
        bench_cmd("idle", "--url", f"ws://127.0.0.1:{srv.port}/ws/{channel}?format=json",
                  "--conns", conns, "--duration", "60s", "--interval", "0"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=bench_env(),
    )
    stop = threading.Event()
    publisher = None
    try:
        wait_subscribers(srv.port, channel, conns, timeout=20)
        wait_number(page, "#conn-websocket", ">=", conns)
        wait_number(page, "#conn-total", ">=", conns)

        def publish_steadily():
            i = 0
            while not stop.is_set():
                publish_ok(srv.port, channel, f"tick {i}")
                i += 1
                stop.wait(0.05)

        publisher = threading.Thread(target=publish_steadily, daemon=True)
        publisher.start()
        wait_number(page, "#rate-in", ">", 0)
        wait_number(page, "#rate-out", ">", 0)
        row = page.locator("#channels tbody tr", has=page.locator("td.name", has_text=channel))
        expect(row).to_have_count(1)
        expect(row.locator("td.subscribers")).to_have_text(str(conns))
        page.wait_for_function(
            """ch => Array.from(document.querySelectorAll('#channels tbody tr')).some(tr =>
                tr.querySelector('td.name').textContent.trim() === ch &&
                parseFloat(tr.querySelector('td.rate').textContent.replace(/,/g, '')) > 0)""",
            arg=channel, timeout=20_000,
        )
        # The chart has drawn a line of some extent (rates went from 0 to hundreds).
        page.wait_for_function(
            """() => { const svg = document.querySelector('#chart'), r = svg.getBoundingClientRect();
                       return r.width > 100 && r.height > 50 &&
                           Array.from(svg.querySelectorAll('path, polyline')).some(e => {
                               const b = e.getBBox(); return b.width > 0 && b.height > 0; }); }"""
        )
        pages.screenshot(page, "under-load")
    finally:
        stop.set()
        if publisher:
            publisher.join(timeout=10)
        stop_process(bench)
        out, err = bench.communicate(timeout=10)
    assert "panicked" not in err.decode("utf-8", "replace"), err

    # The load is gone: only the dashboard's own feed is left.
    wait_number(page, "#conn-websocket", "<=", 1)
    wait_number(page, "#conn-total", "<=", 1)
    pages.screenshot(page, "after-load")
    pages.assert_no_errors()


# -- the bench's HTML report ---------------------------------------------------------

CHARTS_JS = """() => Array.from(document.querySelectorAll('svg[data-chart]')).map(svg => {
    const r = svg.getBoundingClientRect();
    const size = el => { const b = el.getBoundingClientRect(); return [b.width, b.height]; };
    return {
        chart: svg.getAttribute('data-chart'),
        width: r.width, height: r.height,
        lines: Array.from(svg.querySelectorAll('polyline')).map(size),
        bars: Array.from(svg.querySelectorAll('rect.bar')).map(size),
    };
})"""


def test_bench_report_renders_its_charts(start_server, pages, tmp_path):
    srv = start_server()
    report = tmp_path / "push.html"
    run = run_bench(
        "push", "--url", f"ws://127.0.0.1:{srv.port}", "--conns", 6,
        "--channels", 2, "--channel-prefix", "browser-", "--publish-rate", 40, "--grace", "1s",
        "--duration", "2s", "--interval", "1s", "--json", "--report", report,
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    assert report.exists(), ctx

    page = pages.new("report")
    page.goto(report.as_uri())
    expect(page.locator("h1")).to_contain_text("throng bench push")
    charts = {c["chart"]: c for c in page.evaluate(CHARTS_JS)}
    for name in ("throughput", "connections", "latency-timeline", "histogram"):
        assert name in charts, (name, list(charts), ctx)
        c = charts[name]
        assert c["width"] > 100 and c["height"] > 50, (c, ctx)
    for name in ("throughput", "connections", "latency-timeline"):
        lines = charts[name]["lines"]
        assert lines, (name, charts[name])
        # a line over the seconds of the run is drawn across the chart
        assert any(w > 0 for w, _ in lines), (name, lines)
    bars = charts["histogram"]["bars"]
    assert bars and any(w > 0 and h > 0 for w, h in bars), bars
    # The percentile table is laid out too.
    p99 = page.locator("td[data-key=p99_us]")
    expect(p99).to_be_visible()
    pages.screenshot(page, "report")
    pages.assert_no_errors()


# -- throng.js ---------------------------------------------------------------------

# Subscribes to a channel, keeping what it is given in window.__got / __states.
SUBSCRIBE_JS = """([channel, base]) => { window.__got = []; window.__states = [];
    window.__sub = Throng.subscribe(channel, {
        base, onMessage: m => window.__got.push(m), onState: s => window.__states.push(s) }); }"""


def blank_page(pages, srv):
    """A blank page of the server's origin: a document of the server (its health
    check) replaced by an empty one. (A page the browser makes up itself, with
    page.route, would be of no known address, and Chromium's local network access
    checks would then block its WebSocket to 127.0.0.1.)"""
    page = pages.new("blank")
    page.goto(origin(srv) + "/healthz")
    page.set_content("<!doctype html><title>blank</title><body></body>")
    assert page.evaluate("() => location.origin") == origin(srv)
    return page


def test_throng_js_is_javascript_and_defines_throng(start_server, pages):
    srv = start_server()
    resp = http_request(srv.port, "GET", "/throng.js")
    assert resp.status == 200, resp
    ctype = (resp.header("content-type") or "").lower()
    assert ctype.split(";")[0].strip() in ("text/javascript", "application/javascript"), resp

    page = blank_page(pages, srv)
    assert page.evaluate("() => typeof window.Throng") == "undefined"
    page.add_script_tag(url="/throng.js")
    assert page.evaluate("() => typeof window.Throng") in ("object", "function")
    assert page.evaluate("() => typeof Throng.subscribe") == "function"

    # It works: subscribe, then a message published over HTTP arrives with its seq.
    page.evaluate(SUBSCRIBE_JS, ["news", origin(srv)])
    page.wait_for_function("() => window.__sub.state === 'open'")
    wait_subscribers(srv.port, "news", 1)
    publish_ok(srv.port, "news", "first")
    publish_ok(srv.port, "news", "second")
    page.wait_for_function("() => window.__got.length >= 2")
    got = page.evaluate("() => window.__got.map(m => [m.channel, m.seq, m.data])")
    assert got == [["news", 1, "first"], ["news", 2, "second"]], got
    assert page.evaluate("() => window.__sub.lastSeq") == 2
    states = page.evaluate("() => window.__states")
    assert states[-1] == "open" and "connecting" in states, states
    page.evaluate("() => window.__sub.close()")
    wait_subscribers(srv.port, "news", 0)
    assert page.evaluate("() => window.__sub.state") == "closed"
    pages.assert_no_errors()


def test_throng_js_drops_what_it_has_seen_already(start_server, pages):
    # Between the server and the page, every message is sent to the page twice
    # (Playwright's WebSocket routing): the subscriber must get each seq once.
    srv = start_server()
    page = blank_page(pages, srv)

    def relay(ws):
        server = ws.connect_to_server()

        def forward(frame):
            ws.send(frame)
            if isinstance(frame, str) and "event" not in json.loads(frame):
                ws.send(frame)

        server.on_message(forward)

    page.route_web_socket(re.compile(r"/ws/twice\b"), relay)
    page.add_script_tag(url="/throng.js")
    page.evaluate(SUBSCRIBE_JS, ["twice", origin(srv)])
    page.wait_for_function("() => window.__sub.state === 'open'")
    wait_subscribers(srv.port, "twice", 1)
    for i in range(1, 6):
        publish_ok(srv.port, "twice", f"m{i}")
        # each one is shown before the next is published: a duplicate of m{i}
        # (sent right after it) has been handled by then
        page.wait_for_function("n => window.__got.some(m => m.data === 'm' + n)", arg=i)
    got = page.evaluate("() => window.__got.map(m => [m.seq, m.data])")
    assert got == [[i, f"m{i}"] for i in range(1, 6)], got
    assert page.evaluate("() => window.__sub.lastSeq") == 5
    pages.assert_no_errors()


def test_with_tokens_the_chat_name_comes_from_the_token_and_a_refreshed_token_survives_expiry(start_server, pages):
    """--token-secret: the chat page opened with ?token= joins under the token's sub;
    when a fixed token expires the server closes with 4001 and throng.js stops
    (closed, with the code); a page that hands throng.js a function gets a fresh
    token and is back at once, with nothing lost."""
    import time

    import jwt

    secret = "browser-test-secret-of-32-bytes-at-least"
    srv = start_server("--token-secret", secret)

    def mint(ttl: int, sub: str | None = None) -> str:
        c = {"exp": int(time.time()) + ttl, "channels": ["chat:*", "news"]}
        if sub:
            c["sub"] = sub
        return jwt.encode(c, secret, algorithm="HS256")

    for pattern in NETWORK_ERRORS:
        pages.allow(pattern)
    page = pages.new("dave")
    # Lifetimes leave a busy machine's Chromium seconds to load the page and connect
    # first (exp is in whole seconds: 8 lasts 7 to 8 s).
    page.goto(f"{origin(srv)}/chat?room=tok&name=ignored&token={mint(8, 'dave')}")
    expect(page.locator("#status")).to_have_attribute("data-state", "open")
    page.locator("#text").fill("signed in")
    page.locator("#send").click()
    page.wait_for_function("() => Array.from(document.querySelectorAll('#messages .message .from')).some(e => e.textContent.trim() === 'dave')")
    # The fixed token runs out: 4001, and the page stops trying.
    expect(page.locator("#status")).to_have_attribute("data-state", "closed", timeout=15_000)
    pages.screenshot(page, "expired")
    expect(page.locator("#messages")).to_contain_text("token expired")

    # A page whose token is a function is given a new one on every connection.
    blank = blank_page(pages, srv)
    blank.add_script_tag(url="/throng.js")
    blank.evaluate(
        """([first, fresh]) => {
            window.__tokens = [first, fresh];
            window.__got = []; window.__closes = [];
            window.__sub = Throng.subscribe('news', {
                since: 0,
                token: () => window.__tokens.length > 1 ? window.__tokens.shift() : window.__tokens[0],
                onMessage: m => window.__got.push(m.seq),
                onState: (s, info) => { if (info && info.code) window.__closes.push(info.code); },
            });
        }""",
        [mint(4), mint(60)],
    )
    blank.wait_for_function("() => window.__sub.state === 'open'")
    publish_ok(srv.port, "news", "one")
    blank.wait_for_function("() => window.__closes.includes(4001)", timeout=15_000)
    publish_ok(srv.port, "news", "two")
    blank.wait_for_function("() => window.__sub.state === 'open' && window.__got.length >= 2")
    assert blank.evaluate("() => window.__got") == [1, 2]
    blank.evaluate("() => window.__sub.close()")
    pages.assert_no_errors()
