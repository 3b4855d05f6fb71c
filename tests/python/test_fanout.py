"""Fan-out: 1,000 subscribers of one channel each receive every one of 100
messages, in order (one asyncio process, `websockets` clients, --threads 2)."""

from __future__ import annotations

import asyncio
import json
import time

from rawws import channel_info, publish_ok, wait_subscribers, without_epoch
from wsutil import run, ws_connect

SUBSCRIBERS = 1000
MESSAGES = 100
JSON_EVERY = 10  # every 10th subscriber uses ?format=json (checks seq), the rest raw


def test_1000_subscribers_each_get_100_messages_in_order(start_server):
    srv = start_server("--threads", "2")
    channel = "fanout"
    timings = {}

    async def main():
        t0 = time.monotonic()
        sem = asyncio.Semaphore(100)  # at most 100 handshakes in flight

        async def connect(i):
            path = f"/ws/{channel}?format=json" if i % JSON_EVERY == 0 else f"/ws/{channel}"
            async with sem:
                return await ws_connect(srv.url(path), open_timeout=15)

        clients = await asyncio.gather(*(connect(i) for i in range(SUBSCRIBERS)), return_exceptions=True)
        failed = [c for c in clients if isinstance(c, BaseException)]
        conns = [c for c in clients if not isinstance(c, BaseException)]
        try:
            assert not failed, f"{len(failed)} of {SUBSCRIBERS} subscribers failed to connect, first: {failed[0]!r}"
            timings["connect"] = time.monotonic() - t0
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: wait_subscribers(srv.port, channel, SUBSCRIBERS, timeout=15))

            async def consume(i, ws):
                is_json = i % JSON_EVERY == 0
                for k in range(1, MESSAGES + 1):
                    msg = await asyncio.wait_for(ws.recv(), 20)
                    if is_json:
                        m = json.loads(msg)
                        assert m == {"channel": channel, "seq": k, "data": f"message {k}"}, (
                            f"subscriber {i}: expected seq {k}, got {m}"
                        )
                    else:
                        assert msg == f"message {k}", f"subscriber {i}: expected 'message {k}', got {msg!r}"

            readers = [asyncio.create_task(consume(i, ws)) for i, ws in enumerate(conns)]

            def publish_all():
                for k in range(1, MESSAGES + 1):
                    assert publish_ok(srv.port, channel, f"message {k}") == k

            t1 = time.monotonic()
            await loop.run_in_executor(None, publish_all)
            timings["publish"] = time.monotonic() - t1
            results = await asyncio.wait_for(asyncio.gather(*readers, return_exceptions=True), 30)
            timings["deliver"] = time.monotonic() - t1
            errors = [r for r in results if isinstance(r, BaseException)]
            assert not errors, f"{len(errors)} of {SUBSCRIBERS} subscribers failed, first: {errors[0]!r}"
            info = channel_info(srv.port, channel)
            assert without_epoch(info) == {
                "channel": channel,
                "subscribers": SUBSCRIBERS,
                "last_seq": MESSAGES,
                "history_len": min(MESSAGES, 100),
            }, info
        finally:
            t2 = time.monotonic()
            await asyncio.gather(*(ws.close() for ws in conns), return_exceptions=True)
            timings["close"] = time.monotonic() - t2

    t = time.monotonic()
    run(main(), timeout=60)
    total = time.monotonic() - t
    # No bound on the total: how long a busy machine takes is not what this checks
    # (the timeouts above still end a stalled run).
    print(f"fan-out 1000x100: {total:.1f}s total; " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
