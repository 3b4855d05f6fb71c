#!/usr/bin/env bash
# The seed documents' experiments at this machine's scale, with throng on both sides
# (`throng serve` and `throng bench`). Each experiment starts a fresh server on its
# own ports, runs one bench, prints the bench's report and the server's peak RSS and
# CPU, and stops the server by pid.
#
#   oatpp   echo over 100 ports with the "Hello from oatpp!" prefix, 10,000 conns
#   10m     idle subscribers of one channel over 100 ports, pings every 10 s, 19,000 conns
#   chat    one chat room of 500, 800 and 1,000 users, 80% senders, 1 KiB every 1 s
#   push    10,000 subscribers of one channel, 10 messages/s published over HTTP
#
# Keeps the run in bench/results/seeds-STAMP.json (UTC stamp): the provenance
# (commit, dirty tree, machine, command line), the binary, the settings, each
# experiment's server peak RSS and CPU and everything printed; the printed output
# also in seeds-STAMP.md.
#
# Usage: bench/seeds.sh [oatpp] [10m] [chat] [push]   (default: all; ~5 minutes)
# Env:   THRONG_BIN (default <repo>/target/release/throng), DURATION (default 30s)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$BENCH_DIR/lib.sh"   # provenance_json
REPO_DIR=$(dirname "$BENCH_DIR")
RESULTS_DIR=$BENCH_DIR/results
PROVENANCE=$(provenance_json)
STAMP=$(date -u +%Y%m%d-%H%M%S)
WORK=$(mktemp -d /tmp/throng-seeds.XXXXXX)
EXPERIMENT=
THRONG=${THRONG_BIN:-$REPO_DIR/target/release/throng}
DURATION=${DURATION:-30s}
SOURCES=127.0.0.2-127.0.0.254
CLK_TCK=$(getconf CLK_TCK)
[ -x "$THRONG" ] || (cd "$REPO_DIR" && cargo build --release)
experiments=("$@")
[ ${#experiments[@]} -gt 0 ] || experiments=(oatpp 10m chat push)

free_base() { # a free run of $1 ports
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(500):
    base = random.randint(20000, 60000 - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket(); socks.append(s); s.bind(("127.0.0.1", p))
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
PY
}

SERVER_PID=
start_server() { # first last flags...
  local first=$1 last=$2; shift 2
  "$THRONG" serve --listen "127.0.0.1:$first-$last" --stats-interval 0 "$@" >/tmp/throng-seed-server.log 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$first") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "server did not start:"; cat /tmp/throng-seed-server.log; exit 1
}
stop_server() {
  local ticks hwm
  ticks=$(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$SERVER_PID/status")
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
  echo "server: peak RSS ${hwm} kB, CPU $(python3 -c "print(round($ticks / $CLK_TCK, 2))") s utime+stime"
  jq -nc --arg e "$EXPERIMENT" --argjson hwm "$hwm" --argjson ticks "$ticks" --argjson tck "$CLK_TCK" \
    '{experiment: $e, server_peak_rss_kib: $hwm, server_cpu_secs: ($ticks / $tck)}' >>"$WORK/servers.jsonl"
}

# Everything printed goes to the terminal and to $WORK/printed.txt (for the raw file);
# run_all runs in the pipeline's subshell, so it sets its own trap for the server.
run_all() {
trap '[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true' EXIT
echo "# seeds at this machine's scale: $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
for experiment in "${experiments[@]}"; do
  case "$experiment" in
    oatpp)
      EXPERIMENT=oatpp; base=$(free_base 100); last=$((base + 99))
      echo; echo "## oatpp: echo with prefix over ports $base-$last, 10,000 connections"
      echo "\$ throng serve --listen 127.0.0.1:$base-$last --echo-prefix 'Hello from oatpp!'"
      echo "\$ throng bench echo --url ws://127.0.0.1:$base/echo --ports $base-$last --conns 10000 --rate 5000 --source-ips $SOURCES --duration $DURATION"
      start_server "$base" "$last" --echo-prefix "Hello from oatpp!"
      "$THRONG" bench echo --url "ws://127.0.0.1:$base/echo" --ports "$base-$last" --conns 10000 \
        --rate 5000 --source-ips "$SOURCES" --duration "$DURATION" --interval 10s || true
      stop_server
      ;;
    10m)
      EXPERIMENT=10m; base=$(free_base 100); last=$((base + 99))
      echo; echo "## 10M seed: idle subscribers of one channel over ports $base-$last, pings every 10 s, 19,000 connections"
      echo "\$ throng serve --listen 127.0.0.1:$base-$last --ping-interval 10s"
      echo "\$ throng bench idle --url ws://127.0.0.1:$base/ws/news --ports $base-$last --conns 19000 --rate 5000 --source-ips $SOURCES --duration $DURATION"
      start_server "$base" "$last" --ping-interval 10s
      "$THRONG" bench idle --url "ws://127.0.0.1:$base/ws/news" --ports "$base-$last" --conns 19000 \
        --rate 5000 --source-ips "$SOURCES" --duration "$DURATION" --interval 10s || true
      stop_server
      ;;
    chat)
      for users in 500 800 1000; do
        EXPERIMENT=chat-$users; base=$(free_base 1)
        echo; echo "## chat seed: one room of $users users, 80% send 1 KiB every second"
        echo "\$ throng bench chat --url ws://127.0.0.1:$base/ --conns $users --room-size $users --senders 0.8 --size 1024 --send-interval 1s --duration $DURATION"
        start_server "$base" "$base"
        "$THRONG" bench chat --url "ws://127.0.0.1:$base/" --conns "$users" --room-size "$users" \
          --senders 0.8 --size 1024 --send-interval 1s --duration "$DURATION" --interval 10s || true
        stop_server
      done
      ;;
    push)
      EXPERIMENT=push; base=$(free_base 1)
      echo; echo "## push fan-out: 10,000 subscribers of one channel, 10 messages/s"
      echo "\$ throng bench push --url ws://127.0.0.1:$base/ --conns 10000 --channels 1 --publish-rate 10 --rate 5000 --source-ips $SOURCES --duration $DURATION"
      start_server "$base" "$base"
      "$THRONG" bench push --url "ws://127.0.0.1:$base/" --conns 10000 --channels 1 --publish-rate 10 \
        --rate 5000 --source-ips "$SOURCES" --duration "$DURATION" --interval 10s || true
      stop_server
      ;;
    *) echo "unknown experiment $experiment (oatpp, 10m, chat, push)" >&2; exit 2 ;;
  esac
