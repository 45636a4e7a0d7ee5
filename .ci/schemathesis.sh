#!/usr/bin/env bash
# Prints the path of schemathesis's `st` (the API fuzzer the e2e test
# nats::openapi runs against a live coordinator), installing it first when this machine
# has not cached it: a Python venv from PyPI, cached by version under
# /var/cache/capstan-ci. Progress goes to stderr.
set -euo pipefail
VERSION=4.32.5
CACHE=/var/cache/capstan-ci
ROOT=$CACHE/schemathesis-$VERSION
ST=$ROOT/bin/st
mkdir -p "$CACHE"
# A venv cannot be moved once made, so it is made in place under a lock and marked
# complete last: an interrupted install is removed and made again, never used.
exec 9>"$ROOT.lock"
flock 9
if [[ ! -e $ROOT/.complete ]]; then
  echo "schemathesis.sh: installing schemathesis $VERSION into $ROOT (cached for later runs)" >&2
  rm -rf "$ROOT"
  python3 -m venv "$ROOT" >&2
  "$ROOT/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$VERSION" >&2
  touch "$ROOT/.complete"
fi
"$ST" --version >&2
echo "$ST"
