"""The chain as an operator installs it, end to end, from live measurements to bindings.

    agent image (podman, runc) ×2, each on its own replica node tree (powercap, /proc/stat)
      → a real Prometheus scraping them with the shipped scrape job
        (deploy/agent/prometheus/scrape-config.yaml: interval, timeout, path, relabelling) over
        the agent pods of the real kube-apiserver, and loading the shipped recording rules
        (deploy/prometheus/rules.yaml)
      → the extender image (podman) with the shipped config (deploy/extender/config.yaml) and
        its ``prometheus`` profile source
      → the real kube-scheduler with the shipped KubeSchedulerConfiguration
        (deploy/scheduler/scheduler-config.yaml), as the shipped ServiceAccount
      → pods bound on the node whose measured watts per core are lowest;
    then the replicas' power changes, the agents refit, and the next pods go to the other node.

What differs from a cluster, and why: there is no kubelet, so the two agent pods are API objects
whose status the test sets (podIP 127.0.0.1, each its own port) for Prometheus' pod discovery, and
the containers run beside them with podman on the host network. Debian's Prometheus is built
without kubernetes_sd, so the test lists the agent namespace's pods from the apiserver and
writes them as a file_sd target file with the labels kubernetes_sd gives (one target per
container port, ``__meta_kubernetes_pod_*``): the shipped relabelling then keeps the agents'
metrics ports and drops the rest, as it would in a cluster. The scheduler and the extender
reach the apiserver with their ServiceAccounts' tokens; every address is a loopback port. The agents' config is the shipped one with the Kubernetes API off (pods are
not attributed here), a site file (the shipped policy is ``carbon``), and a 20-sample model
window instead of 900 (15 minutes at 1 s), so that the change is fitted within the test.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from binaries import REPO_ROOT
from cluster import ControlPlane
from e2e_extender import deploy_scheduler_config

from joulesched.contracts import names
from joulesched.contracts.net import free_port
from tests.images import RUN, built_images, image_size_mb, podman, require_podman
from tests.measurement.replica import CgroupTree, PowercapTree, ProcTree
from tests.prometheus_server import PrometheusServer
from tests.prometheus_server import require as require_prometheus

DEPLOY = REPO_ROOT / "deploy"
NAMESPACE = "joulesched"
AGENT_NAMESPACE = "joulesched-agent"
# Room for the measured load (at most 7 busy cores) plus the pods the test places: a node whose
# utilisation with the pod would pass 1 is demoted as saturated (policy.avoid_saturation).
CPUS = 16
# The node a cycle of busy cores (held one second each) runs through: spread enough for a fit.
BUSY_CYCLE = (1.0, 3.0, 6.0, 2.0, 7.0, 4.0, 5.0, 1.5)
STEP = 0.05  # seconds between replica updates (the agents sample every second)

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]


class ReplicaNode:
    """A node's kernel trees, changed as a running node's are: energy and CPU time advance."""

    def __init__(self, root: Path, idle_watts: float, watts_per_core: float, phase: int) -> None:
        self.root = root
        self.powercap = PowercapTree(root / "sys")
        self.powercap.add("intel-rapl:0", "package-0", energy_uj=10_000_000)
        self.proc = ProcTree(root / "proc", cpus=CPUS)
        CgroupTree(root / "cgroup")
        self.idle_watts, self.watts_per_core = idle_watts, watts_per_core
        self.phase = phase
        self.busy = 0.0
        self.idle = 0.0

    def advance(self, t: float, dt: float) -> None:
        # By the time that really passed, so that a late update (a loaded machine) adds no error.
        cores = BUSY_CYCLE[(int(t) + self.phase) % len(BUSY_CYCLE)]
        self.powercap.advance("intel-rapl:0", (self.idle_watts + self.watts_per_core * cores) * dt)
        self.busy += cores * dt
        self.idle += (CPUS - cores) * dt
        self.proc.set_stat(self.busy, self.idle)


class Replicas:
    def __init__(self, nodes: dict[str, ReplicaNode]) -> None:
        self.nodes = nodes
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()
        self._thread.start()

    def set_power(self, node: str, idle_watts: float, watts_per_core: float) -> None:
        with self.lock:
            self.nodes[node].idle_watts, self.nodes[node].watts_per_core = idle_watts, watts_per_core

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(STEP):
            now = time.monotonic()
            with self.lock:
                for node in self.nodes.values():
                    node.advance(now - self._started, now - last)
            last = now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def wait(what: str, check: Any, timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def readable(path: Path) -> Path:
    # The extender runs as UID 65532: its mounted files must be world-readable.
    path.chmod(0o755 if path.is_dir() else 0o644)
    return path


def inline_kubeconfig(path: Path) -> dict[str, Any]:
    """A kubeconfig with its CA inline (the container sees none of the host's files)."""
    cfg = yaml.safe_load(path.read_text())
    for cluster in cfg["clusters"]:
        ca = Path(cluster["cluster"].pop("certificate-authority"))
        cluster["cluster"]["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
    return cfg


def rendered_rbac(cp: ControlPlane) -> list[dict[str, Any]]:
    objs = [d for d in yaml.safe_load_all(cp.kubectl("kustomize", str(DEPLOY)).stdout) if d]
    return [
        o for o in objs if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]


def agent_pod(node: str, port: int, image: str) -> dict[str, Any]:
    """The pod the DaemonSet would make on ``node``, as far as Prometheus' discovery reads it."""
    ds = yaml.safe_load((DEPLOY / "agent" / "base" / "daemonset.yaml").read_text())
    spec = copy.deepcopy(ds["spec"]["template"]["spec"])
    container = spec["containers"][0]
    container["image"] = image
    container["ports"][0]["containerPort"] = port
    spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"joulesched-agent-{node}", "namespace": AGENT_NAMESPACE,
                     "labels": ds["spec"]["template"]["metadata"]["labels"]},
        "spec": spec,
    }  # fmt: skip


