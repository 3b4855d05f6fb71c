"""The holes an outside review found (issue 44), each tried the way it was found,
against the real binary: a Pusher app's private, presence and user channels
through throng's own endpoints (pusher-js and the official Python SDK on the
Pusher side), requests smuggled behind a GET (straight and through nginx with
deploy/nginx.conf), X-Forwarded-For entries that are no address, cross-site
publishes and DNS rebinding (Chromium), the pages' security headers, and the
small ones: HTTP/1.1 without Host, bare LF, JWT nbf, a garbage token's reason."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from playwright.sync_api import expect
from websockets.exceptions import InvalidStatus

from browser import browser, pages  # noqa: F401 (fixtures)
from procs import Nginx
from rawws import RawConn, assert_json_error, http_exchange, http_request, publish, publish_ok
from support.nginx import fronting
from support.pusher import APP, APP_ID, sdk
from wsutil import run, ws_connect

HIDDEN = ["private-payroll", "presence-board", "private-encrypted-vault"]
SECRET = "a-token-secret-of-at-least-32-bytes!"


def token(channels, **claims) -> str:
    return jwt.encode({"exp": int(time.time()) + 300, "channels": channels, **claims}, SECRET, "HS256")


def ws_status(port: int, path: str) -> int:
    """The status a WebSocket handshake on `path` is answered with (101: opened)."""

    async def body():
        try:
            async with ws_connect(f"ws://127.0.0.1:{port}{path}"):
                return 101
        except InvalidStatus as e:
            return e.response.status_code

    return run(body())


def endpoints(channel: str, query: str = "") -> dict[str, str]:
    return {
        "poll": f"/poll/{channel}?since=0&timeout=0{query}",
        "sse": f"/sse/{channel}?since=0{query}",
        "ws": f"/ws/{channel}?since=0{query}",
    }


def status_of(port: int, kind: str, path: str) -> int:
    if kind == "ws":
        return ws_status(port, path)
    with RawConn(port, timeout=5) as c:
        c.send(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        return c.read_http_response(timeout=5).status


# ------------------------------------------------------------- 1: Pusher channels


def test_an_apps_private_presence_and_user_channels_are_closed_to_throngs_endpoints(start_server, clients):
    srv = start_server("--pusher-app", APP, "--trusted-proxy", "127.0.0.1")
    # The app's own client still subscribes (signed) and gets the app's events.
    c = clients(srv.port)
    c.connected()
    assert c.subscribe("private-payroll")["type"] == "subscribed"
    sdk(srv.port).trigger("private-payroll", "salary", {"who": "bob", "amount": 1})
    assert c.event("private-payroll", "salary")["data"] == {"who": "bob", "amount": 1}
    for name in HIDDEN + ["user"]:
        channel = f"{APP_ID}.user:bob" if name == "user" else f"{APP_ID}:{name}"
        for kind, path in endpoints(channel).items():
            assert status_of(srv.port, kind, path) == 403, (kind, path)
        # What such a channel holds is told to a publisher only: from this
        # machine (the test's) it is, from anywhere else (the trusted proxy's
        # client below) it is not.
        assert http_request(srv.port, "GET", f"/api/channels/{channel}").status == 200
        resp = http_request(srv.port, "GET", f"/api/channels/{channel}",
                            headers=[("X-Forwarded-For", "203.0.113.5")])
        assert_json_error(resp, 403, "Pusher protocol")
    # The app's public channels stay public, as Pusher's are.
    assert status_of(srv.port, "poll", endpoints(f"{APP_ID}:news")["poll"]) == 200


def test_wildcard_grants_do_not_reach_into_an_apps_namespace(start_server):
    srv = start_server("--pusher-app", APP, "--token-secret", SECRET)
    for grant in (["*"], [f"{APP_ID}*"], [f"{APP_ID}:*"]):
        t = token(grant)
        for channel in (f"{APP_ID}:private-payroll", f"{APP_ID}:news", f"{APP_ID}.user:bob"):
            for kind, path in endpoints(channel, f"&token={t}").items():
                assert status_of(srv.port, kind, path) == 403, (grant, kind, path)
    # Outside the app the wildcard grants as before.
    assert status_of(srv.port, "poll", endpoints("news", f"&token={token(['*'])}")["poll"]) == 200
    # An app's public channel granted by its exact name opens; a private one never.
    exact = token([f"{APP_ID}:news", f"{APP_ID}:private-payroll"])
    assert status_of(srv.port, "poll", endpoints(f"{APP_ID}:news", f"&token={exact}")["poll"]) == 200
    assert status_of(srv.port, "poll", endpoints(f"{APP_ID}:private-payroll", f"&token={exact}")["poll"]) == 403


def test_the_stats_feed_names_no_channel_of_an_app(start_server, clients):
    srv = start_server("--pusher-app", APP)
    c = clients(srv.port)
    c.connected()
    assert c.subscribe("private-payroll")["type"] == "subscribed"

    async def body():
        async with ws_connect(f"ws://127.0.0.1:{srv.port}/ws/news"), \
                ws_connect(f"ws://127.0.0.1:{srv.port}/ws/throng:stats?format=json") as feed:
            for _ in range(3):
                sample = json.loads(json.loads(await asyncio.wait_for(feed.recv(), 5))["data"])
                names = [b["channel"] for b in sample["busiest"]]
                if "news" in names:
                    assert not [n for n in names if n.startswith(APP_ID)], names
                    return
            raise AssertionError(f"the feed never listed news: {names}")

    run(body())


# ------------------------------------------------------------- 2: smuggling

INNER = b"POST /api/publish/smuggled HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nowned"

SMUGGLED = {
    "content-length-on-a-get": b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(INNER) + INNER,
    "chunked-get": b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % len(INNER)
    + INNER + b"\r\n0\r\n\r\n",
    "two-lengths": b"GET /api/stats HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: %d\r\n\r\n"
    % len(INNER) + INNER,
    "plus-length": b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: +%d\r\n\r\n" % len(INNER) + INNER,
}


def read_all(port: int, raw: bytes) -> bytes:
    """Sends `raw` on one connection and reads until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(raw)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return got


