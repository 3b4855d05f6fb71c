#!/usr/bin/env bash
# Publish rate on a Redis broker (groundwork for issue 46): throng (`serve --broker
# redis://...`, --history-size 100) against Centrifugo (Redis engine, history of 100 on
# channels without a namespace), each on its own fresh redis-server on a free port.
# bench/clients/pubload drives closed-loop HTTP publishes from --publishers concurrent
# publishers (each with its own keep-alive connection; publisher i on channel
# bench-(i % --channels)) for --duration seconds after one second of warm-up:
#   throng:     POST /api/publish/{channel}, Authorization: Bearer KEY
#   centrifugo: POST /api/publish {"channel":..,"data":..}, X-API-Key: KEY
# Reports per server: publishes/s, the answer's p50/p99, errors, redis-server CPU
# (utime+stime from /proc/PID/stat over the window) per publish, and the
# INFO commandstats calls and usec each Redis command gained over the window.
# Keeps the run in bench/results/publish_redis-STAMP.json (provenance from
# bench/provenance.py, versions, settings, pubload's JSON per server) and a table in
# publish_redis-STAMP.md.
#
# Usage: bench/publish_redis.sh [--servers throng,centrifugo] [--publishers 64]
#          [--duration 10] [--channels 64] [--size 64] [--out bench/results]
# throng runs with two I/O threads (lib.sh throng_cmd); Centrifugo with its default GOMAXPROCS.
# Env:   THRONG_BIN (default <repo>/target/release/throng)
# Builds pubload (go build) and Centrifugo (bench/peers/centrifugo/build.sh, Go module
# proxy) when missing; a peer that does not build is skipped and noted.
set -euo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$BENCH_DIR/lib.sh"

SERVERS=throng,centrifugo
PUBLISHERS=64
DURATION=10
CHANNELS=64
SIZE=64
RESULTS_DIR=$BENCH_DIR/results
parse_options "--servers=SERVERS --publishers=PUBLISHERS --duration=DURATION --channels=CHANNELS --size=SIZE --out=RESULTS_DIR" "$@"
check_names server "$SERVERS" throng centrifugo
need jq; need redis-server; need go

CENTRIFUGO_DIR=$BENCH_DIR/peers/centrifugo
PUBLOAD=$BENCH_DIR/clients/pubload/pubload
# The API key both servers are given (a throwaway: the servers listen on loopback only).
API_KEY=bench-publish-key

begin_run publish_redis rm
describe_machine
go_build "$BENCH_DIR/clients/pubload" pubload
copy_throngs
CENTRIFUGO_VERSION=
if want centrifugo; then
  log "build centrifugo (bench/peers/centrifugo/build.sh)"
  if "$CENTRIFUGO_DIR/build.sh" >/dev/null; then
    CENTRIFUGO_VERSION=$("$CENTRIFUGO_DIR/build.sh" --version)
  else
    SKIPPED+=("centrifugo: bench/peers/centrifugo/build.sh failed")
  fi
fi
select_servers

REDIS_PID=
REDIS_PORT=
stop_redis() {
  [ -n "$REDIS_PID" ] || return 0
  kill -TERM "$REDIS_PID" 2>/dev/null || true
  reap_pids "$REDIS_PID"
  wait "$REDIS_PID" 2>/dev/null || true
  REDIS_PID=
}
cleanup_all() { cleanup; if [ -n "${REDIS_PID:-}" ]; then kill -KILL "$REDIS_PID" 2>/dev/null || true; fi; }
trap cleanup_all EXIT
# start_redis TAG: a fresh redis-server (no persistence) on a free port, its own directory.
start_redis() {
  local dir=$WORK/redis-$1
  mkdir -p "$dir"
  REDIS_PORT=$(free_port) || { log "no free port for redis"; return 1; }
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --daemonize no >"$dir/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 1 50); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  log "redis-server not ready on :$REDIS_PORT"; return 1
}

# server_cmd NAME PORT (for lib.sh's start_server): the server on REDIS_PORT's Redis.
server_cmd() {
  case "$1" in
    throng)
      throng_cmd throng "$2" --broker "redis://127.0.0.1:$REDIS_PORT" --history-size 100 --api-key "$API_KEY" ;;
    centrifugo)
      # The v6 config keys (internal/configtypes of v6.9.1): engine.type/redis.address,
      # http_api.key, channel.without_namespace.history_size/history_ttl.
      jq -n --argjson port "$2" --arg redis "redis://127.0.0.1:$REDIS_PORT" --arg key "$API_KEY" \
        '{log: {level: "error"},
          http_server: {address: "127.0.0.1", port: $port},
          engine: {type: "redis", redis: {address: [$redis]}},
          http_api: {key: $key},
          channel: {without_namespace: {history_size: 100, history_ttl: "300s"}}}' >"$WORK/centrifugo.json"
      CMD=("$CENTRIFUGO_DIR/bin/centrifugo" --config "$WORK/centrifugo.json") ;;
  esac
}
server_version() {
  case "$1" in
    throng) echo "$(throng_version throng), --threads 2" ;;
    centrifugo) echo "$CENTRIFUGO_VERSION" ;;
  esac
}

