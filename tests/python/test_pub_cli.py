"""`throng pub CHANNEL [MESSAGE] --url ... [--api-key KEY] [--binary]` end to end:
prints the seq and exits 0; errors go to stderr with exit 1."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess

from conftest import free_port, throng_bin
from rawws import wait_subscribers
from wsutil import recv_json, run, ws_connect


def pub(*args, input: bytes | None = None, env: dict | None = None, timeout: float = 15.0):
    """Run `throng pub ARGS...`; stdin is `input` (or empty). THRONG_* env vars are not inherited."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("THRONG_")}
    full_env.update(env or {})
    return subprocess.run(
        [str(throng_bin()), "pub", *[str(a) for a in args]],
        input=input if input is not None else b"",
        capture_output=True,
        timeout=timeout,
        env=full_env,
    )


def describe(p) -> str:
    return f"exit {p.returncode}\nstdout: {p.stdout!r}\nstderr: {p.stderr!r}"


def test_pub_argument_stdin_and_binary_end_to_end(start_server):
    srv = start_server()
    url = f"http://127.0.0.1:{srv.port}"

    async def main():
        async with ws_connect(srv.url("/ws/cli")) as raw, ws_connect(srv.url("/ws/cli?format=json")) as js:
            wait_subscribers(srv.port, "cli", 2)
            loop = asyncio.get_running_loop()

            # 1: message as an argument
            p = await loop.run_in_executor(None, lambda: pub("cli", "hello from argv ✓", "--url", url))
            assert p.returncode == 0, describe(p)
            assert p.stdout == b"1\n", f"stdout must be just the seq and a newline: {describe(p)}"
            got = await asyncio.wait_for(raw.recv(), 5)
            assert got == "hello from argv ✓", f"argument must arrive as a text frame: {got!r}"
            m = await recv_json(js)
            assert m == {"channel": "cli", "seq": 1, "data": "hello from argv ✓"}, m

            # 2: message from stdin with `-`
            p = await loop.run_in_executor(None, lambda: pub("cli", "-", "--url", url, input="from stdin ✓".encode()))
            assert p.returncode == 0, describe(p)
            assert p.stdout == b"2\n", describe(p)
            assert await asyncio.wait_for(raw.recv(), 5) == "from stdin ✓"
            assert (await recv_json(js))["seq"] == 2

            # 3: message omitted => stdin
            p = await loop.run_in_executor(None, lambda: pub("cli", "--url", url, input=b"omitted arg"))
            assert p.returncode == 0, describe(p)
            assert p.stdout == b"3\n", describe(p)
            assert await asyncio.wait_for(raw.recv(), 5) == "omitted arg"
            assert (await recv_json(js))["data"] == "omitted arg"

            # 4: --binary from stdin => a binary frame with exactly those bytes
            blob = bytes(range(256)) + b"\x00\xff"
            p = await loop.run_in_executor(None, lambda: pub("cli", "-", "--binary", "--url", url, input=blob))
            assert p.returncode == 0, describe(p)
            assert p.stdout == b"4\n", describe(p)
            got = await asyncio.wait_for(raw.recv(), 5)
            assert isinstance(got, bytes), f"--binary must arrive as a binary frame, got text {got!r}"
            assert got == blob
            m = await recv_json(js)
            assert m.get("encoding") == "base64" and base64.b64decode(m["data"]) == blob, m

            # 5: --binary with an argument
            p = await loop.run_in_executor(None, lambda: pub("cli", "argbin", "--binary", "--url", url))
            assert p.returncode == 0, describe(p)
            assert p.stdout == b"5\n", describe(p)
            assert await asyncio.wait_for(raw.recv(), 5) == b"argbin"

    run(main())


def test_pub_with_api_key(start_server):
    srv = start_server("--api-key", "k3y")
    url = f"http://127.0.0.1:{srv.port}"

    p = pub("keyed", "ok", "--url", url, "--api-key", "k3y")
    assert p.returncode == 0 and p.stdout == b"1\n", describe(p)

    # key from the environment
    p = pub("keyed", "ok env", "--url", url, env={"THRONG_API_KEY": "k3y"})
    assert p.returncode == 0 and p.stdout == b"2\n", describe(p)


def test_pub_wrong_key_exits_1_with_reason(start_server):
    srv = start_server("--api-key", "right")
    url = f"http://127.0.0.1:{srv.port}"
    for extra in (["--api-key", "wrong"], []):
        p = pub("keyed", "nope", "--url", url, *extra)
        assert p.returncode == 1, describe(p)
        assert p.stdout == b"", f"nothing on stdout on error: {describe(p)}"
        err = p.stderr.decode("utf-8", "replace")
        assert "error: server answered 401" in err, f"stderr must name the 401: {describe(p)}"
        # the server's human reason follows the status
        reason = err.split("error: server answered 401", 1)[1].lstrip(": ").strip()
        assert reason, f"stderr must carry the server's reason: {describe(p)}"


def test_pub_bad_channel_exits_1(start_server):
    srv = start_server()
    p = pub("bad name", "x", "--url", f"http://127.0.0.1:{srv.port}")
    assert p.returncode == 1, describe(p)
    assert p.stderr.startswith(b"error:"), describe(p)
    assert b"channel name" in p.stderr, describe(p)  # refused locally or by the server's 400
    assert p.stdout == b"", describe(p)


def test_pub_unreachable_server_exits_1(tmp_path):
    port = free_port()  # nothing listens here
    p = pub("news", "x", "--url", f"http://127.0.0.1:{port}", "--timeout", "3")
    assert p.returncode == 1, describe(p)
    assert p.stdout == b"", describe(p)
    err = p.stderr.decode("utf-8", "replace")
    assert err.startswith("error:") or "\nerror:" in err, f"stderr must start with 'error:': {describe(p)}"
    assert "connect" in err.lower(), f"stderr should say it cannot connect: {describe(p)}"
