# Shell helpers shared by bench/engine.sh and bench/fanout.sh (sourced, not run).
# The caller defines log(), the QUIET_* settings, WORK, THRONG_BIN and SKIPPED, and
# keeps the server's pid in SERVER_PID.

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

# Benchmarks a private copy of $THRONG_BIN in $WORK (the real binary may be rebuilt
# while a run goes on); sets THRONG_SHA and THRONG_MTIME, or notes it in SKIPPED.
copy_throng() {
  for _ in $(seq 1 30); do
    if [ -x "$THRONG_BIN" ] && cp "$THRONG_BIN" "$WORK/throng" 2>/dev/null && "$WORK/throng" --version >/dev/null 2>&1; then break; fi
    rm -f "$WORK/throng"; [ -e "$THRONG_BIN" ] || break; sleep 2
  done
  if [ -x "$WORK/throng" ]; then
    THRONG_SHA=$(sha256sum "$WORK/throng" | cut -c1-16)
    THRONG_MTIME=$(date -u -r "$THRONG_BIN" +%Y-%m-%dT%H:%M:%SZ)
  else
    SKIPPED+=("throng: $THRONG_BIN not found or not runnable")
  fi
}
