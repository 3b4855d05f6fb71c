#!/usr/bin/env python3
"""What an idle TLS connection keeps on the heap (issue 27): runs

  cargo bench --bench tls_idle -- N tls13   and   ... -- N tls12

(benches/tls_idle.rs: N server connections handshaken in memory against
rustls's client, then held; bytes the allocator still has out per connection,
for rustls's buffered ServerConnection, its unbuffered API, and throng's record
layer session after the handshake) and keeps both outputs with the provenance
in bench/results/tls-idle-STAMP.json and .md.

Usage: bench/tls_idle.py [--conns 1000] [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402  (bench/provenance.py)

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--out", default=str(provenance.RESULTS_DIR))
    args = ap.parse_args()
    prov = provenance.provenance()
    runs = []
    for version in ("tls13", "tls12"):
        cmd = ["cargo", "bench", "--bench", "tls_idle", "--", str(args.conns), version]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["command"] = cmd
        runs.append(result)
    lines = ["| version | rustls buffered B/conn | rustls unbuffered B/conn | throng session B/conn | throng ÷ unbuffered |",
             "|---|---:|---:|---:|---:|"]
    for r in runs:
        t = r["total_bytes_per_conn"]
        lines.append(f"| {r['version']} | {t['rustls_buffered']:,.0f} | {t['rustls_unbuffered']:,.0f} | "
                     f"{t['throng_session']:,.0f} | {t['throng_session'] / t['rustls_unbuffered']:.2f} |")
    doc = {"provenance": prov, "connections": args.conns, "runs": runs}
    md = provenance.md_header("Idle TLS connection heap (bench/tls_idle.py)", prov) + "\n" + "\n".join(lines) + "\n"
    path = provenance.write_raw(provenance.raw_path("tls-idle", out_dir=args.out), doc, md)
    print("\n".join(lines))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
