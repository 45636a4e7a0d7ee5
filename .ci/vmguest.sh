#!/usr/bin/env bash
# Prints the directory of the VM driver's test guest (tests/tests/e2e/vm/): `vmlinuz`,
# Debian's cloud kernel (extracted from its package, not installed), and
# `initramfs.cpio.gz`, static busybox with capstan's reference init (vm/guest/: init,
# workload, acpi-power, envexec.c) and the kernel modules the init loads (fw_cfg, the
# power button, virtio-net). Installs QEMU
# and the build tools first when missing. Cached under
# /var/cache/capstan-ci/vm-guest-<version>, the version a digest of vm/guest/, this
# script and the kernel package: a change to any rebuilds it. The cold build took
# about 20 s here (the kernel package's download most of it); later runs reuse it.
# Progress goes to stderr. Needs root. Recipe and measurements: docs/vm.md.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=/var/cache/capstan-ci
say() { echo "vmguest.sh: $*" >&2; }

packages=(qemu-system-x86 qemu-utils busybox-static cpio lz4 kmod gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
[[ -n $pkg ]] || { say "no linux-image-cloud-amd64 in apt's lists"; exit 1; }
kver=${pkg#linux-image-}
version=$( (cat vm/guest/* .ci/vmguest.sh; echo "$pkg") | sha256sum | cut -c1-12)
out=$CACHE/vm-guest-$version
if [[ ! -f $out/initramfs.cpio.gz ]]; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/vm-guest.lock"
  flock 9
fi
if [[ ! -f $out/initramfs.cpio.gz ]]; then
  say "building the test guest ($kver) into $out"
  t0=$(date +%s)
  rm -rf "$CACHE"/vm-guest-"$version".tmp.*
  scratch=$(mktemp -d "$out.tmp.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  # apt-get download fetches as _apt: the directory must be writable to it.
  mkdir -p "$scratch/debs" && chmod 777 "$scratch/debs"
  (cd "$scratch/debs" && apt-get download -q "$pkg" >&2)
  dpkg-deb -x "$scratch"/debs/"${pkg}"_*.deb "$scratch/kernel"
  # The package ships no modules.dep; the init loads its few modules in order itself.
  cp "$scratch/kernel/boot/vmlinuz-$kver" "$scratch/vmlinuz"
  gcc -O2 -static -o "$scratch/envexec" vm/guest/envexec.c
  root=$scratch/root
  mkdir -p "$root"/{bin,proc,sys,dev,run,tmp,lib/modules,etc/acpi/PWRF,etc/acpi/PWRB}
  cp /bin/busybox "$root/bin/busybox"
  for a in $(/bin/busybox --list); do [[ $a == busybox ]] || ln -s busybox "$root/bin/$a"; done
  install -m 0755 vm/guest/init "$root/init"
  install -m 0755 vm/guest/workload "$root/bin/workload"
  install -m 0755 "$scratch/envexec" "$root/bin/envexec"
  install -m 0755 vm/guest/acpi-power "$root/etc/acpi/PWRF/00000080"
  install -m 0755 vm/guest/acpi-power "$root/etc/acpi/PWRB/00000080"
  mods=$scratch/kernel/lib/modules/$kver/kernel
  for m in drivers/firmware/qemu_fw_cfg drivers/acpi/button drivers/input/evdev \
    drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev \
    drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci net/core/failover \
    drivers/net/net_failover drivers/net/virtio_net; do
    cp "$mods/$m.ko" "$root/lib/modules/"
  done
  (cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -9 >"$scratch/initramfs.cpio.gz"
  mkdir -p "$out.tmp.done"
  mv "$scratch/vmlinuz" "$scratch/initramfs.cpio.gz" "$out.tmp.done/"
  echo "$kver" >"$out.tmp.done/kernel-version"
  rm -rf "$out"
  mv "$out.tmp.done" "$out"
  say "built $out in $(($(date +%s) - t0)) s (initramfs $(wc -c <"$out/initramfs.cpio.gz") bytes)"
fi
echo "$out"
