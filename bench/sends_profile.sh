#!/usr/bin/env bash
# Where a send goes: the system calls (strace -c) and the CPU profile (perf) of a
# server while it fans messages out and while it echoes, per delivery. The "before"
# figures for moving sends to io_uring (issue 30); run it again on the new build
# for the "after".
#
# Servers: throng ($THRONG_BIN, --threads 2, as in bench/fanout.sh and
# bench/engine.sh); throng-tls (not in the default list: the same over its own TLS,
# a fresh self-signed ECDSA P-256 certificate, clients on wss:// trusting it); uws (not in the default list: uWebSockets, C++, one event
# loop; uws-hub for fan-out and uws-echo for echo, built by bench/peers/uws/build.sh,
# needs g++; skipped if it does not build). A fresh server process on a free
# loopback port for every measurement; clients as in the other benchmarks, sources
# spread over 127.0.0.2-127.0.0.254:
#   fanout: bench/clients/fanload, one channel, --subs subscribers, --publish-rate
#           msg/s (10 x 10,000 = 100,000 deliveries/s), --size-byte text messages,
#           --warmup then a --window-second measured window, 2 s grace;
#   echo:   bench/clients/wsload -mode echo, at each of --echo-conns connections,
#           32-byte text, one message in flight per connection, 1 s warmup, then
#           the --window-second window.
# Each scenario runs once per phase (--phases), each time on a new server process,
# so that no tool slows the others' window:
#   cpu     nothing attached: the server's utime+stime (/proc/PID/stat, read by the
#           client) over the window / deliveries (echo: messages) in the window;
#   syscount `perf stat` on the syscall tracepoints (raw_syscalls:sys_enter, and
#           syscalls:sys_enter_NAME for the names in $SYSCOUNT_NAMES) of every thread
#           of the server for the window less 1 s (perf's set-up), inside it:
#           syscalls ÷ (the client's deliveries/s x those seconds), at almost full speed
#           (a tracepoint count does not stop the thread as ptrace does; needs perf);
#   strace  `strace -c -f -p PID` attached for the window: calls per syscall name, and
#           per delivery = calls / deliveries the client counted in the window
#           (strace slows the server: the window holds fewer deliveries; the ratio
#           is what counts; a server that falls behind may also batch more per
#           call than at full speed: compare with syscount). Work that io_uring
#           does inside io_uring_enter (throng's receives) is not seen as
#           separate syscalls, here or in syscount;
#   perf    `perf record -g -p PID` for the window, then `perf report --stdio
#           --no-children`: the top --perf-top symbols by self %. If perf cannot
#           record here (and kernel.perf_event_paranoid=-1 does not help), the
#           output says so and the other phases still run.
# Raw JSON (with the strace tables and perf reports as they came) goes to
# bench/results/sends-profile-<date>.json, a summary to sends-profile-<date>.md.
# Usage: bench/sends_profile.sh [--servers throng,throng-tls,uws] [--scenarios fanout,echo]
#                               [--phases cpu,syscount,strace,perf] [--window 10]
#                               [--subs 10000] [--publish-rate 10] [--size 64]
#                               [--echo-conns 100,1000] [--perf-top 15]
#                               [--results-dir DIR]
# Env:   THRONG_BIN (default <repo>/target/release/throng)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# REPO_DIR, THRONG_BIN; options, logging, builds, servers, machine, report helpers
. "$BENCH_DIR/lib.sh"

SERVERS=throng
SCENARIOS=fanout,echo
PHASES=cpu,syscount,strace,perf
# the syscalls the syscount phase counts one by one (besides the total)
SYSCOUNT_NAMES=sendto,sendmsg,writev,write,recvfrom,recvmsg,read,readv,epoll_wait,epoll_pwait,io_uring_enter,futex
RESULTS_DIR=$BENCH_DIR/results
WINDOW=10            # seconds: the measured window, and how long a tool is attached
SUBS=10000
PUBLISH_RATE=10
SIZE=64
ECHO_CONNS=100,1000
ECHO_SIZE=32
PERF_TOP=15
RATE=3000            # fan-out subscriber connections opened per second
ECHO_RATE=2000       # echo connections opened per second (as bench/engine.sh)
WARMUP=2             # seconds of fan-out publishing before the window
ECHO_WARMUP=1
GRACE=2s
SOURCE_IPS=127.0.0.2-127.0.0.254

