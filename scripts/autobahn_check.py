#!/usr/bin/env python3
"""Check an Autobahn-format report (index.json) for cases 1-10, 12 and 13.

Usage: autobahn_check.py INDEX_JSON [--agent NAME] [--summary-md PATH]
                         [--export-failing DIR] [--behavior-only]

Prints a table of counts by section, behavior and behaviorClose, and lists every
failing case with its description and what the server did versus what the case
expected. Exit status: 0 if every case passed, 1 otherwise (2 on bad input).

A case passes when
  * behavior is OK, NON-STRICT or INFORMATIONAL (UNIMPLEMENTED, FAILED and
    kosoku's ERROR fail), and
  * behaviorClose is OK or INFORMATIONAL (WRONG CODE, UNCLEAN, FAILED BY CLIENT,
    FAILED fail; this is kosoku's own pass rule). --behavior-only drops this.
Cases missing from the index fail too: every case run.json (next to the index,
written by scripts/autobahn.sh) lists as selected, and every case of a section
selected whole (the default 1-10, or a pattern "N.*" in AUTOBAHN_CASES with
nothing excluded: section 12 has 90 cases, 13 has 126). Without run.json,
sections 1-10 and any of 12 and 13 the index has cases of must be complete.
Sections 12 and 13 (permessage-deflate) pass only if the server negotiated the
extension: kosoku calls a case UNIMPLEMENTED otherwise, which fails.

Needs only the standard library. When the per-case reports named in index.json
("reportfile") sit next to it, it also audits them for two blind spots of
kosoku 0.1.0 that the Autobahn verdicts alone do not show:
  * server bytes kosoku could not parse as a frame (e.g. a reserved opcode or
    other invalid frame sent by the server): kosoku then stops as if the server
    had dropped TCP and can report OK for a case the server got wrong (seen in
    4.*); such a case is counted as failed here;
  * an opening-handshake response without the correct Sec-WebSocket-Accept,
    Upgrade or Connection headers (kosoku only checks the 101 status).
It also reads probe.json (written by scripts/autobahn.sh) if present: a raw
check that the server answers a close frame and then drops TCP, which kosoku
does not check.
"""

from __future__ import annotations

import argparse
import collections
import html
import json
import os
import re
import shutil
import sys

SECTIONS = {"1": 16, "2": 11, "3": 7, "4": 10, "5": 20, "6": 145, "7": 37, "9": 54, "10": 1,
            "12": 90, "13": 126}
SECTION_NAMES = {
    "1": "Framing", "2": "Pings/Pongs", "3": "Reserved Bits", "4": "Opcodes",
    "5": "Fragmentation", "6": "UTF-8 Handling", "7": "Close Handling",
    "9": "Limits/Performance", "10": "Misc",
    "12": "WebSocket Compression (different payloads)",
    "13": "WebSocket Compression (different parameters)",
}
# What scripts/autobahn.sh runs when AUTOBAHN_CASES is not set.
DEFAULT_SECTIONS = ["1", "2", "3", "4", "5", "6", "7", "9", "10"]
COMPRESSION_SECTIONS = ["12", "13"]
BEHAVIORS = ["OK", "NON-STRICT", "INFORMATIONAL", "UNIMPLEMENTED", "FAILED", "ERROR"]
CLOSES = ["OK", "INFORMATIONAL", "WRONG CODE", "UNCLEAN", "FAILED BY CLIENT", "FAILED"]
GOOD_BEHAVIOR = {"OK", "NON-STRICT", "INFORMATIONAL"}
GOOD_CLOSE = {"OK", "INFORMATIONAL"}
SAMPLE_KEY = "dGhlIHNhbXBsZSBub25jZQ=="
SAMPLE_ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def sort_key(case_id: str) -> list[int]:
    return [int(p) for p in case_id.split(".")]


def sections_label(sections) -> str:
    """'1-10, 12, 13' for the default sections plus 12 and 13; else the list."""
    secs = sorted(set(sections), key=int)
    if set(DEFAULT_SECTIONS) <= set(secs):
        rest = [x for x in secs if x not in DEFAULT_SECTIONS]
        return ", ".join(["1-10"] + rest)
    return ", ".join(secs) if secs else "none"


def whole_sections(run: dict, present: set[str]) -> list[str]:
    """The sections that must be complete in the index (see the module doc)."""
    if not run:
        return DEFAULT_SECTIONS + [x for x in COMPRESSION_SECTIONS if x in present]
    if not run.get("selection_custom"):
        return list(DEFAULT_SECTIONS)
    if run.get("exclude"):
        return []
    pats = [p.strip() for p in (run.get("selection") or "").split(",") if p.strip()]
    return [x for x in SECTIONS if f"{x}.*" in pats]


