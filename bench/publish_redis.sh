#!/usr/bin/env bash
# Publish rate on a Redis broker (issue 46): throng (`serve --broker redis://...` or
# `redis-cluster://...`, --history-size 100) against Centrifugo (Redis engine, history
# of 100 on channels without a namespace), each on its own fresh Redis per row.
# bench/clients/pubload drives closed-loop HTTP publishes from --publishers concurrent
# publishers (each with its own keep-alive connection; publisher i on channel
# bench-(i % --channels)) for --duration seconds after one second of warm-up:
#   throng:     POST /api/publish/{channel}, Authorization: Bearer KEY
#   centrifugo: POST /api/publish {"channel":..,"data":..}, X-API-Key: KEY
#
# Rows: for each topology (single; with --cluster also cluster), each value of
# --latency-ms and each server, a fresh Redis and a fresh server:
#   single   one redis-server;
#   cluster  a 3-master Redis Cluster (no replicas; redis-server --cluster-enabled yes,
#            redis-cli --cluster create), throng with --broker
#            redis-cluster://P1,P2,P3 and Centrifugo with engine.redis.cluster_address.
# Every Redis process is reached through its own Toxiproxy proxy (bench/peers/toxiproxy,
# one toxiproxy-server for the run, driven over its HTTP API with curl) with a
# `latency` toxic of --latency-ms on the downstream stream (Redis -> server), none at
# 0: a +0 row pays the proxy hop too, the same for both servers. A cluster node
# announces its proxy's port (cluster-announce-port), so the servers' slot maps and
# redirects go through the proxies: the latency applies to cluster rows as well.
# Per row, over the window: publishes/s, the answer's p50/p99, errors, the Redis
# processes' CPU (utime+stime from /proc/PID/stat, summed over a cluster's nodes),
# the server's and the proxy's CPU, each per publish, the INFO commandstats calls
# and usec each Redis command gained, and for throng its loop-turn histogram
# (/metrics throng_loop_turn_seconds buckets, after minus before, and
# throng_loop_turn_slowest_seconds). Keeps the run in
# RESULTS/publish_redis-STAMP.json (provenance from bench/provenance.py, versions,
# settings, one entry per row under "servers") and its tables in publish_redis-STAMP.md,
# with throng ÷ Centrifugo per (topology, latency).
#
# Usage: bench/publish_redis.sh [--servers throng,centrifugo] [--publishers 64]
#          [--duration 10] [--channels 64] [--size 64] [--latency-ms 0,1,2]
#          [--cluster] [--out bench/results]
#   --latency-ms LIST  milliseconds added on Redis -> server, one row set per value (default 0)
#   --cluster          also the cluster rows, after the single ones (default: single only)
# throng runs with two I/O threads (lib.sh throng_cmd); Centrifugo with its default GOMAXPROCS.
# Env:   THRONG_BIN (default <repo>/target/release/throng)
# Builds pubload (go build), Toxiproxy (bench/peers/toxiproxy/build.sh) and Centrifugo
# (bench/peers/centrifugo/build.sh), all through the Go module proxy, when missing; a
# peer that does not build is skipped and noted.
set -euo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$BENCH_DIR/lib.sh"

