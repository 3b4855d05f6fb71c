#!/usr/bin/env bash
# Autobahn TestSuite cases ("fuzzingclient" role: the suite is the client, the
# server under test must echo) via kosoku, a Python-3 runner that drives the
# original Autobahn case files (https://pypi.org/project/kosoku/). By default
# cases 1-10; AUTOBAHN_CASES also selects the permessage-deflate sections 12.*
# (compression of different payloads) and 13.* (different offers and window
# sizes), which need a server that negotiates permessage-deflate.
#
# Usage: scripts/autobahn.sh URL_OR_PORT [OUTDIR]
#   URL_OR_PORT  a port (-> ws://127.0.0.1:PORT/) or a ws:// URL. The server must
#                already be running; this script never starts it.
#   OUTDIR       default docs/autobahn/report. Gets index.json (Autobahn format),
#                the per-case JSON reports of failing cases only, run.json,
#                probe.json and summary.txt. SUMMARY.md goes to
#                docs/autobahn/SUMMARY.md when OUTDIR is the default, else to
#                OUTDIR/SUMMARY.md (override with AUTOBAHN_SUMMARY_MD).
#
# Exit: 0 all cases passed, 1 some case failed (see the table), 2 setup error
# (no server listening, venv/pip failure).
#
# Environment knobs (all optional):
#   AUTOBAHN_AGENT         agent name in the reports (default: throng)
#   AUTOBAHN_CASES         comma-separated case ids/globs to run instead of 1-10,
#                          e.g. "6.*,7.1.5" (quick re-runs while fixing bugs) or
#                          "1.*,2.*,3.*,4.*,5.*,6.*,7.*,9.*,10.*,12.*,13.*" (all,
#                          with compression). A section selected whole ("12.*")
#                          with nothing excluded must be complete in the report.
#   AUTOBAHN_EXCLUDE       comma-separated case ids/globs to skip
#   AUTOBAHN_CASE_TIMEOUT  seconds per case, sections 1-8/10 (default 15)
#   AUTOBAHN_CASE_TIMEOUT_9  seconds per 9.* case (default 30)
#   AUTOBAHN_CASE_TIMEOUT_12 seconds per 12.* and 13.* case (default 60; each
#                          sends 1000 messages of up to 128 KiB compressed)
#   AUTOBAHN_BUDGET        seconds for the whole run (default 600); cases not
#                          started by then are reported as failed "not run"
#   AUTOBAHN_PARALLEL      cases run at once (default 1)
#   AUTOBAHN_KEEP=all      keep every per-case JSON and the HTML report in OUTDIR
#                          (~6 MB) instead of only the failing cases' JSON
#   AUTOBAHN_VERBOSE=1     print every case as it finishes (default: only failures)
#   AUTOBAHN_SERVER_NOTE   free text (e.g. the server's command line), recorded in
#                          run.json and SUMMARY.md
#
# The venv lives at .venv-autobahn at the repo root (not in .gitignore by this
# script). kosoku is pinned because the report writer uses its internals.
set -euo pipefail

KOSOKU_VERSION=0.1.0
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv-autobahn"
DEFAULT_OUTDIR="$ROOT/docs/autobahn/report"

