#!/usr/bin/env python3
"""Recompute a saved million run's summary into a derived file, leaving the run's own file alone.

A file in bench/results is what its run wrote, and is never edited afterwards. When
bench/million.py's summary changes (as when it began taking the pings' share out of
a broadcast's CPU), the new figures are computed from the run's saved samples and
timeline and written beside it:

  bench/results/million-STAMP.json          the run, as written by it (untouched)
  bench/results/million-STAMP.derived.json  this script's output

The derived file says what it was made from (name and SHA-256 of the raw file), by
which command, with the summary bench/million.py computes today, and each figure that
differs from the one the run wrote, both values side by side.

Usage:
  python3 bench/derive_million.py bench/results/million-STAMP.json [...]
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import million  # noqa: E402  (bench/million.py: its summarize() is the one definition)
from provenance import provenance  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

METHOD = (
    "bench/million.py summarize() applied to the run's saved samples (once a second) and "
    "the bench's timeline. Server CPU per delivery = (server CPU cores while the first "
    "broadcast went out - server CPU cores in the idle window, when only pings are sent) "
    "x the seconds until a timeline second received nothing / connections: the pings' "
    "share taken out. The run's own summary (million.py as of the run) had the window's "
    "whole CPU, pings included. Deliveries per second = connections / the slowest "
    "delivery's latency (the run's own used the timeline's whole seconds)."
)


def derived_path(raw: Path) -> Path:
    return raw.with_name(raw.stem + ".derived.json")


def derive(raw: Path) -> tuple[Path, list[tuple[str, str]]]:
    data = raw.read_bytes()
    doc = json.loads(data)
    summary, rows = million.summarize(doc)
    recorded = doc.get("summary", {})
    differs = {
        key: {"raw": recorded.get(key), "derived": summary.get(key)}
        for key in sorted(set(recorded) | set(summary))
        if recorded.get(key) != summary.get(key)
    }
    try:
        shown = raw.resolve().relative_to(ROOT)
    except ValueError:
        shown = raw
    out = {
        "derived_from": raw.name,
        "derived_from_sha256": hashlib.sha256(data).hexdigest(),
        "made_by": f"python3 bench/derive_million.py {shown}",
        "provenance": provenance(),   # the derivation's own: its commit is the summarize() used
        "method": METHOD,
        "summary": summary,
        "differs_from_raw_summary": differs,
    }
    target = derived_path(raw)
    target.write_text(json.dumps(out, indent=1) + "\n")
    return target, rows


def main(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv:
        raw = Path(name)
        if raw.name.endswith(".derived.json"):
            print(f"{raw}: a derived file, not a run", file=sys.stderr)
            return 2
        target, rows = derive(raw)
        million.print_rows(raw.stem, rows)
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
