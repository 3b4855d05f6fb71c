#!/usr/bin/env python3
"""Rounds of bench/fanout.sh's scenario A side by side: per round, each server's
CPU per delivery, latency as the client read it and (runs with --rx-timestamps)
as the subscriber's kernel received it, the client's own CPU, and throng's
ratios to every other server, with their medians and ranges over the rounds.

Usage: bench/fanout_rounds.py bench/results/fanout-A.json ... --out NEW.md
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derived import runs_and_out  # noqa: E402


def ms(v):
    return "–" if v is None else f"{v / 1000:.1f}"


def num(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


def pick(a: dict) -> dict:
    lat, arr = a.get("latency_us") or {}, a.get("arrival_us") or {}
    return {"cpu": a.get("server_cpu_us_per_delivery"), "client_cpu": a.get("client_cpu_us_per_delivery"),
            "p50": lat.get("p50"), "p99": lat.get("p99"), "a50": arr.get("p50"), "a99": arr.get("p99"),
            "lost": a.get("lost"), "dup": a.get("duplicated"), "rate": a.get("deliveries_per_sec")}


def main() -> int:
    runs, out, how = runs_and_out(__doc__, "fanout_rounds.py")
    rows, ratios = [], {}
    for path in runs:
        doc = json.loads(path.read_text())
        servers = {s["name"]: pick(s["A"]) for s in doc.get("servers", []) if isinstance(s.get("A"), dict)
                   and not s["A"].get("error")}
        rows.append((path.stem, [s["name"] for s in doc.get("servers", [])], servers))
        t = servers.get("throng")
        for name, s in servers.items():
            if name == "throng" or t is None:
                continue
            # A client reading with recvmsg and its timestamps costs more: its
            # rounds are kept apart from the others'.
            stamped = "with --rx-timestamps" if t.get("a99") else "without"
            r = ratios.setdefault((name, stamped), {"cpu": [], "p99": [], "a50": [], "a99": []})
            for k in r:
                if t.get(k) and s.get(k):
                    r[k].append(t[k] / s[k])
    lines = ["# Fan-out rounds, scenario A (bench/fanout.sh)", "", how, "",
             "| run | order | server | deliveries/s | CPU µs/delivery | client CPU µs/delivery | p50 / p99 ms (client's read) "
             "| p50 / p99 ms (kernel's receive) | lost / dup |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for stem, order, servers in rows:
        for name, s in servers.items():
            lines.append(f"| {stem} | {','.join(order)} | {name} | {num(s['rate'], 0)} | {num(s['cpu'])} | "
                         f"{num(s['client_cpu'])} | {ms(s['p50'])} / {ms(s['p99'])} | {ms(s['a50'])} / {ms(s['a99'])} | "
                         f"{s['lost']} / {s['dup']} |")
    lines += ["", "| throng ÷ | client | rounds | CPU/delivery: median (range) | p99, client's read | arrival p50, kernel | "
              "arrival p99, kernel |", "|---|---|---:|---:|---:|---:|---:|"]

    def cell(v):
        return "–" if not v else f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f}, {len(v)})"

    for (name, stamped), r in ratios.items():
        lines.append(f"| {name} | {stamped} | {len(r['cpu'])} | {cell(r['cpu'])} | {cell(r['p99'])} | {cell(r['a50'])} | "
                     f"{cell(r['a99'])} |")
    lines.append("")
    out.write_text("\n".join(lines))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
