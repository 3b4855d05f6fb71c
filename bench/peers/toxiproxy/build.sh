#!/usr/bin/env bash
# Builds Toxiproxy's server, bench/peers/toxiproxy/bin/toxiproxy-server, from its
# upstream source through the Go module proxy (module@version pinned in ./UPSTREAM):
#   GOBIN=<tmp> go install github.com/Shopify/toxiproxy/v2/cmd/server@vX.Y.Z
# It puts latency and cuts between throng and Redis: the publish benchmark
# (bench/publish_redis.sh --latency-ms) and the tests of a slow or cut Redis
# (tests/python/support/toxiproxy.py). It is driven over its HTTP API only, so its
# CLI is not built.
# Idempotent: does nothing when the binary exists and is newer than this script and
# UPSTREAM. Prints the binary's path on stdout (last line).
# Env: FORCE=1 (rebuild), GO (default go).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$HERE/bin/toxiproxy-server
GO=${GO:-go}
MODULE=$(awk 'NF && $1 !~ /^#/ {print $1; exit}' "$HERE/UPSTREAM")
die() { echo "toxiproxy/build.sh: $*" >&2; exit 1; }
[ -n "$MODULE" ] || die "no module@version in $HERE/UPSTREAM"
if [ "${FORCE:-0}" != 1 ] && [ -x "$BIN" ] && [ "$BIN" -nt "$HERE/build.sh" ] && [ "$BIN" -nt "$HERE/UPSTREAM" ]; then
  echo "$BIN"; exit 0
fi
command -v "$GO" >/dev/null 2>&1 || die "needs the Go toolchain ($GO)"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "toxiproxy/build.sh: go install $MODULE" >&2
GOBIN=$TMP GOFLAGS=-mod=mod "$GO" install "$MODULE" >&2 || die "go install $MODULE failed"
mkdir -p "$HERE/bin"
mv "$TMP/server" "$BIN"
echo "$BIN"
