"""`joulesched deferrer` against the real kube-apiserver and kube-scheduler.

The deferrer runs as a subprocess with deploy/deferrer's RBAC and admission policy (its
ServiceAccount's token: the policy lets it remove only its gate), a
site file whose carbon series is written here (hourly, dirty now, clean two to four hours
ahead) and ``--clock-offset`` to stand in the future. Gated pods stay Pending with the gate
(kube-scheduler reports them SchedulingGated); bad and expired terms are released at once; the
leader is SIGKILLed with pods held, the standby takes the Lease over and keeps them held (its
clock is still in the dirty hours); it is SIGKILLed too, and a replica standing in the clean
hour releases them: every pod released exactly once (one Event each, the replicas' counters
add up to the pod count), only its own gate removed, then bound by kube-scheduler.

The webhook test registers deploy/deferrer/webhook.yaml's webhook with a URL and the CA of a
certificate made here: the apiserver itself calls it over TLS on pod creation.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from binaries import REPO_ROOT
from cluster import ControlPlane
from dryrun import POLICY_KINDS, wait_until_the_deferrer_policy_is_enforced
from processes import ManagedProcess, _wait_until

from joulesched.contracts.net import free_port

DEPLOY = REPO_ROOT / "deploy" / "deferrer"
NAMESPACE = "joulesched"
SA = "joulesched-deferrer"
LEASE = "joulesched-deferrer"
GATE = "joulesched.io/deferred"
OTHER_GATE = "example.com/hold"
SITE_LABEL = "joulesched.io/site"
H = 3600
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


@pytest.fixture(scope="module")
def deferrer_kubeconfig(control_plane: ControlPlane):
    """deploy/deferrer's RBAC and admission policy applied for real; a kubeconfig with its
    ServiceAccount's token, once the apiserver enforces the policy (deleted after the module:
    the cluster is session-wide, and tests/e2e/test_deploy_e2e.py expects it absent)."""
    cp = control_plane
    cp.create_namespace(NAMESPACE)
    objs = [d for d in yaml.safe_load_all(cp.kubectl("kustomize", str(DEPLOY)).stdout) if d]
    rbac = [o for o in objs if o["kind"] in RBAC_KINDS | POLICY_KINDS]
    assert {o["kind"] for o in rbac} == RBAC_KINDS | POLICY_KINDS
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    kubeconfig = cp.service_account_kubeconfig(NAMESPACE, SA)
    from kubernetes import client
    from kubernetes import config as kconfig

    api = client.CoreV1Api(kconfig.new_client_from_config(config_file=str(kubeconfig)))
    wait_until_the_deferrer_policy_is_enforced(cp, api)
    yield kubeconfig
    cp.kubectl("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(
        [o for o in rbac if o["kind"] in POLICY_KINDS]))


@pytest.fixture
def site_file(tmp_path: Path) -> tuple[Path, float]:
    """Site ``north``: 400 gCO2e/kWh until the clean hours, 50 for two hours, 400 after; returns
    the file and the clean hours' start (two to three hours from now)."""
    h0 = (int(time.time()) // H - 1) * H
    clean = h0 + 4 * H
    rows = ["timestamp,avg_CI"]
    for k in range(40):
        t = h0 + k * H
        rows.append(f"{t},{50 if clean <= t < clean + 2 * H else 400}")
    (tmp_path / "north.csv").write_text("\n".join(rows) + "\n")
    path = tmp_path / "sites.yaml"
    path.write_text(yaml.safe_dump({"sites": {"north": {"carbon_series": {"file": "north.csv", "outside": "error"}}}}))
    return path, float(clean)


class Deferrer(ManagedProcess):
    def __init__(
        self, tmp: Path, name: str, site_file: Path, kubeconfig: Path, namespace: str, offset: float, *extra: str
    ) -> None:
        self.port = free_port()
        argv = [
            sys.executable,
            "-m",
            "joulesched.cli",
            "deferrer",
            "--site-file",
            str(site_file),
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            namespace,
            "--interval",
            "1",
            "--step",
            "300",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--identity",
            name,
            "--lease-namespace",
            NAMESPACE,
            "--lease-duration",
            "4",
            "--renew-deadline",
            "3",
            "--retry-period",
            "0.5",
            "--clock-offset",
            str(offset),
            *extra,
        ]
        super().__init__(
            f"deferrer[{name}]",
            argv,
            tmp / f"deferrer-{name}.log",
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            cwd=REPO_ROOT,
        )

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=3) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def role(self) -> str:
        code, body = self.get("/readyz")
        return str(json.loads(body)["role"]) if code == 200 else ""

    def metric(self, name: str, **labels: str) -> float:
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        raise AssertionError(f"{want} not exported by {self.name}")

    def released(self) -> float:
        return sum(
            self.metric("joulesched_deferrer_released_total", reason=r)
            for r in ("clean", "deadline", "expired", "no_forecast", "invalid")
        )

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        self.stop()