def missing_cases(run: dict, index_ids: set[str], counts: dict[str, int]) -> list[str]:
    """Problems: selected cases absent from the index, incomplete whole sections."""
    out = []
    selected = run.get("selected_cases") if run else None
    if selected is not None:
        absent = sorted((c for c in selected if c not in index_ids), key=sort_key)
        if absent:
            out.append(f"{len(absent)} selected case(s) not in the index: {', '.join(absent[:8])}"
                       + (" ..." if len(absent) > 8 else ""))
    elif run and run.get("selection_custom"):
        return out  # an older run.json of a subset: nothing more is known
    for sec in whole_sections(run, {x for x, n in counts.items() if n}):
        have, n = counts.get(sec, 0), SECTIONS[sec]
        if have < n:
            out.append(f"section {sec}: {have} of {n} cases in the index")
    return out


def plain(text: str, limit: int = 0) -> str:
    text = html.unescape(re.sub(r"<[^>]+>", "", text or "")).replace("\n", " ").strip()
    text = re.sub(r"\s+", " ", text)
    if limit and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def header_size(payload_len: int, masked: bool) -> int:
    ext = 0 if payload_len < 126 else (2 if payload_len < 65536 else 8)
    return 2 + ext + (4 if masked else 0)


def audit_unparsed(case: dict) -> str | None:
    """Server octets read but never parsed into a frame (kosoku parse failure)."""
    wirelog = case.get("wirelog") or []
    if not case.get("createWirelog") or case.get("droppedByMe"):
        return None
    if any(e and e[0] == "WLM" for e in wirelog):
        return None
    ro = [e for e in wirelog if e and e[0] == "RO"]
    rf = [e for e in wirelog if e and e[0] == "RF"]
    received = sum(e[1][0] for e in ro)
    parsed = sum(e[1][0] + header_size(e[1][0], bool(e[5])) for e in rf)
    leftover = received - parsed
    if leftover <= 0:
        return None
    detail = ""
    hexes = [e[1][1] for e in ro]
    if not any(h.endswith(" ...") for h in hexes):  # full stream is in the log
        stream = bytes.fromhex("".join(hexes))
        rest = stream[parsed:]
        if len(rest) >= 2:
            b0, b1 = rest[0], rest[1]
            detail = (f": first unparsed frame header {rest[:2].hex()} = opcode {b0 & 0x0F}, "
                      f"FIN={b0 >> 7}, RSV={(b0 >> 4) & 7}, MASK={b1 >> 7}, len7={b1 & 0x7F}")
        else:
            detail = f": {rest.hex()}"
    return (f"server sent {leftover} octet(s) kosoku could not parse as a frame{detail}; kosoku then "
            f"ends the case as if the server had dropped TCP, so its verdict "
            f"({case.get('behavior')}/{case.get('behaviorClose')}) is not trustworthy")


def audit_handshake(case: dict) -> str | None:
    req, resp = case.get("httpRequest") or "", case.get("httpResponse") or ""
    if not resp:
        return None
    headers = {}
    for line in resp.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    problems = []
    if SAMPLE_KEY in req:
        if headers.get("sec-websocket-accept", [None])[0] != SAMPLE_ACCEPT:
            problems.append(f"Sec-WebSocket-Accept {headers.get('sec-websocket-accept')} (want {SAMPLE_ACCEPT})")
    if not any("websocket" in v.lower() for v in headers.get("upgrade", [])):
        problems.append("no 'Upgrade: websocket'")
    if not any("upgrade" in [t.strip().lower() for t in v.split(",")] for v in headers.get("connection", [])):
        problems.append("no 'Connection: Upgrade'")
    return "; ".join(problems) or None


