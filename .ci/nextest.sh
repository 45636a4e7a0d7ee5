#!/usr/bin/env bash
# Prints the path of cargo-nextest, building it first when this machine has not cached
# it (cargo install from crates.io, about 8–9 minutes cold on 2 cores; cached by version
# under /var/cache/capstan-ci). Progress goes to stderr.
set -euo pipefail
VERSION=0.9.151
ROOT=/var/cache/capstan-ci/cargo-nextest-$VERSION
BIN=$ROOT/bin/cargo-nextest
if [[ ! -x $BIN ]]; then
  echo "nextest.sh: building cargo-nextest $VERSION into $ROOT (cached for later runs)" >&2
  mkdir -p "$(dirname "$ROOT")"
  # Build into a scratch root and move it in whole: an interrupted build leaves no
  # half-installed binary that a later run would take as cached.
  scratch=$(mktemp -d "$ROOT.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  cargo install cargo-nextest --locked --version "$VERSION" --root "$scratch" >&2
  rm -rf "$ROOT"
  mv "$scratch" "$ROOT"
  trap - EXIT
fi
"$BIN" nextest --version >&2
echo "$BIN"
