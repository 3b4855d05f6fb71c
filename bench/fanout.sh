#!/usr/bin/env bash
# Fan-out benchmark: throng vs. peer pub/sub servers with the same channel API
# (WebSocket /ws/{channel}, POST /api/publish/{channel}) on this machine.
#
# Servers: throng, gorilla-hub (Go, gorilla/websocket, hub + per-client send
# buffer and writer goroutine), tokio-broadcast (Rust, axum + one
# tokio::sync::broadcast channel per channel name); uws (not in the default list:
# uWebSockets, C++, one event loop, its built-in topics; built from the crates.io
# crate libuwebsockets-sys's bundled source by bench/peers/uws/build.sh, needs g++);
# throng1 (not in the default list): throng with one I/O thread (--threads 1), as
# single-loop servers run; throng-base (not in the default list): a second throng binary, $THRONG_BASE_BIN, run with the same flags
# as throng and measured alongside it like any other server, to compare two builds
# (say the previous commit and this one) in one run; its rows are labelled
# throng-base, and "÷ throng-base" is the A/B ratio. A fresh server process on a
# free loopback port for every scenario; the client is bench/clients/fanload
# (Go, gorilla/websocket), sources spread over 127.0.0.2-127.0.0.254:
#   (A) one channel, --subs subscribers, --publish-rate msg/s
#       (10 msg/s x 10,000 subscribers = 100k deliveries/s, about the client's limit)
#   (B) --channels-b channels with one subscriber each, --publish-rate-b msg/s
#       in total round-robin over the channels (HTTP publish cost dominates)
#   (C) idle: --idle-conns subscribers of one channel, server VmRSS delta / conns
# A and B: 64-byte text messages "<seq> <unix ns> <pad>", 1 s warmup + --duration
# window + 2 s grace; deliveries/s, server CPU (utime+stime) per delivery,
# delivery latency p50/p99, lost/duplicated/out-of-order per subscriber.
# Prints the machine line and a markdown table; raw JSON goes to
# bench/results/fanout-<date>.json (and the table to fanout-<date>.md).
#
# throng-epoll, throng1-epoll (not in the default list): the same with --io-uring off
# (until 22:40 on 2026-11-25, throng-uring / throng1-uring with auto, then opt-in).
# throng1-nohistory (not in the default list): throng1 with --history-size 0, no
# message kept for recovery, as the peers keep none: what history costs a publish.
# Usage: bench/fanout.sh [--servers throng,throng1,throng-epoll,throng1-epoll,throng1-nohistory,gorilla-hub,tokio-broadcast,uws]
#                        [--subs 10000] [--publish-rate 10]
#                        [--channels-b 10000] [--publish-rate-b 10000]
#                        [--idle-conns 15000] [--duration 10s] [--rate 3000]
#                        [--no-keepalive] [--rx-timestamps] [--scenarios A,B,C] [--results-dir DIR]
# A/B:   THRONG_BASE_BIN=/path/to/old/throng bench/fanout.sh --servers throng,throng-base
# Env:   THRONG_BIN (default <repo>/target/release/throng);
#        THRONG_BASE_BIN (the throng-base binary; needed for --servers ...throng-base)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# REPO_DIR, THRONG_BIN; options, logging, builds, servers, machine, report helpers
. "$BENCH_DIR/lib.sh"

SERVERS=throng,gorilla-hub,tokio-broadcast
SCENARIOS=A,B,C
RESULTS_DIR=$BENCH_DIR/results
SUBS=10000
PUBLISH_RATE=10
CHANNELS_B=10000
PUBLISH_RATE_B=10000
IDLE_CONNS=15000
DURATION=10s
RATE=3000            # subscriber connections opened per second
SIZE=64
GRACE=2s
WARMUP=1s
PUBLISHERS=16
KEEPALIVE=true       # --no-keepalive: a new TCP connection per publish for every server
RX_STAMPS=false      # --rx-timestamps: (A) and (B) also report latency to the kernel's receive time (SO_TIMESTAMPNS)
SOURCE_IPS=127.0.0.2-127.0.0.254

