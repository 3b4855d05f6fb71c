#!/usr/bin/env bash
# History memory: server RSS after one million 32-byte messages were published over
# 10,000 channels (100 per channel), with --history-size 100 (every message kept) and
# with --history-size 0 (none kept), in the same run. 10,000 subscribers (one per
# channel, `throng bench push`) check that every message was delivered in order.
# Prints one line per setting; the difference is what the kept messages cost.
# Keeps the run in bench/results/history-STAMP.json (UTC stamp): provenance (commit,
# dirty tree, machine, command line), the binary, the settings, each setting's figures
# and the bench's JSON; the printed lines in history-STAMP.md.
#
# Usage: bench/history.sh [--messages 1000000] [--channels 10000] [--rate 25000] [--out bench/results]
# Env:   THRONG_BIN (default <repo>/target/release/throng)
set -euo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$BENCH_DIR/lib.sh"   # provenance_json (and THRONG_BIN's default)
MESSAGES=1000000
CHANNELS=10000
RATE=25000
RESULTS_DIR=$BENCH_DIR/results
while [ $# -gt 0 ]; do
  case "$1" in
    --messages) MESSAGES=$2; shift 2 ;;
    --channels) CHANNELS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --out) RESULTS_DIR=$2; shift 2 ;;
    *) echo "history.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
PROVENANCE=$(provenance_json)
STAMP=$(date -u +%Y%m%d-%H%M%S)
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rss_kib() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }
duration=$(( (MESSAGES + RATE - 1) / RATE ))
say() { echo "$*" | tee -a "$WORK/printed.txt"; }   # printed, and kept for the .md
say "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo), $(uname -r); $(date -u +%FT%TZ)"
say "$MESSAGES messages of 32 B over $CHANNELS channels at $RATE/s, $CHANNELS subscribers"
for size in 100 0; do
  port=$(free_port)
  SERVER_CMD=("$THRONG_BIN" serve --listen "127.0.0.1:$port" --stats-interval 0 --history-size "$size")
  "${SERVER_CMD[@]}" >"$WORK/server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 50); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  before=$(rss_kib "$SERVER_PID")
  "$THRONG_BIN" bench push --url "ws://127.0.0.1:$port" --conns "$CHANNELS" --channels "$CHANNELS" \
    --publish-rate "$RATE" --duration "${duration}s" --size 32 --rate 5000 \
    --source-ips 127.0.0.2-127.0.0.254 --json >"$WORK/push.json" 2>"$WORK/push.err"
  sleep 1
  after=$(rss_kib "$SERVER_PID")
  kept=$(curl -fs "http://127.0.0.1:$port/api/channels/bench-0" | python3 -c 'import json,sys; print(json.load(sys.stdin)["history_len"])')
  python3 - "$WORK/push.json" "$size" "$before" "$after" "$kept" "$WORK/run-$size.json" <<'PY' | tee -a "$WORK/printed.txt"
import json, sys
bench = json.load(open(sys.argv[1]))
d = bench["push"]
size, before, after, kept = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
print(f"--history-size {size:>3}: published {d['published']}, delivered {d['delivered']}, lost {d['lost']}, "
      f"dup {d['duplicated']}, ooo {d['out_of_order']}; channel bench-0 keeps {kept}; "
      f"server RSS {before} -> {after} KiB ({after / 1024:.1f} MiB)")
json.dump({"history_size": int(size), "published": d["published"], "delivered": d["delivered"],
           "lost": d["lost"], "duplicated": d["duplicated"], "out_of_order": d["out_of_order"],
           "bench_0_history_len": int(kept), "server_rss_before_kib": before, "server_rss_after_kib": after,
           "bench": bench}, open(sys.argv[6], "w"))
PY
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
  printf '%s\n' "${SERVER_CMD[*]}" >"$WORK/serve-$size.cmd"
done

# The raw file: the printed lines' figures, with where they came from.
mkdir -p "$RESULTS_DIR"
OUT_JSON=$RESULTS_DIR/history-$STAMP.json
OUT_MD=$RESULTS_DIR/history-$STAMP.md
jq -n --argjson provenance "$PROVENANCE" --arg version "$("$THRONG_BIN" --version 2>/dev/null || true)" \
  --arg bin "$THRONG_BIN" --argjson messages "$MESSAGES" --argjson channels "$CHANNELS" --argjson rate "$RATE" \
  --argjson duration "$duration" --slurpfile runs <(cat "$WORK"/run-100.json "$WORK"/run-0.json) \
  --arg serve100 "$(cat "$WORK/serve-100.cmd")" --arg serve0 "$(cat "$WORK/serve-0.cmd")" \
  '{provenance: $provenance, binary: {path: $bin, version: $version},
    settings: {messages: $messages, channels: $channels, subscribers: $channels, publish_rate: $rate,
               message_size: 32, duration_secs: $duration, connect_rate: 5000, source_ips: "127.0.0.2-127.0.0.254",
               history_sizes: [100, 0], serve_commands: {"100": $serve100, "0": $serve0}},
    runs: $runs}' >"$OUT_JSON"
{ jq -r '"# history memory (bench/history.sh)\n\n- machine: \(.machine.cores) cores (\(.machine.cpu_model)), \(.machine.mem_gib) GiB, kernel \(.machine.kernel); \(.date)"' <<<"$PROVENANCE"
  provenance_md; echo; sed 's/^/    /' "$WORK/printed.txt"; } >"$OUT_MD"
echo "wrote $OUT_JSON" >&2
