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
from million import duration_secs, reach_curve, slow_turns  # noqa: E402


def second_share(timeline: list[dict], n: int, every: float) -> float | None:
    """The share of the second broadcast's deliveries the bench had read in the
    first 10 s after it left (the bench's timeline ends with its load, often
    before that broadcast has reached all)."""
    seconds = [p for p in timeline if every < p["t_secs"] <= every + 10 and "received_per_sec" in p]
    if not seconds or n == 0:
        return None
    got, prev = 0.0, every
    for p in seconds:
        got += p["received_per_sec"] * (p["t_secs"] - prev)
        prev = p["t_secs"]
    return min(got / n, 1.0)


def row(path: Path) -> dict:
    doc = json.loads(path.read_text())
    s, push = doc["summary"], doc["bench"]["push"]
    turns = doc.get("slow_turns")
    if turns is None:
        turns = slow_turns(path.with_name(path.stem + "-serve.log"))
    longest = sorted(m for _, m in turns.values())
    every = duration_secs(doc["settings"]["broadcast_every"])
    curves = reach_curve(doc["bench"].get("timeline", []), s["connections_opened"], every, push["published"])
    box = s.get("box_cores_broadcast") or {}
    return {
        "run": path.stem,
        "commit": (doc.get("provenance", {}).get("commit") or "?")[:12],
        # The established-socket table the run's namespace had (recorded since
        # million.py's --socket-table; "-" for runs before it).
        "table": doc["settings"].get("tcp_ehash_entries"),
        "netns": doc["settings"].get("netns"),
        # The binary the run served with (--bin names one built elsewhere).
        "bin": Path(doc["settings"].get("bin") or "?").name,
        "first_reach": curves[0] if curves else [None] * 4,
        "box_idle_broadcast": box.get("idle"),
        "second_in_10s": second_share(doc["bench"].get("timeline", []), s["connections_opened"], every),
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
    lines = ["| run | commit | binary | socket table | open | failed | lost / dup | reach all, max (s) | delivery p50 (s) | publishes (failed) "
             "| slowest publish answer (ms) | turns ≥ 250 ms | longest turn (ms) | median worker's longest (ms) "
             "| first broadcast: 50% / 90% / 99% / all (s) | second: reached in 10 s | idle cores while the first went out |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        answer = "-" if r["answer_max_ms"] is None else f"{r['answer_max_ms']:,}"
        reach = " / ".join("-" if v is None else f"{v:.0f}" for v in r["first_reach"])
        idle = "-" if r["box_idle_broadcast"] is None else f"{r['box_idle_broadcast']:.2f}"
        second = "-" if r["second_in_10s"] is None else f"{r['second_in_10s']:.0%}"
        table = "-" if r["table"] is None else f"{r['table']:,}" + (" (own netns)" if r["netns"] else "")
        lines.append(f"| {r['run']} | {r['commit']} | {r['bin']} | {table} | {r['open']:,} | {r['failed']} | {r['lost']} / {r['dup']} "
                     f"| {r['reach_max_s']:.1f} | {r['p50_s']:.1f} | {r['publishes']} ({r['publish_failed']}) "
                     f"| {answer} | {r['slow_turns']:,} | {r['longest_turn_ms']:,} | {r['median_worker_longest_ms']:,} "
                     f"| {reach} | {second} | {idle} |")
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
