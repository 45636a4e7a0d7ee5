#!/usr/bin/env bash
# Sets up the real services capstan's tests use (see DESIGN.md "Real parts in tests"):
#   - the Debian packages (nats-server, docker.io, busybox-static, openssh-server, ...;
#     systemd, dbus, util-linux and mount for the systemd tests' own systemd per test,
#     tests/harness/systemd.rs: /usr/lib/systemd/systemd, dbus-daemon, unshare,
#     nsenter, journalctl)
#   - a private dockerd on its own socket and data root (never /var/run/docker.sock)
#   - a private podman API service (`podman system service`, Docker-compatible API) on its
#     own socket, storage and run dirs, for running the docker driver's tests on podman too
#   - the test image capstan-test/busybox:1 in both engines, built offline from one
#     busybox-static rootfs tarball (`docker import`, `podman import`)
# Idempotent: a re-run with everything in place takes about a second.
# nats-server and sshd are NOT started here; tests start their own on free loopback ports.
# Nor is systemd: each systemd test boots its own, as PID 1 of its own namespaces.
set -euo pipefail

RUN_DIR=/run/capstan-ci
DATA_ROOT=/var/lib/capstan-ci/docker
SOCK=$RUN_DIR/docker.sock
PIDFILE=$RUN_DIR/dockerd.pid
LOG=$RUN_DIR/dockerd.log
IMAGE=capstan-test/busybox:1
# Podman's container network stack is netavark + aardvark-dns (the bridge networks the
# driver creates and their DNS aliases); without naming them apt would pick the CNI
# plugins for podman's <container-network-stack> dependency.
PACKAGES=(nats-server docker.io tini busybox-static openssh-server iproute2 procps
  systemd dbus util-linux mount podman netavark aardvark-dns)
PODMAN_SOCK=$RUN_DIR/podman.sock
PODMAN_PIDFILE=$RUN_DIR/podman.pid
PODMAN_LOG=$RUN_DIR/podman.log
PODMAN_ROOT=/var/lib/capstan-ci/podman
PODMAN_RUNROOT=$RUN_DIR/podman-run
CONTAINERS_CONF=/etc/containers/containers.conf
# nproc is RLIMIT_NPROC: it counts every thread of the user — for rootful podman's
# containers, every root thread on the machine. 1024 is less than a full test run has
# (agents, nats-servers, systemd hosts, dockerd…), so container starts failed ("write
# child: broken pipe") only under load. 32768 (or this machine's hard limit, if lower)
# is under podman's own limit and far above what a test run holds.
NPROC=$(ulimit -Hu)
[[ $NPROC == unlimited || $NPROC -gt 32768 ]] && NPROC=32768
ULIMITS="default_ulimits = [\"nofile=1024:1024\", \"nproc=$NPROC:$NPROC\"]"

say() { echo "services.sh: $*" >&2; }
docker() { command docker -H "unix://$SOCK" "$@"; }
# Podman's own storage and run dirs (not /var/lib/containers, /run/containers), the
# service and `podman import` alike. No systemd runs on this machine: cgroups are
# managed directly, and events (the driver follows `die` events) go to a file.
PODMAN=(podman --root "$PODMAN_ROOT" --runroot "$PODMAN_RUNROOT" --tmpdir "$PODMAN_RUNROOT/tmp"
  --cgroup-manager cgroupfs --events-backend file)
podman() { command "${PODMAN[@]}" "$@"; }
# Runs a container that must print "ok". `docker run` always warns "IPv4 forwarding is
# disabled" because of --ip-forward=false (below); that is expected, so only show stderr
# on failure, minus that line.
# Up to three tries: podman's attach can lose the race with a container that has
# already exited ("unable to upgrade to tcp, received 409"), which says nothing about
# whether the engine works.
smoke() {
  local engine=$1 out try
  shift
  for try in 1 2 3; do
    out=$(command docker -H "unix://$engine" run --rm "$@" 2>"$RUN_DIR/smoke.err") || true
    [[ $out == ok ]] && break
  done
  if [[ $out != ok ]]; then
    say "smoke test failed: docker -H unix://$engine run --rm $*"
    grep -v 'IPv4 forwarding is disabled' "$RUN_DIR/smoke.err" >&2
    exit 1
  fi
}

rootfs='' net='' engine=''
cleanup() {
  [[ -z $rootfs ]] || rm -rf "$rootfs" "$rootfs.tar"
  [[ -z $net ]] || command docker -H "unix://$engine" network rm "$net" >/dev/null 2>&1 || true
}
trap cleanup EXIT

