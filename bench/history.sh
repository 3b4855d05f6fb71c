#!/usr/bin/env bash
# History memory: server RSS after one million 32-byte messages were published over
# 10,000 channels (100 per channel), with --history-size 100 (every message kept) and
# with --history-size 0 (none kept), in the same run. 10,000 subscribers (one per
# channel, `throng bench push`) check that every message was delivered in order.
# Prints one line per setting; the difference is what the kept messages cost.
#
# Usage: bench/history.sh [--messages 1000000] [--channels 10000] [--rate 25000]
# Env:   THRONG_BIN (default <repo>/target/release/throng)
set -euo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
THRONG_BIN=${THRONG_BIN:-$(dirname "$BENCH_DIR")/target/release/throng}
MESSAGES=1000000
CHANNELS=10000
RATE=25000
while [ $# -gt 0 ]; do
  case "$1" in
    --messages) MESSAGES=$2; shift 2 ;;
    --channels) CHANNELS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    *) echo "history.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rss_kib() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }
duration=$(( (MESSAGES + RATE - 1) / RATE ))
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo), $(uname -r); $(date -u +%FT%TZ)"
echo "$MESSAGES messages of 32 B over $CHANNELS channels at $RATE/s, $CHANNELS subscribers"
for size in 100 0; do
  port=$(free_port)
  "$THRONG_BIN" serve --listen "127.0.0.1:$port" --stats-interval 0 --history-size "$size" >"$WORK/server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 50); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  before=$(rss_kib "$SERVER_PID")
  "$THRONG_BIN" bench push --url "ws://127.0.0.1:$port" --conns "$CHANNELS" --channels "$CHANNELS" \
    --publish-rate "$RATE" --duration "${duration}s" --size 32 --rate 5000 \
    --source-ips 127.0.0.2-127.0.0.254 --json >"$WORK/push.json" 2>"$WORK/push.err"
  sleep 1
  after=$(rss_kib "$SERVER_PID")
  kept=$(curl -fs "http://127.0.0.1:$port/api/channels/bench-0" | python3 -c 'import json,sys; print(json.load(sys.stdin)["history_len"])')
  python3 - "$WORK/push.json" "$size" "$before" "$after" "$kept" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["push"]
size, before, after, kept = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
print(f"--history-size {size:>3}: published {d['published']}, delivered {d['delivered']}, lost {d['lost']}, "
      f"dup {d['duplicated']}, ooo {d['out_of_order']}; channel bench-0 keeps {kept}; "
      f"server RSS {before} -> {after} KiB ({after / 1024:.1f} MiB)")
PY
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
done