parse_options "--servers=SERVERS --scenarios=SCENARIOS --phases=PHASES --window=WINDOW --subs=SUBS
  --publish-rate=PUBLISH_RATE --size=SIZE --echo-conns=ECHO_CONNS --perf-top=PERF_TOP
  --results-dir=RESULTS_DIR" "$@"
check_names server "$SERVERS" throng throng-tls uws
check_names scenario "$SCENARIOS" fanout echo
check_names phase "$PHASES" cpu syscount strace perf
for v in WINDOW SUBS PUBLISH_RATE SIZE PERF_TOP; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || usage_error "${v,,} must be a positive whole number"
done
[ "$WINDOW" -le 60 ] || usage_error "--window is at most 60 s"
for n in ${ECHO_CONNS//,/ }; do [[ $n =~ ^[1-9][0-9]*$ ]] || usage_error "--echo-conns: '$n' is not a count"; done
wantsc() { case ",$SCENARIOS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
wantph() { case ",$PHASES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
if wantph syscount && [ "$WINDOW" -lt 3 ]; then usage_error "--window is at least 3 s with the syscount phase"; fi
need jq
need curl
need timeout
if wantph strace; then need strace; fi

begin_run sends-profile rm
CLIENT_PID=
PARANOID_OLD=   # kernel.perf_event_paranoid before this run set it (put back at exit)
restore_paranoid() {
  if [ -n "${PARANOID_OLD:-}" ]; then sysctl -qw "kernel.perf_event_paranoid=$PARANOID_OLD" >/dev/null 2>&1 || true; PARANOID_OLD=; fi
}
# Also stops a client still running (the server: lib.sh's cleanup).
profile_cleanup() {
  if [ -n "${CLIENT_PID:-}" ] && kill -0 "$CLIENT_PID" 2>/dev/null; then kill -KILL "$CLIENT_PID" 2>/dev/null || true; fi
  restore_paranoid
  cleanup
}
trap profile_cleanup EXIT

# ---------------------------------------------------------------- build
WSLOAD=$BENCH_DIR/clients/wsload/wsload
build_hub_peers      # fanload, uws (uws-hub and uws-echo) if asked, the private throng copy
if wantsc echo; then go_build "$BENCH_DIR/clients/wsload" wsload; fi

# ---------------------------------------------------------------- machine, tools
describe_machine
STRACE_VERSION=$(strace -V 2>/dev/null | head -1 || true)
PERF_VERSION=$(perf --version 2>/dev/null || true)

# perf: can it record here? If not, try kernel.perf_event_paranoid=-1 (as root; the
# old value is put back at exit). PERF_STATUS says what happened, for the results.
perf_can_record() { perf record -q -o "$WORK/perf-probe.data" -- true >/dev/null 2>&1 && [ -s "$WORK/perf-probe.data" ]; }
PERF_OK=false
PERF_STATUS="not asked (--phases)"
PERF_EVENT=
if wantph perf || wantph syscount; then
  if ! command -v perf >/dev/null 2>&1; then
    PERF_STATUS="perf not installed"
  elif perf_can_record; then
    PERF_OK=true; PERF_STATUS="records (kernel.perf_event_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid), uid $(id -u))"
  else
    p=$(cat /proc/sys/kernel/perf_event_paranoid)
    if [ "$(id -u)" = 0 ] && sysctl -qw kernel.perf_event_paranoid=-1 >/dev/null 2>&1; then
      PARANOID_OLD=$p
      if perf_can_record; then
        PERF_OK=true; PERF_STATUS="records after kernel.perf_event_paranoid $p -> -1 (restored at exit)"
      else
        PERF_STATUS="cannot record, even with kernel.perf_event_paranoid=-1: $(perf record -q -o "$WORK/perf-probe.data" -- true 2>&1 | head -2 | tr '\n' ' ')"
      fi
    else
      PERF_STATUS="cannot record (kernel.perf_event_paranoid=$p, uid $(id -u)); sysctl -w kernel.perf_event_paranoid=-1 not possible here"
    fi
  fi
  if [ "$PERF_OK" = true ]; then PERF_EVENT=$(perf evlist -i "$WORK/perf-probe.data" 2>/dev/null | head -1); fi
  rm -f "$WORK/perf-probe.data"
  log "perf: $PERF_STATUS${PERF_EVENT:+; event $PERF_EVENT}"
  [ "$PERF_OK" = true ] || SKIPPED+=("perf and syscount phases: $PERF_STATUS")
fi

# ---------------------------------------------------------------- servers
KIND=fanout   # which scenario server_cmd starts a server for: fanout | echo
server_cmd() { # name port -> sets CMD array
  case "$1:$KIND" in
    throng:fanout) CMD=("$WORK/throng" serve --listen "127.0.0.1:$2" --threads 2 --stats-interval 0) ;;
    throng:echo) CMD=("$WORK/throng" serve --listen "127.0.0.1:$2" --threads 2 --stats-interval 0 --ping-interval 25s) ;;
    throng-tls:fanout) CMD=("$WORK/throng" serve --listen "127.0.0.1:$2" --threads 2 --stats-interval 0 --tls-cert "$CERT" --tls-key "$KEY") ;;
    throng-tls:echo) CMD=("$WORK/throng" serve --listen "127.0.0.1:$2" --threads 2 --stats-interval 0 --ping-interval 25s --tls-cert "$CERT" --tls-key "$KEY") ;;
    uws:fanout) CMD=("$UWS_DIR/bin/uws-hub" --addr "127.0.0.1:$2") ;;
    uws:echo) CMD=("$UWS_DIR/bin/uws-echo" --addr "127.0.0.1:$2") ;;
  esac
}
server_version() {
  case "$1" in
    throng | throng-tls) throng_version throng ;;
    uws) "$UWS_DIR/build.sh" --version ;;
  esac
}
# ready when /healthz answers (throng, uws-hub and uws-echo all have it), over TLS for throng-tls
server_ready() { curl -sf -m 1 "http://127.0.0.1:$1/healthz" >/dev/null 2>&1 || curl -sfk -m 1 "https://127.0.0.1:$1/healthz" >/dev/null 2>&1; }
# throng-tls's certificate, made for this run (the clients trust it with -ca)
CERT=$WORK/cert.pem KEY=$WORK/key.pem
case ",$SERVERS," in *,throng-tls,*)
  need openssl
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout "$KEY" -out "$CERT" >/dev/null 2>&1
esac

