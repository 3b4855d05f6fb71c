# Helpers of bench/publish_redis.sh (sourced after bench/lib.sh, not run): the Redis
# a row's server publishes through (one redis-server, or a 3-master Redis Cluster),
# each Redis process reached through its own Toxiproxy proxy with an optional
# latency toxic, and the rows' Markdown tables. The caller sets TOXIPROXY_BIN and
# has run lib.sh's begin_run (WORK).

# ---------------------------------------------------------------- Toxiproxy

TOXI_PID=
TOXI_API=
# start_toxiproxy: Toxiproxy's server on a free loopback port, driven over its HTTP
# API with curl for the whole run (proxies come and go per row).
start_toxiproxy() {
  local port
  port=$(free_port) || { log "no free port for toxiproxy"; return 1; }
  "$TOXIPROXY_BIN" -host 127.0.0.1 -port "$port" >"$WORK/toxiproxy.log" 2>&1 &
  TOXI_PID=$!
  TOXI_API=http://127.0.0.1:$port
  for _ in $(seq 1 50); do
    curl -sf "$TOXI_API/version" >/dev/null 2>&1 && return 0
    kill -0 "$TOXI_PID" 2>/dev/null || break
    sleep 0.1
  done
  log "toxiproxy not answering on :$port"; return 1
}
stop_toxiproxy() {
  [ -n "$TOXI_PID" ] || return 0
  kill -TERM "$TOXI_PID" 2>/dev/null || true
  reap_pids "$TOXI_PID"
  wait "$TOXI_PID" 2>/dev/null || true
  TOXI_PID=
}
# toxi_post PATH JSON: one API call; fails (and says what Toxiproxy answered) unless 2xx.
toxi_post() {
  local answer
  if ! answer=$(curl -sS -f -X POST -H 'Content-Type: application/json' "$TOXI_API$1" -d "$2" 2>&1); then
    log "toxiproxy POST $1 $2: $answer"; return 1
  fi
}
# toxi_proxy NAME LISTEN_PORT UPSTREAM_PORT: a proxy 127.0.0.1:LISTEN_PORT -> 127.0.0.1:UPSTREAM_PORT.
toxi_proxy() {
  toxi_post /proxies "$(jq -nc --arg n "$1" --arg l "127.0.0.1:$2" --arg u "127.0.0.1:$3" \
    '{name: $n, listen: $l, upstream: $u, enabled: true}')"
}
# toxi_latency NAME MS: MS milliseconds added to every byte Redis sends back (the
# downstream stream, Redis -> server), no jitter; nothing for 0 (the bare proxy hop).
toxi_latency() {
  [ "$2" -gt 0 ] || return 0
  toxi_post "/proxies/$1/toxics" "$(jq -nc --argjson ms "$2" \
    '{name: "latency", type: "latency", stream: "downstream", toxicity: 1, attributes: {latency: $ms, jitter: 0}}')"
}
toxi_delete() { curl -sf -X DELETE "$TOXI_API/proxies/$1" >/dev/null 2>&1 || true; }

# ---------------------------------------------------------------- the Redis of a row

# After start_backing: the redis-server pids (REDIS_PIDS), their own addresses for
# INFO (REDIS_ADDRS, comma-separated: never through the proxy, so reading them
# pays no latency), the addresses the server is given (BROKER_ADDRS: the proxies),
# and the proxies made (PROXIES).
REDIS_PIDS=()
REDIS_ADDRS=
BROKER_ADDRS=
PROXIES=()

# redis_node DIR PORT [ARG...]: a redis-server without persistence in DIR, its pid appended to REDIS_PIDS.
redis_node() {
  local dir=$1 port=$2; shift 2
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --daemonize no "$@" >"$dir/redis.log" 2>&1 &
  REDIS_PIDS+=($!)
  for _ in $(seq 1 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  log "redis-server not ready on :$port"; return 1
}

# fresh_port VAR: a port from lib.sh's free_port into VAR, never one this row was
# already given (a port is only taken when its process binds it, and a row picks
# up to nine before that). Sets VAR rather than printing it: a $(...) subshell
# would not keep ROW_PORTS.
ROW_PORTS=" "
fresh_port() {
  local p
  for _ in $(seq 1 20); do
    p=$(free_port) || return 1
    case "$ROW_PORTS" in *" $p "*) continue ;; esac
    ROW_PORTS+="$p "; printf -v "$1" '%s' "$p"; return 0
  done
  log "no free port"; return 1
}

