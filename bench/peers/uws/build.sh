#!/usr/bin/env bash
# Builds the uWebSockets benchmark peers bench/peers/uws/bin/uws-echo and
# bench/peers/uws/bin/uws-hub from source that comes from crates.io:
#   1. `cargo fetch` on fetch/Cargo.toml downloads the crate libuwebsockets-sys
#      (=0.0.10), which bundles uWebSockets (header-only C++20) and uSockets (C),
#      into $CARGO_HOME/registry/src/*/libuwebsockets-sys-0.0.10/ (the crate itself
#      is never built: its build.rs needs bindgen);
#   2. gcc compiles uSockets (epoll, no TLS), g++ compiles echo.cpp / hub.cpp
#      against uWebSockets/src (no zlib), -O3 -flto, and links them.
# `build.sh --version` prints the version line for the benchmark reports.
# `build.sh --tls` builds only bench/peers/uws/bin/uws-echo-tls and uws-hub-tls instead
# (echo-tls.cpp, hub-tls.cpp: the echo and hub peers on uWS::SSLApp, TLS terminated by
# uSockets' OpenSSL layer):
# uSockets with -DLIBUS_USE_OPENSSL plus src/crypto/*, linked with the system
# -lssl -lcrypto (needs libssl-dev); `build.sh --tls --version` adds the OpenSSL
# version to the version line.
# `build.sh --deflate` builds only bench/peers/uws/bin/uws-hub-deflate instead
# (hub-deflate.cpp: the hub peer with uWS's SHARED_COMPRESSOR permessage-deflate):
# uSockets as for the plain build, the hub with zlib (no -DUWS_NO_ZLIB), linked with
# the system -lz (needs zlib1g-dev); `build.sh --deflate --version` adds the zlib
# version to the version line.
# Idempotent: does nothing when the binaries are newer than their sources and
# this script. Prints the binaries' directory on stdout (last line).
# Env: CXX (default g++), CC (default gcc), UWS_SRC (use this uWebSockets
# directory instead of fetching), FORCE=1 (rebuild).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$HERE/bin
CC=${CC:-gcc}
CXX=${CXX:-g++}
CRATE=libuwebsockets-sys-0.0.10

die() { echo "uws/build.sh: $*" >&2; exit 1; }
say() { echo "uws/build.sh: $*" >&2; }

command -v "$CC" >/dev/null 2>&1 || die "needs a C compiler ($CC): apt-get install -y gcc g++"
command -v "$CXX" >/dev/null 2>&1 || die "needs a C++20 compiler ($CXX): apt-get install -y g++"

# ---- locate (and if needed fetch) the uWebSockets source
MODE=build
TLS=0
DEFLATE=0
for arg in "$@"; do
  case "$arg" in
    --version) MODE=version ;;
    --tls) TLS=1 ;;
    --deflate) DEFLATE=1 ;;
    *) die "usage: build.sh [--tls | --deflate] [--version]" ;;
  esac
done
[ "$TLS" = 1 ] && [ "$DEFLATE" = 1 ] && die "--tls and --deflate are separate builds: run build.sh once with each"

# The OpenSSL uws-echo-tls and uws-hub-tls link: the system libssl/libcrypto as `openssl version`
# reports it (its "Library:" part), else the headers' OPENSSL_VERSION_TEXT.
openssl_version() {
  local v
  v=$(openssl version 2>/dev/null | sed -n 's/.*(Library: \(.*\))$/\1/p;t;p' | head -1)
  if [ -z "$v" ]; then
    v=$(printf '#include <openssl/opensslv.h>\nOPENSSL_VERSION_TEXT\n' | "$CC" -E -P - 2>/dev/null \
      | tr -d '"' | grep -i ssl | tail -1)
  fi
  echo "${v:-OpenSSL ?}"
}
if [ "$TLS" = 1 ] && ! printf '#include <openssl/ssl.h>\n' | "$CC" -E - >/dev/null 2>&1; then
  die "--tls needs the OpenSSL headers (openssl/ssl.h): apt-get install -y libssl-dev"
