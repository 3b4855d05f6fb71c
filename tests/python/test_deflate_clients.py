"""permessage-deflate with clients throng did not write, each seen on the wire by
a relay of our own (Tap) between the client and throng, which keeps every byte
both ways so the frames' RSV1 bits and compressed payloads can be checked:

- Node's `ws` (npm) with perMessageDeflate (tests/node/deflate_client.mjs): it
  offers `permessage-deflate; client_max_window_bits`; text and binary echoes of
  up to 200 KB go compressed both ways and come back equal; a /ws/{channel}
  subscriber gets 2 KB JSON messages and a 300 KB one intact, compressed; with
  `serverMaxWindowBits: 10` the server's frames inflate through a 1 KiB window.
- headless Chromium (browser.py): a page's WebSocket offers the extension, its
  `ws.extensions` names it, a published 300 KB message and a 2 KB one arrive
  intact, and a 200 KB message the page sends (compressed by Chromium) echoes.
- pusher-js: its Node build opens its WebSocket with faye-websocket and no
  extensions, so it offers no permessage-deflate at all; the test asserts that
  (no offer, no answer, no RSV1, nothing counted) and that a 2 KB event arrives
  intact. The same pusher-js in Chromium (its web build uses the browser's
  WebSocket) does negotiate it and gets the event compressed; so does a raw
  Pusher-protocol client of ours that offers it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pusher
import pytest

from browser import browser, pages  # noqa: F401 (fixtures)
from procs import stop_process
from rawws import OP_BINARY, OP_TEXT, publish_ok, settled, wait_subscribers
from support.deflate import (
    assert_params,
    BASE_OFFER,
    compressible_text,
    DEFLATE,
    deflate_metrics,
    deflate_raw,
    inflate,
    inflate_strict,
    json_doc,
    offer_conn,
    params,
    read_data,
    RSV1,
)

NODE_DIR = Path(__file__).resolve().parent.parent / "node"
APP_ID, KEY, SECRET = "4242", "app-key", "app-secret"
APP = f"{APP_ID}:{KEY}:{SECRET}"


# -- a relay that keeps the bytes ----------------------------------------------------


class Tap:
    """A TCP relay on a free loopback port in front of `upstream`: every accepted
    connection is forwarded to it, and each direction's bytes are kept."""

    def __init__(self, upstream: int):
        self.upstream = upstream
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.conns: list[dict] = []
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.lsock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            rec = {"c2s": bytearray(), "s2c": bytearray()}
            with self.lock:
                self.conns.append(rec)
                self.socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, rec["c2s"]), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, rec["s2c"]), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, buf: bytearray) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                buf += data
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def websockets(self) -> list[WireSession]:
        """The connections that were WebSocket upgrades answered 101, in order."""
        with self.lock:
            conns = list(self.conns)
        out = []
        for rec in conns:
            c2s, s2c = bytes(rec["c2s"]), bytes(rec["s2c"])
            if b"\r\n\r\n" not in c2s or b"\r\n\r\n" not in s2c:
                continue
            if not s2c.startswith(b"HTTP/1.1 101"):
                continue
            out.append(WireSession(c2s, s2c))
        return out

    def only_websocket(self) -> WireSession:
        sessions = self.websockets()
        assert len(sessions) == 1, f"{len(sessions)} WebSocket connections through the tap"
        return sessions[0]

    def close(self) -> None:
        self.lsock.close()
        with self.lock:
            for s in self.socks:
                try:
                    s.close()
                except OSError:
                    pass


def head_headers(head: bytes) -> dict[str, list[str]]:
    headers: dict[str, list[str]] = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        k, _, v = line.partition(":")
        headers.setdefault(k.strip().lower(), []).append(v.strip())
    return headers


def parse_frames(data: bytes) -> list[tuple[bool, int, int, bytes]]:
    """Complete frames in `data`: (fin, rsv, opcode, unmasked payload)."""
    frames, i = [], 0
    while i + 2 <= len(data):
        b0, b1 = data[i], data[i + 1]
        n, j = b1 & 0x7F, i + 2
        if n == 126:
            if j + 2 > len(data):
                break
            (n,) = struct.unpack("!H", data[j:j + 2])
            j += 2
        elif n == 127:
            if j + 8 > len(data):
                break
            (n,) = struct.unpack("!Q", data[j:j + 8])
            j += 8
        key = None
        if b1 & 0x80:
            key, j = data[j:j + 4], j + 4
        if j + n > len(data):
            break
        payload = data[j:j + n]
        if key:
            payload = bytes(b ^ key[k % 4] for k, b in enumerate(payload)) if n < 4096 else _unmask(payload, key)
        frames.append((bool(b0 & 0x80), (b0 >> 4) & 7, b0 & 0xF, payload))
        i = j + n
    return frames


