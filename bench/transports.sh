#!/usr/bin/env bash
# One throng, three transports (issue 10): the same push load over WebSocket, SSE
# and long-polling, measured by `throng bench push --transport T` with its loss,
# duplicate and order checks, a fresh server process on a free loopback port per
# run, clients on the same machine with sources over 127.0.0.2-127.0.0.254:
#   (F) fan-out: --subs subscribers of one channel, --publish-rate msg/s for
#       --duration; deliveries/s, latency p50/p99 (publish -> delivery), lost,
#       server CPU (utime+stime, /proc) per delivery over the whole run (the
#       subscribers' connects included; a long-poll reconnects after every answer).
#   (R) reconnects: --subs subscribers over --channels-r channels, --publish-rate-r
#       msg/s in total; a --reconnect fraction of them drops its connection every
#       2 s and resumes (ws since=, sse Last-Event-ID, poll since=): reconnects,
#       lost, duplicated, gaps the server reported.
# The server runs --threads 1 (one core for it, one for the client and publisher).
# Prints the machine line and a markdown table; raw JSON goes to
# bench/results/transports-<date>.json (and the table to transports-<date>.md).
#
# Usage: bench/transports.sh [--transports ws,sse,poll] [--scenarios F,R]
#                            [--subs 10000] [--publish-rate 10] [--channels-r 100]
#                            [--publish-rate-r 100] [--reconnect 0.1] [--duration 10s]
#                            [--rate 3000] [--results-dir DIR]
# Env:   THRONG_BIN (default <repo>/target/release/throng: server and load client)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# REPO_DIR, THRONG_BIN; options, logging, servers, machine, report helpers
. "$BENCH_DIR/lib.sh"

TRANSPORTS=ws,sse,poll
SCENARIOS=F,R
RESULTS_DIR=$BENCH_DIR/results
SUBS=10000
PUBLISH_RATE=10
CHANNELS_R=100
PUBLISH_RATE_R=100
RECONNECT=0.1
DURATION=10s
RATE=3000
SOURCE_IPS=127.0.0.2-127.0.0.254

parse_options "--transports=TRANSPORTS --scenarios=SCENARIOS --subs=SUBS --publish-rate=PUBLISH_RATE
  --channels-r=CHANNELS_R --publish-rate-r=PUBLISH_RATE_R --reconnect=RECONNECT --duration=DURATION
  --rate=RATE --results-dir=RESULTS_DIR" "$@"
