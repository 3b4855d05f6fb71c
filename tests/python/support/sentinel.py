"""Redis topologies for the tests, from Debian's redis-server: a master, one
replica and one Sentinel (`SentinelSet`), each on a free loopback port in a
temporary directory and stopped by its pid.

The replica replicates THROUGH a TCP proxy (`LagProxy`, a thread in this process)
that a test can hold: `hold_replication()` stops forwarding what the master sends
(the bytes are kept, both sockets stay open, so the replica lags without knowing
it) and `release_replication()` forwards what was kept and goes on. A failover
while replication is held promotes a replica that misses what the master had
acknowledged: what a Sentinel failover can lose, on demand.

Sentinel is tuned so that failovers are quick and go through the first time:
- `down-after-milliseconds` 400: a master is down 0.4 s after it stops answering;
- `SENTINEL DEBUG info-period` 250 ms: Sentinel refreshes its replicas' INFO that
  often; it picks a replica only if its INFO is fresh (5 pings, 5 s, once the
  master is down; 3 info-periods otherwise), and with the default 10 s a failover
  can find no good replica and then waits 2 x failover-timeout to try again;
- `failover-timeout` 60 s, long on purpose: Sentinel re-points a replica whose
  master address is not the master's (`+fix-slave-config`) once failover-timeout
  has passed since it found the replica, and the replica's master here is the
  proxy. A test must do its holding within a minute of the set's start.
The replica's `repl-timeout` is an hour so that a long hold does not make it
drop the link (the master's pings are held too); Sentinel reaches the replica
directly (the master lists it with the port the replica announces: its own).

`cd tests/python && python3 -m support.sentinel` starts a set, prints its URL and waits
for Ctrl-C, for trying throng by hand.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

from conftest import free_port, tcp_connectable
from support.wait import wait_until

MASTER_NAME = "throng"
DOWN_AFTER_MS = 400
FAILOVER_TIMEOUT_MS = 60_000
INFO_PERIOD_MS = 250
START_TIMEOUT = 20.0


class RespError(Exception):
    """An error Redis answered (`-ERR …`)."""


def command(port: int, *args, password: str | None = None, timeout: float = 5.0):
    """One command to the Redis or Sentinel on 127.0.0.1:port, on a connection of
    its own (AUTH first with a password); the answer parsed (bulk strings as str,
    errors raised as RespError)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        reader = _Reader(s)
        if password is not None:
            s.sendall(_encode(("AUTH", password)))
            if isinstance(answer := reader.value(), RespError):
                raise answer
        s.sendall(_encode(args))
        reply = reader.value()
    if isinstance(reply, RespError):
        raise reply
    return reply


def _encode(args) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(f"${len(b)}\r\n".encode() + b + b"\r\n")
    return b"".join(out)


class _Reader:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._more()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed mid-answer")
        self.buf += data

    def value(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RespError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._more()
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data.decode("utf-8", "replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.value() for _ in range(n)]
        raise ConnectionError(f"unreadable answer {line[:80]!r}")


def pairs(flat: list) -> dict:
    """Sentinel's [k1, v1, k2, v2, …] answers as a dict."""
    return dict(zip(flat[::2], flat[1::2]))


def info(port: int, section: str = "replication", password: str | None = None) -> dict:
    text = command(port, "INFO", section, password=password)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))


# A Redis or Sentinel that is starting or failing over refuses connections or
# answers errors for a moment: wait_until(..., ignore=SETTLING) counts those as
# "not yet" instead of failing at once.
SETTLING = (OSError, RespError, ConnectionError)


class _Pair:
    """One proxied connection: replica side (`down`) and master side (`up`)."""

    def __init__(self, down: socket.socket, up: socket.socket):
        self.down = down
        self.up = up
        self.kept = bytearray()  # from the master, not forwarded yet
        self.up_eof = False
        self.closed = False