def shipped_scrape_job(targets_file: Path) -> dict[str, Any]:
    """deploy/agent/prometheus/scrape-config.yaml's job: its interval, timeout, path and relabelling
    verbatim; its pod discovery replaced by a file (Debian's Prometheus is built without
    kubernetes_sd), which :func:`discover_agent_pods` writes from the apiserver's pods."""
    (job,) = yaml.safe_load((DEPLOY / "agent" / "prometheus" / "scrape-config.yaml").read_text())["scrape_configs"]
    (sd,) = job.pop("kubernetes_sd_configs")
    assert sd["role"] == "pod" and sd["namespaces"]["names"] == [AGENT_NAMESPACE], sd
    job["file_sd_configs"] = [{"files": [str(targets_file)], "refresh_interval": "1s"}]
    return job


def discover_agent_pods(cp: ControlPlane, targets_file: Path) -> int:
    """What Prometheus' kubernetes_sd (role: pod) makes of the agent namespace's pods: one target per
    container port, address podIP:port, with the __meta_kubernetes_pod_* labels the shipped
    relabelling reads (prometheus/discovery/kubernetes/pod.go). Returns the number of targets."""
    (sd,) = yaml.safe_load((DEPLOY / "agent" / "prometheus" / "scrape-config.yaml").read_text())["scrape_configs"][0][
        "kubernetes_sd_configs"
    ]
    groups = []
    for namespace in sd["namespaces"]["names"]:
        for pod in cp.core.list_namespaced_pod(namespace).items:
            if not pod.status.pod_ip:
                continue
            base = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod.metadata.name,
                    "__meta_kubernetes_pod_node_name": pod.spec.node_name or "",
                    "__meta_kubernetes_pod_ip": pod.status.pod_ip}  # fmt: skip
            for key, value in (pod.metadata.labels or {}).items():
                base["__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in key)] = value
            for container in pod.spec.containers:
                for port in container.ports or []:
                    labels = {**base, "__meta_kubernetes_pod_container_name": container.name,
                              "__meta_kubernetes_pod_container_port_name": port.name or "",
                              "__meta_kubernetes_pod_container_port_number": str(port.container_port)}  # fmt: skip
                    groups.append({"targets": [f"{pod.status.pod_ip}:{port.container_port}"], "labels": labels})
    tmp = targets_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(targets_file)
    return len(groups)


def ask(url: str, verb: str, nodes: list[str]) -> bytes:
    """POST a kube-scheduler ExtenderArgs for a 1-core pod to ``verb``; OSError while it starts."""
    pod = {"metadata": {"name": "probe", "namespace": "default", "uid": str(uuid.uuid4())},
           "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "memory": "256Mi"}}}]}}  # fmt: skip
    body = json.dumps({"Pod": pod, "NodeNames": nodes}).encode()
    request = urllib.request.Request(f"{url}/{verb}", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        data: bytes = reply.read()
        return data


def scores(url: str, nodes: list[str]) -> dict[str, int]:
    """The scores the extender would give kube-scheduler now ({} while it starts), from the
    explain verb: prioritize would count each probe as a placement on its top node (predicted
    load), and the probes would then load the node they favour."""
    try:
        return {n["node"]: n["score"] for n in json.loads(ask(url, "explain", nodes))["nodes"]}
    except OSError:
        return {}


def explain(url: str, nodes: list[str]) -> str:
    """The extender's why of each score, for a failure message."""
    try:
        return ask(url, "explain", nodes).decode()
    except OSError as err:
        return f"explain: {err}"


def prefers(url: str, best: str, other: str) -> bool:
    now = scores(url, [best, other])
    return bool(now) and now[best] > now[other]


def every_worker_prefers(url: str, best: str, other: str, timeout: float) -> None:
    """Until ``best`` wins 12 probes in a row, 0.5 s apart, each on a new connection.

    Each gunicorn worker keeps its own Prometheus cache and answers the first request after it
    went stale from the old profiles while it refreshes (extender/profiles.py): one probe that
    wins says that one worker has the change. A run of wins on fresh connections, which the
    kernel hands to either worker, says that every worker has it."""
    deadline = time.monotonic() + timeout
    streak = 0
    while streak < 12:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for every extender worker to prefer {best}")
        streak = streak + 1 if prefers(url, best, other) else 0
        time.sleep(0.5)


def fitted(prom: PrometheusServer) -> dict[str, float]:
    rows = prom.query(f'{names.MODEL_PER_CORE.name}{{device="cpu"}}')
    return {r["metric"]["node"]: float(r["value"][1]) for r in rows}


def place(cp: ControlPlane, prefix: str, namespace: str, scheduler_name: str, sel: dict[str, str]) -> list[str]:
    """Three 1-core pods for the joulesched scheduler, one after the other: the nodes they are bound to."""
    bound = []
    for i in range(3):
        cp.create_pod(
            f"{prefix}-{i}", namespace, scheduler_name=scheduler_name, cpu="1", memory="256Mi", node_selector=sel
        )
        bound.append(cp.wait_for_pod_scheduled(f"{prefix}-{i}", namespace, timeout=45))
    return bound


@pytest.fixture
def chain_containers() -> Iterator[list[str]]:
    names_: list[str] = []
    yield names_
    for name in names_:
        podman("rm", "-f", "-t", "2", name)


@pytest.mark.e2e
def test_live_measurements_place_pods_and_a_power_change_moves_them(
    control_plane, node_factory, scheduler_factory, e2e_namespace, tmp_path, chain_containers, request
):
    require_podman()
    require_prometheus("prometheus")
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    images, build_seconds = built_images()
    timings["image build (hack/build-image.sh --offline; cached layers)"] = build_seconds
    cp, tag = control_plane, uuid.uuid4().hex[:6]

    # -- the cluster side: namespaces, RBAC, two nodes, the agents' pods ------------------------
    cp.kubectl("apply", "-f", str(DEPLOY / "namespace.yaml"))
    request.addfinalizer(lambda: cp.delete_all_pods(AGENT_NAMESPACE))
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rendered_rbac(cp)))
    sel = {"e2e-test": f"chain-{tag}"}
    a, b = f"chain-a-{tag}", f"chain-b-{tag}"
    for node in (a, b):
        node_factory(node, cpu=str(CPUS), memory="32Gi", labels=sel)
    ports = {a: free_port(), b: free_port()}
    for node in (a, b):
        pod = agent_pod(node, ports[node], images["agent"])
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
        status = {"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                             "hostIP": "127.0.0.1"}}  # fmt: skip
        cp.core.patch_namespaced_pod_status(pod["metadata"]["name"], AGENT_NAMESPACE, status)

    # -- the replicas: a is the efficient node, b the hungry one --------------------------------
    replicas = Replicas({a: ReplicaNode(tmp_path / a, 40.0, 2.0, 0), b: ReplicaNode(tmp_path / b, 45.0, 9.0, 3)})
    try:
        # -- the agent image, twice, as the DaemonSet runs it ------------------------------------
        agent_cfg = yaml.safe_load((DEPLOY / "agent" / "base" / "agent.yaml").read_text())
        agent_cfg["kubernetes"] = {"mode": "off"}
        agent_cfg["model"] = {"window_samples": 20, "min_samples": 8}
        agent_cfg["node"] = {"site": "dc"}
        agent_cfg["sites"] = {"file": "/etc/joulesched/site.yaml"}
        ds = yaml.safe_load((DEPLOY / "agent" / "base" / "daemonset.yaml").read_text())
        shipped_args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        for node in (a, b):
            etc = tmp_path / f"etc-{node}"
            etc.mkdir()
            (etc / "agent.yaml").write_text(yaml.safe_dump(agent_cfg))
            (etc / "site.yaml").write_text(yaml.safe_dump({"sites": {"dc": {"pue": 1.2, "carbon_intensity": 300}}}))
            args = [
                x.replace("$(NODE_NAME)", node).replace("0.0.0.0:9102", f"127.0.0.1:{ports[node]}")
                for x in shipped_args
            ]
            assert args[1:] != shipped_args[1:] and args[0] == "agent"
            name = f"joulesched-chain-agent-{node}"
            chain_containers.append(name)
            root = replicas.nodes[node].root
            started = podman(
                "run", "-d", "--name", name, *RUN, "--network", "host", "--read-only", "--user", "0:0",
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--tmpfs", "/tmp:rw,size=16m",
                "-v", f"{root / 'sys' / 'class' / 'powercap'}:/host/sys/class/powercap:ro",
                "-v", f"{root / 'cgroup'}:/host/sys/fs/cgroup:ro", "-v", f"{root / 'proc'}:/host/proc:ro",
                "-v", f"{etc}:/etc/joulesched:ro", images["agent"], *args, "--log-format", "json",
            )  # fmt: skip
            assert started.returncode == 0, started.stderr

        # -- Prometheus: the shipped scrape job (pod discovery) and recording rules --------------
        prom = PrometheusServer(
            tmp_path / "prometheus",
            [],
            rule_files=[str(DEPLOY / "prometheus" / "rules.yaml")],
            scrape_configs=[shipped_scrape_job(tmp_path / "agent-pods.json")],
        )
        # two agent pods plus a pod of another app in the namespace, which the relabelling drops
        other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "not-an-agent", "namespace": AGENT_NAMESPACE,
                 "labels": {"app.kubernetes.io/name": "something-else"}},
                 "spec": {"nodeName": a, "serviceAccountName": "joulesched-agent", "containers": [{"name": "c", "image": "x",
                          "ports": [{"name": "metrics", "containerPort": free_port()}]}]}}  # fmt: skip
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(other))
        cp.core.patch_namespaced_pod_status(
            "not-an-agent", AGENT_NAMESPACE, {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
        )
        assert discover_agent_pods(cp, tmp_path / "agent-pods.json") == 3
        try:
            # -- the extender image with the shipped config ----------------------------------------
            ext_port = free_port()
            ext_etc = tmp_path / "etc-extender"
            ext_etc.mkdir()
            readable(ext_etc)
            shipped = yaml.safe_load((DEPLOY / "extender" / "config.yaml").read_text())
            config = copy.deepcopy(shipped)
            config["listen"] = f"127.0.0.1:{ext_port}"
            config["profiles"]["prometheus"]["url"] = prom.url
            config["kubeconfig"] = "/etc/joulesched/kubeconfig"
            kc = inline_kubeconfig(cp.service_account_kubeconfig(NAMESPACE, "joulesched-extender"))
            (ext_etc / "kubeconfig").write_text(yaml.safe_dump(kc))
            (ext_etc / "config.yaml").write_text(yaml.safe_dump(config))
            for f in ext_etc.iterdir():
                readable(f)
            ext_name = f"joulesched-chain-extender-{tag}"
            chain_containers.append(ext_name)
            started = podman(
                "run", "-d", "--name", ext_name, *RUN, "--network", "host", "--read-only",
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--tmpfs", "/tmp:rw,size=64m",
                "-e", "PROMETHEUS_MULTIPROC_DIR=/tmp/metrics", "-v", f"{ext_etc}:/etc/joulesched:ro",
                images["extender"], "extender", "--config", "/etc/joulesched/config.yaml", "--log-format", "json",
            )  # fmt: skip
            assert started.returncode == 0, started.stderr
            ext_url = f"http://127.0.0.1:{ext_port}{shipped['prefix']}"

            # -- the real kube-scheduler with the shipped configuration ----------------------------
            sched_cfg = deploy_scheduler_config()
            sched_cfg["extenders"][0]["urlPrefix"] = ext_url
            sched_cfg["clientConnection"] = {
                "kubeconfig": str(cp.service_account_kubeconfig(NAMESPACE, "joulesched-scheduler"))
            }
            sched = scheduler_factory(sched_cfg, name=f"chain-{tag}", leader_election=True)
            (scheduler_name,) = sched.scheduler_names
            timings["start: images run, Prometheus, kube-scheduler"] = time.monotonic() - t0 - build_seconds

            def logs() -> str:
                out = [f"explain now: {explain(ext_url, [a, b])}"]
                out += [f"{n}:\n{podman('logs', '--tail', '30', n).stderr}" for n in chain_containers]
                return (
                    "\n".join(out)
                    + f"\nscheduler:\n{sched.log_tail(20)}\nprometheus:\n{(tmp_path / 'prometheus' / 'prometheus.log').read_text()[-1500:]}"
                )

            # -- phase 1: the measured models reach the extender; pods go to a -------------------
            t1 = time.monotonic()
            try:
                wait(
                    "both agents discovered and scraped",
                    lambda: len(prom.query('up{job="joulesched-agent"} == 1')) == 2,
                    60,
                )
                wait("both nodes' fitted watts per core in Prometheus", lambda: len(fitted(prom)) == 2, 90)
                every_worker_prefers(ext_url, a, b, 90)
            except AssertionError as err:
                raise AssertionError(f"{err}\n{logs()}") from None
            per_core = fitted(prom)
            print(f"\nfitted watts per core, phase 1: {per_core}")
            assert math.isclose(per_core[a], 2.0, rel_tol=0.25) and math.isclose(per_core[b], 9.0, rel_tol=0.25), (
                per_core
            )
            # discovery relabelled instance to the node name, as the shipped job says
            assert {r["metric"]["instance"] for r in prom.query('up{job="joulesched-agent"}')} == {a, b}
            # the recording rules load and evaluate (every group healthy)
            with urllib.request.urlopen(f"{prom.url}/api/v1/rules", timeout=5) as reply:
                groups = json.loads(reply.read())["data"]["groups"]
            assert groups and all(r["health"] != "err" for g in groups for r in g["rules"]), groups
            bound = place(cp, "first", e2e_namespace, scheduler_name, sel)
            assert bound == [a, a, a], f"{bound}\n{logs()}"
            timings["phase 1: agents up to first pods bound on the measured-cheapest node"] = time.monotonic() - t1

            # -- phase 2: the replicas' power changes; the next pods go to b ----------------------
            t2 = time.monotonic()
            replicas.set_power(a, 40.0, 10.0)
            replicas.set_power(b, 45.0, 1.5)
            try:
                wait(
                    "the agents to refit the new power",
                    lambda: (f := fitted(prom)).get(a, 0) > 8 and f.get(b, 99) < 3,
                    120,
                )
                every_worker_prefers(ext_url, b, a, 90)
            except AssertionError as err:
                raise AssertionError(f"{err}\n{logs()}") from None
            moved = place(cp, "next", e2e_namespace, scheduler_name, sel)
            assert moved == [b, b, b], f"{moved}\n{logs()}"
            timings["phase 2: power change to the next pods bound on the other node"] = time.monotonic() - t2

            # the extender was really called by the scheduler, and never failed
            log = sched.log_text()
            assert "Skipping extender" not in log and "forbidden" not in log.lower(), sched.log_tail(30)
            with urllib.request.urlopen(f"http://127.0.0.1:{ext_port}/metrics", timeout=5) as reply:
                metrics = reply.read().decode()
            # only kube-scheduler calls prioritize here (the probes use explain): once per pod at least
            called = re.search(r'joulesched_extender_requests_total\{code="200",verb="prioritize"\} (\S+)', metrics)
            assert called and float(called.group(1)) >= 6, metrics[-3000:]
            failed = [  # (every known verb and reason is exported from the start, at 0)
                line
                for line in metrics.splitlines()
                if line.startswith("joulesched_extender_failures_total{") and 'verb="prioritize"' in line
            ]
            assert failed and all(float(line.rsplit(" ", 1)[1]) == 0 for line in failed), failed
            assert "joulesched_build_info{" in metrics
            # the containers ran as the shipped pods do: the extender as 65532, the agent as 0
            assert podman("exec", ext_name, "id", "-u").stdout.strip() == "65532"
            for line in podman("logs", ext_name).stderr.splitlines():
                json.loads(line)  # --log-format json: every line an object
        finally:
            prom.stop()
    finally:
        replicas.stop()
    timings["total"] = time.monotonic() - t0
    sizes = {name: image_size_mb(image) for name, image in images.items()}
    print("\nchain timings (s): " + json.dumps({k: round(v, 1) for k, v in timings.items()}))
    print("image sizes (MB): " + json.dumps({k: round(v) for k, v in sizes.items()}))
