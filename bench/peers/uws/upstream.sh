#!/usr/bin/env bash
# Lays out uWebSockets and uSockets from their upstream git repositories, at the
# commits UPSTREAM pins, as one tree (uSockets inside uWebSockets, as its submodule
# is), for build.sh:
#
#   bench/peers/uws/upstream.sh DIR            # prints DIR/uWebSockets
#   UWS_SRC=$(bench/peers/uws/upstream.sh DIR) FORCE=1 bench/peers/uws/build.sh
#
# Env: UWS_GIT, USOCKETS_GIT: where to clone from (default: the GitHub URLs in
# UPSTREAM; a local clone or mirror works the same, for a machine that cannot reach
# GitHub). The tree gets a file UPSTREAM naming both commits, which build.sh
# --version reports.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -eq 1 ] || { echo "usage: upstream.sh DIR" >&2; exit 2; }
DEST=$1
pin() { awk -v n="$1" '$1 == n {print $'"$2"'}' "$HERE/UPSTREAM"; }
UWS_URL=${UWS_GIT:-$(pin uWebSockets 2)}
US_URL=${USOCKETS_GIT:-$(pin uSockets 2)}
UWS_COMMIT=$(pin uWebSockets 3)
US_COMMIT=$(pin uSockets 3)

checkout() { # URL COMMIT DIR
  rm -rf "$3"
  git clone --quiet --no-checkout "$1" "$3" >&2
  git -C "$3" -c advice.detachedHead=false checkout --quiet "$2"
  [ "$(git -C "$3" rev-parse HEAD)" = "$2" ] || { echo "upstream.sh: $1 is not at $2" >&2; exit 1; }
}
mkdir -p "$DEST"
checkout "$UWS_URL" "$UWS_COMMIT" "$DEST/uWebSockets"
checkout "$US_URL" "$US_COMMIT" "$DEST/uWebSockets/uSockets"
# The commit uWebSockets itself pins for its uSockets submodule must be this one.
sub=$(git -C "$DEST/uWebSockets" ls-tree HEAD uSockets | awk '{print $3}')
[ "$sub" = "$US_COMMIT" ] || echo "upstream.sh: note: uWebSockets pins uSockets $sub, building with $US_COMMIT" >&2
printf 'uWebSockets %s (%s), uSockets %s (%s), upstream\n' \
  "$(pin uWebSockets 4)" "$UWS_COMMIT" "$(pin uSockets 4)" "$US_COMMIT" >"$DEST/uWebSockets/UPSTREAM"
echo "$DEST/uWebSockets"
