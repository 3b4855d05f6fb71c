"""--stats-interval: periodic stats block on stdout."""

from __future__ import annotations

import asyncio
import re
import time

from wsutil import run, ws_connect
from support.wait import wait_until

KEYS = ["SOCKETS", "FRAMES_TOTAL", "MESSAGES_TOTAL", "FRAMES_PER_MIN", "MESSAGES_PER_MIN"]
LINE = re.compile(r"^\s*(SOCKETS|FRAMES_TOTAL|MESSAGES_TOTAL|FRAMES_PER_MIN|MESSAGES_PER_MIN):\s*(\S+)\s*$", re.M)


def parse_blocks(stdout: str):
    """Group stats lines into blocks, each starting at SOCKETS:."""
    blocks = []
    for key, value in LINE.findall(stdout):
        if key == "SOCKETS" or not blocks:
            blocks.append({})
        blocks[-1][key] = value
    return blocks


async def _fragments(parts):
    for p in parts:
        yield p


def wait_for_blocks(srv, predicate, timeout):
    """The stats blocks on stdout once predicate(blocks) holds, or as they are at timeout."""
    seen: list[dict] = []

    def holds():
        seen[:] = parse_blocks(srv.stdout())
        return predicate(seen)

    wait_until(holds, timeout, fail=False, interval=0.1)
    return list(seen)


def test_stats_block_printed_and_counts_messages(start_server):
    srv = start_server("--stats-interval", "1s")

    async def main():
        async with ws_connect(srv.url()) as ws:
            for i in range(5):
                await ws.send(f"msg {i}")
                assert await ws.recv() == f"msg {i}"
            await ws.send(b"binary one")
            assert await ws.recv() == b"binary one"
            # one fragmented message = 1 message, 3 frames
            await ws.send(_fragments(["a", "b", "c"]))
            assert await ws.recv() == "abc"
            # 7 messages, 9 data frames received by the server so far.
            loop = asyncio.get_running_loop()
            blocks = await loop.run_in_executor(
                None,
                wait_for_blocks,
                srv,
                lambda bs: bool(bs) and bs[-1].get("MESSAGES_TOTAL") == "7" and "MESSAGES_PER_MIN" in bs[-1],
                4.0,
            )
            assert blocks, f"no stats block on stdout after 4s:\n{srv.stdout()}"
            last = blocks[-1]
            for k in KEYS:
                assert k in last, f"missing {k}: in {last}\nstdout:\n{srv.stdout()}"
            assert last["MESSAGES_TOTAL"] == "7", f"MESSAGES_TOTAL should count the 7 messages sent: {last}"
            assert int(last["FRAMES_TOTAL"]) >= 9, f"FRAMES_TOTAL should count >= 9 frames: {last}"
            assert int(last["SOCKETS"]) == 1, f"one client connected: {last}"
            for k in ("FRAMES_PER_MIN", "MESSAGES_PER_MIN"):
                assert re.fullmatch(r"\d+\.\d", last[k]), f"{k} must have one decimal: {last[k]!r}"
                assert float(last[k]) >= 0
        # After the client leaves, SOCKETS drops to 0.
        blocks = wait_for_blocks(srv, lambda bs: bool(bs) and bs[-1].get("SOCKETS") == "0", 4.0)
        assert blocks[-1].get("SOCKETS") == "0", f"SOCKETS should return to 0: {blocks[-1]}"
        assert blocks[-1].get("MESSAGES_TOTAL") == "7", blocks[-1]

    run(main())


def test_stats_printed_periodically(start_server):
    srv = start_server("--stats-interval", "1s")
    time.sleep(3.5)
    blocks = parse_blocks(srv.stdout())
    assert 2 <= len(blocks) <= 6, f"expected ~3 blocks in 3.5s at 1s interval, got {len(blocks)}:\n{srv.stdout()}"
    for b in blocks:
        assert set(KEYS) <= set(b), b


def test_stats_interval_zero_prints_nothing(start_server):
    srv = start_server("--stats-interval", "0")

    async def main():
        async with ws_connect(srv.url()) as ws:
            await ws.send("x")
            await ws.recv()
        await asyncio.sleep(1.5)

    run(main())
    assert not LINE.search(srv.stdout()), f"stats printed with --stats-interval 0:\n{srv.stdout()}"
