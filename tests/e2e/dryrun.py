"""Server-side dry-runs of rendered manifests (kustomize or helm) against the real kube-apiserver."""

from __future__ import annotations

import re
from typing import Any

DRY_RUN_LINE = re.compile(r"^(\S+) (created|configured|unchanged) \(server dry run\)$")


def ref(obj: dict[str, Any]) -> str:
    """``kind[.group]/name`` as kubectl prints it (``deployment.apps/x``, ``configmap/y``)."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"].lower() + (f".{group}" if group else "")
    return f"{kind}/{obj['metadata']['name']}"


def server_dry_run(cp: Any, kubectl_cache: str, text: str, what: str) -> list[str]:
    """``kubectl apply --dry-run=server`` of ``text``: the objects kubectl says it accepted."""
    r = cp.kubectl(kubectl_cache, "apply", "--dry-run=server", "-f", "-", input=text, check=False)
    assert r.returncode == 0, f"{what} rejected by kube-apiserver:\n{r.stderr}\n{r.stdout}"
    printed = []
    for line in r.stdout.splitlines():
        m = DRY_RUN_LINE.match(line.strip())
        assert m, f"unexpected kubectl output line {line!r}\n{r.stdout}\n{r.stderr}"
        printed.append(m.group(1))
    return printed
