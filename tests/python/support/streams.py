"""Clients of throng's HTTP transports for the tests: `EventReader` (SSE) reads
events on a thread so a test can wait for them with a bound; `poll` is one
long-poll request."""

from __future__ import annotations

import threading

import httpx

from rawws import http_request


class EventReader:
    """Reads SSE events (dicts of field -> value, data lines joined with \\n) from an
    httpx streaming response, on a thread, so tests can wait for them with a bound."""

    def __init__(self, url: str, headers: dict | None = None):
        self.events: list[dict] = []
        self.comments = 0
        self.retry = None
        self.headers = None
        self.status = None
        self._cond = threading.Condition()
        self._client = httpx.Client(timeout=httpx.Timeout(10.0, read=None))
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, headers or {}), daemon=True)
        self._thread.start()
        assert self._ready.wait(5), "no response head within 5 s"

    def _run(self, url, headers):
        try:
            with self._client.stream("GET", url, headers=headers) as resp:
                self.status = resp.status_code
                self.headers = resp.headers
                self._ready.set()
                event: dict = {}
                for line in resp.iter_lines():
                    if line == "":
                        if event:
                            with self._cond:
                                self.events.append(event)
                                self._cond.notify_all()
                        event = {}
                    elif line.startswith(":"):
                        with self._cond:
                            self.comments += 1
                            self._cond.notify_all()
                    else:
                        field, _, value = line.partition(":")
                        value = value[1:] if value.startswith(" ") else value
                        if field == "retry":
                            self.retry = int(value)
                        elif field == "data" and "data" in event:
                            event["data"] += "\n" + value
                        else:
                            event[field] = value
        except (httpx.HTTPError, RuntimeError):
            pass
        finally:
            self._ready.set()

    def wait(self, n: int, timeout: float = 5.0) -> list[dict]:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.events) >= n, timeout)
        assert ok, f"expected {n} events within {timeout}s, got {self.events}"
        return self.events[:n]

    def wait_comments(self, n: int, timeout: float = 5.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.comments >= n, timeout), f"{self.comments} comments"

    def close(self):
        self._client.close()


def poll(port: int, channel: str, since: int, timeout: int = 5) -> dict:
    resp = http_request(port, "GET", f"/poll/{channel}?since={since}&timeout={timeout}", timeout=timeout + 5)
    assert resp.status == 200, resp
    return resp.json()