mkdir -p "$RUN_DIR" "$DATA_ROOT"
# Serialise concurrent runs. fd 9 is closed for dockerd below so it doesn't keep the lock.
exec 9>"$RUN_DIR/services.lock"
flock 9

# --- 1. packages -------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# --- 2. private dockerd -----------------------------------------------------
dockerd_running() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) && [[ -n $pid ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == dockerd ]]
}

if dockerd_running; then
  say "dockerd already running (pid $(cat "$PIDFILE"))"
else
  say "starting dockerd on $SOCK"
  t0=$(date +%s%N)
  # --iptables=false --ip-masq=false --ip-forward=false: leave the host's firewall and
  #     net.ipv4.ip_forward alone. User-defined bridge networks still work: containers on
  #     one network reach each other (with DNS by name), the host reaches container IPs
  #     directly, and `-p 127.0.0.1:P:P` is served by docker-proxy. Containers get no
  #     route off the machine, which is what we want.
  # --bridge=none: no default docker0 bridge; containers without --network get only lo.
  #     Tests must create (and remove) their own networks.
  # --default-address-pool: /24s from 10.214.0.0/16 (256 networks) instead of the few
  #     172.17-31.x /16s; kept clear of the test fleet's 10.213.0.0/24.
  # Storage driver: overlay2 is the default and works here (ext4 root).
  # tini -s: a child subreaper that reaps exited containerd-shims. Without it they are
  #     reparented to this machine's PID 1, which was seen leaving them as zombies.
  # setsid + all fds redirected (and the lock fd 9 closed) so dockerd outlives this
  # script and never holds a caller's pipe open; started in / so that it never runs in
  # a directory that goes away (a CI clone removed after the run).
  setsid env -C / tini -s -- dockerd \
    --host "unix://$SOCK" \
    --data-root "$DATA_ROOT" \
    --exec-root "$RUN_DIR/docker-exec" \
    --pidfile "$PIDFILE" \
    --iptables=false --ip-masq=false --ip-forward=false \
    --bridge=none \
    --default-address-pool base=10.214.0.0/16,size=24 \
    --storage-driver overlay2 \
    </dev/null >>"$LOG" 2>&1 9>&- &
  dpid=$!  # tini's pid; dockerd's own pid lands in $PIDFILE
  # Poll for readiness (bounded), failing fast if dockerd died.
  for ((i = 0; i < 240; i++)); do
    docker version >/dev/null 2>&1 && break
    if ! kill -0 "$dpid" 2>/dev/null; then
      say "dockerd exited; tail of $LOG:"; tail -n 30 "$LOG" >&2; exit 1
    fi
    sleep 0.25
  done
  if ! docker version >/dev/null 2>&1; then
    say "dockerd not ready after 60 s; tail of $LOG:"; tail -n 30 "$LOG" >&2; exit 1
  fi
  say "dockerd ready (pid $(cat "$PIDFILE")) in $((($(date +%s%N) - t0) / 1000000)) ms"
fi

# --- 3. podman ----------------------------------------------------------------
# runc fails setting podman's default rlimits here (nofile 1048576 is above this
# machine's hard limit): set them in [containers], leaving every other setting alone.
mkdir -p "$(dirname "$CONTAINERS_CONF")"
touch "$CONTAINERS_CONF"
if ! grep -qxF "$ULIMITS" "$CONTAINERS_CONF"; then
  say "setting default_ulimits in $CONTAINERS_CONF"
  tmp=$(mktemp)
  awk -v line="$ULIMITS" '
    /^[[:space:]]*default_ulimits[[:space:]]*=/ { next }   # an older value: replaced
    { print }
    /^[[:space:]]*\[containers\][[:space:]]*$/ && !done { print line; done = 1 }
    END { if (!done) { print "[containers]"; print line } }
  ' "$CONTAINERS_CONF" >"$tmp"
  cat "$tmp" >"$CONTAINERS_CONF"
  rm -f "$tmp"
  # The service reads containers.conf when it starts.
  if pid=$(cat "$PODMAN_PIDFILE" 2>/dev/null) && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == podman ]]; then
    say "restarting the podman service for the new default_ulimits"
    kill "$pid"
    for ((i = 0; i < 400; i++)); do [[ -e /proc/$pid ]] || break; sleep 0.05; done
  fi
fi

