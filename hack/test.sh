#!/usr/bin/env bash
# The whole test suite on a fresh machine: system packages, a virtual environment with the
# project and its test tools, the upstream Kubernetes binaries (built once, cached), then
# lint, type checks and pytest. `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

log() { printf '\n== %s\n' "$*"; }

# 1. System packages the tests run for real: Prometheus and promtool, etcd for the
#    kube-apiserver, ipmitool and freeipmi against a simulated BMC, InfluxDB 1.x (the NADIKI
#    time-series store read back in tenant mode), openssl for certificates,
#    podman (with runc) and mmdebstrap to build and run the images (tests/deploy/test_image.py).
declare -A provides=([prometheus]=prometheus [promtool]=prometheus [etcd]=etcd-server
                     [ipmitool]=ipmitool [ipmi-dcmi]=freeipmi-tools [influxd]=influxdb [openssl]=openssl
                     [podman]=podman [runc]=runc [mmdebstrap]=mmdebstrap)
missing=()
for binary in "${!provides[@]}"; do
  command -v "$binary" >/dev/null 2>&1 || missing+=("${provides[$binary]}")
done
if ((${#missing[@]})); then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  log "installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts a system Prometheus on :9090 (and InfluxDB on :8086) when it installs them; the
# tests start their own.

# 2. The project and its test tools in .venv.
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
log "installing joulesched[test] into .venv"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
export PATH="$root/.venv/bin:$PATH"

# 3. kube-apiserver, kube-scheduler and kubectl of the pinned release, and the pinned helm
#    (charts/joulesched), all cached outside the clone.
if command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || [ -n "${CI:-}" ]; then
  log "Kubernetes binaries"
  JOULESCHED_K8S_BIN_DIR=$(hack/build-k8s.sh | tail -n 1)
  export JOULESCHED_K8S_BIN_DIR
  log "helm"
  JOULESCHED_HELM="$(hack/build-helm.sh | tail -n 1)/helm"
  export JOULESCHED_HELM
fi

# 4. Lint, types, tests.
log "ruff"
ruff check .
log "mypy (every package; strict on joulesched.policy)"
mypy joulesched
log "pytest"
set +e
python -m pytest --cov=joulesched --cov-report=term:skip-covered "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
[ "$status" -eq 0 ] || exit "$status"

# 5. The e2e tests that depend on the Kubernetes release (the control plane, the scheduler and
#    extender, the shipped manifests and chart, Pod Security, the chain) again on the oldest
#    supported minor (docs/install.md). Its binaries are built when CI is set (a cold build is
#    ~7 min on 2 cores, within CI's budget) or used when already cached; otherwise skipped, said
#    so. JOULESCHED_SECOND_MINOR=off skips it; JOULESCHED_SECOND_MINOR=v1.N.M picks the release.
second=${JOULESCHED_SECOND_MINOR:-v1.35.4}
if [ "$second" != off ] && [ -z "${*}" ] && [ -n "${JOULESCHED_K8S_BIN_DIR:-}" ]; then
  cache="${JOULESCHED_K8S_CACHE:-$HOME/.cache/joulesched/k8s}/$second/bin"
  if [ -x "$cache/kube-scheduler" ] || [ -n "${CI:-}" ]; then
    log "e2e on Kubernetes $second"
    second_bin=$(JOULESCHED_K8S_VERSION=$second hack/build-k8s.sh | tail -n 1)
    JOULESCHED_K8S_VERSION=$second JOULESCHED_K8S_BIN_DIR=$second_bin python -m pytest -p no:cacheprovider \
      tests/e2e/test_control_plane.py tests/e2e/test_extender_e2e.py tests/e2e/test_slice_e2e.py \
      tests/e2e/test_faults_e2e.py tests/e2e/test_deploy_e2e.py tests/e2e/test_chart_e2e.py tests/e2e/test_chain_e2e.py
  else
    log "e2e on Kubernetes $second: skipped (not cached; JOULESCHED_K8S_VERSION=$second hack/build-k8s.sh builds it)"
  fi
fi
