"""`throng tune --conns N` reads the real limits, judges them, prints the fixes and
the --workers plan, exits 1 while something stops N connections, and with --apply
really raises a /proc/sys value; serve and bench point to it when a limit stops them."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
from pathlib import Path

import pytest

from conftest import free_port, throng_bin
from support.wait import wait_until

# Runs alone: it changes machine-wide sysctls.
pytestmark = pytest.mark.serial

SYSCTLS = [
    "fs.file-max",
    "fs.nr_open",
    "net.core.somaxconn",
    "net.ipv4.tcp_max_syn_backlog",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_mem",
]
# Sized at boot, read only (and shown from Linux 6.1 on): judged, never written.
EHASH = "net.ipv4.tcp_ehash_entries"


def proc_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


READ_ONLY = [EHASH] if proc_path(EHASH).exists() else []
ITEMS = ["RLIMIT_NOFILE soft", "RLIMIT_NOFILE hard", *SYSCTLS, *READ_ONLY]


def read_sysctl(key: str) -> int | list[int]:
    values = [int(v) for v in proc_path(key).read_text().split()]
    return values[0] if len(values) == 1 else values


def limit_files(n: int):
    """preexec_fn: give the child an open-files limit of n (soft and hard)."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def tune(*args: str, files: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(throng_bin()), "tune", *args],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        preexec_fn=limit_files(files) if files else None,
    )


@pytest.fixture
def restore_sysctls():
    """Puts back every value tune --apply may write, whatever the test did."""
    saved = {key: proc_path(key).read_text() for key in SYSCTLS}
    yield
    for key, text in saved.items():
        if proc_path(key).read_text() != text:
            proc_path(key).write_text(text)


def test_text_names_every_item_and_the_memory():
    run = tune("--conns", "1000")
    assert run.returncode in (0, 1), run.stderr
    for name in ITEMS:
        assert name in run.stdout, f"{name} missing:\n{run.stdout}"
    assert "memory (idle connections)" in run.stdout
    assert "1,000 sockets x 5,070 B" in run.stdout
    assert "1,000 WebSockets x 97 B" in run.stdout
    assert "Ephemeral ports" in run.stdout
    verdict = "Everything 1,000 connections need is in place." in run.stdout
    assert verdict == (run.returncode == 0), run.stdout


def test_json_values_agree_with_proc_sys_and_the_limits():
    run = tune("--conns", "5000", "--json", "--loopback", "--transport", "poll")
    report = json.loads(run.stdout)
    assert report["ok"] == (run.returncode == 0)
    items = {i["name"]: i for i in report["items"]}
    assert set(items) == set(ITEMS)
    for key in SYSCTLS + READ_ONLY:
        assert items[key]["current"] == read_sysctl(key), key
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert items["RLIMIT_NOFILE soft"]["current"] == soft
    assert items["RLIMIT_NOFILE hard"]["current"] == hard
    cores = len(os.sched_getaffinity(0))
    assert items["RLIMIT_NOFILE hard"]["needed"] == 5000 + 100 + cores
    # A loopback pair is two sockets; a waiting poll holds 177 B in throng.
    mem = report["memory"]
    assert mem["sockets"] == 10_000
    assert mem["kernel_bytes"] == 10_000 * mem["kernel_bytes_per_socket"]
    assert mem["throng_bytes"] == 5000 * 177
    # What --io-uring auto would add (its armed receives) is shown, not counted.
    assert mem["receive_bytes"] == 5000 * mem["receive_bytes_per_conn"] > 0
    assert mem["total_bytes"] == mem["kernel_bytes"] + mem["throng_bytes"] + mem["bench_bytes"]
    available = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo")
                     if line.startswith("MemAvailable:"))
    assert abs(mem["available_bytes"] - available) < available * 0.05
    low, high = read_sysctl("net.ipv4.ip_local_port_range")
    assert report["ports"]["per_source_address"] == high - low + 1


def test_more_connections_than_the_limit_exit_1_with_the_workers_plan():
    cores = len(os.sched_getaffinity(0))
    run = tune("--conns", "5000", files=1000)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "RLIMIT_NOFILE hard" in run.stdout and "TOO LOW" in run.stdout
    # The kernel spreads connections over workers by a hash, unevenly: the plan
    # leaves room for four standard deviations above the mean.
    per_worker = 1000 - 100 - cores
    workers = math.ceil(5000 / per_worker)
    while 5000 / workers + 4 * math.sqrt(5000 / workers) > per_worker:
        workers += 1
    procs = math.ceil(5000 / (1000 - 100))
    assert f"throng serve --workers {workers} --broker redis://" in run.stdout, run.stdout
    assert f"--conns 5000 --procs {procs}" in run.stdout, run.stdout
    assert "LimitNOFILE=" in run.stdout and "nofile" in run.stdout
    assert "Still too low for 5,000 connections: RLIMIT_NOFILE soft, RLIMIT_NOFILE hard" in run.stdout

    report = json.loads(tune("--conns", "5000", "--json", files=1000).stdout)
    assert report["ok"] is False
    assert report["plan"]["workers"] == workers
    assert report["plan"]["procs"] == procs
    assert report["fixes"]["systemd"] == f"LimitNOFILE={5000 + 100 + cores}"


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/proc/sys/net/core/somaxconn", os.W_OK),
    reason="needs root and a writable /proc/sys",
)