def _unmask(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    k = int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(payload, "big") ^ k).to_bytes(n, "big")


def messages(frames) -> list[tuple[int, int, bytes, bytes]]:
    """Data messages from frames: (opcode, rsv of the first frame, wire payload,
    payload inflated when RSV1 was set). Control frames are skipped."""
    out, cur = [], None
    for fin, rsv, op, payload in frames:
        if op >= 0x8:
            continue
        if cur is None:
            cur = [op, rsv, b""]
        cur[2] += payload
        if fin:
            op0, rsv0, wire = cur
            out.append((op0, rsv0, wire, inflate(wire) if rsv0 & RSV1 else wire))
            cur = None
    return out


class WireSession:
    def __init__(self, c2s: bytes, s2c: bytes):
        req_head, _, c2s_rest = c2s.partition(b"\r\n\r\n")
        resp_head, _, s2c_rest = s2c.partition(b"\r\n\r\n")
        self.request = head_headers(req_head)
        self.response = head_headers(resp_head)
        self.offer = ", ".join(self.request.get("sec-websocket-extensions", [])) or None
        answers = self.response.get("sec-websocket-extensions", [])
        assert len(answers) <= 1, answers
        self.answer = answers[0] if answers else None
        self.sent = messages(parse_frames(c2s_rest))       # client -> server
        self.received = messages(parse_frames(s2c_rest))   # server -> client


@pytest.fixture
def tap():
    made: list[Tap] = []

    def make(port: int) -> Tap:
        t = Tap(port)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


# -- Node ws ---------------------------------------------------------------------------


def node_check() -> None:
    assert shutil.which("node"), "node is not installed (scripts/test.sh installs it)"
    assert (NODE_DIR / "node_modules" / "ws").is_dir(), "run npm ci in tests/node (ws is missing)"


