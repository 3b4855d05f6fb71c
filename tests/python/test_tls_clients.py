"""`throng serve --tls-cert --tls-key` with clients throng did not write, each with
its own TLS stack (Go's crypto/tls is in tests/go/tls_test.go):

- Node (tests/node/tls_client.mjs): the `ws` client from npm given the test CA
  with its `ca:` option echoes text, a 60 KB binary message, over
  wss://localhost/echo with an RSA leaf key (TLS 1.3, ALPN http/1.1), and the
  same client without the CA is refused; a `ws` subscriber gets what Node's own
  `https` and `fetch` publish, trusting the CA only through NODE_EXTRA_CA_CERTS
  (without it they are refused);
- headless Chromium (Playwright, browser.py's `pages`) that trusts the test
  leaf alone (--ignore-certificate-errors-spki-list with its SPKI hash, never
  "ignore every certificate error": a server with another leaf is refused):
  the dashboard (`/`) shows live data over https/wss, two chat pages (`/chat`)
  talk to each other, and `/throng.js` from a page subscribes over wss and
  gets what the API publishes. Every WebSocket those pages open is wss:// and
  no request of theirs is plain http://.

Each module run makes a throwaway CA and leaves for localhost and 127.0.0.1
with the openssl command-line tool; servers are stopped by pid (conftest).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from browser import CHROMIUM, pages  # noqa: F401  (fixture; `browser` is redefined below)
from procs import stop_process

NODE_DIR = Path(__file__).resolve().parent.parent / "node"
TLS_CERT_ERRORS = {
    "UNABLE_TO_VERIFY_LEAF_SIGNATURE", "SELF_SIGNED_CERT_IN_CHAIN",
    "UNABLE_TO_GET_ISSUER_CERT_LOCALLY", "DEPTH_ZERO_SELF_SIGNED_CERT",
}


# -- certificates ------------------------------------------------------------------


@dataclass
class Pki:
    ca: Path      # the CA certificate (PEM)
    cert: Path    # the leaf certificate (PEM)
    key: Path     # the leaf's key (PEM, PKCS#8)
    spki: str     # base64 of the SHA-256 of the leaf's SubjectPublicKeyInfo (DER)


def openssl(*args, cwd: Path, stdin: bytes | None = None) -> bytes:
    r = subprocess.run(["openssl", *map(str, args)], cwd=cwd, input=stdin, capture_output=True, timeout=60)
    assert r.returncode == 0, f"openssl {' '.join(map(str, args))}: {r.stderr.decode(errors='replace')}"
    return r.stdout


def make_pki(d: Path, key: str = "ec") -> Pki:
    """A CA (EC P-256) and a leaf for DNS:localhost, IP:127.0.0.1 whose key is
    "ec" (P-256) or "rsa" (2048 bits), both PKCS#8."""
    assert shutil.which("openssl"), "openssl is not installed"
    d.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=throng-test-ca", cwd=d)
    if key == "rsa":
        openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "leaf.key", cwd=d)
    else:
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "leaf.key", cwd=d)
    assert (d / "leaf.key").read_text().startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8
    openssl("req", "-new", "-key", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=localhost", cwd=d)
    (d / "leaf.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-sha256", "-extfile", "leaf.ext", "-out", "leaf.pem", cwd=d)
    pub = openssl("x509", "-in", "leaf.pem", "-pubkey", "-noout", cwd=d)
    der = openssl("pkey", "-pubin", "-outform", "der", cwd=d, stdin=pub)
    digest = openssl("dgst", "-sha256", "-binary", cwd=d, stdin=der)
    spki = openssl("base64", "-A", cwd=d, stdin=digest).decode().strip()
    return Pki(ca=d / "ca.pem", cert=d / "leaf.pem", key=d / "leaf.key", spki=spki)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki-ec"), "ec")


def tls_server(start_server, p: Pki, *flags):
    return start_server("--tls-cert", p.cert, "--tls-key", p.key, *flags)


# -- https from Python (the test's own checks) ---------------------------------------


def https(port: int, ca: Path, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "text/plain; charset=utf-8"} if body else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def publish(port: int, ca: Path, channel: str, text: str) -> int:
    status, body = https(port, ca, "POST", f"/api/publish/{channel}", text.encode())
    assert status == 200, (status, body)
    return json.loads(body)["seq"]


def channel_info(port: int, ca: Path, channel: str) -> dict:
    status, body = https(port, ca, "GET", f"/api/channels/{channel}")
    assert status == 200, (status, body)
    return json.loads(body)


def wait_subscribers(port: int, ca: Path, channel: str, n: int, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = channel_info(port, ca, channel)
        if info["subscribers"] == n:
            return info
        assert time.monotonic() < deadline, f"{channel}: want {n} subscribers, have {info}"
        time.sleep(0.05)


# -- Node -------------------------------------------------------------------------


def node_env(extra_ca: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_EXTRA_CA_CERTS", "NODE_OPTIONS")}
    if extra_ca is not None:
        env["NODE_EXTRA_CA_CERTS"] = str(extra_ca)
    return env


def node_check() -> None:
    assert shutil.which("node"), "node is not installed (scripts/test.sh installs it)"
    assert (NODE_DIR / "node_modules" / "ws").is_dir(), "run npm ci in tests/node (ws is missing)"


def run_node(opts: dict, extra_ca: Path | None = None, timeout: float = 20) -> tuple[int, list[dict], str]:
    node_check()
    r = subprocess.run(["node", str(NODE_DIR / "tls_client.mjs"), json.dumps(opts)], cwd=NODE_DIR,
                       env=node_env(extra_ca), capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    return r.returncode, lines, r.stderr


def test_node_ws_echo_over_tls_with_an_rsa_key(start_server, tmp_path):
    p = make_pki(tmp_path / "pki-rsa", "rsa")
    srv = tls_server(start_server, p)
    messages = ["hello over wss", "ünïcödé ✓", "x" * 3000]
    code, lines, err = run_node({"mode": "echo", "port": srv.port, "ca": str(p.ca), "messages": messages})
    assert code == 0, (code, lines, err)
    [report] = lines
    tls = report["tls"]
    assert tls["authorized"] is True, report
    assert tls["protocol"] == "TLSv1.3", report
    assert tls["alpn"] == "http/1.1", report
    assert tls["peerCN"] == "localhost", report
    assert report["echoes"] == [{"text": m, "binary": False} for m in messages], report
    assert report["big"] == {"binary": True, "length": 60 * 1024, "equal": True}, report
    # Without the test CA the same client refuses the server's certificate.
    assert report["untrusted"]["connected"] is False, report
    assert report["untrusted"]["code"] in TLS_CERT_ERRORS, report


def test_node_ws_subscriber_gets_what_node_https_and_fetch_publish(start_server, pki):
    node_check()
    srv = tls_server(start_server, pki)
    channel = "news"
    sub = subprocess.Popen(
        ["node", str(NODE_DIR / "tls_client.mjs"),
         json.dumps({"mode": "subscribe", "port": srv.port, "ca": str(pki.ca), "channel": channel, "count": 2})],
        cwd=NODE_DIR, env=node_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(sub.stdout.readline() or '{"type": "eof"}')
        assert first["type"] == "open", (first, sub.stderr.read() if sub.poll() is not None else "")
        assert first["tls"]["authorized"] is True and first["tls"]["protocol"] == "TLSv1.3", first
        wait_subscribers(srv.port, pki.ca, channel, 1)

        # https and fetch do not know the test CA unless NODE_EXTRA_CA_CERTS says so.
        code, lines, err = run_node({"mode": "publish", "port": srv.port, "channel": channel,
                                     "messages": ["refused", "refused"]})
        assert code == 2 and lines and lines[-1]["type"] == "error", (code, lines, err)
        assert re.search(r"certificate|UNABLE_TO_VERIFY", lines[-1]["error"]), lines

        code, lines, err = run_node({"mode": "publish", "port": srv.port, "channel": channel,
                                     "messages": ["via https ✓", "via fetch ✓"]}, extra_ca=pki.ca)
        assert code == 0, (code, lines, err)
        [report] = lines
        assert report["https"]["status"] == 200 and json.loads(report["https"]["body"])["seq"] == 1, report
        assert report["https"]["protocol"] == "TLSv1.3" and report["https"]["alpn"] == "http/1.1", report
        assert report["https"]["authorized"] is True, report
        assert report["fetch"]["status"] == 200 and json.loads(report["fetch"]["body"])["seq"] == 2, report

        out, err = sub.communicate(timeout=10)
        assert sub.returncode == 0, (sub.returncode, out, err)
        got = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert [(m["channel"], m["seq"], m["data"]) for m in got] == [
            (channel, 1, "via https ✓"), (channel, 2, "via fetch ✓")], got
    finally:
        stop_process(sub)


# -- Chromium ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(pki):
    """Chromium trusting the module's test leaf (by its SPKI hash) and nothing else
    it would not trust anyway; browser.py's `pages` runs on it."""
    if not CHROMIUM.exists():
        pytest.fail(f"Chromium not found at {CHROMIUM} (scripts/test.sh installs Debian's chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True,
            args=["--no-sandbox", f"--ignore-certificate-errors-spki-list={pki.spki}"],
        )
        try:
            yield b
        finally:
            b.close()


def origin(srv) -> str:
    return f"https://localhost:{srv.port}"


def watch_urls(page) -> dict:
    """Every WebSocket URL and request URL `page` uses from now on."""
    seen = {"ws": [], "requests": []}
    page.on("websocket", lambda ws: seen["ws"].append(ws.url))
    page.on("request", lambda req: seen["requests"].append(req.url))
    return seen


def assert_all_secure(seen: dict) -> None:
    assert seen["ws"], "the page opened no WebSocket"
    bad_ws = [u for u in seen["ws"] if not u.startswith("wss://")]
    assert not bad_ws, f"WebSockets not over TLS: {bad_ws}"
    bad = [u for u in seen["requests"] if u.startswith(("http://", "ws://"))]
    assert not bad, f"plain-http requests from an https page: {bad}"


def wait_number(page, selector: str, op: str, value: float, timeout_ms: int = 15_000) -> None:
    js = f"""([sel, v]) => {{
        const el = document.querySelector(sel);
        if (!el) return false;
        const n = parseFloat(el.textContent.replace(/,/g, ''));
        return !isNaN(n) && n {op} v;
    }}"""
    try:
        page.wait_for_function(js, arg=[selector, value], timeout=timeout_ms)
    except Exception as e:
        raise AssertionError(f"{selector} never became {op} {value} (now {page.locator(selector).text_content()!r})") from e


def open_chat(pages, srv, room: str, name: str):
    page = pages.new(name)
    seen = watch_urls(page)
    page.goto(f"{origin(srv)}/chat?room={room}&name={name}")
    expect(page.locator("#status")).to_have_attribute("data-state", "open")
    return page, seen


def test_chromium_trusts_only_the_test_leaf(start_server, pki, pages, tmp_path):
    """The browser's trust is the leaf's SPKI only: the same browser refuses a
    server whose certificate another CA signed (so nothing below passes because
    certificate errors are ignored wholesale)."""
    srv = tls_server(start_server, pki)
    page = pages.new("trusted")
    resp = page.goto(origin(srv) + "/healthz")
    assert resp is not None and resp.status == 200 and page.evaluate("() => document.body.innerText") == "ok"
    assert page.evaluate("() => window.isSecureContext") is True

    other = tls_server(start_server, make_pki(tmp_path / "other", "ec"))
    bad = pages.new("untrusted")
    with pytest.raises(Exception, match=r"ERR_CERT_AUTHORITY_INVALID"):
        bad.goto(origin(other) + "/healthz")
    pages.allow(r"ERR_CERT_AUTHORITY_INVALID")


def test_chromium_dashboard_over_https_shows_live_data(start_server, pki, pages):
    srv = tls_server(start_server, pki)
    page = pages.new("dashboard")
    seen = watch_urls(page)
    page.goto(origin(srv) + "/")
    expect(page.locator("#feed")).to_have_attribute("data-state", "open")
    expect(page.locator("#broker-state")).to_have_attribute("data-state", "up")
    expect(page.locator("#node")).to_contain_text(str(srv.pid))
    wait_number(page, "#conn-websocket", ">=", 1)  # the dashboard's own feed, over wss
    # The endpoint help speaks of the scheme the page was loaded with.
    expect(page.locator("#endpoints")).to_contain_text(f"wss://localhost:{srv.port}/ws/CHANNEL")
    expect(page.locator("#endpoints")).to_contain_text(f"POST https://localhost:{srv.port}/api/publish/CHANNEL")
    expect(page.locator("#endpoints")).not_to_contain_text("ws://localhost")
    expect(page.locator("#endpoints")).not_to_contain_text("http://localhost")

    # Live data: a chat page is a second WebSocket, and messages published over
    # https make a rate and a channel row with its subscriber.
    room = "dash"
    chat, chat_seen = open_chat(pages, srv, room, "erin")
    wait_number(page, "#conn-websocket", ">=", 2)
    channel = f"chat:{room}"
    row = page.locator("#channels tbody tr", has=page.locator("td.name", has_text=channel))
    deadline = time.monotonic() + 15
    i = 0
    # Publish until the page shows a rate in (bounded: 15 s at 20 a second).
    while time.monotonic() < deadline:
        publish(srv.port, pki.ca, channel, f"tick {i}")
        i += 1
        if page.evaluate("() => parseFloat(document.getElementById('rate-in').textContent) > 0"):
            break
        time.sleep(0.05)
    wait_number(page, "#rate-in", ">", 0, timeout_ms=1000)
    expect(row).to_have_count(1)
    expect(row.locator("td.subscribers")).to_have_text("1")
    # The chat page got them too.
    expect(chat.locator("#messages .message .text", has_text="tick 0")).to_have_count(1)
    pages.screenshot(page, "dashboard-https")
    assert_all_secure(seen)
    assert_all_secure(chat_seen)
    pages.assert_no_errors()


def test_chromium_chat_over_https_two_members(start_server, pki, pages):
    srv = tls_server(start_server, pki)
    room = "tls"
    a, a_seen = open_chat(pages, srv, room, "alice")
    b, b_seen = open_chat(pages, srv, room, "bob")
    expect(a.locator("#count")).to_have_text("2")
    expect(b.locator("#count")).to_have_text("2")
    assert channel_info(srv.port, pki.ca, f"chat:{room}")["subscribers"] == 2

    text = "hello bob, over wss"
    a.fill("#text", text)
    a.click("#send")
    for page in (b, a):
        mine = page.locator("#messages .message", has_text=text)
        expect(mine).to_have_count(1)
        expect(mine.locator(".from")).to_have_text("alice")
        expect(mine.locator(".text")).to_have_text(text)
    reply = "hi alice ✓"
    b.fill("#text", reply)
    b.click("#send")
    expect(a.locator("#messages .message", has_text=reply).locator(".from")).to_have_text("bob")
    # A message published through the https API shows up in both.
    publish(srv.port, pki.ca, f"chat:{room}", "from the api")
    for page in (a, b):
        expect(page.locator("#messages .message .text", has_text="from the api")).to_have_count(1)
    pages.screenshot(a, "chat-https-alice")
    b.close()
    expect(a.locator("#count")).to_have_text("1")
    assert_all_secure(a_seen)
    assert_all_secure(b_seen)
    pages.assert_no_errors()


SUBSCRIBE_JS = """([channel, base]) => { window.__got = []; window.__states = [];
    window.__sub = Throng.subscribe(channel, {
        base, onMessage: m => window.__got.push(m), onState: s => window.__states.push(s) }); }"""


@pytest.mark.parametrize("base", ["explicit", "default"])
def test_chromium_throng_js_over_wss_gets_what_the_api_publishes(start_server, pki, pages, base):
    """throng.js on a blank page of the https origin, with base given as the
    https origin or left to its default (location.origin)."""
    srv = tls_server(start_server, pki)
    page = pages.new("blank")
    seen = watch_urls(page)
    page.goto(origin(srv) + "/healthz")
    page.set_content("<!doctype html><title>blank</title><body></body>")
    assert page.evaluate("() => location.origin") == origin(srv)
    page.add_script_tag(url="/throng.js")
    assert page.evaluate("() => typeof Throng.subscribe") == "function"

    page.evaluate(SUBSCRIBE_JS, ["news", origin(srv) if base == "explicit" else None])
    page.wait_for_function("() => window.__sub.state === 'open'")
    wait_subscribers(srv.port, pki.ca, "news", 1)
    assert publish(srv.port, pki.ca, "news", "first over tls") == 1
    assert publish(srv.port, pki.ca, "news", "second ✓") == 2
    page.wait_for_function("() => window.__got.length >= 2")
    got = page.evaluate("() => window.__got.map(m => [m.channel, m.seq, m.data])")
    assert got == [["news", 1, "first over tls"], ["news", 2, "second ✓"]], got
    page.evaluate("() => window.__sub.close()")
    wait_subscribers(srv.port, pki.ca, "news", 0)
    assert seen["ws"] and all(u.startswith(f"wss://localhost:{srv.port}/ws/news?") for u in seen["ws"]), seen
    assert_all_secure(seen)
    pages.assert_no_errors()


def test_pusher_js_over_wss_gets_what_the_node_sdk_triggers_over_https(start_server, tmp_path):
    """pusher-js with forceTLS and the official Node server SDK with useTLS,
    both trusting the test certificate only through NODE_EXTRA_CA_CERTS."""
    from support.pusher import APP, PusherJs
    from support.tls import make_cert

    cert, key = make_cert(tmp_path, "pusher")
    srv = start_server("--tls-cert", cert, "--tls-key", key, "--pusher-app", APP)
    client = PusherJs(srv.port, tls=True, env={"NODE_EXTRA_CA_CERTS": str(cert)})
    try:
        assert client.connected()
        assert client.subscribe("private-tls")["type"] == "subscribed"
        client.send(op="server_trigger", channel="private-tls", event="over-tls", data={"n": 1})
        assert client.expect(lambda r: r["type"] == "server_triggered")["status"] == 200
        assert client.event("private-tls", "over-tls")["data"] == {"n": 1}
    finally:
        client.close()
    # Without the certificate trusted, neither gets through.
    untrusting = PusherJs(srv.port, tls=True)
    try:
        untrusting.send(op="server_trigger", channel="private-tls", event="x", data={})
        report = untrusting.expect(lambda r: r["type"] == "server_triggered")
        assert "error" in report, report
    finally:
        untrusting.close()
