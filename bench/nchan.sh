#!/usr/bin/env bash
# SSE against Nchan in the same run (issue 10): throng's GET /sse/{channel} and
# Nchan (Debian nginx-light + libnginx-mod-nchan; an `nchan_subscriber
# eventsource` location and an `nchan_publisher` one), each a fresh server
# process on a free loopback port per scenario, clients on the same machine,
# sources spread over 127.0.0.2-127.0.0.254:
#   (M) memory: --mem-conns SSE subscribers over 100 channels, held idle; the
#       server's memory delta / held subscriber, summed over the server's
#       processes (Nchan: the nginx master and its workers), as Pss (smaps_rollup:
#       shared pages split between the processes that map them; the headline) and
#       VmRSS (shared pages counted in every process). Client: bench/comet_memory.py.
#   (D) deliveries: --subs SSE subscribers of one channel, --publishers (1)
#       publishers at --publish-rate msg/s in total for --duration; deliveries/s,
#       server CPU (utime+stime of all its processes, /proc) per delivery over the
#       load window, latency p50/p99 publish -> delivery, lost. Client: `throng
#       bench push --transport sse` (Nchan: --seq-from payload, the client numbers
#       the messages itself; throng's own seq is used for throng). Nchan answers a
#       publish only once it has written the message to its local subscribers, so
#       one publisher (one request in flight) may not reach the rate: the table
#       shows published / target.
# Fairness: nginx runs `worker_processes N` and throng `--threads N` with the same
# N (--workers, default 1: one core for the server, one left for the client);
# both keep 100 messages per channel for 5 minutes, send no SSE pings
# (throng --ping-interval 0; Nchan's default), and start a new subscriber at the
# next message. The Nchan config is bench/peers/nchan/nginx.conf.template.
# Prints the machine line and a markdown table; raw JSON and the table go to
# bench/results/nchan-<date>.{json,md}.
#
# Usage: bench/nchan.sh [--servers throng,nchan] [--scenarios M,D]
#                       [--mem-conns 15000] [--subs 10000] [--publish-rate 10]
#                       [--duration 10s] [--rate 3000] [--workers 1] [--publishers 1]
#                       [--results-dir DIR] [--no-install]
# Installs what is missing (apt-get: nginx-light libnginx-mod-nchan jq curl;
# --no-install: fail instead) and builds throng (cargo build --release) when
# target/release/throng is missing.
# Env:   THRONG_BIN (default <repo>/target/release/throng: server and load client)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# REPO_DIR, THRONG_BIN; options, logging, servers, machine, report helpers
. "$BENCH_DIR/lib.sh"

SERVERS=throng,nchan
SCENARIOS=M,D
RESULTS_DIR=$BENCH_DIR/results
MEM_CONNS=15000
MEM_CHANNELS=100
SUBS=10000
PUBLISH_RATE=10
DURATION=10s
RATE=3000            # subscriber connections opened per second (D)
WORKERS=1            # nginx worker_processes = throng --threads
PUBLISHERS=1         # D: publish requests in flight (Nchan answers a publish only after its fan-out)
INSTALL=true
SOURCE_IPS=127.0.0.2-127.0.0.254
CONF_TEMPLATE=$BENCH_DIR/peers/nchan/nginx.conf.template

parse_options "--servers=SERVERS --scenarios=SCENARIOS --mem-conns=MEM_CONNS --subs=SUBS
  --publish-rate=PUBLISH_RATE --duration=DURATION --rate=RATE --workers=WORKERS --publishers=PUBLISHERS
  --results-dir=RESULTS_DIR --no-install=INSTALL=false" "$@"
