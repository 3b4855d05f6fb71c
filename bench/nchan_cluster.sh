#!/usr/bin/env bash
# Two nodes on one Redis, throng against Nchan, same run (issue 11): the same SSE
# fan-out through Nchan with its Redis storage (Debian's nginx-light +
# libnginx-mod-nchan, `nchan_redis_url` + `nchan_use_redis on`, storage mode
# distributed) and through throng's own cluster (`throng serve --broker
# redis://...`). Per system and scenario, fresh processes: a redis-server on a
# free port (no persistence, --dir in the scratch directory, stopped by pid) and
# two nodes on consecutive loopback ports P and P+1 (two nginx processes, each
# its own prefix directory and `worker_processes 1`, config
# bench/peers/nchan/nginx-redis.conf.template; or two throng nodes, --threads 1).
# The load client is `throng bench push --transport sse`: subscribers
# round-robin over both nodes (--ports P-P+1), the publisher on node 1, sources
# spread over 127.0.0.2-127.0.0.254 (Nchan: --seq-from payload, the client
# numbers the messages itself; throng: its own seq):
#   (A) fan-out: --subs SSE subscribers of one channel, --publish-rate msg/s
#       from one publisher (one request in flight).
#   (B) many channels: --subs-b subscribers over --channels-b channels,
#       --publish-rate-b msg/s in total from --publishers-b publishers, so every
#       publish crosses Redis and every node writes it to its share.
# Measured: deliveries/s, publish-to-delivery p50/p99, lost / duplicated,
# published / target, and the server side's CPU per delivery (utime+stime from
# /proc of both nodes' processes, nginx master + worker, plus redis-server) over
# the load window (from the moment both nodes together hold every subscriber,
# sampled every 0.1 s, for the client's load seconds) and over the whole run
# (connects included); redis-server's share on its own, and Redis commands per
# published message (INFO stats).
# Before the scenarios, each system is checked with curl: an SSE subscriber on
# node 2 must receive a message published on node 1 (and one on node 1 too).
# Fairness: throng runs --threads 1 --ping-interval 0 --history-size 100
# --history-ttl 5m per node; Nchan keeps 100 messages per channel for 5 minutes
# (in Redis), no EventSource pings, one worker per node. Prints the machine line
# and a markdown table with throng ÷ Nchan ratios; raw JSON and the table go to
# bench/results/nchan-cluster-<date>.{json,md}.
#
# Usage: bench/nchan_cluster.sh [--systems throng,nchan] [--scenarios A,B]
#                               [--subs 10000] [--publish-rate 10]
#                               [--subs-b 10000] [--channels-b 1000] [--publish-rate-b 1000]
#                               [--publishers-b 5] [--duration 10s] [--rate 3000]
#                               [--results-dir DIR] [--no-install]
# Installs what is missing (apt-get: nginx-light libnginx-mod-nchan redis-server
# jq curl, with a refusing policy-rc.d so no system service starts; --no-install:
# fail instead) and builds throng (cargo build --release) when
# target/release/throng is missing.
# Env:   THRONG_BIN (default <repo>/target/release/throng: nodes and load client)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# REPO_DIR, THRONG_BIN; options, logging, servers, machine, report helpers
. "$BENCH_DIR/lib.sh"

SYSTEMS=throng,nchan
SCENARIOS=A,B
RESULTS_DIR=$BENCH_DIR/results
SUBS=10000
PUBLISH_RATE=10
SUBS_B=10000
CHANNELS_B=1000
PUBLISH_RATE_B=1000
PUBLISHERS_B=5       # the client's own default at 1,000 msg/s (rate / 200)
DURATION=10s
RATE=3000            # subscriber connections opened per second
INSTALL=true
SOURCE_IPS=127.0.0.2-127.0.0.254
CONF_TEMPLATE=$BENCH_DIR/peers/nchan/nginx-redis.conf.template

parse_options "--systems=SYSTEMS --scenarios=SCENARIOS --subs=SUBS --publish-rate=PUBLISH_RATE
  --subs-b=SUBS_B --channels-b=CHANNELS_B --publish-rate-b=PUBLISH_RATE_B --publishers-b=PUBLISHERS_B
  --duration=DURATION --rate=RATE --results-dir=RESULTS_DIR --no-install=INSTALL=false" "$@"
