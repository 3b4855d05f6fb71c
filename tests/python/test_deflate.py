"""permessage-deflate (RFC 7692, issue 28): `throng serve --permessage-deflate`.

- Python's `websockets` (a client throng did not write; it offers
  `permessage-deflate; client_max_window_bits` by default): large compressible
  text and binary messages echo intact, /ws/{channel} subscribers get 2 KB JSON
  messages published over HTTP intact, the answer names the extension with both
  no_context_takeover parameters, and /metrics shows the bytes saved. With the
  flag off (default, `off`, env) nothing is negotiated and everything still works.
- the switch, --deflate-min-size and --deflate-level as flags, env vars and
  config keys; bad values refused.
- negotiation in our own handshakes (rawws.py): the exact parameters answered to
  each offer, offers declined (server_max_window_bits=8, unknown or repeated
  parameters), and a honoured server_max_window_bits checked by inflating the
  server's frames through that small window with Python's zlib.

Also here: the helpers of test_deflate_frames.py (raw frames: what is compressed,
client frames, close codes, SSE/long-poll, /metrics) and test_deflate_clients.py
(Node `ws`, Chromium, pusher-js).
"""

from __future__ import annotations

import asyncio
import json
import os
import zlib

import pytest

from rawws import OP_BINARY, OP_TEXT, RawConn, publish_ok, settled, upgrade_request, wait_subscribers
from wsutil import recv_json, run, ws_connect
from support.deflate import (
    answered,
    assert_params,
    BASE_OFFER,
    compressible_bytes,
    compressible_text,
    DEFLATE,
    deflate_metrics,
    deflate_raw,
    echo_raw,
    expect_close_code,
    EXT,
    inflate_strict,
    json_doc,
    MIN,
    negotiated,
    offer_conn,
    PLAIN_BYTES,
    read_data,
    RSV1,
    send_compressed,
    WIRE_BYTES,
)


# -- payloads and zlib ---------------------------------------------------------------


# -- raw WebSocket with an offer -----------------------------------------------------


# -- websockets ------------------------------------------------------------------------


def test_websockets_echoes_large_text_and_binary_compressed(start_server):
    srv = start_server(*DEFLATE, "--max-message-size", "4MiB")
    text = compressible_text(1_000_000)
    binary = compressible_bytes(700_000)

    async def main():
        async with ws_connect(srv.url("/echo")) as ws:
            header = ws.response.headers.get("Sec-WebSocket-Extensions")
            # websockets offered client_max_window_bits without a value: the server
            # may name any 8..15 (the interface: 15, what it leaves to the client).
            assert_params(header, BASE_OFFER + ["client_max_window_bits=15"])
            pmd = negotiated(ws)
            assert pmd is not None, ws.protocol.extensions
            assert pmd.remote_no_context_takeover and pmd.local_no_context_takeover, vars(pmd)
            before = deflate_metrics(srv.port)
            for msg in (text, binary, "short ✓", b"\x00\x01"):
                await ws.send(msg)
                got = await asyncio.wait_for(ws.recv(), 20)
                assert type(got) is type(msg) and got == msg, (type(got), len(got), len(msg))
            return before

    before = run(main(), timeout=60)
    plain, wire = settled(lambda: deflate_metrics(srv.port), lambda v: v[0] - before[0] >= len(text) + len(binary))
    d_plain, d_wire = plain - before[0], wire - before[1]
    assert d_plain >= len(text) + len(binary), (before, plain, wire)
    # Both large messages went out compressed and much smaller.
    assert 0 < d_wire < d_plain / 3, (before, plain, wire)


def test_websockets_subscribers_get_2kb_json_messages_intact(start_server):
    srv = start_server(*DEFLATE)
    docs = [json_doc(i) for i in range(20)]

    async def main():
        async with ws_connect(srv.url("/ws/ticks")) as raw, ws_connect(srv.url("/ws/ticks?format=json")) as js:
            for ws in (raw, js):
                assert negotiated(ws) is not None
            wait_subscribers(srv.port, "ticks", 2)
            before = deflate_metrics(srv.port)
            for i, doc in enumerate(docs, 1):
                assert publish_ok(srv.port, "ticks", doc) == i
            as_json = publish_ok(srv.port, "ticks", docs[0].encode(), content_type="application/json")
            for i, doc in enumerate(docs, 1):
                got = await asyncio.wait_for(raw.recv(), 5)
                assert got == doc and json.loads(got)["i"] == i - 1
                env = await recv_json(js)
                assert env == {"channel": "ticks", "seq": i, "data": doc}, env
            # application/json is binary for a raw subscriber: the same bytes.
            assert await asyncio.wait_for(raw.recv(), 5) == docs[0].encode()
            env = await recv_json(js)
            assert env["seq"] == as_json and env.get("encoding") == "base64", env
            return before

    before = run(main())
    plain, wire = settled(lambda: deflate_metrics(srv.port), lambda v: v[1] > before[1])
    assert plain - before[0] > wire - before[1] > 0, (before, plain, wire)


