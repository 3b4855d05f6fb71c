"""The one poll-until helper (`wait_until`) and the waits built on it that
several modules share (`wait_healthy`: a node's /healthz). Nothing here starts
a process."""

from __future__ import annotations

import time

from rawws import http_request

POLL_INTERVAL = 0.05


def wait_until(predicate, timeout: float = 5.0, what="condition", *, fail: bool = True,
               ignore: tuple[type[BaseException], ...] = (), interval: float = POLL_INTERVAL):
    """Calls predicate() every `interval` until it returns something truthy, and
    returns that. After `timeout` seconds it fails with `what` (a string, or a
    callable giving one, so the message can show the state at that moment), or
    with fail=False returns the last value instead. Exceptions of the `ignore`
    types count as "not yet" (a server still starting)."""
    deadline = time.monotonic() + timeout
    last_error = None
    value = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except ignore as e:
            last_error = e
        if time.monotonic() > deadline:
            if not fail:
                return value
            message = what() if callable(what) else f"{what}: not within {timeout}s"
            if last_error is not None:
                message += f" (last error: {last_error})"
            raise AssertionError(message)
        time.sleep(interval)


def wait_healthy(port: int, healthy: bool = True, timeout: float = 10.0) -> None:
    """Until the node on `port` answers /healthz with 200 (or 503 with healthy=False)."""
    want = 200 if healthy else 503
    last = []

    def answers() -> bool:
        last[:] = [http_request(port, "GET", "/healthz").status]
        return last[0] == want

    wait_until(answers, timeout, lambda: f"/healthz on {port} is {last[0] if last else None}, not {want}, after {timeout}s")
