"""At the open-files limit the server keeps working: it pauses accepting instead of
spinning, logs that (rarely), says at start what ceiling the limit gives, and
serves again as soon as descriptors free up."""

from __future__ import annotations

import json
import resource
import subprocess
import time

import pytest

from conftest import free_port, tcp_connectable, throng_bin
from rawws import http_exchange

# Runs alone: it opens sockets up to the process's open-files limit.
pytestmark = pytest.mark.serial


def test_more_clients_than_descriptors(tmp_path):
    port = free_port()
    err_path = tmp_path / "stderr.log"

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))

    with open(err_path, "wb") as err:
        server = subprocess.Popen(
            [str(throng_bin()), "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2",
             "--stats-interval", "0"],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=low_limit,
        )
    try:
        deadline = time.monotonic() + 10
        while not tcp_connectable(port):
            assert time.monotonic() < deadline and server.poll() is None, err_path.read_text()
            time.sleep(0.05)
        bench = subprocess.run(
            [str(throng_bin()), "bench", "idle", "--url", f"ws://127.0.0.1:{port}/", "--conns", "400",
             "--duration", "1s", "--connect-timeout", "2s", "--interval", "0", "--json",
             "--allow-failures"],
            capture_output=True, timeout=60, stdin=subprocess.DEVNULL,
        )
        report = json.loads(bench.stdout)
        assert 150 < report["opened"] < 300, report
        assert report["opened"] + report["failed"] == 400, report
        assert server.poll() is None, "server died at the open-files limit"
        # The bench has closed its connections: the server serves again.
        resp = http_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert resp.status == 200, resp
        log = err_path.read_text()
        assert "open-files limit 300: at most ~" in log, log
        assert 1 <= log.count("accept failed") <= 10, log
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)
