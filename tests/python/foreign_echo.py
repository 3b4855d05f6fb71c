"""A tiny WebSocket echo server that is not throng: the `websockets` library's own
asyncio server. test_bench.py runs it as a subprocess to check that `throng bench`
works against any RFC 6455 server.

    python foreign_echo.py PORT [PING_INTERVAL_SECONDS [PING_TIMEOUT_SECONDS]]

Echoes every data message back on any path (text as text, binary as binary).
With PING_INTERVAL_SECONDS it pings every client that often and closes (1011) one
that does not answer within PING_TIMEOUT_SECONDS (default: the interval); without
it, it never pings.
Prints "listening on PORT" once it accepts connections; exits on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed


async def echo(ws) -> None:
    try:
        async for message in ws:
            await ws.send(message)
    except ConnectionClosed:
        pass


async def main(port: int, ping_interval: float | None, ping_timeout: float | None) -> None:
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    async with serve(
        echo,
        "127.0.0.1",
        port,
        ping_interval=ping_interval,
        # A client that does not answer a ping within the timeout is closed (1011).
        ping_timeout=ping_timeout,
        compression=None,
        max_size=16 * 1024 * 1024,
    ):
        print(f"listening on {port}", flush=True)
        await stop


if __name__ == "__main__":
    port = int(sys.argv[1])
    ping = float(sys.argv[2]) if len(sys.argv) > 2 else None
    ping_timeout = float(sys.argv[3]) if len(sys.argv) > 3 else ping
    asyncio.run(main(port, ping, ping_timeout))
