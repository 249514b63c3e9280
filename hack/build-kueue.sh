#!/usr/bin/env bash
# Build Kueue's manager from its Go module into a cache outside the repo, next to
# the control plane's binaries, and copy its CRDs and webhook manifests beside it.
#
# Why a script: no image registry is reachable, so the manager comes from the Go
# module proxy like the control plane (hack/build-tools.sh). Kueue's go.mod has no
# replace directives, so `go build` inside a module that requires it at the pinned
# version builds exactly the release's dependency graph. The cache is keyed by the
# version and guarded by a lock; a warm cache returns at once.
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
CACHE_ROOT="${GPUJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob}"
OUT_DIR="$CACHE_ROOT/bin/kueue-${KUEUE_VERSION}"
WORK="$CACHE_ROOT/build/kueue-${KUEUE_VERSION}"
STAMP="$OUT_DIR/.complete"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED=0

log() { printf '[build-kueue] %s\n' "$*" >&2; }

if [[ "${1:-}" == "--print-dir" ]]; then echo "$OUT_DIR"; exit 0; fi
if [[ -f "$STAMP" ]]; then echo "$OUT_DIR"; exit 0; fi

command -v go >/dev/null || { log "go is not installed"; exit 2; }
mkdir -p "$CACHE_ROOT" "$WORK" "$OUT_DIR"
exec 9>"$CACHE_ROOT/build-kueue.lock"
log "waiting for the build lock $CACHE_ROOT/build-kueue.lock"
flock 9
if [[ -f "$STAMP" ]]; then echo "$OUT_DIR"; exit 0; fi
start=$(date +%s)

src=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
if [[ ! -x "$OUT_DIR/kueue" ]]; then
  cat >"$WORK/tools.go" <<'GO'
//go:build gpujob_tools

// Package tools pins the Kueue manager this module builds (the tag only keeps
// go mod tidy aware of it; Kueue's own tools.go files use the plain "tools" tag).
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
GO
  # Start from Kueue's own go.mod so every dependency sits at the release's version.
  { echo "module gpujob.local/kueue"; echo; sed -n '/^go [0-9]/,$p' "$src/go.mod" | sed '/^toolchain/d'
    echo; echo "require sigs.k8s.io/kueue $KUEUE_VERSION"; } >"$WORK/go.mod"
  cp "$src/go.sum" "$WORK/go.sum"; chmod u+w "$WORK/go.sum"
  (cd "$WORK" && go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$WORK" && go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.BuildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    -o "$OUT_DIR/kueue" sigs.k8s.io/kueue/cmd/kueue)
  log "built kueue manager $KUEUE_VERSION"
fi
rm -rf "$OUT_DIR/crd" "$OUT_DIR/webhook"
cp -r "$src/config/components/crd/bases" "$OUT_DIR/crd"
cp -r "$src/config/components/webhook" "$OUT_DIR/webhook"
chmod -R u+w "$OUT_DIR/crd" "$OUT_DIR/webhook"
touch "$STAMP"
log "kueue $KUEUE_VERSION in $OUT_DIR after $(( $(date +%s) - start ))s"
echo "$OUT_DIR"
