"""Configuration sources: --config FILE.toml, THRONG_* env vars, CLI flags.
Precedence: CLI > env > file."""

from __future__ import annotations

from wsutil import run, ws_connect


def echo_of(srv, text="hi"):
    async def main():
        async with ws_connect(srv.url()) as ws:
            await ws.send(text)
            return await ws.recv()

    return run(main())


def write_config(tmp_path, body: str):
    p = tmp_path / "throng.toml"
    p.write_text(body)
    return p


def test_config_file_sets_echo_prefix(start_server, tmp_path):
    cfg = write_config(tmp_path, 'echo-prefix = "FILE:"\n')
    srv = start_server("--config", cfg)
    assert echo_of(srv) == "FILE:hi"


def test_env_sets_echo_prefix(start_server):
    srv = start_server(env={"THRONG_ECHO_PREFIX": "ENV:"})
    assert echo_of(srv) == "ENV:hi"


def test_env_overrides_config_file(start_server, tmp_path):
    cfg = write_config(tmp_path, 'echo-prefix = "FILE:"\n')
    srv = start_server("--config", cfg, env={"THRONG_ECHO_PREFIX": "ENV:"})
    assert echo_of(srv) == "ENV:hi"


def test_cli_overrides_env_and_config_file(start_server, tmp_path):
    cfg = write_config(tmp_path, 'echo-prefix = "FILE:"\n')
    srv = start_server("--config", cfg, "--echo-prefix", "CLI:", env={"THRONG_ECHO_PREFIX": "ENV:"})
    assert echo_of(srv) == "CLI:hi"


def test_cli_overrides_config_file(start_server, tmp_path):
    cfg = write_config(tmp_path, 'echo-prefix = "FILE:"\n')
    srv = start_server("--config", cfg, "--echo-prefix", "CLI:")
    assert echo_of(srv) == "CLI:hi"


def test_config_file_numeric_and_duration_keys(start_server, tmp_path):
    """Other keys use the same names as the flags: here max-message-size and
    stats-interval from the file take effect."""
    cfg = write_config(
        tmp_path,
        'echo-prefix = "F>"\nmax-message-size = "1KiB"\nstats-interval = "1s"\n',
    )
    srv = start_server("--config", cfg, "--stats-interval", "0")  # CLI wins for stats-interval

    async def main():
        from wsutil import expect_closed, received_close_code

        async with ws_connect(srv.url()) as ws:
            await ws.send("a" * 1000)
            assert await ws.recv() == "F>" + "a" * 1000
            await ws.send("a" * 1100)
            exc = await expect_closed(ws)
            assert received_close_code(exc) == 1009, "max-message-size from the config file not applied"

    run(main())
