#!/usr/bin/env bash
# Fan-out through Redis against the memory broker, same run (issue 11): one throng
# node with --broker memory, then two throng nodes on one redis-server (Debian's,
# started here on a free port with no persistence, stopped by pid), subscribed per
# channel (redis) and by pattern (redis-pattern, --redis-subscribe pattern), each a
# fresh process per scenario; subscribers spread over both nodes (--ports), the
# publisher on the first node, clients on the same machine, sources 127.0.0.2-254:
#   (A) fan-out: --subs subscribers of one channel, --publish-rate msg/s;
#       deliveries/s, publish-to-delivery p50/p99, lost, CPU per delivery of
#       throng (all nodes) and of redis-server.
#   (B) many channels: --channels-b channels with one subscriber each,
#       --publish-rate-b msg/s over them (each publish one Redis round trip);
#       the same figures, and redis-server CPU per 10,000 messages.
# Every node runs --threads 1. Prints the machine line and a markdown table; raw
# JSON goes to bench/results/cluster-<date>.json (and the table to .md).
#
# --nodes N runs N redis nodes instead of two; --brokers picks the rows.
# Usage: bench/cluster.sh [--scenarios A,B] [--subs 10000] [--publish-rate 10]
#                         [--nodes 2] [--brokers memory,redis,redis-pattern]
#                         [--channels-b 10000] [--publish-rate-b 10000]
#                         [--duration 10s] [--rate 3000] [--results-dir DIR]
# Installs redis-server (apt-get) when missing; builds throng when missing.
# Env:   THRONG_BIN (default <repo>/target/release/throng: servers and load client)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# REPO_DIR, THRONG_BIN; options, logging, servers, machine, report helpers
. "$BENCH_DIR/lib.sh"

SCENARIOS=A,B
RESULTS_DIR=$BENCH_DIR/results
SUBS=10000
PUBLISH_RATE=10
CHANNELS_B=10000
PUBLISH_RATE_B=10000
DURATION=10s
RATE=3000
SOURCE_IPS=127.0.0.2-127.0.0.254
NODES=2
BROKERS=memory,redis,redis-pattern

parse_options "--scenarios=SCENARIOS --subs=SUBS --publish-rate=PUBLISH_RATE --channels-b=CHANNELS_B
  --publish-rate-b=PUBLISH_RATE_B --duration=DURATION --rate=RATE --results-dir=RESULTS_DIR
  --nodes=NODES --brokers=BROKERS" "$@"
