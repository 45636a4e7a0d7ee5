#!/usr/bin/env bash
# Prints the path of nats-server 2.15.2, building it first when this machine has not
# cached it (`go install` from the Go module proxy; cached by version under
# /var/cache/capstan-ci). Debian's nats-server (2.9.10) is the oldest supported
# version and only gets a smoke run (scripts/test.sh). Progress goes to stderr.
set -euo pipefail
VERSION=2.15.2
CACHE=/var/cache/capstan-ci
ROOT=$CACHE/nats-server-$VERSION
BIN=$ROOT/nats-server
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
if [[ ! -x $BIN ]]; then
  echo "nats.sh: building nats-server $VERSION into $ROOT (cached for later runs)" >&2
  mkdir -p "$CACHE"
  # Build into a scratch dir and move it in whole: an interrupted build leaves no
  # half-installed binary that a later run would take as cached. Go's module and build
  # caches live next to it, so a rerun after an interrupted build is quick.
  scratch=$(mktemp -d "$ROOT.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  GOBIN=$scratch GOFLAGS=-buildvcs=false GOCACHE=$CACHE/go-build \
    GOMODCACHE=$CACHE/go-mod GOTOOLCHAIN=local \
    "$GO" install "github.com/nats-io/nats-server/v2@v$VERSION" >&2
  chmod 755 "$scratch"
  rm -rf "$ROOT"
  mv "$scratch" "$ROOT"
  trap - EXIT
fi
"$BIN" --version >&2
echo "$BIN"