fi
# The zlib uws-hub-deflate links: the system libz, as its headers name it (ZLIB_VERSION).
zlib_version() {
  local v
  v=$(printf '#include <zlib.h>\nZLIB_VERSION\n' | "$CC" -E -P - 2>/dev/null | tr -d '"' | tail -1)
  echo "zlib ${v:-?}"
}
if [ "$DEFLATE" = 1 ] && ! printf '#include <zlib.h>\n' | "$CC" -E - >/dev/null 2>&1; then
  die "--deflate needs the zlib headers (zlib.h): apt-get install -y zlib1g-dev"
fi
if [ -z "${UWS_SRC:-}" ]; then
  CARGO_HOME_DIR=${CARGO_HOME:-$HOME/.cargo}
  find_src() { ls -d "$CARGO_HOME_DIR"/registry/src/*/"$CRATE"/uWebSockets 2>/dev/null | head -1; }
  UWS_SRC=$(find_src || true)
  if [ -z "$UWS_SRC" ]; then
    command -v cargo >/dev/null 2>&1 || die "needs cargo to fetch the $CRATE crate from crates.io"
    say "cargo fetch ($CRATE from crates.io)"
    cargo fetch --manifest-path "$HERE/fetch/Cargo.toml" >&2 || die "cargo fetch of $CRATE failed"
    UWS_SRC=$(find_src || true)
    [ -n "$UWS_SRC" ] || die "cargo fetch succeeded but $CARGO_HOME_DIR/registry/src/*/$CRATE/uWebSockets is missing"
  fi
fi
US_SRC=$UWS_SRC/uSockets/src
[ -f "$UWS_SRC/src/App.h" ] || die "$UWS_SRC/src/App.h not found (not a uWebSockets tree)"
[ -f "$US_SRC/libusockets.h" ] || die "$US_SRC/libusockets.h not found (the crate lacks uSockets)"
if [ "$TLS" = 1 ]; then
  [ -f "$US_SRC/crypto/openssl.c" ] || die "$US_SRC/crypto/openssl.c not found (uSockets without TLS support)"
fi

# --version: the line the benchmark reports show for this peer. uWebSockets'
# source carries no release number; its server header ("uWebSockets: 20") gives the major.
if [ "$MODE" = version ]; then
  tls=""
  [ "$TLS" = 1 ] && tls=", TLS by $(openssl_version) (uSockets LIBUS_USE_OPENSSL)"
  [ "$DEFLATE" = 1 ] && tls=", permessage-deflate by $(zlib_version) (SHARED_COMPRESSOR)"
  if [ -f "$UWS_SRC/UPSTREAM" ]; then
    # Laid out by upstream.sh: the pinned upstream commits.
    echo "$(cat "$UWS_SRC/UPSTREAM")$tls, $("$CXX" --version | head -1)"
    exit 0
  fi
  major=$(sed -n 's/.*writeHeader("uWebSockets", "\([0-9]*\)").*/\1/p' "$UWS_SRC/src/HttpResponse.h" | head -1)
  echo "uWebSockets ${major:-?} (source of crates.io $CRATE)$tls, $("$CXX" --version | head -1)"
  exit 0
fi

# ---- up to date?
if [ "$TLS" = 1 ]; then
  PROGS=(echo-tls hub-tls)
  SOURCES=("$HERE/echo-tls.cpp" "$HERE/hub-tls.cpp" "$HERE/hub.cpp" "$HERE/common.h" "$HERE/build.sh")
elif [ "$DEFLATE" = 1 ]; then
  PROGS=(hub-deflate)
  SOURCES=("$HERE/hub-deflate.cpp" "$HERE/hub.cpp" "$HERE/common.h" "$HERE/build.sh")
else
  PROGS=(echo hub)
  SOURCES=("$HERE/echo.cpp" "$HERE/hub.cpp" "$HERE/common.h" "$HERE/build.sh")
fi
up_to_date() {
  local p b s
  for p in "${PROGS[@]}"; do
    b=$BIN/uws-$p
    [ -x "$b" ] || return 1
    for s in "${SOURCES[@]}"; do [ "$b" -nt "$s" ] || return 1; done
    [ "$b" -nt "$UWS_SRC/src/App.h" ] || return 1
  done
}
if [ "${FORCE:-0}" != 1 ] && up_to_date; then
  echo "$BIN"; exit 0
fi

# ---- build
mkdir -p "$BIN"
OBJ=$(mktemp -d "${TMPDIR:-/tmp}/uws-build.XXXXXX")
trap 'rm -rf "$OBJ"' EXIT
if [ "$TLS" = 1 ]; then
  # As uSockets' Makefile does WITH_OPENSSL=1: -DLIBUS_USE_OPENSSL, src/crypto/*.c
  # with the C sources, src/crypto/*.cpp (SNI tree) as C++17, -lssl -lcrypto.
  SSLDEF=-DLIBUS_USE_OPENSSL
  CRYPTO_C=("$US_SRC"/crypto/*.c)
  CRYPTO_CXX=("$US_SRC"/crypto/*.cpp)
  LIBS=(-lssl -lcrypto)
else
  SSLDEF=-DLIBUS_NO_SSL
  CRYPTO_C=()
  CRYPTO_CXX=()
  LIBS=()
fi
CFLAGS=(-O3 -flto=auto "$SSLDEF" -std=c11 -I"$US_SRC")
ZLIBDEF=-DUWS_NO_ZLIB
if [ "$DEFLATE" = 1 ]; then
  # uWebSockets' PerMessageDeflate.h on the system zlib (as its own Makefile does
  # when not WITH_LIBDEFLATE): no -DUWS_NO_ZLIB, link -lz.
  ZLIBDEF=
  LIBS+=(-lz)
fi
CXXFLAGS=(-O3 -flto=auto "$SSLDEF" ${ZLIBDEF:+"$ZLIBDEF"} -std=c++20 -I"$UWS_SRC/src" -I"$US_SRC")

say "compiling uSockets ($US_SRC${CRYPTO_C:+, with OpenSSL})"
objs=()
for f in "$US_SRC"/*.c "$US_SRC"/eventing/epoll_kqueue.c; do
  o=$OBJ/$(basename "${f%.c}").o
  "$CC" "${CFLAGS[@]}" -c "$f" -o "$o" || die "compiling $f failed"
  objs+=("$o")
done
# crypto/openssl.c's optional DH-params code uses APIs OpenSSL 3 deprecates: quiet.
for f in "${CRYPTO_C[@]}"; do
  o=$OBJ/crypto-$(basename "${f%.c}").o
  "$CC" "${CFLAGS[@]}" -Wno-deprecated-declarations -c "$f" -o "$o" || die "compiling $f failed"
  objs+=("$o")
done
for f in "${CRYPTO_CXX[@]}"; do
  o=$OBJ/crypto-$(basename "${f%.cpp}").o
  "$CXX" -O3 -flto=auto "$SSLDEF" -std=c++17 -I"$US_SRC" -c "$f" -o "$o" || die "compiling $f failed"
  objs+=("$o")
done

for prog in "${PROGS[@]}"; do
  say "compiling uws-$prog ($CXX)"
  "$CXX" "${CXXFLAGS[@]}" "$HERE/$prog.cpp" "${objs[@]}" "${LIBS[@]}" -o "$BIN/uws-$prog.tmp" \
    || die "compiling/linking uws-$prog failed"
  mv "$BIN/uws-$prog.tmp" "$BIN/uws-$prog"
done
if [ "$TLS" = 1 ]; then
  say "built $BIN/uws-echo-tls and $BIN/uws-hub-tls ($(openssl_version))"
elif [ "$DEFLATE" = 1 ]; then
  say "built $BIN/uws-hub-deflate ($(zlib_version))"
else
  say "built $BIN/uws-echo and $BIN/uws-hub"
fi
echo "$BIN"
