#!/usr/bin/env bash
# Prints `export` lines for the kube driver's tests (tests/harness/kube.rs):
#   CAPSTAN_KUBE_BIN_DIR  a dir holding kube-apiserver, kube-controller-manager and etcd
# building them first when this machine has not cached them. All three come from the Go
# module proxy, built from source (there is no other source for kube-apiserver here):
#   - kube-apiserver, kube-controller-manager from k8s.io/kubernetes v$KUBE_VERSION. That
#     module replaces every staging module (k8s.io/api, k8s.io/apiserver, ...) with
#     ./staging/...; a module depending on it must pin them itself: one `replace` per
#     staging module, at v0.<minor>.<patch>.
#   - etcd v$ETCD_VERSION (go.etcd.io/etcd/server/v3), the etcd kubeadm pairs with this
#     Kubernetes minor. Debian's etcd-server is 3.4, an untested pairing with 1.36; building
#     3.6 costs little next to kube-apiserver. Its own module: etcd's go.mod files have
#     replace lines, so `go install pkg@version` refuses them.
# Cached under /var/cache/capstan-ci/kube-<versions>; built in a scratch dir and moved
# in whole under a lock, so an interrupted build is never taken as cached. Go's module
# cache is /var/cache/capstan-ci/go-mod; its build cache lives in the scratch dir and
# goes with it. Cold build: 21 min on a busy 2-core machine (docs/kube.md).
# Progress goes to stderr.
set -euo pipefail
KUBE_VERSION=1.36.3
ETCD_VERSION=3.6.16
RECIPE=1
CACHE=/var/cache/capstan-ci
ROOT=$CACHE/kube-$KUBE_VERSION-etcd-$ETCD_VERSION-r$RECIPE
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
BINS=(kube-apiserver kube-controller-manager etcd)

say() { echo "kube.sh: $*" >&2; }
complete() {
  local b
  for b in "${BINS[@]}"; do [[ -x $ROOT/$b ]] || return 1; done
}

if ! complete; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/kube.lock"
  flock 9 # another run may be building the same version: wait for it
fi
if ! complete; then
  say "building kube-apiserver, kube-controller-manager $KUBE_VERSION and etcd $ETCD_VERSION into $ROOT (cached for later runs; see docs/kube.md for how long)"
  t0=$(date +%s)
  rm -rf "$CACHE"/kube-"$KUBE_VERSION"-etcd-"$ETCD_VERSION"-r"$RECIPE".tmp.*
  work=$(mktemp -d "$ROOT.tmp.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  # GOCACHE in the scratch dir: Kubernetes leaves ~2.8 GB of build cache that only a
  # rebuild of another version could use; the modules (~830 MB) are kept in go-mod.
  export GOFLAGS="-mod=mod -buildvcs=false" GOCACHE=$work/go-build GOMODCACHE=$CACHE/go-mod \
    GOTOOLCHAIN=local GOPROXY=${GOPROXY:-https://proxy.golang.org} GOSUMDB=${GOSUMDB:-sum.golang.org}
  minor=${KUBE_VERSION#1.}
  minor=${minor%%.*}
  staging=0.${KUBE_VERSION#1.}

  mkdir -p "$work/k" "$work/e" "$work/bin"
  (
    cd "$work/k"
    printf 'module capstan.ci/kbuild\n\ngo 1.25\n' >go.mod
    gomod=$("$GO" mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" |
      sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
    [[ -f $gomod ]] || { say "no go.mod for k8s.io/kubernetes@v$KUBE_VERSION"; exit 1; }
    grep -oE '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" |
      awk -v v="$staging" '{ print "replace " $1 " => " $1 " v" v }' >>go.mod
    grep -c '^replace' go.mod | sed 's/^/kube.sh: staging modules pinned: /' >&2
    "$GO" get "k8s.io/kubernetes@v$KUBE_VERSION" >&2
    ld="-s -w -X k8s.io/component-base/version.gitVersion=v$KUBE_VERSION"
    ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
    t1=$(date +%s)
    "$GO" build -ldflags "$ld" -o "$work/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager >&2
    say "kube-apiserver, kube-controller-manager: compiled in $(($(date +%s) - t1)) s"
  )
  (
    cd "$work/e"
    printf 'module capstan.ci/ebuild\n\ngo 1.25\n' >go.mod
    "$GO" get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2
    t1=$(date +%s)
    "$GO" build -ldflags "-s -w" -o "$work/bin/etcd" go.etcd.io/etcd/server/v3 >&2
    say "etcd: compiled in $(($(date +%s) - t1)) s"
  )
  chmod 755 "$work/bin"
  rm -rf "$ROOT"
  mv "$work/bin" "$ROOT"
  rm -rf "$work"
  trap - EXIT
  say "built $ROOT in $(($(date +%s) - t0)) s ($(du -sh "$ROOT" | cut -f1))"
fi
"$ROOT/kube-apiserver" --version >&2
"$ROOT/etcd" --version 2>&1 | sed -n 1p >&2
cat <<EOF
export CAPSTAN_KUBE_BIN_DIR=$ROOT
EOF