check_names broker "$BROKERS" memory redis redis-pattern
check_names scenario "$SCENARIOS" A B
wantsc() { case ",$SCENARIOS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
need jq
command -v redis-server >/dev/null 2>&1 || install_packages redis-server

begin_run cluster rm
if [ ! -x "$THRONG_BIN" ] && [ "$THRONG_BIN" = "$REPO_DIR/target/release/throng" ]; then
  need cargo
  log "cargo build --release (throng)"
  (cd "$REPO_DIR" && cargo build --release --quiet)
fi
copy_throng throng "$THRONG_BIN"
describe_machine
QUIET_BUDGET=30; QUIET_WAIT_MAX=5; QUIET_WAITED=0
cpu_ticks() { local t=0 p; for p in "$@"; do t=$(( t + $(awk '{print $14 + $15}' "/proc/$p/stat") )); done; echo "$t"; }

PIDS=()
cleanup_all() { local p; for p in "${PIDS[@]+"${PIDS[@]}"}"; do kill "$p" 2>/dev/null || true; done; }
trap 'cleanup_all; cleanup' EXIT

# setup BROKER: starts redis (for redis*) and the nodes; sets NODE_PORTS, NODE_PIDS, REDIS_PID
setup() {
  NODE_PORTS=(); NODE_PIDS=(); REDIS_PID=
  local broker=memory nodes=1 i port mode=channels
  [ "$1" = redis-pattern ] && mode=pattern
  if [ "$1" != memory ]; then
    local rport; rport=$(free_port)
    redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
      >"$WORK/redis.log" 2>&1 &
    REDIS_PID=$!; PIDS+=("$REDIS_PID")
    for i in $(seq 1 50); do server_ready "$rport" && break; sleep 0.1; done
    broker=redis://127.0.0.1:$rport; nodes=$NODES
  fi
  # Consecutive ports, so --ports spreads the subscribers over the nodes.
  local base; base=$(free_port)
  for i in $(seq 0 $((nodes - 1))); do
    port=$((base + i))
    "$WORK/throng" serve --listen "127.0.0.1:$port" --threads 1 --stats-interval 0 --broker "$broker" \
      --redis-subscribe "$mode" \
      >"$WORK/node-$i.log" 2>&1 &
    NODE_PIDS+=($!); PIDS+=($!); NODE_PORTS+=("$port")
  done
  for port in "${NODE_PORTS[@]}"; do
    for i in $(seq 1 100); do
      curl -sf -m 1 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1
    done
  done
}
teardown() {
  local p
  for p in "${NODE_PIDS[@]}" ${REDIS_PID:+"$REDIS_PID"}; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

run() { # BROKER SCENARIO
  local broker=$1 sc=$2 out=$WORK/$1-$2.json
  wait_quiet
  setup "$broker"
  local first=${NODE_PORTS[0]} last=${NODE_PORTS[-1]} conns=$SUBS
  [ "$sc" = B ] && conns=$CHANNELS_B
  local args=(bench push --url "ws://127.0.0.1:$first" --ports "$first-$last" --conns "$conns" --rate "$RATE"
              --duration "$DURATION" --source-ips "$SOURCE_IPS" --interval 0 --allow-failures --json
              --publish-url "http://127.0.0.1:$first" --channel-prefix "c$sc-")
  case "$sc" in
    A) args+=(--channels 1 --publish-rate "$PUBLISH_RATE") ;;
    B) args+=(--channels "$CHANNELS_B" --publish-rate "$PUBLISH_RATE_B" --publishers 16) ;;
  esac
  local t0 r0 t1 r1
  t0=$(cpu_ticks "${NODE_PIDS[@]}"); r0=0; [ -n "$REDIS_PID" ] && r0=$(cpu_ticks "$REDIS_PID")
  "$WORK/throng" "${args[@]}" >"$out" 2>>"$WORK/bench.log" || true
  t1=$(cpu_ticks "${NODE_PIDS[@]}"); r1=0; [ -n "$REDIS_PID" ] && r1=$(cpu_ticks "$REDIS_PID")
  teardown
  jq -e 'type == "object"' "$out" >/dev/null 2>&1 || { echo '{"error":"no report (see bench.log)"}' >"$out"; return; }
  jq --argjson t "$((t1 - t0))" --argjson r "$((r1 - r0))" --argjson clk "$CLK_TCK" --arg cmd "throng ${args[*]}" '
    (.push.delivered // 0) as $d | (.push.published // 0) as $p |
    . + {command: $cmd, throng_cpu_secs: ($t / $clk), redis_cpu_secs: ($r / $clk),
         throng_cpu_us_per_delivery: (if $d == 0 then null else $t / $clk * 1e6 / $d end),
         redis_cpu_us_per_delivery: (if $d == 0 then null else $r / $clk * 1e6 / $d end),
         redis_cpu_secs_per_10k_messages: (if $p == 0 then null else $r / $clk * 10000 / $p end)}' \
    "$out" >"$out.tmp" && mv "$out.tmp" "$out"
}

for sc in A B; do
  wantsc "$sc" || continue
  for broker in ${BROKERS//,/ }; do
    log "$broker: ($sc)"
    run "$broker" "$sc"
    log "  -> $(jq -c '{published: .push.published, delivered: .push.delivered, lost: .push.lost, p99: .latency.p99_us, throng_us: .throng_cpu_us_per_delivery, redis_us: .redis_cpu_us_per_delivery, error}' "$WORK/$broker-$sc.json")"
  done
done

report_paths cluster
jq -n --argjson provenance "$PROVENANCE" --argjson machine "$(machine_json nofile_hard)" --arg sc "$SCENARIOS" --argjson subs "$SUBS" \
  --argjson pr "$PUBLISH_RATE" --argjson chb "$CHANNELS_B" --argjson prb "$PUBLISH_RATE_B" --arg dur "$DURATION" \
  --argjson rs "$RUN_SECONDS" --arg redis "$(redis-server --version)" \
  '{provenance:$provenance, machine:$machine, redis: $redis, params: {scenarios: $sc, subs: $subs, publish_rate: $pr, channels_b: $chb,
    publish_rate_b: $prb, duration: $dur}, run_seconds: $rs, runs: {}}' >"$OUT_JSON"
for f in "$WORK"/*-[AB].json; do
  key=$(basename "$f" .json)
  jq --arg k "$key" --slurpfile r "$f" '.runs[$k] = $r[0]' "$OUT_JSON" >"$OUT_JSON.tmp" && mv "$OUT_JSON.tmp" "$OUT_JSON"
done

render() {
  echo "# Fan-out through Redis against the memory broker"
  echo
  echo "- machine: $NPROC cores ($MODEL), $MEM RAM, kernel $KERNEL; $(throng_version throng); $(redis-server --version | cut -d' ' -f1-3)"
  provenance_md
  echo "- memory: one node; redis: $NODES nodes on one redis-server (redis: subscribed per channel; redis-pattern: PSUBSCRIBE), subscribers spread over both, publisher on the first; --threads 1 each"
  echo "- A: $SUBS subscribers of 1 channel, $PUBLISH_RATE msg/s; B: $CHANNELS_B channels x 1 subscriber, $PUBLISH_RATE_B msg/s; $DURATION each"
  echo
  echo "| run | published | deliveries/s | p50 ms | p99 ms | lost | throng CPU µs/delivery | redis CPU µs/delivery | redis CPU s per 10k msgs |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  jq -r '.runs | to_entries[] | .key as $k | .value |
    if .error then "| \($k) | \(.error) | | | | | | | |" else
    "| \($k) | \(.push.published) | \(.throughput_msgs_per_sec | floor) | \(.latency.median_us / 1000 * 100 | round / 100) | \(.latency.p99_us / 1000 * 100 | round / 100) | \(.push.lost) | \(.throng_cpu_us_per_delivery * 100 | round / 100) | \(.redis_cpu_us_per_delivery * 100 | round / 100) | \(.redis_cpu_secs_per_10k_messages * 1000 | round / 1000) |" end' "$OUT_JSON"
  echo
  echo "Raw: ${OUT_JSON#"$REPO_DIR"/}"
}
render | tee "$OUT_MD"