check_names system "$SYSTEMS" throng nchan
check_names scenario "$SCENARIOS" A B
for v in SUBS PUBLISH_RATE SUBS_B CHANNELS_B PUBLISH_RATE_B PUBLISHERS_B RATE; do
  [[ ${!v} =~ ^[0-9]+$ ]] || usage_error "--$(echo "$v" | tr 'A-Z_' 'a-z-') takes a whole number"
done
SERVERS=$SYSTEMS   # lib.sh's want / select_servers read SERVERS
wantsc() { case ",$SCENARIOS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# ---------------------------------------------------------------- install
install_missing() {
  local pkgs=()
  command -v jq >/dev/null 2>&1 || pkgs+=(jq)
  command -v curl >/dev/null 2>&1 || pkgs+=(curl)
  { command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; } || pkgs+=(redis-server)
  if want nchan; then
    command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || pkgs+=(nginx-light)
    nchan_module >/dev/null || pkgs+=(libnginx-mod-nchan)
  fi
  install_packages "${pkgs[@]+"${pkgs[@]}"}"
}
install_missing
need jq
need curl
need redis-server
need redis-cli
NGINX=$(command -v nginx 2>/dev/null || echo /usr/sbin/nginx)
if want nchan; then NCHAN_SO=$(nchan_module) || { echo "$PROG: ngx_nchan_module.so not found" >&2; exit 1; }; fi

begin_run nchan-cluster rm

# Every process started here (redis, nodes, sampler) is killed by pid on exit.
PIDS=()
SAMPLER_PID=
eval "lib_$(declare -f cleanup)"
cleanup() {
  local p
  if [ -n "${SAMPLER_PID:-}" ]; then kill "$SAMPLER_PID" 2>/dev/null || true; fi
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do kill -KILL "$p" 2>/dev/null || true; done
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
"$WORK/throng" bench --help 2>&1 | grep -q -- '--seq-from' \
  || { echo "$PROG: this throng's bench has no --transport sse / --seq-from (the load client)" >&2; exit 1; }
if want throng && ! "$WORK/throng" serve --help 2>&1 | grep -q -- '--broker'; then
  SKIPPED+=("throng: $THRONG_BIN has no --broker (a build from before the Redis broker; rebuild or set THRONG_BIN)")
fi

# ---------------------------------------------------------------- machine
describe_machine
QUIET_BUDGET=30; QUIET_WAIT_MAX=5; QUIET_WAITED=0
select_servers

# ---------------------------------------------------------------- processes
# Two consecutive free ports: echoes the first.
free_port_pair() {
  local p
  for _ in $(seq 1 50); do
    p=$(free_port) || return 1
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
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
# busy clock ticks of the whole machine (all cores: user nice system irq softirq steal)
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
stop_pid() { # PID: SIGTERM, up to 5 s, then SIGKILL; reaped
  local p=$1
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}

# node_cmd SYSTEM INDEX PORT: sets CMD (and writes node INDEX's Nchan config)
node_cmd() {
  case "$1" in
    throng) CMD=("$WORK/throng" serve --listen "127.0.0.1:$3" --threads 1 --broker "redis://127.0.0.1:$REDIS_PORT"
                 --stats-interval 0 --ping-interval 0 --history-size 100 --history-ttl 5m) ;;
    nchan) nchan_cmd "$WORK/nchan-$2" "$3" 1 "$CONF_TEMPLATE" "redis://127.0.0.1:$REDIS_PORT" ;;
  esac
}

# setup SYSTEM TAG: redis-server and two nodes. Sets REDIS_PORT, REDIS_PID,
# NODE_PORTS, NODE_PIDS (the processes started), SERVER_PIDS (those plus nginx's
# workers: whose CPU counts). Returns 1 when something did not come up.
setup() {
  local sys=$1 tag=$2 i port
  NODE_PORTS=(); NODE_PIDS=(); SERVER_PIDS=(); REDIS_PID=
  REDIS_PORT=$(free_port) || { log "no free port"; return 1; }
  mkdir -p "$WORK/redis-$sys-$tag"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK/redis-$sys-$tag" \
    >"$WORK/redis-$sys-$tag.log" 2>&1 &
  REDIS_PID=$!; PIDS+=("$REDIS_PID")
  for i in $(seq 1 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 || { log "redis-server did not start"; return 1; }
  local base; base=$(free_port_pair) || { log "no free port pair"; return 1; }
  for i in 0 1; do
    port=$((base + i))
    node_cmd "$sys" "$i" "$port"
    "${CMD[@]}" >"$WORK/$sys-$tag-node$i.log" 2>&1 &
    NODE_PIDS+=($!); PIDS+=($!); NODE_PORTS+=("$port")
  done
  for i in 0 1; do
    local ok=
    for _ in $(seq 1 100); do
      kill -0 "${NODE_PIDS[$i]}" 2>/dev/null || break
      if curl -sf -m 1 "http://127.0.0.1:${NODE_PORTS[$i]}/healthz" >/dev/null 2>&1; then ok=1; break; fi
      sleep 0.1
    done
    if [ -z "$ok" ]; then
      log "$sys node $i did not come up on :${NODE_PORTS[$i]}; log:"; tail -5 "$WORK/$sys-$tag-node$i.log" >&2
      [ "$sys" = nchan ] && tail -5 "$WORK/nchan-$i/error.log" >&2
      return 1
    fi
  done
  SERVER_PIDS=("${NODE_PIDS[@]}")
  if [ "$sys" = nchan ]; then
    local w
    for i in 0 1; do
      for _ in $(seq 1 50); do w=($(pgrep -P "${NODE_PIDS[$i]}" || true)); [ "${#w[@]}" -ge 1 ] && break; sleep 0.1; done
      SERVER_PIDS+=("${w[@]}")
    done
  fi
}
teardown() {
  local p
  for p in "${NODE_PIDS[@]+"${NODE_PIDS[@]}"}"; do stop_pid "$p"; done
  for p in "${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}"; do kill -KILL "$p" 2>/dev/null || true; done
  [ -z "${REDIS_PID:-}" ] || stop_pid "$REDIS_PID"
  NODE_PIDS=(); SERVER_PIDS=(); REDIS_PID=
}

# SSE subscribers node INDEX holds now (-1: no answer)
node_subscribers() {
  local port=${NODE_PORTS[$2]}
  case "$1" in
    throng) curl -s -m 1 "http://127.0.0.1:$port/api/stats" | jq -r '.connections.sse // -1' 2>/dev/null || echo -1 ;;
    nchan) curl -s -m 1 "http://127.0.0.1:$port/nchan_status" | awk '/^subscribers:/ {print $2; f=1} END {if (!f) print -1}' ;;
  esac
}
status_text() {
  local i
  for i in 0 1; do
    echo "## node $i"
    case "$1" in
      throng) curl -s -m 2 "http://127.0.0.1:${NODE_PORTS[$i]}/api/stats" 2>/dev/null || true ;;
      nchan) curl -s -m 2 "http://127.0.0.1:${NODE_PORTS[$i]}/nchan_status" 2>/dev/null || true ;;
    esac
    echo
  done
}
# redis_stat FIELD: a number from INFO (stats, cpu, clients sections)
redis_stat() { redis-cli -p "$REDIS_PORT" info all 2>/dev/null | tr -d '\r' | awk -F: -v k="$1" '$1 == k {print $2; f=1} END {if (!f) print "null"}'; }

