"""What the deferrer's and the expander's ServiceAccounts can write, against the real kube-apiserver.

RBAC cannot narrow a ``patch`` to one field, nor a ``create`` to one name. So:

- deploy/deferrer ships a ValidatingAdmissionPolicy (admission-policy.yaml): with its RBAC and
  that policy applied for real, the deferrer's ServiceAccount (its token) removes its gate
  ``joulesched.io/deferred`` with the deferrer's own code path, and every other change to a pod
  (an image, a label, another controller's gate, the gate together with anything else, a
  kube-system pod under server dry-run) is denied with the policy's message;
- deploy/expander ships the priority-expander ConfigMap and grants only get and patch on it:
  its ServiceAccount reads and patches that ConfigMap, and can neither create another ConfigMap in
  kube-system nor patch one; without the ConfigMap, the expander says how to create it (exit 1)
  or, under ``--watch``, keeps retrying and writes it once it exists. The chart's ConfigMap keeps
  the ranking in the cluster on an upgrade (its ``lookup``, rendered by helm against this
  apiserver).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from binaries import REPO_ROOT
from cluster import ControlPlane
from dryrun import POLICY_KINDS, wait_until_the_deferrer_policy_is_enforced
from processes import ClusterError, _wait_until

DEPLOY = REPO_ROOT / "deploy"
CHART = REPO_ROOT / "charts" / "joulesched"
NAMESPACE = "joulesched"
DEFERRER = "joulesched-deferrer"
EXPANDER = "joulesched-expander"
GATE = "joulesched.io/deferred"
OTHER_GATE = "example.com/hold"
CM = "cluster-autoscaler-priority-expander"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
DENIED = f"ValidatingAdmissionPolicy '{DEFERRER}' with binding '{DEFERRER}' denied request: " \
         f"joulesched-deferrer may only remove the scheduling gate {GATE} from a pod"


def kustomize(cp: ControlPlane, kdir: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(cp.kubectl("kustomize", str(DEPLOY / kdir)).stdout) if d]


def sa_core(cp: ControlPlane, namespace: str, name: str) -> Any:
    """CoreV1Api authenticated with a token of ServiceAccount ``namespace/name``."""
    from kubernetes import client
    from kubernetes import config as kconfig

    return client.CoreV1Api(kconfig.new_client_from_config(
        config_file=str(cp.service_account_kubeconfig(namespace, name))))


def refused(call: Any) -> tuple[int, str]:
    """The status and message of an API call that must fail."""
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        call()
    return err.value.status, str(json.loads(err.value.body).get("message", err.value.body))


# --------------------------------------------------------------------------
# the deferrer
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def deferrer_api(control_plane: ControlPlane):
    """deploy/deferrer's RBAC and admission policy applied for real; the ServiceAccount's client,
    once the apiserver enforces the policy (it loads a new one within a second or so). The policy
    is deleted after the module (the cluster is session-wide)."""
    cp = control_plane
    cp.create_namespace(NAMESPACE)
    objs = [o for o in kustomize(cp, "deferrer") if o["kind"] in RBAC_KINDS | POLICY_KINDS]
    assert {o["kind"] for o in objs} == RBAC_KINDS | POLICY_KINDS
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs))
    api = sa_core(cp, NAMESPACE, DEFERRER)
    wait_until_the_deferrer_policy_is_enforced(cp, api)
    yield api
    cp.kubectl("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(
        [o for o in objs if o["kind"] in POLICY_KINDS]))


def gated(cp: ControlPlane, name: str, ns: str, gates: list[str], labels: dict[str, str] | None = None) -> None:
    cp.create_pod(name, ns, cpu="100m", memory="64Mi", labels=labels,
                  spec_overrides={"schedulingGates": [{"name": g} for g in gates]})


def pod_of(cp: ControlPlane, name: str, ns: str) -> tuple[list[str], str, dict[str, str]]:
    pod = cp.core.read_namespaced_pod(name, ns)
    return [g.name for g in pod.spec.scheduling_gates or []], pod.spec.containers[0].image, pod.metadata.labels or {}


def test_the_deferrer_removes_its_gate_through_the_policy(control_plane, deferrer_api, e2e_namespace):
    """Its own code path (KubePods.patch_pod with release_patch, as its ServiceAccount) passes."""
    from kubernetes import client

    from joulesched.extender.deferrer import KubePods, release_patch

    cp, ns = control_plane, e2e_namespace
    gated(cp, "one", ns, [GATE])
    gated(cp, "two", ns, [OTHER_GATE, GATE])
    pods = KubePods(deferrer_api.api_client, "e2e")
    assert pods.patch_pod(ns, "one", release_patch([{"name": GATE}]))
    assert pods.patch_pod(ns, "two", release_patch([{"name": OTHER_GATE}, {"name": GATE}]))
    assert pod_of(cp, "one", ns)[0] == [] and pod_of(cp, "two", ns)[0] == [OTHER_GATE]
    # the policy let it through: it is bound and enforcing (the same account, any other change)
    status, message = refused(lambda: client.CoreV1Api(deferrer_api.api_client).patch_namespaced_pod(
        "two", ns, [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]))
    assert status == 403 and DENIED in message, message


@pytest.mark.parametrize("what,ops,changed", [
    ("an image", [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil.example/x:1"}],
     "spec.containers"),
    ("a label", [{"op": "add", "path": "/metadata/labels/evil", "value": "yes"}], "metadata.labels"),
    ("an annotation", [{"op": "add", "path": "/metadata/annotations", "value": {"evil": "yes"}}], "metadata.annotations"),
    ("a toleration", [{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}], "spec.tolerations"),
    ("a finalizer", [{"op": "add", "path": "/metadata/finalizers", "value": ["evil.example/keep"]}], "metadata.finalizers"),
    ("its gate and an image at once", [
        {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": OTHER_GATE}]},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "evil.example/x:1"}], "spec.containers"),
])
def test_the_deferrer_may_change_nothing_else(control_plane, deferrer_api, e2e_namespace, what, ops, changed):
    cp, ns = control_plane, e2e_namespace
    gated(cp, "p", ns, [GATE, OTHER_GATE], labels={"app": "x"})
    before = pod_of(cp, "p", ns)
    status, message = refused(lambda: deferrer_api.patch_namespaced_pod("p", ns, ops))
    assert status == 403 and DENIED in message and f"(changed: {changed})" in message, (what, message)
    assert pod_of(cp, "p", ns) == before, what
    # a merge patch is the same request to the policy
    status, message = refused(lambda: deferrer_api.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"app": "y"}}}))
    assert status == 403 and "(changed: metadata.labels)" in message, message


def test_the_deferrer_may_not_touch_other_gates(control_plane, deferrer_api, e2e_namespace):
    cp, ns = control_plane, e2e_namespace
    gated(cp, "other", ns, [OTHER_GATE])
    gated(cp, "both", ns, [GATE, OTHER_GATE])
    # removing another controller's gate: the apiserver allows removals, the policy does not
    for name, ops in (("other", [{"op": "remove", "path": "/spec/schedulingGates"}]),
                      ("both", [{"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]),
                      ("both", [{"op": "remove", "path": "/spec/schedulingGates"}])):
        status, message = refused(lambda name=name, ops=ops: deferrer_api.patch_namespaced_pod(name, ns, ops))
        assert status == 403 and DENIED in message and "the other scheduling gates stay as they are" in message, message
    assert pod_of(cp, "other", ns)[0] == [OTHER_GATE] and pod_of(cp, "both", ns)[0] == [GATE, OTHER_GATE]
    # adding a gate: denied too (the apiserver's own validation answers first: only removals)
    status, message = refused(lambda: deferrer_api.patch_namespaced_pod(
        "other", ns, [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}]))
    assert status in (403, 422) and ("only deletion is allowed" in message or DENIED in message), message
    assert pod_of(cp, "other", ns)[0] == [OTHER_GATE]


def test_a_kube_system_pod_is_out_of_its_reach(control_plane, deferrer_api):
    """The review's reproduction: a server dry-run JSON patch of a kube-system pod's image."""
    cp = control_plane
    cp.ensure_service_account("kube-system")
    name = f"coredns-{uuid.uuid4().hex[:6]}"
    cp.create_pod(name, "kube-system", cpu="10m", memory="8Mi")
    try:
        status, message = refused(lambda: deferrer_api.patch_namespaced_pod(
            name, "kube-system", [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil.example/x:1"}],
            dry_run="All"))
        assert status == 403 and DENIED in message, message
        # others are not held by the policy: the admin changes a label
        cp.core.patch_namespaced_pod(name, "kube-system", {"metadata": {"labels": {"checked": "yes"}}})
        assert pod_of(cp, name, "kube-system")[2]["checked"] == "yes"
    finally:
        cp.delete_pod(name, "kube-system")


# --------------------------------------------------------------------------
# the expander
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def expander_rbac(control_plane: ControlPlane) -> list[dict[str, Any]]:
    cp = control_plane
    cp.kubectl("apply", "-f", str(DEPLOY / "namespace.yaml"))
    objs = kustomize(cp, "expander")
    rbac = [o for o in objs if o["kind"] in RBAC_KINDS]
    assert {o["kind"] for o in rbac} == RBAC_KINDS
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    return objs


@pytest.fixture
def shipped_configmap(control_plane: ControlPlane, expander_rbac: list[dict[str, Any]]):
    """deploy/expander's ConfigMap, applied afresh (the placeholder); deleted after the test."""
    cp = control_plane
    (cm,) = [o for o in expander_rbac if o["kind"] == "ConfigMap"]
    assert (cm["metadata"]["namespace"], cm["metadata"]["name"]) == ("kube-system", CM)
    cp.kubectl("delete", "configmap", CM, "-n", "kube-system", "--ignore-not-found")
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(cm))
    yield cm
    cp.kubectl("delete", "configmap", CM, "-n", "kube-system", "--ignore-not-found")


