"""charts/joulesched against the real kube-apiserver v1.37.2.

``helm template`` renders the chart (default values, and everything on: ServiceMonitor,
PrometheusRule, the GPU agent, the expander) for the apiserver's version, and every rendered
object is accepted by ``kubectl apply --dry-run=server`` (strict field validation, admission).
The Prometheus Operator kinds go against the same minimal CRDs as test_deploy_e2e.py.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from binaries import REPO_ROOT
from cluster import ControlPlane
from dryrun import pod_security_dry_run, pods_of, ref, server_dry_run
from e2e_extender import EFFICIENT_CURVE, INEFFICIENT_CURVE, node_profile
from processes import _wait_until

CHART = REPO_ROOT / "charts" / "joulesched"
NAMESPACE = "joulesched"
AGENT_NAMESPACE = "joulesched-agent"
EVERYTHING_ON = [
    "--set", "gpu.enabled=true", "--set", "expander.enabled=true",
    "--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
    "--set", "serviceMonitor.labels.release=kube-prometheus-stack",
    "--set", "prometheusRule.labels.release=kube-prometheus-stack",
    "--set", "extender.config.bind.enabled=true", "--set", "extender.serviceMonitor.enabled=true",
    "--set", "extender.tls.enabled=true",
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
        if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
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


def folded(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its keys in lower case."""
    return {key.lower(): value for key, value in doc.items()}


@pytest.mark.e2e
def two_node_types(cp: ControlPlane, node_factory: Any, name: str,
                   ext_cfg: dict[str, Any]) -> tuple[dict[str, str], str, dict[str, Any]]:
    """An efficient and an inefficient Node labelled ``e2e-test: name``, their profile document,
    and the chart's extender config made to run here (the profiles given, the API's kubeconfig
    for the pod watch: the chart's runs in-cluster): the label, the efficient node, the profiles."""
    sel = {"e2e-test": name}
    eff, ineff = f"{name}-eff", f"{name}-ineff"
    node_factory(eff, cpu="64", memory="128Gi", labels=sel)
    node_factory(ineff, cpu="80", memory="512Gi", labels=sel)
    profiles = {"sites": {"dc": {"pue": 1.2, "carbon_intensity": 300}},
                "nodes": [node_profile(eff, EFFICIENT_CURVE, 64, site="dc"), node_profile(ineff, INEFFICIENT_CURVE, 80, site="dc")]}
    ext_cfg.pop("profiles")
    ext_cfg.pop("listen")
    ext_cfg["kubeconfig"] = str(cp.kubeconfig)
    return sel, eff, profiles


def test_bind_write_off_with_the_api_rate_raised_runs_in_real_kube_scheduler(
        control_plane, helm, node_factory, scheduler_factory, extender_factory, e2e_namespace):
    # The chart with extender.config.bind.write=false and scheduler.clientConnection raised: the
    # rendered scheduler config in the real kube-scheduler, which takes the rate, asks the
    # extender's bind verb for every pod (the extender records it and answers that kube-scheduler
    # binds it) and writes each binding itself.
    cp, ns, tag = control_plane, e2e_namespace, uuid.uuid4().hex[:6]
    _, objs = render(helm, cp, "--set", "extender.config.bind.write=false", "--set", "scheduler.clientConnection.qps=500",
                     "--set", "scheduler.clientConnection.burst=1000")
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    sched_cfg = yaml.safe_load(configmaps["joulesched-scheduler-config"]["data"]["scheduler-config.yaml"])
    ext_cfg = yaml.safe_load(configmaps["joulesched-extender"]["data"]["config.yaml"])
    assert sched_cfg["clientConnection"] == {"qps": 500, "burst": 1000} and ext_cfg["bind"] == {"enabled": True, "write": False}
    sel, eff, profiles = two_node_types(cp, node_factory, f"chart-{tag}", ext_cfg)
    ext = extender_factory(profiles, ext_cfg)
    sched_cfg["extenders"][0]["urlPrefix"] = ext.url
    sched_cfg.pop("leaderElection")
    sched = scheduler_factory(sched_cfg, name=f"chart-record-{tag}", extra_args=["--authorization-always-allow-paths=/healthz,/readyz,/configz"])
    (name,) = sched.scheduler_names
    pods = [f"rec-{i}-{tag}" for i in range(3)]
    for pod in pods:
        cp.create_pod(pod, ns, scheduler_name=name, cpu="8", memory="1Gi", node_selector=sel)
    assert {cp.wait_for_pod_scheduled(pod, ns, timeout=45) for pod in pods} == {eff}
    _wait_until(lambda: ext.requests("bind", "200") >= len(pods), timeout=10, what="the bind replies counted")
    # The real binary took the rate (its running configuration, /configz) ...
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its self-signed serving certificate
    with urllib.request.urlopen(f"https://127.0.0.1:{sched.port}/configz", context=ctx, timeout=5) as r:
        running = json.load(r)["componentconfig"]
    # v1.37 serves the versioned form (clientConnection.qps), v1.35 the internal one (ClientConnection.QPS)
    client = folded(running)["clientconnection"]
    assert (folded(client)["qps"], folded(client)["burst"]) == (500, 1000), client
    # ... and bound each pod itself after the extender's answer.
    log = sched.log_text()
    assert log.count("kube-scheduler binds it (bind.write: false)") == len(pods), log[-3000:]
    assert ext.failures() == 0, ext.samples()


