#!/usr/bin/env python3
"""Sums up several bench/million.py runs side by side, from their own files (never
changed): for each run, when the broadcasts reached everyone, how long their
publishes waited for an answer, and the server's slow event-loop turns (from the
run's -serve.log when the run's JSON predates million.py counting them).

Usage: python3 bench/million_series.py RUN.json [RUN.json ...] [--out FILE.md]
Prints a Markdown table (and writes it to --out, a new file, if given).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from million import slow_turns  # noqa: E402


def row(path: Path) -> dict:
    doc = json.loads(path.read_text())
    s, push = doc["summary"], doc["bench"]["push"]
    turns = doc.get("slow_turns")
    if turns is None:
        turns = slow_turns(path.with_name(path.stem + "-serve.log"))
    longest = sorted(m for _, m in turns.values())
    return {
        "run": path.stem,
        "commit": doc.get("provenance", {}).get("commit", "?")[:12],
        "open": s["connections_opened"],
        "failed": s["failed"] + s["dropped"],
        "lost": s["lost"],
        "dup": s["duplicated"],
        "reach_max_s": s["broadcast_to_all_max_ms"] / 1000,
        "p50_s": s["delivery_p50_ms"] / 1000,
        "publishes": push["published"],
        "publish_failed": push["publish_errors"],
        "answer_max_ms": push.get("publish_answer_max_ms"),
        "slow_turns": sum(n for n, _ in turns.values()),
        "longest_turn_ms": longest[-1] if longest else 0,
        "median_worker_longest_ms": longest[len(longest) // 2] if longest else 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = [row(Path(p)) for p in args.runs]
    lines = ["| run | commit | open | failed | lost / dup | reach all, max (s) | delivery p50 (s) | publishes (failed) "
             "| slowest publish answer (ms) | turns ≥ 250 ms | longest turn (ms) | median worker's longest (ms) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        answer = "-" if r["answer_max_ms"] is None else f"{r['answer_max_ms']:,}"
        lines.append(f"| {r['run']} | {r['commit']} | {r['open']:,} | {r['failed']} | {r['lost']} / {r['dup']} "
                     f"| {r['reach_max_s']:.1f} | {r['p50_s']:.1f} | {r['publishes']} ({r['publish_failed']}) "
                     f"| {answer} | {r['slow_turns']:,} | {r['longest_turn_ms']:,} | {r['median_worker_longest_ms']:,} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        out = Path(args.out)
        if out.exists():
            print(f"{out} exists: a summary is written once, to a new file", file=sys.stderr)
            return 2
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