@pytest.fixture
def no_configmap(control_plane: ControlPlane, expander_rbac: list[dict[str, Any]]):
    control_plane.kubectl("delete", "configmap", CM, "-n", "kube-system", "--ignore-not-found")
    yield
    control_plane.kubectl("delete", "configmap", CM, "-n", "kube-system", "--ignore-not-found")


def test_the_expander_patches_the_shipped_configmap_and_creates_none(control_plane, shipped_configmap):
    cp = control_plane
    api = sa_core(cp, NAMESPACE, EXPANDER)
    cm = api.read_namespaced_config_map(CM, "kube-system")
    assert yaml.safe_load(cm.data["priorities"]) == {1: [".*"]}  # the placeholder: no preference
    api.patch_namespaced_config_map(CM, "kube-system", {"data": {"priorities": "10:\n- ^a$\n1:\n- .*\n"}})
    assert yaml.safe_load(cp.core.read_namespaced_config_map(CM, "kube-system").data["priorities"]) == {
        10: ["^a$"], 1: [".*"]}
    # the review's reproduction: kube-system/coredns-custom (CoreDNS imports it on AKS)
    other = {"metadata": {"name": "coredns-custom", "namespace": "kube-system"}, "data": {"x.override": "x"}}
    for dry_run in ("All", None):
        status, message = refused(lambda dry_run=dry_run: api.create_namespaced_config_map(
            "kube-system", other, dry_run=dry_run))
        assert status == 403 and "cannot create resource \"configmaps\"" in message, message
    # nor any other ConfigMap there, by patch or get
    cp.kubectl("create", "configmap", "coredns-custom", "-n", "kube-system", "--from-literal=x=1")
    try:
        status, _ = refused(lambda: api.patch_namespaced_config_map("coredns-custom", "kube-system", {"data": {"x": "2"}}))
        assert status == 403
        status, _ = refused(lambda: api.read_namespaced_config_map("coredns-custom", "kube-system"))
        assert status == 403
    finally:
        cp.kubectl("delete", "configmap", "coredns-custom", "-n", "kube-system")
    # and not the shipped one with create either (it exists: the answer is still Forbidden, not 409)
    status, _ = refused(lambda: api.create_namespaced_config_map("kube-system", {"metadata": {"name": CM}}))
    assert status == 403


