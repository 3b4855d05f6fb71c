#!/usr/bin/env bash
# Runs the cargo-fuzz (libFuzzer) targets in fuzz/ for a short while each and fails
# on the first crash or broken invariant. Each target fuzzes a working corpus,
# $FUZZ_CORPUS_DIR/TARGET (default target/fuzz-corpus/TARGET, git-ignored), which
# starts as a copy of the seeds kept in git (fuzz/corpus/TARGET, a few dozen small
# inputs each) and keeps every input a run finds, so it grows where it runs. Installs the nightly toolchain and cargo-fuzz when they are missing.
# See docs/RELIABILITY.md for what each target checks and for the long runs.
#
# Usage: scripts/fuzz.sh [--seconds N] [--record | --no-record] [TARGET...]
#   --seconds N   how long each target runs (default 30)
#   --record      keep a record of the run (the default from --seconds 600 on)
#   --no-record   keep none, even for a long run
#   --parallel P  how many targets run at once, each on a core (default: the
#                 cores, or 1 for a recorded run)
#   TARGET        frame_decoder, http_request, names_and_queries, jwt (default: all)
#
# A recorded run writes bench/results/fuzz-STAMP.json (UTC stamp) and its .md: the
# provenance (bench/provenance.py: commit, dirty tree, machine, command line), the
# toolchain, and per target the seconds asked for and run, executions, exec/s,
# peak RSS, corpus inputs and bytes before and after, crashes (with the artifact's
# path) and the last lines of libFuzzer's output ($FUZZ_RECORD_DIR, if set, instead
# of bench/results). Only what has such a record is quoted in docs/RELIABILITY.md.
#
# Builds in $CARGO_TARGET_DIR (default ~/.cache/throng/fuzz-target, or under
# $XDG_CACHE_HOME: outside the checkout, so a fresh clone on the same machine,
# as CI makes, rebuilds only what changed instead of every dependency on the
# nightly compiler, 3-4 minutes here; cargo's fingerprints keep each checkout's
# builds apart). New inputs found during the
# run go to the working corpus, never into fuzz/corpus; a crashing input is kept
# in fuzz/artifacts/TARGET/ (not committed) and its path printed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

