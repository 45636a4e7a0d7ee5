#!/usr/bin/env bash
# capstan's main job over NATS: a private nats-server (installed if missing) with an
# account per host (`capstan-coordinator nats-config`), a coordinator and two sim
# agents (h1, h2), each host's key registered; a rollout through the coordinator's
# HTTP API (namespace, prepare, activate on both hosts), then the results, the hosts
# and the central audit log of each host, checked against its signatures. Everything
# runs from a temp dir and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nats-server >/dev/null; then
  echo "== installing nats-server"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null
fi
# A fresh machine compiles the stack first: about 790 CPU-seconds, 6 min 47 s measured
# on two idle cores, 16 min 50 s on a loaded machine; seconds once built
# (cargo's own progress shows on stderr). scripts/demo.sh builds the same, so either
# runs at once after the other.
echo "== building (the first time: about 790 CPU-seconds of compiling, 7 to 17 minutes on 2 cores)"
cargo build -p capstan-agent -p capstan-coordinator --bins
bin=${CARGO_TARGET_DIR:-target}/debug
dir=$(mktemp -d /tmp/capstan-fleet.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_for() { # file text
  for _ in $(seq 1 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}

# Every server picks its own port and says which: a port chosen beforehand could be
# taken meanwhile, and whoever holds it would then be the demo's "server".
echo "== nats-server accounts: one per host, each confined to its own subjects"
"$bin/capstan-coordinator" nats-config --host h1 --host h2 --out "$dir/nats"
nats-server -c "$dir/nats/nats-server.conf" -js -a 127.0.0.1 -p -1 -sd "$dir/js" -l "$dir/nats.log" & pids+=($!)
wait_for "$dir/nats.log" "Server is ready"
nats_port=$(sed -n 's/.*Listening for client connections on 127.0.0.1:\([0-9]*\).*/\1/p' "$dir/nats.log")
echo "== nats-server on 127.0.0.1:$nats_port (store $dir/js)"

echo "== signing key"
public=$("$bin/capstan-coordinator" keygen --out "$dir/signing.key")
echo "public key $public"

echo "== API token (role submit; only its hash goes into the tokens file)"
(umask 077 && "$bin/capstan-coordinator" token --role submit --name demo \
  --append-to "$dir/tokens" >"$dir/api.token")
cat "$dir/tokens"

cat >"$dir/coordinator.toml" <<TOML
listen = "127.0.0.1:0"
signing_key_file = "$dir/signing.key"
tokens_file = "$dir/tokens"
[nats]
url = "nats://127.0.0.1:$nats_port"
nkey_seed_file = "$dir/nats/credentials/coordinator.nk"
hosts_nkey_seed_file = "$dir/nats/credentials/coordinator-hosts.nk"
host_accounts = true
TOML
RUST_LOG=info "$bin/capstan-coordinator" run --config "$dir/coordinator.toml" 2>"$dir/coordinator.log" & pids+=($!)
wait_for "$dir/coordinator.log" "capstan-coordinator ready"
api_port=$(sed -n 's/.*capstan-coordinator ready.*listen=127.0.0.1:\([0-9]*\).*/\1/p' "$dir/coordinator.log")
echo "== coordinator API on 127.0.0.1:$api_port"
export CAPSTAN_COORDINATOR="http://127.0.0.1:$api_port"
export CAPSTAN_TOKEN_FILE="$dir/api.token"
echo "== without the token the API answers 401"
if env -u CAPSTAN_TOKEN_FILE "$bin/capstan" hosts; then echo "the API answered without a token" >&2; exit 1; fi
# The first answered request also creates the streams, before the agents come.
for _ in $(seq 1 300); do "$bin/capstan" hosts >/dev/null 2>&1 && break; sleep 0.1; done

for host in h1 h2; do
  mkdir -p "$dir/$host"
  cat >"$dir/$host/agent.toml" <<TOML
host = "$host"
data_dir = "$dir/$host"
[nats]
url = "nats://127.0.0.1:$nats_port"
nkey_seed_file = "$dir/nats/credentials/$host.nk"
host_accounts = true
[signing]
public_keys = ["$public"]
[metrics]
# Two agents on one machine: each on a free port (\`serving metrics on …\` in its log).
listen = "127.0.0.1:0"
TOML
  echo "== $host's key (it signs everything $host publishes), registered"
  "$bin/capstan" register "$host" "$("$bin/capstan-agent" --config "$dir/$host/agent.toml" host-key)"
  RUST_LOG=info "$bin/capstan-agent" --config "$dir/$host/agent.toml" run 2>"$dir/$host/agent.log" & pids+=($!)
  wait_for "$dir/$host/agent.log" "taking commands"
done

step() { # id-base op-fields
  printf '{"id":"%s",%s}\n' "$1" "$2" >"$dir/$1.json"
  echo "== rollout $1"
  "$bin/capstan" rollout "$dir/$1.json" --hosts h1,h2
}
step demo-ns '"op":"ensure_namespace","namespace":"shop"'
step demo-prep '"op":"prepare_revision","namespace":"shop","workload":"web","revision":"r1","spec":{"driver":"sim","image":"shop/web:1","command":["serve"]}'
step demo-act '"op":"activate_revision","namespace":"shop","workload":"web","revision":"r1"'

echo "== one command in full"
"$bin/capstan" status demo-act.h1
echo "== hosts"
# Beats follow the log within 250 ms: wait until both report all 9 records; never go
# on without them (the audit logs below would be short, and look like the truth).
synced=
for _ in $(seq 1 100); do [ "$("$bin/capstan" hosts | grep -c 'alive .* 9$')" = 2 ] && synced=1 && break; sleep 0.1; done
"$bin/capstan" hosts
[ -n "$synced" ] || { echo "the hosts did not report their 9 records" >&2; exit 1; }
for host in h1 h2; do
  echo "== audit log of $host (from CAPSTAN_EVT)"
  # The outbox publishes after the log: wait until the stream has all 9 records (a
  # read that cannot complete fails the script, never prints a shorter log). A record
  # is a row under the header, starting with its seq.
  audit=
  for _ in $(seq 1 100); do
    audit=$("$bin/capstan" log "$host")
    [ "$(printf '%s\n' "$audit" | grep -cE '^ *[0-9]+  ')" -ge 9 ] && break
    sleep 0.1
  done
  printf '%s\n' "$audit"
  [ "$(printf '%s\n' "$audit" | grep -cE '^ *[0-9]+  ')" -ge 9 ] || { echo "the audit log of $host is incomplete" >&2; exit 1; }
done
echo "== intent of h1 (asked over NATS)"
"$bin/capstan" intent h1
echo "== h1's log on the host and in CAPSTAN_EVT, record by record (each signed by h1)"
"$bin/capstan" verify h1