SERVERS=throng,centrifugo
PUBLISHERS=64
DURATION=10
CHANNELS=64
SIZE=64
LATENCIES=0
TOPOLOGIES=single
RESULTS_DIR=$BENCH_DIR/results
parse_options "--servers=SERVERS --publishers=PUBLISHERS --duration=DURATION --channels=CHANNELS --size=SIZE --latency-ms=LATENCIES --cluster=TOPOLOGIES=single,cluster --out=RESULTS_DIR" "$@"
check_names server "$SERVERS" throng centrifugo
for ms in ${LATENCIES//,/ }; do
  [[ $ms =~ ^[0-9]+$ ]] || usage_error "--latency-ms takes whole milliseconds (0,1,2), not '$ms'"
done
[ -n "${LATENCIES//,/}" ] || usage_error "--latency-ms needs at least one value"
need jq; need redis-server; need redis-cli; need go; need curl

CENTRIFUGO_DIR=$BENCH_DIR/peers/centrifugo
TOXIPROXY_DIR=$BENCH_DIR/peers/toxiproxy
PUBLOAD=$BENCH_DIR/clients/pubload/pubload
# The API key both servers are given (a throwaway: the servers listen on loopback only).
API_KEY=bench-publish-key
. "$BENCH_DIR/publish_redis_lib.sh"

begin_run publish_redis rm
describe_machine
go_build "$BENCH_DIR/clients/pubload" pubload
copy_throngs
log "build toxiproxy (bench/peers/toxiproxy/build.sh)"
TOXIPROXY_BIN=$("$TOXIPROXY_DIR/build.sh" | tail -1) || { echo "$PROG: bench/peers/toxiproxy/build.sh failed" >&2; exit 1; }
# Its /version says "git" when built with go install: the version is UPSTREAM's.
TOXIPROXY_VERSION="Toxiproxy $(awk 'NF && $1 !~ /^#/ {print $1; exit}' "$TOXIPROXY_DIR/UPSTREAM") via the Go module proxy"
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

cleanup_all() { cleanup; kill_backing; }
trap cleanup_all EXIT
start_toxiproxy || { echo "$PROG: toxiproxy-server did not start" >&2; exit 1; }

TOPOLOGY=single
# server_cmd NAME PORT (for lib.sh's start_server): the server on BROKER_ADDRS (the proxies).
server_cmd() {
  local broker="redis://$BROKER_ADDRS"
  [ "$TOPOLOGY" = cluster ] && broker="redis-cluster://$BROKER_ADDRS"
  case "$1" in
    throng)
      throng_cmd throng "$2" --broker "$broker" --history-size 100 --api-key "$API_KEY" ;;
    centrifugo)
      # The v6 config keys (internal/configtypes of v6.9.1): engine.type, engine.redis.address
      # (one Redis) or engine.redis.cluster_address (one entry per Cluster, its seed nodes
      # comma-separated: internal/redisshard/init.go), http_api.key,
      # channel.without_namespace.history_size/history_ttl.
      local redis
      if [ "$TOPOLOGY" = cluster ]; then
        redis=$(jq -nc --arg a "$BROKER_ADDRS" '{cluster_address: [$a]}')
      else
        redis=$(jq -nc --arg a "redis://$BROKER_ADDRS" '{address: [$a]}')
      fi
      jq -n --argjson port "$2" --argjson redis "$redis" --arg key "$API_KEY" \
        '{log: {level: "error"},
          http_server: {address: "127.0.0.1", port: $port},
          engine: {type: "redis", redis: $redis},
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

# run_row NAME MS: one row (TOPOLOGY, MS, NAME) into $WORK/all.json, or a note in SKIPPED.
run_row() {
  local name=$1 ms=$2 row="$TOPOLOGY-${2}ms-$1" metrics=
  log "$row: fresh $TOPOLOGY Redis behind toxiproxy (+$ms ms on Redis -> server)"
  if ! start_backing "$TOPOLOGY" "$row" "$ms"; then SKIPPED+=("$row: Redis ($TOPOLOGY) did not start"); stop_backing; return; fi
  if ! start_server "$name" "$row"; then SKIPPED+=("$row: $name did not start"); stop_backing; return; fi
  [ "$name" = throng ] && metrics="http://127.0.0.1:$PORT/metrics"
  log "$row: $name on :$PORT (redis $REDIS_ADDRS via $BROKER_ADDRS): $PUBLISHERS publishers, ${DURATION}s"
  sleep 0.5
  local pids
  pids=$(IFS=,; echo "${REDIS_PIDS[*]}")
  if "$PUBLOAD" -api "$name" -url "http://127.0.0.1:$PORT" -key "$API_KEY" -publishers "$PUBLISHERS" \
      -channels "$CHANNELS" -size "$SIZE" -duration "${DURATION}s" \
      -redis-addr "$REDIS_ADDRS" -redis-pid "$pids" -server-pid "$SERVER_PID" -proxy-pid "$TOXI_PID" \
      ${metrics:+-metrics-url "$metrics"} >"$WORK/$row.json" 2>"$WORK/$row.err"; then
    jq --arg name "$name" --arg version "$(server_version "$name")" --arg cmd "${CMD[*]}" \
      --arg redis "$(redis-server --version)" --argjson clk "$CLK_TCK" --arg topology "$TOPOLOGY" \
      --argjson ms "$ms" --arg proxy "$TOXIPROXY_VERSION, one proxy per Redis process" \
      --arg broker "$BROKER_ADDRS" --arg redis_addrs "$REDIS_ADDRS" '
      def per_publish(t): if t != null and .published > 0 then t * 1e6 / $clk / .published else null end;
      {name: $name, topology: $topology, latency_ms: $ms, proxy: $proxy, version: $version, command: $cmd,
       redis: $redis, redis_addrs: $redis_addrs, broker_addrs: $broker, pubload: .}
       + {redis_cpu_us_per_publish: per_publish(.redis_cpu_ticks),
          server_cpu_us_per_publish: per_publish(.server_cpu_ticks),
          proxy_cpu_us_per_publish: per_publish(.proxy_cpu_ticks)}' \
      "$WORK/$row.json" >"$WORK/$row.server.json"
    add_server "$WORK/$row.server.json"
  else
    SKIPPED+=("$row: pubload failed: $(tail -1 "$WORK/$row.err")")
  fi
  stop_server
  stop_backing
}