parse_options "--servers=SERVERS --scenarios=SCENARIOS --subs=SUBS --publish-rate=PUBLISH_RATE
  --channels-b=CHANNELS_B --publish-rate-b=PUBLISH_RATE_B --idle-conns=IDLE_CONNS --duration=DURATION
  --rate=RATE --results-dir=RESULTS_DIR --no-keepalive=KEEPALIVE=false --rx-timestamps=RX_STAMPS=true" "$@"
check_names server "$SERVERS" throng throng1 throng-epoll throng1-epoll throng1-nohistory throng-base gorilla-hub tokio-broadcast uws
check_names scenario "$SCENARIOS" A B C
check_throng_base
wantsc() { case ",$SCENARIOS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
need jq
need curl

begin_run fanout rm

# ---------------------------------------------------------------- build
HUB=$HUB_DIR/gorilla-hub
TB=$TB_DIR/target/release/tokio-broadcast
build_hub_peers

# ---------------------------------------------------------------- machine
describe_machine

# ---------------------------------------------------------------- servers
server_cmd() { # name port -> sets CMD array
  throng_cmd "$1" "$2" && return
  case "$1" in
    gorilla-hub) CMD=("$HUB" -addr "127.0.0.1:$2") ;;
    tokio-broadcast) CMD=("$TB" --addr "127.0.0.1:$2") ;;
    uws) CMD=("$UWS_DIR/bin/uws-hub" --addr "127.0.0.1:$2") ;;
  esac
}

# ready when /healthz answers
server_ready() { curl -sf -m 1 "http://127.0.0.1:$1/healthz" >/dev/null 2>&1; }

# The machine may be shared with other sessions: before each measurement wait
# (up to 5 s each, 30 s per run) until it is < 25% busy over 1 s. The load of
# other processes during each window is recorded in the results either way.
QUIET_BUDGET=30; QUIET_WAIT_MAX=5; QUIET_WAITED=0

# server's own counters (peers: dropped slow clients / lagged messages)
server_stats() { curl -s -m 2 "http://127.0.0.1:$PORT/api/stats" 2>/dev/null | jq -c . 2>/dev/null || echo null; }

run_scenario() { # name scenario fanload-args...
  local name=$1 sc=$2; shift 2
  local out=$WORK/$name-$sc.json
  wait_quiet
  if start_server "$name" "$sc"; then
    sleep 1
    if ! "$FANLOAD" -addr "127.0.0.1:$PORT" -server-pid "$SERVER_PID" -clk-tck "$CLK_TCK" -source-ips "$SOURCE_IPS" \
         -rate "$RATE" -keepalive="$KEEPALIVE" -rx-timestamps="$RX_STAMPS" -label "$name-$sc" "$@" >"$out" 2>>"$WORK/fanload.log"; then
      echo '{"error":"fanload failed"}' >"$out"
    fi
    jq -e . "$out" >/dev/null 2>&1 || echo '{"error":"fanload printed no JSON"}' >"$out"
    local st; st=$(server_stats)
    stop_server
    local tail_log; tail_log=$(tail -3 "$WORK/$name-$sc.log" | cut -c1-300)
    jq --argjson st "$st" --arg lg "$tail_log" '. + {server_stats:$st, server_log_tail:$lg}' "$out" >"$out.tmp" && mv "$out.tmp" "$out"
  else
    echo '{"error":"server did not start"}' >"$out"
  fi
}

server_version() {
  throng_build_version "$1" && return
  case "$1" in
    gorilla-hub) echo "gorilla/websocket $(awk '/gorilla\/websocket v/ {print $NF; exit}' "$HUB_DIR/go.mod"), $(go version 2>/dev/null | awk '{print $3}')" ;;
    tokio-broadcast) echo "axum $(awk '/^name = "axum"$/ {getline; gsub(/"/,"",$3); print $3}' "$TB_DIR/Cargo.lock"), tokio $(awk '/^name = "tokio"$/ {getline; gsub(/"/,"",$3); print $3}' "$TB_DIR/Cargo.lock"), tokio-tungstenite $(awk '/^name = "tokio-tungstenite"$/ {getline; gsub(/"/,"",$3); print $3}' "$TB_DIR/Cargo.lock")" ;;
    uws) "$UWS_DIR/build.sh" --version ;;
  esac
}