# As bench/fanout.sh: before each measurement wait (up to 5 s each, 30 s per run)
# until the machine is < 25% busy over 1 s; the clients record other load anyway.
QUIET_BUDGET=30; QUIET_WAIT_MAX=5; QUIET_WAITED=0

# wait_for_line FILE TEXT SECONDS: FILE gets a line containing TEXT in time
# (while the client $CLIENT_PID still runs).
wait_for_line() {
  local i
  for i in $(seq 1 $(( $3 * 20 ))); do
    grep -qF "$2" "$1" 2>/dev/null && return 0
    kill -0 "$CLIENT_PID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# attach PHASE DIR: what the phase attaches to $SERVER_PID for $WINDOW s
# (in the foreground; each tool ends by itself: timeout sends strace SIGINT,
# perf records for as long as its `sleep` runs).
attach() {
  local dir=$2
  case "$1" in
    cpu) sleep "$WINDOW" ;;
    syscount)
      local ev=(-e raw_syscalls:sys_enter) n
      for n in ${SYSCOUNT_NAMES//,/ }; do ev+=(-e "syscalls:sys_enter_$n"); done
      # perf takes ~0.5 s to set the counters up before it starts `sleep`, and
      # counts while it runs: WINDOW - 1 s, inside the client's window.
      perf stat -x, "${ev[@]}" -o "$dir/syscount.csv" -p "$SERVER_PID" -- sleep "$(( WINDOW - 1 ))" >"$dir/syscount.err" 2>&1 || true ;;
    strace)
      timeout -s INT -k 5 "$WINDOW" strace -c -f -S calls -o "$dir/strace.txt" -p "$SERVER_PID" 2>"$dir/strace.err" || true ;;
    perf)
      perf record -q -g -o "$dir/perf.data" -p "$SERVER_PID" -- sleep "$WINDOW" >"$dir/perf.err" 2>&1 || true ;;
  esac
}