class LagProxy:
    """A TCP proxy in front of a master for its replica. Replica -> master always
    flows; master -> replica flows unless held. Held bytes are kept, in order, and
    forwarded on release; a held pair is never closed (not even when the master
    dies), so the replica's link looks up while it lags."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.cond = threading.Condition()
        self.held = False
        self.pairs: list[_Pair] = []
        threading.Thread(target=self._accept, daemon=True, name=f"lag-proxy-{self.port}").start()

    def hold(self) -> None:
        with self.cond:
            self.held = True

    def release(self) -> None:
        with self.cond:
            self.held = False
            self.cond.notify_all()

    def held_bytes(self) -> int:
        with self.cond:
            return sum(len(p.kept) for p in self.pairs)

    def close(self) -> None:
        try:
            self.listener.close()
        except OSError:
            pass
        with self.cond:
            pairs, self.pairs = self.pairs, []
            for p in pairs:
                p.closed = True
            self.cond.notify_all()
        for p in pairs:
            _close(p.down, p.up)

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                up.settimeout(None)
            except OSError:
                down.close()
                continue
            pair = _Pair(down, up)
            with self.cond:
                self.pairs.append(pair)
            for target in (self._replica_to_master, self._master_in, self._master_out):
                threading.Thread(target=target, args=(pair,), daemon=True).start()

    def _replica_to_master(self, pair: _Pair) -> None:
        try:
            while data := pair.down.recv(65536):
                pair.up.sendall(data)
        except OSError:
            pass
        # The replica left (closed, or promoted): the pair is over.
        with self.cond:
            pair.closed = True
            self.cond.notify_all()
        _close(pair.down, pair.up)

    def _master_in(self, pair: _Pair) -> None:
        try:
            while data := pair.up.recv(65536):
                with self.cond:
                    pair.kept += data
                    self.cond.notify_all()
        except OSError:
            pass
        with self.cond:
            pair.up_eof = True
            self.cond.notify_all()

    def _master_out(self, pair: _Pair) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: pair.closed or (not self.held and (pair.kept or pair.up_eof)))
                if pair.closed:
                    return
                data = bytes(pair.kept)
                pair.kept.clear()
                eof = pair.up_eof and not data
            if eof:
                # The master is gone and nothing is held: the replica may know.
                try:
                    pair.down.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                pair.down.sendall(data)
            except OSError:
                return


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


class _Process:
    """redis-server (or redis-server --sentinel) on a free port, stopped by pid."""

    def __init__(self, name: str, root: Path, args: list[str], port: int):
        self.name = name
        self.port = port
        self.dir = root / name
        self.dir.mkdir(exist_ok=True)
        self.log = self.dir / "log.txt"
        self.args = args
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", *self.args, "--logfile", str(self.log)],
            cwd=self.dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not tcp_connectable(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start on {self.port}\n{self.tail()}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, limit: int = 3000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} (port {self.port}) ---\n{text[-limit:]}"


def _server_args(port: int, password: str | None) -> list[str]:
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--repl-diskless-sync-delay", "0"]
    if password is not None:
        # masterauth on both: after a failover the old master replicates from the new.
        args += ["--requirepass", password, "--masterauth", password]
    return args


class SentinelSet:
    """A master, `replicas` replicas replicating through one `LagProxy`, and one
    Sentinel (quorum 1) watching them under `MASTER_NAME`. Ready when Sentinel
    knows every replica (a failover could pick it) and the master counts each one
    online. With `password` every Redis requires it (Sentinel is told it; Sentinel
    itself has none). After a failover Sentinel points the other replicas at the
    promoted one directly, not through the proxy."""

    def __init__(self, name: str = MASTER_NAME, password: str | None = None, replicas: int = 1):
        assert shutil.which("redis-server"), "redis-server is not installed (scripts/test.sh installs it)"
        self.name = name
        self.password = password
        self._tmp = tempfile.TemporaryDirectory(prefix="throng-sentinel-")
        root = Path(self._tmp.name)
        self.redis: dict[int, _Process] = {}
        self.proxy: LagProxy | None = None
        self.sentinel: _Process | None = None
        try:
            mport = free_port()
            master = _Process("master", root, _server_args(mport, password), mport)
            master.start()
            self.redis[master.port] = master
            self.proxy = LagProxy(master.port)
            rports = []
            for i in range(replicas):
                rport = free_port()
                replica = _Process("replica" if i == 0 else f"replica{i + 1}", root, _server_args(rport, password) + [
                    "--replicaof", "127.0.0.1", str(self.proxy.port),
                    "--replica-announce-ip", "127.0.0.1", "--repl-timeout", "3600",
                ], rport)
                replica.start()
                self.redis[rport] = replica
                rports.append(rport)
                wait_until(lambda: info(rport, password=password).get("master_link_status") == "up", START_TIMEOUT,
                           "replica in sync through the proxy", ignore=SETTLING)
            sport = free_port()
            conf = root / "sentinel.conf"
            conf.write_text(
                f"port {sport}\nbind 127.0.0.1\ndir {root}\n"
                f"sentinel monitor {name} 127.0.0.1 {master.port} 1\n"
                f"sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {name} 1\n"
                + (f"sentinel auth-pass {name} {password}\n" if password is not None else "")
            )
            self.sentinel = _Process("sentinel", root, [str(conf), "--sentinel"], sport)
            self.sentinel.start()
            command(sport, "SENTINEL", "DEBUG", "info-period", INFO_PERIOD_MS)
            for rport in rports:
                wait_until(lambda: self._replica_known(rport), START_TIMEOUT, "Sentinel knows the replica", ignore=SETTLING)
            # The master counts a replica (as --redis-wait-replicas does) once
            # the first sync is done on its side too.
            wait_until(lambda: sum("state=online" in v for k, v in info(master.port, password=password).items()
                                   if k.startswith("slave")) == replicas, START_TIMEOUT,
                       "the replicas online at the master", ignore=SETTLING)
        except BaseException:
            self.close()
            raise

    # -- what tests use ------------------------------------------------------
    @property
    def url(self) -> str:
        """redis-sentinel://[:PASSWORD@]127.0.0.1:SENTINEL_PORT/NAME"""
        auth = f":{quote(self.password, safe='')}@" if self.password is not None else ""
        return f"redis-sentinel://{auth}127.0.0.1:{self.sentinel_port}/{self.name}"

    @property
    def sentinel_port(self) -> int:
        return self.sentinel.port

    def master_port(self) -> int:
        """The master's port as Sentinel names it now."""
        host, port = command(self.sentinel_port, "SENTINEL", "get-master-addr-by-name", self.name)
        return int(port)

    def replica_port(self) -> int:
        """The port of the Redis started as the replica (the master after one failover)."""
        return next(p for p, r in self.redis.items() if r.name == "replica")

    def kill_master(self) -> int:
        """SIGKILL of the master Sentinel names now; returns its port."""
        port = self.master_port()
        self.redis[port].kill()
        return port

    def failover(self) -> None:
        """SENTINEL FAILOVER: the replica is promoted, the master demoted."""
        assert command(self.sentinel_port, "SENTINEL", "FAILOVER", self.name) == "OK"

    def wait_switched(self, old_port: int, timeout: float = 30.0) -> int:
        """Waits until Sentinel names a master other than old_port and that Redis says
        it is a master; returns its port."""

        def switched():
            port = self.master_port()
            if port == old_port:
                return None
            return port if self.redis_command(port, "ROLE")[0] == "master" else None

        try:
            return wait_until(switched, timeout, f"Sentinel switched away from {old_port}", ignore=SETTLING)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.describe()}") from None

    def hold_replication(self) -> None:
        self.proxy.hold()

    def release_replication(self) -> None:
        self.proxy.release()

    def redis_command(self, port: int, *args):
        """A command to one of the set's Redis servers (with the set's password)."""
        return command(port, *args, password=self.password)

    def offset(self, port: int) -> int:
        """A Redis' replication offset (master_repl_offset, or slave_repl_offset)."""
        i = info(port, password=self.password)
        return int(i.get("slave_repl_offset") or i["master_repl_offset"])

    def stop_sentinel(self) -> None:
        self.sentinel.stop()

    def start_sentinel(self) -> None:
        # Same port and the config file Sentinel rewrote: it knows what it knew.
        self.sentinel.start()
        command(self.sentinel_port, "SENTINEL", "DEBUG", "info-period", INFO_PERIOD_MS)

    def describe(self) -> str:
        parts = [p.tail() for p in self.redis.values()]
        if self.sentinel:
            parts.append(self.sentinel.tail())
        return "\n".join(parts)

    def close(self) -> None:
        for p in list(self.redis.values()) + ([self.sentinel] if self.sentinel else []):
            p.stop()
        if self.proxy:
            self.proxy.close()
        self._tmp.cleanup()

    def __enter__(self) -> "SentinelSet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- readiness -------------------------------------------------------------
    def _replica_known(self, rport: int) -> bool:
        for r in command(self.sentinel_port, "SENTINEL", "replicas", self.name):
            r = pairs(r)
            if int(r["port"]) == rport:
                flags = r["flags"].split(",")
                return ("s_down" not in flags and "disconnected" not in flags
                        and r.get("master-link-status") == "ok")
        return False


if __name__ == "__main__":
    with SentinelSet() as s:
        print(s.url, "master", s.master_port(), "replica", s.replica_port(), flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