def expander_cmd(*args: str, kubeconfig: Path) -> list[str]:
    return [sys.executable, "-m", "joulesched.cli", "expander", *args, "--kubeconfig", str(kubeconfig)]


def test_without_the_configmap_the_expander_says_how_to_create_it_and_waits(
        control_plane, expander_rbac, no_configmap, node_factory, tmp_path):
    cp, tag = control_plane, uuid.uuid4().hex[:6]
    node_factory(f"lp-{tag}-1", labels={"joulesched.io/node-group": f"lp-{tag}"})
    profiles = tmp_path / "profiles.yaml"
    curve = [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]
    profiles.write_text(yaml.safe_dump({"nodes": [{"name": f"lp-{tag}-1", "cores": 64, "power_curve_watts": curve}]}))
    kc = cp.service_account_kubeconfig(NAMESPACE, EXPANDER)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    how = f"configmap kube-system/{CM} not found"

    r = subprocess.run(expander_cmd("--profiles", str(profiles), "--apply", kubeconfig=kc),
                       capture_output=True, text=True, timeout=60, env=env, cwd=REPO_ROOT)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert how in r.stderr and "kubectl apply -k deploy/expander/" in r.stderr, r.stderr
    assert "Forbidden" not in r.stderr, r.stderr  # it never tried to create it
    assert CM not in cp.kubectl("get", "configmaps", "-n", "kube-system", "-o", "name").stdout

    log_path = tmp_path / "watch.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(expander_cmd("--profiles", str(profiles), "--apply", "--watch", "0.5", kubeconfig=kc),
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        try:
            try:
                _wait_until(lambda: log_path.read_text().count(how) >= 3, 30, what="three rounds without the ConfigMap")
            except ClusterError as err:  # say what it did instead
                raise AssertionError(f"{err}; its log:\n{log_path.read_text()[-3000:]}") from None
            assert proc.poll() is None, log_path.read_text()  # still running: it retries
            (cm,) = [o for o in expander_rbac if o["kind"] == "ConfigMap"]
            cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(cm))  # the operator follows the advice

            def ranked() -> bool:
                text = cp.core.read_namespaced_config_map(CM, "kube-system").data["priorities"]
                return yaml.safe_load(text) == {10: [f"^lp-{tag}$"], 1: [".*"]}

            try:
                _wait_until(ranked, 30, interval=0.2, what="the expander writes the ranking")
            except ClusterError as err:
                raise AssertionError(f"{err}; its log:\n{log_path.read_text()[-3000:]}") from None
            assert proc.poll() is None, log_path.read_text()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    text = log_path.read_text()
    assert f"configmap kube-system/{CM} updated" in text, text
    assert "Traceback" not in text, text


