"""Server-side dry-runs of rendered manifests (kustomize or helm) against the real kube-apiserver."""

from __future__ import annotations

import re
from typing import Any

import yaml

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


WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")


def pods_of(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One Pod per workload object: its pod template, in its namespace (what the controller would create).

    Pod Security admission enforces on Pods only (on workloads it merely warns), so this is what
    the apiserver's ``enforce`` label is proven on."""
    pods = []
    for o in objs:
        if o["kind"] not in WORKLOAD_KINDS:
            continue
        spec = o["spec"]["jobTemplate"]["spec"] if o["kind"] == "CronJob" else o["spec"]
        tmpl = spec["template"]
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{o['metadata']['name']}-psa", "namespace": o["metadata"]["namespace"],
                         "labels": tmpl["metadata"].get("labels", {})},
            "spec": tmpl["spec"],
        })
    return pods


def pod_security_dry_run(cp: Any, kubectl_cache: str, pod: dict[str, Any]) -> Any:
    """``kubectl create --dry-run=server`` of one Pod: admission (Pod Security included) runs, nothing is written."""
    return cp.kubectl(kubectl_cache, "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)


POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def wait_until_the_deferrer_policy_is_enforced(cp: Any, api: Any) -> None:
    """Until the apiserver enforces deploy/deferrer's admission policy on ``api`` (the deferrer's
    ServiceAccount): a dry run of a change the policy denies, on a probe pod, is refused by it
    (a new policy is loaded within a second or so). The probe is deleted after."""
    import json
    import uuid

    from kubernetes.client.exceptions import ApiException
    from processes import _wait_until

    probe = f"policy-probe-{uuid.uuid4().hex[:6]}"
    cp.create_pod(probe, "default", cpu="10m", memory="8Mi")

    def enforced() -> bool:
        try:  # a dry run: nothing is written even before the policy is enforced
            api.patch_namespaced_pod(probe, "default", [{"op": "add", "path": "/metadata/labels", "value": {"probe": "x"}}],
                                     dry_run="All", _preload_content=False)
        except ApiException as err:
            return err.status == 403 and "ValidatingAdmissionPolicy" in json.loads(err.body).get("message", "")
        return False

    _wait_until(enforced, 30, interval=0.3, what="the apiserver enforces the deferrer's admission policy")
    cp.delete_pod(probe, "default")