@pytest.mark.parametrize("mode", ["tls", "io-uring-off", "io-uring-auto"])
def test_websockets_over_tls_and_both_ways_of_receiving(start_server, tmp_path, mode):
    """Large compressed messages span many reads over TLS, over epoll and over
    io_uring receives (where the machine has it; else auto is epoll again)."""
    import httpx

    from support.tls import client_context, make_cert

    flags = [*DEFLATE, "--max-message-size", "4MiB"]
    ssl_ctx, scheme = None, "http"
    if mode == "tls":
        cert, key = make_cert(tmp_path, "deflate")
        flags += ["--tls-cert", cert, "--tls-key", key]
        ssl_ctx, scheme = client_context(cert), "https"
    else:
        flags += ["--io-uring", mode.removeprefix("io-uring-")]
    srv = start_server(*flags)
    api = httpx.Client(base_url=f"{scheme}://127.0.0.1:{srv.port}", verify=ssl_ctx or True, timeout=10)
    ws_base = f"{'wss' if ssl_ctx else 'ws'}://127.0.0.1:{srv.port}"
    text, binary = compressible_text(1_500_000, seed=3), compressible_bytes(900_000, seed=4)
    published = compressible_text(300_000, seed=5)

    async def main():
        async with ws_connect(f"{ws_base}/echo", ssl=ssl_ctx) as echo, \
                ws_connect(f"{ws_base}/ws/wide", ssl=ssl_ctx) as sub:
            for ws in (echo, sub):
                assert negotiated(ws) is not None, ws.response.headers
            for msg in (text, binary):
                await echo.send(msg)
                assert await asyncio.wait_for(echo.recv(), 20) == msg
            for _ in range(200):
                if api.get("/api/channels/wide").json()["subscribers"] == 1:
                    break
                await asyncio.sleep(0.02)
            r = api.post("/api/publish/wide", content=published.encode(),
                         headers={"Content-Type": "text/plain; charset=utf-8"})
            assert r.status_code == 200, r.text
            assert await asyncio.wait_for(sub.recv(), 20) == published

    try:
        run(main(), timeout=60)
        metrics = api.get("/metrics").text
    finally:
        api.close()
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith(("throng_deflate_plain", "throng_deflate_wire"))}
    assert values[PLAIN_BYTES] > len(text) + len(binary) + len(published) > 3 * values[WIRE_BYTES] > 0, values


@pytest.mark.parametrize("how", ["default", "flag-off", "env-off"])
def test_off_negotiates_nothing_and_everything_still_works(start_server, how):
    flags = {"default": [], "flag-off": ["--permessage-deflate", "off"], "env-off": []}[how]
    env = {"THRONG_PERMESSAGE_DEFLATE": "off"} if how == "env-off" else None
    srv = start_server(*flags, "--deflate-min-size", str(MIN), "--max-message-size", "4MiB", env=env)
    text = compressible_text(300_000)

    async def main():
        async with ws_connect(srv.url("/echo")) as echo, ws_connect(srv.url("/ws/news")) as sub:
            for ws in (echo, sub):
                assert "Sec-WebSocket-Extensions" not in ws.response.headers, ws.response.headers
                assert ws.protocol.extensions == []
            await echo.send(text)
            assert await asyncio.wait_for(echo.recv(), 10) == text
            wait_subscribers(srv.port, "news", 1)
            doc = json_doc(7)
            publish_ok(srv.port, "news", doc)
            assert await asyncio.wait_for(sub.recv(), 5) == doc

    run(main())
    # Raw: the offer is declined and a large message comes back plain.
    with offer_conn(srv.port, "permessage-deflate; client_max_window_bits") as c:
        assert answered(c) is None
        op, rsv, wire, data = echo_raw(c, OP_TEXT, text.encode(), compressed=False)
        assert (op, rsv, data) == (OP_TEXT, 0, text.encode())
    assert deflate_metrics(srv.port) == (0, 0)


