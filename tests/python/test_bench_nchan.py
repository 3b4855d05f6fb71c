"""`throng bench push --transport sse` against a server that is not throng: Nchan
(Debian's nginx-light + libnginx-mod-nchan, which scripts/test.sh installs), run
from bench/peers/nchan/nginx.conf.template on a free port as its own nginx process
and stopped by its master's pid.

Nchan has no seqs (its event ids are `<unix seconds>:<n>`), so the bench numbers
its own messages (`--seq-from payload`) and publishes to `/pub/{channel}`. Nchan
resumes an EventSource from `Last-Event-ID`, so `--reconnect` is checked there too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import free_port, tcp_connectable
from test_bench import assert_clean, assert_latency_sane, assert_no_panic, run_bench, short

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "bench/peers/nchan/nginx.conf.template"
MODULES = [Path("/usr/lib/nginx/modules/ngx_nchan_module.so"), Path("/usr/share/nginx/modules/ngx_nchan_module.so")]


class Nchan:
    def __init__(self) -> None:
        module = next((m for m in MODULES if m.exists()), None)
        assert module, "libnginx-mod-nchan is not installed (scripts/test.sh installs it)"
        self.dir = tempfile.TemporaryDirectory(prefix="throng-nchan-")
        d = Path(self.dir.name)
        (d / "tmp").mkdir()
        self.port = free_port()
        user = ""
        if os.geteuid() == 0:
            import grp
            import pwd

            user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};"
        conf = (
            TEMPLATE.read_text()
            .replace("@MODULE@", str(module))
            .replace("@WORKERS@", "1")
            .replace("@PORT@", str(self.port))
            .replace("@DIR@", str(d))
            .replace("@USER@", user)
        )
        (d / "nginx.conf").write_text(conf)
        self.log = d / "error.log"
        self.proc = subprocess.Popen(
            ["nginx", "-p", f"{d}/", "-c", "nginx.conf", "-e", str(self.log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while not tcp_connectable(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nginx did not start: {self.describe()}")
            time.sleep(0.05)

    def describe(self) -> str:
        log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        return f"nginx on port {self.port}, pid {self.proc.pid}; error.log:\n{log}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.proc.stderr:
            self.proc.stderr.close()
        self.dir.cleanup()


@pytest.fixture
def nchan():
    server = Nchan()
    yield server
    server.stop()


@pytest.mark.parametrize("reconnect", [False, True], ids=["steady", "reconnecting"])
def test_push_over_sse_against_nchan(nchan, reconnect):
    conns, channels = 10, 2
    extra = ["--reconnect", "0.5", "--reconnect-interval", "300ms"] if reconnect else []
    run = run_bench(
        "push", "--url", f"http://127.0.0.1:{nchan.port}/sse/{{channel}}", "--transport", "sse",
        "--seq-from", "payload", "--publish-url", f"http://127.0.0.1:{nchan.port}/pub/{{channel}}",
        "--publishers", "1", "--conns", conns, "--channels", channels, "--publish-rate", 100,
        "--grace", "1s", *extra, *short(duration="2s"),
    )
    ctx = run.describe() + "\n" + nchan.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert_clean(r, conns, ctx)
    p = r["push"]
    assert p["publish_errors"] == 0 and p["published"] > 0, ctx
    assert p["expected_deliveries"] == (conns // channels) * p["published"], ctx
    assert p["delivered"] == p["expected_deliveries"], ctx
    assert (p["lost"], p["duplicated"], p["out_of_order"]) == (0, 0, 0), ctx
    assert_latency_sane(r["latency"], ctx)
    if reconnect:
        assert p["reconnects"] >= 10, ctx
