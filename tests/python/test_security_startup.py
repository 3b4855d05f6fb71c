"""What the server refuses at start, and how secrets reach it (issue 44, findings
7-9): a Pusher app id that is a namespace of its own (chat, throng, one the config
file declares) stops the start; a port another process holds is not shared unless
both ask for it (--reuse-port); the flags that carry secrets say in --help how to
keep them off the command line, and their THRONG_* variables work."""

from __future__ import annotations

import subprocess
import time

from conftest import free_port, throng_bin
from rawws import http_request

SECRET = "s3cr3t-value"


def serve(*flags, env=None, timeout=5) -> subprocess.CompletedProcess:
    """Runs `throng serve` expecting it to stop by itself (a refused start)."""
    return subprocess.run(
        [str(throng_bin()), "serve", "--stats-interval", "0", *map(str, flags)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# -- finding 7: app ids that are namespaces -----------------------------------


def test_app_ids_that_are_namespaces_are_refused(tmp_path):
    for app_id, why in [("chat", "chat room"), ("throng", "server's own feeds")]:
        proc = serve("--listen", "127.0.0.1:0", "--pusher-app", f"{app_id}:key:{SECRET}")
        assert proc.returncode != 0, (app_id, proc.stderr)
        assert f"--pusher-app {app_id}" in proc.stderr and why in proc.stderr, proc.stderr
        assert SECRET not in proc.stderr, proc.stderr


def test_an_app_id_the_config_file_declares_as_a_namespace_is_refused(tmp_path):
    cfg = tmp_path / "throng.toml"
    cfg.write_text(f'pusher-app = ["room:key:{SECRET}"]\n\n[namespaces.room]\nclient_publish = true\n')
    proc = serve("--config", cfg, "--listen", "127.0.0.1:0")
    assert proc.returncode != 0, proc.stderr
    assert "--pusher-app room" in proc.stderr and "[namespaces.room]" in proc.stderr, proc.stderr
    # The user channels' namespace, ID.user, counts too; and [[pusher-app]] tables.
    cfg.write_text(
        f'[[pusher-app]]\nid = "app1"\nkey = "k"\nsecret = "{SECRET}"\n\n[namespaces."app1.user"]\nclient_publish = true\n'
    )
    proc = serve("--config", cfg, "--listen", "127.0.0.1:0")
    assert proc.returncode != 0, proc.stderr
    assert "--pusher-app app1" in proc.stderr and "[namespaces.app1.user]" in proc.stderr, proc.stderr


def test_an_ordinary_app_id_starts(start_server):
    srv = start_server("--pusher-app", f"app1:key:{SECRET}")
    assert http_request(srv.port, "GET", "/healthz").status == 200


# -- finding 8: a held port is not shared -------------------------------------


def test_a_port_another_server_holds_is_refused(start_server):
    first = start_server()
    port = first.port
    proc = serve("--listen", f"127.0.0.1:{port}")
    assert proc.returncode != 0, proc.stderr
    assert f"127.0.0.1:{port} is already in use by another process" in proc.stderr, proc.stderr
    assert "--reuse-port" in proc.stderr, proc.stderr
    assert first.proc.poll() is None, first.describe()


def test_every_port_of_a_range_is_checked(start_server):
    held = start_server()
    port = held.port
    proc = serve("--listen", f"127.0.0.1:{port}-{port}", "--listen", f"127.0.0.1:{free_port()}")
    assert proc.returncode != 0 and "already in use" in proc.stderr, proc.stderr


def test_a_port_a_servers_workers_hold_is_refused_to_another(start_server, shared_redis):
    """The workers share their master's port with each other, and with nobody else."""
    port = free_port()
    start_server("--listen", f"127.0.0.1:{port}", "--workers", "2", "--broker", shared_redis.url, ports=[port])
    for extra in [[], ["--workers", "2", "--broker", shared_redis.url]]:
        proc = serve("--listen", f"127.0.0.1:{port}", *extra)
        assert proc.returncode != 0, (extra, proc.stderr)
        assert f"127.0.0.1:{port} is already in use by another process" in proc.stderr, proc.stderr


def test_reuse_port_shares_a_port_on_purpose(start_server):
    first = start_server("--reuse-port")
    second = start_server("--reuse-port", "--listen", f"127.0.0.1:{first.port}", ports=[first.port])
    assert second.proc.poll() is None, second.describe()
    # Both answer: the kernel spreads connections over the two.
    pids = set()
    deadline = time.monotonic() + 5
    while len(pids) < 2 and time.monotonic() < deadline:
        pids.add(http_request(first.port, "GET", "/api/stats").json()["pid"])
    assert pids == {first.pid, second.pid}, pids


def test_a_restart_on_the_same_port_is_not_refused(start_server):
    """Connections in TIME_WAIT from the last run do not make the port look held."""
    first = start_server()
    port = first.port
    for _ in range(5):
        http_request(port, "GET", "/healthz")
    first.stop()
    again = start_server("--listen", f"127.0.0.1:{port}", ports=[port])
    assert http_request(port, "GET", "/healthz").status == 200, again.describe()


# -- finding 9: secrets on the command line -----------------------------------


def test_help_says_which_flags_carry_secrets_and_hides_their_values():
    env = {"THRONG_API_KEY": SECRET, "THRONG_TOKEN_SECRET": SECRET, "THRONG_PUSHER_APP": f"a:k:{SECRET}"}
    out = subprocess.run(
        [str(throng_bin()), "serve", "--help"], capture_output=True, text=True, timeout=10, env=env
    ).stdout
    assert SECRET not in out, out
    for flag, var in [
        ("--api-key", "THRONG_API_KEY"),
        ("--token-secret", "THRONG_TOKEN_SECRET"),
        ("--pusher-app", "THRONG_PUSHER_APP"),
    ]:
        text = out.split(f"      {flag} ", 1)[1].split("\n      --", 1)[0]
        assert "secret" in text.lower() and "ps" in text and var in text, (flag, text)


def test_help_hides_a_secret_the_config_file_gives(tmp_path):
    cfg = tmp_path / "throng.toml"
    cfg.write_text(f'api-key = "{SECRET}"\n')
    out = subprocess.run(
        [str(throng_bin()), "serve", "--config", str(cfg), "--help"], capture_output=True, text=True, timeout=10
    ).stdout
    assert "--api-key" in out and SECRET not in out, out


def test_the_api_key_can_come_from_the_environment(start_server):
    srv = start_server(env={"THRONG_API_KEY": SECRET})
    url = "/api/publish/news"
    assert http_request(srv.port, "POST", url, body=b"x").status == 401
    ok = http_request(srv.port, "POST", url, body=b"x", headers=[("Authorization", f"Bearer {SECRET}")])
    assert ok.status == 200, ok
