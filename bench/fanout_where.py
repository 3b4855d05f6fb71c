#!/usr/bin/env python3
"""Where a fan-out's latency goes, from bench/fanout.sh raw results (derived,
the raw files are only read): for each server of each run, the CPU the server,
the client and the kernel's interrupt work took during the window, how busy the
whole machine was, and the latency quantiles the client saw. On a 2-core box
where the client shares the cores, a burst's p99 is the time the machine needs
to carry all of it (server, kernel and client), not the server's alone.

Usage: bench/fanout_where.py RUN.json... --out NEW.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derived import runs_and_out  # noqa: E402


def rows(path: Path):
    run = json.loads(path.read_text())
    for server in run["servers"]:
        for scenario, r in server.items():
            if not isinstance(r, dict) or "latency_us" not in r:
                continue
            window = r.get("window_seconds") or 0
            if not window:
                continue
            yield {
                "run": path.stem,
                "server": server["name"],
                "scenario": scenario,
                "rate": r.get("deliveries_per_sec", 0),
                "server_cores": r.get("server_cpu_cores", 0),
                "client_cores": r.get("client_cpu_cores", 0),
                "irq_cores": r.get("machine_irq_softirq_seconds", 0) / window,
                "busy_cores": r.get("machine_busy_cpu_seconds", 0) / window,
                "server_us": r.get("server_cpu_us_per_delivery", 0),
                "client_us": r.get("client_cpu_us_per_delivery", 0),
                "p50_ms": r["latency_us"]["p50"] / 1000,
                "p99_ms": r["latency_us"]["p99"] / 1000,
            }


def main() -> None:
    runs, out, how = runs_and_out(__doc__, "fanout_where.py")
    lines = [
        "# Where the fan-out's latency goes (derived from bench/fanout.sh raw results)",
        "",
        how,
        "Cores = CPU seconds in the measured window ÷ its length. irq = the machine's",
        "interrupt and softirq time (the loopback's receive side runs there). busy = every",
        "core's non-idle time: 2.0 is this whole 2-core machine.",
        "",
        "| run | server | deliveries/s | server cores | client cores | irq cores | busy cores | server µs/delivery | client µs/delivery | p50 ms | p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path in runs:
        for r in rows(path):
            lines.append(
                f"| {r['run']} | {r['server']} | {r['rate']:,.0f} | {r['server_cores']:.2f} | "
                f"{r['client_cores']:.2f} | {r['irq_cores']:.2f} | {r['busy_cores']:.2f} | "
                f"{r['server_us']:.2f} | {r['client_us']:.2f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
            )
    out.write_text("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()
