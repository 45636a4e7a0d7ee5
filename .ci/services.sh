#!/usr/bin/env bash
# Sets up the real services capstan's tests use (see DESIGN.md "Real parts in tests"):
#   - the Debian packages (nats-server, docker.io, busybox-static, openssh-server, ...;
#     systemd, dbus, util-linux and mount for the systemd tests' own systemd per test,
#     tests/harness/systemd.rs: /usr/lib/systemd/systemd, dbus-daemon, unshare,
#     nsenter, journalctl)
#   - a private dockerd on its own socket and data root (never /var/run/docker.sock)
#   - the test image capstan-test/busybox:1, built offline with `docker import`
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
PACKAGES=(nats-server docker.io tini busybox-static openssh-server iproute2 procps
  systemd dbus util-linux mount)

say() { echo "services.sh: $*" >&2; }
docker() { command docker -H "unix://$SOCK" "$@"; }
# Runs a container that must print "ok". `docker run` always warns "IPv4 forwarding is
# disabled" because of --ip-forward=false (below); that is expected, so only show stderr
# on failure, minus that line.
smoke() {
  local out
  out=$(docker run --rm "$@" 2>"$RUN_DIR/smoke.err") || true
  if [[ $out != ok ]]; then
    say "smoke test failed: docker run --rm $*"
    grep -v 'IPv4 forwarding is disabled' "$RUN_DIR/smoke.err" >&2
    exit 1
  fi
}

rootfs='' net=''
cleanup() {
  [[ -z $rootfs ]] || rm -rf "$rootfs"
  [[ -z $net ]] || docker network rm "$net" >/dev/null 2>&1 || true
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
  # script and never holds a caller's pipe open.
  setsid tini -s -- dockerd \
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

# --- 3. test image ----------------------------------------------------------
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "building $IMAGE from busybox-static"
  rootfs=$(mktemp -d)
  mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp}
  chmod 1777 "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  # Run inside the rootfs so the applet symlinks point at /bin/busybox, not at $rootfs.
  chroot "$rootfs" /bin/busybox --install -s
  tar --numeric-owner -C "$rootfs" -c . |
    docker import \
      --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/sh"]' \
      - "$IMAGE" >/dev/null
fi

# --- 4. smoke test ----------------------------------------------------------
smoke "$IMAGE" sh -c 'echo ok'
net=capstan-ci-smoke-$$
docker network create "$net" >/dev/null
smoke --network "$net" "$IMAGE" sh -c 'ip -4 addr show eth0 | grep -q inet && echo ok'
say "smoke tests passed"

cat <<EOF
export CAPSTAN_TEST_DOCKER_HOST=unix://$SOCK
export DOCKER_HOST=unix://$SOCK
# test image: $IMAGE   dockerd pid: $(cat "$PIDFILE")   log: $LOG
EOF
