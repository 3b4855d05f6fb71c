#!/usr/bin/env python3
"""Where a raw result came from: the one way the benchmarks in this folder record it.

provenance() gives

  {"commit":  git rev-parse HEAD (None outside a git checkout),
   "dirty":   true if `git status --porcelain` lists anything but untracked files
              under bench/results (a run's own output),
   "dirty_paths": what it lists, so a dirty run says how (at most 50 entries),
   "machine": {"cpu_model", "cores" (usable by this process, as nproc counts),
               "mem_gib", "kernel"},
   "command": the command line as run, shell-quoted, preceded by the environment
              settings the benchmarks read (THRONG_BIN=... and so on) when set,
   "date":    UTC, ISO 8601}

Python benchmarks import it (provenance(), binary(), raw_path(), write_raw(),
md_header()); the shell ones
call it through bench/lib.sh's provenance_json, which runs

  python3 bench/provenance.py -- ARGV...

(ARGV: the script's $0 and arguments as it was started) and takes the JSON it prints.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

# The environment variables the benchmarks read: part of how a run was asked for.
ENV_SETTINGS = ("THRONG_BIN", "THRONG_BASE_BIN", "DURATION", "INSTALL", "NCHAN_SO", "UWS_SRC")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state() -> tuple[str | None, bool | None, list[str]]:
    """(commit, dirty, the porcelain lines that make it dirty)."""
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain")
    if head is None or status is None:
        return None, None, []
    lines = [line for line in status.splitlines()
             if line and not (line.startswith("?? ") and line[3:].lstrip('"').startswith("bench/results/"))]
    return head.strip(), bool(lines), lines[:50]


def machine() -> dict:
    model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1048576, 1)
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    return {"cpu_model": model, "cores": cores, "mem_gib": mem_gib, "kernel": platform.release()}


def command_line(argv: list[str] | None = None) -> str:
    """The command as run, shell-quoted. By default this Python process's own (with
    the interpreter, as typed: `python3 bench/x.py --flag`)."""
    if argv is None:
        argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in ENV_SETTINGS if k in os.environ]
    return " ".join(env + [shlex.quote(a) for a in argv])


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def provenance(argv: list[str] | None = None) -> dict:
    commit, dirty, paths = git_state()
    return {"commit": commit, "dirty": dirty, "dirty_paths": paths, "machine": machine(),
            "command": command_line(argv), "date": utc_now()}


def binary(path: str | Path) -> dict:
    """The binary a run measured (it may not be this checkout's build): path, its
    `--version`, modification time (UTC) and SHA-256 (first 16 hex digits)."""
    import hashlib
    p = Path(path)
    out: dict = {"path": str(p)}
    try:
        out["version"] = subprocess.run([str(p), "--version"], capture_output=True, text=True,
                                        timeout=10).stdout.strip()
        out["mtime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(p.stat().st_mtime))
        out["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    except (OSError, subprocess.TimeoutExpired) as e:
        out["error"] = repr(e)
    return out


def stamp() -> str:
    """The UTC stamp in raw file names: 20261125-173903."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def raw_path(name: str, when: str | None = None, out_dir: Path | str | None = None) -> Path:
    """bench/results/NAME-STAMP.json (or in out_dir)."""
    return Path(out_dir or RESULTS_DIR) / f"{name}-{when or stamp()}.json"


def write_raw(path: Path | str, doc: dict, md: str | None = None) -> Path:
    """Writes the raw JSON (and, given md, its Markdown summary beside it as .md) and
    returns where. Never overwrites: a raw result is not edited after its run, so if
    the file (or its .md) is there already, this one goes to NAME-2.json (-3, ...)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    base, k = path, 1
    while path.exists() or (md is not None and path.with_suffix(".md").exists()):
        k += 1
        path = base.with_name(f"{base.stem}-{k}{base.suffix}")
    if k > 1:
        print(f"{base} exists: writing {path}", file=sys.stderr)
    with open(path, "x") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
    if md is not None:
        with open(path.with_suffix(".md"), "x") as f:
            f.write(md if md.endswith("\n") else md + "\n")
    return path


def md_header(title: str, prov: dict) -> str:
    """The first lines of a raw run's Markdown summary: what, where, which commit, how."""
    m = prov["machine"]
    commit = (prov["commit"] or "no git")[:12] + (" (dirty tree)" if prov["dirty"] else "")
    return (f"# {title}\n\n"
            f"- machine: {m['cores']} cores ({m['cpu_model']}), {m['mem_gib']} GiB, kernel {m['kernel']}\n"
            f"- commit {commit}; {prov['date']}\n"
            f"- command: `{prov['command']}`\n")


def main(args: list[str]) -> int:
    if args[:1] != ["--"]:
        print("usage: provenance.py -- ARGV...   (prints the provenance JSON of the command ARGV)",
              file=sys.stderr)
        return 2
    print(json.dumps(provenance(args[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