check_names transport "$TRANSPORTS" ws sse poll
check_names scenario "$SCENARIOS" F R
wantsc() { case ",$SCENARIOS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
need jq

begin_run transports rm
if [ ! -x "$THRONG_BIN" ] && [ "$THRONG_BIN" = "$REPO_DIR/target/release/throng" ]; then
  need cargo
  log "cargo build --release (throng)"
  (cd "$REPO_DIR" && cargo build --release --quiet)
fi
copy_throng throng "$THRONG_BIN"   # a private copy: the real one may be rebuilt meanwhile
describe_machine
QUIET_BUDGET=30; QUIET_WAIT_MAX=5; QUIET_WAITED=0

server_cmd() {
  CMD=("$WORK/throng" serve --listen "127.0.0.1:$2" --threads 1 --stats-interval 0)
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# run TRANSPORT SCENARIO: one bench run against a fresh server -> $WORK/T-S.json
run() {
  local t=$1 sc=$2 out=$WORK/$1-$2.json scheme=http
  [ "$t" = ws ] && scheme=ws
  local args=(bench push --transport "$t" --url "$scheme://127.0.0.1:PORT" --conns "$SUBS" --rate "$RATE"
              --duration "$DURATION" --source-ips "$SOURCE_IPS" --interval 0 --allow-failures --json)
  case "$sc" in
    F) args+=(--channels 1 --publish-rate "$PUBLISH_RATE") ;;
    R) args+=(--channels "$CHANNELS_R" --publish-rate "$PUBLISH_RATE_R" --reconnect "$RECONNECT") ;;
  esac
  wait_quiet
  if ! start_server throng "$t-$sc"; then echo '{"error":"server did not start"}' >"$out"; return; fi
  args=("${args[@]/PORT/$PORT}")
  local c0 c1
  c0=$(cpu_ticks "$SERVER_PID")
  "$WORK/throng" "${args[@]}" >"$out" 2>>"$WORK/bench.log" || true
  c1=$(cpu_ticks "$SERVER_PID")
  stop_server
  jq -e 'type == "object"' "$out" >/dev/null 2>&1 || { echo '{"error":"no report (see bench.log)"}' >"$out"; return; }
  jq --argjson ticks "$((c1 - c0))" --argjson clk "$CLK_TCK" --arg cmd "throng ${args[*]}" '
    . + {command: $cmd, server_cpu_secs: ($ticks / $clk),
         server_cpu_us_per_delivery: (if (.push.delivered // 0) == 0 then null
                                      else $ticks / $clk * 1e6 / .push.delivered end)}' \
    "$out" >"$out.tmp" && mv "$out.tmp" "$out"
}

IFS=, read -r -a TS <<<"$TRANSPORTS"
for sc in F R; do
  wantsc "$sc" || continue
  for t in "${TS[@]}"; do
    log "$t: ($sc) $SUBS subscribers"
    run "$t" "$sc"
    log "  -> $(jq -c '{delivered: .push.delivered, lost: .push.lost, dup: .push.duplicated, reconnects: .push.reconnects, p99: .latency.p99_us, cpu_us: .server_cpu_us_per_delivery, error}' "$WORK/$t-$sc.json")"
  done
done

report_paths transports
jq -n --argjson provenance "$PROVENANCE" --argjson machine "$(machine_json nofile_hard)" --arg tr "$TRANSPORTS" --arg sc "$SCENARIOS" \
  --argjson subs "$SUBS" --argjson pr "$PUBLISH_RATE" --argjson chr "$CHANNELS_R" --argjson prr "$PUBLISH_RATE_R" \
  --arg rec "$RECONNECT" --arg dur "$DURATION" --argjson rs "$RUN_SECONDS" \
  '{provenance:$provenance, machine:$machine, params: {transports: $tr, scenarios: $sc, subs: $subs, publish_rate: $pr,
    channels_r: $chr, publish_rate_r: $prr, reconnect: $rec, duration: $dur}, run_seconds: $rs, runs: {}}' >"$OUT_JSON"
for f in "$WORK"/*-[FR].json; do
  key=$(basename "$f" .json)
  jq --arg k "$key" --slurpfile r "$f" '.runs[$k] = $r[0]' "$OUT_JSON" >"$OUT_JSON.tmp" && mv "$OUT_JSON.tmp" "$OUT_JSON"
done

render() {
  echo "# throng push over ws, sse and poll"
  echo
  echo "- machine: $NPROC cores ($MODEL), $MEM RAM, kernel $KERNEL; $(throng_version throng); server --threads 1"
  provenance_md
  echo "- F: $SUBS subscribers of 1 channel, $PUBLISH_RATE msg/s; R: $SUBS subscribers over $CHANNELS_R channels,"
  echo "  $PUBLISH_RATE_R msg/s, --reconnect $RECONNECT every 2 s; each for $DURATION"
  echo
  echo "| run | deliveries/s | p50 ms | p99 ms | lost | duplicated | reconnects | server gaps | server CPU µs/delivery (whole run) |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  jq -r '.runs | to_entries[] | .key as $k | .value |
    if .error then "| \($k) | \(.error) | | | | | | | |" else
    "| \($k) | \(.throughput_msgs_per_sec | floor) | \(.latency.median_us / 1000 * 10 | round / 10) | \(.latency.p99_us / 1000 * 10 | round / 10) | \(.push.lost) | \(.push.duplicated) | \(.push.reconnects) | \(.push.server_reported_gaps) | \(.server_cpu_us_per_delivery * 100 | round / 100) |" end' "$OUT_JSON"
  echo
  echo "Raw: ${OUT_JSON#"$REPO_DIR"/}"
}
render | tee "$OUT_MD"