def test_the_chart_keeps_the_ranking_in_the_cluster_on_upgrade(control_plane, no_configmap, tmp_path):
    """The chart renders the placeholder only where the ConfigMap does not exist yet: helm's
    ``lookup``, evaluated here against the apiserver (``helm template --dry-run=server``)."""
    cp = control_plane
    helm = os.environ.get("JOULESCHED_HELM") or ""
    if not helm:  # as test_chart_e2e.py finds it
        r = subprocess.run([str(REPO_ROOT / "hack" / "build-helm.sh")], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"hack/build-helm.sh failed:\n{r.stderr}", pytrace=False)
        helm = str(Path(r.stdout.strip().splitlines()[-1]) / "helm")

    def rendered() -> dict[str, Any]:
        r = subprocess.run([helm, "template", "joulesched", str(CHART), "-n", NAMESPACE, "--dry-run=server",
                            "--kubeconfig", str(cp.kubeconfig), "--set", "expander.enabled=true",
                            "--show-only", "templates/expander.yaml"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        (cm,) = [d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "ConfigMap"]
        assert (cm["metadata"]["namespace"], cm["metadata"]["name"]) == ("kube-system", CM)
        return cm

    assert rendered()["data"] == {"priorities": "1:\n- .*\n"}  # install: the placeholder
    ranking = "20:\n- ^fast$\n10:\n- ^slow$\n1:\n- .*\n"
    cp.kubectl("create", "configmap", CM, "-n", "kube-system", f"--from-literal=priorities={ranking}")
    assert rendered()["data"] == {"priorities": ranking}  # upgrade: what the expander wrote stays
    # and the rendered object applies as it is
    cp.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(rendered()))