check_names server "$SERVERS" throng nchan
check_names scenario "$SCENARIOS" M D
for v in MEM_CONNS SUBS PUBLISH_RATE RATE WORKERS PUBLISHERS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || usage_error "--$(echo "$v" | tr 'A-Z_' 'a-z-') takes a whole number"
done
wantsc() { case ",$SCENARIOS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# ---------------------------------------------------------------- install
install_missing() {
  local pkgs=()
  command -v jq >/dev/null 2>&1 || pkgs+=(jq)
  command -v curl >/dev/null 2>&1 || pkgs+=(curl)
  if want nchan; then
    command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || pkgs+=(nginx-light)
    nchan_module >/dev/null || pkgs+=(libnginx-mod-nchan)
  fi
  install_packages "${pkgs[@]+"${pkgs[@]}"}"
}
install_missing
need jq
need curl
need python3
NGINX=$(command -v nginx 2>/dev/null || echo /usr/sbin/nginx)
if want nchan; then NCHAN_SO=$(nchan_module) || { echo "$PROG: ngx_nchan_module.so not found" >&2; exit 1; }; fi

begin_run nchan rm

# lib.sh's exit trap kills SERVER_PID; nginx's workers are killed here too.
SERVER_PIDS=()
eval "lib_$(declare -f cleanup)"
cleanup() {
  local p
  for p in "${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [ -n "${SAMPLER_PID:-}" ]; then kill "$SAMPLER_PID" 2>/dev/null || true; fi
  lib_cleanup
}

# ---------------------------------------------------------------- build
if [ ! -x "$THRONG_BIN" ] && [ "$THRONG_BIN" = "$REPO_DIR/target/release/throng" ]; then
  need cargo
  log "cargo build --release (throng)"
  (cd "$REPO_DIR" && cargo build --release --quiet)
fi
copy_throng throng "$THRONG_BIN"   # a private copy: the real one may be rebuilt meanwhile
[ -x "$WORK/throng" ] || { echo "$PROG: $THRONG_BIN not found or not runnable (the load client too)" >&2; exit 1; }

# Does the load client speak SSE yet (throng bench push --transport sse)?
BENCH_HELP=$("$WORK/throng" bench --help 2>&1 || true)
HAS_SSE_CLIENT=; HAS_SEQ_FROM=
grep -q -- '--transport' <<<"$BENCH_HELP" && HAS_SSE_CLIENT=1
grep -q -- '--seq-from' <<<"$BENCH_HELP" && HAS_SEQ_FROM=1
if wantsc D && [ -z "$HAS_SSE_CLIENT" ]; then
  log "throng bench has no --transport sse yet: scenario D is not run"
fi

# ---------------------------------------------------------------- machine
describe_machine

# ---------------------------------------------------------------- servers
NCHAN_DIR=$WORK/nchan
server_cmd() { # name port -> sets CMD array (and writes Nchan's config)
  case "$1" in
    throng) CMD=("$WORK/throng" serve --listen "127.0.0.1:$2" --threads "$WORKERS" --stats-interval 0
                 --ping-interval 0 --history-size 100 --history-ttl 5m) ;;
    nchan) nchan_cmd "$NCHAN_DIR" "$2" "$WORKERS" "$CONF_TEMPLATE" ;;
  esac
}
# ready when /healthz answers (the Nchan config has one too)
server_ready() { curl -sf -m 1 "http://127.0.0.1:$1/healthz" >/dev/null 2>&1; }

# start NAME TAG: start_server, then SERVER_PIDS = the server and (nginx) its workers.
start() {
  SERVER_PIDS=()
  start_server "$1" "$2" || return 1
  SERVER_PIDS=("$SERVER_PID")
  if [ "$1" = nchan ]; then
    local i w
    for i in $(seq 1 50); do
      w=($(pgrep -P "$SERVER_PID" || true))
      [ "${#w[@]}" -ge "$WORKERS" ] && break; sleep 0.1
    done
    SERVER_PIDS+=("${w[@]}")
  fi
}
# stop: the master by its pid (SIGTERM; nginx stops its workers), then any worker left.
stop() {
  stop_server
  reap_pids "${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}"
  SERVER_PIDS=()
}

