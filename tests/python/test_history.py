"""Channel history as the API shows it: --history-size and --history-ttl bound what a
channel keeps, 0 turns it off, and the epoch stays while the channel lives."""

from __future__ import annotations

import subprocess
import time

from conftest import throng_bin
from rawws import channel_info, publish_ok, without_epoch


def test_history_keeps_the_last_history_size_messages(start_server):
    srv = start_server("--history-size", "3")
    for i in range(5):
        publish_ok(srv.port, "kept", f"m{i}")
    info = channel_info(srv.port, "kept")
    assert without_epoch(info) == {"channel": "kept", "subscribers": 0, "last_seq": 5, "history_len": 3}, info


def test_default_history_is_100_messages(start_server):
    srv = start_server()
    for i in range(120):
        publish_ok(srv.port, "hundred", f"m{i}")
    info = channel_info(srv.port, "hundred")
    assert (info["last_seq"], info["history_len"]) == (120, 100), info


def test_history_expires_after_its_ttl_and_the_epoch_stays(start_server):
    # Ages are whole seconds, so a message lives between ttl - 1 and ttl seconds:
    # with 2 s the four are surely all there a moment after they were published.
    srv = start_server("--history-ttl", "2s")
    for i in range(4):
        publish_ok(srv.port, "brief", f"m{i}")
    before = channel_info(srv.port, "brief")
    assert before["history_len"] == 4, before
    deadline = time.monotonic() + 8
    while True:
        after = channel_info(srv.port, "brief")
        if after["history_len"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert after == {**before, "history_len": 0}, (before, after)


def test_history_size_0_keeps_nothing(start_server):
    srv = start_server("--history-size", "0")
    for i in range(3):
        publish_ok(srv.port, "none", f"m{i}")
    info = channel_info(srv.port, "none")
    assert (info["last_seq"], info["history_len"]) == (3, 0), info


def test_a_restarted_server_starts_every_channel_in_a_new_epoch(start_server):
    first = start_server()
    publish_ok(first.port, "restart", "a")
    epoch = channel_info(first.port, "restart")["epoch"]
    first.stop()
    second = start_server()
    publish_ok(second.port, "restart", "b")
    info = channel_info(second.port, "restart")
    assert info["last_seq"] == 1 and info["epoch"] != epoch, (epoch, info)


def test_a_history_ttl_below_whole_seconds_is_refused_at_start():
    proc = subprocess.run(
        [str(throng_bin()), "serve", "--listen", "127.0.0.1:0", "--history-ttl", "500ms"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert proc.returncode != 0
    assert "--history-ttl must be whole seconds" in proc.stderr, proc.stderr
