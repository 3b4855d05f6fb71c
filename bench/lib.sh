# Shell helpers shared by bench/engine.sh and bench/fanout.sh (sourced, not run).
# The caller sets BENCH_DIR (its own directory) before sourcing, and defines
# server_cmd NAME PORT (sets the CMD array); it sets the QUIET_* settings before
# wait_quiet. The helpers keep the server's pid in SERVER_PID, the run's scratch
# directory in WORK, and what cannot run in SKIPPED ("name: reason").

REPO_DIR=$(dirname "$BENCH_DIR")
THRONG_BIN=${THRONG_BIN:-$REPO_DIR/target/release/throng}
PROG=${0##*/}   # in messages: engine.sh, fanout.sh
# The command line as the script was started (lib.sh is sourced at the top of the
# script, before any option is read): for provenance_json.
RUN_ARGV=("$0" "$@")

# ---------------------------------------------------------------- options, messages

# The comment block at the top of the script, without the '#'s.
usage() { awk 'NR > 1 && /^set /{exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; }
usage_error() { echo "$PROG: $*" >&2; usage >&2; exit 2; }

# parse_options SPEC ARG...: SPEC lists "--option=VAR" (takes a value, as
# --option V or --option=V, into VAR) and "--switch=VAR=VALUE" (no value; sets
# VAR to VALUE). -h/--help prints the usage; anything else is an error (exit 2).
parse_options() {
  local spec=$1 arg opt entry target found; shift
  while [ $# -gt 0 ]; do
    arg=$1; shift
    case "$arg" in -h|--help) usage; exit 0 ;; esac
    opt=${arg%%=*}; found=
    for entry in $spec; do
      [ "${entry%%=*}" = "$opt" ] || continue
      found=1; target=${entry#*=}
      if [[ $target == *=* ]]; then
        [ "$opt" = "$arg" ] || usage_error "$opt takes no value"
        printf -v "${target%%=*}" '%s' "${target#*=}"
      elif [ "$opt" != "$arg" ]; then
        printf -v "$target" '%s' "${arg#*=}"
      else
        [ $# -ge 1 ] || usage_error "$opt needs a value"
        printf -v "$target" '%s' "$1"; shift
      fi
      break
    done
    [ -n "$found" ] || usage_error "unknown option $arg"
  done
}

# check_names WHAT LIST ALLOWED...: every name in the comma-separated LIST is one of ALLOWED.
check_names() {
  local what=$1 list=$2 n; shift 2
  for n in ${list//,/ }; do
    case " $* " in *" $n "*) ;; *) echo "$PROG: unknown $what '$n'" >&2; exit 2 ;; esac
  done
}

# A throng-base server (in --servers) needs the binary to compare with.
check_throng_base() {
  if want throng-base && [ -z "${THRONG_BASE_BIN:-}" ]; then
    echo "$PROG: --servers throng-base needs THRONG_BASE_BIN (the throng binary to compare with)" >&2; exit 2
  fi
}

want() { case ",$SERVERS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
log() { printf '[%s %s] %s\n' "${PROG%.sh}" "$(date +%H:%M:%S)" "$*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "$PROG: needs $1" >&2; exit 1; }; }

# ---------------------------------------------------------------- the run

# begin_run NAME [rm]: start time, STAMP, a scratch directory WORK
# (/tmp/throng-NAME.*), the results directory, and an exit trap that kills a
# server still running (with "rm", it also removes WORK).
begin_run() {
  RUN_START=$(date +%s)
  STAMP=$(date +%Y%m%d-%H%M%S)
  PROVENANCE=$(provenance_json)
  WORK=$(mktemp -d "/tmp/throng-$1.XXXXXX")
  RM_WORK_ON_EXIT=${2:-}
  mkdir -p "$RESULTS_DIR"
  SERVER_PID=
  SKIPPED=()
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}
cleanup() {
  if [ -n "${SERVER_PID:-}" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  if [ "$RM_WORK_ON_EXIT" = rm ] && [ -n "${WORK:-}" ]; then rm -rf "$WORK"; fi
}

# go_build DIR OUT: go build -o OUT in DIR, unless DIR/OUT is newer than every
# Go source, go.mod and go.sum of DIR's module (for a client: bench/clients,
# with the package the clients share).
go_build() {
  local mod=$1
  while [ ! -f "$mod/go.mod" ] && [ "$mod" != "$BENCH_DIR" ]; do mod=$(dirname "$mod"); done
  if [ ! -x "$1/$2" ] || [ -n "$(find "$mod" \( -name '*.go' -o -name go.mod -o -name go.sum \) -newer "$1/$2" | head -1)" ]; then
    need go
    log "go build $1"
    (cd "$1" && go build -o "$2" .)
  fi
}

# Benchmarks a private copy of a throng binary in $WORK (the real binary may be
# rebuilt while a run goes on): copy_throng NAME BIN copies BIN to $WORK/NAME
# and notes where it came from for throng_version, or notes NAME in SKIPPED.
declare -A THRONG_FROM=()
copy_throng() {
  local name=$1 bin=$2
  for _ in $(seq 1 30); do
    if [ -x "$bin" ] && cp "$bin" "$WORK/$name" 2>/dev/null && "$WORK/$name" --version >/dev/null 2>&1; then break; fi
    rm -f "$WORK/$name"; [ -e "$bin" ] || break; sleep 2
  done
  if [ -x "$WORK/$name" ]; then
    local sha; sha=$(sha256sum "$WORK/$name" | cut -c1-16)
    THRONG_FROM[$name]="$bin (mtime $(date -u -r "$bin" +%Y-%m-%dT%H:%M:%SZ), sha256 $sha)"
  else
    SKIPPED+=("$name: $bin not found or not runnable")
  fi
}
# The throng builds in --servers: throng ($THRONG_BIN) and throng-base ($THRONG_BASE_BIN).
copy_throngs() {
  if want throng || want throng-tls || want throng1 || want throng-epoll || want throng1-epoll || want throng1-nohistory; then copy_throng throng "$THRONG_BIN"; fi
  if want throng-base; then copy_throng throng-base "$THRONG_BASE_BIN"; fi
}
throng_version() { echo "$("$WORK/$1" --version 2>/dev/null), ${THRONG_FROM[$1]}"; }

# The throng builds the fan-out and echo scripts offer by name: throng and
# throng-base with two I/O threads, throng1 with one, the -epoll builds with
# --io-uring off, throng1-nohistory with --history-size 0.
# throng_cmd NAME PORT [FLAG...]: sets CMD for NAME, each FLAG after the common
# ones; fails (status 1, CMD untouched) for a name that is not a throng build.
throng_cmd() {
  local name=$1 port=$2 bin=$WORK/throng threads=2 variant=()
  shift 2
  case "$name" in
    throng|throng-base) bin=$WORK/$name ;;
    throng1) threads=1 ;;
    throng-epoll) variant=(--io-uring off) ;;
    throng1-epoll) threads=1; variant=(--io-uring off) ;;
    throng1-nohistory) threads=1; variant=(--history-size 0) ;;
    *) return 1 ;;
  esac
  CMD=("$bin" serve --listen "127.0.0.1:$port" --threads "$threads" --stats-interval 0 "$@" "${variant[@]+"${variant[@]}"}")
}
# throng_build_version NAME: the version line of throng_cmd's NAME; fails for other names.
throng_build_version() {
  case "$1" in
    throng|throng-base) throng_version "$1" ;;
    throng1) echo "$(throng_version throng), one I/O thread" ;;
    throng-epoll) echo "$(throng_version throng), --io-uring off" ;;
    throng1-epoll) echo "$(throng_version throng), one I/O thread, --io-uring off" ;;
    throng1-nohistory) echo "$(throng_version throng), one I/O thread, --history-size 0" ;;
    *) return 1 ;;
  esac
}

