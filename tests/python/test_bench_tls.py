"""`throng bench` over TLS (`wss://`, `https://`) as a black box.

The TLS servers are Python's, run as subprocesses on free ports and stopped by
pid: the `websockets` library's echo server behind `ssl`, and a small TLS
terminator in front of a plain throng server, so push over ws, sse and poll,
the publisher's `https://` API and `bench handshakes` (a GET of /healthz) meet
throng itself. When `throng serve` has `--tls-cert`, one case runs against
its own TLS too.

Certificates are made by `openssl` in a temporary directory: a self-signed one
exactly as `openssl req -x509` makes it (a CA's certificate, which webpki
refuses as a server's own: `--insecure` takes it), a test CA with a leaf for
localhost and 127.0.0.1 that it signed (what `--ca` trusts), and a leaf of that
CA for another name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_port, tcp_connectable, throng_bin
from support.bench import assert_clean, assert_no_panic, run_bench, short

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]

ECHO_SERVER = """
import asyncio, signal, ssl, sys
from websockets.asyncio.server import serve

async def echo(ws):
    try:
        async for message in ws:
            await ws.send(message)
    except Exception:
        pass

async def main(port, cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    async with serve(echo, "127.0.0.1", port, ssl=ctx, compression=None, max_size=16 * 1024 * 1024):
        print("listening", flush=True)
        await stop

asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
"""

# TLS in front of a plain server: every connection is piped to 127.0.0.1:UPSTREAM.
TERMINATOR = """
import asyncio, signal, ssl, sys

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except Exception:
        pass
    finally:
        writer.close()

async def handle(reader, writer, upstream):
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

async def main(port, upstream, cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    server = await asyncio.start_server(lambda r, w: handle(r, w, upstream), "127.0.0.1", port, ssl=ctx)
    async with server:
        print("listening", flush=True)
        await stop

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]))
"""


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    san = "subjectAltName=DNS:localhost,IP:127.0.0.1"
    # Self-signed, as the brief's one-liner makes it (basicConstraints CA:TRUE).
    openssl("req", "-x509", *EC, "-subj", "/CN=localhost", "-addext", san,
            "-keyout", "self.key", "-out", "self.pem", cwd=d)
    openssl("req", "-x509", *EC, "-subj", "/CN=throng bench test CA", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    for name, alt in [("leaf", "DNS:localhost,IP:127.0.0.1"), ("other", "DNS:other.invalid")]:
        openssl("req", "-new", *EC[:4], "-nodes", "-subj", "/CN=" + alt.split(",")[0][4:],
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(
            f"subjectAltName={alt}\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n"
        )
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)
    (d / "echo_server.py").write_text(ECHO_SERVER)
    (d / "terminator.py").write_text(TERMINATOR)
    return d


class Proc:
    """A helper server in a subprocess, listening on `port`, stopped by pid."""

    def __init__(self, args: list[str], port: int):
        self.port = port
        env = {k: v for k, v in os.environ.items() if not k.startswith("THRONG_")}
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env
        )
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while not tcp_connectable(port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                err = self.proc.stderr.read().decode("utf-8", "replace") if self.proc.stderr else ""
                raise RuntimeError(f"{args} did not listen on {port}: {err}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture
def helpers():
    started: list[Proc] = []

    def start(args: list[str], port: int) -> Proc:
        p = Proc(args, port)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture
def echo_tls(certs, helpers):
    """echo_tls(name) -> port of a `websockets` echo server with certificate NAME."""

    def start(name: str) -> int:
        port = free_port()
        helpers([sys.executable, str(certs / "echo_server.py"), str(port),
                 str(certs / f"{name}.pem"), str(certs / f"{name}.key")], port)
        return port

    return start


def assert_echoed(run, conns: int) -> dict:
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["url"].startswith("wss://"), ctx
    assert_clean(r, conns, ctx)
    assert r["messages_sent"] > 0, ctx
    assert r["messages_total"] == r["messages_sent"], ctx
    assert r["lost_messages"] == 0 and r["errors"] == 0, ctx
    return r


# -- against the websockets library's TLS echo server ---------------------------


def test_insecure_echoes_over_a_self_signed_certificate(echo_tls):
    port = echo_tls("self")
    run = run_bench("echo", "--url", f"wss://127.0.0.1:{port}/", "--insecure", "--conns", 4, *short())
    assert_echoed(run, 4)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_ca_file_trusts_the_servers_ca_by_ip_and_by_name(echo_tls, certs, host):
    port = echo_tls("leaf")
    run = run_bench("echo", "--url", f"wss://{host}:{port}/", "--ca", certs / "ca.pem", "--conns", 4, *short())
    assert_echoed(run, 4)


@pytest.mark.parametrize(
    "cert,flags,says",
    [
        ("self", [], "invalid peer certificate"),
        ("leaf", [], "UnknownIssuer"),
        ("other", ["--ca", "ca.pem"], "invalid peer certificate"),
    ],
    ids=["self-signed-untrusted", "unknown-ca", "wrong-name"],
)
def test_an_untrusted_certificate_fails_every_connection_with_its_reason(echo_tls, certs, cert, flags, says):
    port = echo_tls(cert)
    flags = [str(certs / f) if f.endswith(".pem") else f for f in flags]
    t0 = time.monotonic()
    run = run_bench("echo", "--url", f"wss://127.0.0.1:{port}/", *flags, "--conns", 3, *short())
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 1, ctx
    r = run.report()
    assert r["attempted"] == 3 and r["opened"] == 0 and r["failed"] == 3, ctx
    (reason, n), = r["failures"].items()
    assert n == 3 and reason.startswith("tls: ") and says in reason, ctx
    assert "--ca" in reason, f"the reason says what to do\n{ctx}"
    # Refused at the handshake, not left to time out.
    assert time.monotonic() - t0 < 8, ctx


def test_bad_tls_flags_are_refused_before_anything_runs(certs):
    for args, mentions in [
        (["--url", "wss://127.0.0.1:1/", "--ca", str(certs / "missing.pem")], "--ca"),
        (["--url", "wss://127.0.0.1:1/", "--ca", str(certs / "ca.key")], "CERTIFICATE"),
        (["--url", "ws://127.0.0.1:1/", "--insecure"], "--insecure"),
        (["--url", "wss://127.0.0.1:1/", "--insecure", "--ca", str(certs / "ca.pem")], "--ca"),
        (["--url", "https://127.0.0.1:1/"], "https://"),
    ]:
        run = run_bench("echo", *args, "--duration", "1h", "--json", timeout=30)
        ctx = run.describe()
        assert_no_panic(run)
        assert run.returncode not in (0, 101), ctx
        assert mentions in run.stderr, ctx
        assert run.stdout.strip() == "", ctx


# -- against throng, through a TLS terminator -------------------------------------


@pytest.fixture
def throng_tls(start_server, helpers, certs):
    """A plain throng server behind a TLS terminator (leaf certificate); the
    terminator's port."""
    srv = start_server()
    port = free_port()
    helpers([sys.executable, str(certs / "terminator.py"), str(port), str(srv.port),
             str(certs / "leaf.pem"), str(certs / "leaf.key")], port)
    return port


