"""Every manifest in deploy/ against the Kubernetes schemas, offline (kubernetes-validate).

Kustomize rendering and the server-side dry run (``kubectl apply --dry-run=server``) are
proved against the real kube-apiserver in tests/e2e; the KubeSchedulerConfiguration is
loaded by the real kube-scheduler there too.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSION = "1.37.0"  # the release tests/e2e runs (hack/build-k8s.sh)
# Kinds that are not core API objects: validated elsewhere (see module docstring) or CRDs.
NOT_CORE_API = {
    "Kustomization": "kustomize build input",
    "Component": "kustomize build input",
    "KubeSchedulerConfiguration": "loaded by the real kube-scheduler in tests/e2e",
    "ServiceMonitor": "prometheus-operator CRD",
    "PodMonitor": "prometheus-operator CRD",
    "PrometheusRule": "prometheus-operator CRD",
}


def patch_files() -> set[Path]:
    """Files that kustomizations apply as patches: partial objects, validated once rendered (tests/e2e)."""
    patches: set[Path] = set()
    for kustomization in DEPLOY.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text()) or {}
        for entry in spec.get("patches", []) + spec.get("patchesStrategicMerge", []):
            path = entry.get("path") if isinstance(entry, dict) else entry
            if path:
                patches.add((kustomization.parent / path).resolve())
    return patches


def manifest_documents() -> list[tuple[str, dict]]:
    docs = []
    patches = patch_files()
    for path in sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml")):
        if path.resolve() in patches:
            continue
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc and doc["kind"] not in NOT_CORE_API:
                docs.append((f"{path.relative_to(DEPLOY)}#{i}", doc))
    return docs


DOCS = manifest_documents()


def test_deploy_has_the_expected_objects() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in DOCS}
    for expected in [
        ("Deployment", "joulesched-extender"),
        ("Service", "joulesched-extender"),
        ("ServiceAccount", "joulesched-extender"),
        ("ClusterRole", "joulesched-extender"),
        ("Deployment", "joulesched-scheduler"),
        ("Namespace", "joulesched"),
    ]:
        assert expected in kinds


@pytest.mark.parametrize(("where", "doc"), DOCS, ids=[w for w, _ in DOCS])
def test_manifest_is_valid_against_the_kubernetes_schema(where: str, doc: dict) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_extender_runs_locked_down() -> None:
    deployment = next(doc for _, doc in DOCS if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "joulesched-extender")
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert "schedulerName" not in spec  # never placed by the scheduler that depends on it
    assert spec["securityContext"]["runAsNonRoot"] is True
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"readinessProbe", "livenessProbe", "resources"} <= set(container)


def test_scheduler_config_wires_the_extender_as_documented() -> None:
    config = yaml.safe_load((DEPLOY / "scheduler" / "scheduler-config.yaml").read_text())
    (extender,) = config["extenders"]
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is True
    assert extender["urlPrefix"].endswith("/scheduler")
    assert 1 <= extender["weight"] <= 10
    timeout = extender["httpTimeout"]
    assert timeout.endswith("s") and float(timeout.rstrip("ms")) < 5
    assert [p["schedulerName"] for p in config["profiles"]] == ["joulesched"]


def test_extender_config_in_deploy_is_valid() -> None:
    from joulesched.extender.config import parse_config

    doc = yaml.safe_load((DEPLOY / "extender" / "config.yaml").read_text())
    config = parse_config(doc, "deploy/extender/config.yaml")
    assert config.source == "prometheus" and config.watch_pods


def test_extender_rbac_reads_pods_and_binds_them_only() -> None:
    role = next(doc for _, doc in DOCS if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == "joulesched-extender")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    ]


def test_the_scheduler_binds_through_the_extender_exactly_when_the_extender_serves_bind() -> None:
    from joulesched.extender.config import parse_config

    config = parse_config(yaml.safe_load((DEPLOY / "extender" / "config.yaml").read_text()), "deploy/extender/config.yaml")
    (entry,) = yaml.safe_load((DEPLOY / "scheduler" / "scheduler-config.yaml").read_text())["extenders"]
    assert config.bind_enabled and entry["bindVerb"] == "bind" and entry["ignorable"] is True
    # one ledger per replica: all of the scheduler's connections go to one replica
    service = next(doc for _, doc in DOCS if doc["kind"] == "Service" and doc["metadata"]["name"] == "joulesched-extender")
    assert service["spec"]["sessionAffinity"] == "ClientIP"


def test_expander_is_optional_and_its_rbac_is_least() -> None:
    # deploy/expander is applied on its own (docs/autoscaler.md), never by `kubectl apply -k deploy/`
    assert "expander" not in (yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    by_key = {(doc["kind"], doc["metadata"]["name"]): doc for where, doc in DOCS if where.startswith("expander/")}
    role = by_key[("Role", "joulesched-expander")]
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cluster-autoscaler-priority-expander"],
         "verbs": ["get", "patch"]},
    ]  # no create (it cannot be name-restricted): deploy/expander/configmap.yaml ships the ConfigMap
    assert by_key[("ClusterRole", "joulesched-expander")]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
    ]
    binding = by_key[("RoleBinding", "joulesched-expander")]
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "joulesched-expander", "namespace": "joulesched"}]
    container = by_key[("Deployment", "joulesched-expander")]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "expander" and "--apply" in container["args"] and "--watch=300" in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    from joulesched.extender.expander import parse_args

    args = parse_args(container["args"][1:])  # the command accepts what the Deployment passes
    assert (args.apply, args.watch, args.namespace, args.output) == (True, 300.0, "kube-system", None)
    assert args.prometheus and not args.group_from_name  # groups from the nodes' labels
