"""The deferrer's admission policy and the expander's shipped ConfigMap stay consistent with the
names and namespaces they depend on, in deploy/ and in the chart (offline: kustomize and helm
render; tests/e2e/test_least_privilege_e2e.py runs them against the real kube-apiserver)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.deploy.test_chart import DEPLOY, by_key, helm_binary, helm_template, kubectl_binary, run

POLICY = ("ValidatingAdmissionPolicy", "", "joulesched-deferrer")
BINDING = ("ValidatingAdmissionPolicyBinding", "", "joulesched-deferrer")
CM = "cluster-autoscaler-priority-expander"


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


def kustomize(kdir: str) -> list[dict[str, Any]]:
    r = run(kubectl_binary(), "kustomize", str(DEPLOY / kdir))
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def username(policy: dict[str, Any]) -> str:
    (cond,) = policy["spec"]["matchConditions"]
    prefix = "request.userInfo.username == '"
    assert cond["expression"].startswith(prefix) and cond["expression"].endswith("'"), cond
    return cond["expression"][len(prefix):-1]


def test_the_policy_names_the_deferrers_service_account_in_deploy() -> None:
    objs = kustomize("deferrer")
    (sa,) = [o for o in objs if o["kind"] == "ServiceAccount"]
    (policy,) = [o for o in objs if o["kind"] == POLICY[0]]
    (binding,) = [o for o in objs if o["kind"] == BINDING[0]]
    (crb,) = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    assert username(policy) == user
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                "namespace": sa["metadata"]["namespace"]}]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}]
    # the pods patch it narrows is still the only pod write RBAC grants it
    (role,) = [o for o in objs if o["kind"] == "ClusterRole"]
    assert [r["verbs"] for r in role["rules"] if r["resources"] == ["pods"]] == [["list", "watch", "patch"]]


@pytest.mark.parametrize("namespace", ["joulesched", "energy"])
def test_the_chart_policy_follows_the_release_namespace(helm, namespace) -> None:
    r = run(helm, "template", "joulesched", str(DEPLOY.parent / "charts" / "joulesched"), "-n", namespace)
    assert r.returncode == 0, r.stderr
    objs = by_key([d for d in yaml.safe_load_all(r.stdout) if d])
    assert username(objs[POLICY]) == f"system:serviceaccount:{namespace}:joulesched-deferrer"
    assert ("ServiceAccount", namespace, "joulesched-deferrer") in objs
    assert objs[BINDING]["spec"]["policyName"] == "joulesched-deferrer"
    # the deferrer off: neither its RBAC nor its policy
    off = by_key(helm_template(helm, "--set", "deferrer.enabled=false"))
    assert POLICY not in off and BINDING not in off and ("ClusterRole", "", "joulesched-deferrer") not in off


def test_the_expander_patches_the_configmap_it_ships_and_creates_none() -> None:
    objs = kustomize("expander")
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    (role,) = [o for o in objs if o["kind"] == "Role"]
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    assert cm["metadata"]["name"] == CM and cm["data"] == {"priorities": "1:\n- .*\n"}
    assert cm["metadata"]["namespace"] == role["metadata"]["namespace"] == "kube-system"
    assert f"--namespace={cm['metadata']['namespace']}" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CM],
                              "verbs": ["get", "patch"]}]
    assert not [r for r in role["rules"] if "create" in r["verbs"]]


@pytest.mark.parametrize("autoscaler_ns", ["kube-system", "autoscaling"])
def test_the_chart_ships_the_configmap_beside_the_role(helm, autoscaler_ns) -> None:
    objs = by_key(helm_template(helm, "--set", "expander.enabled=true",
                                "--set", f"expander.autoscalerNamespace={autoscaler_ns}"))
    cm = objs[("ConfigMap", autoscaler_ns, CM)]
    assert cm["data"] == {"priorities": "1:\n- .*\n"}  # helm template: no cluster, the placeholder
    # kept on uninstall: cluster-autoscaler --expander=priority cannot rank without it (docs/autoscaler.md)
    assert cm["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    role = objs[("Role", autoscaler_ns, "joulesched-expander")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CM],
                              "verbs": ["get", "patch"]}]
    args = objs[("Deployment", "joulesched", "joulesched-expander")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={autoscaler_ns}" in args
    assert not [k for k in objs if k[0] == "ConfigMap" and k[2] == CM and k[1] != autoscaler_ns]
    # off by default: no ConfigMap in the autoscaler's namespace either
    assert not [k for k in by_key(helm_template(helm)) if k[2] == CM]