@pytest.mark.parametrize("transport", ["ws", "sse", "poll"])
def test_push_over_tls_with_an_https_publisher_loses_nothing(throng_tls, certs, transport):
    scheme = "wss" if transport == "ws" else "https"
    conns, channels = 6, 2
    run = run_bench(
        "push", "--transport", transport, "--url", f"{scheme}://localhost:{throng_tls}/",
        "--ca", certs / "ca.pem", "--conns", conns, "--channels", channels, "--publish-rate", 40,
        "--reconnect", "0.5", "--reconnect-interval", "400ms", "--grace", "1s", *short(duration="2s"),
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["url"].startswith(f"{scheme}://"), ctx
    assert r["attempted"] == conns and r["opened"] == conns and r["failures"] == {}, ctx
    p = r["push"]
    # Published through https://localhost:PORT (the default: --url's scheme and host).
    assert p["published"] > 0 and p["publish_errors"] == 0, ctx
    assert p["delivered"] == p["expected_deliveries"] > 0, ctx
    assert p["lost"] == 0 and p["duplicated"] == 0, ctx
    # Reconnecting subscribers came back over new TLS connections.
    assert p["reconnects"] > 0, ctx


def test_handshakes_counts_full_and_resumed(throng_tls, certs):
    conns = 12
    run = run_bench(
        "handshakes", "--url", f"https://127.0.0.1:{throng_tls}/healthz", "--ca", certs / "ca.pem",
        "--conns", conns, "--threads", 1, "--duration", "20s", "--json",
    )
    ctx = run.describe()
    assert_no_panic(run)
    assert run.returncode == 0, ctx
    r = run.report()
    assert r["mode"] == "handshakes" and r["errors"] == 0, ctx
    off, on = r["passes"]
    assert (off["resumption"], on["resumption"]) == (False, True), ctx
    for p in (off, on):
        assert p["handshakes"] == p["answered"] == conns and p["failed"] == 0, ctx
        assert p["statuses"] == {"200": conns}, ctx
        assert p["handshakes_per_sec"] > 0 and p["handshake_time"]["samples"] == conns, ctx
    assert off["resumed"] == 0 and off["full"] == conns, ctx
    # One thread: the first connection is full, every later one resumes.
    assert on["resumed"] == conns - 1, ctx
    # --no-resume: the first pass only.
    run = run_bench(
        "handshakes", "--url", f"https://127.0.0.1:{throng_tls}/healthz", "--ca", certs / "ca.pem",
        "--conns", 3, "--no-resume", "--json",
    )
    assert run.returncode == 0, run.describe()
    assert [p["resumption"] for p in run.report()["passes"]] == [False], run.describe()


# -- against throng's own TLS, once it has it ----------------------------------------


def serve_has_tls() -> bool:
    try:
        out = subprocess.run([str(throng_bin()), "serve", "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"--tls-cert" in out.stdout


@pytest.mark.skipif(not serve_has_tls(), reason="throng serve has no --tls-cert yet")
def test_echo_and_handshakes_against_throngs_own_tls(start_server, certs):
    srv = start_server("--tls-cert", certs / "leaf.pem", "--tls-key", certs / "leaf.key")
    run = run_bench("echo", "--url", f"wss://localhost:{srv.port}/echo", "--ca", certs / "ca.pem",
                    "--conns", 4, *short())
    assert_echoed(run, 4)
    run = run_bench("handshakes", "--url", f"https://127.0.0.1:{srv.port}/healthz", "--ca", certs / "ca.pem",
                    "--conns", 6, "--threads", 1, "--json")
    ctx = run.describe()
    assert run.returncode == 0, ctx
    off, on = run.report()["passes"]
    assert off["handshakes"] == on["handshakes"] == 6 and off["resumed"] == 0, ctx
    assert on["resumed"] > 0, ctx
