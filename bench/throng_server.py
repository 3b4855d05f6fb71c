"""Starts a throng server on a free loopback port for the Python benchmarks in this
folder, and stops it by its pid (imported by catchup.py and comet_memory.py)."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

DEFAULT_BIN = str(Path(__file__).resolve().parent.parent / "target/release/throng")


@contextlib.contextmanager
def running(binary: str, *flags: str):
    """Yields (process, port) once the server accepts connections; stops it after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--stats-interval", "0", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield server, port
    finally:
        server.terminate()
        server.wait(timeout=15)
