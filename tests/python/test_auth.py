"""Subscription tokens (`--token-secret`: HS256 JWTs minted here with PyJWT, a
library others wrote) and browser origins (`--allowed-origin`), on WebSocket, SSE
and long-poll alike."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import jwt
import pytest
from websockets.exceptions import InvalidStatus

from rawws import publish_ok, settled
from wsutil import expect_closed, received_close_code, recv_json, run, ws_connect

SECRET = "a-test-secret-of-at-least-32-bytes-long"


def token(claims: dict, secret: str = SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, secret, algorithm=algorithm)


def claims(**over) -> dict:
    c = {"exp": int(time.time()) + 60, "channels": ["news", "chat:*"]}
    c.update(over)
    return c


def unsigned(c: dict) -> str:
    """An `alg: none` token: header and claims, no signature."""
    part = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(c)}."


@pytest.fixture
def secured(start_server):
    return start_server("--token-secret", SECRET)


async def refused(url: str, **kw) -> tuple[int, str]:
    with pytest.raises(InvalidStatus) as info:
        await ws_connect(url, **kw)
    resp = info.value.response
    return resp.status_code, json.loads(resp.body)["error"]


BAD_TOKENS = [
    (None, 401, "a token is needed"),
    (lambda: token(claims(exp=int(time.time()) - 5)), 401, "token expired"),
    (lambda: token(claims(), secret="another-secret-also-of-32-bytes-or-more"), 401, "bad signature"),
    (lambda: token(claims(), secret=SECRET * 2, algorithm="HS512"), 401, "HS256"),
    (lambda: unsigned(claims()), 401, "invalid token"),
    (lambda: token({"channels": ["news"]}), 401, "exp"),
    (lambda: token({"exp": int(time.time()) + 60}), 401, "channels"),
    (lambda: token(claims(channels=["sports", "chat:*"])), 403, "does not grant channel 'news'"),
    (lambda: "not.a.jwt", 401, "invalid token"),
]


@pytest.mark.parametrize("make,status,reason", BAD_TOKENS)
def test_every_transport_refuses_a_bad_token_with_the_reason(secured, make, status, reason):
    query = "" if make is None else f"?token={make()}"
    sep = "&" if query else "?"

    async def main():
        got = await refused(secured.url(f"/ws/news{query}"))
        assert got[0] == status and reason in got[1], got

    run(main())
    for path in (f"/sse/news{query}", f"/poll/news{query}{sep}timeout=0"):
        resp = httpx.get(f"http://127.0.0.1:{secured.port}{path}", timeout=5)
        assert resp.status_code == status and reason in resp.json()["error"], (path, resp.text)


def test_a_good_token_in_the_query_or_the_header_subscribes(secured):
    good = token(claims())

    async def main():
        by_query = await ws_connect(secured.url(f"/ws/news?token={good}"))
        by_header = await ws_connect(
            secured.url("/ws/news"), additional_headers={"Authorization": f"Bearer {good}"}
        )
        publish_ok(secured.port, "news", "hello")
        assert await asyncio.wait_for(by_query.recv(), 5) == "hello"
        assert await asyncio.wait_for(by_header.recv(), 5) == "hello"
        await by_query.close()
        await by_header.close()

    run(main())
    resp = httpx.get(f"http://127.0.0.1:{secured.port}/poll/news?since=0&timeout=0&token={good}")
    assert resp.status_code == 200 and resp.json()["messages"][0]["data"] == "hello", resp.text
    with httpx.stream(
        "GET", f"http://127.0.0.1:{secured.port}/sse/news?since=0",
        headers={"Authorization": f"Bearer {good}"}, timeout=5,
    ) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data:"):
                assert line == "data: hello"
                break
    # Echo needs no token; publishing still goes by the API key rules.
    async def echo():
        ws = await ws_connect(secured.url("/echo"))
        await ws.send("x")
        assert await asyncio.wait_for(ws.recv(), 5) == "x"
        await ws.close()

    run(echo())


def test_a_prefix_grant_and_the_chat_name_come_from_the_token(secured):
    async def main():
        ws = await ws_connect(secured.url(f"/ws/chat:room1?format=json&token={token(claims(sub='carol'))}"))
        welcome = await recv_json(ws)
        assert welcome["event"] == "welcome" and welcome["client"] == "carol", welcome
        await ws.send("hi")
        m = await recv_json(ws)
        assert m["from"] == "carol", m
        await ws.close()
        # A client may not pick another name than its token's.
        got = await refused(secured.url(f"/ws/chat:room1?format=json&name=mallory&token={token(claims(sub='carol'))}"))
        assert got[0] == 400 and "sub" in got[1], got
        got = await refused(secured.url(f"/ws/chat:room1?token={token(claims(sub='no spaces'))}"))
        assert got[0] == 401 and "sub" in got[1], got

    run(main())


def test_an_expiring_token_ends_the_subscription_with_4001(secured):
    # Expiry counts whole seconds: + 3 leaves at least 2 s to connect.
    soon = token(claims(exp=int(time.time()) + 3))

    async def main():
        ws = await ws_connect(secured.url(f"/ws/news?token={soon}"))
        lasting = await ws_connect(secured.url(f"/ws/news?token={token(claims())}"))
        closed = await expect_closed(ws, timeout=8)
        assert received_close_code(closed) == 4001, closed
        assert closed.rcvd.reason == "token expired"
        publish_ok(secured.port, "news", "still here")
        assert await asyncio.wait_for(lasting.recv(), 5) == "still here"
        await lasting.close()

    run(main())
    with httpx.stream("GET", f"http://127.0.0.1:{secured.port}/sse/news?token={token(claims(exp=int(time.time()) + 3))}", timeout=10) as resp:
        lines = list(resp.iter_lines())
    assert "event: expired" in lines, lines


def test_origins_not_allowed_get_403_and_count(start_server):
    srv = start_server("--allowed-origin", "https://app.example")

    async def main():
        got = await refused(srv.url("/ws/news"), origin="https://evil.example")
        assert got[0] == 403 and "origin" in got[1], got
        got = await refused(srv.url("/echo"), origin="https://evil.example")
        assert got[0] == 403, got
        ok = await ws_connect(srv.url("/ws/news"), origin="https://app.example")
        await ok.close()
        no_origin = await ws_connect(srv.url("/ws/news"))
        await no_origin.close()

    run(main())
    resp = httpx.get(f"http://127.0.0.1:{srv.port}/sse/news", headers={"Origin": "https://evil.example"})
    assert resp.status_code == 403, resp.text
    metrics = settled(lambda: httpx.get(f"http://127.0.0.1:{srv.port}/metrics").text,
                      lambda text: 'throng_handshake_failures_total{reason="origin"} 3' in text)
    assert 'throng_handshake_failures_total{reason="origin"} 3' in metrics, metrics


@pytest.mark.parametrize("procs", [1, 2])
def test_the_bench_subscribes_with_a_token_and_is_refused_without(secured, procs):
    from support.bench import run_bench, short

    url = f"ws://127.0.0.1:{secured.port}"
    args = ["push", "--url", url, "--conns", 4, "--channels", 2, "--channel-prefix", "news",
            "--publish-rate", 20, "--procs", procs, *short(duration="2s")]
    # news0/news1 are not granted by a token for "news" alone: the prefix grant is.
    good = token(claims(channels=["news*"]))
    run = run_bench(*args, "--token", good)
    assert run.returncode == 0, run.describe()
    report = run.report()
    assert report["failed"] == 0, run.describe()
    push = report["push"]
    assert push["lost"] == 0 and push["delivered"] > 0, run.describe()
    assert good not in run.stdout and good not in run.stderr
    refused = run_bench(*args)
    assert refused.returncode == 1, refused.describe()
    assert "401" in refused.stdout + refused.stderr, refused.describe()
