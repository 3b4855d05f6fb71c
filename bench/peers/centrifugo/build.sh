#!/usr/bin/env bash
# Builds the Centrifugo benchmark peer bench/peers/centrifugo/bin/centrifugo from its
# upstream source through the Go module proxy:
#   GOBIN=bench/peers/centrifugo/bin go install -ldflags "-X .../internal/build.Version=X.Y.Z" \
#     github.com/centrifugal/centrifugo/v6@vX.Y.Z
# with the module@version pinned in ./UPSTREAM.
# `build.sh --version` prints the version line for the benchmark reports (the binary's
# own `centrifugo version` output plus the Go toolchain).
# Idempotent: does nothing when bin/centrifugo exists and is newer than this script and
# UPSTREAM. Prints the binary's directory on stdout (last line).
# Env: FORCE=1 (rebuild), GO (default go).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$HERE/bin
GO=${GO:-go}
MODULE=$(awk 'NF && $1 !~ /^#/ {print $1; exit}' "$HERE/UPSTREAM")
# Centrifugo's release builds stamp their version into internal/build.Version (else it
# says 0.0.0): the same, from UPSTREAM's @vX.Y.Z.
VERSION=${MODULE##*@v}
LDFLAGS="-X github.com/centrifugal/centrifugo/v6/internal/build.Version=$VERSION"

die() { echo "centrifugo/build.sh: $*" >&2; exit 1; }
say() { echo "centrifugo/build.sh: $*" >&2; }

[ -n "$MODULE" ] || die "no module@version in $HERE/UPSTREAM"
MODE=build
for arg in "$@"; do
  case "$arg" in
    --version) MODE=version ;;
    *) die "usage: build.sh [--version]" ;;
  esac
done

if [ "$MODE" = version ]; then
  [ -x "$BIN/centrifugo" ] || die "$BIN/centrifugo not built yet: run build.sh first"
  v=$("$BIN/centrifugo" version 2>/dev/null | head -1)
  echo "${v:-Centrifugo ?} ($MODULE via the Go module proxy), $("$GO" version 2>/dev/null || echo 'go ?')"
  exit 0
fi

up_to_date() {
  [ -x "$BIN/centrifugo" ] && [ "$BIN/centrifugo" -nt "$HERE/build.sh" ] \
    && [ "$BIN/centrifugo" -nt "$HERE/UPSTREAM" ]
}
if [ "${FORCE:-0}" != 1 ] && up_to_date; then
  echo "$BIN"; exit 0
fi

command -v "$GO" >/dev/null 2>&1 || die "needs the Go toolchain ($GO): https://go.dev/dl/"
mkdir -p "$BIN"
say "go install $MODULE (a few minutes on 2 cores)"
GOBIN=$BIN "$GO" install -ldflags "$LDFLAGS" "$MODULE" >&2 || die "go install $MODULE failed"
[ -x "$BIN/centrifugo" ] || die "go install succeeded but $BIN/centrifugo is missing"
# go install keeps the cached binary's mtime when nothing changed: mark it newer than the script.
touch "$BIN/centrifugo"
say "built $BIN/centrifugo"
echo "$BIN"
