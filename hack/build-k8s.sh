#!/usr/bin/env bash
# Build (or locate in the cache) the upstream Kubernetes control-plane binaries
# used by the end-to-end tests: kube-apiserver, kube-scheduler and kubectl.
#
# ONE Kubernetes release is pinned below. The binaries are built from the
# k8s.io/kubernetes Go module in a throwaway Go module that requires
# k8s.io/kubernetes@${K8S_VERSION} and replaces every k8s.io/* staging module
# (listed at v0.0.0 in k8s.io/kubernetes's go.mod) with its published v0.X.Y
# tag -- the way out-of-tree schedulers are built.
#
# Binaries are cached OUTSIDE the clone:
#   ${JOULESCHED_K8S_CACHE:-$HOME/.cache/joulesched/k8s}/<version>/bin/
# and rebuilt only when they are missing for the pinned version.
#
# Usage:  BIN=$(hack/build-k8s.sh | tail -1)
# The last line of stdout is always the bin directory; progress goes to stderr.
#
# Environment:
#   JOULESCHED_K8S_CACHE    cache root (default $HOME/.cache/joulesched/k8s)
#   JOULESCHED_K8S_VERSION  override the pinned version (for experiments only)
#   GO                      go binary (default: `go` on PATH, else /usr/local/go/bin/go)
#   JOULESCHED_BUILD_P      go build -p value (default 2)
set -euo pipefail

# Pinned release. v1.37.2 is the newest release served by the proxy and its
# go.mod says `go 1.26.0`, so it builds with the stock Go 1.26.x toolchain
# (no GOTOOLCHAIN download needed).
K8S_VERSION_PINNED=v1.37.2
K8S_VERSION="${JOULESCHED_K8S_VERSION:-$K8S_VERSION_PINNED}"
COMPONENTS=(kube-apiserver kube-scheduler kubectl)

CACHE_ROOT="${JOULESCHED_K8S_CACHE:-$HOME/.cache/joulesched/k8s}"
VERSION_DIR="$CACHE_ROOT/$K8S_VERSION"
BIN_DIR="$VERSION_DIR/bin"

log() { echo "build-k8s: $*" >&2; }

have_all() {
  local c
  for c in "${COMPONENTS[@]}"; do
    [[ -x "$BIN_DIR/$c" ]] || return 1
  done
}

if have_all; then
  log "cache hit: $BIN_DIR ($K8S_VERSION; $(cat "$BIN_DIR/../BUILD_INFO" 2>/dev/null || echo 'build time not recorded'))"
  echo "$BIN_DIR"
  exit 0
fi

# shellcheck source=hack/find-go.sh
source "$(dirname "${BASH_SOURCE[0]}")/find-go.sh"

if [[ ! "$K8S_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
  log "ERROR: unexpected version '$K8S_VERSION' (want v1.N.M)"
  exit 2
fi
MINOR="${BASH_REMATCH[1]}"
PATCH="${BASH_REMATCH[2]}"
STAGING_VERSION="v0.${MINOR}.${PATCH}"

start=$(date +%s)
GO_VERSION=$("$GO" version)
log "building $K8S_VERSION (${COMPONENTS[*]}) with $GO_VERSION into $BIN_DIR"

mkdir -p "$VERSION_DIR"
# Serialise concurrent builds of the same version.
exec 9>"$VERSION_DIR/.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  if have_all; then
    log "cache hit after waiting for a concurrent build: $BIN_DIR"
    echo "$BIN_DIR"
    exit 0
  fi
fi

SRC_DIR="$VERSION_DIR/src"
rm -rf "$SRC_DIR"
mkdir -p "$SRC_DIR"
cd "$SRC_DIR"

# Keep the build self-contained: ignore any go.work / GOFLAGS of the caller.
export GOWORK=off
export GOFLAGS=-mod=mod
export CGO_ENABLED=0

# Fetch k8s.io/kubernetes's go.mod to learn which staging modules it uses.
KMOD=$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
if [[ -z "$KMOD" || ! -f "$KMOD" ]]; then
  log "ERROR: could not download go.mod of k8s.io/kubernetes@$K8S_VERSION"
  exit 1
fi
mapfile -t STAGING < <(grep -Eo '^[[:space:]]*k8s\.io/[A-Za-z0-9._-]+ v0\.0\.0$' "$KMOD" | awk '{print $1}' | sort -u)
# Also replace staging modules named only in its replace block (e.g. sample-*),
# harmless if unused.
mapfile -t STAGING_R < <(grep -Eo '^[[:space:]]*k8s\.io/[A-Za-z0-9._-]+ => \./staging/' "$KMOD" | awk '{print $1}' | sort -u)
GO_DIRECTIVE=$(awk '$1=="go"{print $2; exit}' "$KMOD")

{
  echo "module joulesched.local/k8s-build"
  echo
  echo "go ${GO_DIRECTIVE:-1.26.0}"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  for m in $(printf '%s\n' "${STAGING[@]}" "${STAGING_R[@]}" | sort -u); do
    echo "	$m => $m $STAGING_VERSION"
  done
  echo ")"
} >go.mod
log "go.mod: $(grep -c '=>' go.mod) staging replaces at $STAGING_VERSION"

# Version stamping, as kubernetes' hack/lib/version.sh does.
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION"
  LDFLAGS+=" -X $pkg.gitMajor=1"
  LDFLAGS+=" -X $pkg.gitMinor=$MINOR"
  LDFLAGS+=" -X $pkg.gitTreeState=clean"
  LDFLAGS+=" -X $pkg.buildDate=$BUILD_DATE"
done

PKGS=()
for c in "${COMPONENTS[@]}"; do PKGS+=("k8s.io/kubernetes/cmd/$c"); done

log "downloading modules..."
"$GO" mod download k8s.io/kubernetes >&2
# -mod=mod lets `go build` add the transitive requirements to go.mod.
TMP_BIN="$VERSION_DIR/bin.tmp"
rm -rf "$TMP_BIN"
mkdir -p "$TMP_BIN"
log "compiling (this takes a while on a small machine)..."
"$GO" build -p "${JOULESCHED_BUILD_P:-2}" -trimpath -ldflags="$LDFLAGS" -o "$TMP_BIN/" "${PKGS[@]}" >&2

for c in "${COMPONENTS[@]}"; do
  [[ -x "$TMP_BIN/$c" ]] || { log "ERROR: $c was not produced"; exit 1; }
done
rm -rf "$BIN_DIR"
mv "$TMP_BIN" "$BIN_DIR"
cd "$VERSION_DIR"
rm -rf "$SRC_DIR"

end=$(date +%s)
echo "$K8S_VERSION built in $((end - start))s on $(date -u +%Y-%m-%dT%H:%M:%SZ) with $GO_VERSION" >"$VERSION_DIR/BUILD_INFO"
log "built $K8S_VERSION in $((end - start))s"
"$BIN_DIR/kube-apiserver" --version >&2 || true
echo "$BIN_DIR"