def describe_failure(cid: str, entry: dict, case: dict | None, audit: str | None) -> list[str]:
    lines = [f"{cid}  behavior={entry.get('behavior')}  behaviorClose={entry.get('behaviorClose')}"
             f"  remoteCloseCode={entry.get('remoteCloseCode')}"]
    if case is None:
        lines.append("    (per-case report not available)")
        return lines
    lines.append(f"    case:     {plain(case.get('description', ''), 200)}")
    lines.append(f"    expect:   {plain(case.get('expectation', ''), 200)}")
    lines.append(f"    result:   {plain(case.get('result', ''), 300)}")
    ec = case.get("expectedClose") or {}
    lines.append(
        f"    close:    {plain(case.get('resultClose', ''), 200)}"
        + (f" [expected closedByMe={ec.get('closedByMe')} code in {ec.get('closeCode')}"
           f" clean={ec.get('requireClean')}; got closedByMe={case.get('closedByMe')}"
           f" code={case.get('remoteCloseCode')} reason={case.get('remoteCloseReason')!r}"
           f" wasClean={case.get('wasClean')} droppedByMe={case.get('droppedByMe')}]" if ec else ""))
    exp = case.get("expected") or {}
    if exp:
        lines.append(f"    expected: {plain(json.dumps(exp), 300)}")
        lines.append(f"    received: {plain(json.dumps(case.get('received')), 300)}")
    if audit:
        lines.append(f"    AUDIT:    {audit}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("index")
    ap.add_argument("--agent", help="agent to check (default: the only one in the index)")
    ap.add_argument("--summary-md", help="write a Markdown summary here")
    ap.add_argument("--export-failing", metavar="DIR", help="copy failing cases' JSON reports to DIR")
    ap.add_argument("--behavior-only", action="store_true",
                    help="judge behavior only, not behaviorClose")
    args = ap.parse_args()

    try:
        with open(args.index) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        print(f"autobahn_check: cannot read {args.index}: {e}", file=sys.stderr)
        return 2
    base = os.path.dirname(os.path.abspath(args.index))
    agents = sorted(index)
    if args.agent:
        agent = args.agent
    elif len(agents) == 1:
        agent = agents[0]
    else:
        print(f"autobahn_check: index has agents {agents}; pick one with --agent", file=sys.stderr)
        return 2
    if agent not in index:
        print(f"autobahn_check: agent {agent!r} not in index ({agents})", file=sys.stderr)
        return 2

    def load_json(name):
        try:
            with open(os.path.join(base, name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    run = load_json("run.json") or {}
    probe = load_json("probe.json")

    entries = {cid: e for cid, e in index[agent].items() if cid.split(".")[0] in SECTIONS}
    others = sorted(set(index[agent]) - set(entries), key=sort_key)

    failing: dict[str, list[str]] = {}
    audits: dict[str, str] = {}
    handshake_issues: dict[str, str] = {}
    reports_seen = 0
    by_section = collections.defaultdict(collections.Counter)
    by_section_close = collections.defaultdict(collections.Counter)
    for cid in sorted(entries, key=sort_key):
        e = entries[cid]
        sec = cid.split(".")[0]
        by_section[sec][e.get("behavior")] += 1
        by_section_close[sec][e.get("behaviorClose")] += 1
        case = load_json(e["reportfile"]) if e.get("reportfile") else None
        audit = None
        if case is not None:
            reports_seen += 1
            audit = audit_unparsed(case)
            hs = audit_handshake(case)
            if hs:
                handshake_issues[cid] = hs
        bad = e.get("behavior") not in GOOD_BEHAVIOR
        bad |= not args.behavior_only and e.get("behaviorClose") not in GOOD_CLOSE
        if audit:
            audits[cid] = audit
        if bad or audit:
            failing[cid] = describe_failure(cid, e, case, audit)

    counts = {sec: sum(by_section[sec].values()) for sec in SECTIONS if sec in by_section}
    missing = missing_cases(run, set(index[agent]), counts)

    probe_problems = []
    if probe is not None:
        if probe.get("error"):
            probe_problems.append(f"probe error: {probe['error']} (status line {probe.get('status_line')!r})")
        else:
            if not probe.get("accept_ok"):
                probe_problems.append("wrong Sec-WebSocket-Accept for a random key")
            if not probe.get("close_reply"):
                probe_problems.append("no close frame in reply to a client close (1000) within 3s")
            if not probe.get("server_dropped_tcp"):
                probe_problems.append("server did not close the TCP connection within 3s after the "
                                      "closing handshake (RFC 6455 7.1.1: the server closes TCP first; "
                                      "Autobahn would report FAILED BY CLIENT, kosoku cannot see this)")

    # ---- text report ------------------------------------------------------
    out: list[str] = []
    total = sum(sum(c.values()) for c in by_section.values())
    label = sections_label(by_section)
    out.append(f"Autobahn TestSuite cases {label} (kosoku {run.get('kosoku', '?')}) -- agent '{agent}', "
               f"{total} cases" + (f", target {run['url']}, {run.get('wall_seconds')}s wall" if run else ""))
    cols = ["sec", "total"] + BEHAVIORS + ["| close:"] + CLOSES
    widths = [max(len(c), 5) for c in cols]
    out.append("  ".join(c.rjust(w) for c, w in zip(cols, widths)))

    def row(label, beh, clo):
        vals = [label, str(sum(beh.values()))] + [str(beh.get(b, 0)) for b in BEHAVIORS] + ["|"] \
            + [str(clo.get(c, 0)) for c in CLOSES]
        return "  ".join(v.rjust(w) for v, w in zip(vals, widths))

    tot_b, tot_c = collections.Counter(), collections.Counter()
    for sec in sorted(by_section, key=int):
        out.append(row(sec, by_section[sec], by_section_close[sec]))
        tot_b.update(by_section[sec])
        tot_c.update(by_section_close[sec])
    out.append(row("all", tot_b, tot_c))
    odd = sorted(set(tot_b) - set(BEHAVIORS)) + sorted(set(tot_c) - set(CLOSES))
    if odd:
        out.append(f"other labels seen: {odd}")
    if others:
        out.append(f"ignored (not sections {sections_label(SECTIONS)}): {len(others)} cases")
    if reports_seen < total:
        out.append(f"note: per-case reports found for {reports_seen} of {total} cases; the audit covers only those"
                   + ("" if reports_seen else " (scripts/autobahn.sh audits all of them before pruning)"))
    if run.get("timed_out_cases"):
        out.append(f"cases abandoned after the per-case timeout: {', '.join(run['timed_out_cases'])}")
    if handshake_issues:
        first = next(iter(handshake_issues.items()))
        out.append(f"HANDSHAKE problems in {len(handshake_issues)} case(s), e.g. {first[0]}: {first[1]}")
    for p in probe_problems:
        out.append(f"PROBE: {p}")
    for m in missing:
        out.append(f"MISSING: {m}")
    ok = not failing and not missing and not handshake_issues and not probe_problems
    if failing:
        out.append("")
        out.append(f"FAILING CASES ({len(failing)}):")
        for cid in sorted(failing, key=sort_key):
            out.extend("  " + line for line in failing[cid])
    out.append("")
    out.append(f"RESULT: {'PASS' if ok else 'FAIL'} -- {total - len(failing)}/{total} cases passed"
               + (f", {len(audits)} flagged by the audit" if audits else ""))
    print("\n".join(out))

    # ---- markdown summary ---------------------------------------------------
    if args.summary_md:
        md = [f"# Autobahn TestSuite summary (cases {label})", ""]
        md.append(f"Generated by `scripts/autobahn_check.py` from `{os.path.relpath(args.index)}`"
                  if not run else
                  f"Run by `scripts/autobahn.sh` with kosoku {run.get('kosoku')} against `{run.get('url')}` "
                  f"(agent `{agent}`), started {run.get('started')}, {run.get('cases')} cases in "
                  f"{run.get('wall_seconds')} s.")
        if run.get("server"):
            md += ["", f"Server: `{run['server']}`"]
        md.append("")
        md.append(f"**Result: {'PASS' if ok else 'FAIL'}** -- {total - len(failing)} of {total} cases passed "
                  f"(pass = behavior OK/NON-STRICT/INFORMATIONAL"
                  + ("" if args.behavior_only else " and behaviorClose OK/INFORMATIONAL") + ").")
        md.append("")
        md.append("| section | cases | " + " | ".join(BEHAVIORS) + " | close OK | close other |")
        md.append("|---|---:|" + "---:|" * len(BEHAVIORS) + "---:|---:|")
        for sec in sorted(by_section, key=int):
            b, c = by_section[sec], by_section_close[sec]
            close_other = sum(v for k, v in c.items() if k not in ("OK",))
            md.append(f"| {sec} {SECTION_NAMES.get(sec, '')} | {sum(b.values())} | "
                      + " | ".join(str(b.get(x, 0)) for x in BEHAVIORS)
                      + f" | {c.get('OK', 0)} | {close_other} |")
        close_other = sum(v for k, v in tot_c.items() if k != "OK")
        md.append(f"| **all** | {total} | " + " | ".join(str(tot_b.get(x, 0)) for x in BEHAVIORS)
                  + f" | {tot_c.get('OK', 0)} | {close_other} |")
        md.append("")
        md.append("behaviorClose counts: " + ", ".join(f"{k} {v}" for k, v in sorted(tot_c.items())))
        extra = ([f"- Handshake: {len(handshake_issues)} case(s): {next(iter(handshake_issues.values()))}"]
                 if handshake_issues else []) + [f"- Probe: {p}" for p in probe_problems] \
            + [f"- Missing: {m}" for m in missing]
        if extra:
            md += ["", "## Other problems", ""] + extra
        if failing:
            md += ["", "## Failing cases", ""]
            for cid in sorted(failing, key=sort_key):
                lines = failing[cid]
                md.append(f"- **{lines[0].split()[0]}** `{' '.join(lines[0].split()[1:])}`")
                md += [f"  - {line.strip()}" for line in lines[1:]]
        md.append("")
        os.makedirs(os.path.dirname(os.path.abspath(args.summary_md)), exist_ok=True)
        with open(args.summary_md, "w") as f:
            f.write("\n".join(md))

    if args.export_failing:
        os.makedirs(args.export_failing, exist_ok=True)
        for cid in failing:
            name = entries[cid].get("reportfile")
            src = os.path.join(base, name) if name else None
            if src and os.path.exists(src) and os.path.abspath(args.export_failing) != base:
                shutil.copy(src, os.path.join(args.export_failing, name))

    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
