"""What every derived summary script shares: it reads raw result files (never
changing them) and writes one new file, once."""
from __future__ import annotations

import argparse
from pathlib import Path


def runs_and_out(doc: str, script: str) -> tuple[list[Path], Path, str]:
    """Parses `RUN.json... --out NEW.md`; refuses an --out that exists. Returns
    the runs, the output and the line that says how the file was derived."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: a derived file is written once")
    how = f"Derived by `bench/{script} " + " ".join(str(p) for p in args.runs) + "`."
    return args.runs, args.out, how