select_servers

summary='{opened,failed,deliveries_per_sec,publish_per_sec,server_cpu_us_per_delivery,p50:.latency_us.p50,p99:.latency_us.p99,arrival_p99:.arrival_us.p99,lost,duplicated,out_of_order,closed:.subscribers_closed_by_server,publish_failed,other_cores,error}'
# Scenarios run one after the other for all servers, so that a slow phase of
# the shared machine hits every server alike.
wantsc A && for name in "${RAN[@]+"${RAN[@]}"}"; do
  log "$name: (A) $SUBS subscribers on 1 channel, $PUBLISH_RATE msg/s, $DURATION"
  run_scenario "$name" A -conns "$SUBS" -channels 1 -publish-rate "$PUBLISH_RATE" -publishers 1 \
    -size "$SIZE" -warmup "$WARMUP" -duration "$DURATION" -grace "$GRACE" -settle 1s -rss-samples 3
  log "  -> $(jq -c "$summary" "$WORK/$name-A.json")"
done
wantsc B && for name in "${RAN[@]+"${RAN[@]}"}"; do
  log "$name: (B) $CHANNELS_B channels x 1 subscriber, $PUBLISH_RATE_B msg/s, $DURATION"
  run_scenario "$name" B -conns "$CHANNELS_B" -channels "$CHANNELS_B" -publish-rate "$PUBLISH_RATE_B" -publishers "$PUBLISHERS" \
    -size "$SIZE" -warmup "$WARMUP" -duration "$DURATION" -grace "$GRACE" -settle 1s -rss-samples 3
  log "  -> $(jq -c "$summary" "$WORK/$name-B.json")"
done
wantsc C && for name in "${RAN[@]+"${RAN[@]}"}"; do
  log "$name: (C) idle $IDLE_CONNS subscribers on 1 channel"
  run_scenario "$name" C -conns "$IDLE_CONNS" -channels 1 -publish-rate 0 -settle 3s -duration 1s -rss-samples 5
  log "  -> $(jq -c '{opened,failed,server_rss_before_kb,server_rss_after_kb,server_rss_bytes_per_conn,closed:.subscribers_closed_by_server,error}' "$WORK/$name-C.json")"
done

# ---------------------------------------------------------------- report
report_paths fanout
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)
jq -n --argjson provenance "$PROVENANCE" --argjson machine "$(machine_json nofile_hard)" --arg la0 "$LOADAVG_START" --arg la1 "$LOADAVG_END" \
  --argjson subs "$SUBS" --argjson pr "$PUBLISH_RATE" --argjson chb "$CHANNELS_B" --argjson prb "$PUBLISH_RATE_B" \
  --argjson idle "$IDLE_CONNS" --arg dur "$DURATION" --arg rate "$RATE" --arg src "$SOURCE_IPS" \
  --argjson size "$SIZE" --arg grace "$GRACE" --arg warmup "$WARMUP" --argjson pubs "$PUBLISHERS" --argjson ka "$KEEPALIVE" \
  --argjson run_seconds "$RUN_SECONDS" --argjson quiet "$QUIET_WAITED" --argjson skipped "$(skipped_json)" \
  '{provenance:$provenance, machine:($machine + {loadavg_start:$la0, loadavg_end:$la1}),
    params:{A:{subscribers:$subs, channels:1, publish_rate:$pr, publishers:1},
            B:{subscribers:$chb, channels:$chb, publish_rate:$prb, publishers:$pubs},
            publish_keepalive:$ka,
            C:{subscribers:$idle, channels:1},
            scenarios:"'"$SCENARIOS"'", duration:$dur, warmup:$warmup, grace:$grace, size:$size, conn_rate:$rate, source_ips:$src},
    skipped:$skipped, run_seconds:$run_seconds, quiet_wait_seconds:$quiet, servers:[]}' >"$WORK/all.json"
