#!/usr/bin/env bash
# Build the joulesched images with podman from this checkout.
#
#   hack/build-image.sh [--offline] [--tag TAG] [--base IMAGE]
#
# 1. Wheels of joulesched and every dependency are built on the host into dist/wheels (pip, with
#    the host's index and CA bundle), so the image build itself needs no network.
# 2. --offline makes the base image without pulling one: mmdebstrap writes a Debian bookworm
#    root with python3, python3-venv, libstdc++6, ipmitool and freeipmi-tools, and `podman
#    import` loads it as localhost/joulesched-base:bookworm-<hash of that list>. Without it, BASE is the Containerfile's default (an
#    official slim Python image) or --base.
# 3. podman builds the `extender` and `agent` targets (runc runtime: crun 1.8 refuses hybrid
#    cgroup layouts).
# The last two lines of stdout are the two image names.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
base=""
offline=false
while (($#)); do
  case "$1" in
    --offline) offline=true ;;
    --tag) tag=$2; shift ;;
    --base) base=$2; shift ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
log() { echo "build-image: $*" >&2; }
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && python=.venv/bin/python

rm -rf dist/wheels
log "wheels of joulesched and its dependencies -> dist/wheels"
# The commit's time in the wheel's zip entries: the same tree gives the same wheel, so podman
# reuses its install layer instead of rebuilding it (a second build in the same CI run).
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)} \
  "$python" -m pip wheel -q --wheel-dir dist/wheels . >&2

if $offline; then
  # numpy's wheels need libstdc++; the agent needs ipmitool and FreeIPMI.
  packages=python3,python3-venv,libstdc++6,ca-certificates,ipmitool,freeipmi-tools
  base=localhost/joulesched-base:bookworm-$(printf %s "$packages" | sha256sum | cut -c1-12)
  if ! podman image exists "$base"; then
    root=$(mktemp -d)
    log "base image $base with mmdebstrap"
    mmdebstrap --quiet --variant=essential --include="$packages" --format=tar bookworm "$root/base.tar" >&2
    podman import "$root/base.tar" "$base" >&2
    rm -rf "$root"
  fi
fi
# The commit joulesched_build_info reports (a "-dirty" suffix when the tree has changes).
revision=unknown
if git rev-parse --verify -q HEAD >/dev/null 2>&1; then
  revision=$(git rev-parse --short=12 HEAD)
  git diff --quiet HEAD -- 2>/dev/null || revision+=-dirty
fi
args=(--runtime runc --ulimit "nofile=4096:4096" --ulimit "nproc=4096:4096" --build-arg "VERSION=$tag"
      --build-arg "REVISION=$revision")
[ -n "$base" ] && args+=(--build-arg "BASE=$base")
# The names deploy/ runs (ghcr.io/joulesched/joulesched and …/joulesched-agent), built locally.
for target in extender agent; do
  name=localhost/joulesched:$tag
  [ "$target" = agent ] && name=localhost/joulesched-agent:$tag
  log "podman build --target $target -> $name"
  podman build -q "${args[@]}" --target "$target" -t "$name" -f Containerfile . >&2
  echo "$name"
done