# strace_json FILE: strace -c's table as JSON [{syscall, calls, errors, seconds}]
# plus the total line; null if the file has no table.
strace_json() {
  [ -s "$1" ] || { echo null; return; }
  awk '
    /^[ -]*$/ || /% time/ { next }
    { name = $NF; calls = $4; errors = (NF >= 6) ? $5 : 0; secs = $2
      if (name == "total") { printf "T %s %s %s\n", calls, errors, secs } else { printf "S %s %s %s %s\n", name, calls, errors, secs } }
  ' "$1" | jq -R -s '
    split("\n") | map(select(length > 0) | split(" ")) as $rows |
    { syscalls: [ $rows[] | select(.[0] == "S") | {syscall: .[1], calls: (.[2]|tonumber), errors: (.[3]|tonumber), seconds: (.[4]|tonumber)} ],
      total: ([ $rows[] | select(.[0] == "T") | {calls: (.[1]|tonumber), errors: (.[2]|tonumber), seconds: (.[3]|tonumber)} ] | .[0]) }'
}

# syscount_json FILE: perf stat -x, output as {total, syscalls: [{syscall, calls}]}
# (calls null where perf could not count); null if the file has no counts.
syscount_json() {
  [ -s "$1" ] || { echo null; return; }
  grep -E '^[^#]*,(raw_syscalls|syscalls):' "$1" | jq -R -s '
    split("\n") | map(select(length > 0) | split(",") | {event: .[2], calls: (.[0] | tonumber? // null)}) as $r |
    if ($r | length) == 0 then null else
    { total: ([ $r[] | select(.event == "raw_syscalls:sys_enter") | .calls ] | .[0]),
      syscalls: [ $r[] | select(.event | startswith("syscalls:sys_enter_")) | {syscall: (.event | ltrimstr("syscalls:sys_enter_")), calls} ] } end'
}

# perf_json DIR: the top $PERF_TOP symbols by self % from DIR/perf.data, with the
# report's header lines (event, samples); null without a recording.
perf_json() {
  local dir=$1
  [ -s "$dir/perf.data" ] || { echo null; return; }
  perf report -i "$dir/perf.data" --stdio --no-children -g none --sort dso,symbol --percent-limit 0.1 \
    >"$dir/perf-report.txt" 2>"$dir/perf-report.err" || true
  local top
  top=$(grep -E '^ +[0-9.]+%' "$dir/perf-report.txt" | head -n "$PERF_TOP" |
        sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//' |
        jq -R -s 'split("\n") | map(select(length > 0) | capture("^ *(?<pct>[0-9.]+)% +(?<dso>[^ ]+) +(?<symbol>.*[^ ]) *$") | .pct |= tonumber)')
  jq -n --argjson top "$top" --arg head "$(grep -E '^# (Samples|Event count|Total Lost)' "$dir/perf-report.txt")" \
    --arg lines "$(grep -E '^ +[0-9.]+%' "$dir/perf-report.txt" | head -n "$PERF_TOP")" \
    '{header: ($head | split("\n")), top: $top, report_top_lines: ($lines | split("\n"))}'
}

# run_phase NAME SCEN PHASE TAG: one measurement: a fresh server, the scenario's
# client in the background, PHASE's tool attached for the client's window; writes
# $WORK/NAME-TAG-PHASE.json (the client's JSON + what the tool saw).
run_phase() {
  local name=$1 sc=$2 ph=$3 tag=$4
  local dir=$WORK/$name-$tag-$ph out=$WORK/$name-$tag-$ph.json marker delay
  mkdir -p "$dir"
  if { [ "$ph" = perf ] || [ "$ph" = syscount ]; } && [ "$PERF_OK" != true ]; then echo "{\"error\":\"perf cannot record: $PERF_STATUS\"}" >"$out"; return; fi
  KIND=$sc
  wait_quiet
  if ! start_server "$name" "$tag-$ph"; then echo '{"error":"server did not start"}' >"$out"; return; fi
  sleep 1
  local tls_args=() scheme=ws
  if [ "$name" = throng-tls ]; then tls_args=(-ca "$CERT"); scheme=wss; fi
  if [ "$sc" = fanout ]; then
    if [ "$name" = throng-tls ]; then tls_args+=(-tls); fi
    "$FANLOAD" "${tls_args[@]}" -addr "127.0.0.1:$PORT" -server-pid "$SERVER_PID" -clk-tck "$CLK_TCK" -source-ips "$SOURCE_IPS" \
      -rate "$RATE" -label "$name-$tag-$ph" -conns "$SUBS" -channels 1 -publish-rate "$PUBLISH_RATE" -publishers 1 \
      -size "$SIZE" -warmup "${WARMUP}s" -duration "${WINDOW}s" -grace "$GRACE" -settle 1s -rss-samples 3 \
      >"$dir/client.json" 2>"$dir/client.err" &
    marker="fanload: publishing"; delay=$(awk -v w="$WARMUP" 'BEGIN { printf "%.3f", w + 0.02 }')
  else
    "$WSLOAD" "${tls_args[@]}" -mode echo -url "$scheme://127.0.0.1:$PORT/echo" -server-pid "$SERVER_PID" -clk-tck "$CLK_TCK" \
      -source-ips "$SOURCE_IPS" -conns "$tag_conns" -rate "$ECHO_RATE" -size "$ECHO_SIZE" \
      -warmup "${ECHO_WARMUP}s" -duration "${WINDOW}s" >"$dir/client.json" 2>"$dir/client.err" &
    marker="wsload: echo: opened"; delay=$(awk -v w="$ECHO_WARMUP" 'BEGIN { printf "%.3f", w + 0.05 }')
  fi
  CLIENT_PID=$!
  local attached=false t0='' t1=''
  if wait_for_line "$dir/client.err" "$marker" 60; then
    sleep "$delay"
    t0=$(date +%s.%N); attach "$ph" "$dir"; t1=$(date +%s.%N); attached=true
  fi
  # The client ends by itself (bounded window, grace, closing); give it 60 s more, then stop it.
  for _ in $(seq 1 600); do kill -0 "$CLIENT_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$CLIENT_PID" 2>/dev/null; then log "client still running after its window: stopping it"; kill -KILL "$CLIENT_PID" 2>/dev/null || true; fi
  wait "$CLIENT_PID" 2>/dev/null || true
  CLIENT_PID=
  stop_server
  jq -e 'type == "object"' "$dir/client.json" >/dev/null 2>&1 || echo '{"error":"client printed no JSON"}' >"$dir/client.json"
  local tool=null
  case "$ph" in
    strace) tool=$(strace_json "$dir/strace.txt") ;;
    syscount) tool=$(syscount_json "$dir/syscount.csv") ;;
    perf) tool=$(perf_json "$dir") ;;
  esac
  jq -n --slurpfile c "$dir/client.json" --argjson tool "$tool" --arg phase "$ph" --argjson attached "$attached" --argjson window "$WINDOW" \
    --arg t0 "${t0:-}" --arg t1 "${t1:-}" --arg cerr "$(tail -3 "$dir/client.err" | cut -c1-300)" \
    --arg traw "$(if [ "$ph" = strace ]; then cat "$dir/strace.txt" 2>/dev/null || true; fi)" \
    --arg terr "$(cat "$dir/strace.err" "$dir/syscount.err" "$dir/perf.err" "$dir/perf-report.err" 2>/dev/null | head -5 | cut -c1-300)" \
    '{phase:$phase, attached:$attached,
      tool_seconds: (if $t0 != "" then (($t1|tonumber) - ($t0|tonumber)) else null end),
      count_seconds: (if $phase == "syscount" and $attached then $window - 1 else null end),
      client:$c[0], client_stderr_tail:$cerr}
     + (if $phase == "strace" then {strace:$tool, strace_raw:$traw} elif $phase == "syscount" then {syscount:$tool} elif $phase == "perf" then {perf:$tool} else {} end)
     + (if $terr != "" then {tool_stderr:$terr} else {} end)' >"$out"
}

