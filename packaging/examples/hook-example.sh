#!/bin/sh
# An example capstan exec hook (see docs/hooks.md). It grants a workload a database
# credential before it starts, by handing out an opaque placeholder that a sidecar
# resolves, and revokes it before the workload stops.
#
# Contract: the request is one JSON object on stdin; the reply is one JSON object on
# stdout (empty output means {}); exit 0 = success, anything else = failure. Calls
# may be repeated (after a crash, a retry or a compensation): be idempotent.
# Never print secrets: capstan discards stderr and never logs replies, but the
# launch env values must be opaque placeholders anyway.
set -eu

req=$(cat)
field() { printf '%s' "$req" | sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }
phase=$(field phase)
ns=$(field namespace)
workload=$(field workload)

# argv[1] is the state dir (hooks run with an empty environment but PATH). Hooks
# run inside the agent's unit (capstan-agent.service: ProtectSystem=strict, a private
# /tmp), where only the agent's state directory /var/lib/capstan and
# /etc/systemd/system are writable: a hook keeps its state under
# /var/lib/capstan/hooks/<owner>/ (docs/hooks.md, "Where a hook may write").
state=${1:-/var/lib/capstan/hooks/example}
mkdir -p "$state"
grant="$state/$ns.$workload"

case "$phase" in
before_workload_start)
    # Idempotent grant: reuse the placeholder if it exists.
    [ -s "$grant" ] || printf 'opaque-db.%s.%s' "$ns" "$workload" > "$grant"
    printf '{"env":{"DB_CREDENTIAL":"%s"}}\n' "$(cat "$grant")"
    ;;
before_workload_stop)
    # Idempotent revoke: gone already is fine.
    rm -f "$grant"
    ;;
*)
    # Phases we are not configured for are not sent; nothing to do for others.
    ;;
esac
