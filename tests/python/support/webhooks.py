"""A Pusher webhook endpoint (`Receiver`) whose every request is checked by both
official SDKs (`checked`), `named`, a matcher for its events, and the
presence/occupancy check two nodes must pass on any Redis broker
(`presence_and_occupancy_across`)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.pusher import APP_ID, KEY, NODE_DIR, SECRET, sdk, user


class Receiver:
    """An app's webhook endpoint: keeps every request; answers 500 to the first
    `fail_first` ones, 200 after."""

    def __init__(self, fail_first: int = 0) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.fail_left = fail_first
        self.answered: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = 200
                if receiver.fail_left > 0:
                    receiver.fail_left -= 1
                    status = 500
                receiver.answered.append(status)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                if status == 200:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.requests.put((self.path, headers, body))

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/pusher/webhooks"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.events: list[dict] = []

    def event(self, want, timeout: float = 10.0) -> dict:
        """The first event (of any request so far or to come) for which want holds."""
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if want(e):
                    return e
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no such webhook event in {timeout}s; got {self.events}")
            try:
                path, headers, body = self.requests.get(timeout=left)
            except queue.Empty:
                continue
            self.events.extend(checked(headers, body, path))

    def drain(self, quiet: float = 1.5) -> list[dict]:
        """Every event, once nothing more has come for `quiet` seconds."""
        while True:
            try:
                path, headers, body = self.requests.get(timeout=quiet)
            except queue.Empty:
                return self.events
            self.events.extend(checked(headers, body, path))

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def checked(headers: dict, body: bytes, path: str) -> list[dict]:
    """The events of one request, after the official SDKs found it valid."""
    assert path == "/pusher/webhooks"
    assert headers["content-type"] == "application/json"
    assert headers["x-pusher-key"] == KEY
    data = sdk(1).validate_webhook(headers["x-pusher-key"], headers["x-pusher-signature"], body.decode())
    assert data is not None, f"the Python SDK refused {headers} {body!r}"
    assert abs(data["time_ms"] - time.time() * 1000) < 60_000
    node = subprocess.run(
        ["node", str(NODE_DIR / "verify_webhook.mjs"), json.dumps({"appId": APP_ID, "key": KEY, "secret": SECRET})],
        input=json.dumps({"headers": headers, "body": body.decode()}) + "\n",
        capture_output=True, text=True, cwd=NODE_DIR, timeout=30,
    )
    verdict = json.loads(node.stdout)
    assert verdict["valid"], f"the Node SDK refused {headers} {body!r}: {node.stderr}"
    assert verdict["events"] == data["events"]
    return data["events"]


def named(name: str, **fields):
    return lambda e: e["name"] == name and all(e.get(k) == v for k, v in fields.items())


def presence_and_occupancy_across(a, b, receiver, clients) -> None:
    """Ann on node a and Ben on node b in one presence channel: each sees the
    other come and go, the users list spans both, and the occupancy webhooks are
    said once for the cluster."""
    ann = clients(a.port, user=user("ann"))
    ann.connected()
    assert ann.subscribe("presence-room")["members"] == {"ann": {"name": "Ann"}}
    receiver.event(named("channel_occupied", channel="presence-room"))
    ben = clients(b.port, user=user("ben"))
    ben.connected()
    assert set(ben.subscribe("presence-room")["members"]) == {"ann", "ben"}
    assert ann.expect(lambda r: r["type"] == "member_added")["id"] == "ben"
    assert sorted(u["id"] for u in sdk(b.port).users_info("presence-room")["users"]) == ["ann", "ben"]
    # b's keeper writes itself an occupant within a second; a's leaving then
    # empties nothing.
    time.sleep(2.5)
    ann.close()
    assert ben.expect(lambda r: r["type"] == "member_removed")["id"] == "ann"
    time.sleep(2.5)
    ben.close()
    receiver.event(named("channel_vacated", channel="presence-room"))
    events = [e for e in receiver.drain() if e["channel"] == "presence-room"]
    names = [e["name"] for e in events]
    assert names.count("channel_occupied") == 1 and names.count("channel_vacated") == 1, events
    assert names.count("member_added") == 2 and names.count("member_removed") == 2, events