# start_backing TOPOLOGY TAG LATENCY_MS: a fresh Redis for one row and a proxy per
# Redis process, with LATENCY_MS on each. single: one redis-server. cluster: three
# masters (no replicas) created with redis-cli --cluster create; each node announces
# its proxy's port (cluster-announce-port), so CLUSTER SLOTS and every MOVED send
# clients through the proxies, while the nodes' bus (cluster-announce-bus-port, the
# real one) stays direct.
start_backing() {
  local topology=$1 tag=$2 ms=$3 dir=$WORK/redis-$2 port proxy_port bus i nodes=()
  REDIS_PIDS=(); REDIS_ADDRS=; BROKER_ADDRS=; PROXIES=(); ROW_PORTS=" "
  local count=1
  [ "$topology" = cluster ] && count=3
  for i in $(seq 1 "$count"); do
    fresh_port port && fresh_port proxy_port || return 1
    toxi_proxy "$tag-$i" "$proxy_port" "$port" || return 1
    PROXIES+=("$tag-$i")
    if [ "$topology" = cluster ]; then
      fresh_port bus || return 1
      redis_node "$dir/$i" "$port" --cluster-enabled yes --cluster-port "$bus" \
        --cluster-config-file "$dir/$i/nodes.conf" --cluster-node-timeout 1000 \
        --cluster-announce-ip 127.0.0.1 --cluster-announce-port "$proxy_port" \
        --cluster-announce-bus-port "$bus" || return 1
    else
      redis_node "$dir/$i" "$port" || return 1
    fi
    nodes+=("127.0.0.1:$port")
    REDIS_ADDRS+=${REDIS_ADDRS:+,}127.0.0.1:$port
    BROKER_ADDRS+=${BROKER_ADDRS:+,}127.0.0.1:$proxy_port
  done
  if [ "$topology" = cluster ]; then
    if ! redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1; then
      log "redis-cli --cluster create failed:"; tail -3 "$dir/create.log" >&2; return 1
    fi
    wait_cluster_ok || return 1
  fi
  # The toxic goes on last: creating the cluster does not pay it.
  for i in "${PROXIES[@]}"; do toxi_latency "$i" "$ms" || return 1; done
}

