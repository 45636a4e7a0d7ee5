#!/usr/bin/env bash
# Runs every capstan test: unit, property and end-to-end tests against real services.
# Needs root (it installs packages and starts a private dockerd through .ci/services.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# Packages (nats-server, docker.io, busybox-static, …) and a private dockerd.
eval "$(.ci/services.sh)"

# The end-to-end tests run the real binaries: build them first.
cargo build --workspace --bins
# Time limits, so a regression that hangs fails the run instead of holding CI:
# - each e2e test (tests/harness/watchdog.rs, CAPSTAN_TEST_TIMEOUT seconds, default
#   600) aborts its binary, naming itself;
# - the unit and property tests (seconds in all) run under one bound,
#   CAPSTAN_UNIT_TIMEOUT seconds (default 600), once they are built.
# The last line counts the tests of every binary that ran to the end.
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cargo test --workspace --no-run "$@"
set +e
timeout --signal=KILL "${CAPSTAN_UNIT_TIMEOUT:-600}" \
  cargo test --workspace --exclude capstan-tests --no-fail-fast "$@" 2>&1 | tee "$out"
unit=${PIPESTATUS[0]}
[[ $unit == 137 ]] && echo "capstan-tests watchdog: the unit tests ran past ${CAPSTAN_UNIT_TIMEOUT:-600} s" | tee -a "$out"
cargo test -p capstan-tests --no-fail-fast "$@" 2>&1 | tee -a "$out"
e2e=${PIPESTATUS[0]}
set -e
echo "== summary"
grep -h '^capstan-tests watchdog:' "$out" || true
grep -h "process didn't exit successfully" "$out" | sed 's/^ */failed: /' || true
awk '/^test result:/ { binaries++ } END { printf "(%d test binaries ran to the end)\n", binaries }' "$out"
awk '/^test result:/ { passed += $4; failed += $6 }
     END { printf "%d passed, %d failed\n", passed, failed }' "$out"
if ((unit != 0)); then exit "$unit"; fi
exit "$e2e"
