#!/usr/bin/env bash
# Fan-out at full publish speed: --subs WebSocket subscribers of one channel, then
# --messages messages published as fast as each server takes them (one request in
# flight: a server that answers a publish only after writing it out, as Nchan
# does, slows its own publisher), measured from the first publish until every
# subscriber has every accepted message. Per server: deliveries/s over that time,
# publish-to-delivery latency p50/p99/max over every delivery, server CPU per
# delivery (the server's process and its children: nginx's workers), lost.
#
# Servers (each a fresh process on a free loopback port, the same client for all:
# bench/clients/fanload -messages, Go, gorilla/websocket, sources spread over
# 127.0.0.2-127.0.0.254): throng (--threads 2, the default here), throng1
# (--threads 1), uws (uWebSockets' one loop, bench/peers/uws), nchan (Nchan from
# Debian, worker_processes 1, its WebSocket subscriber; bench/peers/nchan),
# gorilla-hub (Go), tokio-broadcast (Rust, tokio-tungstenite); throng-base
# ($THRONG_BASE_BIN, run as throng, for an A/B of two builds).
# Prints the machine line and a markdown table; raw JSON and the table go to
# bench/results/burst-<date>.{json,md}.
#
# --pace R publishes the messages at R/s instead (or slower, if a server's answers
# are): the latency of every server at one delivery rate, e.g. the rate the
# slowest reached at full speed.
#
# Usage: bench/burst.sh [--servers throng,throng1,uws,nchan,gorilla-hub,tokio-broadcast]
#                       [--subs 10000] [--messages 200] [--pace 0] [--rate 3000] [--runs 1]
#                       [--results-dir DIR] [--no-install]
# Installs what is missing (apt-get: nginx-light libnginx-mod-nchan jq curl g++;
# --no-install: fail instead).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# REPO_DIR, THRONG_BIN; options, logging, builds, servers, machine, report helpers
. "$BENCH_DIR/lib.sh"

SERVERS=throng,throng1,uws,nchan,gorilla-hub,tokio-broadcast
RESULTS_DIR=$BENCH_DIR/results
SUBS=10000
MESSAGES=200
RATE=3000            # subscriber connections opened per second
RUNS=1
PACE=0               # messages/s; 0 = full speed
SIZE=64
GRACE=20s            # longest wait for the last deliveries after the last answer
LIMIT=60s            # longest the publishing may take
SOURCE_IPS=127.0.0.2-127.0.0.254
INSTALL=true

parse_options "--servers=SERVERS --subs=SUBS --messages=MESSAGES --pace=PACE --rate=RATE --runs=RUNS
  --results-dir=RESULTS_DIR --no-install=INSTALL=false" "$@"
check_names server "$SERVERS" throng throng1 throng-base uws nchan gorilla-hub tokio-broadcast
check_throng_base
for v in SUBS MESSAGES RATE RUNS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || usage_error "--$(echo "$v" | tr 'A-Z_' 'a-z-') takes a whole number above 0"
done
[[ $PACE =~ ^[0-9]+$ ]] || usage_error "--pace takes a whole number of messages per second (0: full speed)"
if [ "$PACE" = 0 ]; then SPEED="at full speed"; else SPEED="paced at $PACE/s"; fi

# ---------------------------------------------------------------- install
pkgs=()
command -v jq >/dev/null 2>&1 || pkgs+=(jq)
command -v curl >/dev/null 2>&1 || pkgs+=(curl)
if want nchan; then
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || pkgs+=(nginx-light)
  nchan_module >/dev/null || pkgs+=(libnginx-mod-nchan)
fi
if want uws; then command -v g++ >/dev/null 2>&1 || pkgs+=(g++); fi
install_packages "${pkgs[@]+"${pkgs[@]}"}"
need jq
need curl
NGINX=$(command -v nginx 2>/dev/null || echo /usr/sbin/nginx)
NCHAN_SO=
if want nchan; then NCHAN_SO=$(nchan_module) || { echo "$PROG: ngx_nchan_module.so not found" >&2; exit 1; }; fi

begin_run burst rm

# ---------------------------------------------------------------- build
build_hub_peers

# ---------------------------------------------------------------- machine
describe_machine

