"""What the Python benchmarks in this folder share for their processes: a free
loopback port, whether a port accepts, waiting for a condition or for a started
process to listen, a process's descendants, stopping the processes a server is
made of. Each waiter raises the exception its caller names (`fail`):
scripts that stop at the first failure pass SystemExit, scripts that record an
error in their report and go on to the next round pass RuntimeError."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connectable(port: int, timeout: float = 0.2) -> bool:
    """Something accepts a TCP connection on 127.0.0.1:port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=timeout).close()
        return True
    except OSError:
        return False


def wait_until(cond, seconds: float, what: str, fail: type[BaseException] = SystemExit) -> None:
    """Polls cond() every 50 ms; raises fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise fail(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.05)


def wait_port(port: int, proc: subprocess.Popen, what: str, tries: int = 100,
              fail: type[BaseException] = SystemExit) -> None:
    """Tries to connect every 100 ms, `tries` times, while proc runs; raises fail if
    proc exits first or never listens."""
    for _ in range(tries):
        if proc.poll() is not None:
            raise fail(f"{what} exited early ({proc.returncode})")
        if connectable(port):
            return
        time.sleep(0.1)
    raise fail(f"{what} not listening on {port}")


def children(pid: int) -> list[int]:
    """The processes whose parent is pid (from every /proc/N/stat)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def tree(pid: int) -> list[int]:
    """pid and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each running one, the last started first; then waits up to 15 s
    for each, and kills one that is still there."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
