#!/usr/bin/env bash
# Build the local control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) and helm from Go modules into a cache outside the repo.
#
# Why a script: no release downloads are reachable, so every binary comes from the
# Go module proxy. The cache is keyed by versions and guarded by a lock so two
# builds never race; a warm cache returns at once.
set -euo pipefail

ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
K8S_VERSION="${K8S_VERSION:-v1.37.2}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE_ROOT="${GPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob}"
BIN_DIR="$CACHE_ROOT/bin/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"
WORK="$CACHE_ROOT/build"
STAMP="$BIN_DIR/.complete"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED=0

log() { printf '[build-tools] %s\n' "$*" >&2; }

if [[ "${1:-}" == "--print-bin-dir" ]]; then echo "$BIN_DIR"; exit 0; fi
if [[ -f "$STAMP" ]]; then echo "$BIN_DIR"; exit 0; fi

command -v go >/dev/null || { log "go is not installed; install Go >= 1.26 first (Kubernetes v1.37 needs it)"; exit 2; }
mkdir -p "$CACHE_ROOT" "$WORK"
exec 9>"$CACHE_ROOT/build.lock"
log "waiting for the build lock $CACHE_ROOT/build.lock"
flock 9
if [[ -f "$STAMP" ]]; then echo "$BIN_DIR"; exit 0; fi
mkdir -p "$BIN_DIR"
start=$(date +%s)

build_etcd() {
  local dir="$WORK/etcd-$ETCD_VERSION"
  [[ -x "$BIN_DIR/etcd" ]] && return 0
  mkdir -p "$dir"
  cat >"$dir/main.go" <<'GO'
// Command etcd wraps etcdmain so etcd builds from its server module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$dir" && rm -f go.mod go.sum && go mod init gpujob.local/etcd >/dev/null 2>&1 \
    && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" && go mod tidy \
    && go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd" .)
  log "built etcd $ETCD_VERSION"
}

build_k8s() {
  local dir="$WORK/k8s-$K8S_VERSION" minor staging_ver gomod
  local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  local missing=0
  for c in "${cmds[@]}"; do [[ -x "$BIN_DIR/$c" ]] || missing=1; done
  [[ $missing == 0 ]] && return 0
  staging_ver="v0.${K8S_VERSION#v1.}"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  mkdir -p "$dir"
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module gpujob.local/k8s"
    echo
    grep -E '^go [0-9]' "$gomod"
    grep -E '^godebug' "$gomod" || true
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # Each staging module k8s.io/<name> v0.0.0 comes from the proxy at the matching v0.N.P.
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk -v v="$staging_ver" '{print "replace " $1 " => " $1 " " v}'
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

// Package tools pins the Kubernetes commands this module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  (cd "$dir" && go mod tidy -e >/dev/null 2>&1 || true; cd "$dir" && go mod download)
  local date ld
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitCommit=0000000000000000000000000000000000000000 -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  for c in "${cmds[@]}"; do
    [[ -x "$BIN_DIR/$c" ]] && continue
    (cd "$dir" && go build -trimpath -tags tools -ldflags "$ld" -o "$BIN_DIR/$c" "k8s.io/kubernetes/cmd/$c")
    log "built $c $K8S_VERSION"
  done
}

build_helm() {
  local dir="$WORK/helm-$HELM_VERSION"
  [[ -x "$BIN_DIR/helm" ]] && return 0
  mkdir -p "$dir"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

// Package tools pins the helm command this module builds.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO
  (cd "$dir" && rm -f go.mod go.sum && go mod init gpujob.local/helm >/dev/null 2>&1 \
    && go get "helm.sh/helm/v3@$HELM_VERSION" && go mod tidy -e >/dev/null 2>&1; \
    cd "$dir" && go build -trimpath -tags tools \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
      -o "$BIN_DIR/helm" helm.sh/helm/v3/cmd/helm)
  log "built helm $HELM_VERSION"
}

build_etcd
build_k8s
build_helm
"$BIN_DIR/kube-apiserver" --version >&2
touch "$STAMP"
log "all tools in $BIN_DIR after $(( $(date +%s) - start ))s"
echo "$BIN_DIR"