# The per-delivery figures of one scenario from its phases: $WORK/NAME-TAG.json.
# fanout: unit = the client's deliveries_in_window; echo: its messages (in window).
summarize() {
  local name=$1 tag=$2 sc=$3
  local f
  for f in cpu syscount strace perf; do [ -f "$WORK/$name-$tag-$f.json" ] || echo '{"error":"not run"}' >"$WORK/$name-$tag-$f.json"; done
  jq -n --arg sc "$sc" --arg tag "$tag" \
    --slurpfile cpu "$WORK/$name-$tag-cpu.json" --slurpfile st "$WORK/$name-$tag-strace.json" --slurpfile pf "$WORK/$name-$tag-perf.json" --slurpfile sy "$WORK/$name-$tag-syscount.json" '
    def units(c): if $sc == "fanout" then c.deliveries_in_window else c.messages end;
    ($st[0]) as $s | (if $s.client then units($s.client) else null end) as $u |
    def rate(c): if $sc == "fanout" then c.deliveries_per_sec else c.msgs_per_sec end;
    ($sy[0]) as $k | (if $k.client and $k.count_seconds then rate($k.client) * $k.count_seconds else null end) as $ku |
    {scenario:$sc, tag:$tag,
     cpu_us_per_delivery: (if $cpu[0].client then (if $sc == "fanout" then $cpu[0].client.server_cpu_us_per_delivery else $cpu[0].client.server_cpu_us_per_msg end) else null end),
     cpu_window_deliveries: (if $cpu[0].client then units($cpu[0].client) else null end),
     strace_window_deliveries: $u,
     strace_nominal_deliveries: (if $sc == "fanout" and $s.client then ($s.client.published_in_window * $s.client.opened) else null end),
     syscalls_per_delivery: (if $s.strace and $u and $u > 0 then
        {total: ($s.strace.total.calls / $u),
         by_syscall: [ $s.strace.syscalls[] | {syscall, calls, errors, per_delivery: (.calls / $u)} ]} else null end),
     syscount_window_deliveries: $ku,
     syscount_per_delivery: (if $k.syscount and $ku and $ku > 0 then
        {total: (if $k.syscount.total then $k.syscount.total / $ku else null end),
         by_syscall: [ $k.syscount.syscalls[] | {syscall, calls, per_delivery: (if .calls then .calls / $ku else null end)} ]} else null end),
     perf_top: (if $pf[0].perf then $pf[0].perf.top else null end),
     phases: {cpu:$cpu[0], syscount:$k, strace:$st[0], perf:$pf[0]}}' >"$WORK/$name-$tag.json"
}