# ---------------------------------------------------------------- servers
NCHAN_DIR=$WORK/nchan
server_cmd() { # name port -> sets CMD array (and writes Nchan's config)
  case "$1" in
    throng|throng-base) CMD=("$WORK/$1" serve --listen "127.0.0.1:$2" --threads 2 --stats-interval 0) ;;
    throng1) CMD=("$WORK/throng" serve --listen "127.0.0.1:$2" --threads 1 --stats-interval 0) ;;
    uws) CMD=("$UWS_DIR/bin/uws-hub" --addr "127.0.0.1:$2") ;;
    gorilla-hub) CMD=("$HUB_DIR/gorilla-hub" -addr "127.0.0.1:$2") ;;
    tokio-broadcast) CMD=("$TB_DIR/target/release/tokio-broadcast" --addr "127.0.0.1:$2") ;;
    nchan) nchan_cmd "$NCHAN_DIR" "$2" 1 "$BENCH_DIR/peers/nchan/nginx.conf.template" ;;
  esac
}
server_version() {
  case "$1" in
    throng|throng-base) echo "$(throng_version "$1"), two I/O threads" ;;
    throng1) echo "$(throng_version throng), one I/O thread" ;;
    uws) "$UWS_DIR/build.sh" --version ;;
    gorilla-hub) echo "gorilla/websocket $(awk '/gorilla\/websocket v/ {print $NF; exit}' "$HUB_DIR/go.mod"), $(go version 2>/dev/null | awk '{print $3}')" ;;
    tokio-broadcast) echo "tokio-tungstenite $(awk '/^name = "tokio-tungstenite"$/ {getline; gsub(/"/,"",$3); print $3}' "$TB_DIR/Cargo.lock")" ;;
    nchan) echo "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //'), nchan $(dpkg-query -W -f '${Version}' libnginx-mod-nchan 2>/dev/null || echo '?'), worker_processes 1" ;;
  esac
}
# ready when /healthz answers (every server here has one)
server_ready() { curl -sf -m 1 "http://127.0.0.1:$1/healthz" >/dev/null 2>&1; }
# nginx's workers outlive a killed master: stop them by their pids too.
stop_all() {
  local kids=()
  [ -z "${SERVER_PID:-}" ] || kids=($(pgrep -P "$SERVER_PID" || true))
  stop_server
  reap_pids "${kids[@]+"${kids[@]}"}"
}
eval "lib_$(declare -f cleanup)"
cleanup() { stop_all; lib_cleanup; }

QUIET_BUDGET=30; QUIET_WAIT_MAX=5; QUIET_WAITED=0

run_one() { # name run -> $WORK/name-run.json
  local name=$1 n=$2 out=$WORK/$1-$2.json
  wait_quiet
  if start_server "$name" "$n"; then
    sleep 1
    if ! "$FANLOAD" -addr "127.0.0.1:$PORT" -server-pid "$SERVER_PID" -clk-tck "$CLK_TCK" -source-ips "$SOURCE_IPS" \
         -rate "$RATE" -conns "$SUBS" -channels 1 -publishers 1 -messages "$MESSAGES" -publish-rate "$PACE" -size "$SIZE" \
         -duration "$LIMIT" -grace "$GRACE" -settle 1s -rss-samples 1 -label "$name-$n" >"$out" 2>>"$WORK/fanload.log"; then
      echo '{"error":"fanload failed"}' >"$out"
    fi
    jq -e . "$out" >/dev/null 2>&1 || echo '{"error":"fanload printed no JSON"}' >"$out"
    stop_all
  else
    echo '{"error":"server did not start"}' >"$out"
  fi
}

select_servers
summary='{opened,failed,published_ok,publish_failed,deliveries_per_sec,window_seconds,server_cpu_us_per_delivery,p50:.latency_us.p50,p99:.latency_us.p99,lost,duplicated,error}'
for n in $(seq 1 "$RUNS"); do
  for name in "${RAN[@]+"${RAN[@]}"}"; do
    log "$name (run $n): $SUBS subscribers of one channel, $MESSAGES messages $SPEED"
    run_one "$name" "$n"
    log "  -> $(jq -c "$summary" "$WORK/$name-$n.json")"
  done
done

# ---------------------------------------------------------------- report
report_paths burst
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)
jq -n --argjson provenance "$PROVENANCE" --argjson machine "$(machine_json nofile_hard)" --arg la0 "$LOADAVG_START" --arg la1 "$LOADAVG_END" \
  --argjson subs "$SUBS" --argjson msgs "$MESSAGES" --argjson pace "$PACE" --argjson runs "$RUNS" --arg rate "$RATE" --arg src "$SOURCE_IPS" \
  --argjson size "$SIZE" --arg grace "$GRACE" --argjson run_seconds "$RUN_SECONDS" --argjson quiet "$QUIET_WAITED" \
  --argjson skipped "$(skipped_json)" \
  '{provenance:$provenance, machine:($machine + {loadavg_start:$la0, loadavg_end:$la1}),
    params:{subscribers:$subs, channels:1, messages:$msgs, pace:$pace, publishers:1, runs:$runs, size:$size, grace:$grace,
            conn_rate:$rate, source_ips:$src},
    skipped:$skipped, run_seconds:$run_seconds, quiet_wait_seconds:$quiet, servers:[]}' >"$WORK/all.json"