echo '{"servers": []}' >"$WORK/all.json"
for name in "${RAN[@]}"; do
  log "$name: fresh redis-server"
  if ! start_redis "$name"; then SKIPPED+=("$name: redis-server did not start"); stop_redis; continue; fi
  if ! start_server "$name" run; then SKIPPED+=("$name: did not start"); stop_redis; continue; fi
  log "$name on :$PORT (redis :$REDIS_PORT): $PUBLISHERS publishers, ${DURATION}s"
  sleep 0.5
  if "$PUBLOAD" -api "$name" -url "http://127.0.0.1:$PORT" -key "$API_KEY" -publishers "$PUBLISHERS" \
      -channels "$CHANNELS" -size "$SIZE" -duration "${DURATION}s" \
      -redis-addr "127.0.0.1:$REDIS_PORT" -redis-pid "$REDIS_PID" >"$WORK/$name.json" 2>"$WORK/$name.err"; then
    jq --arg name "$name" --arg version "$(server_version "$name")" --arg cmd "${CMD[*]}" \
      --arg redis "$(redis-server --version)" --argjson clk "$CLK_TCK" \
      '{name: $name, version: $version, command: $cmd, redis: $redis, pubload: .}
       + {redis_cpu_us_per_publish: (if .redis_cpu_ticks != null and .published > 0
            then .redis_cpu_ticks * 1e6 / $clk / .published else null end)}' \
      "$WORK/$name.json" >"$WORK/$name.server.json"
    add_server "$WORK/$name.server.json"
  else
    SKIPPED+=("$name: pubload failed: $(tail -1 "$WORK/$name.err")")
  fi
  stop_server
  stop_redis
done

report_paths publish_redis
jq --argjson provenance "$PROVENANCE" --argjson machine "$(machine_json nofile_hard)" \
  --argjson skipped "$(skipped_json)" --argjson rs "$RUN_SECONDS" \
  --argjson publishers "$PUBLISHERS" --argjson duration "$DURATION" --argjson channels "$CHANNELS" \
  --argjson size "$SIZE" \
  '{bench: "publish_redis", provenance: $provenance, machine: $machine, run_seconds: $rs,
    settings: {publishers: $publishers, duration_secs: $duration, warmup_secs: 1, channels: $channels,
               message_size: $size, throng_threads: 2, history_size: 100,
               redis: "a fresh redis-server per server, --save \"\" --appendonly no"},
    skipped: $skipped} + .' "$WORK/all.json" >"$OUT_JSON"

{
  echo "# Publish rate on a Redis broker (bench/publish_redis.sh)"
  echo
  echo "- machine: $NPROC cores ($MODEL), $MEM RAM, kernel $KERNEL; load at start $LOADAVG_START"
  provenance_md
  echo "- $PUBLISHERS closed-loop HTTP publishers (keep-alive, bench/clients/pubload) over $CHANNELS channels, ${SIZE}-byte JSON messages, ${DURATION} s after 1 s warm-up; history 100 per channel; a fresh redis-server per server"
  jq -r '.servers[] | "- \(.name): \(.version); `\(.command)`"' "$OUT_JSON"
  print_skipped
  echo
  echo "Redis commands per publish: INFO commandstats deltas over the window divided by the publishes answered in it; a command a script (EVALSHA, FCALL) runs is counted on its own row and again inside the script's usec."
  echo
  echo "| server | publishes/s | p50 ms | p99 ms | errors | redis CPU µs/publish | redis commands per publish (calls, usec) |"
  echo "|---|---:|---:|---:|---:|---:|---|"
  jq -r "$JQ_DEFS"'
    .servers[] | .pubload as $p |
    ($p.redis_commandstats_delta // {} | to_entries | sort_by(-.value.usec) | map(select(.value.calls > 0)) |
      map("\(.key) \((.value.calls / ([$p.published, 1] | max)) | f2), \((.value.usec / ([$p.published, 1] | max)) | f2) µs") | join("; ")) as $cmds |
    "| \(.name) | \($p.publishes_per_s | f0) | \($p.latency_us.p50 / 1000 | f2) | \($p.latency_us.p99 / 1000 | f2) | \($p.errors) | \(.redis_cpu_us_per_publish | f1) | \($cmds) |"' "$OUT_JSON"
  echo
  jq -r "$JQ_DEFS"'ratio_table("throng ÷ peer, publishes/s:"; "- \(.p.name): \(r(.t.pubload.publishes_per_s; .p.pubload.publishes_per_s) | f2)x")' "$OUT_JSON"
} >"$OUT_MD"
cat "$OUT_MD"
log "wrote $OUT_JSON"