# wait_cluster_ok: every node says cluster_state:ok and lists the proxies' ports
# (gossip has spread every node's announced port), within 30 s.
wait_cluster_ok() {
  local addr want ok
  for _ in $(seq 1 300); do
    ok=1
    for addr in ${REDIS_ADDRS//,/ }; do
      redis-cli -p "${addr##*:}" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || { ok=; break; }
      for want in ${BROKER_ADDRS//,/ }; do
        redis-cli -p "${addr##*:}" cluster nodes 2>/dev/null | grep -q " $want@" || { ok=; break 2; }
      done
    done
    [ -n "$ok" ] && return 0
    sleep 0.1
  done
  log "cluster not ok (or not announcing the proxies) after 30 s"; return 1
}

stop_backing() {
  local p
  for p in "${PROXIES[@]+"${PROXIES[@]}"}"; do toxi_delete "$p"; done
  PROXIES=()
  [ ${#REDIS_PIDS[@]} -gt 0 ] || return 0
  kill -TERM "${REDIS_PIDS[@]}" 2>/dev/null || true
  reap_pids "${REDIS_PIDS[@]}"
  for p in "${REDIS_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  REDIS_PIDS=()
}
kill_backing() {
  if [ ${#REDIS_PIDS[@]} -gt 0 ]; then kill -KILL "${REDIS_PIDS[@]}" 2>/dev/null || true; fi
  if [ -n "$TOXI_PID" ]; then kill -KILL "$TOXI_PID" 2>/dev/null || true; fi
}

# ---------------------------------------------------------------- the report's tables

# jq: a row's label and what a turn histogram's cumulative buckets hold per bucket.
PUB_JQ_DEFS='
  def topo: .topology // "single";
  def lat: if .latency_ms == null then "+0 (no proxy)" else "+\(.latency_ms)" end;
  def per_bucket: . as $b | [range(0; $b | length) | {le: $b[.].le,
    turns: ($b[.].turns - (if . == 0 then 0 else $b[. - 1].turns end))}];
'

# publish_tables FILE: the Markdown tables of a publish_redis result.
publish_tables() {
  echo "| topology | Redis latency ms | server | publishes/s | p50 ms | p99 ms | errors | redis CPU µs/publish | server CPU µs/publish | proxy CPU µs/publish |"
  echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
  jq -r "$JQ_DEFS$PUB_JQ_DEFS"'
    .servers[] | .pubload as $p |
    "| \(topo) | \(lat) | \(.name) | \($p.publishes_per_s | f0) | \($p.latency_us.p50 / 1000 | f2) | \($p.latency_us.p99 / 1000 | f2) | \($p.errors) | \(.redis_cpu_us_per_publish | f1) | \(.server_cpu_us_per_publish | f1) | \(.proxy_cpu_us_per_publish | f1) |"' "$1"
  echo
  echo "throng ÷ Centrifugo per (topology, latency): publishes/s (above 1: throng publishes more), p99 and CPU per publish (below 1: throng needs less):"
  echo
  echo "| topology | Redis latency ms | publishes/s | p99 | redis CPU/publish | server CPU/publish |"
  echo "|---|---|---:|---:|---:|---:|"
  jq -r "$JQ_DEFS$PUB_JQ_DEFS"'
    .servers | group_by([(if topo == "single" then 0 else 1 end), (.latency_ms // -1)])[] |
    (map(select(.name == "throng")) | .[0]) as $t | (map(select(.name == "centrifugo")) | .[0]) as $c |
    select($t != null and $c != null) |
    "| \($t | topo) | \($t | lat) | \(r($t.pubload.publishes_per_s; $c.pubload.publishes_per_s) | f2)x | \(r($t.pubload.latency_us.p99; $c.pubload.latency_us.p99) | f2)x | \(r($t.redis_cpu_us_per_publish; $c.redis_cpu_us_per_publish) | f2)x | \(r($t.server_cpu_us_per_publish; $c.server_cpu_us_per_publish) | f2)x |"' "$1"
  echo
  echo "throng's loop turns in the window (throng_loop_turn_seconds from /metrics, after minus before; turns per bucket, not cumulative); the slowest turn is the gauge at the window's end, since the server started (\"grew\": it was set inside the window):"
  echo
  # The bucket columns as the server's /metrics bounds them (seconds, `le`).
  jq -r '[.servers[] | select(.pubload.loop_turns != null)][0].pubload.loop_turns.buckets_delta // [] | map(.le) as $les |
    "| topology | Redis latency ms | turns | \($les | map(if . == "+Inf" then "longer" else "≤ \(.) s" end) | join(" | ")) | turns/publish | slowest ms |",
    "|---|---|---:|\($les | map("---:") | join("|"))|---:|---:|"' "$1"
  jq -r "$JQ_DEFS$PUB_JQ_DEFS"'
    .servers[] | select(.name == "throng" and .pubload.loop_turns != null) | .pubload as $p | $p.loop_turns as $lt |
    ($lt.buckets_delta | per_bucket | map(.turns | f0) | join(" | ")) as $cells |
    "| \(topo) | \(lat) | \($lt.count_delta | f0) | \($cells) | \(r($lt.count_delta; $p.published) | f2) | \($lt.slowest_secs_after * 1000 | f2)\(if $lt.slowest_grew_in_window then " (grew)" else "" end) |"' "$1"
  echo
  echo "Redis commands per publish: INFO commandstats deltas over the window (summed over a cluster's masters) divided by the publishes answered in it; a command a script (EVALSHA, FCALL) runs is counted on its own row and again inside the script's usec."
  echo
  echo "| topology | Redis latency ms | server | redis commands per publish (calls, usec) |"
  echo "|---|---|---|---|"
  jq -r "$JQ_DEFS$PUB_JQ_DEFS"'
    .servers[] | .pubload as $p |
    ($p.redis_commandstats_delta // {} | to_entries | sort_by(-.value.usec) | map(select(.value.calls > 0)) |
      map("\(.key) \((.value.calls / ([$p.published, 1] | max)) | f2), \((.value.usec / ([$p.published, 1] | max)) | f2) µs") | join("; ")) as $cmds |
    "| \(topo) | \(lat) | \(.name) | \($cmds) |"' "$1"
}