@pytest.mark.parametrize("how", ["flag", "flag-on", "env", "config", "config-bool"])
def test_each_way_of_turning_it_on(start_server, tmp_path, how):
    """The switch and the threshold, as flags, env vars and config-file keys."""
    env, flags = None, []
    if how == "flag":
        flags = ["--permessage-deflate", "--deflate-min-size", "1000"]
    elif how == "flag-on":
        flags = ["--permessage-deflate", "on", "--deflate-min-size", "1000"]
    elif how == "config-bool":
        cfg = tmp_path / "throng.toml"
        cfg.write_text('permessage-deflate = true\ndeflate-min-size = "1000"\n')
        flags = ["--config", cfg]
    elif how == "env":
        env = {"THRONG_PERMESSAGE_DEFLATE": "on", "THRONG_DEFLATE_MIN_SIZE": "1000"}
    else:
        cfg = tmp_path / "throng.toml"
        cfg.write_text('permessage-deflate = "on"\ndeflate-min-size = 1000\n')
        flags = ["--config", cfg]
    srv = start_server(*flags, env=env)
    with offer_conn(srv.port, "permessage-deflate") as c:
        assert_params(answered(c), BASE_OFFER)
        small = compressible_text(999).encode()
        big = compressible_text(1000).encode()
        assert echo_raw(c, OP_TEXT, small, compressed=False)[1:] == (0, small, small)
        op, rsv, wire, data = echo_raw(c, OP_TEXT, big, compressed=False)
        assert (op, rsv, data) == (OP_TEXT, RSV1, big) and len(wire) < len(big)


@pytest.mark.parametrize(
    "flags,mentions",
    [
        (["--permessage-deflate", "maybe"], "maybe"),
        (["--permessage-deflate", "--deflate-level", "10"], "deflate-level"),
        (["--permessage-deflate", "--deflate-min-size", "lots"], "deflate-min-size"),
    ],
    ids=["on-off", "level", "min-size"],
)
def test_bad_values_are_refused(start_server, flags, mentions):
    srv = start_server(*flags, wait=False)
    assert srv.wait(10) not in (None, 0), "throng started with a bad value"
    assert mentions in srv.stderr(), srv.stderr()


def test_default_threshold_is_between_tiny_and_large(start_server):
    """Whatever the measured default of --deflate-min-size is, 16 bytes go plain
    and 64 KB of text go compressed."""
    srv = start_server("--permessage-deflate")
    with offer_conn(srv.port, "permessage-deflate") as c:
        tiny = b"sixteen bytes ok"
        assert echo_raw(c, OP_TEXT, tiny, compressed=False)[1:] == (0, tiny, tiny)
        big = compressible_text(60_000).encode()
        op, rsv, wire, data = echo_raw(c, OP_TEXT, big, compressed=False)
        assert rsv == RSV1 and data == big and len(wire) < len(big) / 3


def test_deflate_level_is_used(start_server):
    """Level 0 only stores, which is never smaller, so such messages go plain
    (permessage-deflate lets a sender choose per message) and nothing is
    counted; levels 1 and 9 compress, 9 smaller than 1."""
    msg = compressible_text(20_000).encode()
    wires = {}
    for level in ("0", "1", "9"):
        srv = start_server(*DEFLATE, "--deflate-level", level)
        with offer_conn(srv.port, "permessage-deflate") as c:
            op, rsv, wire, data = echo_raw(c, OP_TEXT, msg, compressed=False)
            assert data == msg
            wires[level] = (rsv, len(wire))
        if level == "0":
            assert deflate_metrics(srv.port) == (0, 0)
    assert wires["0"] == (0, len(msg)), wires
    assert wires["1"][0] == wires["9"][0] == RSV1, wires
    assert wires["9"][1] < wires["1"][1] < len(msg) / 3, wires


def test_incompressible_messages_go_plain(start_server):
    """What compressing would not make smaller goes plain, RSV1 clear, even
    above --deflate-min-size."""
    srv = start_server(*DEFLATE)
    with offer_conn(srv.port, "permessage-deflate") as c:
        noise = os.urandom(5000)
        assert echo_raw(c, OP_BINARY, noise, compressed=False)[1:3] == (0, noise)
        text = compressible_text(5000).encode()
        assert echo_raw(c, OP_TEXT, text, compressed=False)[1] == RSV1


# -- negotiation ---------------------------------------------------------------------------