done
}
for experiment in "${experiments[@]}"; do
  case "$experiment" in oatpp|10m|chat|push) ;; *) echo "unknown experiment $experiment (oatpp, 10m, chat, push)" >&2; exit 2 ;; esac
done
trap 'rm -rf "$WORK"' EXIT
: >"$WORK/servers.jsonl"
run_all | tee "$WORK/printed.txt"

mkdir -p "$RESULTS_DIR"
OUT_JSON=$RESULTS_DIR/seeds-$STAMP.json
jq -n --argjson provenance "$PROVENANCE" --arg bin "$THRONG" --arg version "$("$THRONG" --version 2>/dev/null || true)" \
  --arg duration "$DURATION" --arg sources "$SOURCES" --args \
  --slurpfile servers "$WORK/servers.jsonl" --rawfile printed "$WORK/printed.txt" \
  '{provenance: $provenance, binary: {path: $bin, version: $version},
    settings: {experiments: $ARGS.positional, duration: $duration, source_ips: $sources},
    servers: $servers, printed: $printed}' "${experiments[@]}" >"$OUT_JSON"
{ jq -r '"# seeds (bench/seeds.sh)\n\n- machine: \(.machine.cores) cores (\(.machine.cpu_model)), \(.machine.mem_gib) GiB, kernel \(.machine.kernel); \(.date)"' <<<"$PROVENANCE"
  provenance_md; echo; sed 's/^/    /' "$WORK/printed.txt"; } >"${OUT_JSON%.json}.md"
echo "wrote $OUT_JSON" >&2
