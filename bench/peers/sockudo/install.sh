#!/usr/bin/env bash
# Installs Sockudo, the Rust Pusher Channels server, as a benchmark peer for
# bench/pusher.py: crates.io `sockudo` (pinned below, --locked) built by
# `cargo install` into bench/peers/sockudo/.install/bin/sockudo (git-ignored).
# Sockudo's build compiles protobuf definitions, so Debian's protobuf-compiler
# (protoc) is installed first when it is missing (apt-get; needs root).
# Idempotent: does nothing when the binary is there at the pinned version.
# `install.sh --version` prints the version line for the benchmark reports.
# Prints the binary's path on stdout (last line). Slow: 21 minutes on 2 cores
# here (2026-11-26), more on a busy machine.
# Env: FORCE=1 (rebuild), CARGO_BUILD_JOBS (cargo's -j).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$HERE/.install
BIN=$ROOT/bin/sockudo
VERSION=5.2.0

die() { echo "sockudo/install.sh: $*" >&2; exit 1; }
say() { echo "sockudo/install.sh: $*" >&2; }

installed_version() {
  # cargo's own record of what it installed into $ROOT.
  [ -x "$BIN" ] && [ -f "$ROOT/.crates.toml" ] || return 1
  sed -n 's/^"sockudo \([0-9.]*\) .*/\1/p' "$ROOT/.crates.toml" | head -1
}

case "${1:-}" in
  --version)
    v=$(installed_version) || die "not installed (run install.sh)"
    echo "sockudo $v (crates.io, cargo install --locked), $(rustc --version)"
    exit 0 ;;
  "") ;;
  *) die "usage: install.sh [--version]" ;;
esac

if [ "${FORCE:-0}" != 1 ] && [ "$(installed_version || true)" = "$VERSION" ]; then
  echo "$BIN"; exit 0
fi

command -v cargo >/dev/null 2>&1 || die "needs cargo (Rust stable; sockudo $VERSION wants rustc 1.95 or newer)"
if ! command -v protoc >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || die "needs protoc: as root, apt-get install -y protobuf-compiler"
  say "installing protobuf-compiler (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y protobuf-compiler >&2 \
    || { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y protobuf-compiler >&2; } \
    || die "apt-get install protobuf-compiler failed"
fi

say "cargo install sockudo $VERSION --locked into $ROOT (this takes long)"
force=()
[ "${FORCE:-0}" = 1 ] && force=(--force)
cargo install sockudo --locked --version "=$VERSION" --root "$ROOT" "${force[@]}" >&2 \
  || die "cargo install sockudo $VERSION failed"
[ -x "$BIN" ] || die "cargo install succeeded but $BIN is missing"
say "installed $BIN"
echo "$BIN"
