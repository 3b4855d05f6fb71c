"""What the server refuses at start (issue 44): a Pusher app id that is a
namespace of its own (chat, throng, one the config file declares) stops the start."""

from __future__ import annotations

import subprocess

from conftest import throng_bin
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