def nothing_published(port: int) -> bool:
    return http_request(port, "GET", "/api/channels/smuggled").json()["last_seq"] == 0


@pytest.mark.parametrize("case", list(SMUGGLED), ids=list(SMUGGLED))
def test_no_request_hides_in_anothers_body(start_server, case):
    srv = start_server()
    got = read_all(srv.port, SMUGGLED[case])
    assert got.count(b"HTTP/1.1 ") == 1, got
    assert got.startswith(b"HTTP/1.1 400"), got
    assert nothing_published(srv.port)


def test_through_nginx_a_get_smuggles_no_publish(start_server):
    srv = start_server("--trusted-proxy", "127.0.0.1")
    proxy = Nginx(fronting([srv.port]))
    try:
        for case in ("content-length-on-a-get", "chunked-get"):
            raw = SMUGGLED[case].replace(b"Host: x", f"Host: 127.0.0.1:{proxy.port}".encode(), 1)
            read_all(proxy.port, raw)
            assert nothing_published(srv.port), case
        # The proxy itself still works for a plain GET.
        assert http_request(proxy.port, "GET", "/healthz").status == 200
    finally:
        proxy.stop()


# ------------------------------------------------------------- 3: X-Forwarded-For


@pytest.mark.parametrize("entry", ["203.0.113.5:51234", "[2001:db8::1]:443", "unknown", "", "203.0.113.5,",
                                   '"203.0.113.5"', "fe80::1%eth0", "127.1", "127.0.0.1"])
def test_a_forwarded_request_never_publishes_as_loopback(start_server, entry):
    srv = start_server("--trusted-proxy", "127.0.0.1", "--trusted-proxy", "10.0.0.0/8")
    resp = publish(srv.port, "news", "hi", headers=[("X-Forwarded-For", entry)])
    assert_json_error(resp, 403, "loopback")
    # A client in the broad trusted range claiming loopback is forwarded too.
    resp = publish(srv.port, "news", "hi", headers=[("X-Forwarded-For", "127.0.0.1, 10.1.2.3")])
    assert_json_error(resp, 403, "loopback")
    # The proxy's own request, forwarding for nobody, is local.
    publish_ok(srv.port, "news", "hi")


# ------------------------------------------------------------- 5, 6: sites


