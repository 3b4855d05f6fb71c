"""`--workers N`: a master runs N serving processes on one port (SO_REUSEPORT), all
joined through Redis, and keeps them running: connections spread over the workers,
a broadcast reaches subscribers of every worker, a killed worker is started again,
SIGTERM drains them all; without Redis, more than one worker is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from conftest import free_port, throng_bin
from rawws import http_request, publish_ok
from support.wait import wait_until
from wsutil import recv_json, run, ws_connect


def children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry))
    return found


def answering_pids(port: int, tries: int = 60) -> set[int]:
    return {http_request(port, "GET", "/api/stats").json()["pid"] for _ in range(tries)}


def test_workers_share_a_port_fan_out_through_redis_and_are_restarted(start_server, shared_redis, prefix):
    port = free_port()
    master = start_server("--listen", f"127.0.0.1:{port}", "--workers", "4", "--broker", shared_redis.url,
                          ports=[port])
    def four_workers():
        c = children(master.pid)
        return c if len(c) == 4 else None

    workers = wait_until(four_workers, what="4 workers")

    def several_answering():
        p = answering_pids(port)
        return p if len(p) >= 2 else None

    # The kernel spreads connections over the workers.
    pids = wait_until(several_answering, what="several workers answering")
    assert pids <= workers, (pids, workers)

    async def main():
        subs = [await ws_connect(f"ws://127.0.0.1:{port}/ws/{prefix}all?format=json") for _ in range(24)]
        try:
            wait_until(lambda: http_request(port, "GET", f"/api/channels/{prefix}all").json()["subscribers"] == 24,
                     what="24 subscribers counted over the workers")
            seq = publish_ok(port, f"{prefix}all", "to everyone")
            for ws in subs:
                msg = await recv_json(ws)
                assert (msg["seq"], msg["data"]) == (seq, "to everyone"), msg
        finally:
            for ws in subs:
                await ws.close()

    run(main())
    # A worker killed outright is started again; the port keeps answering.
    victim = sorted(workers)[0]
    os.kill(victim, signal.SIGKILL)
    def replaced():
        c = children(master.pid)
        return c if len(c) == 4 and victim not in c else None

    renewed = wait_until(replaced, timeout=10, what="the killed worker replaced")
    assert len(renewed - workers) == 1
    # Its pid shows before it listens and reaches Redis (503 until then).
    wait_until(lambda: http_request(port, "GET", "/healthz").status == 200, timeout=10,
             what="/healthz answering 200 with the new worker")
    # SIGTERM to the master drains every worker and ends the master.
    os.kill(master.pid, signal.SIGTERM)
    assert master.wait(20) == 0, master.describe()
    assert not any(os.path.exists(f"/proc/{p}") for p in renewed), "a worker outlived its master"
    assert "worker died; starting it again" in master.stderr()


def test_workers_on_port_0_share_the_one_port_their_master_picked_and_reports(start_server, shared_redis):
    # The master binds port 0 once (never listening on it) and hands the port to
    # every worker, a restarted one too; it alone prints the `listening on` line.
    master = start_server("--workers", "2", "--broker", shared_redis.url)
    assert master.port != 0

    def two_workers():
        c = children(master.pid)
        return c if len(c) == 2 else None

    workers = wait_until(two_workers, what="2 workers")

    def both_answering():
        p = answering_pids(master.port)
        return p if p == workers else None

    wait_until(both_answering, timeout=10, what=lambda: f"workers {workers} not both answering on {master.port}")
    victim = sorted(workers)[0]
    os.kill(victim, signal.SIGKILL)

    def replaced():
        c = children(master.pid)
        return c if len(c) == 2 and victim not in c else None

    renewed = wait_until(replaced, timeout=10, what="the killed worker started again")

    def all_renewed_answering():
        p = answering_pids(master.port)
        return p if p == renewed else None

    wait_until(all_renewed_answering, timeout=10, what="the restarted worker answering on the same port")
    assert master.stdout().count("listening on ") == 1, master.stdout()


def test_more_than_one_worker_needs_redis():
    out = subprocess.run(
        [str(throng_bin()), "serve", "--listen", f"127.0.0.1:{free_port()}", "--workers", "2"],
        capture_output=True, timeout=10,
    )
    assert out.returncode != 0
    assert b"--workers 2 needs --broker redis://" in out.stderr, out.stderr


def test_tls_workers_resume_each_others_sessions_and_reload_on_sighup(start_server, shared_redis, tmp_path):
    import ssl
    from support.tls import client_context, der, https_get, make_cert, served_cert

    cert, key = make_cert(tmp_path, "workers")
    port = free_port()
    master = start_server("--listen", f"127.0.0.1:{port}", "--workers", "3", "--broker", shared_redis.url,
                          "--tls-cert", cert, "--tls-key", key, ports=[port])
    wait_until(lambda: len(children(master.pid)) == 3 or None, what="3 workers")
    ctx = client_context(cert, ssl.TLSVersion.TLSv1_2)
    session, _ = https_get(port, ctx)
    # Each connection lands on whichever worker the kernel picks; with a ticket
    # key the master handed them all, every one of them resumes.
    resumed = [https_get(port, ctx, session)[1] for _ in range(20)]
    assert all(resumed), resumed
    # SIGHUP to the master reaches every worker.
    new_cert, new_key = make_cert(tmp_path, "renewed")
    cert.write_bytes(new_cert.read_bytes())
    key.write_bytes(new_key.read_bytes())
    master.signal(signal.SIGHUP)
    wait_until(lambda: all(served_cert(port) == der(new_cert) for _ in range(20)) or None,
             what="every worker serving the new certificate")
