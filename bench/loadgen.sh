#!/usr/bin/env bash
# Load-generator benchmark: how much echo load one process of `throng bench` drives,
# and at what CPU cost to itself, next to a peer load generator (bench/clients/wsload,
# a Go gorilla/websocket client) -- against throng and against the Go gorilla echo
# server (bench/peers/gorilla-echo), in the same run on the same machine.
#
# For each (server, generator): a fresh server on a free port, then one generator
# process with --conns connections (32-byte text, one message in flight per
# connection) for --duration. Recorded: messages/s, the generator's CPU
# (utime+stime) per message, and the server's CPU per message (its utime+stime over
# the whole generator run, divided by the messages echoed).
#
# Keeps the run in bench/results/loadgen-STAMP.json (UTC stamp: the provenance --
# commit, dirty tree, machine, command line --, the binary, the settings, each row)
# and the printed table in loadgen-STAMP.md.
#
# Usage: bench/loadgen.sh [--conns 1000] [--duration 10s] [--rounds 2]
# Env:   THRONG_BIN (default <repo>/target/release/throng)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$BENCH_DIR/lib.sh"   # provenance_json
REPO_DIR=$(dirname "$BENCH_DIR")
RESULTS_DIR=$BENCH_DIR/results
THRONG_BIN=${THRONG_BIN:-$REPO_DIR/target/release/throng}
CONNS=1000
DURATION=10s
ROUNDS=2
SOURCE_IPS=127.0.0.2-127.0.0.254
while [ $# -gt 0 ]; do
  case "$1" in
    --conns) CONNS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

[ -x "$THRONG_BIN" ] || (cd "$REPO_DIR" && cargo build --release)
WSLOAD=$BENCH_DIR/clients/wsload/wsload
GORILLA=$BENCH_DIR/peers/gorilla-echo/gorilla-echo
[ -x "$WSLOAD" ] || (cd "$BENCH_DIR/clients/wsload" && go build -o wsload .)
[ -x "$GORILLA" ] || (cd "$BENCH_DIR/peers/gorilla-echo" && go build -o gorilla-echo .)

CLK_TCK=$(getconf CLK_TCK)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "server on port $1 did not start" >&2; return 1
}

start_server() { # name port -> pid on stdout
  case "$1" in
    throng) "$THRONG_BIN" serve --listen "127.0.0.1:$2" --threads 2 --stats-interval 0 >/dev/null 2>&1 & ;;
    gorilla) "$GORILLA" -addr "127.0.0.1:$2" >/dev/null 2>&1 & ;;
  esac
  echo $!
}

run_generator() { # gen port -> "msgs msgs_per_sec client_cpu_s"
  local url="ws://127.0.0.1:$2/echo"
  case "$1" in
    throng-bench)
      "$THRONG_BIN" bench echo --url "$url" --conns "$CONNS" --duration "$DURATION" \
        --source-ips "$SOURCE_IPS" --rate 5000 --interval 0 --json 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["messages_total"], d["throughput_msgs_per_sec"], d["client_cpu_secs"])'
      ;;
    wsload)
      "$WSLOAD" -mode echo -url "$url" -conns "$CONNS" -duration "$DURATION" -warmup 0s \
        -source-ips "$SOURCE_IPS" -rate 5000 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["messages"], d["msgs_per_sec"], d["client_cpu_seconds"])'
      ;;
  esac
}

PROVENANCE=$(provenance_json)
STAMP=$(date -u +%Y%m%d-%H%M%S)
WORK=$(mktemp -d /tmp/throng-loadgen.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
: >"$WORK/rows.jsonl"
run_all() {
echo "# load generators: echo, $CONNS connections, 32 B, $DURATION, $ROUNDS round(s)"
echo "- machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), kernel $(uname -r), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo
echo "| server | generator | round | msgs/s | generator CPU µs/msg | server CPU µs/msg |"
echo "|---|---|---:|---:|---:|---:|"
for round in $(seq "$ROUNDS"); do
  for server in throng gorilla; do
    for gen in throng-bench wsload; do
      port=$(free_port)
      pid=$(start_server "$server" "$port")
      wait_port "$port"
      before=$(cpu_ticks "$pid")
      read -r msgs rate client_cpu < <(run_generator "$gen" "$port")
      after=$(cpu_ticks "$pid")
      kill "$pid"; wait "$pid" 2>/dev/null || true
      python3 - "$server" "$gen" "$round" "$msgs" "$rate" "$client_cpu" "$before" "$after" "$CLK_TCK" "$WORK/rows.jsonl" <<'PY'
import json, sys
server, gen, rnd, msgs, rate, ccpu, before, after, tck, rows = sys.argv[1:]
messages = int(float(msgs))
msgs = max(messages, 1)
server_cpu = (int(after) - int(before)) / int(tck)
print(f"| {server} | {gen} | {rnd} | {float(rate):.0f} | {float(ccpu) * 1e6 / msgs:.2f} | {server_cpu * 1e6 / msgs:.2f} |")
with open(rows, "a") as f:
    f.write(json.dumps({"server": server, "generator": gen, "round": int(rnd), "messages": messages,
                        "msgs_per_sec": float(rate), "generator_cpu_secs": float(ccpu), "server_cpu_secs": server_cpu,
                        "generator_cpu_us_per_msg": float(ccpu) * 1e6 / msgs,
                        "server_cpu_us_per_msg": server_cpu * 1e6 / msgs}) + "\n")
PY
    done
  done
done
}
run_all | tee "$WORK/printed.txt"

mkdir -p "$RESULTS_DIR"
OUT_JSON=$RESULTS_DIR/loadgen-$STAMP.json
jq -n --argjson provenance "$PROVENANCE" --arg bin "$THRONG_BIN" --arg version "$("$THRONG_BIN" --version 2>/dev/null || true)" \
  --argjson conns "$CONNS" --arg duration "$DURATION" --argjson rounds "$ROUNDS" --arg src "$SOURCE_IPS" \
  --slurpfile rows "$WORK/rows.jsonl" \
  '{provenance: $provenance, binary: {path: $bin, version: $version},
    settings: {conns: $conns, duration: $duration, rounds: $rounds, source_ips: $src, message_size: 32,
               servers: ["throng (--threads 2)", "gorilla-echo"], generators: ["throng bench echo", "wsload"]},
    rows: $rows}' >"$OUT_JSON"
{ sed -n 1p "$WORK/printed.txt"; echo; provenance_md; sed -n '2,$p' "$WORK/printed.txt"; } >"${OUT_JSON%.json}.md"
echo "wrote $OUT_JSON" >&2