def run_node(opts: dict, timeout: float = 30) -> list[dict]:
    node_check()
    r = subprocess.run(["node", str(NODE_DIR / "deflate_client.mjs"), json.dumps(opts)], cwd=NODE_DIR,
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert r.returncode == 0, (r.returncode, lines, r.stderr)
    return lines


NODE_SIZES = [10, 2048, 200_000]


def test_node_ws_echo_is_compressed_both_ways(start_server, tap):
    srv = start_server(*DEFLATE, "--max-message-size", "1MiB")
    t = tap(srv.port)
    opened, report = run_node({"mode": "echo", "url": f"ws://127.0.0.1:{t.port}/echo", "sizes": NODE_SIZES})
    assert opened["type"] == "open" and opened["extensions"] == "permessage-deflate", opened
    assert_params(opened["header"], BASE_OFFER + ["client_max_window_bits=15"])
    echoes = report["echoes"]
    assert len(echoes) == 2 * len(NODE_SIZES)
    for e in echoes:
        assert e["equal"] and e["binary"] == e["sentBinary"], e

    wire = t.only_websocket()
    assert wire.offer is not None and params(wire.offer)[0] == "permessage-deflate", wire.offer
    assert wire.answer == opened["header"]
    assert len(wire.sent) == len(wire.received) == len(echoes)
    for (op_s, rsv_s, _, data_s), (op_r, rsv_r, wire_r, data_r), e in zip(wire.sent, wire.received, echoes):
        assert op_s == op_r == (OP_BINARY if e["sentBinary"] else OP_TEXT)
        assert data_r == data_s and hashlib.sha256(data_r).hexdigest() == e["sha256"]
        big = e["size"] >= 1024  # ws's own threshold for compressing what it sends
        assert rsv_s == (RSV1 if big else 0), (e, rsv_s)
        assert rsv_r == (RSV1 if e["size"] >= 256 else 0), (e, rsv_r)
        if e["size"] == 200_000 and not e["sentBinary"]:
            assert len(wire_r) < e["size"] / 3


def test_node_ws_subscriber_gets_compressed_channel_messages(start_server, tap):
    node_check()
    srv = start_server(*DEFLATE, "--max-message-size", "1MiB")
    t = tap(srv.port)
    docs = [json_doc(i) for i in range(10)] + [compressible_text(300_000)]
    sub = subprocess.Popen(
        ["node", str(NODE_DIR / "deflate_client.mjs"),
         json.dumps({"mode": "subscribe", "url": f"ws://127.0.0.1:{t.port}/ws/feed?format=json",
                     "count": len(docs)})],
        cwd=NODE_DIR, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = json.loads(sub.stdout.readline() or '{"type": "eof"}')
        assert first["type"] == "open", (first, sub.stderr.read() if sub.poll() is not None else "")
        assert first["extensions"] == "permessage-deflate", first
        wait_subscribers(srv.port, "feed", 1)
        for i, doc in enumerate(docs, 1):
            assert publish_ok(srv.port, "feed", doc) == i
        out, err = sub.communicate(timeout=20)
        assert sub.returncode == 0, (sub.returncode, out, err)
    finally:
        stop_process(sub)
    got = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [m["binary"] for m in got] == [False] * len(docs)
    envelopes = [json.loads(m["data"]) for m in got]
    assert envelopes == [{"channel": "feed", "seq": i, "data": d} for i, d in enumerate(docs, 1)]
    wire = t.only_websocket()
    assert len(wire.received) == len(docs)
    assert all(rsv == RSV1 for _, rsv, _, _ in wire.received), [r[1] for r in wire.received]
    plain, compressed = settled(lambda: deflate_metrics(srv.port), lambda v: v[1] > 0)
    assert plain > compressed > 0


def test_node_ws_asking_for_a_small_server_window_gets_it(start_server, tap):
    srv = start_server(*DEFLATE)
    t = tap(srv.port)
    deflate = {"serverMaxWindowBits": 10, "clientMaxWindowBits": 12}
    opened, report = run_node({"mode": "echo", "url": f"ws://127.0.0.1:{t.port}/echo", "deflate": deflate,
                               "sizes": [40_000]})
    assert_params(opened["header"], BASE_OFFER + ["server_max_window_bits=10", "client_max_window_bits=12"])
    assert all(e["equal"] for e in report["echoes"]), report
    wire = t.only_websocket()
    for op, rsv, payload, data in wire.received:
        assert rsv == RSV1 and inflate_strict(payload, wbits=-10) == data


# -- Chromium ------------------------------------------------------------------------------


OPEN_JS = """async ([url]) => {
    const ws = new WebSocket(url);
    window.__ws = ws;
    window.__got = [];
    ws.onmessage = (e) => window.__got.push(e.data);
    await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
    return ws.extensions;
}"""


def test_chromium_negotiates_and_gets_large_messages_intact(start_server, tap, pages):
    srv = start_server(*DEFLATE, "--max-message-size", "1MiB")
    t = tap(srv.port)
    page = pages.new("deflate")
    page.goto(f"http://127.0.0.1:{t.port}/healthz")
    extensions = page.evaluate(OPEN_JS, [f"ws://127.0.0.1:{t.port}/ws/big"])
    assert extensions.startswith("permessage-deflate"), extensions
    assert_params(extensions, BASE_OFFER + ["client_max_window_bits=15"])
    wait_subscribers(srv.port, "big", 1)
    large, doc = compressible_text(300_000), json_doc(1)
    publish_ok(srv.port, "big", large)
    publish_ok(srv.port, "big", doc)
    page.wait_for_function("() => window.__got.length >= 2")
    got = page.evaluate("() => window.__got")
    assert got[0] == large and got[1] == doc, [len(g) for g in got]

    # What the page sends, Chromium compresses; the server inflates and echoes.
    page.evaluate("""async ([url, n]) => {
        let s = ""; for (let i = 0; s.length < n; i++) s += `line ${i % 97} of the page's message\\n`;
        window.__sent = s.slice(0, n);
        const ws = new WebSocket(url);
        window.__echo = null;
        ws.onmessage = (e) => { window.__echo = e.data; };
        await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
        ws.send(window.__sent);
    }""", [f"ws://127.0.0.1:{t.port}/echo", 200_000])
    page.wait_for_function("() => window.__echo !== null")
    assert page.evaluate("() => window.__echo === window.__sent && window.__echo.length") == 200_000

    sub, echo = t.websockets()
    assert sub.offer is not None and "permessage-deflate" in sub.offer, sub.offer
    assert [(op, rsv) for op, rsv, _, _ in sub.received] == [(OP_TEXT, RSV1), (OP_TEXT, RSV1)]
    assert sub.received[0][3] == large.encode()
    [(op, rsv, _, sent)] = echo.sent
    assert (op, rsv) == (OP_TEXT, RSV1), "Chromium did not compress what it sent"
    assert [r[1:4:2] for r in echo.received] == [(RSV1, sent)]
    pages.assert_no_errors()


# -- pusher-js -----------------------------------------------------------------------------


def sdk(port: int) -> pusher.Pusher:
    return pusher.Pusher(app_id=APP_ID, key=KEY, secret=SECRET, host="127.0.0.1", port=port, ssl=False)


def event_data(n: int = 2048) -> dict:
    return {"doc": json.loads(json_doc(5, n - 100)), "note": "two kilobytes of event ✓"}


def test_pusher_js_in_node_offers_no_deflate_and_still_gets_a_2kb_event(start_server, tap):
    """pusher-js 8's Node build dials with faye-websocket and passes it no
    extensions: it never offers permessage-deflate, so throng (flag on) answers
    none, sends its frames plain, and counts nothing as compressed."""
    from support.pusher import PusherJs

    srv = start_server(*DEFLATE, "--pusher-app", APP)
    t = tap(srv.port)
    client = PusherJs(t.port)
    try:
        client.connected()
        assert client.subscribe("deflate-news")["type"] == "subscribed"
        data = event_data()
        sdk(srv.port).trigger("deflate-news", "big", data)
        assert client.event("deflate-news", "big")["data"] == data
    finally:
        client.close()
    wire = t.only_websocket()
    assert wire.offer is None, f"pusher-js offered {wire.offer!r}"
    assert wire.answer is None
    events = [json.loads(d) for _, _, _, d in wire.received]
    big = [e for e in events if e.get("event") == "big"]
    assert len(big) == 1 and len(json.dumps(big[0])) > 2048
    assert all(rsv == 0 for _, rsv, _, _ in wire.received)
    assert deflate_metrics(srv.port) == (0, 0)


def test_a_pusher_protocol_client_that_offers_deflate_gets_the_event_compressed(start_server):
    srv = start_server(*DEFLATE, "--pusher-app", APP)
    with offer_conn(srv.port, "permessage-deflate; client_max_window_bits",
                    path=f"/app/{KEY}?protocol=7&client=raw&version=1") as c:
        assert_params(c.handshake_response.header("sec-websocket-extensions"),
                      BASE_OFFER + ["client_max_window_bits=15"])
        op, rsv, wire, hello = read_data(c)
        assert json.loads(hello)["event"] == "pusher:connection_established"
        c.send_frame(OP_TEXT, json.dumps({"event": "pusher:subscribe", "data": {"channel": "deflate-news"}}).encode())
        op, rsv, wire, ok = read_data(c)
        assert json.loads(ok)["event"] == "pusher_internal:subscription_succeeded", ok
        data = event_data()
        sdk(srv.port).trigger("deflate-news", "big", data)
        op, rsv, wire, raw = read_data(c)
        event = json.loads(raw)
        assert (event["event"], event["channel"], json.loads(event["data"])) == ("big", "deflate-news", data)
        assert rsv == RSV1 and len(wire) < len(raw), (rsv, len(wire), len(raw))
        # The protocol's own ping, compressed by the client, is understood.
        c.send_frame(OP_TEXT, deflate_raw(b'{"event":"pusher:ping","data":{}}'), rsv=RSV1)
        assert json.loads(read_data(c)[3])["event"] == "pusher:pong"


def test_pusher_js_in_chromium_negotiates_deflate_and_gets_a_2kb_event(start_server, tap, pages):
    srv = start_server(*DEFLATE, "--pusher-app", APP)
    t = tap(srv.port)
    page = pages.new("pusher-js")
    page.goto(f"http://127.0.0.1:{t.port}/healthz")
    page.add_script_tag(path=str(NODE_DIR / "node_modules" / "pusher-js" / "dist" / "web" / "pusher.min.js"))
    page.evaluate("""([key, port]) => {
        window.seen = [];
        const client = new Pusher(key, {cluster: "local", wsHost: "127.0.0.1", wsPort: port,
                                        forceTLS: false, enabledTransports: ["ws"], disableStats: true});
        const channel = client.subscribe("deflate-news");
        channel.bind("pusher:subscription_succeeded", () => window.seen.push("subscribed"));
        channel.bind("big", (data) => window.seen.push(data));
    }""", [KEY, t.port])
    page.wait_for_function("window.seen.includes('subscribed')")
    data = event_data()
    sdk(srv.port).trigger("deflate-news", "big", data)
    page.wait_for_function("window.seen.length >= 2")
    assert page.evaluate("window.seen[1]") == data
    wire = t.only_websocket()
    assert wire.offer is not None and "permessage-deflate" in wire.offer, wire.offer
    assert_params(wire.answer, BASE_OFFER + ["client_max_window_bits=15"])
    big = [(rsv, json.loads(d)) for _, rsv, _, d in wire.received if b'"big"' in d]
    assert len(big) == 1 and big[0][0] == RSV1, big
    plain, compressed = settled(lambda: deflate_metrics(srv.port), lambda v: v[1] > 0)
    assert plain > compressed > 0
