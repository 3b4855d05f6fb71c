"""Echo behaviour: text, binary, prefix, fragmentation, ping/pong, clean close."""

from __future__ import annotations

import asyncio
import os

import pytest

from rawws import OP_BINARY, OP_CONT, OP_PING, OP_PONG, OP_TEXT, ws_connect as raw_connect
from wsutil import run, ws_connect


def test_echo_text(server):
    async def main():
        async with ws_connect(server.url()) as ws:
            for msg in ["hello", "", "ünïcødé ✓ 🚀", "x" * 5000]:
                await ws.send(msg)
                got = await ws.recv()
                assert isinstance(got, str)
                assert got == msg

    run(main())


def test_echo_binary(server):
    async def main():
        async with ws_connect(server.url()) as ws:
            for msg in [b"\x00\x01\x02\xff", b"", os.urandom(40000)]:
                await ws.send(msg)
                got = await ws.recv()
                assert isinstance(got, bytes)
                assert got == msg

    run(main())


def test_echo_on_root_path(server):
    async def main():
        async with ws_connect(server.url("/")) as ws:
            await ws.send("root")
            assert await ws.recv() == "root"

    run(main())


def test_echo_preserves_order_of_many_messages(server):
    async def main():
        async with ws_connect(server.url()) as ws:
            msgs = [f"m{i}" for i in range(500)]
            for m in msgs:
                await ws.send(m)
            got = [await ws.recv() for _ in msgs]
            assert got == msgs

    run(main())


def test_echo_prefix_applies_to_text_only(start_server):
    srv = start_server("--echo-prefix", "ECHO: ")

    async def main():
        async with ws_connect(srv.url()) as ws:
            await ws.send("hi")
            assert await ws.recv() == "ECHO: hi"
            await ws.send(b"hi")
            assert await ws.recv() == b"hi", "binary must be echoed unchanged"
            await ws.send("")
            assert await ws.recv() == "ECHO: "

    run(main())


async def _fragments(parts):
    for p in parts:
        yield p
        await asyncio.sleep(0.01)


def test_fragmented_text_is_reassembled(server):
    async def main():
        async with ws_connect(server.url()) as ws:
            parts = ["frag-one ", "frag-two ", "frag-three ", "é✓"]
            await ws.send(_fragments(parts))
            assert await ws.recv() == "".join(parts)

    run(main())


def test_fragmented_binary_is_reassembled(server):
    async def main():
        async with ws_connect(server.url()) as ws:
            parts = [os.urandom(1000) for _ in range(7)]
            await ws.send(_fragments(parts))
            assert await ws.recv() == b"".join(parts)

    run(main())


def test_fragmented_text_prefix_applied_once(start_server):
    srv = start_server("--echo-prefix", ">")

    async def main():
        async with ws_connect(srv.url()) as ws:
            await ws.send(_fragments(["a", "b", "c"]))
            assert await ws.recv() == ">abc"

    run(main())


def test_fragmented_message_echoed_as_one_frame_with_interleaved_ping(server):
    """Raw check: fragments (with a ping between them) come back as ONE message,
    the ping is answered with a pong carrying the same payload."""
    c = raw_connect(server.port)
    try:
        c.send_frame(OP_TEXT, b"abc", fin=False)
        c.send_frame(OP_PING, b"mid")
        c.send_frame(OP_CONT, "d€".encode()[:2], fin=False)  # split inside a UTF-8 sequence
        c.send_frame(OP_CONT, "d€".encode()[2:], fin=True)
        frames = []
        data = b""
        opcode = None
        while True:
            fin, rsv, op, payload = c.read_frame()
            frames.append((fin, op, payload))
            if op == OP_PONG:
                assert payload == b"mid"
                continue
            if op in (OP_TEXT, OP_BINARY, OP_CONT):
                if op != OP_CONT:
                    opcode = op
                data += payload
                if fin:
                    break
            else:
                raise AssertionError(f"unexpected frame {frames!r}")
        assert opcode == OP_TEXT
        assert data == "abcd€".encode()
        assert any(op == OP_PONG for _, op, _ in frames), f"ping not answered: {frames!r}"
    finally:
        c.close()


def test_ping_is_answered_with_pong(server):
    async def main():
        async with ws_connect(server.url()) as ws:
            for payload in [b"", b"abc", b"x" * 125]:
                waiter = await ws.ping(payload)
                latency = await asyncio.wait_for(waiter, 5)
                assert latency >= 0

    run(main())


def test_raw_ping_pong_payload(server):
    c = raw_connect(server.port)
    try:
        c.send_frame(OP_PING, b"payload-123")
        fin, rsv, op, payload = c.read_frame()
        assert (fin, op, payload) == (True, OP_PONG, b"payload-123")
    finally:
        c.close()


def test_close_1000_is_answered_with_1000(server):
    async def main():
        ws = await ws_connect(server.url())
        await ws.send("bye")
        assert await ws.recv() == "bye"
        await ws.close(1000, "done")
        assert ws.close_code == 1000, f"server answered close with {ws.close_code} {ws.close_reason!r}"
        rcvd = ws.protocol.close_rcvd
        assert rcvd is not None and rcvd.code == 1000, rcvd

    run(main())


def test_raw_close_1000_answered_then_tcp_closed(server):
    c = raw_connect(server.port)
    try:
        c.send_close(1000, b"bye")
        code, _reason = c.expect_close(timeout=5)
        assert code == 1000
        rest = c.wait_closed(timeout=5)
        assert rest == b"", f"bytes after close frame: {rest!r}"
    finally:
        c.close()


@pytest.mark.parametrize("code", [1001, 3000, 4999])
def test_valid_close_codes_are_answered_normally(server, code):
    c = raw_connect(server.port)
    try:
        c.send_close(code)
        got, _ = c.expect_close(timeout=5)
        assert got in (code, 1000), f"close {code} answered with {got}"
    finally:
        c.close()


def test_close_without_code_is_answered(server):
    c = raw_connect(server.port)
    try:
        c.send_close(None)
        got, _ = c.expect_close(timeout=5)
        assert got in (None, 1000), f"empty close answered with {got}"
    finally:
        c.close()
