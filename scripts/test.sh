#!/usr/bin/env bash
# Runs every capstan test: unit, property and end-to-end tests against real services.
# Needs root (it installs packages and starts a private dockerd through .ci/services.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# Packages (nats-server, docker.io, podman, busybox-static, …), a private dockerd and a
# private podman API service: every docker e2e test runs once on each
# (`<test>::dockerd`, `<test>::podman`, in the e2e binary), so the summary counts both.
eval "$(.ci/services.sh)"

# Every test that starts nats-server runs the binary $CAPSTAN_NATS_SERVER names: the
# current release, built once and cached by .ci/nats.sh. Debian's 2.9.10, the oldest
# supported version, gets a smoke run at the end.
CAPSTAN_NATS_SERVER=$(.ci/nats.sh)
export CAPSTAN_NATS_SERVER
# The fleet tests (tests/harness/fleet/) boot every host on an overlay of this Debian
# rootfs: built once by .ci/rootfs.sh (debootstrap, about 1.5 minutes) and cached.
CAPSTAN_FLEET_ROOTFS=$(.ci/rootfs.sh)
export CAPSTAN_FLEET_ROOTFS
# The kube tests (tests/harness/kube.rs) run a real etcd, kube-apiserver and
# kube-controller-manager per test: built from the Go module proxy by .ci/kube.sh once
# and cached (sets CAPSTAN_KUBE_BIN_DIR; cold build time in docs/kube.md).
# (Assigned first, so that a failed build stops this script under set -e.)
kube_env=$(.ci/kube.sh)
eval "$kube_env"
# The VM driver's tests (tests/tests/e2e/vm/) boot a tiny guest under QEMU with TCG:
# .ci/vmguest.sh installs QEMU and builds the guest (Debian's cloud kernel, a busybox
# initramfs with vm/guest/'s init) once, cached (docs/vm.md, *Tests*).
CAPSTAN_VM_GUEST_DIR=$(.ci/vmguest.sh)
export CAPSTAN_VM_GUEST_DIR
OLDEST_NATS=/usr/sbin/nats-server
# schemathesis (PyPI, in a venv cached by .ci/schemathesis.sh) fuzzes the coordinator's
# API from its OpenAPI description (e2e test nats::openapi).
CAPSTAN_SCHEMATHESIS=$(.ci/schemathesis.sh)
export CAPSTAN_SCHEMATHESIS

# The unit tests run under cargo-nextest (built once and cached by .ci/nextest.sh).
nextest=$(.ci/nextest.sh)

# The end-to-end tests run the real binaries: build them first, the agent with its
# fault-injection seams (feature `testing`; no release build has them).
cargo build --workspace --bins --features capstan-agent/testing
# Time limits, so a regression that hangs fails its test instead of holding CI:
# - each unit, property and per-crate integration test runs in its own process under
#   cargo-nextest, killed and failed after 120 s (.config/nextest.toml);
# - each e2e test (tests/harness/watchdog.rs, CAPSTAN_TEST_TIMEOUT seconds, default
#   600) aborts its binary, naming itself.
# The last line counts every test that ran.
out=$(mktemp)
smoke_out=$(mktemp)
fuzz_out=$(mktemp)
ts_out=$(mktemp)
trap 'rm -f "$out" "$smoke_out" "$fuzz_out" "$ts_out"' EXIT
cargo test --workspace --no-run "$@"
set +e
"$nextest" nextest run --workspace --exclude capstan-tests --no-fail-fast "$@" 2>&1 | tee "$out"
unit=${PIPESTATUS[0]}
# Building the workspace's tests builds capstan-agent's binary again without the
# seams (agent/tests/ has an integration test, and cargo builds a package's binaries
# for its integration tests): the e2e tests need the one with them.
cargo build --workspace --bins --features capstan-agent/testing
cargo test -p capstan-tests --no-fail-fast "$@" 2>&1 | tee -a "$out"
e2e=${PIPESTATUS[0]}
# Smoke run against the oldest supported nats-server: real round trips (submit, run,
# events, hosts, offline delivery, a redelivery, two coordinators). Its own filter, so
# without "$@" (which may hold one); it runs the debug binaries built above.
echo "== smoke run against $("$OLDEST_NATS" --version)"
CAPSTAN_NATS_SERVER=$OLDEST_NATS cargo test -p capstan-tests --test e2e --no-fail-fast \
  -- nats::flow:: 2>&1 | tee -a "$out" "$smoke_out"