# utime+stime (clock ticks) summed over the given pids
cpu_ticks() {
  local p f t=0
  for p in "$@"; do
    f=($(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null)) || continue
    [ "${#f[@]}" -gt 12 ] && t=$(( t + f[11] + f[12] ))
  done
  echo "$t"
}
# SSE subscribers the server holds now
subscribers() {
  case "$1" in
    throng) curl -s -m 1 "http://127.0.0.1:$PORT/api/stats" | jq -r '.connections.sse // -1' 2>/dev/null || echo -1 ;;
    nchan) curl -s -m 1 "http://127.0.0.1:$PORT/nchan_status" | awk '/^subscribers:/ {print $2; f=1} END {if (!f) print -1}' ;;
  esac
}
status_text() {
  case "$1" in
    throng) curl -s -m 2 "http://127.0.0.1:$PORT/api/stats" 2>/dev/null || true ;;
    nchan) curl -s -m 2 "http://127.0.0.1:$PORT/nchan_status" 2>/dev/null || true ;;
  esac
}
# sampler NAME OUT: every 0.1 s "unix_ns cpu_ticks subscribers" (subscribers
# asked until all --subs are there, then -1: no more requests to the server).
sampler() {
  local name=$1 out=$2 n reached=
  while :; do
    n=-1
    if [ -z "$reached" ]; then n=$(subscribers "$name"); [ "${n:--1}" -ge "$SUBS" ] 2>/dev/null && reached=1; fi
    echo "$(date +%s%N) $(cpu_ticks "${SERVER_PIDS[@]}") ${n:--1}" >>"$out"
    sleep 0.1
  done
}

server_version() {
  case "$1" in
    throng) throng_version throng ;;
    nchan) echo "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //'), nchan $(dpkg-query -W -f '${Version}' libnginx-mod-nchan 2>/dev/null || echo '?') ($NCHAN_SO), worker_processes $WORKERS" ;;
  esac
}

QUIET_BUDGET=30; QUIET_WAIT_MAX=5; QUIET_WAITED=0
select_servers

# ---------------------------------------------------------------- (M) memory
run_m() {
  local name=$1 out=$WORK/$1-M.json status_path
  wait_quiet
  if ! start "$name" M; then echo '{"error":"server did not start"}' >"$out"; return; fi
  sleep 1
  case "$name" in throng) status_path=/api/stats ;; nchan) status_path=/nchan_status ;; esac
  if ! python3 "$BENCH_DIR/comet_memory.py" --port "$PORT" --pids "$(IFS=,; echo "${SERVER_PIDS[*]}")" \
       --conns "$MEM_CONNS" --channels "$MEM_CHANNELS" --path '/sse/{channel}' --status-path "$status_path" \
       --json --no-record >"$out" 2>>"$WORK/comet_memory.log"; then
    echo '{"error":"comet_memory.py failed"}' >"$out"
  fi
  jq -e . "$out" >/dev/null 2>&1 || echo '{"error":"comet_memory.py printed no JSON"}' >"$out"
  jq --arg pids "${SERVER_PIDS[*]}" '. + {server_pids:$pids}' "$out" >"$out.tmp" && mv "$out.tmp" "$out"
  stop
  add_log_tail "$name" M
}
# add_log_tail NAME TAG: the end of the server's output (Nchan: its error.log) into NAME-TAG.json
add_log_tail() {
  local f=$WORK/$1-$2.log; [ "$1" = nchan ] && f=$NCHAN_DIR/error.log
  jq --arg lg "$(grep -v ' \[info\] ' "$f" 2>/dev/null | tail -5 | cut -c1-300)" '. + {server_log_tail:$lg}' \
    "$WORK/$1-$2.json" >"$WORK/$1-$2.tmp" && mv "$WORK/$1-$2.tmp" "$WORK/$1-$2.json"
}

