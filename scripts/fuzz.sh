#!/usr/bin/env bash
# Runs the cargo-fuzz (libFuzzer) targets in fuzz/ for a short while each and fails
# on the first crash or broken invariant. Each target fuzzes a working corpus,
# $FUZZ_CORPUS_DIR/TARGET (default target/fuzz-corpus/TARGET, git-ignored), which
# starts as a copy of the seeds kept in git (fuzz/corpus/TARGET, a few dozen small
# inputs each) and keeps every input a run finds, so it grows where it runs. Installs the nightly toolchain and cargo-fuzz when they are missing.
# See docs/RELIABILITY.md for what each target checks and for the long runs.
#
# Usage: scripts/fuzz.sh [--seconds N] [TARGET...]
#   --seconds N   how long each target runs (default 30)
#   TARGET        frame_decoder, http_request, names_and_queries, jwt (default: all)
#
# Builds in $CARGO_TARGET_DIR (default target/fuzz). New inputs found during the
# run go to the working corpus, never into fuzz/corpus; a crashing input is kept
# in fuzz/artifacts/TARGET/ (not committed) and its path printed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

ALL_TARGETS=(frame_decoder http_request names_and_queries jwt)
SECONDS_EACH=30
TARGETS=()
while (($#)); do
    case $1 in
        --seconds)
            [[ $# -ge 2 ]] || { usage >&2; exit 2; }
            SECONDS_EACH=$2
            shift 2
            ;;
        --seconds=*)
            SECONDS_EACH=${1#--seconds=}
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        -*)
            echo "unknown option $1" >&2
            usage >&2
            exit 2
            ;;
        *)
            TARGETS+=("$1")
            shift
            ;;
    esac
done
[[ $SECONDS_EACH =~ ^[1-9][0-9]*$ ]] || { echo "--seconds needs a whole number > 0" >&2; exit 2; }
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
    [[ -f fuzz/fuzz_targets/$t.rs ]] || { echo "no fuzz target '$t' (have: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

step() { printf '\n==> %s\n' "$*"; }
have() { command -v "$1" >/dev/null 2>&1; }

step "tools"
[[ -d $HOME/.cargo/bin ]] && export PATH="$HOME/.cargo/bin:$PATH"
if ! have rustup; then
    # libFuzzer instrumentation needs a nightly compiler, which only rustup provides.
    if have apt-get && apt-cache show rustup >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustup >/dev/null
    else
        echo "rustup is needed for a nightly toolchain: see https://rustup.rs" >&2
        exit 1
    fi
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
echo "$(rustup run nightly rustc --version), $(cargo fuzz --version)"

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/fuzz}
CORPUS_DIR=${FUZZ_CORPUS_DIR:-$ROOT/target/fuzz-corpus}

step "build fuzz targets (${TARGETS[*]})"
for t in "${TARGETS[@]}"; do
    cargo +nightly fuzz build --fuzz-dir "$ROOT/fuzz" -O "$t"
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failed=()
for t in "${TARGETS[@]}"; do
    step "fuzz $t for ${SECONDS_EACH}s"
    mkdir -p "$CORPUS_DIR/$t" "fuzz/artifacts/$t"
    # The seeds join the working corpus (one already grown keeps what it found).
    [[ -d fuzz/corpus/$t ]] && cp -Rn "fuzz/corpus/$t/." "$CORPUS_DIR/$t/"
    echo "corpus $CORPUS_DIR/$t: $(find "$CORPUS_DIR/$t" -type f | wc -l) inputs"
    args=(-max_total_time="$SECONDS_EACH" -timeout=10 -print_final_stats=1)
    [[ -f fuzz/dict/$t.dict ]] && args+=(-dict="$ROOT/fuzz/dict/$t.dict")
    # libFuzzer adds the new inputs it finds to the (first) corpus directory given.
    if cargo +nightly fuzz run --fuzz-dir "$ROOT/fuzz" -O "$t" "$CORPUS_DIR/$t" -- \
        "${args[@]}" >"$WORK/$t.log" 2>&1; then
        grep -E '^(Done |stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb))' \
            "$WORK/$t.log" || tail -n 5 "$WORK/$t.log"
    else
        tail -n 60 "$WORK/$t.log"
        echo "FAILED: $t" >&2
        grep -hoE 'Test unit written to [^ ]+' "$WORK/$t.log" >&2 || true
        failed+=("$t")
    fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
    echo
    echo "fuzzing found a crash in: ${failed[*]} (reproduce: cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-...)" >&2
    exit 1
fi
echo
echo "fuzzing: ${TARGETS[*]}: no crash in ${SECONDS_EACH}s each"