for name in "${RAN[@]+"${RAN[@]}"}"; do
  for sc in A B C; do [ -f "$WORK/$name-$sc.json" ] || echo '{"error":"not run"}' >"$WORK/$name-$sc.json"; done
  server_cmd "$name" PORT
  jq -n --arg name "$name" --arg version "$(server_version "$name")" --arg cmd "${CMD[*]}" \
    --slurpfile a "$WORK/$name-A.json" --slurpfile b "$WORK/$name-B.json" --slurpfile c "$WORK/$name-C.json" \
    '{name:$name, version:$version, command:$cmd, A:$a[0], B:$b[0], C:$c[0]}' >"$WORK/$name.json"
  add_server "$WORK/$name.json"
done
cp "$WORK/all.json" "$OUT_JSON"

render() {
  echo "# throng fan-out benchmark"
  echo
  echo "- machine: $NPROC cores ($MODEL), $MEM RAM, kernel $KERNEL, open files (hard) $NOFILE; load average $LOADAVG_START at start, $LOADAVG_END at end"
  provenance_md
  echo "- date: $DATE; run took ${RUN_SECONDS}s; client \`fanload\` (Go, gorilla/websocket) on the same 2 cores, sources $SOURCE_IPS -> 127.0.0.1"
  echo "- (A) $SUBS subscribers of one channel, $PUBLISH_RATE msg/s; (B) $CHANNELS_B channels x 1 subscriber, $PUBLISH_RATE_B msg/s"
  echo "  round-robin ($PUBLISHERS publishers, HTTP keep-alive: $KEEPALIVE (where the server allows it)); $SIZE B text, $WARMUP warmup + $DURATION window + $GRACE grace;"
  echo "  (C) $IDLE_CONNS idle subscribers of one channel: server VmRSS delta / connections. Fresh server process per scenario."
  print_skipped
  echo
  jq -r "$JQ_DEFS"'
    def ldo(e): if ok(e) == null then "n/a" else "\(e.lost)/\(e.duplicated)/\(e.out_of_order)" end;
    def lat(e): if ok(e) == null then "n/a" else "\(e.latency_us.p50 | f0) / \(e.latency_us.p99 | f0)" end;
    "| server | A deliveries/s | A server CPU µs/delivery | A latency p50 / p99 µs | A lost/dup/ooo | B publish/s | B deliveries/s | B server CPU µs/delivery | B latency p50 / p99 µs | B lost/dup/ooo | C idle B/conn |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    (.servers[] |
      "| \(.name) | \(ok(.A).deliveries_per_sec | f0) | \(ok(.A).server_cpu_us_per_delivery | f2) | \(lat(.A)) | \(ldo(.A)) | \(ok(.B).publish_per_sec | f0) | \(ok(.B).deliveries_per_sec | f0) | \(ok(.B).server_cpu_us_per_delivery | f2) | \(lat(.B)) | \(ldo(.B)) | \(ok(.C).server_rss_bytes_per_conn | f0) |"),
    "",
    ratio_table(
      "| throng ÷ peer | A deliveries/s | A CPU/delivery | A p99 | B deliveries/s | B CPU/delivery | B p99 | C B/conn |",
      "|---|---:|---:|---:|---:|---:|---:|---:|";
      "| ÷ \(.p.name) | \(r(ok(.t.A).deliveries_per_sec; ok(.p.A).deliveries_per_sec) | f2) | \(r(ok(.t.A).server_cpu_us_per_delivery; ok(.p.A).server_cpu_us_per_delivery) | f2) | \(r(ok(.t.A).latency_us.p99; ok(.p.A).latency_us.p99) | f2) | \(r(ok(.t.B).deliveries_per_sec; ok(.p.B).deliveries_per_sec) | f2) | \(r(ok(.t.B).server_cpu_us_per_delivery; ok(.p.B).server_cpu_us_per_delivery) | f2) | \(r(ok(.t.B).latency_us.p99; ok(.p.B).latency_us.p99) | f2) | \(r(ok(.t.C).server_rss_bytes_per_conn; ok(.p.C).server_rss_bytes_per_conn) | sig3) |"),
    "",
    if [.servers[] | (.A, .B) | ok(.) | .arrival_us] | map(select(. != null)) | length == 0 then empty else
      "Arrival (--rx-timestamps): send time to the kernel'"'"'s receive time of the read that returned the message (SO_TIMESTAMPNS),",
      "so without the client'"'"'s own wait to be scheduled and its parsing; the same messages as the latency above.",
      "",
      "| server | A arrival p50 / p99 µs | A p99 − arrival p99 µs | B arrival p50 / p99 µs |",
      "|---|---:|---:|---:|",
      (.servers[] | def arr(e): if ok(e).arrival_us == null then "n/a" else "\(e.arrival_us.p50 | f0) / \(e.arrival_us.p99 | f0)" end;
        "| \(.name) | \(arr(.A)) | \(if ok(.A).arrival_us == null then "n/a" else (.A.latency_us.p99 - .A.arrival_us.p99 | f0) end) | \(arr(.B)) |"),
      "",
      ratio_table(
        "| throng ÷ peer | A arrival p50 | A arrival p99 | B arrival p99 |",
        "|---|---:|---:|---:|";
        "| ÷ \(.p.name) | \(r(ok(.t.A).arrival_us.p50; ok(.p.A).arrival_us.p50) | f2) | \(r(ok(.t.A).arrival_us.p99; ok(.p.A).arrival_us.p99) | f2) | \(r(ok(.t.B).arrival_us.p99; ok(.p.B).arrival_us.p99) | f2) |"),
      ""
    end,
    "Details per window (cores = CPU seconds / window seconds; other = CPU of other user processes, capped by busy − server − client;",
    "busy − server − client = machine CPU (/proc/stat) not charged to server or client: other processes plus kernel softirq work):",
    "",
    "| server | scen. | opened/failed | published ok/failed/skipped | publish dials | publish RTT p50 / p99 µs | latency max µs | server cores | client cores | client CPU µs/delivery | other cores | busy − server − client | closed by server | server counters |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    (.servers[] | . as $s | ("A","B","C") as $k | $s[$k] as $e |
      if $e.error != null then "| \($s.name) | \($k) | error: \($e.error) | | | | | | | | | | | |" else
      "| \($s.name) | \($k) | \($e.opened)/\($e.failed) | " +
      (if $k == "C" then "– | – | – | – | – | – | – | – | – | \($e.subscribers_closed_by_server) | \($e.server_rss_before_kb) → \($e.server_rss_after_kb) KiB |"
       else "\($e.published_ok)/\($e.publish_failed)/\($e.publish_skipped) | \($e.publish_dials) | \($e.publish_rtt_us.p50 | f0) / \($e.publish_rtt_us.p99 | f0) | \($e.latency_us.max | f0) | \($e.server_cpu_cores | f2) | \($e.client_cpu_cores | f2) | \($e.client_cpu_us_per_delivery | f2) | \($e.other_cores | f2) | \($e.machine_residual_cpu_seconds / $e.window_seconds | f2) | \($e.subscribers_closed_by_server) | \($e.server_stats | if type == "object" then with_entries(select(.key | IN("messages_out","published","dropped_slow_clients","lagged_messages","lag_events"))) | to_entries | map("\(.key) \(.value)") | join(", ") else "n/a" end) |" end)
      end)
  ' "$OUT_JSON"
  echo
  echo "lost = published (HTTP 200) but never received by a subscriber of the channel; dup = received twice; ooo = a seq below the"
  echo "highest seen. Latency = receive time − send time written in the payload by the publisher just before its POST, so it includes"
  echo "the publish request; in (A) one message is a burst of $SUBS frames that the client reads one by one, so p50/p99 are mostly"
  echo "the client working through the burst. Server CPU = utime+stime of the server pid over the window ÷ deliveries in the window,"
  if [ "$KEEPALIVE" = true ]; then
    echo "publish requests included (throng answers Connection: close, so each publish is a new TCP connection; the peers keep"
    echo "connections alive: compare 'publish dials'). Ratios: CPU, latency and B/conn below 1 favour throng; deliveries/s above 1 favours throng."
  else
    echo "publish requests included (--no-keepalive: every publish is a new TCP connection for every server)."
    echo "Ratios: CPU, latency and B/conn below 1 favour throng; deliveries/s above 1 favours throng."
  fi
  echo "This machine is shared with other work: see 'other cores' for the load of other processes during each window."
  echo "Raw: ${OUT_JSON#"$REPO_DIR"/}"
}
render | tee "$OUT_MD"