# ---------------------------------------------------------------- (D) deliveries
run_d() {
  local name=$1 out=$WORK/$1-D.json samples=$WORK/$1-D.samples
  if [ -z "$HAS_SSE_CLIENT" ]; then
    echo '{"error":"throng bench push has no --transport sse (the load client) in this build"}' >"$out"; return
  fi
  wait_quiet
  if ! start "$name" D; then echo '{"error":"server did not start"}' >"$out"; return; fi
  sleep 1
  local args=(bench push --transport sse --channels 1 --conns "$SUBS" --rate "$RATE" --publish-rate "$PUBLISH_RATE"
              --publishers "$PUBLISHERS" --duration "$DURATION" --source-ips "$SOURCE_IPS" --interval 0 --allow-failures --json)
  case "$name" in
    throng) args+=(--url "http://127.0.0.1:$PORT/sse/{channel}") ;;
    nchan) args+=(--url "http://127.0.0.1:$PORT/sse/{channel}" --publish-url "http://127.0.0.1:$PORT/pub/{channel}")
           if [ -n "$HAS_SEQ_FROM" ]; then args+=(--seq-from payload); fi ;;
  esac
  : >"$samples"
  local c0 t0 c1 t1
  c0=$(cpu_ticks "${SERVER_PIDS[@]}"); t0=$(date +%s%N)
  sampler "$name" "$samples" & SAMPLER_PID=$!
  if ! "$WORK/throng" "${args[@]}" >"$out" 2>>"$WORK/bench-push.log"; then :; fi
  kill "$SAMPLER_PID" 2>/dev/null || true; wait "$SAMPLER_PID" 2>/dev/null || true; SAMPLER_PID=
  c1=$(cpu_ticks "${SERVER_PIDS[@]}"); t1=$(date +%s%N)
  jq -e 'type == "object"' "$out" >/dev/null 2>&1 || echo '{"error":"throng bench push printed no JSON (see bench-push.log)"}' >"$out"
  local st; st=$(status_text "$name")
  local pids="${SERVER_PIDS[*]}"
  stop
  add_log_tail "$name" D
  # Server CPU over the load window: from the first sample with every subscriber
  # open (the client starts publishing then) for the report's load seconds.
  local secs; secs=$(jq -r '.load_secs // .duration_secs // empty' "$out")
  local win; win=$(awk -v subs="$SUBS" -v secs="${secs:-0}" '
      { t[NR] = $1; c[NR] = $2; if ($3 > max) max = $3; s[NR] = $3 }
      END {
        if (NR == 0 || secs <= 0) { print "null null null"; exit }
        for (i = 1; i <= NR; i++) if (s[i] >= max && s[i] >= 0) { a = i; break }
        if (!a) { print "null null null"; exit }
        end = t[a] + secs * 1e9; b = a
        for (i = a; i <= NR; i++) if (t[i] <= end) b = i
        printf "%d %.6f %d\n", c[b] - c[a], (t[b] - t[a]) / 1e9, max
      }' "$samples")
  read -r win_ticks win_secs subs_seen <<<"$win"
  jq --argjson clk "$CLK_TCK" --arg wt "$win_ticks" --arg ws "$win_secs" --arg ss "$subs_seen" \
     --argjson c0 "$c0" --argjson c1 "$c1" --argjson t0 "$t0" --argjson t1 "$t1" --argjson rate "$PUBLISH_RATE" --arg st "$st" --arg pids "$pids" '
    def num($x): if $x == "null" or $x == "" then null else ($x | tonumber) end;
    (.load_secs // .duration_secs) as $secs |
    (.push.delivered // .messages_total) as $delivered |
    (.messages_received_in_load // null) as $in_load |
    . + {summary: {
      deliveries_per_sec: (if .throughput_msgs_per_sec != null then .throughput_msgs_per_sec
                           elif $secs != null and $secs > 0 and $delivered != null then $delivered / $secs else null end),
      p50_us: .latency.median_us, p99_us: .latency.p99_us,
      published: .push.published, publish_target: (if $secs == null then null else ($secs * $rate | round) end), publish_errors: .push.publish_errors,
      expected: .push.expected_deliveries, delivered: $delivered,
      lost: .push.lost, duplicated: .push.duplicated, out_of_order: .push.out_of_order,
      window_secs: num($ws), window_server_cpu_secs: (if num($wt) == null then null else num($wt) / $clk end),
      subscribers_seen: num($ss),
      server_cpu_us_per_delivery: (if num($wt) == null or (($in_load // $delivered) // 0) == 0 then null
                                   else num($wt) / $clk * 1e6 / ($in_load // $delivered) end),
      whole_run_secs: (($t1 - $t0) / 1e9), whole_run_server_cpu_secs: (($c1 - $c0) / $clk),
      whole_run_server_cpu_us_per_delivery: (if ($delivered // 0) == 0 then null else ($c1 - $c0) / $clk * 1e6 / $delivered end)
 }, server_status: $st, server_pids: $pids}' "$out" >"$out.tmp" && mv "$out.tmp" "$out"
}

wantsc M && for name in "${RAN[@]+"${RAN[@]}"}"; do
  log "$name: (M) $MEM_CONNS SSE subscribers held over $MEM_CHANNELS channels"
  run_m "$name"
  log "  -> $(jq -c '{held,failed,pss_before_kib,pss_after_kib,pss_bytes_per_conn,rss_before_kib,rss_after_kib,rss_bytes_per_conn,error}' "$WORK/$name-M.json")"
done
wantsc D && for name in "${RAN[@]+"${RAN[@]}"}"; do
  log "$name: (D) $SUBS SSE subscribers of 1 channel, $PUBLISH_RATE msg/s, $DURATION"
  run_d "$name"
  log "  -> $(jq -c '.summary // {error}' "$WORK/$name-D.json")"
done

# ---------------------------------------------------------------- report
report_paths nchan
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)
jq -n --argjson provenance "$PROVENANCE" --argjson machine "$(machine_json nofile_hard)" --arg la0 "$LOADAVG_START" --arg la1 "$LOADAVG_END" \
  --argjson mem "$MEM_CONNS" --argjson memch "$MEM_CHANNELS" --argjson subs "$SUBS" --argjson pr "$PUBLISH_RATE" \
  --arg dur "$DURATION" --argjson rate "$RATE" --argjson workers "$WORKERS" --argjson pubs "$PUBLISHERS" --arg src "$SOURCE_IPS" \
  --arg sc "$SCENARIOS" --argjson run_seconds "$RUN_SECONDS" --argjson quiet "$QUIET_WAITED" \
  --argjson skipped "$(skipped_json)" --rawfile conf "$CONF_TEMPLATE" \
  '{provenance:$provenance, machine:($machine + {loadavg_start:$la0, loadavg_end:$la1}),
    params:{scenarios:$sc, M:{subscribers:$mem, channels:$memch},
            D:{subscribers:$subs, channels:1, publish_rate:$pr, publishers:$pubs, duration:$dur, conn_rate:$rate},
            workers:$workers, source_ips:$src},
    nchan_conf_template:$conf,
    skipped:$skipped, run_seconds:$run_seconds, quiet_wait_seconds:$quiet, servers:[]}' >"$WORK/all.json"
for name in "${RAN[@]+"${RAN[@]}"}"; do
  for sc in M D; do [ -f "$WORK/$name-$sc.json" ] || echo '{"error":"not run"}' >"$WORK/$name-$sc.json"; done
  server_cmd "$name" PORT
  jq -n --arg name "$name" --arg version "$(server_version "$name")" --arg cmd "${CMD[*]}" \
    --slurpfile m "$WORK/$name-M.json" --slurpfile d "$WORK/$name-D.json" \
    '{name:$name, version:$version, command:$cmd, M:$m[0], D:$d[0]}' >"$WORK/$name.json"
  add_server "$WORK/$name.json"
done
cp "$WORK/all.json" "$OUT_JSON"

render() {
  echo "# throng SSE vs Nchan"
  echo
  echo "- machine: $NPROC cores ($MODEL), $MEM RAM, kernel $KERNEL, open files (hard) $NOFILE; load average $LOADAVG_START at start, $LOADAVG_END at end"
  provenance_md
  echo "- date: $DATE; run took ${RUN_SECONDS}s; servers: $WORKERS nginx worker process(es), throng --threads $WORKERS; clients on the same cores, sources $SOURCE_IPS -> 127.0.0.1"
  echo "- (M) $MEM_CONNS SSE subscribers over $MEM_CHANNELS channels, held idle (bench/comet_memory.py); (D) $SUBS SSE subscribers of one channel,"
  echo "  $PUBLISH_RATE msg/s from $PUBLISHERS publisher(s) (one request in flight each) for $DURATION (\`throng bench push --transport sse\`). Fresh server process per scenario."
  for name in "${RAN[@]+"${RAN[@]}"}"; do echo "- $name: $(jq -r --arg n "$name" '.servers[] | select(.name == $n) | .version' "$OUT_JSON")"; done
  print_skipped
  echo
  jq -r "$JQ_DEFS"'
    def m(e): ok(e);
    def d(e): if ok(e) == null then null else e.summary end;
    "| server | M B/subscriber (Pss) | M B/subscriber (RSS) | M held | D deliveries/s | D server CPU µs/delivery | D p50 µs | D p99 µs | D lost | D published / target |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    (.servers[] |
      "| \(.name) | \(m(.M).pss_bytes_per_conn | f0) | \(m(.M).rss_bytes_per_conn | f0) | \(m(.M).held // "n/a") | \(d(.D).deliveries_per_sec | f0) | \(d(.D).server_cpu_us_per_delivery | f2) | \(d(.D).p50_us | f0) | \(d(.D).p99_us | f0) | \(d(.D).lost // "n/a") | \(d(.D) | if . == null then "n/a" else "\(.published) / \(.publish_target)" end) |"),
    "",
    ratio_table(
      "| throng ÷ peer | B/subscriber (Pss) | B/subscriber (RSS) | deliveries/s | CPU/delivery | p50 | p99 |",
      "|---|---:|---:|---:|---:|---:|---:|";
      "| ÷ \(.p.name) | \(r(m(.t.M).pss_bytes_per_conn; m(.p.M).pss_bytes_per_conn) | sig3) | \(r(m(.t.M).rss_bytes_per_conn; m(.p.M).rss_bytes_per_conn) | sig3) | \(r(d(.t.D).deliveries_per_sec; d(.p.D).deliveries_per_sec) | f2) | \(r(d(.t.D).server_cpu_us_per_delivery; d(.p.D).server_cpu_us_per_delivery) | f2) | \(r(d(.t.D).p50_us; d(.p.D).p50_us) | f2) | \(r(d(.t.D).p99_us; d(.p.D).p99_us) | f2) |"),
    "",
    "Details:",
    "",
    "| server | M Pss before → after KiB | M RSS before → after KiB | M failed | D published / expected / delivered | D dup / ooo | D window s | D server CPU s (window / whole run) | D CPU µs/delivery, whole run |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    (.servers[] | . as $s |
      "| \($s.name) | " +
      (if m($s.M) == null then "\($s.M.error) | | | " else "\($s.M.pss_before_kib) → \($s.M.pss_after_kib) | \($s.M.rss_before_kib) → \($s.M.rss_after_kib) | \($s.M.failed) | " end) +
      (if d($s.D) == null then "\($s.D.error) | | | | |" else
        (d($s.D)) as $e | "\($e.published) / \($e.expected) / \($e.delivered) | \($e.duplicated) / \($e.out_of_order) | \($e.window_secs | f2) | \($e.window_server_cpu_secs | f2) / \($e.whole_run_server_cpu_secs | f2) | \($e.whole_run_server_cpu_us_per_delivery | f2) |" end))
  ' "$OUT_JSON"
  echo
  echo "M: memory delta ÷ held subscribers, summed over the server's processes (throng: one; Nchan: the nginx master and its"
  echo "worker(s)); Pss splits shared pages (Nchan's shared-memory zone, libraries) between the processes that map them, RSS"
  echo "counts them in each. nginx allocates its 19,000 connection slots (worker_connections) at start: they are in 'before', not in the delta."
  echo "D: deliveries/s over the client's load window; server CPU = utime+stime of the server's processes over the load window"
  echo "(from the moment the server holds every subscriber, sampled every 0.1 s) ÷ deliveries in it, publish requests included;"
  echo "'whole run' also counts the $SUBS SSE handshakes and closes. Latency = receive time − publish time (client clock)."
  echo "lost = published but never received by a subscriber. Ratios: Pss/RSS, CPU and latency below 1 favour throng; deliveries/s above 1 does."
  echo "This machine is shared with other work; load average above."
  echo "Raw: ${OUT_JSON#"$REPO_DIR"/}"
}
render | tee "$OUT_MD"
