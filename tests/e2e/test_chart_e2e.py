"""charts/joulesched against the real kube-apiserver v1.37.2.

``helm template`` renders the chart (default values, and everything on: ServiceMonitor,
PrometheusRule, the GPU agent, the expander) for the apiserver's version, and every rendered
object is accepted by ``kubectl apply --dry-run=server`` (strict field validation, admission).
The Prometheus Operator kinds go against the same minimal CRDs as test_deploy_e2e.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from binaries import REPO_ROOT
from cluster import ControlPlane
from dryrun import pod_security_dry_run, pods_of, ref, server_dry_run

CHART = REPO_ROOT / "charts" / "joulesched"
NAMESPACE = "joulesched"
AGENT_NAMESPACE = "joulesched-agent"
EVERYTHING_ON = [
    "--set", "gpu.enabled=true", "--set", "expander.enabled=true",
    "--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
    "--set", "serviceMonitor.labels.release=kube-prometheus-stack",
    "--set", "prometheusRule.labels.release=kube-prometheus-stack",
    "--set", "extender.config.bind.enabled=true", "--set", "extender.serviceMonitor.enabled=true",
]


@pytest.fixture(scope="module")
def helm() -> str:
    env = os.environ.get("JOULESCHED_HELM")
    if env:
        return env
    r = subprocess.run([str(REPO_ROOT / "hack" / "build-helm.sh")], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"hack/build-helm.sh failed:\n{r.stderr}", pytrace=False)
    return str(Path(r.stdout.strip().splitlines()[-1]) / "helm")


@pytest.fixture(scope="module")
def kubectl_cache(tmp_path_factory) -> str:
    return f"--cache-dir={tmp_path_factory.mktemp('kubectl-cache-chart')}"


def server_version(cp: ControlPlane) -> str:
    return yaml.safe_load(cp.kubectl("version", "-o", "yaml").stdout)["serverVersion"]["gitVersion"]


def render(helm: str, cp: ControlPlane, *extra: str) -> tuple[str, list[dict[str, Any]]]:
    r = subprocess.run([helm, "template", "joulesched", str(CHART), "-n", NAMESPACE,
                        "--kube-version", server_version(cp), *extra], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout, [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module")
def chart_namespace(control_plane: ControlPlane, helm: str) -> str:
    """The chart's Namespaces (namespace.create=true, and the agent's), applied for real."""
    text, _ = render(helm, control_plane, "--set", "namespace.create=true",
                     "--show-only", "templates/namespace.yaml")
    control_plane.kubectl("apply", "-f", "-", input=text)
    ns = control_plane.core.read_namespace(NAMESPACE)
    assert ns.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    agent = control_plane.core.read_namespace(AGENT_NAMESPACE)
    assert agent.metadata.labels["pod-security.kubernetes.io/enforce"] == "privileged"
    return NAMESPACE


@pytest.mark.e2e
@pytest.mark.parametrize("values", ["default", "everything-on"])
def test_chart_is_accepted_by_server_dry_run(control_plane, helm, chart_namespace, operator_crds,
                                             kubectl_cache, values):
    cp = control_plane
    text, objs = render(helm, cp, *(EVERYTHING_ON if values == "everything-on" else []))
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "DaemonSet", "ConfigMap", "Service", "PodDisruptionBudget"} <= kinds
    if values == "everything-on":
        assert {"ServiceMonitor", "PrometheusRule"} <= kinds
    printed = server_dry_run(cp, kubectl_cache, text, "the chart")
    assert sorted(printed) == sorted(ref(o) for o in objs), printed
    for o in objs:
        if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"):
            assert o["metadata"].get("namespace") in (NAMESPACE, AGENT_NAMESPACE, "kube-system"), ref(o)
    # nothing was written by the dry run
    for ns in (NAMESPACE, AGENT_NAMESPACE):
        written = [ref(o) for o in objs if o["kind"] in ("Deployment", "DaemonSet", "ConfigMap", "Service")
                   and o["metadata"].get("namespace") == ns]
        got = cp.kubectl(kubectl_cache, "get", "-n", ns, "--ignore-not-found", "-o", "name", *written)
        assert got.stdout.strip() == "", got.stdout
    # Pod Security: every workload's pod is admitted in its namespace, the agent's alone in the
    # privileged one (the negative controls are in test_deploy_e2e.py).
    sas = [o for o in objs if o["kind"] == "ServiceAccount"]
    # the RuntimeClass the NVIDIA GPU operator installs, which the GPU agent's pods name
    runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}
    cp.kubectl(kubectl_cache, "apply", "-f", "-", input=yaml.safe_dump_all([*sas, runtime_class]))
    pods = pods_of(objs)
    assert len(pods) == (6 if values == "everything-on" else 4), [p["metadata"]["name"] for p in pods]
    for pod in pods:
        r = pod_security_dry_run(cp, kubectl_cache, pod)
        assert r.returncode == 0 and "PodSecurity" not in r.stderr, (pod["metadata"]["name"], r.stderr)
        agent = pod["metadata"]["labels"]["app.kubernetes.io/name"] == "joulesched-agent"
        assert pod["metadata"]["namespace"] == (AGENT_NAMESPACE if agent else NAMESPACE), pod["metadata"]


@pytest.mark.e2e
def test_scheduler_image_is_the_apiservers_version(control_plane, helm):
    _, objs = render(helm, control_plane)
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "joulesched-scheduler")
    version = server_version(control_plane)
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == f"registry.k8s.io/kube-scheduler:{version}"
