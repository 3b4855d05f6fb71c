"""permessage-deflate (RFC 7692) in our own frames over a raw socket (rawws.py),
against `throng serve --permessage-deflate`: what goes out compressed (RSV1 at
and above --deflate-min-size, plain below it; one frame shared by every
subscriber of a window size), compressed client frames (whole, fragmented with a
ping in between, empty, the RFC's own examples), RSV1 where it is not allowed
(1002), a decompression bomb (1009, the server unharmed), corrupt DEFLATE data
and bad UTF-8 inside it (1007), SSE and long-poll never compressed, and the
/metrics deflate counters per delivery. The compressed bytes are inflated here
with Python's zlib (raw DEFLATE, 00 00 ff ff put back). Helpers: test_deflate.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import zlib

import pytest

from rawws import (
    OP_BINARY,
    OP_CLOSE,
    OP_CONT,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    RawConn,
    http_request,
    publish_ok,
    settled,
    wait_subscribers,
)
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
    frame_len,
    inflate,
    inflate_strict,
    offer_conn,
    read_data,
    RSV1,
    send_compressed,
)


# -- what goes out compressed -----------------------------------------------------------


def test_messages_at_or_above_the_min_size_are_compressed_smaller_ones_plain(start_server):
    srv = start_server("--permessage-deflate", "--deflate-min-size", "512")
    with offer_conn(srv.port, "permessage-deflate") as c:
        for n, want_rsv in [(1, 0), (200, 0), (511, 0), (512, RSV1), (513, RSV1), (60_000, RSV1)]:
            for opcode in (OP_TEXT, OP_BINARY):
                msg = compressible_text(n).encode() if opcode == OP_TEXT else compressible_bytes(n)
                assert len(msg) == n
                op, rsv, wire, data = echo_raw(c, opcode, msg, compressed=False)
                assert (op, rsv, data) == (opcode, want_rsv, msg), (n, opcode, rsv)
                if want_rsv:
                    assert inflate(wire) == msg
                else:
                    assert wire == msg
    # Channel deliveries: each subscriber gets the same frame the same way.
    srv2 = start_server("--permessage-deflate", "--deflate-min-size", "512", "--max-message-size", "1MiB")
    subs = [offer_conn(srv2.port, "permessage-deflate", path="/ws/sizes") for _ in range(3)]
    plain_sub = offer_conn(srv2.port, None, path="/ws/sizes")
    try:
        wait_subscribers(srv2.port, "sizes", 4)
        sizes = [100, 511, 512, 4096, 300_000]
        msgs = [compressible_text(n, seed=n) for n in sizes]
        for m in msgs:
            publish_ok(srv2.port, "sizes", m)
        for m in msgs:
            frames = []
            for c in subs:
                op, rsv, wire, data = read_data(c)
                assert (op, data) == (OP_TEXT, m.encode()) and rsv == (RSV1 if len(m) >= 512 else 0), (len(m), rsv)
                frames.append(wire)
            assert frames[0] == frames[1] == frames[2], "subscribers got different bytes for one message"
            op, rsv, wire, data = read_data(plain_sub)
            assert (op, rsv, wire) == (OP_TEXT, 0, m.encode()), "a subscriber that did not offer got RSV1"
    finally:
        for c in subs + [plain_sub]:
            c.close()


def test_one_channel_subscribers_of_different_windows(start_server):
    """Subscribers that asked for a 10-bit server window share one frame made
    with it; the others share one made with the full window; one that did not
    offer gets the message plain. Every one inflates to the message."""
    srv = start_server(*DEFLATE)
    offers = {
        "w15a": "permessage-deflate", "w15b": "permessage-deflate; client_max_window_bits",
        "w10a": "permessage-deflate; server_max_window_bits=10",
        "w10b": "permessage-deflate; server_max_window_bits=10; client_max_window_bits",
        "plain": None,
    }
    conns = {name: offer_conn(srv.port, offer, path="/ws/windows") for name, offer in offers.items()}
    try:
        wait_subscribers(srv.port, "windows", len(conns))
        msg = os.urandom(750).hex() * 8  # repeats 1500 bytes back: only a big window reaches them
        publish_ok(srv.port, "windows", msg)
        got = {name: read_data(c) for name, c in conns.items()}
    finally:
        for c in conns.values():
            c.close()
    for name, (op, rsv, wire, data) in got.items():
        assert (op, data) == (OP_TEXT, msg.encode()), name
        assert rsv == (0 if name == "plain" else RSV1), name
    assert got["w15a"][2] == got["w15b"][2] and got["w10a"][2] == got["w10b"][2]
    assert inflate_strict(got["w10a"][2], wbits=-10) == msg.encode()
    assert len(got["w15a"][2]) < len(got["w10a"][2]), "the full window found no more than the small one"


@pytest.mark.parametrize("fmt", ["raw", "json"])
def test_a_replay_from_history_is_compressed_too(start_server, fmt):
    srv = start_server(*DEFLATE, "--max-message-size", "1MiB")
    msgs = [compressible_text(n, seed=n) for n in (100, 5000, 200_000)]
    for m in msgs:
        publish_ok(srv.port, "past", m)
    with offer_conn(srv.port, "permessage-deflate", path=f"/ws/past?format={fmt}&since=0") as c:
        if fmt == "json":
            op, rsv, wire, data = read_data(c)
            assert json.loads(data)["event"] == "epoch", data
        for seq, m in enumerate(msgs, 1):
            op, rsv, wire, data = read_data(c)
            if fmt == "json":
                assert json.loads(data) == {"channel": "past", "seq": seq, "data": m}
            else:
                assert data == m.encode()
            assert rsv == (RSV1 if len(data) >= 256 else 0), (seq, len(data), rsv)
        live = compressible_text(3000, seed=99)
        publish_ok(srv.port, "past", live)
        op, rsv, wire, data = read_data(c)
        assert rsv == RSV1
        assert (json.loads(data)["data"] if fmt == "json" else data.decode()) == live


def test_a_chat_room_member_sends_compressed_and_the_room_gets_it(start_server):
    srv = start_server(*DEFLATE)
    room = "/ws/chat:squeeze"
    alice = offer_conn(srv.port, "permessage-deflate", path=room + "?name=alice")
    bob = offer_conn(srv.port, "permessage-deflate", path=room + "?format=json&name=bob")
    carol = offer_conn(srv.port, None, path=room + "?name=carol")
    try:
        wait_subscribers(srv.port, "chat:squeeze", 3)
        msg = compressible_text(6000, seed=5)
        send_compressed(alice, OP_TEXT, msg.encode())
        for c in (alice, carol):
            op, rsv, wire, data = read_data(c)
            assert (op, data) == (OP_TEXT, msg.encode())
            assert rsv == (RSV1 if c is alice else 0)
        while True:  # bob's welcome and join events come first
            op, rsv, wire, data = read_data(bob)
            event = json.loads(data)
            if "data" in event:
                break
        assert (event["from"], event["data"]) == ("alice", msg), event
        assert rsv == RSV1
    finally:
        for c in (alice, bob, carol):
            c.close()


def test_two_nodes_on_redis_each_compress_for_their_own_subscribers(start_server, shared_redis, prefix):
    """A message published on one node reaches a deflate subscriber of the other
    compressed, and a plain subscriber there plain."""
    from support.wait import wait_healthy

    across = f"{prefix}across"  # the Redis is shared: a channel no other test names
    a = start_server(*DEFLATE, "--broker", shared_redis.url)
    b = start_server(*DEFLATE, "--broker", shared_redis.url)
    for node in (a, b):
        wait_healthy(node.port)
    subs = {
        ("a", "deflate"): offer_conn(a.port, "permessage-deflate", path=f"/ws/{across}"),
        ("b", "deflate"): offer_conn(b.port, "permessage-deflate; server_max_window_bits=11", path=f"/ws/{across}"),
        ("b", "plain"): offer_conn(b.port, None, path=f"/ws/{across}"),
    }
    try:
        wait_subscribers(a.port, across, 3)
        msg = compressible_text(20_000, seed=11)
        publish_ok(a.port, across, msg)
        for (node, kind), c in subs.items():
            op, rsv, wire, data = read_data(c)
            assert (op, data) == (OP_TEXT, msg.encode()), (node, kind)
            assert rsv == (RSV1 if kind == "deflate" else 0), (node, kind)
            if node == "b" and kind == "deflate":
                assert inflate_strict(wire, wbits=-11) == msg.encode()
    finally:
        for c in subs.values():
            c.close()


def test_a_compressed_client_frame_is_understood(start_server):
    srv = start_server(*DEFLATE, "--max-message-size", "1MiB")
    with offer_conn(srv.port, "permessage-deflate; client_max_window_bits") as c:
        for opcode, msg in [
            (OP_TEXT, "hello ✓ ünïcødé".encode()),
            (OP_TEXT, compressible_text(300_000).encode()),
            (OP_BINARY, compressible_bytes(100_000)),
            (OP_BINARY, os.urandom(3000)),  # incompressible: still valid DEFLATE
        ]:
            op, rsv, wire, data = echo_raw(c, opcode, msg, compressed=True)
            assert (op, data) == (opcode, msg), (opcode, len(msg), len(data))
        # An empty message compressed is the single byte 00 (RFC 7692 7.2.3.6).
        c.send_frame(OP_TEXT, b"\x00", rsv=RSV1)
        assert read_data(c)[::3] == (OP_TEXT, b"")
        # Compressed and plain messages mix on one connection.
        assert echo_raw(c, OP_TEXT, b"plain", compressed=False)[3] == b"plain"
    # A client that agreed to a 9-bit window compresses with it.
    with offer_conn(srv.port, "permessage-deflate; client_max_window_bits=9") as c:
        assert_params(answered(c), BASE_OFFER + ["client_max_window_bits=9"])
        msg = compressible_text(50_000).encode()
        c.send_frame(OP_TEXT, deflate_raw(msg, wbits=-9), rsv=RSV1)
        assert read_data(c)[3] == msg


# RFC 7692 7.2.3: "Hello" compressed in the ways the RFC shows (7.2.3.2, a shared
# window, needs context takeover, which throng never agrees to).
RFC_EXAMPLES = {
    "7.2.3.1-one-block": "f248cdc9c90700",
    "7.2.3.3-bfinal": "f348cdc9c90700",
    "7.2.3.4-two-blocks": "f24805000000ffffcac9c90700",
    "7.2.3.5-stored-block": "000500faff48656c6c6f00",
}


@pytest.mark.parametrize("payload", RFC_EXAMPLES.values(), ids=RFC_EXAMPLES.keys())
def test_the_rfc7692_examples_of_hello(start_server, payload):
    srv = start_server(*DEFLATE)
    with offer_conn(srv.port, "permessage-deflate") as c:
        c.send_frame(OP_TEXT, bytes.fromhex(payload), rsv=RSV1)
        assert read_data(c)[::3] == (OP_TEXT, b"Hello")


def test_an_echo_prefix_and_a_compressed_message(start_server):
    """The echo answer is the prefix and the inflated message, compressed as one."""
    srv = start_server(*DEFLATE, "--echo-prefix", "P✓:")
    msg = compressible_text(30_000).encode()
    with offer_conn(srv.port, "permessage-deflate") as c:
        op, rsv, wire, data = echo_raw(c, OP_TEXT, msg, compressed=True)
        assert (op, rsv, data) == (OP_TEXT, RSV1, "P✓:".encode() + msg)
        op, rsv, wire, data = echo_raw(c, OP_TEXT, b"tiny", compressed=True)
        assert (op, rsv, data) == (OP_TEXT, 0, "P✓:tiny".encode())


def test_a_compressed_message_fragmented_across_frames(start_server):
    srv = start_server(*DEFLATE, "--max-message-size", "1MiB")
    msg = ("ünïcødé ✓ 🚀 " * 12_000).encode() + compressible_text(50_000).encode()
    comp = deflate_raw(msg)
    cuts = [0, 1, len(comp) // 3, len(comp) // 3 + 1, len(comp) - 2, len(comp)]
    parts = [comp[a:b] for a, b in zip(cuts, cuts[1:])]
    with offer_conn(srv.port, "permessage-deflate") as c:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            c.send_frame(OP_TEXT if i == 0 else OP_CONT, part, fin=last, rsv=RSV1 if i == 0 else 0)
            if i == 1:
                c.send_frame(OP_PING, b"between")  # a control frame amid the fragments
        fin, rsv, op, payload = c.read_frame()
        assert (op, payload) == (OP_PONG, b"between")
        op, rsv, wire, data = read_data(c)
        assert (op, data) == (OP_TEXT, msg)
        # The first fragment of an uncompressed message has RSV1 clear: also fine.
        c.send_frame(OP_BINARY, b"ab", fin=False)
        c.send_frame(OP_CONT, b"cd")
        assert read_data(c)[::3] == (OP_BINARY, b"abcd")


# -- protocol errors --------------------------------------------------------------------------


@pytest.mark.parametrize("server_flags,offer", [
    (DEFLATE, None),
    (DEFLATE, "permessage-deflate; server_max_window_bits=8"),
    ([], "permessage-deflate"),
], ids=["not-offered", "declined", "flag-off"])
def test_rsv1_without_negotiation_is_1002(start_server, server_flags, offer):
    srv = start_server(*server_flags)
    with offer_conn(srv.port, offer) as c:
        assert answered(c) is None
        send_compressed(c, OP_TEXT, b"hello")
        assert expect_close_code(c) == 1002


@pytest.mark.parametrize("frames", [
    [(OP_PING, b"p", True, RSV1)],
    [(OP_PONG, b"p", True, RSV1)],
    [(OP_CLOSE, struct.pack("!H", 1000), True, RSV1)],
    [(OP_TEXT, deflate_raw(b"hello, "), False, RSV1), (OP_CONT, deflate_raw(b"world"), True, RSV1)],
    [(OP_TEXT, b"plain start", False, 0), (OP_CONT, deflate_raw(b" then compressed"), True, RSV1)],
    [(OP_TEXT, deflate_raw(b"hello"), True, 0x2)],  # RSV2: no extension gives it a meaning
], ids=["ping", "pong", "close", "continuation", "continuation-of-plain", "rsv2"])
def test_rsv1_where_rfc7692_forbids_it_is_1002(start_server, frames):
    srv = start_server(*DEFLATE)
    with offer_conn(srv.port, "permessage-deflate") as c:
        assert answered(c) is not None
        for op, payload, fin, rsv in frames:
            c.send_frame(op, payload, fin=fin, rsv=rsv)
        assert expect_close_code(c) == 1002


@pytest.mark.parametrize("fragments", [1, 10])
def test_a_decompression_bomb_is_1009_and_the_server_is_fine(start_server, fragments):
    srv = start_server(*DEFLATE, "--max-message-size", "1MiB")
    bomb = deflate_raw(bytes(10 * 1024 * 1024), level=9)
    assert len(bomb) < 16 * 1024, len(bomb)  # on the wire it is far below the limit
    with offer_conn(srv.port, "permessage-deflate") as c:
        step = -(-len(bomb) // fragments)
        pieces = [bomb[i:i + step] for i in range(0, len(bomb), step)]
        for i, piece in enumerate(pieces):
            c.send_frame(OP_BINARY if i == 0 else OP_CONT, piece, fin=i == len(pieces) - 1,
                         rsv=RSV1 if i == 0 else 0)
        try:
            assert expect_close_code(c) == 1009
        except ConnectionError:
            raise AssertionError("the server dropped TCP without a close frame")
    # The server lives on and still inflates, right up to the limit.
    assert srv.proc.poll() is None
    with offer_conn(srv.port, "permessage-deflate") as c:
        exact = bytes(1024 * 1024)
        op, rsv, wire, data = echo_raw(c, OP_BINARY, exact, compressed=True)
        assert (op, rsv, data) == (OP_BINARY, RSV1, exact)
        send_compressed(c, OP_BINARY, exact + b"\x00")
        assert expect_close_code(c) == 1009
    with offer_conn(srv.port, "permessage-deflate") as c:
        assert echo_raw(c, OP_TEXT, b"still here", compressed=True)[3] == b"still here"


CORRUPT = {
    "bad-block-type": b"\xff" * 8,                       # block type 3 is reserved
    "bad-stored-length": b"\x00\x05\x00\x00\x00hello",   # NLEN is not ~LEN
    "too-far-back": bytes.fromhex("82b70eee7f1a"),      # refers to bytes before the start
    "bad-code-lengths": bytes.fromhex("5dc7512447e3"),  # a dynamic block's header is invalid
}


@pytest.mark.parametrize("payload", CORRUPT.values(), ids=CORRUPT.keys())
def test_corrupt_deflate_data_is_1007(start_server, payload):
    with pytest.raises(zlib.error):
        inflate(payload)  # zlib rejects it too
    srv = start_server(*DEFLATE)
    with offer_conn(srv.port, "permessage-deflate") as c:
        c.send_frame(OP_BINARY, payload, rsv=RSV1)
        assert expect_close_code(c) == 1007
    assert srv.proc.poll() is None


def test_invalid_utf8_inside_a_compressed_text_message_is_1007(start_server):
    srv = start_server(*DEFLATE)
    with offer_conn(srv.port, "permessage-deflate") as c:
        send_compressed(c, OP_TEXT, "valid ✓ then ".encode() + b"\xc3\x28")
        assert expect_close_code(c) == 1007


# -- other transports and the counters ------------------------------------------------------


def test_sse_and_long_poll_are_never_compressed(start_server):
    srv = start_server(*DEFLATE, "--max-message-size", "1MiB")
    msg = compressible_text(50_000)
    with RawConn(srv.port) as sse, offer_conn(srv.port, "permessage-deflate", path="/ws/plain") as ws:
        sse.send(
            f"GET /sse/plain HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nAccept: text/event-stream\r\n"
            "Accept-Encoding: gzip, deflate, br\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n".encode()
        )
        head = sse.read_http_response(body=False)
        assert head.status == 200, head
        assert head.header("content-encoding") is None, head
        assert head.header(EXT) is None, head
        wait_subscribers(srv.port, "plain", 2)
        publish_ok(srv.port, "plain", msg)
        # The SSE body carries the text itself (one data: line per line of it).
        first_line = msg.split("\n", 1)[0]
        sse.read_until(f"data: {first_line}\n".encode(), timeout=10)
        for line in msg.split("\n")[1:]:
            assert sse.read_until(b"\n", timeout=10) == f"data: {line}\n".encode()
        # The WebSocket subscriber got the same message compressed.
        assert read_data(ws)[1:4:2] == (RSV1, msg.encode())
    resp = http_request(srv.port, "GET", "/poll/plain?since=0",
                        headers=[("Accept-Encoding", "gzip, deflate, br")], timeout=10)
    assert resp.status == 200 and resp.header("content-encoding") is None, resp
    assert resp.json()["messages"][0]["data"] == msg


def test_metrics_count_deflate_bytes_per_delivery(start_server):
    srv = start_server(*DEFLATE)
    assert deflate_metrics(srv.port) == (0, 0)
    subs = [offer_conn(srv.port, "permessage-deflate", path="/ws/m") for _ in range(3)]
    plain_sub = offer_conn(srv.port, None, path="/ws/m")
    try:
        wait_subscribers(srv.port, "m", 4)
        msg = compressible_text(8000)
        publish_ok(srv.port, "m", msg)
        publish_ok(srv.port, "m", "small, so plain")
        wires = []
        for c in subs:
            op, rsv, wire, data = read_data(c)
            assert (rsv, data) == (RSV1, msg.encode())
            wires.append(wire)
            assert read_data(c)[1] == 0
        assert read_data(plain_sub)[1] == 0
        n, w = len(msg.encode()), len(wires[0])
        plain, wire = settled(lambda: deflate_metrics(srv.port), lambda v: v[0] >= 3 * n and v[1] >= 3 * w)
        # Whole frames (header and payload), once per delivery of this one
        # message, and nothing for the plain ones.
        assert plain == 3 * frame_len(n), (plain, n)
        assert wire == 3 * frame_len(w), (wire, w)
        assert plain > wire > 0
    finally:
        for c in subs + [plain_sub]:
            c.close()


def test_a_message_digest_survives_many_compressed_round_trips(start_server):
    """Many messages of varied sizes and content each way on one connection: no
    state leaks from one message's compression into the next."""
    srv = start_server(*DEFLATE, "--max-message-size", "1MiB")
    rnd = random.Random(7)
    with offer_conn(srv.port, "permessage-deflate; client_max_window_bits") as c:
        for i in range(200):
            n = rnd.choice([0, 1, 255, 256, 257, 1000, 4096, 33_000, 70_000])
            kind = rnd.choice(["text", "bytes", "random"])
            if kind == "text":
                msg, op = compressible_text(n, seed=i).encode(), OP_TEXT
            elif kind == "bytes":
                msg, op = compressible_bytes(n, seed=i), OP_BINARY
            else:
                msg, op = os.urandom(n), OP_BINARY
            got = echo_raw(c, op, msg, compressed=rnd.random() < 0.5)
            assert got[0] == op and hashlib.sha256(got[3]).digest() == hashlib.sha256(msg).digest(), (i, n, kind)
