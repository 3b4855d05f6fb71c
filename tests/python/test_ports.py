"""--listen: port ranges and repeated listeners."""

from __future__ import annotations

import re
import time

from conftest import free_port, free_port_range
from rawws import http_exchange
from wsutil import run, ws_connect


def test_port_range_echo_on_every_port(start_server):
    first = free_port_range(5)
    ports = list(range(first, first + 5))
    srv = start_server("--listen", f"127.0.0.1:{first}-{first + 4}", ports=ports)

    async def main():
        for p in ports:
            async with ws_connect(srv.url(port=p)) as ws:
                await ws.send(f"port {p}")
                assert await ws.recv() == f"port {p}"
                await ws.send(f"bin {p}".encode())
                assert await ws.recv() == f"bin {p}".encode()

    run(main())
    for p in ports:
        resp = http_exchange(p, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert resp.status == 200, (p, resp)


def test_port_range_is_logged_as_one_range_line(start_server):
    # 500 ports would be 500 log lines: a range is logged once, with its size.
    first = free_port_range(5)
    ports = list(range(first, first + 5))
    srv = start_server("--listen", f"127.0.0.1:{first}-{first + 4}", ports=ports)
    expected = rf"listening on 127\.0\.0\.1:{first}-{first + 4} \(5 listeners\)"
    deadline = time.monotonic() + 3
    while not re.search(expected, srv.stderr()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert re.search(expected, srv.stderr()), srv.stderr()


def test_listen_flag_is_repeatable(start_server):
    a, b = free_port(), free_port()
    while b == a:
        b = free_port()
    srv = start_server("--listen", f"127.0.0.1:{a}", "--listen", f"127.0.0.1:{b}", ports=[a, b])

    async def main():
        for p in (a, b):
            async with ws_connect(srv.url(port=p)) as ws:
                await ws.send(str(p))
                assert await ws.recv() == str(p)

    run(main())


def test_clients_on_different_ports_are_independent(start_server):
    first = free_port_range(3)
    ports = list(range(first, first + 3))
    srv = start_server("--listen", f"127.0.0.1:{first}-{first + 2}", ports=ports)

    async def main():
        conns = [await ws_connect(srv.url(port=p)) for p in ports]
        try:
            for i, ws in enumerate(conns):
                await ws.send(f"x{i}")
            for i, ws in enumerate(conns):
                assert await ws.recv() == f"x{i}"
        finally:
            for ws in conns:
                await ws.close()

    run(main())


def test_port_0_is_picked_by_the_kernel_and_reported_on_one_stdout_line(start_server):
    """`--listen 127.0.0.1:0` (what start_server gives a test that names no port):
    each listener gets a free port of its own, and one line on stdout says which."""
    srv = start_server("--listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--threads", "2")
    lines = [line for line in srv.stdout().splitlines() if line.startswith("listening on ")]
    assert len(lines) == 1, srv.stdout()
    addrs = lines[0].removeprefix("listening on ").split()
    ports = [int(a.rsplit(":", 1)[1]) for a in addrs]
    assert all(a.startswith("127.0.0.1:") for a in addrs), addrs
    assert len(ports) == 2 and 0 not in ports and ports[0] != ports[1], addrs
    assert srv.ports == ports

    async def main():
        for p in ports:
            async with ws_connect(srv.url(port=p)) as ws:
                await ws.send(f"port {p}")
                assert await ws.recv() == f"port {p}"

    run(main())
    for p in ports:
        resp = http_exchange(p, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert resp.status == 200, (p, resp)


def test_a_server_given_no_listen_by_the_tests_is_on_port_0(start_server):
    srv = start_server()
    assert srv.args[srv.args.index("--listen") + 1] == "127.0.0.1:0"
    assert f"listening on 127.0.0.1:{srv.port}\n" in srv.stdout(), srv.stdout()
