"""Servers that are not throng, run by the tests themselves (nginx, for Nchan and
as a reverse proxy): each in a temporary directory on a free port, stopped by its
pid. Redis lives in test_redis.py (it also restarts)."""

from __future__ import annotations

import grp
import os
import pwd
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from conftest import free_port, tcp_connectable


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout`."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


class Nginx:
    """nginx as its own process (never the system service). `render(dir, port,
    user_line)` returns its nginx.conf: `dir` holds the pid file, logs and temp
    paths (`dir/tmp` exists), `port` is free, and `user_line` keeps the workers'
    user when the tests run as root."""

    def __init__(self, render: Callable[[Path, int, str], str]):
        self.dir = tempfile.TemporaryDirectory(prefix="throng-nginx-")
        d = Path(self.dir.name)
        (d / "tmp").mkdir()
        self.port = free_port()
        user = ""
        if os.geteuid() == 0:
            user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};"
        (d / "nginx.conf").write_text(render(d, self.port, user))
        self.log = d / "error.log"
        self.proc = subprocess.Popen(
            ["nginx", "-p", f"{d}/", "-c", "nginx.conf", "-e", str(self.log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while not tcp_connectable(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
                self.stop()
                raise RuntimeError(f"nginx did not start: {err} {self.describe()}")
            time.sleep(0.05)

    def describe(self) -> str:
        log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        return f"nginx on port {self.port}, pid {self.proc.pid}; error.log:\n{log}"

    def stop(self) -> None:
        stop_process(self.proc)
        if self.proc.stderr:
            self.proc.stderr.close()
        self.dir.cleanup()
