"""Namespaces declared in the config file ([namespaces.NAME] with client_publish,
join_leave, history_size, history_ttl) change how their channels behave; a bad
declaration stops the server at start with a clear message."""

from __future__ import annotations

import subprocess

from conftest import throng_bin
from rawws import channel_info, publish_ok
from wsutil import expect_silence, recv_json, run, ws_connect

CONFIG = """
[namespaces.room]
client_publish = true
join_leave = true

[namespaces.quiet]
client_publish = true
join_leave = false

[namespaces.log]
history_size = 3
history_ttl = "1h"
"""


def test_a_declared_namespace_becomes_a_chat_room(start_server, tmp_path):
    cfg = tmp_path / "throng.toml"
    cfg.write_text(CONFIG)
    srv = start_server("--config", cfg)

    async def main():
        a = await ws_connect(srv.url("/ws/room:x?format=json"))
        b = await ws_connect(srv.url("/ws/room:x?format=json"))
        try:
            welcome = await recv_json(a)
            assert welcome["event"] == "welcome", welcome
            joined = await recv_json(a)
            assert (joined["event"], joined["count"]) == ("join", 2), joined
            await b.send("hello")
            got = await recv_json(a)
            assert (got["data"], got["seq"]) == ("hello", 1) and got["from"].startswith("c"), got
            assert (await recv_json(b))["event"] == "welcome"
            own = await recv_json(b)
            assert own == got, (own, got)
        finally:
            await a.close()
            await b.close()

    run(main())


def test_join_leave_false_publishes_without_announcing(start_server, tmp_path):
    cfg = tmp_path / "throng.toml"
    cfg.write_text(CONFIG)
    srv = start_server("--config", cfg)

    async def main():
        a = await ws_connect(srv.url("/ws/quiet:x?format=json"))
        try:
            await a.send("hi")
            m = await recv_json(a)
            assert (m["data"], m["seq"]) == ("hi", 1), m
            await expect_silence(a, 0.3)
        finally:
            await a.close()

    run(main())


def test_a_namespace_sets_its_own_history_size(start_server, tmp_path):
    cfg = tmp_path / "throng.toml"
    cfg.write_text(CONFIG)
    srv = start_server("--config", cfg)
    for i in range(6):
        publish_ok(srv.port, "log:a", f"m{i}")
        publish_ok(srv.port, "other", f"m{i}")
    assert channel_info(srv.port, "log:a")["history_len"] == 3
    assert channel_info(srv.port, "other")["history_len"] == 6


def test_a_bad_namespace_declaration_stops_the_server_with_the_reason(tmp_path):
    for body, reason in [
        ("[namespaces.room]\nclient_publish = 1\n", "client_publish must be true or false"),
        ("[namespaces.room]\ncolour = true\n", "unknown option 'colour'"),
        ("[namespaces.\"a:b\"]\njoin_leave = true\n", "namespace name"),
        ("[namespaces.log]\nhistory_ttl = \"soon\"\n", "not a duration"),
    ]:
        cfg = tmp_path / "bad.toml"
        cfg.write_text(body)
        proc = subprocess.run(
            [str(throng_bin()), "serve", "--config", str(cfg), "--listen", "127.0.0.1:0"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert proc.returncode != 0, body
        assert reason in proc.stderr, (body, proc.stderr)