for name in "${RAN[@]+"${RAN[@]}"}"; do
  server_cmd "$name" PORT
  files=(); for n in $(seq 1 "$RUNS"); do files+=("$WORK/$name-$n.json"); done
  # The run with the median p99 stands for the server; every run is kept.
  jq -s --arg name "$name" --arg version "$(server_version "$name")" --arg cmd "${CMD[*]}" \
    '(map(select(.error == null)) | sort_by(.latency_us.p99)) as $ok
     | {name:$name, version:$version, command:$cmd,
        median:(if ($ok | length) > 0 then $ok[(($ok | length) - 1) / 2 | floor] else {error:"every run failed"} end),
        runs:.}' "${files[@]}" >"$WORK/$name.json"
  add_server "$WORK/$name.json"
done
cp "$WORK/all.json" "$OUT_JSON"

render() {
  echo "# throng burst benchmark: fan-out $SPEED"
  echo
  echo "- machine: $NPROC cores ($MODEL), $MEM RAM, kernel $KERNEL, open files (hard) $NOFILE; load average $LOADAVG_START at start, $LOADAVG_END at end"
  provenance_md
  echo "- date: $DATE; run took ${RUN_SECONDS}s; client \`fanload -messages\` (Go, gorilla/websocket) on the same cores, sources $SOURCE_IPS -> 127.0.0.1"
  echo "- $SUBS WebSocket subscribers of one channel; $MESSAGES messages of $SIZE B published $SPEED by one publisher (one request in flight);"
  echo "  measured from the first publish until every subscriber has every accepted message. $RUNS run(s) per server: the run with the median p99 is shown."
  print_skipped
  echo
  jq -r "$JQ_DEFS"'
    def m: ok(.median);
    "| server | published ok / failed | deliveries/s | time to deliver all (s) | server CPU µs/delivery | latency p50 / p99 / max ms | lost/dup/ooo |",
    "|---|---:|---:|---:|---:|---:|---:|",
    (.servers[] | m as $e |
      if $e == null then "| \(.name) | error: \(.median.error) | | | | | |" else
      "| \(.name) | \($e.published_ok // 0) / \($e.publish_failed) | \($e.deliveries_per_sec | f0) | \($e.window_seconds | f2) | \($e.server_cpu_us_per_delivery | f2) | \($e.latency_us.p50 / 1000 | f1) / \($e.latency_us.p99 / 1000 | f1) / \($e.latency_us.max / 1000 | f1) | \($e.lost)/\($e.duplicated)/\($e.out_of_order) |" end),
    "",
    ratio_table(
      "| throng ÷ peer | deliveries/s | CPU/delivery | p99 |",
      "|---|---:|---:|---:|";
      "| ÷ \(.p.name) | \(r(ok(.t.median).deliveries_per_sec; ok(.p.median).deliveries_per_sec) | f2) | \(r(ok(.t.median).server_cpu_us_per_delivery; ok(.p.median).server_cpu_us_per_delivery) | f2) | \(r(ok(.t.median).latency_us.p99; ok(.p.median).latency_us.p99) | f2) |"),
    "",
    "Every run (p99 ms, deliveries/s, server cores, client cores, other cores):",
    "",
    (.servers[] | "- \(.name): " + ([.runs[] | if .error != null then "error: \(.error)" else "\(.latency_us.p99 / 1000 | f1) ms, \(.deliveries_per_sec | f0)/s, \(.server_cpu_cores | f2) / \(.client_cpu_cores | f2) / \(.other_cores | f2)" end] | join("; ")))
  ' "$OUT_JSON"
  echo
  echo "Latency = receive time − send time written in the payload by the publisher just before its POST. lost = accepted (2xx) but"
  echo "never received; dup = received twice; ooo = a seq below the highest seen. Ratios: CPU and p99 below 1, deliveries/s above 1 favour throng."
  echo "Raw: ${OUT_JSON#"$REPO_DIR"/}"
}
render | tee "$OUT_MD"
