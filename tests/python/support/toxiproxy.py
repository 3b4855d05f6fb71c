"""Toxiproxy between a throng node and its Redis, driven over Toxiproxy's HTTP
API: its server on a free loopback port (`Toxiproxy`), a proxy to one upstream
listening on a port the kernel picks (`add_proxy`), and `latency` toxics added
and taken away while the node runs. The server binary is built by
bench/peers/toxiproxy/build.sh (scripts/test.sh's tools stage runs it; when the
binary is missing the fixture runs it too). Stopped by its pid."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from conftest import REPO, free_port
from procs import stop_process

BUILD = REPO / "bench" / "peers" / "toxiproxy" / "build.sh"
START_TIMEOUT = 10.0


def toxiproxy_binary() -> Path:
    """The built toxiproxy-server; build.sh is run when it is missing (it prints
    the binary's path last, and does nothing when the binary is up to date)."""
    binary = BUILD.parent / "bin" / "toxiproxy-server"
    if binary.exists():
        return binary
    out = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{BUILD} failed:\n{out.stderr[-3000:]}"
    return Path(out.stdout.strip().splitlines()[-1])


class Proxy:
    """One proxy of a Toxiproxy: `port` is where clients connect, `upstream`
    where it forwards to."""

    def __init__(self, api: httpx.Client, name: str, port: int, upstream: str) -> None:
        self.api, self.name, self.port, self.upstream = api, name, port, upstream

    def add_latency(self, ms: int, stream: str = "downstream", name: str = "latency") -> None:
        """Delays every byte on `stream` by `ms` (downstream: upstream -> client,
        here Redis -> node), on the connections already open too."""
        body = {"name": name, "type": "latency", "stream": stream, "toxicity": 1.0,
                "attributes": {"latency": ms, "jitter": 0}}
        resp = self.api.post(f"/proxies/{self.name}/toxics", json=body)
        assert resp.status_code == 200, resp.text

    def remove_toxic(self, name: str = "latency") -> None:
        resp = self.api.delete(f"/proxies/{self.name}/toxics/{name}")
        assert resp.status_code == 204, resp.text

    def toxics(self) -> list[dict]:
        resp = self.api.get(f"/proxies/{self.name}/toxics")
        assert resp.status_code == 200, resp.text
        return resp.json()


class Toxiproxy:
    """toxiproxy-server with its API on a free loopback port."""

    def __init__(self) -> None:
        binary = toxiproxy_binary()
        self.dir = tempfile.TemporaryDirectory(prefix="throng-toxiproxy-")
        self.log_path = Path(self.dir.name) / "toxiproxy.log"
        self._log = open(self.log_path, "wb")
        # The free port may be taken by another test's process before the server
        # binds it (tests run in parallel): then it exits, and another is tried.
        for attempt in range(3):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [str(binary), "-host", "127.0.0.1", "-port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            )
            self.api = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=5.0,
                                    trust_env=False)
            if self._wait_ready():
                return
            self.api.close()
            stop_process(self.proc)
        raise AssertionError(f"toxiproxy-server did not start:\n{self.log()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if self.api.get("/version").status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        return False

    def add_proxy(self, name: str, upstream: str) -> Proxy:
        """A proxy to `upstream` (host:port), listening on a port the kernel picks."""
        body = {"name": name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": True}
        resp = self.api.post("/proxies", json=body)
        assert resp.status_code == 201, resp.text
        port = int(resp.json()["listen"].rsplit(":", 1)[1])
        return Proxy(self.api, name, port, upstream)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_bytes().decode("utf-8", "replace")[-4000:]

    def close(self) -> None:
        self.api.close()
        stop_process(self.proc)
        self._log.close()
        self.dir.cleanup()
