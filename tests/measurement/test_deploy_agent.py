"""deploy/agent: kustomize builds, every object validates offline, least privilege holds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from joulesched.measurement.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "agent"
K8S_VERSION = "1.32.0"

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) is not installed"
)


def build(path: Path) -> list[dict[str, Any]]:
    result = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "DaemonSet")


@pytest.mark.parametrize(
    "variant", ["", "overlays/msr", "overlays/servicemonitor"], ids=["base", "msr overlay", "servicemonitor overlay"]
)
def test_every_object_validates_against_the_kubernetes_schema(variant: str) -> None:
    docs = build(DEPLOY / variant)
    kinds = sorted(d["kind"] for d in docs)
    assert {"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Service", "ServiceAccount"} <= set(kinds)
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a CRD: no schema in kubernetes_validate; check its shape
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            assert doc["spec"]["endpoints"][0]["port"] == "metrics"
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"].get("namespace", "joulesched-agent") == "joulesched-agent" or doc["kind"].startswith("Cluster")


def test_base_daemonset_is_least_privilege() -> None:
    docs = build(DEPLOY)
    spec = daemonset(docs)["spec"]["template"]["spec"]
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    assert spec["securityContext"]["runAsUser"] == 0  # energy_uj is root-only since Linux 5.10
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert (
        sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    )
    assert sc["capabilities"] == {"drop": ["ALL"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert set(host_paths.values()) == {
        "/sys/class/powercap",
        "/sys/devices/virtual/powercap",
        "/sys/fs/cgroup",
        "/proc",
        "/var/lib/joulesched/joulesched-agent",  # server.state_dir: the only one written
    }
    for mount in container["volumeMounts"]:
        if mount["name"] in host_paths:
            assert bool(mount.get("readOnly")) is (mount["name"] != "state"), mount
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["state"] == "/var/lib/joulesched"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node-name=$(NODE_NAME)" in container["args"]


def test_rbac_only_reads_pods() -> None:
    role = next(d for d in build(DEPLOY) if d["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]


def test_msr_overlay_adds_only_sys_rawio_and_dev_cpu() -> None:
    base = daemonset(build(DEPLOY))["spec"]["template"]["spec"]
    msr = daemonset(build(DEPLOY / "overlays" / "msr"))["spec"]["template"]["spec"]
    sc = msr["containers"][0]["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_RAWIO"]}
    assert sc["privileged"] is False
    added = {v["name"]: v for v in msr["volumes"]}.keys() - {v["name"] for v in base["volumes"]}
    assert added == {"dev-cpu"}
    assert "--dev-root=/host/dev" in msr["containers"][0]["args"]


@pytest.mark.parametrize("path", ["base/agent.yaml", "overlays/msr/agent.yaml"])
def test_shipped_agent_configs_are_valid(path: str) -> None:
    config = load_config(str(DEPLOY / path))
    assert config.kubernetes.mode == "in-cluster"


def test_plain_prometheus_scrape_config_keeps_only_agent_pods() -> None:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "scrape-config.yaml").read_text())
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == "joulesched-agent"
    assert {
        "regex": "joulesched-agent",
        "action": "keep",
        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
    } in job["relabel_configs"]


def test_scrapes_honour_the_agents_namespace_and_pod_labels() -> None:
    """The per-pod series carry the workload's namespace and pod: the Operator's target labels
    (the agent pod's own namespace and pod) must not overwrite them (exported_namespace/_pod)."""
    (sm,) = [d for d in build(DEPLOY / "overlays" / "servicemonitor") if d["kind"] == "ServiceMonitor"]
    assert [e.get("honorLabels") for e in sm["spec"]["endpoints"]] == [True]
    (job,) = yaml.safe_load((DEPLOY / "prometheus" / "scrape-config.yaml").read_text())["scrape_configs"]
    assert job["honor_labels"] is True
