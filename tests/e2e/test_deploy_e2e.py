"""deploy/ against the real kube-apiserver and kube-scheduler v1.37.2.

1. Every kustomization in deploy/ renders with the built kubectl and every object it renders is
   accepted by ``kubectl apply --dry-run=server`` (strict field validation, admission). The
   Prometheus Operator kinds (ServiceMonitor, PrometheusRule) are dry-run against minimal CRDs.
   Every other file in deploy/ is either part of a kustomization or listed, with the reason, as
   not a Kubernetes object.
2. The RBAC that deploy/ grants, applied for real, is what the code needs and no more
   (``kubectl auth can-i --as=system:serviceaccount:joulesched:<sa>``).
3. The shipped KubeSchedulerConfiguration runs in the real kube-scheduler, as the shipped
   ServiceAccount, against the real extender (running as its shipped ServiceAccount): only
   ``clientConnection.kubeconfig`` and the extender's ``urlPrefix`` differ from the file.
"""

from __future__ import annotations

import copy
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from binaries import REPO_ROOT
from cluster import ControlPlane
from dryrun import pod_security_dry_run, pods_of, ref, server_dry_run
from e2e_extender import (
    DEPLOY_EXTENDER_CONFIG,
    DEPLOY_SCHEDULER_CONFIG,
    EFFICIENT_CURVE,
    INEFFICIENT_CURVE,
    deploy_extender_config,
    deploy_scheduler_config,
    node_profile,
)
from processes import ClusterError, _wait_until

from joulesched.extender.config import parse_config

DEPLOY = REPO_ROOT / "deploy"
NAMESPACE = "joulesched"
AGENT_NAMESPACE = "joulesched-agent"
NAMESPACES = (NAMESPACE, AGENT_NAMESPACE)

# Every directory holding a kustomization.yaml (found, not listed: a new one is tested too);
# the components (deploy/components/*) render only inside an overlay, tested below.
COMPONENTS = sorted(p.parent for p in (DEPLOY / "components").glob("*/kustomization.yaml"))
KUSTOMIZATIONS = sorted(p.parent.relative_to(REPO_ROOT).as_posix() for p in DEPLOY.rglob("kustomization.yaml")
                        if p.parent not in COMPONENTS)

# Files in deploy/ that no kustomization renders, and why none of them is a Kubernetes object.
NOT_KUBERNETES_OBJECTS = {
    # deploy/provider/*: NADIKI provider mode runs the agent on a physical host, outside
    # Kubernetes (docs/provider.md) -- a systemd unit and the agent's own config file.
    "provider/joulesched-provider.service": "systemd unit, installed on the host",
    "provider/provider.yaml": "agent configuration for provider mode (kubernetes.mode: off)",
    # A scrape_configs fragment for a prometheus.yml (clusters without the Prometheus Operator).
    "agent/prometheus/scrape-config.yaml": "Prometheus configuration fragment",
    # promtool's unit tests of rules.yaml (`promtool test rules`).
    "prometheus/rules_test.yaml": "promtool rule unit tests",
}

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
RBAC_FILES = [
    "extender/rbac.yaml",
    "extender/serviceaccount.yaml",
    "scheduler/rbac.yaml",
    "scheduler/serviceaccount.yaml",
    "agent/base/rbac.yaml",
    "agent/base/serviceaccount.yaml",
    "deferrer/rbac.yaml",
    "deferrer/serviceaccount.yaml",
]



# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def render(cp: ControlPlane, kdir: str) -> tuple[str, list[dict[str, Any]]]:
    text = cp.kubectl("kustomize", str(REPO_ROOT / kdir)).stdout
    return text, [d for d in yaml.safe_load_all(text) if d]