# The machine: NPROC, MODEL, KERNEL, DATE, MEM, CLK_TCK, the hard open-files
# limit NOFILE and the load average at the start, LOADAVG_START.
describe_machine() {
  NOFILE=$(ulimit -Hn)
  LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
  NPROC=$(nproc)
  MODEL=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
  KERNEL=$(uname -r)
  DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  MEM=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
  CLK_TCK=$(getconf CLK_TCK)
}
# machine_json NOFILE_KEY: the machine as JSON, the open-files limit $NOFILE under NOFILE_KEY.
machine_json() {
  jq -n --arg nproc "$NPROC" --arg model "$MODEL" --arg kernel "$KERNEL" --arg date "$DATE" --arg mem "$MEM" \
    --arg key "$1" --arg nofile "$NOFILE" --arg clk "$CLK_TCK" \
    '{nproc:($nproc|tonumber), model:$model, kernel:$kernel, memory:$mem} + {($key):$nofile} + {clk_tck:($clk|tonumber), date:$date}'
}
# provenance_json: where the run came from, as JSON (bench/provenance.py, the one
# place this is worked out, for the shell and the Python benchmarks alike): git
# commit, dirty tree, machine (cpu_model, cores, mem_gib, kernel), the command line
# as run (shell-quoted) and the UTC date. begin_run keeps it in PROVENANCE, taken
# when the run starts; each raw JSON holds it under "provenance".
provenance_json() { python3 "$BENCH_DIR/provenance.py" -- "${RUN_ARGV[@]}"; }
# provenance_md: the same as a Markdown list item, for a run's write-up.
provenance_md() {
  jq -r '"- commit \(.commit // "unknown")\(if .dirty then " (dirty tree)" else "" end); command: `\(.command)`"' <<<"$PROVENANCE"
}
skipped_json() { printf '%s\n' "${SKIPPED[@]+"${SKIPPED[@]}"}" | jq -R . | jq -sc 'map(select(length>0))'; }
print_skipped() { local s; for s in "${SKIPPED[@]+"${SKIPPED[@]}"}"; do echo "- skipped: $s"; done; }

