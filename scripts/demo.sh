#!/usr/bin/env bash
# capstan's main job, in miniature: a rollout through the agent with the sim driver.
# Prepares a namespace, stages and activates two revisions of three workloads, retires
# the old revisions, then shows the audit log, verifies its hash chain and prints the
# running intent rebuilt from the log.
set -euo pipefail
cd "$(dirname "$0")/.."
# The same build as scripts/fleet-demo.sh (one feature set: either runs at once after
# the other); the first time about 790 CPU-seconds of compiling, 7 to 17 minutes on 2
# cores (measured: docs/development.md).
echo "== building (the first time: about 790 CPU-seconds of compiling, 7 to 17 minutes on 2 cores)"
cargo build -p capstan-agent -p capstan-coordinator --bins
agent=target/debug/capstan-agent
dir=$(mktemp -d /tmp/capstan-demo.XXXXXX)
host=demo-host
run() { "$agent" --data-dir "$dir" --host "$host" "$@"; }

cmd() { # id op-fields
  printf '{"v":1,"id":"%s","host":"%s","issued_at":"%s",%s}\n' "$1" "$host" "$(date -u +%FT%TZ)" "$2"
}
{
  cmd ns-shop '"op":"ensure_namespace","namespace":"shop"'
  for wl in web api worker; do
    for rev in r1 r2; do
      cmd "$wl-$rev-prep" "\"op\":\"prepare_revision\",\"namespace\":\"shop\",\"workload\":\"$wl\",\"revision\":\"$rev\",\"spec\":{\"driver\":\"sim\",\"image\":\"shop/$wl:$rev\",\"command\":[\"serve\"],\"env\":{\"PORT\":\"8080\"}}"
      cmd "$wl-$rev-act" "\"op\":\"activate_revision\",\"namespace\":\"shop\",\"workload\":\"$wl\",\"revision\":\"$rev\""
    done
    cmd "$wl-r1-retire" "\"op\":\"retire_revision\",\"namespace\":\"shop\",\"workload\":\"$wl\",\"revision\":\"r1\""
  done
  cmd worker-stop '"op":"stop_workload","namespace":"shop","workload":"worker"'
} >"$dir/rollout.jsonl"

echo "== apply ($(wc -l <"$dir/rollout.jsonl") commands; data dir $dir)"
RUST_LOG=error run apply "$dir/rollout.jsonl"
echo "== apply again: every command is answered from the log (duplicate), nothing runs twice"
RUST_LOG=error run apply "$dir/rollout.jsonl" >"$dir/again.jsonl"
head -3 "$dir/again.jsonl"
echo "== audit log"
run log
echo "== log verify"
run log verify
echo "== intent"
run intent
