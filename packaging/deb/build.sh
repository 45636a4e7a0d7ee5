#!/usr/bin/env bash
# Builds capstan-agent_<version>_<arch>.deb and capstan-coordinator_<version>_<arch>.deb
# with dpkg-deb, reproducibly: the same binaries and sources give the same bytes
# (every mtime is SOURCE_DATE_EPOCH — the last commit's time unless set —, owners are
# root, modes are fixed, and dpkg-deb sorts the archive's entries).
#
#   packaging/deb/build.sh [--bin-dir DIR] [--out DIR] [--version V]
#
# --bin-dir: where the built binaries are (default: build them with
#   `cargo build --release --locked` and take target/release).
# --out: where the packages go (default: target/deb). Prints their paths.
# --version: the packages' version (default: the workspace's); tests use it to make a
#   package that `capstan install --upgrade` sees as another version.
# What the packages hold and what their scripts do: docs/install.md, "Packages".
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/packaging/deb

bin_dir='' out=$ROOT/target/deb version=''
while (($#)); do
  case $1 in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    *) echo "usage: $0 [--bin-dir DIR] [--out DIR] [--version V]" >&2; exit 2 ;;
  esac
done
if [[ -z $bin_dir ]]; then
  echo "build.sh: cargo build --release (cold: 785 CPU-seconds, at least 6.5 minutes on 2 idle cores)" >&2
  cargo build --release --locked -p capstan-agent -p capstan-coordinator --bins >&2
  bin_dir=$ROOT/target/release
fi

[[ -n $version ]] || version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
: "${SOURCE_DATE_EPOCH:=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH
umask 022
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# The glibc the binaries need (their newest versioned symbol).
libc_of() {
  objdump -T "$@" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1
}

# put SRC DEST MODE: one file into the package tree.
put() {
  install -D -m "$3" "$1" "$pkg/$2"
}

# package NAME DESCRIPTION LONG [FIELD...]: the control files (with FIELD lines, e.g.
# `X-Capstan-Log-Layouts: 1 2`, after Depends), then the .deb.
package() {
  local name=$1 summary=$2 long=$3
  shift 3
  local extra='' field
  for field in "$@"; do extra+="$field"$'\n'; done
  local libc
  libc=$(libc_of "$pkg"/usr/bin/*)
  install -d -m 0755 "$pkg/DEBIAN"
  for script in postinst prerm postrm; do
    install -m 0755 "$HERE/$name/$script" "$pkg/DEBIAN/$script"
  done
  (cd "$pkg" && find etc -type f -printf '/%p\n' | sort) >"$pkg/DEBIAN/conffiles"
  chmod 0644 "$pkg/DEBIAN/conffiles"
  install -d -m 0755 "$pkg/usr/share/doc/$name"
  cat >"$pkg/usr/share/doc/$name/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: capstan

Files: *
Copyright: the capstan developers
License: Apache-2.0
 On Debian systems, the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF
  chmod 0644 "$pkg/usr/share/doc/$name/copyright"
  (cd "$pkg" && find usr etc -type f -print0 | sort -z | xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
  chmod 0644 "$pkg/DEBIAN/md5sums"
  # Installed-Size in KiB, counted as dpkg-gencontrol does (each file's size rounded up
  # to a KiB, 1 for each directory or link): from the sizes, not from the blocks `du`
  # sees, which vary with how the filesystem placed the files (two builds side by side
  # under load differed by an extent block).
  local installed
  installed=$(cd "$pkg" && find . -path ./DEBIAN -prune -o -mindepth 1 -printf '%y %s\n' |
    awk '$1 == "f" { k += int(($2 + 1023) / 1024); next } { k += 1 } END { print k }')
  cat >"$pkg/DEBIAN/control" <<EOF
Package: $name
Version: $version
Architecture: $arch
Maintainer: capstan developers <capstan@localhost>
Section: admin
Priority: optional
Depends: libc6 (>= $libc), libgcc-s1, systemd, init-system-helpers
${extra}Installed-Size: $installed
Description: $summary
$long
EOF
  find "$pkg" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  dpkg-deb --root-owner-group -Zxz --build "$pkg" "$out/${name}_${version}_${arch}.deb" >/dev/null
  echo "$out/${name}_${version}_${arch}.deb"
}

# bin NAME: a binary, stripped of its symbols and debug info (a release build's are
# most of its size).
bin() {
  put "$bin_dir/$1" "usr/bin/$1" 0755
  strip --strip-unneeded "$pkg/usr/bin/$1"
}

pkg=$stage/capstan-agent
bin capstan-agent
# The storage layouts of the log this agent reads, from the binary itself (the second
# line of `capstan-agent --version`): `capstan install` reads the field with
# `dpkg-deb -f` to refuse a downgrade to a build that cannot read a host's log.
layouts=$("$pkg/usr/bin/capstan-agent" --version | sed -n 's/^log layouts: //p')
[[ $layouts =~ ^[0-9]+( [0-9]+)*$ ]] || {
  echo "build.sh: $bin_dir/capstan-agent --version names no log layouts" >&2
  exit 1
}
put systemd/units/capstan-agent.service usr/lib/systemd/system/capstan-agent.service 0644
put systemd/units/capstan.tmpfiles usr/lib/tmpfiles.d/capstan.conf 0644
put packaging/etc/agent.toml etc/capstan/agent.toml 0644
put README.md usr/share/doc/capstan-agent/README.md 0644
for doc in agent cli glossary install hooks nats protocol systemd vm driver-protocol; do
  put "docs/$doc.md" "usr/share/doc/capstan-agent/$doc.md" 0644
done
package capstan-agent "capstan node agent: an event-sourced lifecycle agent for one host" \
" Writes each lifecycle command from the coordinator to its own durable, hash-chained
 event log before acting, carries it out through one driver (sim, docker, systemd, vm,
 or an external driver process), runs the lifecycle hooks around each start and stop,
 and rebuilds the running intent of every workload from its log when it comes back." \
  "X-Capstan-Log-Layouts: $layouts"

pkg=$stage/capstan-coordinator
bin capstan-coordinator
bin capstan
put systemd/units/capstan-coordinator.service usr/lib/systemd/system/capstan-coordinator.service 0644
put systemd/units/capstan.sysusers usr/lib/sysusers.d/capstan.conf 0644
put packaging/etc/coordinator.toml etc/capstan/coordinator.toml 0644
put packaging/nats-server.conf usr/share/doc/capstan-coordinator/examples/nats-server.conf 0644
put README.md usr/share/doc/capstan-coordinator/README.md 0644
for doc in api cli glossary install nats protocol; do
  put "docs/$doc.md" "usr/share/doc/capstan-coordinator/$doc.md" 0644
done
package capstan-coordinator "capstan coordinator: the HTTP API over a capstan fleet's NATS streams" \
" Signs and publishes lifecycle commands to capstan agents over NATS JetStream, and
 answers what happened to each from the fleet's streams and buckets. Also the
 \`capstan\` command line client."