def test_the_charts_mutual_tls_runs_in_real_kube_scheduler(
        control_plane, helm, node_factory, scheduler_factory, extender_factory, e2e_namespace):
    # extender.tls.enabled: the rendered extender config (server.tls from the mounted Secret) and
    # scheduler entry (enableHTTPS, tlsConfig) with the Secrets' files put where the pods mount
    # them; the real kube-scheduler is answered over mutual TLS, and a client without the
    # certificate is refused.
    cp, ns, tag = control_plane, e2e_namespace, uuid.uuid4().hex[:6]
    _, objs = render(helm, cp, "--set", "extender.tls.enabled=true", "--set", "extender.serviceMonitor.enabled=true")
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    sched_cfg = yaml.safe_load(configmaps["joulesched-scheduler-config"]["data"]["scheduler-config.yaml"])
    ext_cfg = yaml.safe_load(configmaps["joulesched-extender"]["data"]["config.yaml"])
    entry = sched_cfg["extenders"][0]
    assert entry["urlPrefix"] == f"https://joulesched-extender.{NAMESPACE}.svc:8888/scheduler" and entry["enableHTTPS"] is True
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    mounted = {}  # the Secret each file of the two configs comes from, as the pods mount them
    for name, container in (("joulesched-extender", "extender"), ("joulesched-scheduler", "kube-scheduler")):
        spec = deployments[name]["spec"]["template"]["spec"]
        secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
        (c,) = [c for c in spec["containers"] if c["name"] == container]
        for m in c["volumeMounts"]:
            if m["name"] in secrets:
                mounted[m["mountPath"]] = secrets[m["name"]]
    pki = cp.pki
    server_crt, server_key = pki.sign(f"chart-extender-{tag}", "/CN=joulesched-extender", server=True,
                                      sans=["IP:127.0.0.1", f"DNS:joulesched-extender.{NAMESPACE}.svc"])
    client_crt, client_key = pki.client(f"chart-scheduler-{tag}", "joulesched-scheduler")
    files = {"joulesched-extender-tls": {"tls.crt": server_crt, "tls.key": server_key, "ca.crt": pki.ca_crt},
             "joulesched-scheduler-client-tls": {"tls.crt": client_crt, "tls.key": client_key, "ca.crt": pki.ca_crt}}

    def local(path: str) -> str:  # a mounted Secret's file, as this test has it
        directory, _, key = path.rpartition("/")
        return str(files[mounted[directory]][key])

    tls = ext_cfg["server"]["tls"]
    assert {k: mounted[v.rpartition("/")[0]] for k, v in tls.items()} == dict.fromkeys(
        ("cert_file", "key_file", "client_ca_file"), "joulesched-extender-tls")
    ext_cfg["server"]["tls"] = {k: local(v) for k, v in tls.items()}
    assert set(entry["tlsConfig"]) == {"certFile", "keyFile", "caFile"}
    entry["tlsConfig"] = {k: local(v) for k, v in entry["tlsConfig"].items()}
    monitor = next(o for o in objs if o["kind"] == "ServiceMonitor" and o["metadata"]["name"] == "joulesched-extender")
    assert monitor["spec"]["endpoints"][0]["scheme"] == "https"
    sel, eff, profiles = two_node_types(cp, node_factory, f"chart-tls-{tag}", ext_cfg)
    probe = ssl.create_default_context(cafile=str(pki.ca_crt))  # as the kubelet: no client certificate
    ext = extender_factory(profiles, ext_cfg, tls=probe)
    assert ext.url.startswith("https://")
    entry["urlPrefix"] = ext.url
    sched_cfg.pop("leaderElection")
    sched = scheduler_factory(sched_cfg, name=f"chart-tls-{tag}")
    (name,) = sched.scheduler_names
    pods = [f"tls-{i}-{tag}" for i in range(2)]
    for pod in pods:
        cp.create_pod(pod, ns, scheduler_name=name, cpu="8", memory="1Gi", node_selector=sel)
    assert {cp.wait_for_pod_scheduled(pod, ns, timeout=45) for pod in pods} == {eff}
    assert ext.requests("filter", "200") >= len(pods) and ext.failures() == 0, ext.samples()
    # A client without a certificate signed by the CA is refused.
    plain = ssl.create_default_context(cafile=str(pki.ca_crt))
    plain.check_hostname = False
    request = urllib.request.Request(f"{ext.url}/filter", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=plain, timeout=5)
    refused.value.close()
    assert refused.value.code == 403