# sampler SYSTEM WANT OUT: every 0.1 s "unix_ns node_ticks redis_ticks subscribers"
# (subscribers summed over both nodes, asked until WANT are held, then -1: no more
# requests to the nodes during the load).
sampler() {
  local sys=$1 want=$2 out=$3 n a b reached=
  while :; do
    n=-1
    if [ -z "$reached" ]; then
      a=$(node_subscribers "$sys" 0); b=$(node_subscribers "$sys" 1)
      if [ "${a:--1}" -ge 0 ] 2>/dev/null && [ "${b:--1}" -ge 0 ] 2>/dev/null; then n=$((a + b)); fi
      [ "$n" -ge "$want" ] && reached=1
    fi
    echo "$(date +%s%N) $(cpu_ticks "${SERVER_PIDS[@]}") $(cpu_ticks "$REDIS_PID") $n" >>"$out"
    sleep 0.1
  done
}

versions_of() {
  case "$1" in
    throng) echo "$(throng_version throng); two nodes, --threads 1 each; $(redis-server --version | cut -d' ' -f1-3)" ;;
    nchan) echo "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //'), nchan $(dpkg-query -W -f '${Version}' libnginx-mod-nchan 2>/dev/null || echo '?') ($NCHAN_SO); two nginx processes, worker_processes 1 each; $(redis-server --version | cut -d' ' -f1-3)" ;;
  esac
}