class ForeignSite:
    """A page of another origin, served by Python's http.server on a free port."""

    def __init__(self, html: str):
        page = html.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_foreign_page_cannot_publish_or_frame_the_pages(start_server, pages):
    srv = start_server("--allowed-origin", "https://app.example")
    site = ForeignSite(f"""<!doctype html><body>
<iframe id="f" src="http://127.0.0.1:{srv.port}/chat" onload="window.framed = true"></iframe>
<script>
fetch("http://127.0.0.1:{srv.port}/api/publish/csrf", {{method: "POST", mode: "no-cors",
  headers: {{"Content-Type": "text/plain"}}, body: "owned"}}).then(() => document.title = "sent",
  () => document.title = "sent");
</script></body>""")
    try:
        pages.allow(r"Refused to (display|frame)|frame-ancestors|X-Frame-Options")
        pages.allow(r"status of 403")
        page = pages.new("foreign")
        page.goto(site.url)
        page.wait_for_function("document.title === 'sent'")
        assert http_request(srv.port, "GET", "/api/channels/csrf").json()["last_seq"] == 0
        # Without --allowed-origin, a foreign page is still no publisher of a
        # keyless server (its browser is on this machine: it would be loopback).
        open_srv = start_server()
        page.evaluate(f"""fetch("http://127.0.0.1:{open_srv.port}/api/publish/csrf", {{method: "POST",
            mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body: "owned"}}).catch(() => {{}})""")
        time.sleep(0.3)
        assert http_request(open_srv.port, "GET", "/api/channels/csrf").json()["last_seq"] == 0
        # The framed page is refused by the browser: the frame holds Chromium's
        # error page, not the chat.
        page.wait_for_function("window.framed === true")
        frame = next(f for f in page.frames if f != page.main_frame)
        assert frame.locator("#lobby").count() == 0, frame.url
    finally:
        site.close()


def test_pages_and_api_answers_carry_the_security_headers(start_server):
    srv = start_server()
    for path in ("/", "/chat"):
        resp = http_request(srv.port, "GET", path)
        csp = resp.header("content-security-policy") or ""
        assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp, resp
        assert resp.header("x-frame-options") == "DENY", resp
    for path in ("/api/stats", "/healthz", "/nope"):
        resp = http_request(srv.port, "GET", path)
        assert resp.header("x-content-type-options") == "nosniff", resp
        assert resp.header("referrer-policy") == "no-referrer", resp


def test_a_browser_naming_a_loopback_server_by_a_foreign_name_is_refused(start_server):
    srv = start_server()
    rebinding = [("Host", f"evil.example:{srv.port}"), ("Sec-Fetch-Site", "same-origin")]
    with RawConn(srv.port, timeout=5) as c:
        c.send(b"GET /api/channels/news HTTP/1.1\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in rebinding)
               + b"\r\n")
        resp = c.read_http_response(timeout=5)
    assert_json_error(resp, 403, "rebinding")
    listed = start_server("--allowed-host", "app.example")
    ok = http_exchange(listed.port, b"GET /healthz HTTP/1.1\r\nHost: app.example:1\r\n\r\n")
    assert ok.status == 200
    refused = http_exchange(listed.port, b"GET /healthz HTTP/1.1\r\nHost: other.example\r\n\r\n")
    assert_json_error(refused, 403, "--allowed-host")


def test_the_chat_page_takes_its_token_from_the_fragment_and_drops_it(start_server, pages):
    srv = start_server("--token-secret", SECRET)
    t = token(["chat:*"], sub="dora")
    page = pages.new()
    page.goto(f"http://127.0.0.1:{srv.port}/chat?room=sec&name=ignored#token={t}")
    expect(page.locator("#status")).to_have_attribute("data-state", "open")
    assert "token" not in page.url, page.url
    page.locator("#text").fill("hello")
    page.locator("#send").click()
    page.wait_for_function("() => Array.from(document.querySelectorAll('#messages .message .from'))"
                           ".some(e => e.textContent.trim() === 'dora')")


# ------------------------------------------------------------- 9: the small ones


@pytest.mark.parametrize("raw,needle", [
    (b"GET /healthz HTTP/1.1\r\n\r\n", "Host"),
    (b"GET /healthz HTTP/1.1\nHost: x\n\n", "CRLF"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", "Host"),
])
def test_heads_http_11_does_not_allow_are_refused(shared_server, raw, needle):
    assert_json_error(http_exchange(shared_server.port, raw), 400, needle)


def test_tokens_before_nbf_and_garbage_tokens_get_plain_reasons(start_server):
    srv = start_server("--token-secret", SECRET)
    early = token(["*"], nbf=int(time.time()) + 120)
    resp = http_request(srv.port, "GET", f"/poll/news?since=0&timeout=0&token={early}")
    assert_json_error(resp, 401, "not valid yet")
    for garbage in ("", "garbage"):
        resp = http_request(srv.port, "GET", f"/poll/news?since=0&timeout=0&token={garbage}")
        assert resp.status == 401, resp
        assert "InvalidToken" not in resp.json()["error"], resp