select_servers

# Scenarios in turn, each for every server, phase by phase (interleaved, so that a
# slow phase of the shared machine hits every server alike).
TAGS=()
if wantsc fanout; then TAGS+=(fanout); fi
if wantsc echo; then for n in ${ECHO_CONNS//,/ }; do TAGS+=("echo$n"); done; fi
for tag in "${TAGS[@]}"; do
  case "$tag" in fanout) sc=fanout; tag_conns='' ;; *) sc='echo'; tag_conns=${tag#echo} ;; esac
  for ph in ${PHASES//,/ }; do
    for name in "${RAN[@]+"${RAN[@]}"}"; do
      log "$name: $tag, phase $ph, ${WINDOW}s window"
      run_phase "$name" "$sc" "$ph" "$tag"
      log "  -> $(jq -c '{error, attached, tool_seconds, d: (.client.deliveries_in_window // .client.messages), cpu: (.client.server_cpu_us_per_delivery // .client.server_cpu_us_per_msg), syscalls: .strace.total.calls, perf_top1: (.perf.top[0] // null)}' "$WORK/$name-$tag-$ph.json")"
    done
  done
done

# ---------------------------------------------------------------- report
report_paths sends-profile
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)
jq -n --argjson provenance "$PROVENANCE" --argjson machine "$(machine_json nofile_hard)" --arg la0 "$LOADAVG_START" --arg la1 "$LOADAVG_END" \
  --argjson subs "$SUBS" --argjson pr "$PUBLISH_RATE" --argjson size "$SIZE" --argjson window "$WINDOW" \
  --arg echo_conns "$ECHO_CONNS" --argjson echo_size "$ECHO_SIZE" --argjson warmup "$WARMUP" --argjson ewarmup "$ECHO_WARMUP" \
  --arg grace "$GRACE" --arg src "$SOURCE_IPS" --arg phases "$PHASES" --arg scen "$SCENARIOS" --argjson top "$PERF_TOP" --arg scn "$SYSCOUNT_NAMES" \
  --arg strace_v "$STRACE_VERSION" --arg perf_v "$PERF_VERSION" --arg perf_status "$PERF_STATUS" --arg perf_event "$PERF_EVENT" \
  --argjson run_seconds "$RUN_SECONDS" --argjson quiet "$QUIET_WAITED" --argjson skipped "$(skipped_json)" \
  '{provenance:$provenance, machine:($machine + {loadavg_start:$la0, loadavg_end:$la1}),
    params:{scenarios:$scen, phases:$phases, window_seconds:$window,
            fanout:{subscribers:$subs, channels:1, publish_rate:$pr, publishers:1, size:$size, warmup_seconds:$warmup, grace:$grace},
            echo:{conns:($echo_conns | split(",") | map(tonumber)), size:$echo_size, warmup_seconds:$ewarmup, in_flight_per_conn:1},
            source_ips:$src, perf_top:$top,
            strace_command:"strace -c -f -S calls -p PID (SIGINT after the window)",
            syscount_command:"perf stat -x, -e raw_syscalls:sys_enter -e syscalls:sys_enter_NAME... -p PID -- sleep WINDOW",
            syscount_names:($scn | split(",")),
            perf_command:"perf record -g -p PID -- sleep WINDOW; perf report --stdio --no-children -g none --sort dso,symbol"},
    tools:{strace:$strace_v, perf:$perf_v, perf_status:$perf_status, perf_event:$perf_event},
    skipped:$skipped, run_seconds:$run_seconds, quiet_wait_seconds:$quiet, servers:[]}' >"$WORK/all.json"