@needs_root
def test_apply_raises_a_sysctl_that_is_too_low(restore_sysctls):
    proc_path("net.core.somaxconn").write_text("512\n")
    before = tune("--conns", "2000")
    assert "net.core.somaxconn" in before.stdout
    assert "sysctl -w net.core.somaxconn=2000" in before.stdout, before.stdout
    assert "net.core.somaxconn = 2000" in before.stdout  # the sysctl.d line
    assert before.returncode == 1

    run = tune("--conns", "2000", "--apply")
    assert read_sysctl("net.core.somaxconn") == 2000, run.stdout
    assert "set net.core.somaxconn: 512 -> 2000" in run.stdout, run.stdout
    # What it judges afterwards is what it set.
    again = json.loads(tune("--conns", "2000", "--json").stdout)
    somaxconn = next(i for i in again["items"] if i["name"] == "net.core.somaxconn")
    assert somaxconn["current"] == 2000 and somaxconn["verdict"] == "OK"
    assert run.returncode == (0 if again["ok"] else 1)


@needs_root
def test_apply_says_plainly_it_cannot_raise_the_open_files_limit(restore_sysctls):
    run = tune("--conns", "5000", "--apply", files=1000)
    assert run.returncode == 1
    assert "NOT SET RLIMIT_NOFILE hard:" in run.stdout, run.stdout
    assert "NOT SET RLIMIT_NOFILE soft: not changed: raising this process's soft limit helps no other process" in run.stdout
    assert "throng serve --workers" in run.stdout
    cap_eff = next(int(line.split()[1], 16) for line in open("/proc/self/status")
                   if line.startswith("CapEff:"))
    if not cap_eff & (1 << 24):  # no CAP_SYS_RESOURCE: setrlimit says EPERM, and tune says why
        assert "lacks CAP_SYS_RESOURCE" in run.stdout, run.stdout


def wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 10.0) -> str:
    """The log at `path` once it says `text` (or the process ended, or at timeout)."""
    log = [""]

    def said() -> bool:
        log[0] = path.read_text()
        return text in log[0] or proc.poll() is not None

    wait_until(said, timeout, fail=False)
    return log[0]


@pytest.mark.parametrize("max_conns, hinted", [(1000, True), (100, False)])
def test_serve_points_to_tune_when_max_conns_is_over_the_limit(tmp_path, max_conns, hinted):
    err_path = tmp_path / "stderr.log"
    with open(err_path, "wb") as err:
        server = subprocess.Popen(
            [str(throng_bin()), "serve", "--listen", f"127.0.0.1:{free_port()}", "--threads", "2",
             "--stats-interval", "0", "--max-conns", str(max_conns)],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=limit_files(300),
        )
    try:
        wait_for(err_path, "open-files limit 300", server)
        # The hint, if any, is logged right after that line and before the server
        # stops: stop it and read everything it wrote, rather than guess how long
        # the next line takes.
        server.terminate()
        server.wait(timeout=10)
        log = err_path.read_text()
        assert "open-files limit 300: at most ~198" in log, log
        assert (f"`throng tune --conns {max_conns}`" in log) == hinted, log
        if hinted:
            assert "--max-conns 1,000 is more than the open-files limit lets a process hold (~198)" in log
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_bench_points_to_tune_when_the_limit_stops_it():
    run = subprocess.run(
        [str(throng_bin()), "bench", "idle", "--url", f"ws://127.0.0.1:{free_port()}/", "--conns", "1000",
         "--duration", "1s", "--interval", "0"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, preexec_fn=limit_files(300),
    )
    assert run.returncode != 0
    assert "use --procs 5" in run.stderr, run.stderr
    assert "`throng tune --conns 1000` says what to raise" in run.stderr, run.stderr


def test_in_a_network_namespace_it_reads_that_namespaces_socket_table_and_not_tcp_mem():
    """A container's network namespace shows no net.ipv4.tcp_mem (the host's
    applies) and has its own established-socket table, sized when it was made:
    tune says both instead of failing, and calls a small table SLOW, not a stop."""
    if not READ_ONLY:
        pytest.skip("this kernel does not show net.ipv4.tcp_ehash_entries (Linux < 6.1)")
    name = f"throng-tune-{os.getpid()}"
    child = proc_path("net.ipv4.tcp_child_ehash_entries")
    saved = child.read_text()
    try:
        child.write_text("1024")
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
        child.write_text(saved)
        run = subprocess.run(
            ["ip", "netns", "exec", name, str(throng_bin()), "tune", "--conns", "5000",
             "--loopback", "--json"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )
        report = json.loads(run.stdout)
        items = {i["name"]: i for i in report["items"]}
        assert "net.ipv4.tcp_mem" not in items, items
        assert items[EHASH]["current"] == 1024, items[EHASH]
        assert items[EHASH]["needed"] == 16384, "10,000 sockets, a power of two"
        assert items[EHASH]["verdict"] == "SLOW"
        assert report["fixes"]["boot"] == "thash_entries=16384"
        assert report["ok"] == (run.returncode == 0)
        text = subprocess.run(
            ["ip", "netns", "exec", name, str(throng_bin()), "tune", "--conns", "5000",
             "--loopback"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        ).stdout
        assert "not shown in this network namespace" in text, text
        assert "net.ipv4.tcp_child_ehash_entries=16384" in text, text
    finally:
        child.write_text(saved)
        subprocess.run(["ip", "netns", "del", name], timeout=30)
