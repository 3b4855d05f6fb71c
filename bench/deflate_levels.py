#!/usr/bin/env python3
"""What --deflate-level and --deflate-min-size trade, kept as a raw result: runs
`cargo bench --bench deflate -- MESSAGES` (benches/deflate.rs: realistic JSON of
several sizes compressed once at levels 1, 3, 6 and 9, then inflated) and writes
bench/results/deflate-levels-STAMP.json (with provenance) and .md (the table).

Usage: bench/deflate_levels.py [--messages 3000]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=3000, help="messages per size and level")
    args = ap.parse_args()
    prov = provenance.provenance()
    run = subprocess.run(["cargo", "bench", "--bench", "deflate", "--", str(args.messages)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        print(run.stderr[-2000:], file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if not rows:
        print("no rows in the bench's output", file=sys.stderr)
        return 1
    md = [provenance.md_header("permessage-deflate: size and CPU by level and message size", prov), "",
          "Each message compressed once (15-bit window, no context takeover), as throng does per",
          "message for all its subscribers; `sent` counts a message plain when compressing did",
          "not make it smaller.", "",
          "| message B | level | sent B | sent/plain | compress µs | inflate µs |",
          "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['plain_bytes']:.0f} | {r['level']} | {r['sent_bytes']:.0f} | {r['ratio']:.3f} "
                  f"| {r['compress_us']:.2f} | {r['inflate_us']:.2f} |")
    path = provenance.write_raw(provenance.raw_path("deflate-levels"),
                                {"provenance": prov, "messages": args.messages, "rows": rows},
                                "\n".join(md))
    print(path)
    print("\n".join(md[-len(rows) - 2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
