#!/usr/bin/env python3
"""Echo rounds side by side, from bench/engine.sh raw results (derived; the raw
files are only read): for each run, connection count and round, every server's
CPU µs per message and throng's ratio to each other server in that round (the
servers of a round run one after another, interleaved).

Usage: bench/engine_rounds.py RUN.json... --out NEW.md
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derived import runs_and_out  # noqa: E402


def main() -> None:
    runs, out, how = runs_and_out(__doc__, "engine_rounds.py")
    lines = [
        "# Echo CPU per message, round by round (derived from bench/engine.sh raw results)",
        "",
        how,
        "",
    ]
    ratios: dict[tuple[str, str], list[float]] = {}
    for path in runs:
        run = json.loads(path.read_text())
        servers = [s for s in run["servers"] if s.get("echo")]
        names = [s["name"] for s in servers]
        others = [n for n in names if n != "throng"]
        lines += [
            f"## {path.stem}",
            "",
            "| conns | round | " + " | ".join(f"{n} µs/msg" for n in names) + " | "
            + " | ".join(f"throng ÷ {n}" for n in others) + " |",
            "|---|---:|" + "---:|" * (len(names) + len(others)),
        ]
        for conns in sorted({c for s in servers for c in s["echo"]}, key=int):
            per = {s["name"]: [r.get("server_cpu_us_per_msg") for r in s["echo"][conns]["rounds"]]
                   for s in servers if conns in s["echo"]}
            for i in range(min(len(v) for v in per.values())):
                cpu = {n: per[n][i] for n in names}
                cells = [f"{cpu[n]:.2f}" if cpu[n] else "–" for n in names]
                for n in others:
                    if cpu["throng"] and cpu[n]:
                        r = cpu["throng"] / cpu[n]
                        ratios.setdefault((conns, n), []).append(r)
                        cells.append(f"{r:.2f}")
                    else:
                        cells.append("–")
                lines.append(f"| {conns} | {i + 1} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Every round of every run", "", "| conns | throng ÷ | rounds | median | min | max |",
              "|---|---|---:|---:|---:|---:|"]
    for (conns, other), rs in sorted(ratios.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
        lines.append(f"| {conns} | {other} | {len(rs)} | {statistics.median(rs):.2f} | {min(rs):.2f} | {max(rs):.2f} |")
    out.write_text("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()
