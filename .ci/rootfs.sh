#!/usr/bin/env bash
# Prints the path of the fleet harness's Debian rootfs (tests/harness/fleet/ boots every
# fleet host on an overlay of it), building it first when this machine has not cached it:
#   debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,openssh-server,iproute2
# from the machine's own apt mirror (/etc/apt/sources.list*). Cached under
# /var/cache/capstan-ci/rootfs-<version>, where the version names the suite, a digest of
# the package list and RECIPE (bump it whenever this recipe changes what it builds).
# The cold build took 87 s here (2 cores, downloads included: 7 s installing debootstrap,
# 80 s debootstrap; 42 s a second time) and left 175 MB; later runs reuse it (a few ms).
# Progress goes to stderr. Needs root.
set -euo pipefail
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,openssh-server,iproute2
RECIPE=1
CACHE=/var/cache/capstan-ci
VERSION=$SUITE-r$RECIPE-$(printf '%s %s %s' "$SUITE" "$PACKAGES" "$RECIPE" | sha256sum | cut -c1-8)
ROOT=$CACHE/rootfs-$VERSION

say() { echo "rootfs.sh: $*" >&2; }

# The mirror the machine's apt uses for $SUITE: the URI of the first deb822 stanza whose
# Suites name it, else of the first one-line `deb URI $SUITE ...` source.
mirror() {
  local uri
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$SUITE" '
    BEGIN { RS = "" }
    {
      uri = ""; ok = 0; n = split($0, lines, "\n")
      for (i = 1; i <= n; i++) {
        m = split(lines[i], f, /[ \t]+/)
        if (f[1] == "URIs:") uri = f[2]
        if (f[1] == "Suites:") for (j = 2; j <= m; j++) if (f[j] == suite) ok = 1
      }
      if (ok && uri != "") { print uri; exit }
    }' || true)
  if [[ -z $uri ]]; then
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v suite="$SUITE" '
      $1 == "deb" { for (i = 2; i < NF; i++) if ($i ~ /^https?:/ && $(i + 1) == suite) { print $i; exit } }' || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

if [[ ! -x $ROOT/lib/systemd/systemd ]]; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/rootfs.lock"
  flock 9 # another run may be building the same version: wait for it
fi
if [[ ! -x $ROOT/lib/systemd/systemd ]]; then
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends debootstrap >&2
  fi
  url=$(mirror)
  say "building the $SUITE rootfs into $ROOT from $url (about 1.5 minutes; cached for later runs)"
  t0=$(date +%s)
  # Built in a scratch dir and moved in whole: an interrupted build is never taken as
  # cached (the scratch dir is removed on exit, or by the next build's sweep below).
  # --one-file-system: an interrupted debootstrap may leave its proc or sys mounted there.
  rm -rf --one-file-system "$CACHE"/rootfs-"$VERSION".tmp.*
  scratch=$(mktemp -d "$ROOT.tmp.XXXXXX")
  trap 'rm -rf --one-file-system "$scratch"' EXIT
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$scratch" "$url" >&2
  # Small: no apt lists or package caches; no machine-id (the harness writes one per host).
  rm -rf "$scratch"/var/lib/apt/lists/* "$scratch"/var/cache/apt/*.bin \
    "$scratch"/var/cache/apt/archives/*.deb "$scratch"/var/log/*.log
  : >"$scratch/etc/machine-id"
  chmod 755 "$scratch"
  rm -rf "$ROOT"
  mv "$scratch" "$ROOT"
  trap - EXIT
  say "built $ROOT in $(($(date +%s) - t0)) s ($(du -sh "$ROOT" | cut -f1))"
fi
echo "$ROOT"