def kustomization_inputs(kfile: Path) -> set[Path]:
    """The files (and sub-kustomizations) a kustomization.yaml reads."""
    kdir = kfile.parent
    doc = yaml.safe_load(kfile.read_text()) or {}
    out: set[Path] = set()
    for entry in doc.get("resources") or []:
        path = (kdir / entry).resolve()
        out.add(path / "kustomization.yaml" if path.is_dir() else path)
    for entry in (doc.get("patches") or []) + (doc.get("patchesStrategicMerge") or []):
        if isinstance(entry, dict) and "path" in entry:
            out.add((kdir / entry["path"]).resolve())
        elif isinstance(entry, str):
            out.add((kdir / entry).resolve())
    for entry in doc.get("transformers") or []:
        if "\n" not in entry:  # a file; multi-line entries are inline transformer configs
            out.add((kdir / entry).resolve())
    for gen in (doc.get("configMapGenerator") or []) + (doc.get("secretGenerator") or []):
        for entry in gen.get("files") or []:
            out.add((kdir / entry.split("=", 1)[-1]).resolve())
    return out


def can_i(cp: ControlPlane, sa: str, verb: str, resource: str, *extra: str) -> bool:
    ns = AGENT_NAMESPACE if sa == "joulesched-agent" else NAMESPACE
    r = cp.kubectl("auth", "can-i", verb, resource, *extra,
                   f"--as=system:serviceaccount:{ns}:{sa}", check=False)
    # "yes", or "no" optionally followed by " - <why>" (e.g. an RBAC evaluation error)
    answer = r.stdout.strip().split(" ", 1)[0]
    if answer not in ("yes", "no"):
        raise ClusterError(f"kubectl auth can-i {verb} {resource} {extra}: {r.stdout!r} {r.stderr!r}")
    return answer == "yes"


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: []}
    return {prefix: value}


def changed_fields(shipped: dict[str, Any], used: dict[str, Any]) -> set[str]:
    a, b = flatten(shipped), flatten(used)
    return {k for k in a.keys() | b.keys() if a.get(k, KeyError) != b.get(k, KeyError)}


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kubectl_cache(tmp_path_factory) -> str:
    # A private discovery cache: kubectl must see the CRDs created below.
    return f"--cache-dir={tmp_path_factory.mktemp('kubectl-cache')}"


