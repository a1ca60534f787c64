"""charts/joulesched against deploy/: one source of truth.

The real helm (hack/build-helm.sh, ``$JOULESCHED_HELM``) lints and renders the chart for the
default values and for other values files; the default render is compared, object by object,
with ``kubectl kustomize deploy/`` plus ``kubectl kustomize deploy/prometheus`` (the rules and
dashboard ConfigMaps). What legitimately differs is normalised away: Helm's standard labels,
the chart's ``checksum/*`` pod annotations, kustomize's ConfigMap name hashes, and the
namespace on cluster-scoped objects. The chart's files/ are byte copies of deploy/'s files.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "joulesched"
DEPLOY = REPO / "deploy"
NAMESPACE = "joulesched"
AGENT_NAMESPACE = "joulesched-agent"
KUBE_VERSION = "v1.37.2"  # the release deploy/scheduler pins, and the e2e apiserver's
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version"}
# kustomize does not know ValidatingAdmissionPolicy(Binding) is cluster-scoped: it writes the
# namespace on them (the apiserver ignores it).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}

# The chart's copies of deploy/'s files (.Files.Get reads only inside the chart).
COPIES = {
    "files/rules.yaml": "prometheus/rules.yaml",
    "files/dashboard.json": "prometheus/dashboard.json",
    "files/extender-config.yaml": "extender/config.yaml",
    "files/agent.yaml": "agent/base/agent.yaml",
    "files/deferrer-sites.yaml": "deferrer/sites.yaml",
}

VALUES_FILES: dict[str, dict[str, Any]] = {
    "everything-on": {
        "namespace": {"create": True},
        "gpu": {"enabled": True},
        "expander": {"enabled": True},
        "deferrer": {"replicas": 3, "extraArgs": ["--interval=60"], "webhook": {"certManager": False}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "dashboard": {"enabled": True, "labelKey": "grafana_dashboard", "labelValue": "joulesched"},
        "extender": {"replicas": 3, "serviceMonitor": {"enabled": True}, "nodeSelector": {"node-role.kubernetes.io/infra": ""},
                     "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
                     "config": {"bind": {"enabled": True}}, "tls": {"enabled": True}},
        "scheduler": {"image": {"tag": "v1.36.4", "pullPolicy": "IfNotPresent"},
                      "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}}},
    },
    "agent-off-custom-labels": {
        "agent": {"enabled": False},
        "commonLabels": {"app.kubernetes.io/part-of": "joulesched", "team": "platform"},
        "dashboard": {"labelKey": "grafana.io/dashboard", "labelValue": "energy"},
        "rules": {"configMap": {"enabled": False}},
        "deferrer": {"webhook": {"enabled": False}},
        "extender": {"config": {"bind": {"enabled": False}, "policy": {"filter_keeps": "best"}}},
    },
}


def helm_binary() -> str:
    env = os.environ.get("JOULESCHED_HELM")
    if env:
        if not os.access(env, os.X_OK):
            pytest.fail(f"JOULESCHED_HELM={env} is not executable")
        return env
    r = subprocess.run([str(REPO / "hack" / "build-helm.sh")], capture_output=True, text=True)
    if r.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"hack/build-helm.sh failed:\n{r.stderr}")
        pytest.skip(f"helm is not available (hack/build-helm.sh: {r.stderr.strip()[-300:]})")
    return str(Path(r.stdout.strip().splitlines()[-1]) / "helm")


def kubectl_binary() -> str:
    d = os.environ.get("JOULESCHED_K8S_BIN_DIR") or str(Path.home() / ".cache/joulesched/k8s/v1.37.2/bin")
    path = Path(d) / "kubectl"
    if not os.access(path, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"kubectl not found at {path} (hack/build-k8s.sh)")
        pytest.skip(f"kubectl not found at {path} (hack/build-k8s.sh)")
    return str(path)


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True)


def helm_template(helm: str, *extra: str) -> list[dict[str, Any]]:
    r = run(helm, "template", "joulesched", str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION, *extra)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def write_values(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(VALUES_FILES[name]))
    return path


def key(o: dict[str, Any]) -> tuple[str, str, str]:
    return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])


def by_key(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {key(o): o for o in objs}
    assert len(out) == len(objs), "duplicate objects"
    return out


def pod_spec(o: dict[str, Any]) -> dict[str, Any]:
    return o["spec"]["template"]["spec"]


def normalise(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """What legitimately differs between the two renders, removed."""
    objs = copy.deepcopy(objs)
    hashed = {}
    for o in objs:  # kustomize's generated names: <name>-<10-char hash>
        if o["kind"] == "ConfigMap":
            m = re.fullmatch(r"(.+)-[a-z0-9]{10}", o["metadata"]["name"])
            if m and m.group(1) in ("joulesched-extender", "joulesched-scheduler-config", "joulesched-agent"):
                hashed[o["metadata"]["name"]] = m.group(1)
                o["metadata"]["name"] = m.group(1)
    for o in objs:
        meta = o["metadata"]
        if o["kind"] in CLUSTER_SCOPED:
            meta.pop("namespace", None)
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in HELM_LABELS}
        meta.pop("labels", None)
        if labels:
            meta["labels"] = labels
        tmpl = o.get("spec", {}).get("template") if isinstance(o.get("spec"), dict) else None
        if tmpl:
            ann = {k: v for k, v in (tmpl["metadata"].get("annotations") or {}).items()
                   if not k.startswith("checksum/")}
            tmpl["metadata"].pop("annotations", None)
            if ann:
                tmpl["metadata"]["annotations"] = ann
            for vol in tmpl["spec"].get("volumes", []):
                if "configMap" in vol:
                    vol["configMap"]["name"] = hashed.get(vol["configMap"]["name"], vol["configMap"]["name"])
        if o["kind"] == "ConfigMap" and meta["name"] in ("joulesched-extender", "joulesched-scheduler-config"):
            # YAML documents: compared parsed (the scheduler config's comments are shortened)
            o["data"] = {k: yaml.safe_load(v) for k, v in o["data"].items()}
    return by_key(objs)


# --------------------------------------------------------------------------

@pytest.mark.parametrize("chart_file,deploy_file", sorted(COPIES.items()))
def test_chart_files_are_copies_of_deploy(chart_file, deploy_file):
    assert (CHART / chart_file).read_bytes() == (DEPLOY / deploy_file).read_bytes(), (
        f"charts/joulesched/{chart_file} differs from deploy/{deploy_file}: cp deploy/{deploy_file} "
        f"charts/joulesched/{chart_file}")


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == "0.1.0"
    images = {m.group(0) for m in re.finditer(r"ghcr\.io/joulesched/[a-z-]+:[0-9.]+", (DEPLOY / "extender/deployment.yaml").read_text()
                                                + (DEPLOY / "agent/base/daemonset.yaml").read_text())}
    assert images == {f"ghcr.io/joulesched/joulesched:{chart['appVersion']}",
                      f"ghcr.io/joulesched/joulesched-agent:{chart['appVersion']}"}
    json.loads((CHART / "values.schema.json").read_text())


@pytest.mark.parametrize("values", [None, *VALUES_FILES])
def test_helm_lint_is_clean(helm, tmp_path, values):
    extra = ["-f", str(write_values(tmp_path, values))] if values else []
    r = run(helm, "lint", "--strict", str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION, *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 chart(s) failed" in r.stdout, r.stdout
    assert "[WARNING]" not in r.stdout and "[ERROR]" not in r.stdout, r.stdout


def test_default_render_equals_kustomize(helm):
    kubectl = kubectl_binary()
    kust: list[dict[str, Any]] = []
    for kdir in ("deploy", "deploy/prometheus"):
        r = run(kubectl, "kustomize", str(REPO / kdir))
        assert r.returncode == 0, r.stderr
        kust += [d for d in yaml.safe_load_all(r.stdout) if d]
    # the Namespace: rendered on request (namespace.create), as helm install --create-namespace
    # makes it otherwise
    chart = helm_template(helm, "--set", "namespace.create=true")
    want, got = normalise(kust), normalise(chart)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k] == want[k], f"{k} differs:\nchart: {yaml.safe_dump(got[k])}\nkustomize: {yaml.safe_dump(want[k])}"
    # spelled out, the parts that matter most (all also covered by the equality above)
    for k, o in want.items():
        if k[0] in ("Deployment", "DaemonSet"):
            for c_want, c_got in zip(pod_spec(o)["containers"], pod_spec(got[k])["containers"], strict=True):
                for field in ("image", "args", "command", "ports", "securityContext", "resources"):
                    assert c_got.get(field) == c_want.get(field), (k, field)
            assert pod_spec(got[k])["securityContext"] == pod_spec(o)["securityContext"], k
    cms = {k[2]: o["data"] for k, o in got.items() if k[0] == "ConfigMap"}
    assert cms["joulesched-prometheus-rules"]["joulesched-impact.rules.yaml"] == (DEPLOY / "prometheus/rules.yaml").read_text()
    assert cms["joulesched-grafana-dashboard"]["joulesched.json"] == (DEPLOY / "prometheus/dashboard.json").read_text()
    assert cms["joulesched-scheduler-config"]["scheduler-config.yaml"] == yaml.safe_load(
        (DEPLOY / "scheduler/scheduler-config.yaml").read_text())
    # the default render itself (no namespace.create): the same, without the Namespace
    default = {k for k in normalise(helm_template(helm))}
    assert default == set(want) - {("Namespace", "", NAMESPACE)}
    # the extender's config file is the deploy file byte for byte
    ext_cm = next(o for o in helm_template(helm) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "joulesched-extender")
    assert ext_cm["data"]["config.yaml"] == (DEPLOY / "extender/config.yaml").read_text()


def test_everything_on(helm, tmp_path):
    objs = by_key(helm_template(helm, "-f", str(write_values(tmp_path, "everything-on"))))
    kinds = {k[0] for k in objs}
    assert {"Namespace", "ServiceMonitor", "PrometheusRule"} <= kinds
    sm = objs[("ServiceMonitor", AGENT_NAMESPACE, "joulesched-agent")]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"] == yaml.safe_load((DEPLOY / "agent/overlays/servicemonitor/servicemonitor.yaml").read_text())["spec"]
    # the agent's namespace/pod labels (the workload's) win over the Operator's target labels
    assert [e.get("honorLabels") for e in sm["spec"]["endpoints"]] == [True]
    ext_sm = objs[("ServiceMonitor", NAMESPACE, "joulesched-extender")]
    assert ext_sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # deploy/'s, with the scheme and CA of extender.tls (on in these values)
    (endpoint,) = ext_sm["spec"]["endpoints"]
    assert (endpoint.pop("scheme"), endpoint.pop("tlsConfig")) == ("https", {
        "ca": {"secret": {"name": "joulesched-extender-tls", "key": "ca.crt"}}, "serverName": f"joulesched-extender.{NAMESPACE}.svc"})
    assert ext_sm["spec"] == yaml.safe_load((DEPLOY / "extender/servicemonitor/servicemonitor.yaml").read_text())["spec"]
    pr = objs[("PrometheusRule", NAMESPACE, "joulesched-impact")]
    assert pr["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert pr["spec"] == yaml.safe_load((DEPLOY / "prometheus/operator/prometheusrule.yaml").read_text())["spec"]
    dash = objs[("ConfigMap", NAMESPACE, "joulesched-grafana-dashboard")]
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "joulesched"
    # the expander: deploy/expander's objects
    kust = run(kubectl_binary(), "kustomize", str(DEPLOY / "expander"))
    assert kust.returncode == 0, kust.stderr
    exp_want = normalise([d for d in yaml.safe_load_all(kust.stdout) if d])
    exp_got = normalise(list(objs.values()))
    for k, o in exp_want.items():
        assert exp_got[k] == o, k
    # GPU nodes: a second DaemonSet with the NVIDIA runtime; the plain one avoids them
    gpu = pod_spec(objs[("DaemonSet", AGENT_NAMESPACE, "joulesched-agent-gpu")])
    assert gpu["runtimeClassName"] == "nvidia"
    assert gpu["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in gpu["containers"][0]["env"]
    plain = pod_spec(objs[("DaemonSet", AGENT_NAMESPACE, "joulesched-agent")])
    (term,) = plain["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}]
    # per-component placement, replicas, image tag override, merged extender config + its RBAC
    ext = objs[("Deployment", NAMESPACE, "joulesched-extender")]
    assert ext["spec"]["replicas"] == 3
    assert pod_spec(ext)["nodeSelector"] == {"node-role.kubernetes.io/infra": ""}
    assert pod_spec(ext)["tolerations"][0]["key"] == "infra"
    sched = pod_spec(objs[("Deployment", NAMESPACE, "joulesched-scheduler")])["containers"][0]
    assert sched["image"] == "registry.k8s.io/kube-scheduler:v1.36.4"
    # values maps merge: the default limits stay
    assert sched["resources"] == {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
    cfg = yaml.safe_load(objs[("ConfigMap", NAMESPACE, "joulesched-extender")]["data"]["config.yaml"])
    assert cfg["bind"] == {"enabled": True} and cfg["policy"]["strategy"] == "carbon"
    rules = objs[("ClusterRole", "", "joulesched-extender")]["rules"]
    assert {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]} in rules
    # the deferrer: replicas, extra args after the shipped ones, the webhook without cert-manager
    dfr = objs[("Deployment", NAMESPACE, "joulesched-deferrer")]
    assert dfr["spec"]["replicas"] == 3 and pod_spec(dfr)["containers"][0]["args"][-1] == "--interval=60"
    hook = objs[("MutatingWebhookConfiguration", "", "joulesched-deferrer")]
    assert "annotations" not in hook["metadata"]
    assert hook["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", NAMESPACE]


def test_agent_off_and_custom_labels(helm, tmp_path):
    objs = by_key(helm_template(helm, "-f", str(write_values(tmp_path, "agent-off-custom-labels"))))
    assert not [k for k in objs if "agent" in k[2]], sorted(objs)
    assert ("ConfigMap", NAMESPACE, "joulesched-prometheus-rules") not in objs
    for o in objs.values():
        assert o["metadata"]["labels"]["team"] == "platform", key(o)
    dash = objs[("ConfigMap", NAMESPACE, "joulesched-grafana-dashboard")]
    assert dash["metadata"]["labels"]["grafana.io/dashboard"] == "energy"
    assert "grafana_dashboard" not in dash["metadata"]["labels"]
    # the deferrer without its webhook: no configuration, no webhook flags
    assert ("MutatingWebhookConfiguration", "", "joulesched-deferrer") not in objs
    args = pod_spec(objs[("Deployment", NAMESPACE, "joulesched-deferrer")])["containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--webhook", "--tls"))], args
    # the bind verb off: kube-scheduler binds itself, and the extender may not
    rules = objs[("ClusterRole", "", "joulesched-extender")]["rules"]
    assert not [r for r in rules if "pods/binding" in r["resources"]], rules
    sched = yaml.safe_load(objs[("ConfigMap", NAMESPACE, "joulesched-scheduler-config")]["data"]["scheduler-config.yaml"])
    assert "bindVerb" not in sched["extenders"][0], sched["extenders"]
    # filter keeps the best node: kube-scheduler never asks prioritize, and is not told to
    assert "prioritizeVerb" not in sched["extenders"][0] and sched["extenders"][0]["filterVerb"] == "filter"


@pytest.mark.parametrize("keeps,prioritize", [("all", True), ("top", False), ("best", False)])
def test_the_scheduler_asks_prioritize_only_when_filter_keeps_every_node(helm, keeps, prioritize):
    # filter_keeps: top and best leave nodes the extender scores alike, or one: kube-scheduler
    # is not told to ask prioritize; the bind verb stays (deploy/'s bind.enabled)
    r = run(helm, "template", "joulesched", str(CHART), "-n", NAMESPACE, "--set", f"extender.config.policy.filter_keeps={keeps}",
            "--show-only", "templates/scheduler-configmap.yaml")
    assert r.returncode == 0, r.stderr
    sched = yaml.safe_load(yaml.safe_load(r.stdout)["data"]["scheduler-config.yaml"])
    entry = sched["extenders"][0]
    assert ("prioritizeVerb" in entry) is prioritize and entry["filterVerb"] == "filter" and entry["bindVerb"] == "bind", entry


def test_bind_write_off_keeps_the_bind_verb_drops_the_binding_permission_and_needs_an_ignorable_entry(helm):
    # bind.write: false: the bind verb only records, kube-scheduler (ignorable) writes the binding
    objs = by_key(helm_template(helm, "--set", "extender.config.bind.write=false"))
    rules = objs[("ClusterRole", "", "joulesched-extender")]["rules"]
    assert not [r for r in rules if "pods/binding" in r["resources"]], rules
    cfg = yaml.safe_load(objs[("ConfigMap", NAMESPACE, "joulesched-extender")]["data"]["config.yaml"])
    assert cfg["bind"] == {"enabled": True, "write": False}
    sched = yaml.safe_load(objs[("ConfigMap", NAMESPACE, "joulesched-scheduler-config")]["data"]["scheduler-config.yaml"])
    assert sched["extenders"][0]["bindVerb"] == "bind" and sched["extenders"][0]["ignorable"] is True
    # written explicitly: the permission stays
    rules = by_key(helm_template(helm, "--set", "extender.config.bind.write=true"))[("ClusterRole", "", "joulesched-extender")]["rules"]
    assert {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]} in rules
    # a non-ignorable entry would fail every binding on the extender's answer: refused
    r = run(helm, "template", "joulesched", str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION,
            "--set", "extender.config.bind.write=false", "--set", "scheduler.ignorable=false")
    assert r.returncode != 0 and "bind.write: false needs scheduler.ignorable: true" in r.stderr, r.stderr


def test_kube_schedulers_api_rate_is_rendered_only_where_set(helm):
    # With bind.write: false kube-scheduler writes every binding, held to its clientConnection.qps
    # (50 by default): the chart lets it be raised, and renders nothing it was not given.
    def scheduler_config(*sets: str) -> subprocess.CompletedProcess[str]:
        return run(helm, "template", "joulesched", str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION, *sets,
                   "--show-only", "templates/scheduler-configmap.yaml")

    def parsed(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
        assert r.returncode == 0, r.stderr
        return yaml.safe_load(yaml.safe_load(r.stdout)["data"]["scheduler-config.yaml"])

    assert "clientConnection" not in parsed(scheduler_config())
    raised = parsed(scheduler_config("--set", "extender.config.bind.write=false", "--set", "scheduler.clientConnection.qps=500",
                                     "--set", "scheduler.clientConnection.burst=1000"))
    assert raised["clientConnection"] == {"qps": 500, "burst": 1000}, raised
    for bad in ("scheduler.clientConnection.qps=0", "scheduler.clientConnection.burst=0", "scheduler.clientConnection.kubeconfig=/k"):
        r = scheduler_config("--set", bad)
        assert r.returncode != 0 and "clientConnection" in r.stderr, (bad, r.stderr)


@pytest.mark.parametrize("kube_version,tag", [("v1.37.2", "v1.37.2"), ("v1.36.0", "v1.36.0"),
                                              ("v1.35.4+k3s1", "v1.35.4")])
def test_scheduler_image_follows_the_cluster_version(helm, kube_version, tag):
    r = run(helm, "template", "joulesched", str(CHART), "-n", NAMESPACE, "--kube-version", kube_version,
            "--show-only", "templates/scheduler-deployment.yaml")
    assert r.returncode == 0, r.stderr
    dep = yaml.safe_load(r.stdout)
    assert pod_spec(dep)["containers"][0]["image"] == f"registry.k8s.io/kube-scheduler:{tag}"


@pytest.mark.parametrize("bad,message", [
    ("extender.replicas=-1", "/extender/replicas"),
    ("scheduler.replicas=0", "/scheduler/replicas"),
    ("agent.enabled=yes", "/agent/enabled"),
    ("extender.image.pullPolicy=Sometimes", "/extender/image/pullPolicy"),
    ("scheduler.percentageOfNodesToScore=101", "/scheduler/percentageOfNodesToScore"),
    ("extenderReplicas=2", "additional properties"),
    ("deferrer.replicas=0", "/deferrer/replicas"),
    ("extender.tls.serverSecret=", "/extender/tls/serverSecret"),
])
def test_schema_rejects_bad_values(helm, bad, message):
    flag = "--set-string" if bad.startswith("agent.enabled") else "--set"
    for cmd in ("template", "lint"):
        r = run(helm, cmd, *(["joulesched"] if cmd == "template" else []), str(CHART), "-n", NAMESPACE,
                "--kube-version", KUBE_VERSION, flag, bad)
        assert r.returncode != 0, (cmd, bad, r.stdout)
        assert "schema" in (r.stdout + r.stderr) and message in (r.stdout + r.stderr), (cmd, r.stdout, r.stderr)


def test_agent_namespace_and_network_policy_values(helm):
    objs = by_key(helm_template(helm, "--set", "agent.namespace.name=energy-agent", "--set", "networkPolicy.prometheus.namespaceSelector.matchLabels.team=obs"))
    agent_objs = {k for k in objs if k[2].startswith("joulesched-agent") and k[0] not in CLUSTER_SCOPED}
    assert agent_objs and {k[1] for k in agent_objs} == {"energy-agent"}, sorted(agent_objs)
    ns = objs[("Namespace", "", "energy-agent")]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    (subject,) = objs[("ClusterRoleBinding", "", "joulesched-agent")]["subjects"]
    assert subject == {"kind": "ServiceAccount", "name": "joulesched-agent", "namespace": "energy-agent"}
    for name, ns_name in (("joulesched-extender", NAMESPACE), ("joulesched-agent", "energy-agent")):
        peer = objs[("NetworkPolicy", ns_name, name)]["spec"]["ingress"][-1]["from"][0]
        assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring", "team": "obs"}
    # off: no NetworkPolicy at all
    off = helm_template(helm, "--set", "networkPolicy.enabled=false")
    assert not [o for o in off if o["kind"] == "NetworkPolicy"]


def test_the_node_watch_gets_its_permission_and_a_not_ready_extender_never_holds_a_drain(helm):
    rules = by_key(helm_template(helm))[("ClusterRole", "", "joulesched-extender")]["rules"]
    assert not [r for r in rules if "nodes" in r["resources"]], "no node rights unless the node watch is on"
    objs = by_key(helm_template(helm, "--set", "extender.config.servers.watch_nodes=true"))
    rules = objs[("ClusterRole", "", "joulesched-extender")]["rules"]
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]} in rules  # extender/kube.py: list_node
    pdb = objs[("PodDisruptionBudget", NAMESPACE, "joulesched-extender")]["spec"]
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow", "both replicas not ready (Prometheus down) must not hold a drain"
    # The pods are listed and watched only by the pod watch (extender/kube.py: PodBindingWatch).
    pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
    assert pods in rules
    objs = by_key(helm_template(helm, "--set", "extender.config.predicted_load.watch_pods=false"))
    assert pods not in (objs[("ClusterRole", "", "joulesched-extender")]["rules"] or [])


def test_mutual_tls_between_kube_scheduler_and_the_extender(helm):
    # Off by default (the render equals deploy/'s); on, both ends get their Secret and the
    # configs point at the mounted files (tests/e2e/test_chart_e2e.py runs them in the real
    # kube-scheduler).
    def entry_and_config(*extra: str) -> tuple[dict[str, Any], dict[str, Any], dict[tuple[str, str, str], dict[str, Any]]]:
        objs = by_key(helm_template(helm, *extra))
        sched = yaml.safe_load(objs[("ConfigMap", NAMESPACE, "joulesched-scheduler-config")]["data"]["scheduler-config.yaml"])
        ext = yaml.safe_load(objs[("ConfigMap", NAMESPACE, "joulesched-extender")]["data"]["config.yaml"])
        return sched["extenders"][0], ext, objs

    entry, ext, _ = entry_and_config()
    assert entry["enableHTTPS"] is False and entry["urlPrefix"].startswith("http://") and "tlsConfig" not in entry
    assert "tls" not in ext["server"]
    entry, ext, objs = entry_and_config("--set", "extender.tls.enabled=true", "--set", "extender.tls.serverSecret=srv",
                                        "--set", "extender.tls.clientSecret=cli")
    assert entry["enableHTTPS"] is True and entry["urlPrefix"] == f"https://joulesched-extender.{NAMESPACE}.svc:8888/scheduler"
    assert entry["tlsConfig"] == {f"{k}File": f"/etc/kubernetes/extender-tls/{f}" for k, f in
                                  (("cert", "tls.crt"), ("key", "tls.key"), ("ca", "ca.crt"))}
    assert ext["server"]["tls"] == {"cert_file": "/etc/joulesched-tls/tls.crt", "key_file": "/etc/joulesched-tls/tls.key",
                                    "client_ca_file": "/etc/joulesched-tls/ca.crt"}
    for name, secret, path in (("joulesched-extender", "srv", "/etc/joulesched-tls"),
                               ("joulesched-scheduler", "cli", "/etc/kubernetes/extender-tls")):
        spec = pod_spec(objs[("Deployment", NAMESPACE, name)])
        volume = next(v["name"] for v in spec["volumes"] if v.get("secret", {}).get("secretName") == secret)
        mounts = [m for c in spec["containers"] for m in c["volumeMounts"] if m["name"] == volume]
        assert [(m["mountPath"], m.get("readOnly")) for m in mounts] == [(path, True)], name
    extender = pod_spec(objs[("Deployment", NAMESPACE, "joulesched-extender")])["containers"][0]
    assert {extender[p]["httpGet"]["scheme"] for p in ("readinessProbe", "livenessProbe", "startupProbe")} == {"HTTPS"}


@pytest.mark.parametrize("selector", [None, 'job="kubernetes-pods",namespace=~"joulesched.*"', ""])
def test_the_expander_reads_the_series_the_extender_reads(helm, selector):
    escaped = (selector or "").replace(",", "\\,")  # --set separates assignments with commas
    extra = [] if selector is None else ["--set-string", f"extender.config.profiles.prometheus.selector={escaped}"]
    objs = by_key(helm_template(helm, "--set", "expander.enabled=true", *extra))
    ext = yaml.safe_load(objs[("ConfigMap", NAMESPACE, "joulesched-extender")]["data"]["config.yaml"])
    args = pod_spec(objs[("Deployment", NAMESPACE, "joulesched-expander")])["containers"][0]["args"]
    given = [a.removeprefix("--prometheus-selector=") for a in args if a.startswith("--prometheus-selector=")]
    want = ext["profiles"]["prometheus"]["selector"]
    assert want == ('job="joulesched-agent"' if selector is None else selector)
    assert given == ([want] if want else [])