@pytest.fixture
def deferrers(tmp_path: Path):
    started: list[Deferrer] = []

    def start(*args: Any, **kw: Any) -> Deferrer:
        d = Deferrer(tmp_path, *args, **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def no_lease(control_plane: ControlPlane):
    control_plane.kubectl("delete", "lease", LEASE, "-n", NAMESPACE, "--ignore-not-found")
    yield
    control_plane.kubectl("delete", "lease", LEASE, "-n", NAMESPACE, "--ignore-not-found")


def gated_pod(
    cp: ControlPlane,
    name: str,
    ns: str,
    annotations: dict[str, str],
    gates: list[str] = (GATE,),
    labels: dict[str, str] | None = None,
) -> None:
    cp.create_pod(
        name,
        ns,
        cpu="100m",
        memory="64Mi",
        annotations=annotations,
        labels=labels,
        node_selector={SITE_LABEL: "north"},
        spec_overrides={"schedulingGates": [{"name": g} for g in gates]} if gates else None,
    )


def pod_gates(cp: ControlPlane, name: str, ns: str) -> list[str]:
    pod = cp.core.read_namespaced_pod(name, ns)
    return [g.name for g in pod.spec.scheduling_gates or []]


def scheduled_reason(cp: ControlPlane, name: str, ns: str) -> str:
    pod = cp.core.read_namespaced_pod(name, ns)
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled":
            return str(c.reason or c.status)
    return ""


def deferrer_events(cp: ControlPlane, ns: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ev in cp.core.list_namespaced_event(ns).items:
        if ev.source and ev.source.component == "joulesched-deferrer":
            out.setdefault(ev.involved_object.name, []).append(ev.reason)
    return out


def bound(cp: ControlPlane, ns: str, *names: str) -> bool:
    return all(cp.pod_node(n, ns) for n in names)


def test_deferrer_rbac_is_what_it_needs_and_no_more(control_plane, deferrer_kubeconfig):
    cp = control_plane

    def can(verb: str, resource: str, *extra: str) -> bool:
        r = cp.kubectl(
            "auth", "can-i", verb, resource, *extra, f"--as=system:serviceaccount:{NAMESPACE}:{SA}", check=False
        )
        return r.stdout.strip().split(" ", 1)[0] == "yes"

    for verb in ("list", "watch", "patch"):
        assert can(verb, "pods", "-A")
    assert can("create", "events", "-n", "default")
    assert can("get", f"leases.coordination.k8s.io/{LEASE}", "-n", NAMESPACE)
    assert can("update", f"leases.coordination.k8s.io/{LEASE}", "-n", NAMESPACE)
    for verb, resource, *extra in [
        ("get", "pods", "-A"),
        ("update", "pods", "-A"),
        ("delete", "pods", "-A"),
        ("create", "pods/binding", "-A"),
        ("patch", "nodes"),
        ("get", "secrets", "-A"),
        ("update", "leases.coordination.k8s.io/other", "-n", NAMESPACE),
        ("create", "leases.coordination.k8s.io", "-n", "default"),
    ]:
        assert not can(verb, resource, *extra), (verb, resource)


def test_release_patch_is_refused_once_the_gate_is_gone(control_plane, e2e_namespace):
    """The apiserver applies the deferrer's JSON patch once; the same patch again (a second
    controller on a stale view) fails its test op, and another controller's gate survives."""
    from kubernetes.client.exceptions import ApiException

    from joulesched.extender.deferrer import release_patch

    cp, ns = control_plane, e2e_namespace
    gated_pod(cp, "p", ns, {"joulesched.io/max-delay-seconds": "3600"}, gates=[GATE, OTHER_GATE])
    ops = release_patch([{"name": GATE}, {"name": OTHER_GATE}])
    cp.core.patch_namespaced_pod("p", ns, ops)
    assert pod_gates(cp, "p", ns) == [OTHER_GATE]
    with pytest.raises(ApiException) as err:
        cp.core.patch_namespaced_pod("p", ns, ops)
    assert err.value.status == 422, err.value
    assert pod_gates(cp, "p", ns) == [OTHER_GATE]


def test_held_until_the_clean_hour_across_kills_and_a_lease_takeover(
    control_plane, deferrer_kubeconfig, site_file, deferrers, no_lease, e2e_namespace, node_factory, scheduler_factory
):
    cp, ns = control_plane, e2e_namespace
    sites, clean = site_file
    node_factory(f"north-{uuid.uuid4().hex[:6]}", cpu="8", memory="16Gi", labels={SITE_LABEL: "north"})
    scheduler_factory(None)
    terms = {"joulesched.io/max-delay-seconds": str(12 * H), "joulesched.io/expected-runtime-seconds": "1800"}
    waiting = ["wait-0", "wait-1", "wait-2"]
    for name in waiting:
        gated_pod(cp, name, ns, terms)
    gated_pod(cp, "two-gates", ns, terms, gates=[OTHER_GATE, GATE])
    gated_pod(cp, "bad", ns, {"joulesched.io/max-delay-seconds": "soon"})
    gated_pod(cp, "late", ns, {"joulesched.io/deadline": "2020-01-01T00:00:00Z"})
    held = [*waiting, "two-gates"]

    # two replicas in the dirty hours: one leads, one stands by
    r1 = deferrers("r1", sites, deferrer_kubeconfig, ns, 0.0)
    _wait_until(lambda: r1.role() == "leader", 30, what="r1 leads", proc=r1)
    r2 = deferrers("r2", sites, deferrer_kubeconfig, ns, 0.0)
    _wait_until(lambda: r2.role() == "standby", 30, what="r2 stands by", proc=r2)
    _wait_until(lambda: bound(cp, ns, "bad", "late"), 30, what="bad and late bound", proc=r1)
    _wait_until(lambda: r1.metric("joulesched_deferrer_pods_held") == len(held), 15, what="4 held", proc=r1)
    assert r1.metric("joulesched_deferrer_released_total", reason="invalid") == 1
    assert r1.metric("joulesched_deferrer_released_total", reason="expired") == 1
    released_by_r1 = r1.released()
    assert r2.released() == 0 and r2.metric("joulesched_deferrer_leader") == 0
    for name in held:
        assert GATE in pod_gates(cp, name, ns) and cp.pod_node(name, ns) is None
        assert scheduled_reason(cp, name, ns) == "SchedulingGated"

    # the leader dies with pods held: the standby takes over once the Lease expires
    r1.kill()
    _wait_until(lambda: r2.role() == "leader", 30, what="r2 takes the Lease over", proc=r2)
    lease = cp.kubectl("get", "lease", LEASE, "-n", NAMESPACE, "-o", "json").stdout
    assert json.loads(lease)["spec"]["holderIdentity"] == "r2"
    _wait_until(lambda: r2.metric("joulesched_deferrer_pods_held") == len(held), 15, what="r2 holds 4", proc=r2)
    time.sleep(2)  # a couple of its ticks: still the dirty hours, nothing released
    assert r2.released() == 0
    assert all(GATE in pod_gates(cp, n, ns) for n in held)

    # it dies too; a replica standing in the clean hours resumes and releases them
    r2.kill()
    r3 = deferrers("r3", sites, deferrer_kubeconfig, ns, clean + 60 - time.time())
    _wait_until(lambda: bound(cp, ns, *waiting), 40, what="the waiting pods bound", proc=r3)
    _wait_until(
        lambda: pod_gates(cp, "two-gates", ns) == [OTHER_GATE], 10, what="two-gates keeps its other gate", proc=r3
    )
    assert r3.metric("joulesched_deferrer_released_total", reason="clean") == len(held)
    assert r3.metric("joulesched_deferrer_deadlines_missed_total") == 0
    assert r3.metric("joulesched_deferrer_avoided_grams_total") > 0
    assert cp.pod_node("two-gates", ns) is None  # still held, by the other controller's gate
    # each pod released exactly once: one Event each, and the replicas' counters add up
    assert released_by_r1 + r3.released() == 6
    assert r3.get("/healthz")[0] == 200
    events = deferrer_events(cp, ns)
    assert events == {**{n: ["Released"] for n in held}, "bad": ["InvalidDeferral"], "late": ["Released"]}


def test_two_active_controllers_release_each_pod_once(
    control_plane, deferrer_kubeconfig, site_file, deferrers, e2e_namespace
):
    """Without the Lease (a split brain), two controllers on the same pods: the test op makes
    every release happen once."""
    cp, ns = control_plane, e2e_namespace
    sites, clean = site_file
    names = [f"p{i}" for i in range(12)]
    for name in names:
        gated_pod(cp, name, ns, {"joulesched.io/max-delay-seconds": str(12 * H)}, gates=[GATE, OTHER_GATE])
    offset = clean + 60 - time.time()
    a = deferrers("a", sites, deferrer_kubeconfig, ns, offset, "--no-leader-elect")
    b = deferrers("b", sites, deferrer_kubeconfig, ns, offset, "--no-leader-elect")
    _wait_until(lambda: all(pod_gates(cp, n, ns) == [OTHER_GATE] for n in names), 40, what="all released", proc=a)
    time.sleep(2)  # let both settle: nothing more may happen
    assert a.released() + b.released() == len(names)
    assert deferrer_events(cp, ns) == {n: ["Released"] for n in names}


def test_webhook_gates_opting_in_pods_through_the_apiserver(
    control_plane,
    deferrer_kubeconfig,
    site_file,
    deferrers,
    no_lease,
    e2e_namespace,
    tmp_path,
    node_factory,
    scheduler_factory,
):
    cp, ns = control_plane, e2e_namespace
    sites, _ = site_file
    crt, key = cp.pki.sign(
        f"deferrer-webhook-{uuid.uuid4().hex[:6]}",
        "/CN=joulesched-deferrer.joulesched.svc",
        server=True,
        sans=["IP:127.0.0.1"],
    )
    port = free_port()
    d = deferrers(
        "w",
        sites,
        deferrer_kubeconfig,
        ns,
        0.0,
        "--webhook-listen",
        f"127.0.0.1:{port}",
        "--tls-cert",
        str(crt),
        "--tls-key",
        str(key),
    )
    _wait_until(lambda: d.role() == "leader", 30, what="the deferrer leads", proc=d)
    hook = yaml.safe_load((DEPLOY / "webhook.yaml").read_text())
    name = f"joulesched-deferrer-e2e-{uuid.uuid4().hex[:6]}"
    hook["metadata"] = {"name": name}
    for w in hook["webhooks"]:
        w["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}/mutate",
            "caBundle": base64.b64encode(cp.pki.ca_crt.read_bytes()).decode(),
        }
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(hook))
    try:
        node_factory(f"north-{uuid.uuid4().hex[:6]}", cpu="8", memory="16Gi", labels={SITE_LABEL: "north"})
        scheduler_factory(None)
        opt_in = {"joulesched.io/deferrable": "true"}
        terms = {"joulesched.io/max-delay-seconds": str(12 * H)}

        def webhook_up() -> bool:  # the apiserver picks the configuration up within a second or so
            probe = f"probe-{uuid.uuid4().hex[:6]}"
            gated_pod(cp, probe, ns, terms, gates=[], labels=opt_in)
            return GATE in pod_gates(cp, probe, ns)

        _wait_until(webhook_up, 20, interval=0.5, what="the apiserver calls the webhook", proc=d)
        gated_pod(cp, "gated", ns, terms, gates=[OTHER_GATE], labels=opt_in)
        gated_pod(cp, "no-label", ns, terms, gates=[])
        gated_pod(cp, "no-terms", ns, {}, gates=[], labels=opt_in)
        assert pod_gates(cp, "gated", ns) == [OTHER_GATE, GATE]
        assert pod_gates(cp, "no-label", ns) == [] and pod_gates(cp, "no-terms", ns) == []
        # malformed terms: created ungated, and kubectl shows the webhook's warning
        bad = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "bad",
                "namespace": ns,
                "labels": opt_in,
                "annotations": {"joulesched.io/max-delay-seconds": "soon"},
            },
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
        }
        r = cp.kubectl("create", "-f", "-", input=yaml.safe_dump(bad))
        assert "joulesched.io/max-delay-seconds" in r.stderr and "Warning" in r.stderr, r.stderr
        assert pod_gates(cp, "bad", ns) == []
        # the gated pod is held in the dirty hours (the deferrer is at offset 0)
        time.sleep(2)
        assert GATE in pod_gates(cp, "gated", ns) and cp.pod_node("no-label", ns)
    finally:
        cp.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")
    code, body = d.get("/readyz")
    assert code == 200 and json.loads(body)["webhook"].startswith("serving"), body


def test_bad_site_file_is_an_error_naming_it(tmp_path, deferrer_kubeconfig):
    bad = tmp_path / "sites.yaml"
    bad.write_text("sites:\n  north:\n    carbon_series: {file: missing.csv}\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "joulesched.cli",
            "deferrer",
            "--site-file",
            str(bad),
            "--kubeconfig",
            str(deferrer_kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
    )
    assert r.returncode == 2 and "missing.csv" in r.stderr, r.stderr
