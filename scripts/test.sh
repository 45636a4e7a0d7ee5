#!/usr/bin/env bash
# Runs every capstan test: unit, property and end-to-end tests against real services.
# Needs root (it installs packages and starts a private dockerd through .ci/services.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# Packages (nats-server, docker.io, busybox-static, …) and a private dockerd.
eval "$(.ci/services.sh)"

# The end-to-end tests run the real binaries: build them first.
cargo build --workspace --bins
# Each e2e test has a time limit (tests/harness/watchdog.rs, CAPSTAN_TEST_TIMEOUT
# seconds, default 600): a test that hangs aborts its binary, naming itself, instead of
# holding CI. The last lines count the tests of every binary that ran to the end.
out=$(mktemp)
trap 'rm -f "$out"' EXIT
set +e
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
set -e
echo "== summary"
grep -h '^capstan-tests watchdog:' "$out" || true
grep -h "process didn't exit successfully" "$out" | sed 's/^ */failed: /' || true
awk '/^test result:/ { passed += $4; failed += $6; binaries++ }
     END { printf "%d passed, %d failed (in %d test binaries that finished)\n", passed, failed, binaries }' "$out"
exit "$status"