smoke=${PIPESTATUS[0]}
# The TypeScript packages (clients/typescript): their generated types against the
# OpenAPI description, the description against Redocly's recommended rules, the live
# tests (node's test runner; each test file starts its own nats-server, coordinator
# and agents from the debug binaries built above), and `npm pack` installable. Not
# with a test-name filter.
ts=0
if (($# == 0)); then
  echo "== TypeScript client and compute driver (clients/typescript)"
  .ci/typescript.sh 2>&1 | tee -a "$out" "$ts_out"
  ts=${PIPESTATUS[0]}
fi
# Coverage-guided fuzzing, short: every target of fuzz/ for 20 s from its seed corpus
# (.ci/fuzz.sh; the full run gives each 600 s). Not with a test-name filter.
fuzz=0
if (($# == 0)); then
  echo "== fuzzing (short)"
  .ci/fuzz.sh 20 2>&1 | tee "$fuzz_out" | grep -v '^ *Compiling '
  fuzz=${PIPESTATUS[0]}
fi
set -e
echo "== summary"
echo "smoke run against $OLDEST_NATS: $(grep -h '^test result:' "$smoke_out" || echo 'no result')"
if (($# == 0)); then
  echo "TypeScript tests: $(grep -hE '^ℹ (pass|fail) ' "$ts_out" | tr '\n' ' ' || echo 'no result')"
  grep -h '^fuzz ' "$fuzz_out" || echo "fuzzing: no result"
fi
grep -h '^capstan-tests watchdog:' "$out" || true
# nextest names each failure twice (as it happens, and again at the end): once here.
grep -hE '^ *(FAIL|TIMEOUT|SIGKILL|SIGSEGV|SIGABRT|ABORT) \[' "$out" | sed 's/^ */failed: /' | sort -u || true
grep -h "process didn't exit successfully" "$out" | sed 's/^ */failed: /' || true
# Why each failed: its panic's location and the first lines of its message.
awk '/^thread .* panicked at / { n = 6; print "panic: " $0; next }
     n > 0 && (/^stack backtrace:/ || /^note: run with/ || /^$/) { n = 0 }
     n > 0 { print "  " $0; n-- }' "$out" | head -60
# nextest: "Summary [ 40.1s] 210 tests run: 208 passed, 1 failed, 1 timed out, 0 skipped"
# cargo test: "test result: ok. 58 passed; 0 failed; …"
# node --test (spec reporter): "ℹ pass 12" and "ℹ fail 0"
awk '/^ *Summary \[/ {
       for (i = 1; i <= NF; i++) {
         if ($(i + 1) ~ /^passed/) passed += $i
         if ($(i + 1) ~ /^failed/) failed += $i
         if ($(i + 1) == "timed" && $(i + 2) ~ /^out/) failed += $i
       }
     }
     /^test result:/ { passed += $4; failed += $6 }
     /^ℹ pass [0-9]+$/ { passed += $3 }
     /^ℹ fail [0-9]+$/ { failed += $3 }
     END { printf "%d passed, %d failed\n", passed, failed }' "$out"
if ((unit != 0)); then exit "$unit"; fi
if ((e2e != 0)); then exit "$e2e"; fi
if ((smoke != 0)); then exit "$smoke"; fi
if ((ts != 0)); then exit "$ts"; fi
exit "$fuzz"
