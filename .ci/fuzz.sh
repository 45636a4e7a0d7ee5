#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (cargo-fuzz, libFuzzer, on nightly) for SECONDS each
# (default 20: the short run scripts/test.sh makes; the full run is 600), starting from
# the seed corpus in fuzz/corpus/<target> (never written to: what a run finds goes to
# a temp dir). cargo-fuzz is built once and cached under /var/cache/capstan-ci, and so
# is the targets' build dir. Prints each target's executions and new coverage; exits 1
# with the crashing input when a target fails.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-20}
CACHE=/var/cache/capstan-ci
FUZZ_VERSION=0.13.2
ROOT=$CACHE/cargo-fuzz-$FUZZ_VERSION
mkdir -p "$CACHE"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing the nightly toolchain" >&2
  rustup toolchain install nightly --profile minimal >&2
fi
if [[ ! -x $ROOT/bin/cargo-fuzz ]]; then
  echo "fuzz.sh: building cargo-fuzz $FUZZ_VERSION into $ROOT (cached for later runs)" >&2
  scratch=$(mktemp -d "$ROOT.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  cargo install --quiet --locked --root "$scratch" "cargo-fuzz@$FUZZ_VERSION" >&2
  rm -rf "$ROOT"
  mv "$scratch" "$ROOT"
  trap - EXIT
fi
export PATH=$ROOT/bin:$PATH
export CARGO_TARGET_DIR=$CACHE/fuzz-target
echo "fuzz.sh: building the targets (sanitizer build, cached in $CARGO_TARGET_DIR)" >&2
cargo +nightly fuzz build -O >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for target in $(cargo +nightly fuzz list); do
  mkdir -p "$work/$target"
  log=$work/$target.log
  if cargo +nightly fuzz run -O "$target" "$work/$target" "fuzz/corpus/$target" -- \
      -max_total_time="$SECONDS_EACH" -print_final_stats=1 -artifact_prefix="$work/" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    new=$(sed -n 's/^stat::new_units_added: *//p' "$log")
    echo "fuzz $target: ok, $runs executions in ${SECONDS_EACH}s, $new new inputs"
  else
    failed=1
    echo "fuzz $target: FAILED"
    grep -E 'panicked|ERROR|SUMMARY' "$log" | head -5 || true
    for crash in "$work"/crash-* "$work"/oom-* "$work"/timeout-*; do
      [[ -e $crash ]] || continue
      echo "  input ($crash), base64: $(base64 -w0 "$crash")"
    done
  fi
done
exit "$failed"