# ---------------------------------------------------------------- cross-node check
# check_fanout SYSTEM: curl SSE subscribers on node 2 and node 1, a publish on
# node 1, then one on node 2; writes $WORK/SYSTEM-check.json with what each got.
check_fanout() {
  local sys=$1 out=$WORK/$1-check.json ch=crossnode-check
  if ! setup "$sys" check; then teardown; echo '{"error":"nodes did not start"}' >"$out"; return; fi
  local p1=${NODE_PORTS[0]} p2=${NODE_PORTS[1]} pub1 pub2 s1 s2 mon
  # What the nodes ask Redis meanwhile (MONITOR), for the record
  redis-cli -p "$REDIS_PORT" monitor >"$WORK/$sys-check-monitor.txt" 2>/dev/null &
  mon=$!; PIDS+=("$mon")
  sleep 0.2
  curl -sN -m 4 -H 'Accept: text/event-stream' "http://127.0.0.1:$p2/sse/$ch" >"$WORK/$sys-check-sub-node2.txt" 2>/dev/null &
  s2=$!
  curl -sN -m 4 -H 'Accept: text/event-stream' "http://127.0.0.1:$p1/sse/$ch" >"$WORK/$sys-check-sub-node1.txt" 2>/dev/null &
  s1=$!
  sleep 1
  case "$sys" in
    throng) pub1=$(curl -s -i -m 2 -H 'Content-Type: text/plain' -d 'published-on-node-1' "http://127.0.0.1:$p1/api/publish/$ch" | tr -d '\r' || true)
            sleep 0.3
            pub2=$(curl -s -i -m 2 -H 'Content-Type: text/plain' -d 'published-on-node-2' "http://127.0.0.1:$p2/api/publish/$ch" | tr -d '\r' || true) ;;
    nchan)  pub1=$(curl -s -i -m 2 -X POST -H 'Content-Type: text/plain' -d 'published-on-node-1' "http://127.0.0.1:$p1/pub/$ch" | tr -d '\r' || true)
            sleep 0.3
            pub2=$(curl -s -i -m 2 -X POST -H 'Content-Type: text/plain' -d 'published-on-node-2' "http://127.0.0.1:$p2/pub/$ch" | tr -d '\r' || true) ;;
  esac
  wait "$s1" "$s2" 2>/dev/null || true
  kill "$mon" 2>/dev/null || true; wait "$mon" 2>/dev/null || true
  teardown
  local g2 g1
  g2=$(tr -d '\r' <"$WORK/$sys-check-sub-node2.txt"); g1=$(tr -d '\r' <"$WORK/$sys-check-sub-node1.txt")
  local trace; trace=$(grep -v '^OK$' "$WORK/$sys-check-monitor.txt" | cut -c1-240 | head -400 || true)
  jq -n --arg g2 "$g2" --arg g1 "$g1" --arg pub1 "$pub1" --arg pub2 "$pub2" --arg tr "$trace" '
    {node2_got_node1_publish: ($g2 | contains("data: published-on-node-1")),
     node1_got_node2_publish: ($g1 | contains("data: published-on-node-2")),
     node2_got_node2_publish: ($g2 | contains("data: published-on-node-2")),
     node1_got_node1_publish: ($g1 | contains("data: published-on-node-1")),
     sse_on_node2: $g2, sse_on_node1: $g1, publish_on_node1_response: $pub1, publish_on_node2_response: $pub2,
     redis_monitor: ($tr | split("\n") | map(select(length > 0)))}' >"$out"
}

