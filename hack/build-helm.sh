#!/usr/bin/env bash
# Build (or locate in the cache) the helm v3 client used by tests/deploy/test_chart.py and
# tests/e2e/test_chart_e2e.py to lint and render charts/joulesched.
#
# ONE helm release is pinned below; it is built with `go install` from the
# helm.sh/helm/v3 Go module (cmd/helm) into a cache OUTSIDE the clone:
#   ${JOULESCHED_HELM_CACHE:-$HOME/.cache/joulesched/helm}/<version>/bin/helm
# and rebuilt only when it is missing for the pinned version.
#
# Usage:  BIN=$(hack/build-helm.sh | tail -1); "$BIN/helm" version
# The last line of stdout is always the bin directory; progress goes to stderr.
#
# Environment:
#   JOULESCHED_HELM_CACHE    cache root (default $HOME/.cache/joulesched/helm)
#   JOULESCHED_HELM_VERSION  override the pinned version (for experiments only)
#   GO                       go binary (default: `go` on PATH, else /usr/local/go/bin/go)
#   JOULESCHED_BUILD_P       go build -p value (default 2)
set -euo pipefail

# Pinned release: v3.22.0 is the newest v3 release served by the proxy; its go.mod says
# `go 1.26.0`, so the stock Go 1.26.x toolchain builds it.
HELM_VERSION_PINNED=v3.22.0
HELM_VERSION="${JOULESCHED_HELM_VERSION:-$HELM_VERSION_PINNED}"

CACHE_ROOT="${JOULESCHED_HELM_CACHE:-$HOME/.cache/joulesched/helm}"
VERSION_DIR="$CACHE_ROOT/$HELM_VERSION"
BIN_DIR="$VERSION_DIR/bin"

log() { echo "build-helm: $*" >&2; }

if [[ -x "$BIN_DIR/helm" ]]; then
  log "cache hit: $BIN_DIR ($HELM_VERSION; $(cat "$VERSION_DIR/BUILD_INFO" 2>/dev/null || echo 'build time not recorded'))"
  echo "$BIN_DIR"
  exit 0
fi

# shellcheck source=hack/find-go.sh
source "$(dirname "${BASH_SOURCE[0]}")/find-go.sh"

if [[ ! "$HELM_VERSION" =~ ^v3\.[0-9]+\.[0-9]+$ ]]; then
  log "ERROR: unexpected version '$HELM_VERSION' (want v3.N.M)"
  exit 2
fi

mkdir -p "$VERSION_DIR"
# Serialise concurrent builds of the same version.
exec 9>"$VERSION_DIR/.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  if [[ -x "$BIN_DIR/helm" ]]; then
    log "cache hit after waiting for a concurrent build: $BIN_DIR"
    echo "$BIN_DIR"
    exit 0
  fi
fi

start=$(date +%s)
GO_VERSION=$("$GO" version)
log "building helm $HELM_VERSION with $GO_VERSION into $BIN_DIR"

# Keep the build self-contained: ignore any go.work / GOFLAGS of the caller, and build
# outside any module (go install pkg@version).
export GOWORK=off
export GOFLAGS=
export CGO_ENABLED=0
TMP_BIN="$VERSION_DIR/bin.tmp"
rm -rf "$TMP_BIN"
mkdir -p "$TMP_BIN"
cd "$VERSION_DIR"
# Stamp what helm's Makefile stamps: its version, and the default Kubernetes version of
# `helm template`/`helm lint` (.Capabilities.KubeVersion without --kube-version), derived
# from the k8s.io/client-go it requires (v0.N.M -> v1.N). Unstamped, that default is v1.20.
HMOD=$("$GO" mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
CLIENT_GO=$(awk '$1=="k8s.io/client-go"{print $2; exit}' "$HMOD")
if [[ ! "$CLIENT_GO" =~ ^v0\.([0-9]+)\. ]]; then
  log "ERROR: no k8s.io/client-go v0.N.M in helm's go.mod ($HMOD)"
  exit 1
fi
K8S_MINOR="${BASH_REMATCH[1]}"
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
LDFLAGS+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  LDFLAGS+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$K8S_MINOR"
done
log "default Kubernetes version: v1.$K8S_MINOR (client-go $CLIENT_GO)"
GOBIN="$TMP_BIN" "$GO" install -p "${JOULESCHED_BUILD_P:-2}" -trimpath -ldflags="$LDFLAGS" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2

[[ -x "$TMP_BIN/helm" ]] || { log "ERROR: helm was not produced"; exit 1; }
rm -rf "$BIN_DIR"
mv "$TMP_BIN" "$BIN_DIR"

end=$(date +%s)
echo "helm $HELM_VERSION built in $((end - start))s on $(date -u +%Y-%m-%dT%H:%M:%SZ) with $GO_VERSION" >"$VERSION_DIR/BUILD_INFO"
log "built helm $HELM_VERSION in $((end - start))s"
"$BIN_DIR/helm" version --short >&2 || true
echo "$BIN_DIR"