# RAN: the servers asked for, minus the skipped ones.
select_servers() {
  local name s skip
  RAN=()
  for name in ${SERVERS//,/ }; do
    skip=
    for s in "${SKIPPED[@]+"${SKIPPED[@]}"}"; do case "$s" in "$name:"*) skip=1 ;; esac; done
    if [ -n "$skip" ]; then log "skipping $name"; else RAN+=("$name"); fi
  done
}

# ---------------------------------------------------------------- packages

# nchan_module: the Nchan module's .so, as Debian's libnginx-mod-nchan installs it.
nchan_module() {
  local f
  for f in /usr/lib/nginx/modules/ngx_nchan_module.so /usr/share/nginx/modules/ngx_nchan_module.so; do
    [ -f "$f" ] && { echo "$f"; return 0; }
  done
  # modules-available/mod-nchan.conf: load_module modules/ngx_nchan_module.so; (relative to nginx's prefix)
  f=$(sed -n 's/^ *load_module *\([^;]*\);.*/\1/p' /usr/share/nginx/modules-available/mod-nchan.conf 2>/dev/null | head -1)
  case "$f" in /*) ;; ?*) f=/usr/share/nginx/$f ;; esac
  [ -n "$f" ] && [ -f "$f" ] && { echo "$f"; return 0; }
  return 1
}

# install_packages PKG...: apt-get installs them (as root; INSTALL=false refuses
# instead). Installing nginx or redis-server must not start the system's service:
# without a policy-rc.d, one that refuses is put in place for the install only.
install_packages() {
  [ $# -gt 0 ] || return 0
  if [ "${INSTALL:-true}" != true ] || ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "$PROG: needs $* (apt-get install -y $*, as root)" >&2; exit 1
  fi
  local made_policy= rc=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  log "apt-get update; apt-get install -y $*"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; } >&2 || rc=$?
  [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || { echo "$PROG: apt-get install $* failed" >&2; exit 1; }
}

# ---------------------------------------------------------------- servers

# nchan_cmd DIR PORT WORKERS TEMPLATE [REDIS_URL]: writes DIR/nginx.conf from
# TEMPLATE (an Nchan config under bench/peers/nchan: the module $NCHAN_SO, WORKERS
# worker processes, PORT, DIR for its pid, logs and temp files, the invoking user
# for the workers when run as root, REDIS_URL for the Redis one) and sets CMD to
# run nginx from it as its own process ($NGINX).
nchan_cmd() {
  local dir=$1 port=$2 workers=$3 template=$4 redis=${5:-} user_line=
  if [ "$(id -u)" = 0 ]; then user_line="user $(id -un) $(id -gn);"; fi
  mkdir -p "$dir/tmp"; : >"$dir/error.log"
  sed -e "s#@MODULE@#${NCHAN_SO:-ngx_nchan_module.so}#" -e "s#@WORKERS@#$workers#" -e "s#@PORT@#$port#" \
      -e "s#@DIR@#$dir#g" -e "s#@USER@#$user_line#" -e "s#@REDIS_URL@#$redis#" "$template" >"$dir/nginx.conf"
  CMD=("$NGINX" -p "$dir/" -c nginx.conf -e "$dir/error.log")
}

# build_hub_peers: for the pub/sub harnesses (fanout.sh, burst.sh), their client
# fanload and the peers --servers names: gorilla-hub ($HUB_DIR), tokio-broadcast
# ($TB_DIR), uws (uws-hub, $UWS_DIR; skipped if it does not build); then the
# private copies of the throng builds.
HUB_DIR=$BENCH_DIR/peers/gorilla-hub
TB_DIR=$BENCH_DIR/peers/tokio-broadcast
UWS_DIR=$BENCH_DIR/peers/uws
FANLOAD=$BENCH_DIR/clients/fanload/fanload
build_hub_peers() {
  go_build "$BENCH_DIR/clients/fanload" fanload
  if want gorilla-hub; then go_build "$HUB_DIR" gorilla-hub; fi
  if want tokio-broadcast; then
    need cargo
    log "cargo build --release (tokio-broadcast)"
    cargo build --release --quiet --manifest-path "$TB_DIR/Cargo.toml" --target-dir "$TB_DIR/target"
  fi
  if want uws; then
    log "build uws-hub (bench/peers/uws/build.sh)"
    "$UWS_DIR/build.sh" >/dev/null || SKIPPED+=("uws: bench/peers/uws/build.sh failed")
  fi
  copy_throngs
}

free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$(( 20000 + RANDOM % 12000 ))   # below the ephemeral range (32768+)
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
}

# server_ready PORT: the server answers; here a TCP connect (a harness may redefine it).
server_ready() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start_server NAME TAG: starts server_cmd NAME on a free port (log $WORK/NAME-TAG.log);
# sets SERVER_PID and PORT; returns 1 if it is not ready within 10 s.
start_server() {
  local name=$1 tag=$2
  PORT=$(free_port) || { log "no free port"; return 1; }
  server_cmd "$name" "$PORT"
  "${CMD[@]}" >"$WORK/$name-$tag.log" 2>&1 &
  SERVER_PID=$!
  local i
  for i in $(seq 1 100); do   # up to 10 s
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      log "$name exited during start-up; log:"; tail -5 "$WORK/$name-$tag.log" >&2; SERVER_PID=; return 1
    fi
    if server_ready "$PORT"; then return 0; fi
    sleep 0.1
  done
  log "$name not ready on :$PORT after 10 s"; stop_server; return 1
}

# reap_pids PID...: gives each up to 3 s to exit, then SIGKILL (the nginx
# workers a stopped master may leave behind).
reap_pids() {
  local p
  for p in "$@"; do
    for _ in $(seq 1 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
}
# Stops the server by pid: SIGTERM, up to 5 s, then SIGKILL.
stop_server() {
  [ -n "${SERVER_PID:-}" ] || return 0
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  local i
  for i in $(seq 1 50); do   # up to 5 s, then SIGKILL
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$SERVER_PID" 2>/dev/null; then kill -KILL "$SERVER_PID" 2>/dev/null || true; fi
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}

# ---------------------------------------------------------------- quiet machine

# Machine-wide busy percentage over one second, from /proc/stat.
busy_pct() {
  local a b
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  local tot=0 idle i
  for i in 1 2 3 4 5 6 7 8; do tot=$(( tot + b[i] - a[i] )); done
  idle=$(( b[4] - a[4] + b[5] - a[5] ))
  [ "$tot" -gt 0 ] && echo $(( 100 * (tot - idle) / tot )) || echo 0
}

# Waits (up to QUIET_WAIT_MAX s, QUIET_BUDGET s per run) until the machine is under
# 25% busy, so a compile running next door does not land in a measurement window.
wait_quiet() {
  local t=0 b
  while :; do
    b=$(busy_pct)
    if [ "$b" -lt 25 ]; then return 0; fi
    if [ "$t" -ge "$QUIET_WAIT_MAX" ] || [ "$QUIET_WAITED" -ge "$QUIET_BUDGET" ]; then
      log "machine still ${b}% busy (other processes); measuring anyway"; return 0
    fi
    [ "$t" -eq 0 ] && log "machine ${b}% busy (other processes); waiting for quiet"
    t=$((t + 1)); QUIET_WAITED=$((QUIET_WAITED + 1))
  done
}

# ---------------------------------------------------------------- report

# report_paths NAME: RUN_SECONDS so far, OUT_JSON and OUT_MD ($RESULTS_DIR/NAME-<stamp>.*).
report_paths() {
  RUN_SECONDS=$(( $(date +%s) - RUN_START ))
  OUT_JSON=$RESULTS_DIR/$1-$STAMP.json
  OUT_MD=$RESULTS_DIR/$1-$STAMP.md
}

# add_server FILE: appends the server object in FILE to .servers of $WORK/all.json.
add_server() {
  jq --slurpfile s "$1" '.servers += $s' "$WORK/all.json" >"$WORK/all.tmp" && mv "$WORK/all.tmp" "$WORK/all.json"
}

# jq definitions for the tables: number formats, ok(e) (null if e failed), r(a; b)
# (a ratio or null), and ratio_table(head; row): "throng ÷ peer" rows, head then
# one row per other server, row's input being {t: throng's object, p: the peer's}.
JQ_DEFS='
  def f0: if . == null then "n/a" else (. + 0.5 | floor | tostring) end;
  def f1: if . == null then "n/a" else ((. * 10 + 0.5 | floor) / 10 | tostring) end;
  def f2: if . == null then "n/a" else ((. * 100 + 0.5 | floor) / 100 | tostring) end;
  def sig3: if . == null then "n/a" elif . == 0 then "0" else (. as $x | ($x|fabs|log10|floor) as $e | pow(10; 2 - $e) as $m | (($x * $m + 0.5 | floor) / $m) | tostring) end;
  def ok(e): if e == null or e.error != null then null else e end;
  def r(a; b): if a == null or b == null or b == 0 then null else a / b end;
  def ratio_table(head; row):
    (.servers | map(select(.name == "throng")) | .[0]) as $t |
    if $t == null then "(throng not measured: no ratios)" else
      head, (.servers[] | select(.name != "throng") | {t: $t, p: .} | row)
    end;
'
