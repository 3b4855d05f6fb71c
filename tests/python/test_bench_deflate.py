"""bench/deflate.py (issue 28's benchmark) in a tiny configuration, against throng
only: plain and --permessage-deflate, real servers started and stopped by the
script, its real Go clients (fanload, wsload). What a recorded run relies on:

- the deflate row negotiated the extension on every connection (the exact answer
  is recorded), the plain row was not offered it;
- every message reached every subscriber, whole (each one inflated and compared
  with what was published);
- the plain row's wire bytes are exactly the payloads plus their 4-byte frame
  headers (the byte count is the client's, at the socket), and the deflate row's
  are well below them (the payloads are JSON that deflates to ~0.4);
- the raw JSON and the Markdown table are written, with the ratios.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import throng_bin

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/deflate.py"
SUBS, MESSAGES = 20, 10


def serve_has_deflate() -> bool:
    try:
        out = subprocess.run([str(throng_bin()), "serve", "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"--permessage-deflate" in out.stdout


@pytest.mark.skipif(not serve_has_deflate(), reason="throng serve has no --permessage-deflate yet")
def test_a_tiny_deflate_bench_against_throng(tmp_path):
    env = {**os.environ, "THRONG_BIN": str(throng_bin())}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--servers", "throng,throng-deflate", "--subscribers", str(SUBS),
         "--messages", str(MESSAGES), "--publish-rate", "20", "--rounds", "1", "--idle-conns", str(SUBS), "--idle-hold", "3",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=180, env=env, cwd=ROOT,
    )
    ctx = f"exit {run.returncode}\nstdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, ctx
    path = Path(run.stdout.strip().splitlines()[-1])
    assert path.parent == tmp_path and path.name.startswith("deflate-") and path.suffix == ".json", ctx
    doc = json.loads(path.read_text())
    md = path.with_suffix(".md").read_text()
    ctx += "\n" + json.dumps({n: r.get("summary") for n, r in doc["servers"].items()})[:4000]

    assert doc["skipped"] == {}, ctx
    assert list(doc["servers"]) == ["throng", "throng-deflate"], ctx
    assert doc["provenance"]["commit"] and doc["versions"]["throng"]["sha256"], ctx
    assert doc["payloads"]["count"] == MESSAGES and 1000 <= doc["payloads"]["bytes_min"], ctx
    assert doc["payloads"]["bytes_max"] <= 2000, ctx

    plain, comp = doc["servers"]["throng"]["summary"], doc["servers"]["throng-deflate"]["summary"]
    for s in (plain, comp):
        assert s["problems"] == [] and s["comparable"], ctx
        assert s["opened"] == SUBS, ctx
        assert s["deliveries"] == s["expected"] == SUBS * MESSAGES and s["lost"] == 0, ctx
        assert s["verified"] == SUBS * MESSAGES and s["payload_mismatch"] == 0 and s["malformed"] == 0, ctx
        assert s["server_cpu_us_per_delivery"] >= 0, ctx  # 0: less than a clock tick in so short a run

    # Offered only on the deflate row; accepted there on every connection, with
    # both no_context_takeover parameters (else gorilla would have refused the dial).
    assert plain["negotiated"] is None and plain["extensions"] is None, ctx
    assert comp["negotiated"] == SUBS, ctx
    (answer, n), = comp["extensions"].items()
    assert n == SUBS and answer.startswith("permessage-deflate"), ctx
    assert "server_no_context_takeover" in answer and "client_no_context_takeover" in answer, ctx
    assert f"`{answer}`" in md, ctx

    # Plain: each delivery is its payload plus a 4-byte header (126..65535 bytes,
    # server frames unmasked), nothing else on the wire (no pings).
    assert abs(plain["wire_bytes_per_delivery"] - (plain["payload_bytes_mean"] + 4)) < 0.11, ctx
    assert comp["payload_bytes_mean"] == plain["payload_bytes_mean"], ctx  # same seeded sequence
    ratio = comp["wire_bytes_per_delivery"] / plain["wire_bytes_per_delivery"]
    assert 0.2 < ratio < 0.5, ctx
    assert doc["ratios"]["throng-deflate/throng bytes per delivery"]["value"] == pytest.approx(ratio, abs=0.002), ctx
    cpu = doc["ratios"]["throng-deflate/throng CPU per delivery"]
    assert "met" not in cpu, ctx  # a few clock ticks of CPU: no value, or too short a run to judge

    # Idle connections held, deflate negotiated on each of the deflate row's.
    idle_plain, idle_comp = doc["servers"]["throng"]["idle"], doc["servers"]["throng-deflate"]["idle"]
    assert idle_plain["opened"] == idle_comp["opened"] == SUBS and idle_plain["deflate"] is None, ctx
    assert idle_comp["deflate"]["negotiated"] == SUBS, ctx
    assert idle_comp["rss_after_kb"] > 0 and idle_comp["rss_bytes_per_conn"] is not None, ctx

    assert "| throng-deflate | yes | 200 / 200 |" in md, ctx