ALL_TARGETS=(frame_decoder http_request names_and_queries jwt)
SECONDS_EACH=30
RECORD=auto
PARALLEL=
TARGETS=()
ORIG_ARGS=("$@")
while (($#)); do
    case $1 in
        --record)
            RECORD=yes
            shift
            ;;
        --no-record)
            RECORD=no
            shift
            ;;
        --seconds)
            [[ $# -ge 2 ]] || { usage >&2; exit 2; }
            SECONDS_EACH=$2
            shift 2
            ;;
        --seconds=*)
            SECONDS_EACH=${1#--seconds=}
            shift
            ;;
        --parallel)
            [[ $# -ge 2 ]] || { usage >&2; exit 2; }
            PARALLEL=$2
            shift 2
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
if [[ $RECORD == auto ]]; then
    if ((SECONDS_EACH >= 600)); then RECORD=yes; else RECORD=no; fi
fi
if [[ -z $PARALLEL ]]; then
    if [[ $RECORD == yes ]]; then PARALLEL=1; else PARALLEL=$(nproc 2>/dev/null || echo 1); fi
fi
[[ $PARALLEL =~ ^[1-9][0-9]*$ ]] || { echo "--parallel needs a whole number > 0" >&2; exit 2; }
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
TOOLCHAIN="$(rustup run nightly rustc --version), $(cargo fuzz --version)"
echo "$TOOLCHAIN"
# The provenance is taken before the run, of the tree that is built and fuzzed.
PROVENANCE=
if [[ $RECORD == yes ]]; then
    PROVENANCE=$(python3 "$ROOT/bench/provenance.py" -- "$0" "${ORIG_ARGS[@]}")
fi

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/throng/fuzz-target}
CORPUS_DIR=${FUZZ_CORPUS_DIR:-$ROOT/target/fuzz-corpus}

step "build fuzz targets (${TARGETS[*]})"
for t in "${TARGETS[@]}"; do
    cargo +nightly fuzz build --fuzz-dir "$ROOT/fuzz" -O "$t"
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
corpus_size() { echo "$(find "$1" -type f | wc -l) $(find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')"; }
# fuzz_one TARGET: one target's run; its output goes to $WORK/TARGET.out and its
# row (for the record) to $WORK/TARGET.tsv, so targets can run side by side.
fuzz_one() {
    local t=$1 inputs_before bytes_before inputs_after bytes_after started ended status=0
    {
        step "fuzz $t for ${SECONDS_EACH}s"
        mkdir -p "$CORPUS_DIR/$t" "fuzz/artifacts/$t"
        # The seeds join the working corpus (one already grown keeps what it found).
        [[ -d fuzz/corpus/$t ]] && cp -Rn "fuzz/corpus/$t/." "$CORPUS_DIR/$t/"
        read -r inputs_before bytes_before < <(corpus_size "$CORPUS_DIR/$t")
        echo "corpus $CORPUS_DIR/$t: $inputs_before inputs"
        local args=(-max_total_time="$SECONDS_EACH" -timeout=10 -print_final_stats=1)
        [[ -f fuzz/dict/$t.dict ]] && args+=(-dict="$ROOT/fuzz/dict/$t.dict")
        # libFuzzer adds the new inputs it finds to the (first) corpus directory given.
        started=$(date +%s.%N)
        cargo +nightly fuzz run --fuzz-dir "$ROOT/fuzz" -O "$t" "$CORPUS_DIR/$t" -- \
            "${args[@]}" >"$WORK/$t.log" 2>&1 || status=$?
        ended=$(date +%s.%N)
        if ((status == 0)); then
            grep -E '^(Done |stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb))' \
                "$WORK/$t.log" || tail -n 5 "$WORK/$t.log"
        else
            tail -n 60 "$WORK/$t.log"
            echo "FAILED: $t"
            grep -hoE 'Test unit written to [^ ]+' "$WORK/$t.log" || true
        fi
        read -r inputs_after bytes_after < <(corpus_size "$CORPUS_DIR/$t")
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$status" "$started" "$ended" \
            "$inputs_before" "$bytes_before" "$inputs_after" "$bytes_after" "$WORK/$t.log" >"$WORK/$t.tsv"
    } >"$WORK/$t.out" 2>&1
}
# Each target is one libFuzzer process on one core: PARALLEL of them run side by
# side, each still fuzzed for --seconds on a core of its own, so a smoke of four
# targets takes half the wall time on two cores and each target gets the same
# work. A recorded run (exec/s is compared across runs) runs them one at a time.
for t in "${TARGETS[@]}"; do
    while (($(jobs -rp | wc -l) >= PARALLEL)); do wait -n || true; done
    fuzz_one "$t" &
done
wait
failed=()
for t in "${TARGETS[@]}"; do
    cat "$WORK/$t.out"
    cat "$WORK/$t.tsv" >>"$WORK/runs.tsv"
    [[ $(cut -f2 "$WORK/$t.tsv") == 0 ]] || failed+=("$t")
done

if [[ $RECORD == yes ]]; then
    step "record"
    SECONDS_EACH=$SECONDS_EACH PROVENANCE=$PROVENANCE TOOLCHAIN=$TOOLCHAIN CORPUS_DIR=$CORPUS_DIR \
        python3 - "$WORK/runs.tsv" <<'PY'
import json, os, re, sys
sys.path.insert(0, "bench")
import provenance

prov = json.loads(os.environ["PROVENANCE"])
asked = int(os.environ["SECONDS_EACH"])
runs = []
for row in open(sys.argv[1]).read().splitlines():
    t, status, started, ended, ib, bb, ia, ba, log = row.split("\t")
    text = open(log, errors="replace").read()
    def stat(name):
        m = re.search(rf"^stat::{name}:\s*(\d+)", text, re.M)
        return int(m.group(1)) if m else None
    done = re.search(r"^Done (\d+) runs in (\d+) second", text, re.M)
    artifacts = re.findall(r"Test unit written to (\S+)", text)
    runs.append({
        "target": t, "exit_status": int(status),
        "seconds_asked": asked, "seconds_wall": round(float(ended) - float(started), 1),
        "seconds_fuzzed": int(done.group(2)) if done else None,
        "executions": stat("number_of_executed_units") or (int(done.group(1)) if done else None),
        "exec_per_sec": stat("average_exec_per_sec"), "new_units": stat("new_units_added"),
        "peak_rss_mb": stat("peak_rss_mb"),
        "corpus_before": {"inputs": int(ib), "bytes": int(bb)},
        "corpus_after": {"inputs": int(ia), "bytes": int(ba)},
        "failed": int(status) != 0, "crashes": len(artifacts), "artifacts": artifacts,
        "log_tail": text.splitlines()[-40:],
    })
doc = {"provenance": prov, "toolchain": os.environ["TOOLCHAIN"], "corpus_dir": os.environ["CORPUS_DIR"],
       "seconds_each": asked, "runs": runs}
lines = [f"    {r['target']}: {r['seconds_fuzzed']} s, {r['executions']} executions "
         f"({r['exec_per_sec']}/s), corpus {r['corpus_before']['inputs']} -> {r['corpus_after']['inputs']} inputs, "
         f"peak RSS {r['peak_rss_mb']} MB, crashes {r['crashes']}" for r in runs]
md = provenance.md_header("fuzzing (scripts/fuzz.sh)", prov) + f"- toolchain: {os.environ['TOOLCHAIN']}\n\n" + "\n".join(lines)
when = prov["date"].replace("-", "").replace(":", "").replace("T", "-").rstrip("Z")
path = provenance.write_raw(provenance.raw_path("fuzz", when, os.environ.get("FUZZ_RECORD_DIR") or None), doc, md)
print(f"wrote {path}")
PY
fi

if [[ ${#failed[@]} -gt 0 ]]; then
    echo
    echo "fuzzing found a crash in: ${failed[*]} (reproduce: cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-...)" >&2
    exit 1
fi
echo
echo "fuzzing: ${TARGETS[*]}: no crash in ${SECONDS_EACH}s each"
