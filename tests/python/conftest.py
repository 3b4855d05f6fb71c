"""Fixtures that run the real throng binary as a black box.

The binary comes from $THRONG_BIN (default: <repo>/target/release/throng).
A server the test gave no --listen is started on `--listen 127.0.0.1:0`: the
kernel picks a free port, and the server's first stdout line,
`listening on 127.0.0.1:PORT`, says which (a test that gives --listen passes
ports=[...] to wait on). Every server is stopped by PID (SIGTERM, wait, SIGKILL
fallback). Its stdout/stderr go to files and are attached to the report of a
failing test.

Helpers and fixtures shared by several test modules live in support/ (see
support/__init__.py); its fixtures are registered here (`pytest_plugins`), so no
test module imports another.

Tests run in parallel (pytest-xdist, scripts/test.sh): nothing here may assume
it has the machine to itself. A test that measures memory or CPU, or holds a
machine-wide resource (a network namespace, a sysctl, a fixed port), marks its
module `pytestmark = pytest.mark.serial` and then runs after the rest, alone.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_BIN = REPO / "target" / "release" / "throng"
DEFAULT_FLAGS = {"--threads": "2", "--stats-interval": "0"}
READY_TIMEOUT = 10.0
# What `throng serve` prints on stdout once bound (src/main.rs, announce_listening).
LISTENING = re.compile(r"^listening on (.+)$", re.M)

pytest_plugins = ["support.fixtures"]


def throng_bin() -> Path:
    return Path(os.environ.get("THRONG_BIN") or DEFAULT_BIN)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_range(n: int, attempts: int = 200) -> int:
    """Find n consecutive free ports; returns the first one."""
    for _ in range(attempts):
        base = random.randint(20000, 60000 - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"could not find {n} consecutive free ports")


def can_bind(addr: str) -> bool:
    """Whether a socket can be bound to this local address (e.g. 127.0.0.2 as a
    client's source address; some sandboxes only have 127.0.0.1)."""
    try:
        with socket.socket() as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def vm_rss_kb(pid: int) -> int:
    """A process's resident set size in KiB, from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def tcp_connectable(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class Server:
    """One running throng process."""

    def __init__(self, flags: list[str], env: dict | None, ports: list[int] | None, listen_given: bool,
                 cwd: str | None):
        # Without ports (and without --listen) the server is told port 0; either
        # way wait_ready() then learns its ports from its `listening on` line.
        self.ports = list(ports or [])
        self.port = self.ports[0] if self.ports else 0
        self._announced = ports is None
        self._tmp = tempfile.TemporaryDirectory(prefix="throng-test-")
        self.stdout_path = Path(self._tmp.name) / "stdout.log"
        self.stderr_path = Path(self._tmp.name) / "stderr.log"
        args = [str(throng_bin()), "serve"]
        if not listen_given:
            args += ["--listen", f"127.0.0.1:{self.port}"]
        for flag, value in DEFAULT_FLAGS.items():
            if flag not in flags:
                args += [flag, value]
        args += flags
        self.args = args
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("THRONG_")}
        full_env.update(env or {})
        self._out = open(self.stdout_path, "wb")
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            args, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL, env=full_env, cwd=cwd
        )
        self.pid = self.proc.pid
        self.returncode: int | None = None

    # -- lifecycle -----------------------------------------------------------
    def bound_addresses(self) -> list[str] | None:
        """The addresses of the server's `listening on` line, once it printed it."""
        found = LISTENING.search(self.stdout())
        return found.group(1).split() if found else None

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while self._announced and not self.ports:
            addrs = self.bound_addresses()
            if addrs:
                self.ports = [int(a.rsplit(":", 1)[1]) for a in addrs]
                self.port = self.ports[0]
                break
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"throng exited early with code {self.proc.returncode}\n{self.describe()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"throng printed no 'listening on' line after {timeout}s\n{self.describe()}")
            time.sleep(0.02)
        pending = list(self.ports)
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"throng exited early with code {self.proc.returncode}\n{self.describe()}"
                )
            pending = [p for p in pending if not tcp_connectable(p)]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"throng not ready on ports {pending} after {timeout}s\n{self.describe()}")
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int | None:
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.returncode

    def stop(self, term_timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if self.wait(term_timeout) is None:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=5)
        self.returncode = self.proc.returncode
        self._out.close()
        self._err.close()

    def cleanup(self) -> None:
        self._tmp.cleanup()

    # -- output ----------------------------------------------------------------
    def stdout(self) -> str:
        self._out.flush()
        return self.stdout_path.read_bytes().decode("utf-8", "replace")

    def stderr(self) -> str:
        self._err.flush()
        return self.stderr_path.read_bytes().decode("utf-8", "replace")

    def describe(self, limit: int = 6000) -> str:
        def tail(s: str) -> str:
            return s if len(s) <= limit else "...[truncated]...\n" + s[-limit:]

        return (
            f"command: {' '.join(self.args)}\npid: {self.pid} returncode: {self.proc.poll()}\n"
            f"--- stdout ---\n{tail(self.stdout())}\n--- stderr ---\n{tail(self.stderr())}"
        )

    def url(self, path: str = "/echo", port: int | None = None) -> str:
        return f"ws://127.0.0.1:{port or self.port}{path}"


def _start(request, flags, env=None, ports=None, wait=True, cwd=None) -> Server:
    flags = [str(f) for f in flags]
    listen_given = "--listen" in flags
    binary = throng_bin()
    if not binary.exists():
        pytest.fail(f"throng binary not found at {binary} (set THRONG_BIN or build with cargo build --release)")
    srv = Server(flags, env, ports, listen_given, cwd)
    request.node.__dict__.setdefault("_throng_servers", []).append(srv)
    if wait:
        try:
            srv.wait_ready()
        except Exception:
            srv.stop()
            raise
    return srv


@pytest.fixture
def start_server(request):
    """start_server(*flags, env=None, ports=None, wait=True) -> Server.

    If no --listen flag is given the server listens on 127.0.0.1:0 and srv.port
    is the port it reports (known once it is ready: with wait=False, only after
    srv.wait_ready()). If --listen flags are given, pass ports=[...] so readiness
    can be polled.
    """
    servers: list[Server] = []

    def start(*flags, env=None, ports=None, wait=True, cwd=None) -> Server:
        srv = _start(request, flags, env=env, ports=ports, wait=wait, cwd=cwd)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()
    for srv in servers:
        srv.cleanup()


@pytest.fixture
def server(start_server):
    """A default server (no extra flags)."""
    return start_server()


@pytest.fixture(scope="module")
def shared_server(request):
    """One default server shared by the tests of a module (for read-only HTTP/echo checks).
    Module param via `SHARED_SERVER_FLAGS` in the test module."""
    flags = getattr(request.module, "SHARED_SERVER_FLAGS", [])
    srv = _start(request, flags)
    yield srv
    srv.stop()
    srv.cleanup()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        servers = list(item.__dict__.get("_throng_servers", []))
        # module-scoped servers are registered on the module's request node
        mod = item.getparent(pytest.Module)
        if mod is not None:
            servers += [s for s in mod.__dict__.get("_throng_servers", []) if s not in servers]
        for i, srv in enumerate(servers):
            try:
                rep.sections.append((f"throng server #{i} (pid {srv.pid})", srv.describe()))
            except Exception as e:  # pragma: no cover
                rep.sections.append((f"throng server #{i}", f"<could not read output: {e}>"))