@pytest.fixture(scope="module")
def joulesched_namespace(control_plane: ControlPlane) -> str:
    """deploy/namespace.yaml, applied for real (it stays: there is no namespace controller)."""
    control_plane.kubectl("apply", "-f", str(DEPLOY / "namespace.yaml"))
    labels = {n: control_plane.core.read_namespace(n).metadata.labels for n in NAMESPACES}
    assert labels[NAMESPACE]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels[NAMESPACE]["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels[AGENT_NAMESPACE]["pod-security.kubernetes.io/enforce"] == "privileged"
    return NAMESPACE


@pytest.fixture(scope="module")
def joulesched_rbac(control_plane: ControlPlane, joulesched_namespace: str) -> list[dict[str, Any]]:
    """The ServiceAccounts and RBAC objects of ``kubectl kustomize deploy/``, applied for real."""
    _, objs = render(control_plane, "deploy")
    rbac = [o for o in objs if o["kind"] in RBAC_KINDS]
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    return rbac


# --------------------------------------------------------------------------
# 1. every manifest is accepted by the real apiserver
# --------------------------------------------------------------------------

def test_every_file_in_deploy_is_rendered_or_explained():
    kfiles = sorted(DEPLOY.rglob("kustomization.yaml"))
    used = set().union(*(kustomization_inputs(k) for k in kfiles))
    missing = sorted(str(p.relative_to(REPO_ROOT)) for p in used if not p.is_file())
    assert not missing, f"kustomizations name files that do not exist: {missing}"
    files = {p.resolve() for p in DEPLOY.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    left = {p.relative_to(DEPLOY.resolve()).as_posix() for p in files - used - {k.resolve() for k in kfiles}}
    assert left == set(NOT_KUBERNETES_OBJECTS), (
        f"files no kustomization renders: {sorted(left)}; "
        f"add them to a kustomization or to NOT_KUBERNETES_OBJECTS with the reason")
    for rel in NOT_KUBERNETES_OBJECTS:
        if rel.endswith(".yaml"):
            for doc in yaml.safe_load_all((DEPLOY / rel).read_text()):
                assert not (isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc), (
                    f"deploy/{rel} holds a Kubernetes object: it must be in a kustomization")
    # the ones the deployment docs name
    assert {"deploy", "deploy/agent/overlays/msr", "deploy/agent/overlays/servicemonitor",
            "deploy/prometheus", "deploy/prometheus/operator", "deploy/expander"} <= set(KUSTOMIZATIONS), KUSTOMIZATIONS


@pytest.mark.parametrize("kdir", KUSTOMIZATIONS)
def test_kustomization_is_accepted_by_server_dry_run(control_plane, joulesched_namespace, operator_crds,
                                                    kubectl_cache, kdir):
    cp = control_plane
    text, objs = render(cp, kdir)
    assert objs, f"{kdir} renders nothing"
    printed = server_dry_run(cp, kubectl_cache, text, str(kdir))
    assert sorted(printed) == sorted(ref(o) for o in objs), printed
    for o in objs:  # every namespaced object lands in joulesched (or names its own namespace)
        ns = o["metadata"].get("namespace")
        if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                             "MutatingWebhookConfiguration"):
            assert ns in (*NAMESPACES, "kube-system"), f"{ref(o)} in namespace {ns!r}"
            # the agent alone in its privileged namespace, nothing else there
            assert (ns == AGENT_NAMESPACE) == o["metadata"]["name"].startswith("joulesched-agent"), ref(o)
    # A dry run writes nothing: no workload or config object of this kustomization exists.
    # (The namespace and the RBAC objects are applied for real by other tests.)
    written = [ref(o) for o in objs
               if o["kind"] not in RBAC_KINDS | {"Namespace"} and o["metadata"].get("namespace") in NAMESPACES]
    for ns in NAMESPACES:
        names = [ref(o) for o in objs if ref(o) in written and o["metadata"].get("namespace") == ns]
        if names:
            got = cp.kubectl(kubectl_cache, "get", "-n", ns, "--ignore-not-found", "-o", "name", *names)
            assert got.stdout.strip() == "", got.stdout


def test_server_dry_run_rejects_an_invalid_manifest(control_plane, joulesched_namespace, kubectl_cache):
    # The negative control: the same dry run does reject what the apiserver would reject.
    _, objs = render(control_plane, "deploy/extender")
    dep = next(o for o in objs if o["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["bogusField"] = 1
    r = control_plane.kubectl(kubectl_cache, "apply", "--dry-run=server", "-f", "-",
                              input=yaml.safe_dump(dep), check=False)
    assert r.returncode != 0, r.stdout
    assert 'unknown field "spec.template.spec.containers[0].bogusField"' in r.stderr, r.stderr
    del dep["spec"]["template"]["spec"]["containers"][0]["bogusField"]
    dep["spec"]["replicas"] = -1
    r = control_plane.kubectl(kubectl_cache, "apply", "--dry-run=server", "-f", "-",
                              input=yaml.safe_dump(dep), check=False)
    assert r.returncode != 0 and "spec.replicas" in r.stderr, r.stderr


# Every workload deploy/ ships (the optional expander and the MSR agent included).
WORKLOAD_KUSTOMIZATIONS = ["deploy", "deploy/expander", "deploy/agent/overlays/msr"]


@pytest.fixture(scope="module")
def expander_service_account(control_plane, joulesched_namespace):
    # ServiceAccount admission rejects a pod whose account is missing, before Pod Security runs.
    _, objs = render(control_plane, "deploy/expander")
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([o for o in objs if o["kind"] == "ServiceAccount"]))


@pytest.mark.parametrize("kdir", WORKLOAD_KUSTOMIZATIONS)
def test_pod_security_admission_admits_every_pod_in_its_namespace(
        control_plane, joulesched_rbac, expander_service_account, kubectl_cache, kdir):
    cp = control_plane
    text, objs = render(cp, kdir)
    pods = pods_of(objs)
    assert pods, kdir
    for pod in pods:
        r = pod_security_dry_run(cp, kubectl_cache, pod)
        assert r.returncode == 0, f"{pod['metadata']['name']} in {pod['metadata']['namespace']}: {r.stderr}"
        assert "PodSecurity" not in r.stderr, r.stderr
        # only the agent needs the privileged namespace
        agent = pod["metadata"]["labels"]["app.kubernetes.io/name"] == "joulesched-agent"
        assert pod["metadata"]["namespace"] == (AGENT_NAMESPACE if agent else NAMESPACE), pod["metadata"]
    # The workloads themselves: the warn=restricted label prints "would violate PodSecurity" on
    # a Deployment whose pods would be rejected; there is none.
    r = cp.kubectl(kubectl_cache, "apply", "--dry-run=server", "-f", "-", input=text, check=False)
    assert r.returncode == 0 and "PodSecurity" not in r.stderr, r.stderr


def test_pod_security_admission_rejects_a_violation(control_plane, joulesched_rbac, kubectl_cache):
    # The negative controls: the same dry run refuses what "restricted" forbids.
    cp = control_plane
    _, objs = render(cp, "deploy")
    pods = {p["metadata"]["labels"]["app.kubernetes.io/name"]: p for p in pods_of(objs)}
    ext = copy.deepcopy(pods["joulesched-extender"])
    ext["spec"]["containers"][0]["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["NET_RAW"]}
    r = pod_security_dry_run(cp, kubectl_cache, ext)
    assert r.returncode != 0 and 'violates PodSecurity "restricted:latest"' in r.stderr and "NET_RAW" in r.stderr, r.stderr
    sched = copy.deepcopy(pods["joulesched-scheduler"])
    del sched["spec"]["securityContext"]["runAsNonRoot"]
    r = pod_security_dry_run(cp, kubectl_cache, sched)
    assert r.returncode != 0 and "runAsNonRoot" in r.stderr, r.stderr
    # the agent's pod (hostPath, UID 0) in the restricted namespace
    agent = copy.deepcopy(pods["joulesched-agent"])
    agent["metadata"]["namespace"] = NAMESPACE
    agent["spec"]["serviceAccountName"] = "joulesched-extender"  # one that exists there
    r = pod_security_dry_run(cp, kubectl_cache, agent)
    assert r.returncode != 0 and "restricted volume types" in r.stderr and "hostPath" in r.stderr, r.stderr


def docs_flow_schema() -> dict[str, Any]:
    """The FlowSchema docs/extender.md ("The bind verb: what it costs") gives operators."""
    text = (REPO_ROOT / "docs" / "extender.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "kind: FlowSchema" in b]
    doc: dict[str, Any] = yaml.safe_load(block)
    return doc


def test_the_docs_flow_schema_gives_the_extenders_bindings_kube_schedulers_priority(
        control_plane, joulesched_rbac, e2e_namespace):
    # The extender's bindings are its ServiceAccount's: API Priority and Fairness puts them at
    # workload-low (service-accounts) unless the operator applies docs/extender.md's FlowSchema,
    # which gives them kube-scheduler's workload-high. kube-apiserver names the priority level
    # of every request it classifies in X-Kubernetes-PF-PriorityLevel-UID.
    import ssl
    import urllib.error
    import urllib.request

    cp, ns, tag = control_plane, e2e_namespace, uuid.uuid4().hex[:6]
    levels = {name: cp.kubectl("get", "prioritylevelconfiguration", name, "-o", "jsonpath={.metadata.uid}").stdout
              for name in ("workload-low", "workload-high")}
    token = cp.kubectl("create", "token", "joulesched-extender", "-n", NAMESPACE).stdout.strip()
    context = ssl.create_default_context(cafile=str(cp.pki.ca_crt))  # the token alone: no client certificate

    def bind(pod: str) -> tuple[int, str]:
        """Bind ``pod`` (which need not exist) as deploy/'s extender: (status, priority level's name)."""
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, "namespace": ns},
                "target": {"apiVersion": "v1", "kind": "Node", "name": f"nowhere-{tag}"}}
        req = urllib.request.Request(f"{cp.server}/api/v1/namespaces/{ns}/pods/{pod}/binding", method="POST",
                                     data=yaml.safe_dump(body).encode(), headers={
                                         "Authorization": f"Bearer {token}", "Content-Type": "application/yaml"})
        try:
            with urllib.request.urlopen(req, context=context, timeout=10) as r:
                status, headers = r.status, r.headers
        except urllib.error.HTTPError as e:
            status, headers = e.code, e.headers
        uid = headers.get("X-Kubernetes-PF-PriorityLevel-UID")
        return status, next((name for name, u in levels.items() if u == uid), f"another level ({uid})")

    cp.create_pod(f"a-{tag}", ns, scheduler_name="nobody", cpu="100m", memory="64Mi")
    assert bind(f"a-{tag}") == (201, "workload-low")  # deploy/'s RBAC lets it bind; low priority
    schema = docs_flow_schema()
    schema["metadata"]["name"] = f"{schema['metadata']['name']}-{tag}"
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(schema))
    try:
        # kube-apiserver's APF controller takes the new schema up within moments
        _wait_until(lambda: bind(f"missing-{tag}") == (404, "workload-high"), 30,
                    what="the extender's bindings at workload-high")
        cp.create_pod(f"b-{tag}", ns, scheduler_name="nobody", cpu="100m", memory="64Mi")
        assert bind(f"b-{tag}") == (201, "workload-high")
    finally:
        cp.kubectl("delete", "flowschema", schema["metadata"]["name"], check=False)


def test_network_policies_admit_only_the_scheduler_and_prometheus(control_plane):
    _, objs = render(control_plane, "deploy")
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "NetworkPolicy"}
    assert set(policies) == {"joulesched-extender", "joulesched-agent"}
    ext, agent = policies["joulesched-extender"], policies["joulesched-agent"]
    pods = {p["metadata"]["labels"]["app.kubernetes.io/name"]: p for p in pods_of(objs)}
    # each selects its component's pods, in that component's namespace
    for policy, name in ((ext, "joulesched-extender"), (agent, "joulesched-agent")):
        assert policy["metadata"]["namespace"] == pods[name]["metadata"]["namespace"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= pods[name]["metadata"]["labels"].items()
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    sched_labels = pods["joulesched-scheduler"]["metadata"]["labels"]
    (from_sched, from_prom) = ext["spec"]["ingress"]
    # a podSelector alone: pods of the policy's own namespace only, the scheduler's
    assert from_sched["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": sched_labels["app.kubernetes.io/name"]}}}]
    assert from_prom["from"] == [prometheus]
    (port,) = pods["joulesched-extender"]["spec"]["containers"][0]["ports"]
    assert from_sched["ports"] == from_prom["ports"] == [{"port": port["name"], "protocol": "TCP"}]
    (only,) = agent["spec"]["ingress"]
    assert only["from"] == [prometheus]
    (port,) = pods["joulesched-agent"]["spec"]["containers"][0]["ports"]
    assert only["ports"] == [{"port": port["name"], "protocol": "TCP"}]