podman_running() {
  local pid
  pid=$(cat "$PODMAN_PIDFILE" 2>/dev/null) && [[ -n $pid ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == podman ]]
}
podman_ready() { command docker -H "unix://$PODMAN_SOCK" version >/dev/null 2>&1; }

# One started (by an older version of this script) in a directory since removed cannot
# start containers: stop it, and start it again below.
if podman_running && [[ $(readlink "/proc/$(cat "$PODMAN_PIDFILE")/cwd") == *" (deleted)" ]]; then
  say "podman service (pid $(cat "$PODMAN_PIDFILE")) runs in a removed directory: restarting it"
  pid=$(cat "$PODMAN_PIDFILE")
  kill "$pid"
  for ((i = 0; i < 400; i++)); do [[ -e /proc/$pid ]] || break; sleep 0.05; done
fi
if podman_running; then
  say "podman service already running (pid $(cat "$PODMAN_PIDFILE"))"
else
  say "starting podman system service on $PODMAN_SOCK"
  t0=$(date +%s%N)
  mkdir -p "$PODMAN_ROOT" "$PODMAN_RUNROOT/tmp"
  rm -f "$PODMAN_SOCK"
  # --time=0: never exit when idle. setsid + fds redirected (lock fd 9 closed) and
  # started in /, as for dockerd: conmon inherits the service's working directory and
  # fails every container start ("Failed to get working directory") once it is gone.
  # Its pid is podman's own (exec), written before it can be asked anything.
  setsid env -C / bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PODMAN_PIDFILE" \
    "${PODMAN[@]}" system service --time=0 "unix://$PODMAN_SOCK" \
    </dev/null >>"$PODMAN_LOG" 2>&1 9>&- &
  ppid_=$!
  for ((i = 0; i < 1200; i++)); do
    podman_ready && break
    if ! kill -0 "$ppid_" 2>/dev/null; then
      say "podman service exited; tail of $PODMAN_LOG:"; tail -n 30 "$PODMAN_LOG" >&2; exit 1
    fi
    sleep 0.05
  done
  if ! podman_ready; then
    say "podman service not ready after 60 s; tail of $PODMAN_LOG:"; tail -n 30 "$PODMAN_LOG" >&2; exit 1
  fi
  say "podman service ready (pid $(cat "$PODMAN_PIDFILE")) in $((($(date +%s%N) - t0) / 1000000)) ms"
fi

# --- 4. test image, in both engines ----------------------------------------------
# One busybox-static rootfs tarball, made only when an engine lacks the image.
tarball=''
rootfs_tarball() {
  [[ -n $tarball ]] && return
  rootfs=$(mktemp -d)
  mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp}
  chmod 1777 "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  # Run inside the rootfs so the applet symlinks point at /bin/busybox, not at $rootfs.
  chroot "$rootfs" /bin/busybox --install -s
  tarball=$rootfs.tar
  tar --numeric-owner -C "$rootfs" -cf "$tarball" .
}
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "building $IMAGE in dockerd from busybox-static"
  rootfs_tarball
  docker import \
    --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/sh"]' \
    - "$IMAGE" <"$tarball" >/dev/null
fi
if ! podman image exists "$IMAGE"; then
  say "building $IMAGE in podman from busybox-static"
  rootfs_tarball
  podman import --quiet \
    --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/sh"]' \
    "$tarball" "$IMAGE" >/dev/null
fi

# --- 5. smoke test ----------------------------------------------------------
# The same two containers on each engine, through its Docker-compatible API.
for engine in "$SOCK" "$PODMAN_SOCK"; do
  smoke "$engine" "$IMAGE" sh -c 'echo ok'
  net=capstan-ci-smoke-$$
  command docker -H "unix://$engine" network create "$net" >/dev/null
  smoke "$engine" --network "$net" "$IMAGE" sh -c 'ip -4 addr show eth0 | grep -q inet && echo ok'
  command docker -H "unix://$engine" network rm "$net" >/dev/null
  net=''
done
say "smoke tests passed"

cat <<EOF
export CAPSTAN_TEST_DOCKER_HOST=unix://$SOCK
export CAPSTAN_TEST_PODMAN_HOST=unix://$PODMAN_SOCK
export DOCKER_HOST=unix://$SOCK
# test image: $IMAGE   dockerd pid: $(cat "$PIDFILE")   log: $LOG
# podman service pid: $(cat "$PODMAN_PIDFILE")   log: $PODMAN_LOG
EOF