NEGOTIATIONS = [
    ("permessage-deflate", BASE_OFFER),
    ("permessage-deflate; client_max_window_bits", BASE_OFFER + ["client_max_window_bits=15"]),
    ("permessage-deflate; client_max_window_bits=12", BASE_OFFER + ["client_max_window_bits=12"]),
    ("permessage-deflate; server_max_window_bits=10", BASE_OFFER + ["server_max_window_bits=10"]),
    ("permessage-deflate; server_max_window_bits=15", BASE_OFFER + ["server_max_window_bits=15"]),
    ("permessage-deflate;server_no_context_takeover;client_no_context_takeover", BASE_OFFER),
    ("permessage-deflate; server_max_window_bits=\"11\"; client_max_window_bits",
     BASE_OFFER + ["server_max_window_bits=11", "client_max_window_bits=15"]),
    ("x-webkit-deflate-frame, permessage-deflate", BASE_OFFER),
    # The first offer it can honour: 8 is declined, the next is taken.
    ("permessage-deflate; server_max_window_bits=8, permessage-deflate; client_max_window_bits",
     BASE_OFFER + ["client_max_window_bits=15"]),
    ("permessage-deflate; server_max_window_bits=8", None),
    ("permessage-deflate; server_max_window_bits=16", None),
    ("permessage-deflate; no_such_parameter", None),
    ("permessage-deflate; server_no_context_takeover; server_no_context_takeover", None),
    ("x-webkit-deflate-frame", None),
]


@pytest.mark.parametrize("offer,want", NEGOTIATIONS, ids=[o for o, _ in NEGOTIATIONS])
def test_negotiated_parameters(start_server, offer, want):
    srv = start_server(*DEFLATE)
    for path in ("/echo", "/ws/neg"):
        with offer_conn(srv.port, offer, path=path) as c:
            if want is None:
                assert answered(c) is None, f"{path}: {answered(c)!r}"
            else:
                assert_params(answered(c), want)
    # Declined or not, the connection works; large messages are compressed only if
    # the extension was agreed.
    msg = compressible_text(5000).encode()
    with offer_conn(srv.port, offer) as c:
        op, rsv, wire, data = echo_raw(c, OP_TEXT, msg, compressed=False)
        assert (op, data) == (OP_TEXT, msg)
        assert rsv == (0 if want is None else RSV1)


def test_the_offer_spread_over_two_header_lines(start_server):
    srv = start_server(*DEFLATE)
    req, _ = upgrade_request(host=f"127.0.0.1:{srv.port}", extra=[
        ("Sec-WebSocket-Extensions", "permessage-deflate; server_max_window_bits=8"),
        ("Sec-WebSocket-Extensions", "permessage-deflate; server_max_window_bits=12"),
    ])
    with RawConn(srv.port) as c:
        c.send(req)
        resp = c.read_http_response()
        assert resp.status == 101, resp
        assert_params(resp.header(EXT), BASE_OFFER + ["server_max_window_bits=12"])


def test_server_max_window_bits_10_is_honoured(start_server):
    """The message repeats a 1500-byte random block: a 32 KiB window finds the
    repeats 1500 bytes back, a 1 KiB window cannot; so what the server sends must
    inflate through a 1 KiB window, and the check below is shown to catch a
    stream made with the larger window."""
    srv = start_server(*DEFLATE)
    block = os.urandom(750).hex().encode()
    msg = block * 8
    with pytest.raises(zlib.error, match="too far back"):
        inflate_strict(deflate_raw(msg, wbits=-15), wbits=-10)
    with offer_conn(srv.port, "permessage-deflate; server_max_window_bits=10") as c:
        assert_params(answered(c), BASE_OFFER + ["server_max_window_bits=10"])
        c.send_frame(OP_BINARY, msg)
        op, rsv, wire, data = read_data(c)
        assert (op, rsv, data) == (OP_BINARY, RSV1, msg)
        assert inflate_strict(wire, wbits=-10) == msg
    # Without the parameter the server may use its full window (and this message
    # then shrinks a lot more); inflating it with 15 bits works either way.
    with offer_conn(srv.port, "permessage-deflate") as c:
        c.send_frame(OP_BINARY, msg)
        op, rsv, wire15, data = read_data(c)
        assert (rsv, data) == (RSV1, msg) and inflate_strict(wire15, wbits=-15) == msg


def test_server_max_window_bits_8_declined_and_the_connection_works_plain(start_server):
    srv = start_server(*DEFLATE)
    with offer_conn(srv.port, "permessage-deflate; server_max_window_bits=8") as c:
        assert answered(c) is None
        msg = compressible_text(10_000).encode()
        assert echo_raw(c, OP_TEXT, msg, compressed=False)[:2] == (OP_TEXT, 0)
        # and RSV1 from the client is now a protocol error
        send_compressed(c, OP_TEXT, b"hello")
        assert expect_close_code(c) == 1002
