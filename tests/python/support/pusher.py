"""The Pusher side of the tests: the app every test configures (`APP`, `APP_ID`,
`KEY`, `SECRET`), pusher-js (or Laravel Echo) in a Node process (`PusherJs`),
the official Python SDK (`sdk`), requests signed as Pusher's HTTP API wants
(`signed`, `post_signed`), a presence user (`user`) and `eventually`."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pusher

from procs import stop_process
from rawws import http_request, settled


NODE_DIR = Path(__file__).resolve().parents[2] / "node"

APP_ID, KEY, SECRET = "4242", "app-key", "app-secret"
APP = f"{APP_ID}:{KEY}:{SECRET}"


class PusherJs:
    """pusher-js (or Laravel Echo on it: script="echo_client.mjs") in a Node
    process, commanded over stdin, reporting over stdout."""

    def __init__(self, port: int, bad_auth: bool = False, key: str = KEY, user: dict | None = None,
                 script: str = "pusher_client.mjs", signin_as: dict | None = None,
                 tls: bool = False, env: dict | None = None) -> None:
        assert shutil.which("node"), "node is not installed (scripts/test.sh installs it)"
        assert (NODE_DIR / "node_modules" / "pusher-js").is_dir(), "run npm ci in tests/node"
        opts = {"host": "127.0.0.1", "port": port, "key": key, "appId": APP_ID, "secret": SECRET,
                "badAuth": bad_auth, "user": user, "signinAs": signin_as, "tls": tls}
        self.proc = subprocess.Popen(
            ["node", str(NODE_DIR / script), json.dumps(opts)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=NODE_DIR,
            env={**os.environ, **(env or {})},
        )
        self.seen: queue.Queue = queue.Queue()
        self.log: list[dict] = []
        self.unclaimed: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.seen.put(json.loads(line))
            except json.JSONDecodeError:
                self.seen.put({"type": "unreadable", "line": line})

    def send(self, **cmd) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def expect(self, want, timeout: float = 10.0) -> dict:
        """The oldest report not yet returned for which want(report) holds.

        Reports passed over while waiting stay unclaimed for a later expect: the
        two sides of one step may report in either order (an event published
        through the HTTP API can reach the socket before the trigger's response
        is reported), so waiting for one must not lose the other. Every report
        is also kept in log."""
        for i, report in enumerate(self.unclaimed):
            if want(report):
                return self.unclaimed.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"pusher-js did not report what was expected in {timeout}s; saw {self.log}")
            try:
                report = self.seen.get(timeout=left)
            except queue.Empty:
                continue
            self.log.append(report)
            if want(report):
                return report
            self.unclaimed.append(report)

    def connected(self) -> str:
        report = self.expect(lambda r: r["type"] == "state" and r["current"] == "connected")
        return report["socket_id"]

    def subscribe(self, channel: str) -> dict:
        self.send(op="subscribe", channel=channel)
        return self.expect(lambda r: r.get("channel") == channel and r["type"] in ("subscribed", "subscription_error"))

    def event(self, channel: str, event: str, timeout: float = 10.0) -> dict:
        return self.expect(lambda r: r["type"] == "event" and r["channel"] == channel and r["event"] == event, timeout)

    def got(self, event: str) -> list[dict]:
        """Every delivery of `event` seen so far."""
        return [r for r in self.log if r["type"] == "event" and r["event"] == event]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(op="disconnect")
                self.proc.wait(timeout=5)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        stop_process(self.proc)


def eventually(fetch, ok, timeout: float = 5.0):
    """Asserts that ok(fetch()) comes to hold within `timeout`."""
    value = settled(fetch, ok, timeout=timeout)
    assert ok(value), value
    return value


def sdk(port: int, secret: str = SECRET, app_id: str = APP_ID) -> pusher.Pusher:
    return pusher.Pusher(app_id=app_id, key=KEY, secret=secret, host="127.0.0.1", port=port, ssl=False)


def signed(method: str, path: str, body: bytes = b"", timestamp: int | None = None,
           secret: str = SECRET, extra: dict | None = None) -> str:
    """path?query signed as Pusher's HTTP API reference says, written here."""
    params = {"auth_key": KEY, "auth_timestamp": str(timestamp or int(time.time())), "auth_version": "1.0"}
    if body:
        params["body_md5"] = hashlib.md5(body).hexdigest()
    params.update(extra or {})
    query = "&".join(f"{k}={params[k]}" for k in sorted(params))
    signature = hmac.new(secret.encode(), f"{method}\n{path}\n{query}".encode(), hashlib.sha256).hexdigest()
    return f"{path}?{query}&auth_signature={signature}"


def post_signed(port: int, path: str, body: bytes, **kw):
    return http_request(port, "POST", signed("POST", path, body, **kw), body,
                        [("Content-Type", "application/json")])


def user(user_id: str) -> dict:
    return {"user_id": user_id, "user_info": {"name": user_id.title()}}


