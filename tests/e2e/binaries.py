"""The Kubernetes binaries for the e2e tests: hack/build-k8s.sh builds (or finds cached) kube-apiserver,
kube-scheduler and kubectl."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from processes import ClusterError

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-k8s.sh"

def find_go() -> str | None:
    """The go binary: $GO, `go` on PATH, or /usr/local/go/bin/go."""
    cand = os.environ.get("GO")
    if cand and os.access(cand, os.X_OK):
        return cand
    cand = shutil.which("go")
    if cand:
        return cand
    if os.access("/usr/local/go/bin/go", os.X_OK):
        return "/usr/local/go/bin/go"
    return None


def build_k8s(timeout: float = 3600) -> Path:
    """Run hack/build-k8s.sh (cache hit: instant) and return the bin dir.

    Build progress is streamed to our stderr. Raises ClusterError on failure.
    """
    env = dict(os.environ)
    go = find_go()
    if go:
        env["GO"] = go
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE,
                          stderr=None, env=env, timeout=timeout, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        raise ClusterError(f"{BUILD_SCRIPT} printed no bin directory")
    return Path(lines[-1].strip())
