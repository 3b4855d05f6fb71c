"""permessage-deflate helpers shared by test_deflate*.py: compressible payloads
and zlib both ways, a raw WebSocket with an extension offer and what it was
answered, compressed frames sent and read, the deflate metrics, and the flags
(`DEFLATE`) with the threshold (`MIN`) the tests set explicitly."""

from __future__ import annotations

import json
import random
import zlib

from websockets.extensions.permessage_deflate import PerMessageDeflate

from rawws import OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, RawConn, metric
from rawws import ws_connect as raw_connect


RSV1 = 0x4  # in the 3-bit rsv field rawws reads and writes (RSV1 RSV2 RSV3)
SYNC_TAIL = b"\x00\x00\xff\xff"
EXT = "sec-websocket-extensions"
PLAIN_BYTES = "throng_deflate_plain_bytes_total"
WIRE_BYTES = "throng_deflate_wire_bytes_total"
# The threshold is given explicitly wherever a test depends on it: the default is
# decided by measurement (test_default_threshold_is_between_tiny_and_large).
MIN = 256
DEFLATE = ["--permessage-deflate", "--deflate-min-size", str(MIN)]
BASE_OFFER = ["permessage-deflate", "server_no_context_takeover", "client_no_context_takeover"]


def compressible_text(n: int, seed: int = 1) -> str:
    """n characters of JSON-ish text with enough variety that it is not trivial,
    and enough repetition that DEFLATE shrinks it a lot."""
    rnd = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "ünïcødé", "✓", "price", "volume", "42", "3.14"]
    parts, size = [], 0
    while size < n:
        p = json.dumps({"k": rnd.choice(words), "v": rnd.randint(0, 999), "t": rnd.choice(words)}) + "\n"
        parts.append(p)
        size += len(p)
    return "".join(parts)[:n]


def compressible_bytes(n: int, seed: int = 2) -> bytes:
    rnd = random.Random(seed)
    block = bytes(rnd.randrange(256) for _ in range(64))
    out = bytearray()
    while len(out) < n:
        out += block
        out += bytes([rnd.randrange(256)])  # not a pure repeat
    return bytes(out[:n])


def json_doc(i: int, size: int = 2048) -> str:
    """A JSON document of exactly `size` bytes (ASCII)."""
    head = {"i": i, "kind": "tick", "items": []}
    doc = head
    k = 0
    while len(json.dumps(doc, separators=(",", ":"))) < size - 40:
        doc["items"].append({"n": k, "sym": f"S{k % 17}", "px": round(100 + k * 0.25, 2)})
        k += 1
    s = json.dumps(doc, separators=(",", ":"))
    pad = size - len(s) - len(',"pad":""')
    doc["pad"] = "x" * pad
    s = json.dumps(doc, separators=(",", ":"))
    assert len(s) == size, len(s)
    return s


def deflate_raw(data: bytes, wbits: int = -15, level: int = 6) -> bytes:
    """What an RFC 7692 sender puts in a frame: raw DEFLATE, sync-flushed, without
    the final 00 00 ff ff."""
    c = zlib.compressobj(level, zlib.DEFLATED, wbits)
    out = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(SYNC_TAIL)
    return out[:-4]


def inflate(payload: bytes, wbits: int = -15) -> bytes:
    """What an RFC 7692 receiver does: put 00 00 ff ff back and inflate."""
    d = zlib.decompressobj(wbits)
    out = d.decompress(payload + SYNC_TAIL)
    assert not d.unconsumed_tail, "inflate left input unread"
    return out


def inflate_strict(payload: bytes, wbits: int) -> bytes:
    """Inflate a few bytes of output at a time, so zlib must resolve every
    back-reference through its window of 2**|wbits| bytes: a stream that refers
    further back fails with 'invalid distance too far back'."""
    d = zlib.decompressobj(wbits)
    out = bytearray()
    data = payload + SYNC_TAIL
    while data:
        out += d.decompress(data, 64)
        data = d.unconsumed_tail
    return bytes(out)


def offer_conn(port: int, offer: str | None, path: str = "/echo", timeout: float = 10.0) -> RawConn:
    """A raw WebSocket (handshake done) that offered `offer` (None: no header)."""
    extra = [("Sec-WebSocket-Extensions", offer)] if offer is not None else []
    return raw_connect(port, path=path, extra=extra, timeout=timeout)


def answered(c: RawConn) -> str | None:
    """The Sec-WebSocket-Extensions of the 101, asserting there is at most one."""
    lines = [v for k, v in c.handshake_response.headers if k.lower() == EXT]
    assert len(lines) <= 1, f"several extension headers: {c.handshake_response!r}"
    return lines[0] if lines else None


def params(value: str) -> list[str]:
    """'permessage-deflate; a; b=1' -> ['permessage-deflate', 'a', 'b=1'] (whitespace
    around ';' and '=' is not significant)."""
    return ["=".join(x.strip() for x in p.split("=", 1)) for p in value.split(";")]


def assert_params(value: str | None, want: list[str]) -> None:
    assert value is not None, "no Sec-WebSocket-Extensions in the 101"
    got = params(value)
    assert "," not in value, f"more than one extension answered: {value!r}"
    assert got[0] == "permessage-deflate", value
    assert len(set(got)) == len(got), f"a parameter repeated: {value!r}"
    assert sorted(got[1:]) == sorted(want[1:]), f"answered {value!r}, want the parameters {want}"


def send_compressed(c: RawConn, opcode: int, data: bytes, wbits: int = -15) -> None:
    c.send_frame(opcode, deflate_raw(data, wbits), rsv=RSV1)


def read_data(c: RawConn, timeout: float = 10.0):
    """The next data message: (opcode, rsv of its first frame, the payload as it
    came on the wire, the payload inflated when RSV1 was set). Pings are answered,
    pongs skipped; a close frame fails the test."""
    opcode, first_rsv, wire = None, None, b""
    while True:
        fin, rsv, op, payload = c.read_frame(timeout=timeout)
        if op == OP_PING:
            c.send_frame(OP_PONG, payload)
            continue
        if op == OP_PONG:
            continue
        assert op != OP_CLOSE, f"server closed: {payload!r}"
        if opcode is None:
            assert op in (OP_TEXT, OP_BINARY), f"continuation without a start: {op}"
            opcode, first_rsv = op, rsv
        else:
            assert op == OP_CONT, f"opcode {op} inside a fragmented message"
            assert rsv == 0, f"RSV bits {rsv} on a continuation frame (RFC 7692 6.1)"
        wire += payload
        if fin:
            break
    assert first_rsv in (0, RSV1), f"RSV bits {first_rsv:03b} on a data frame"
    data = inflate(wire) if first_rsv == RSV1 else wire
    return opcode, first_rsv, wire, data


def echo_raw(c: RawConn, opcode: int, data: bytes, compressed: bool):
    if compressed:
        send_compressed(c, opcode, data)
    else:
        c.send_frame(opcode, data)
    return read_data(c)


def expect_close_code(c: RawConn, timeout: float = 10.0):
    code, _reason = c.expect_close(timeout=timeout)
    return code


def deflate_metrics(port: int) -> tuple[float, float]:
    return metric(port, PLAIN_BYTES), metric(port, WIRE_BYTES)


def frame_len(n: int) -> int:
    """Bytes of an unmasked server frame with an n-byte payload."""
    return n + (2 if n < 126 else 4 if n < 65536 else 10)


def negotiated(ws) -> PerMessageDeflate | None:
    exts = [e for e in ws.protocol.extensions if isinstance(e, PerMessageDeflate)]
    assert len(exts) <= 1
    return exts[0] if exts else None