echo '{"servers": []}' >"$WORK/all.json"
for TOPOLOGY in ${TOPOLOGIES//,/ }; do
  for ms in ${LATENCIES//,/ }; do
    for name in "${RAN[@]}"; do run_row "$name" "$ms"; done
  done
done
stop_toxiproxy

report_paths publish_redis
jq --argjson provenance "$PROVENANCE" --argjson machine "$(machine_json nofile_hard)" \
  --argjson skipped "$(skipped_json)" --argjson rs "$RUN_SECONDS" \
  --argjson publishers "$PUBLISHERS" --argjson duration "$DURATION" --argjson channels "$CHANNELS" \
  --argjson size "$SIZE" --arg latencies "$LATENCIES" --arg topologies "$TOPOLOGIES" --arg proxy "$TOXIPROXY_VERSION" \
  '{bench: "publish_redis", provenance: $provenance, machine: $machine, run_seconds: $rs,
    settings: {publishers: $publishers, duration_secs: $duration, warmup_secs: 1, channels: $channels,
               message_size: $size, throng_threads: 2, history_size: 100,
               latencies_ms: ($latencies | split(",") | map(select(length > 0) | tonumber)),
               topologies: ($topologies | split(",")),
               proxy: "\($proxy): one proxy per Redis process, a latency toxic (downstream, no jitter) when above 0",
               redis: "a fresh redis-server (or 3-master cluster) per row, --save \"\" --appendonly no"},
    skipped: $skipped} + .' "$WORK/all.json" >"$OUT_JSON"

{
  echo "# Publish rate on a Redis broker (bench/publish_redis.sh)"
  echo
  echo "- machine: $NPROC cores ($MODEL), $MEM RAM, kernel $KERNEL; load at start $LOADAVG_START"
  provenance_md
  echo "- $PUBLISHERS closed-loop HTTP publishers (keep-alive, bench/clients/pubload) over $CHANNELS channels, ${SIZE}-byte JSON messages, ${DURATION} s after 1 s warm-up; history 100 per channel; a fresh Redis per row (topologies: $TOPOLOGIES; a cluster: 3 masters, no replicas)"
  echo "- Redis reached through $TOXIPROXY_VERSION, one proxy per Redis process, +$LATENCIES ms on Redis -> server (latency toxic, downstream, no jitter; none at 0, the proxy hop only)"
  jq -r '.servers | unique_by(.name)[] | "- \(.name): \(.version); e.g. `\(.command)`"' "$OUT_JSON"
  print_skipped
  echo
  publish_tables "$OUT_JSON"
} >"$OUT_MD"
cat "$OUT_MD"
log "wrote $OUT_JSON"