for name in "${RAN[@]+"${RAN[@]}"}"; do
  scen_files=()
  for tag in "${TAGS[@]}"; do
    case "$tag" in fanout) sc=fanout ;; *) sc='echo' ;; esac
    summarize "$name" "$tag" "$sc"
    scen_files+=("$WORK/$name-$tag.json")
  done
  cmds=$(for k in fanout echo; do KIND=$k; server_cmd "$name" PORT; echo "$k: ${CMD[*]}"; done)
  jq -s --arg name "$name" --arg version "$(server_version "$name")" --arg cmd "$cmds" \
    '{name:$name, version:$version, commands:($cmd | split("\n")), scenarios:.}' "${scen_files[@]}" >"$WORK/$name.json"
  add_server "$WORK/$name.json"
done
cp "$WORK/all.json" "$OUT_JSON"

render() {
  echo "# Where a send goes: syscalls and perf per delivery"
  echo
  echo "- machine: $NPROC cores ($MODEL), $MEM RAM, kernel $KERNEL; load average $LOADAVG_START at start, $LOADAVG_END at end"
  provenance_md
  echo "- date: $DATE; run took ${RUN_SECONDS}s; $STRACE_VERSION; $PERF_VERSION; perf: $PERF_STATUS${PERF_EVENT:+ (event $PERF_EVENT)}"
  echo "- fanout: $SUBS subscribers of one channel, $PUBLISH_RATE msg/s, $SIZE B (client fanload); echo: ${ECHO_CONNS} connections,"
  echo "  $ECHO_SIZE B, one in flight each (client wsload); sources $SOURCE_IPS -> 127.0.0.1; a ${WINDOW} s window per phase,"
  echo "  each phase (cpu: nothing attached; syscount: perf stat on the syscall tracepoints; strace -c -f; perf record -g)"
  echo "  on a fresh server process"
  print_skipped
  echo
  jq -r "$JQ_DEFS"'
    def unit: if .scenario == "fanout" then "delivery" else "message" end;
    (.params.syscount_names) as $names |
    def key: ["sendmsg","sendto","writev","write","send","epoll_wait","epoll_pwait","epoll_ctl","io_uring_enter","recvfrom","recvmsg","read","readv","accept4","futex","close"];
    "## Per delivery (fanout) / per echoed message (echo)", "",
    "| server | scenario | CPU µs per unit (nothing attached) | syscalls per unit (perf stat tracepoints) | syscalls per unit (strace) | units in syscount window | units in strace window (client) | published × subscribers in it | units in CPU window |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    (.servers[] | .name as $n | .scenarios[] |
      "| \($n) | \(.tag) | \(.cpu_us_per_delivery | f2) | \(.syscount_per_delivery.total | sig3) | \(.syscalls_per_delivery.total | sig3) | \(.syscount_window_deliveries | f0) | \(.strace_window_deliveries // "n/a") | \(.strace_nominal_deliveries // "–") | \(.cpu_window_deliveries // "n/a") |"),
    "",
    "## Syscalls per unit at almost full speed (perf stat on the syscall tracepoints for window − 1 s ÷ the client units per second × those seconds)", "",
    "| server | scenario | all | " + ($names | join(" | ")) + " |",
    "|---|---|---:|" + ($names | map("---:") | join("|")) + "|",
    (.servers[] | .name as $n | .scenarios[] | select(.syscount_per_delivery != null) | .syscount_per_delivery as $p |
      "| \($n) | \(.tag) | \($p.total | sig3) | " + ([ $names[] as $x | ($p.by_syscall[] | select(.syscall == $x) | .per_delivery) // null | sig3 ] | join(" | ")) + " |"),
    "",
    "## Syscalls per unit under strace, by name (calls in the strace window ÷ units the client counted in it)", "",
    (.servers[] | .name as $n | .scenarios[] | select(.syscalls_per_delivery != null) |
      "### \($n), \(.tag)", "",
      "| syscall | calls | errors | per \(unit) |", "|---|---:|---:|---:|",
      (.syscalls_per_delivery.by_syscall[] | select(.calls >= 10 or (.syscall | IN(key[]))) |
        "| \(.syscall) | \(.calls) | \(.errors) | \(.per_delivery | sig3) |"),
      ""),
    "## perf: top symbols by self % (no children)", "",
    (.servers[] | .name as $n | .scenarios[] | select(.perf_top != null) |
      "### \($n), \(.tag)", "",
      "| self % | object | symbol |", "|---:|---|---|",
      (.perf_top[] | "| \(.pct) | \(.dso) | `\(.symbol | if length > 110 then .[0:107] + "..." else . end)` |"),
      "")
  ' "$OUT_JSON"
  echo "Syscount: perf stat -e raw_syscalls:sys_enter (all) and syscalls:sys_enter_NAME on every thread of the server, counting for"
  echo "the window less 1 s (inside it), ÷ the client's deliveries/s (echo: messages/s) in the window × those seconds."
  echo "CPU = the server's utime+stime (/proc/PID/stat, read by the client) over the window ÷ deliveries (echo: messages) the client"
  echo "counted in it, with nothing attached. Syscalls: strace -c -f on every thread of the server for the window ÷ the deliveries the"
  echo "client counted in that window (strace slows the server, so that window holds fewer; the ratio is what it shows). io_uring work"
  echo "(throng's receives) happens inside io_uring_enter and is not counted as separate syscalls. The strace window and the client's"
  echo "window are aligned to a few ms, not exactly: at $PUBLISH_RATE publishes/s over ${WINDOW} s, one publish more or less is $(awk -v r="$PUBLISH_RATE" -v w="$WINDOW" 'BEGIN { printf "%.1f", 100 / (r * w) }')% of the fan-out divisor."
  echo "Raw: ${OUT_JSON#"$REPO_DIR"/}"
}
render | tee "$OUT_MD"
