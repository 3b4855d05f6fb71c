"""A real Redis Cluster for tests: Debian's redis-server with `--cluster-enabled yes`,
masters and replicas on free loopback ports (client and bus ports both picked free),
joined by `redis-cli --cluster create`, each process stopped by its pid."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from conftest import free_port, tcp_connectable
from procs import stop_process


class ClusterNode:
    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.bus = free_port()
        self.dir = root / str(self.port)
        self.dir.mkdir()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-port", str(self.bus),
             "--cluster-config-file", str(self.dir / "nodes.conf"),
             "--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
             "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not tcp_connectable(self.port):
            assert self.proc.poll() is None, "redis-server (cluster node) exited at start"
            assert time.monotonic() < deadline, "cluster node not listening after 10 s"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def cli(self, *args: str) -> str:
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args],
                             capture_output=True, timeout=10, check=True)
        return out.stdout.decode().strip()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


class RedisCluster:
    """`masters` masters, each with `replicas` replicas."""

    def __init__(self, masters: int = 3, replicas: int = 1) -> None:
        assert shutil.which("redis-server"), "redis-server is not installed (scripts/test.sh installs it)"
        self.root = tempfile.TemporaryDirectory(prefix="throng-cluster-")
        self.nodes = [ClusterNode(Path(self.root.name)) for _ in range(masters * (1 + replicas))]
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                ["redis-cli", "--cluster", "create", *[n.addr for n in self.nodes],
                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                capture_output=True, timeout=60, check=True,
            )
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Every running node says cluster_state:ok, and every replica is linked to its
        master (a replica that never synced could not take over)."""
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for node in self.running():
                try:
                    states.append("cluster_state:ok" in node.cli("CLUSTER", "INFO"))
                    replication = node.cli("INFO", "replication")
                    if "role:slave" in replication:
                        states.append("master_link_status:up" in replication)
                except subprocess.SubprocessError:
                    states.append(False)
            if all(states):
                return
            assert time.monotonic() < deadline, f"cluster not ok after {timeout}s"
            time.sleep(0.1)

    def running(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.proc is not None]

    def masters(self) -> list[ClusterNode]:
        return [n for n in self.running() if "role:master" in n.cli("INFO", "replication")]

    def node_at(self, port: int) -> ClusterNode:
        return next(n for n in self.nodes if n.port == port)

    def master_of(self, key: str) -> ClusterNode:
        slot = int(self.running()[0].cli("CLUSTER", "KEYSLOT", key))
        for node in self.masters():
            for line in node.cli("CLUSTER", "NODES").splitlines():
                fields = line.split()
                if "myself" in fields[2]:
                    for part in fields[8:]:
                        lo, _, hi = part.partition("-")
                        if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                            return node
        raise AssertionError(f"no master holds the slot of {key}")

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(n.addr for n in self.nodes[:3])

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.root.cleanup()