# ---------------------------------------------------------------- a scenario
# run SYSTEM SCENARIO: writes $WORK/SYSTEM-SCENARIO.json (the client's report plus .summary)
run() {
  local sys=$1 sc=$2 out=$WORK/$1-$2.json samples=$WORK/$1-$2.samples
  local conns channels rate pubs
  case "$sc" in
    A) conns=$SUBS; channels=1; rate=$PUBLISH_RATE; pubs=1 ;;
    B) conns=$SUBS_B; channels=$CHANNELS_B; rate=$PUBLISH_RATE_B; pubs=$PUBLISHERS_B ;;
  esac
  wait_quiet
  if ! setup "$sys" "$sc"; then teardown; echo '{"error":"nodes did not start"}' >"$out"; return; fi
  sleep 1
  local p1=${NODE_PORTS[0]} p2=${NODE_PORTS[1]}
  local args=(bench push --transport sse --url "http://127.0.0.1:$p1/sse/{channel}" --ports "$p1-$p2"
              --conns "$conns" --channels "$channels" --channel-prefix "c$sc-" --publish-rate "$rate" --publishers "$pubs"
              --duration "$DURATION" --rate "$RATE" --source-ips "$SOURCE_IPS" --interval 0 --allow-failures --json)
  case "$sys" in
    throng) args+=(--publish-url "http://127.0.0.1:$p1") ;;
    nchan) args+=(--seq-from payload --publish-url "http://127.0.0.1:$p1/pub/{channel}") ;;
  esac
  : >"$samples"
  local c0 r0 t0 c1 r1 t1 k0 k1 m0 m1 la
  la=$(cut -d' ' -f1-3 /proc/loadavg)
  k0=$(redis_stat total_commands_processed)
  c0=$(cpu_ticks "${SERVER_PIDS[@]}"); r0=$(cpu_ticks "$REDIS_PID"); m0=$(machine_ticks); t0=$(date +%s%N)
  sampler "$sys" "$conns" "$samples" & SAMPLER_PID=$!
  "$WORK/throng" "${args[@]}" >"$out" 2>>"$WORK/bench-push.log" || true
  kill "$SAMPLER_PID" 2>/dev/null || true; wait "$SAMPLER_PID" 2>/dev/null || true; SAMPLER_PID=
  c1=$(cpu_ticks "${SERVER_PIDS[@]}"); r1=$(cpu_ticks "$REDIS_PID"); m1=$(machine_ticks); t1=$(date +%s%N)
  k1=$(redis_stat total_commands_processed)
  local st; st=$(status_text "$sys")
  local cmdstats; cmdstats=$(redis-cli -p "$REDIS_PORT" info commandstats 2>/dev/null | tr -d '\r' | grep '^cmdstat_' || true)
  local pids="${SERVER_PIDS[*]}" rpid=$REDIS_PID
  local logs=""
  case "$sys" in
    nchan) logs=$(grep -hv -e ' \[info\] ' -e 'is discouraged' "$WORK"/nchan-[01]/error.log 2>/dev/null | tail -5 | cut -c1-300 || true) ;;
    throng) logs=$(tail -q -n 3 "$WORK/$sys-$sc-node0.log" "$WORK/$sys-$sc-node1.log" 2>/dev/null | cut -c1-300 || true) ;;
  esac
  teardown
  jq -e 'type == "object"' "$out" >/dev/null 2>&1 || { echo '{"error":"throng bench push printed no JSON (see bench-push.log)"}' >"$out"; return; }
  # The load window: from the first sample with every subscriber held (the client
  # starts publishing then) for the report's load seconds.
  local secs; secs=$(jq -r '.load_secs // .duration_secs // empty' "$out")
  local win; win=$(awk -v want="$conns" -v secs="${secs:-0}" '
      { t[NR] = $1; c[NR] = $2; r[NR] = $3; s[NR] = $4; if ($4 > max) max = $4 }
      END {
        if (NR == 0 || secs <= 0) { print "null null null null"; exit }
        for (i = 1; i <= NR; i++) if (s[i] >= max && s[i] >= 0) { a = i; break }
        if (!a) { print "null null null null"; exit }
        end = t[a] + secs * 1e9; b = a
        for (i = a; i <= NR; i++) if (t[i] <= end) b = i
        printf "%d %d %.6f %d\n", c[b] - c[a], r[b] - r[a], (t[b] - t[a]) / 1e9, max
      }' "$samples")
  local wt wr ws ss
  read -r wt wr ws ss <<<"$win"
  jq --argjson clk "$CLK_TCK" --arg wt "$wt" --arg wr "$wr" --arg ws "$ws" --arg ss "$ss" \
     --argjson c0 "$c0" --argjson c1 "$c1" --argjson r0 "$r0" --argjson r1 "$r1" --argjson t0 "$t0" --argjson t1 "$t1" \
     --argjson m0 "$m0" --argjson m1 "$m1" --arg la "$la" --arg k0 "$k0" --arg k1 "$k1" --argjson rate "$rate" --argjson conns "$conns" --argjson channels "$channels" \
     --argjson pubs "$pubs" --arg st "$st" --arg pids "$pids" --arg rpid "$rpid" --arg lg "$logs" --arg cs "$cmdstats" \
     --arg cmd "throng ${args[*]}" '
    def num($x): if $x == "null" or $x == "" then null else ($x | tonumber) end;
    def per($a; $b): if $a == null or $b == null or $b == 0 then null else $a / $b end;
    (.load_secs // .duration_secs) as $secs |
    (.push.delivered // .messages_total) as $delivered |
    (.messages_received_in_load // $delivered) as $in_load |
    (num($wt)) as $wt | (num($wr)) as $wr |
    (if num($k0) == null or num($k1) == null then null else num($k1) - num($k0) end) as $rcmds |
    . + {command: $cmd, summary: {
      subscribers: $conns, channels: $channels, publish_rate: $rate, publishers: $pubs,
      deliveries_per_sec: (if .throughput_msgs_per_sec != null then .throughput_msgs_per_sec
                           elif $secs != null and $secs > 0 and $delivered != null then $delivered / $secs else null end),
      p50_us: .latency.median_us, p99_us: .latency.p99_us,
      published: .push.published, publish_target: (if $secs == null then null else ($secs * $rate | round) end),
      publish_errors: .push.publish_errors, expected: .push.expected_deliveries, delivered: $delivered,
      lost: .push.lost, duplicated: .push.duplicated, out_of_order: .push.out_of_order,
      failed_connections: (.connections.failed // .failed // null),
      window_secs: num($ws), subscribers_seen: num($ss),
      window_nodes_cpu_secs: (if $wt == null then null else $wt / $clk end),
      window_redis_cpu_secs: (if $wr == null then null else $wr / $clk end),
      server_cpu_us_per_delivery: (if $wt == null then null else per(($wt + $wr) / $clk * 1e6; $in_load) end),
      nodes_cpu_us_per_delivery: (if $wt == null then null else per($wt / $clk * 1e6; $in_load) end),
      redis_cpu_us_per_delivery: (if $wr == null then null else per($wr / $clk * 1e6; $in_load) end),
      whole_run_secs: (($t1 - $t0) / 1e9),
      whole_run_nodes_cpu_secs: (($c1 - $c0) / $clk), whole_run_redis_cpu_secs: (($r1 - $r0) / $clk),
      whole_run_server_cpu_us_per_delivery: per(($c1 - $c0 + $r1 - $r0) / $clk * 1e6; $delivered),
      whole_run_redis_cpu_us_per_delivery: per(($r1 - $r0) / $clk * 1e6; $delivered),
      whole_run_machine_cpu_secs: (($m1 - $m0) / $clk), client_cpu_secs: .client_cpu_secs,
      other_processes_cpu_secs: (if .client_cpu_secs == null then null
                                 else ($m1 - $m0 - ($c1 - $c0) - ($r1 - $r0)) / $clk - .client_cpu_secs end),
      loadavg_at_start: $la,
      redis_commands: $rcmds,
      redis_commands_per_published_message: per($rcmds; .push.published)
    }, server_status: $st, server_pids: $pids, redis_pid: $rpid, server_log_tail: $lg, redis_commandstats: $cs}' \
    "$out" >"$out.tmp" && mv "$out.tmp" "$out"
}

# ---------------------------------------------------------------- run
for sys in "${RAN[@]+"${RAN[@]}"}"; do
  log "$sys: cross-node check (SSE subscriber on node 2, publish on node 1)"
  check_fanout "$sys"
  log "  -> $(jq -c '{node2_got_node1_publish, node1_got_node2_publish, error}' "$WORK/$sys-check.json")"
done
for sc in A B; do
  wantsc "$sc" || continue
  for sys in "${RAN[@]+"${RAN[@]}"}"; do
    case "$sc" in
      A) log "$sys: (A) $SUBS SSE subscribers of 1 channel over 2 nodes, $PUBLISH_RATE msg/s, $DURATION" ;;
      B) log "$sys: (B) $SUBS_B SSE subscribers over $CHANNELS_B channels over 2 nodes, $PUBLISH_RATE_B msg/s, $DURATION" ;;
    esac
    run "$sys" "$sc"
    log "  -> $(jq -c '.summary // {error}' "$WORK/$sys-$sc.json")"
  done
done

# ---------------------------------------------------------------- report
report_paths nchan-cluster
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)
jq -n --argjson provenance "$PROVENANCE" --argjson machine "$(machine_json nofile_hard)" --arg la0 "$LOADAVG_START" --arg la1 "$LOADAVG_END" \
  --argjson subs "$SUBS" --argjson pr "$PUBLISH_RATE" --argjson subsb "$SUBS_B" --argjson chb "$CHANNELS_B" \
  --argjson prb "$PUBLISH_RATE_B" --argjson pubsb "$PUBLISHERS_B" --arg dur "$DURATION" --argjson rate "$RATE" \
  --arg src "$SOURCE_IPS" --arg sc "$SCENARIOS" --argjson run_seconds "$RUN_SECONDS" --argjson quiet "$QUIET_WAITED" \
  --argjson skipped "$(skipped_json)" --rawfile conf "$CONF_TEMPLATE" --arg redis "$(redis-server --version)" \
  '{provenance:$provenance, machine:($machine + {loadavg_start:$la0, loadavg_end:$la1}), redis:$redis,
    params:{scenarios:$sc, nodes:2, A:{subscribers:$subs, channels:1, publish_rate:$pr, publishers:1},
            B:{subscribers:$subsb, channels:$chb, publish_rate:$prb, publishers:$pubsb},
            duration:$dur, conn_rate:$rate, source_ips:$src},
    nchan_conf_template:$conf, skipped:$skipped, run_seconds:$run_seconds, quiet_wait_seconds:$quiet, servers:[]}' >"$WORK/all.json"