if [[ $# -lt 1 || $# -gt 2 || $1 == -h || $1 == --help ]]; then
    sed -n '2,43p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
fi

target=$1
if [[ $target =~ ^[0-9]+$ ]]; then
    url="ws://127.0.0.1:$target/"
else
    url=$target
fi
outdir=${2:-$DEFAULT_OUTDIR}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
if [[ -n ${AUTOBAHN_SUMMARY_MD:-} ]]; then
    summary_md=$AUTOBAHN_SUMMARY_MD
elif [[ $outdir == "$DEFAULT_OUTDIR" ]]; then
    summary_md="$ROOT/docs/autobahn/SUMMARY.md"
else
    summary_md="$outdir/SUMMARY.md"
fi

# --- venv with kosoku -------------------------------------------------------
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('kosoku') != '$KOSOKU_VERSION')" 2>/dev/null; then
    echo "autobahn.sh: setting up $VENV (kosoku==$KOSOKU_VERSION)" >&2
    if [[ ! -x $VENV/bin/python ]]; then
        python3 -m venv "$VENV" || { echo "autobahn.sh: python3 -m venv failed" >&2; exit 2; }
    fi
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "kosoku==$KOSOKU_VERSION" \
        || { echo "autobahn.sh: pip install kosoku failed" >&2; exit 2; }
fi
PY="$VENV/bin/python"

budget=${AUTOBAHN_BUDGET:-600}
work=$(mktemp -d "${TMPDIR:-/tmp}/autobahn.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- run the cases (bounded: per-case timeouts + a global budget inside the
# driver, and `timeout` as a last-resort net around it) -----------------------
set +e
timeout --kill-after=10 $((budget + 120)) "$PY" - "$url" "$work" <<'PYEOF'
import asyncio, base64, datetime, hashlib, json, os, re, socket, struct, sys, time
from urllib.parse import urlsplit

url, work = sys.argv[1], sys.argv[2]
agent = os.environ.get("AUTOBAHN_AGENT", "throng")
case_timeout = float(os.environ.get("AUTOBAHN_CASE_TIMEOUT", "15"))
case_timeout_9 = float(os.environ.get("AUTOBAHN_CASE_TIMEOUT_9", "30"))
case_timeout_12 = float(os.environ.get("AUTOBAHN_CASE_TIMEOUT_12", "60"))
budget = float(os.environ.get("AUTOBAHN_BUDGET", "600"))
parallel = max(1, int(os.environ.get("AUTOBAHN_PARALLEL", "1")))
keep_all = os.environ.get("AUTOBAHN_KEEP", "") == "all"
verbose = os.environ.get("AUTOBAHN_VERBOSE", "") not in ("", "0")

u = urlsplit(url)
host, port = u.hostname or "127.0.0.1", u.port or 80
path = (u.path or "/") + (("?" + u.query) if u.query else "")

# Wait (briefly) for the server to accept TCP connections.
deadline = time.monotonic() + 10
while True:
    try:
        socket.create_connection((host, port), timeout=2).close()
        break
    except OSError as e:
        if time.monotonic() > deadline:
            print(f"autobahn.sh: nothing accepts connections at {host}:{port}: {e}", file=sys.stderr)
            sys.exit(2)
        time.sleep(0.2)

import importlib.metadata
from kosoku import FailureError, run_fuzzingclient
from kosoku.cases import CASES
from kosoku import _report as R


def globs(env, default):
    pats = [p.strip() for p in os.environ.get(env, default).split(",") if p.strip()]
    # kosoku's own glob semantics: prefix-anchored, '.' literal, '*' = '.*'
    return [re.compile("^" + p.replace(".", r"\.").replace("*", ".*") + ("" if "*" in p else "$")) for p in pats]

# kosoku 0.1.0 bug: on a connection that negotiated permessage-deflate, a message
# the server sent uncompressed (RSV1 clear, which RFC 7692 6.1 allows for any
# message; throng does so below --deflate-min-size and where compressing would
# not make it smaller) reaches the case's onMessage as a str, its bytes decoded
# as latin-1, even for a binary message; the 12.*/13.* cases then fail in
# hashlib ("Strings must be encoded before hashing", ERROR). Such a str is
# encoded back to exactly those bytes before the case sees it: the case still
# compares every byte, type and length with what it sent.
def _bytes_for_case(on_message):
    def on_message_bytes(self, msg, binary):
        if isinstance(msg, str):
            msg = msg.encode("latin-1")
        return on_message(self, msg, binary)
    return on_message_bytes


incl = globs("AUTOBAHN_CASES", ",".join(f"{n}.*" for n in range(1, 11)))
excl = globs("AUTOBAHN_EXCLUDE", "")
ids = [c for c in CASES if any(r.match(c) for r in incl) and not any(r.match(c) for r in excl)]
if not ids:
    print("autobahn.sh: no case matches AUTOBAHN_CASES/AUTOBAHN_EXCLUDE", file=sys.stderr)
    sys.exit(2)


for cid in ids:
    if cid.startswith(("12.", "13.")):
        CASES[cid].onMessage = _bytes_for_case(CASES[cid].onMessage)


def synthetic(cid, result, result_close):
    """An Autobahn-format case dict for a case kosoku could not finish."""
    cls = CASES[cid]
    return {
        "id": cid, "description": getattr(cls, "DESCRIPTION", ""),
        "expectation": getattr(cls, "EXPECTATION", ""), "agent": agent,
        "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "duration": 0, "reportTime": False, "reportCompressionRatio": False,
        "behavior": "FAILED", "behaviorClose": "UNCLEAN", "expected": {}, "expectedClose": {},
        "received": [], "result": result, "resultClose": result_close, "wirelog": [],
        "createWirelog": False, "closedByMe": False, "failedByMe": False, "droppedByMe": True,
        "wasClean": False, "wasNotCleanReason": result_close,
        "wasServerConnectionDropTimeout": False, "wasOpenHandshakeTimeout": False,
        "wasCloseHandshakeTimeout": False, "localCloseCode": None, "localCloseReason": None,
        "remoteCloseCode": None, "remoteCloseReason": None, "isServer": False,
        "createStats": False, "rxOctetStats": {}, "rxFrameStats": {}, "txOctetStats": {},
        "txFrameStats": {}, "httpRequest": "", "httpResponse": "", "trafficStats": None,
    }


async def run_all():
    t0 = time.monotonic()
    end = t0 + budget
    sem = asyncio.Semaphore(parallel)
    results = {}
    timeouts = []

    async def one(cid):
        async with sem:
            remaining = end - time.monotonic()
            if remaining <= 0:
                results[cid] = synthetic(
                    cid, f"NOT RUN: the run's time budget ({budget:.0f}s, AUTOBAHN_BUDGET) was used up before this case started.",
                    "not run")
                return
            if cid.startswith("9."):
                own = case_timeout_9
            elif cid.startswith(("12.", "13.")):
                own = case_timeout_12
            else:
                own = case_timeout
            limit = min(own, remaining)
            why = "" if limit == own else " (cut short: the run's time budget AUTOBAHN_BUDGET was nearly used up)"
            t = time.monotonic()
            try:
                res = await asyncio.wait_for(run_fuzzingclient(url, [cid]), limit)
            except FailureError as e:
                res = e.results
            except asyncio.TimeoutError:
                timeouts.append(cid)
                print(f"  {cid:8s} TIMEOUT after {limit:.1f}s{why}", file=sys.stderr, flush=True)
                results[cid] = synthetic(
                    cid, f"TIMEOUT: kosoku did not finish this case within {limit:.1f}s{why}. kosoku has no close-handshake "
                         "or open-handshake timeout of its own, so the server most likely never answered kosoku's "
                         "close frame (or the handshake, or stopped reading/echoing).",
                    "kosoku abandoned the case after the per-case timeout")
                return
            if len(res) != 1:
                results[cid] = synthetic(cid, f"kosoku returned {len(res)} results for one case", "n/a")
                return
            d = R.case_to_dict(res[0])
            d["agent"] = agent
            results[cid] = d
            if verbose or d["behavior"] not in ("OK", "NON-STRICT", "INFORMATIONAL") \
                    or d["behaviorClose"] not in ("OK", "INFORMATIONAL"):
                print(f"  {cid:8s} {d['behavior']:13s} {d['behaviorClose']:16s} {time.monotonic() - t:6.2f}s",
                      file=sys.stderr, flush=True)

    await asyncio.gather(*(one(c) for c in ids))
    return results, timeouts, time.monotonic() - t0


started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
print(f"autobahn.sh: running {len(ids)} cases against {url} (agent {agent!r})", file=sys.stderr)
results, timeouts, wall = asyncio.run(run_all())

# --- extra probe: does the server drop TCP after the closing handshake? -------
# kosoku stops reading as soon as close frames went both ways, so it never
# notices a server that keeps the TCP connection open afterwards (Autobahn waits
# 1s, then drops itself and reports "FAILED BY CLIENT"). Also checks the
# handshake with a random key (kosoku always sends the RFC 6455 sample key).
def probe():
    out = {"url": url}
    try:
        s = socket.create_connection((host, port), timeout=5)
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        out["status_line"] = lines[0] if lines else ""
        hdrs = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        out["accept_ok"] = hdrs.get("sec-websocket-accept") == want
        if " 101 " not in out["status_line"] + " ":
            out["error"] = "no 101 response"
            return out
        mask = os.urandom(4)
        payload = struct.pack("!H", 1000)
        s.sendall(bytes([0x88, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        t = time.monotonic()
        data, closed = rest, False
        s.settimeout(0.2)
        while time.monotonic() - t < 3:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                closed = True
                break
            data += chunk
        out["close_reply"] = len(data) >= 2 and data[0] == 0x88
        out["close_reply_code"] = struct.unpack("!H", data[2:4])[0] if out["close_reply"] and data[1] & 0x7F >= 2 and len(data) >= 4 else None
        out["server_dropped_tcp"] = closed
        out["seconds_to_drop"] = round(time.monotonic() - t, 3) if closed else None
        s.close()
    except OSError as e:
        out["error"] = repr(e)
    return out

probe_result = probe()

# --- write the Autobahn-format report ----------------------------------------
index = {agent: {}}
cases = {}
for n, cid in enumerate(ids, 1):
    d = results[cid]
    d["case"] = n
    fname = R._report_filename(agent, cid, "json")
    with open(os.path.join(work, fname), "w") as f:
        json.dump(d, f, **R._JSON_KW)
    index[agent][cid] = {"behavior": d["behavior"], "behaviorClose": d["behaviorClose"],
                         "remoteCloseCode": d["remoteCloseCode"], "duration": d["duration"],
                         "reportfile": fname}
    cases[(agent, cid)] = d
    if keep_all:
        with open(os.path.join(work, R._report_filename(agent, cid, "html")), "w") as f:
            f.write(R._detail_html(d))
with open(os.path.join(work, "index.json"), "w") as f:
    json.dump(index, f, **R._JSON_KW)
if keep_all:
    with open(os.path.join(work, "index.html"), "w") as f:
        f.write(R._master_html(index, cases))
with open(os.path.join(work, "probe.json"), "w") as f:
    json.dump(probe_result, f, indent=2, sort_keys=True)
with open(os.path.join(work, "run.json"), "w") as f:
    json.dump({"url": url, "agent": agent, "kosoku": importlib.metadata.version("kosoku"),
               "started": started, "wall_seconds": round(wall, 1), "cases": len(ids),
               "case_timeout": case_timeout, "case_timeout_9": case_timeout_9,
               "case_timeout_12": case_timeout_12, "budget": budget,
               "parallel": parallel, "timed_out_cases": timeouts,
               "server": os.environ.get("AUTOBAHN_SERVER_NOTE", ""),
               "selection": os.environ.get("AUTOBAHN_CASES", "1.*,...,10.*"),
               "exclude": os.environ.get("AUTOBAHN_EXCLUDE", ""),
               "selection_custom": bool(os.environ.get("AUTOBAHN_CASES") or os.environ.get("AUTOBAHN_EXCLUDE")),
               "selected_cases": ids},
              f, indent=2, sort_keys=True)
print(f"autobahn.sh: {len(ids)} cases in {wall:.1f}s", file=sys.stderr)
PYEOF
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
    [[ $rc -eq 124 || $rc -eq 137 ]] && echo "autobahn.sh: the kosoku driver hit the hard timeout" >&2
    echo "autobahn.sh: kosoku driver failed (exit $rc)" >&2
    exit 2
fi

# --- replace the previous report in OUTDIR -------------------------------------
rm -f "$outdir"/index.json "$outdir"/index.html "$outdir"/*_case_*.json "$outdir"/*_case_*.html \
      "$outdir"/run.json "$outdir"/probe.json "$outdir"/summary.txt
cp "$work"/index.json "$work"/run.json "$work"/probe.json "$outdir"/
if [[ ${AUTOBAHN_KEEP:-} == all ]]; then
    cp "$work"/*_case_*.json "$work"/*_case_*.html "$work"/index.html "$outdir"/ 2>/dev/null || true
    export_args=()
else
    export_args=(--export-failing "$outdir")
fi

set +e
"$PY" "$ROOT/scripts/autobahn_check.py" "$work/index.json" \
    --summary-md "$summary_md" "${export_args[@]}" | tee "$outdir/summary.txt"
check_rc=${PIPESTATUS[0]}
set -e
echo "autobahn.sh: report in $outdir ($(du -sh "$outdir" | cut -f1)), summary in $summary_md" >&2
exit "$check_rc"
