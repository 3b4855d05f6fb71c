# Shell helpers shared by bench/engine.sh and bench/fanout.sh (sourced, not run).
# The caller defines log() and the QUIET_* settings, and keeps the server's pid in
# SERVER_PID.

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
