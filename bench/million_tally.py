#!/usr/bin/env python3
"""Every million run kept in bench/results, in one derived table: which held all
its connections and delivered every broadcast exactly once, and which had a
problem, and what. The raw files are read, never written; the tally goes to
bench/results/million-tally-STAMP.json (+ .md), with its provenance.

A run "had a problem" when any of these holds: connections failed or were dropped,
fewer opened than asked, a delivery was lost or duplicated, or a broadcast took
more than --slow-broadcast seconds to reach everyone. Requests answered late (the
"late answers" of docs/SCALE.md) show only in server logs, which are not kept: they
are not counted here.

Usage: python3 bench/million_tally.py [--slow-broadcast 30]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

RESULTS = provenance.RESULTS_DIR


def runs() -> list[Path]:
    return sorted(
        p for p in RESULTS.glob("million-2*.json")
        if not p.name.endswith(".derived.json")
    )


def problems(doc: dict, slow_ms: float) -> list[str]:
    s = doc.get("summary", {})
    asked = doc.get("settings", {}).get("conns")
    found = []
    if s.get("failed"):
        found.append(f"{s['failed']} connections failed")
    if s.get("dropped"):
        found.append(f"{s['dropped']} dropped")
    if asked and s.get("connections_opened", 0) < asked:
        found.append(f"{s.get('connections_opened', 0)} of {asked} opened")
    if s.get("lost"):
        found.append(f"{s['lost']} deliveries lost")
    if s.get("duplicated"):
        found.append(f"{s['duplicated']} duplicated")
    if (s.get("broadcast_to_all_max_ms") or 0) > slow_ms:
        found.append(f"a broadcast took {s['broadcast_to_all_max_ms'] / 1000:.1f} s")
    if not s:
        found.append("no summary (the run did not finish)")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slow-broadcast", type=float, default=30.0, help="seconds (default 30)")
    args = ap.parse_args()
    rows = []
    for path in runs():
        doc = json.loads(path.read_text())
        s = doc.get("summary", {})
        rows.append({
            "file": path.name,
            "connections": s.get("connections_opened"),
            "bytes_per_conn": round(s["server_userspace_bytes_per_conn"], 1)
            if s.get("server_userspace_bytes_per_conn") is not None else None,
            "broadcast_to_all_max_s": round(s["broadcast_to_all_max_ms"] / 1000, 1)
            if s.get("broadcast_to_all_max_ms") is not None else None,
            "problems": problems(doc, args.slow_broadcast * 1000),
        })
    bad = [r for r in rows if r["problems"]]
    doc = {
        "provenance": provenance.provenance(),
        "derived_from": [r["file"] for r in rows],
        "method": __doc__.split("Usage:")[0].strip(),
        "slow_broadcast_secs": args.slow_broadcast,
        "runs": len(rows),
        "with_a_problem": len(bad),
        "rows": rows,
    }
    lines = [f"# Million runs: {len(bad)} of {len(rows)} had a problem", "",
             "| run | connections | B/conn | slowest broadcast s | problems |", "|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['file']} | {r['connections']} | {r['bytes_per_conn']} | "
                     f"{r['broadcast_to_all_max_s']} | {'; '.join(r['problems']) or '-'} |")
    path = provenance.write_raw(provenance.raw_path("million-tally"), doc, "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
