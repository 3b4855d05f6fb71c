"""The publish API's access rule seen from a real non-loopback peer.

A network namespace of the test's own, joined to this host by a veth pair, plays a
remote machine: its requests reach the server from a non-loopback address. Without
--api-key such a peer must be refused (403) while loopback peers may publish; with a
key it needs the key like everyone else. Needs root and iproute2 (scripts/test.sh
installs it; CI runs as root)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import free_port
from rawws import http_request
from support import netns

# Runs alone: it builds network namespaces with fixed names.
pytestmark = [pytest.mark.serial, pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and the ip command to build a network namespace",
)]


@pytest.fixture
def remote_host():
    """(host-side address, function running a command inside the namespace)."""
    tag = os.getpid() % 100000
    ns, host_if, ns_if = f"thr{tag}", f"thv{tag}a", f"thv{tag}b"
    third = tag % 250
    host_ip, ns_ip = f"10.213.{third}.1", f"10.213.{third}.2"
    try:
        netns.join(ns, host_if, ns_if, host_ip, ns_ip)

        def run_inside(code: str) -> str:
            p = subprocess.run(
                ["ip", "netns", "exec", ns, "python3", "-c", code],
                capture_output=True, timeout=15, text=True,
            )
            assert p.returncode == 0, p.stderr
            return p.stdout.strip()

        yield host_ip, run_inside
    finally:
        netns.remove(ns, host_if)


def publish_from_inside(run_inside, host_ip: str, port: int, key: str | None) -> tuple[int, str]:
    auth = f', "Authorization": "Bearer {key}"' if key else ""
    code = f"""
import urllib.request, urllib.error
req = urllib.request.Request("http://{host_ip}:{port}/api/publish/remote", data=b"hi",
                             headers={{"Content-Type": "text/plain"{auth}}}, method="POST")
try:
    r = urllib.request.urlopen(req, timeout=5)
    print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
"""
    status, _, body = run_inside(code).partition(" ")
    return int(status), body


def test_remote_peer_is_refused_without_an_api_key(start_server, remote_host):
    host_ip, run_inside = remote_host
    port = free_port()
    srv = start_server("--listen", f"127.0.0.1:{port}", "--listen", f"{host_ip}:{port}", ports=[port])
    status, body = publish_from_inside(run_inside, host_ip, port, None)
    assert status == 403, (status, body)
    assert "loopback" in body
    # The refusal used no seq: the loopback publish that follows gets seq 1.
    resp = http_request(srv.port, "POST", "/api/publish/remote", body=b"x", headers=[("Content-Type", "text/plain")])
    assert resp.status == 200 and resp.json() == {"seq": 1}, resp


def test_remote_peer_needs_the_key_when_one_is_set(start_server, remote_host):
    host_ip, run_inside = remote_host
    port = free_port()
    start_server("--listen", f"127.0.0.1:{port}", "--listen", f"{host_ip}:{port}",
                 "--api-key", "s3cret", ports=[port])
    status, body = publish_from_inside(run_inside, host_ip, port, "wrong")
    assert status == 401, (status, body)
    status, body = publish_from_inside(run_inside, host_ip, port, "s3cret")
    assert status == 200 and body == '{"seq":1}', (status, body)
