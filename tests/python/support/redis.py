"""The one launcher of a single redis-server (`Redis`): plain, persistent
(append-only, so what it acknowledged survives a restart), in cluster mode alone
owning every slot, or a replica of another. Each is Debian's redis-server on a
free loopback port in a temporary directory, stopped by its pid. The Sentinel set
lives in support/sentinel.py, the 6-process Cluster in support/cluster.py; the
per-worker shared Redis is a fixture (support/fixtures.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

from conftest import free_port, tcp_connectable
from procs import stop_process
from support.wait import wait_until

START_TIMEOUT = 10.0


class Redis:
    """redis-server on a free loopback port. `persist` keeps an append-only file;
    `cluster` runs it in cluster mode, alone in its cluster and owning every slot;
    `replica_of` makes it replicate that Redis (it is started once the master
    counts it online). stop() and start() again keep its port and directory."""

    def __init__(self, persist: bool = False, cluster: bool = False, replica_of: Redis | None = None) -> None:
        assert shutil.which("redis-server"), "redis-server is not installed (scripts/test.sh installs it)"
        self.persist = persist
        self.cluster = cluster
        self.master = replica_of
        self.dir = tempfile.TemporaryDirectory(prefix="throng-redis-")
        self.proc: subprocess.Popen | None = None
        self.bus_port: int | None = None
        # A free port may be taken by another test's process before redis-server
        # binds it (tests run in parallel): the first start tries another one.
        for attempt in range(3):
            self.port = free_port()
            try:
                self.start()
                return
            except AssertionError:
                if attempt == 2 or self.proc is None or self.proc.poll() is None:
                    raise
                # Another port, and a cluster node that is fresh again.
                self.bus_port = None
                if os.path.exists(self.cluster_conf):
                    os.remove(self.cluster_conf)

    def server_args(self) -> list[str]:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes" if self.persist else "no", "--dir", self.dir.name]
        if self.persist:
            args += ["--appendfsync", "always"]
        if self.cluster:
            if self.bus_port is None:
                # Not the default (port + 10000), which may be taken or past 65535.
                self.bus_port = free_port()
            args += ["--cluster-enabled", "yes", "--cluster-config-file", self.cluster_conf,
                     "--cluster-port", str(self.bus_port)]
        if self.master is not None:
            args += ["--replicaof", "127.0.0.1", str(self.master.port)]
        return args

    @property
    def cluster_conf(self) -> str:
        return os.path.join(self.dir.name, "nodes.conf")

    def start(self) -> None:
        fresh_cluster = self.cluster and not os.path.exists(self.cluster_conf)
        self.proc = subprocess.Popen(
            self.server_args(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not tcp_connectable(self.port):
            assert self.proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, f"redis-server not listening after {START_TIMEOUT} s"
            time.sleep(0.05)
        if fresh_cluster:
            assert self.cli("CLUSTER", "ADDSLOTSRANGE", "0", "16383") == "OK"
        if self.cluster:
            wait_until(lambda: "cluster_state:ok" in self.cli("CLUSTER", "INFO"), timeout=10,
                       what="cluster_state:ok")
        if self.master is not None:
            wait_until(lambda: "master_link_status:up" in self.cli("INFO", "replication"),
                       timeout=10, what="replica linked")
            # The master counts it (--redis-wait-replicas needs it online there) only
            # once the first sync is done on its side too.
            wait_until(lambda: "state=online" in self.master.cli("INFO", "replication"),
                       timeout=10, what="replica online at the master")

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)

    def close(self) -> None:
        """stop() and remove its directory."""
        self.stop()
        self.dir.cleanup()

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, timeout=10, check=True
        )
        return out.stdout.decode().strip()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"
