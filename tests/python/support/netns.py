"""A network namespace joined to this host by a veth pair: another machine on a
/30 link, for tests that need a peer outside loopback (a remote client, a Redis
whose link is cut one way). `join` makes it, `remove` takes it away again (and
never fails: it runs in `finally` blocks)."""

from __future__ import annotations

import subprocess


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=10)


def join(ns: str, host_if: str, ns_if: str, host_ip: str, ns_ip: str) -> None:
    """Namespace `ns`, its end `ns_if` at `ns_ip`/30, this host's `host_if` at
    `host_ip`/30, both up, and the namespace's loopback up."""
    sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    sh("ip", "link", "set", ns_if, "netns", ns)
    sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
    sh("ip", "link", "set", host_if, "up")
    sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
    sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
    sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")


def remove(ns: str, host_if: str) -> None:
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=10)