for sys in "${RAN[@]+"${RAN[@]}"}"; do
  for f in check A B; do [ -f "$WORK/$sys-$f.json" ] || echo '{"error":"not run"}' >"$WORK/$sys-$f.json"; done
  REDIS_PORT=R; node_cmd "$sys" 0 P
  jq -n --arg name "$sys" --arg version "$(versions_of "$sys")" --arg cmd "${CMD[*]} (and node 1 on P+1)" \
    --slurpfile c "$WORK/$sys-check.json" --slurpfile a "$WORK/$sys-A.json" --slurpfile b "$WORK/$sys-B.json" \
    '{name:$name, version:$version, node_command:$cmd, crossnode_check:$c[0], A:$a[0], B:$b[0]}' >"$WORK/$sys.json"
  add_server "$WORK/$sys.json"
done
cp "$WORK/all.json" "$OUT_JSON"

render() {
  echo "# Two nodes on one Redis: throng against Nchan (SSE)"
  echo
  echo "- machine: $NPROC cores ($MODEL), $MEM RAM, kernel $KERNEL, open files (hard) $NOFILE; load average $LOADAVG_START at start, $LOADAVG_END at end"
  provenance_md
  echo "- date: $DATE; run took ${RUN_SECONDS}s; per system and scenario: a fresh redis-server and two fresh nodes on consecutive loopback ports;"
  echo "  subscribers round-robin over both nodes, the publisher on node 1 (one request in flight per publisher); clients on the same cores, sources $SOURCE_IPS"
  echo "- A: $SUBS SSE subscribers of 1 channel, $PUBLISH_RATE msg/s, 1 publisher; B: $SUBS_B SSE subscribers over $CHANNELS_B channels, $PUBLISH_RATE_B msg/s in total, $PUBLISHERS_B publishers; $DURATION each (\`throng bench push --transport sse\`; Nchan: \`--seq-from payload\`)"
  for sys in "${RAN[@]+"${RAN[@]}"}"; do echo "- $sys: $(jq -r --arg n "$sys" '.servers[] | select(.name == $n) | .version' "$OUT_JSON")"; done
  print_skipped
  jq -r '.servers[] | "- cross-node check, \(.name): " + (.crossnode_check | if .error then .error else
      "SSE subscriber on node 2 got node 1'"'"'s publish: \(.node2_got_node1_publish); node 1 got node 2'"'"'s: \(.node1_got_node2_publish)" end)' "$OUT_JSON"
  echo
  jq -r "$JQ_DEFS"'
    def s(e): if ok(e) == null then null else e.summary end;
    def ms: if . == null then null else . / 1000 end;
    "| run | deliveries/s | p50 ms | p99 ms | lost | dup | published / target | server CPU µs/delivery (nodes + redis) | of it redis | whole run µs/delivery | Redis cmds / message |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    (["A", "B"][] as $sc | .servers[] | . as $v | select($v[$sc].error != "not run") |
      if s($v[$sc]) == null then "| \($v.name) \($sc) | \($v[$sc].error) | | | | | | | | | |" else
      (s($v[$sc])) as $e |
      "| \($v.name) \($sc) | \($e.deliveries_per_sec | f0) | \($e.p50_us | ms | f1) | \($e.p99_us | ms | f1) | \($e.lost // "n/a") | \($e.duplicated // "n/a") | \($e.published) / \($e.publish_target) | \($e.server_cpu_us_per_delivery | f2) | \($e.redis_cpu_us_per_delivery | f2) | \($e.whole_run_server_cpu_us_per_delivery | f2) | \($e.redis_commands_per_published_message | f1) |" end),
    "",
    ((.servers | map(select(.name == "throng")) | .[0]) as $t |
     (.servers | map(select(.name == "nchan")) | .[0]) as $n |
     if $t == null or $n == null then "(throng and nchan not both measured: no ratios)" else
      "| throng ÷ Nchan | deliveries/s | p50 | p99 | server CPU/delivery | redis CPU/delivery | whole run CPU/delivery |",
      "|---|---:|---:|---:|---:|---:|---:|",
      (["A", "B"][] as $sc | select($t[$sc].error != "not run") | (s($t[$sc])) as $a | (s($n[$sc])) as $b |
        "| \($sc) | \(r($a.deliveries_per_sec; $b.deliveries_per_sec) | f2) | \(r($a.p50_us; $b.p50_us) | f2) | \(r($a.p99_us; $b.p99_us) | f2) | \(r($a.server_cpu_us_per_delivery; $b.server_cpu_us_per_delivery) | f2) | \(r($a.redis_cpu_us_per_delivery; $b.redis_cpu_us_per_delivery) | f2) | \(r($a.whole_run_server_cpu_us_per_delivery; $b.whole_run_server_cpu_us_per_delivery) | f2) |")
     end),
    "",
    "Details:",
    "",
    "| run | published / expected / delivered | out of order | failed conns | subscribers held | window s | CPU s in window: nodes / redis | CPU s whole run: nodes / redis / client / other processes | redis µs/delivery, whole run | load average at start |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    (["A", "B"][] as $sc | .servers[] | . as $v | select(s($v[$sc]) != null) | (s($v[$sc])) as $e |
      "| \($v.name) \($sc) | \($e.published) / \($e.expected) / \($e.delivered) | \($e.out_of_order) | \($e.failed_connections // "n/a") | \($e.subscribers_seen // "n/a") | \($e.window_secs | f2) | \($e.window_nodes_cpu_secs | f2) / \($e.window_redis_cpu_secs | f2) | \($e.whole_run_nodes_cpu_secs | f2) / \($e.whole_run_redis_cpu_secs | f2) / \($e.client_cpu_secs | f2) / \($e.other_processes_cpu_secs | f2) | \($e.whole_run_redis_cpu_us_per_delivery | f2) | \($e.loadavg_at_start) |")
  ' "$OUT_JSON"
  echo
  echo "Server CPU = utime+stime of both nodes' processes (Nchan: each nginx master and its worker) plus redis-server, over the load"
  echo "window (from the moment both nodes together hold every subscriber, sampled every 0.1 s, for the client's load seconds) ÷"
  echo "deliveries in it, publish requests included; 'whole run' also counts the SSE handshakes, subscribes and closes."
  echo "'other processes' = the machine's busy CPU over the run (/proc/stat) minus nodes, redis and the load client: work next door,"
  echo "this script's sampler, and kernel network work charged to no process of the run (ksoftirqd, softirqs on an idle core);"
  echo "it does not tell these apart, so read it as an upper bound on the competition the measurement had."
  echo "Latency = receive time − publish time (client clock). lost = published but never received by a subscriber it was for."
  echo "Redis cmds / message = Redis commands processed over the whole run (INFO total_commands_processed; a Lua script counts"
  echo "its inner calls too) ÷ messages published. Ratios: CPU and latency below 1 favour throng; deliveries/s above 1 does."
  echo "This machine is shared with other work; load average above. Nchan config: ${CONF_TEMPLATE#"$REPO_DIR"/}."
  echo "Raw: ${OUT_JSON#"$REPO_DIR"/}"
}
render | tee "$OUT_MD"