def overlay_with(tmp_path: Path, component: Path) -> Path:
    """An operator's overlay: deploy/ plus one version component (kustomize wants relative paths)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(DEPLOY, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [rel.as_posix()], "components": [(rel / "components" / component.name).as_posix()]}))
    return tmp_path


def scheduler_image(objs: list[dict[str, Any]]) -> str:
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "joulesched-scheduler")
    return dep["spec"]["template"]["spec"]["containers"][0]["image"]


def test_one_version_component_per_supported_minor(control_plane, tmp_path):
    minors = [re.fullmatch(r"kube-v1\.(\d+)", c.name) for c in COMPONENTS]
    assert all(minors) and len(minors) >= 3, [c.name for c in COMPONENTS]
    numbers = sorted(int(m.group(1)) for m in minors if m)
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers  # no gap
    _, base = render(control_plane, "deploy")
    for component in COMPONENTS:
        text = control_plane.kubectl("kustomize", str(overlay_with(tmp_path / component.name, component))).stdout
        objs = [d for d in yaml.safe_load_all(text) if d]
        tag = scheduler_image(objs).rpartition(":")[2]
        assert re.fullmatch(rf"v1\.{component.name.rpartition('.')[2]}\.\d+", tag), (component.name, tag)
        # the component changes the scheduler's image tag and nothing else
        assert len(objs) == len(base)
        for a, b in zip(objs, base, strict=True):
            if a["kind"] == "Deployment" and a["metadata"]["name"] == "joulesched-scheduler":
                a, b = copy.deepcopy(a), copy.deepcopy(b)
                a["spec"]["template"]["spec"]["containers"][0]["image"] = b["spec"]["template"]["spec"]["containers"][0]["image"]
            assert a == b, ref(a)
    # deploy/ alone runs the newest minor's scheduler
    assert scheduler_image(base) == f"registry.k8s.io/kube-scheduler:v1.{numbers[-1]}." + scheduler_image(base).rsplit(".", 1)[1]


def test_the_running_apiservers_minor_has_a_component_and_its_overlay_is_accepted(
        control_plane, joulesched_namespace, kubectl_cache, tmp_path):
    # Run on each minor the suite runs on (.ci/run): the component of that minor names exactly
    # the apiserver's release, and the apiserver accepts the overlay.
    cp = control_plane
    version = yaml.safe_load(cp.kubectl("version", "-o", "yaml").stdout)["serverVersion"]
    component = DEPLOY / "components" / f"kube-v{version['major']}.{version['minor'].rstrip('+')}"
    assert component in COMPONENTS, f"no deploy/components entry for the apiserver's {version['gitVersion']}"
    text = cp.kubectl("kustomize", str(overlay_with(tmp_path, component))).stdout
    objs = [d for d in yaml.safe_load_all(text) if d]
    assert scheduler_image(objs) == f"registry.k8s.io/kube-scheduler:{version['gitVersion']}"
    printed = server_dry_run(cp, kubectl_cache, text, f"deploy/ + {component.name}")
    assert sorted(printed) == sorted(ref(o) for o in objs), printed


def test_shipped_configmaps_hold_the_shipped_files(control_plane):
    # What test_shipped_scheduler_config_* runs is what the Deployment mounts.
    _, objs = render(control_plane, "deploy")
    files = {key: value for o in objs if o["kind"] == "ConfigMap" for key, value in o["data"].items()}
    assert files["scheduler-config.yaml"] == DEPLOY_SCHEDULER_CONFIG.read_text()
    assert files["config.yaml"] == DEPLOY_EXTENDER_CONFIG.read_text()
    # ... and the Deployments mount those ConfigMaps (kustomize rewrites the hashed names).
    maps = {o["metadata"]["name"]: set(o["data"]) for o in objs if o["kind"] == "ConfigMap"}
    for name in ("joulesched-scheduler", "joulesched-extender"):
        dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name)
        (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
        assert vol["configMap"]["name"] in maps, (name, vol, sorted(maps))


# --------------------------------------------------------------------------
# 2. RBAC is what the code needs, and no more
# --------------------------------------------------------------------------

def test_rbac_objects_are_the_shipped_files(joulesched_rbac):
    from_files = set()
    for rel in RBAC_FILES:
        for doc in yaml.safe_load_all((DEPLOY / rel).read_text()):
            if doc:
                from_files.add((doc["kind"], doc["metadata"]["name"]))
    assert {(o["kind"], o["metadata"]["name"]) for o in joulesched_rbac} == from_files


def test_extender_service_account_rbac(control_plane, joulesched_rbac):
    cp, sa = control_plane, "joulesched-extender"
    cfg = parse_config(yaml.safe_load(DEPLOY_EXTENDER_CONFIG.read_text()), str(DEPLOY_EXTENDER_CONFIG))
    # What extender/kube.py calls, for the features deploy/extender/config.yaml turns on:
    #   predicted_load.watch_pods -> PodBindingWatch: list_pod_for_all_namespaces + watch
    #   bind.enabled              -> Binder: create_namespaced_pod_binding (create pods/binding)
    #   servers.watch_nodes       -> NodeServerWatch: list_node + watch
    assert cfg.watch_pods, "the shipped config watches pods; the checks below assume it"
    assert can_i(cp, sa, "list", "pods", "-A")
    assert can_i(cp, sa, "watch", "pods", "-A")
    assert not can_i(cp, sa, "get", "pods", "-A")  # no single pod is read: list and watch only
    assert can_i(cp, sa, "create", "pods", "--subresource=binding", "-A") is cfg.bind_enabled
    assert can_i(cp, sa, "list", "nodes") is cfg.watch_nodes
    assert can_i(cp, sa, "watch", "nodes") is cfg.watch_nodes
    # nothing else
    assert not can_i(cp, sa, "delete", "pods", "-A")
    assert not can_i(cp, sa, "create", "pods", "-A")
    assert not can_i(cp, sa, "update", "pods", "-A")
    assert not can_i(cp, sa, "get", "secrets", "-A")
    assert not can_i(cp, sa, "get", "secrets", "-n", NAMESPACE)
    assert not can_i(cp, sa, "create", "nodes")


def test_agent_service_account_rbac(control_plane, joulesched_rbac):
    cp, sa = control_plane, "joulesched-agent"
    # measurement/sources/kube_pods.py lists the pods on its node, cluster-wide:
    #   GET /api/v1/pods?fieldSelector=spec.nodeName=<node> (list pods, all namespaces).
    assert can_i(cp, sa, "list", "pods", "-A")
    assert not can_i(cp, sa, "get", "pods", "-A")  # nothing else of pods: no single pod, no watch
    assert not can_i(cp, sa, "watch", "pods", "-A")
    assert not can_i(cp, sa, "get", "secrets", "-A")
    assert not can_i(cp, sa, "get", "secrets", "-n", NAMESPACE)
    assert not can_i(cp, sa, "patch", "nodes")
    assert not can_i(cp, sa, "delete", "pods", "-A")
    assert not can_i(cp, sa, "create", "pods", "--subresource=binding", "-A")


def test_scheduler_service_account_rbac(control_plane, joulesched_rbac):
    cp, sa = control_plane, "joulesched-scheduler"
    le = deploy_scheduler_config()["leaderElection"]
    # kube-scheduler binds pods, reads pods and nodes, takes the lease its config names, and
    # reads the requestheader CA (extension-apiserver-authentication) for delegated authn.
    assert can_i(cp, sa, "create", "pods", "--subresource=binding", "-A")
    assert can_i(cp, sa, "list", "pods", "-A")
    assert can_i(cp, sa, "watch", "nodes")
    assert can_i(cp, sa, "create", "leases.coordination.k8s.io", "-n", le["resourceNamespace"])
    assert can_i(cp, sa, "update", f"leases.coordination.k8s.io/{le['resourceName']}",
                 "-n", le["resourceNamespace"])
    assert can_i(cp, sa, "get", "configmaps/extension-apiserver-authentication", "-n", "kube-system"), (
        "the scheduler cannot read kube-system/extension-apiserver-authentication")
    assert not can_i(cp, sa, "get", "secrets", "-A")
    assert not can_i(cp, sa, "get", "secrets", "-n", NAMESPACE)
    assert not can_i(cp, sa, "get", "configmaps", "-n", "kube-system")  # that one only


# --------------------------------------------------------------------------
# 3. the shipped scheduler config in the real kube-scheduler
# --------------------------------------------------------------------------

def test_shipped_scheduler_config_runs_in_real_kube_scheduler(
        control_plane, joulesched_rbac, node_factory, scheduler_factory, extender_factory, e2e_namespace):
    cp, ns, tag = control_plane, e2e_namespace, uuid.uuid4().hex[:6]
    sel = {"e2e-test": f"deploy-{tag}"}
    eff, ineff = f"deploy-eff-{tag}", f"deploy-ineff-{tag}"
    # In-tree scoring alone prefers the bigger, inefficient node (see test_extender_e2e.py).
    node_factory(eff, cpu="64", memory="128Gi", labels=sel)
    node_factory(ineff, cpu="80", memory="512Gi", labels=sel)
    profiles = {"sites": {"dc": {"pue": 1.2, "carbon_intensity": 300}},
                "nodes": [node_profile(eff, EFFICIENT_CURVE, 64, site="dc"),
                          node_profile(ineff, INEFFICIENT_CURVE, 80, site="dc")]}
    # Both run with their ServiceAccount's token: the shipped RBAC must be enough.
    ext_kc = cp.service_account_kubeconfig(NAMESPACE, "joulesched-extender")
    sched_kc = cp.service_account_kubeconfig(NAMESPACE, "joulesched-scheduler")
    ext = extender_factory(profiles, deploy_extender_config(ext_kc))

    shipped = deploy_scheduler_config()
    cfg = deploy_scheduler_config()
    cfg["extenders"][0]["urlPrefix"] = ext.url
    cfg["clientConnection"] = {"kubeconfig": str(sched_kc)}
    # leader_election=True: the shipped leaderElection section is kept (a real lease in joulesched).
    sched = scheduler_factory(cfg, name=f"deploy-config-{tag}", leader_election=True)
    assert changed_fields(shipped, sched.config) == {"clientConnection.kubeconfig", "extenders[0].urlPrefix"}
    used = yaml.safe_load(Path(sched.config_path).read_text())
    assert changed_fields(shipped, used) == {"clientConnection.kubeconfig", "extenders[0].urlPrefix"}
    entry = used["extenders"][0]
    assert (entry["weight"], entry["httpTimeout"], entry["nodeCacheCapable"], entry["ignorable"]) == (5, "1s", True, True)
    (name,) = sched.scheduler_names

    cp.create_pod("shipped", ns, scheduler_name=name, cpu="8", memory="1Gi", node_selector=sel)
    node = cp.wait_for_pod_scheduled("shipped", ns, timeout=45)
    log = sched.log_text()
    # ignorable: true would hide a failing extender: it must have answered, and been used.
    assert ext.requests("filter", "200") >= 1, ext.samples()
    assert ext.requests("prioritize", "200") >= 1, ext.samples()
    assert ext.failures() == 0, ext.samples()
    assert "Skipping extender" not in log, log[-3000:]
    assert node == eff, f"bound to {node}\nscheduler log:\n{sched.log_tail(30)}\nextender log:\n{ext.log_tail(30)}"
    # The real binary parsed the shipped extender settings (its config dump at startup).
    assert '"Weight":5' in log and '"HTTPTimeout":"1s"' in log and '"NodeCacheCapable":true' in log, log[:4000]
    # It ran as the ServiceAccount and held the shipped lease.
    lease = cp.kubectl("get", "lease", shipped["leaderElection"]["resourceName"], "-n",
                       shipped["leaderElection"]["resourceNamespace"], "-o", "yaml").stdout
    assert yaml.safe_load(lease)["spec"]["holderIdentity"], lease
    assert "forbidden" not in log.lower(), [ln for ln in log.splitlines() if "forbidden" in ln.lower()][:5]
    ext_log = ext.log_text()
    assert "pod-binding-watch failed" not in ext_log and "Forbidden" not in ext_log, ext.log_tail(30)
