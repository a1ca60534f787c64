"""Replay a trace against a real kube-scheduler and check the simulator's model against it.

``joulesched sim run --scheduler kube`` talks to a running kube-apiserver (``--kubeconfig``):

1. It creates a namespace ``joulesched-sim-<run>`` and, for every node of the cluster spec, a
   Node object ``jsim-<run>-<node>`` (capacity = allocatable = the type's cores, memory,
   ``max_pods`` and ``nvidia.com/gpu``; Ready; labelled ``joulesched.io/sim-run=<run>`` and with
   the site's ``topology.kubernetes.io/zone``; tainted ``joulesched.io/sim-run=<run>:NoSchedule``
   so that no other pod lands there). Status is written through the status subresource and the
   ``not-ready`` taint that admission adds is removed, as a kubelet and the node lifecycle
   controller would. A probe pod then checks that the scheduler named ``--scheduler-name``
   binds pods and already sees every node.
2. It replays the workload event by event, in simulated time: a pod is created when it arrives
   (or when its parents finish), the replayer waits until the scheduler has bound it and reads
   the node back, and deletes it (force, grace 0) when it finishes on that node (``duration /
   speed`` later). Nothing else happens while a pod is being scheduled, so the real scheduler
   sees exactly the cluster state that the replayer records. ``--time-scale S`` paces the
   events at S simulated seconds per wall second; by default they go as fast as binding does.
   Pods are bare (no owner), with the trace's requests, a nodeSelector and a toleration for the
   run's nodes, and ``schedulerName``. A pod with a ``group`` is selected by a headless Service
   of that group, so the system default PodTopologySpread constraints apply to it, as the
   model assumes.
3. For every pod, at the moment it is created, :mod:`sim.kube`'s arithmetic scores every node
   from the real state (the pods really bound so far, minus the deleted ones). The pod
   **agrees** when the real node is among the model's best-scoring feasible nodes. When the
   model's best is shared by several nodes the pod is **tied**: kube-scheduler breaks ties at
   random, so tied pods are reported apart and agreement is counted among the others.

A pod that the model finds no room for is held back by the replayer, as the simulator's
scheduling queue holds it, and created once a deletion makes room: the real scheduler never
sees an unschedulable pod (its back-off timing would make the replay depend on wall-clock
time). If the real scheduler still refuses a pod the model thought fits, that is reported as a
disagreement. The autoscaler of the cluster spec is not replayed: every node exists throughout.

Everything created is deleted at the end (the namespace may stay ``Terminating`` on a cluster
without a namespace controller).
"""

from __future__ import annotations

import heapq
import json
import math
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from joulesched.sim import kube
from joulesched.sim.cluster import ZONE_LABEL, ClusterSpec
from joulesched.sim.errors import SimError
from joulesched.sim.model import PodSpec, Workload

PROFILES = ("default", "most-allocated")
SIM_LABEL = "joulesched.io/sim-run"
GROUP_LABEL = "joulesched.io/sim-group"
TYPE_LABEL = "joulesched.io/sim-node-type"
POD_ANNOTATION = "joulesched.io/sim-pod"
GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
FINISH, ARRIVE = 0, 1  # at equal times a pod finishes before the next arrives (as in sim.engine)


@dataclass(frozen=True)
class KubeOptions:
    kubeconfig: str | None = None  # None: $KUBECONFIG
    scheduler_name: str = "default-scheduler"
    profile: str = "default"  # the scoring the real scheduler uses: default | most-allocated
    seed: int = 0  # the model's tie-break (reported as its own pick)
    time_scale: float = 0.0  # simulated seconds per wall second; 0: as fast as binding allows
    bind_timeout: float = 30.0  # seconds to wait for one pod to be bound
    run_id: str = ""  # default: random


# -- the agreement arithmetic ------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """The model's view of one real placement."""

    top: tuple[int, ...]  # nodes with the model's best total among the feasible ones
    best: int | None  # that total (None: no feasible node)
    real: int | None  # the node the real scheduler chose (None: it refused the pod)
    real_score: int | None  # the model's total for the real node (None: refused, or not feasible)
    feasible: int  # how many nodes the model finds feasible

    @property
    def tied(self) -> bool:
        return len(self.top) > 1

    @property
    def agree(self) -> bool:
        return self.real is not None and self.real in self.top


def judge(feasible: np.ndarray, totals: np.ndarray, real: int | None) -> Verdict:
    """Compare a real placement with the model's totals over every node (``feasible``: mask)."""
    cand = np.flatnonzero(feasible)
    if len(cand) == 0:
        return Verdict((), None, real, None, 0)
    best = int(totals[cand].max())
    top = tuple(int(n) for n in cand[totals[cand] == best])
    real_score = int(totals[real]) if real is not None and feasible[real] else None
    return Verdict(top, best, real, real_score, len(cand))


def summarise(verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """Agreement counted among the pods whose best node is not tied; ties reported apart."""
    non_tied = [v for v in verdicts if not v.tied]
    tied = [v for v in verdicts if v.tied]
    agreements = sum(1 for v in non_tied if v.agree)
    return {
        "pods": len(verdicts),
        "non_tied": len(non_tied),
        "agreements": agreements,
        "agreement_percent": 100.0 * agreements / len(non_tied) if non_tied else None,
        "tied": len(tied),
        "tied_real_among_best": sum(1 for v in tied if v.agree),
        "single_feasible": sum(1 for v in verdicts if v.feasible == 1),
        "refused_by_real_scheduler": sum(1 for v in verdicts if v.real is None),
        "disagreements": sum(1 for v in verdicts if not v.agree),
    }


# -- the model, on the real state --------------------------------------------------------------


@dataclass
class PodNeeds:
    cpu: int  # millicores
    mem: int  # bytes
    gpu: int
    group: int  # -1: none

    @property
    def nz_cpu(self) -> int:
        return self.cpu if self.cpu > 0 else kube.DEFAULT_MILLI_CPU_REQUEST

    @property
    def nz_mem(self) -> int:
        return self.mem if self.mem > 0 else kube.DEFAULT_MEMORY_REQUEST


def needs_of(pod: PodSpec, group: int = -1) -> PodNeeds:
    return PodNeeds(kube.milli_cpu(pod.cpu_request), math.ceil(pod.memory_request), int(pod.gpu_request), group)


class ClusterState:
    """What is bound where, and kube-scheduler's filter and scores on it (:mod:`sim.kube`)."""

    def __init__(self, cluster: ClusterSpec, fit_strategy: str, groups: int = 0) -> None:
        nodes = cluster.nodes()
        types = [cluster.node_types[n.type_index] for n in nodes]
        self.n = len(nodes)
        self.strategy = fit_strategy
        self.alloc_cpu = np.array([kube.milli_cpu(t.cores) for t in types], dtype=np.int64)
        self.alloc_mem = np.array([math.ceil(t.memory_bytes) for t in types], dtype=np.int64)
        self.alloc_gpu = np.array([t.gpus.count for t in types], dtype=np.int64)
        self.max_pods = np.array([t.max_pods for t in types], dtype=np.int64)
        self.req_cpu = np.zeros(self.n, dtype=np.int64)
        self.req_mem = np.zeros(self.n, dtype=np.int64)
        self.req_gpu = np.zeros(self.n, dtype=np.int64)
        self.nz_cpu = np.zeros(self.n, dtype=np.int64)
        self.nz_mem = np.zeros(self.n, dtype=np.int64)
        self.npods = np.zeros(self.n, dtype=np.int64)
        zones = sorted({nd.zone for nd in nodes})
        self.zone_of = np.array([zones.index(nd.zone) for nd in nodes], dtype=np.int64)
        self.n_zones = len(zones)
        self.group_host = np.zeros((groups, self.n), dtype=np.int64)

    def feasible(self, p: PodNeeds) -> np.ndarray:
        """NodeResourcesFit's filter (and the pod count)."""
        fit = self.npods < self.max_pods
        if p.cpu:
            fit &= self.alloc_cpu - self.req_cpu >= p.cpu
        if p.mem:
            fit &= self.alloc_mem - self.req_mem >= p.mem
        if p.gpu:
            fit &= self.alloc_gpu - self.req_gpu >= p.gpu
        return fit

    def totals(self, p: PodNeeds, feasible: np.ndarray) -> np.ndarray:
        """The weighted sum of the non-constant score plugins on every node (0 where infeasible)."""
        strategy = "most" if self.strategy == "most" else "least"
        total = (
            kube.resource_fit_score(
                strategy, self.nz_cpu + p.nz_cpu, self.alloc_cpu, self.nz_mem + p.nz_mem, self.alloc_mem
            )
            * kube.WEIGHTS["NodeResourcesFit"]
        )
        if p.cpu or p.mem:  # BalancedAllocation skips best-effort pods
            total = total + kube.WEIGHTS["NodeResourcesBalancedAllocation"] * kube.balanced_allocation_score(
                self.req_cpu + p.cpu, self.alloc_cpu, self.req_mem + p.mem, self.alloc_mem, self.req_cpu, self.req_mem
            )
        if p.group >= 0 and feasible.any():
            cand = np.flatnonzero(feasible)
            host = self.group_host[p.group]
            zone_totals = np.bincount(self.zone_of, weights=host, minlength=self.n_zones).astype(np.int64)
            zones = self.zone_of[cand]
            spread = np.zeros(self.n, dtype=np.int64)
            spread[cand] = kube.topology_spread_scores(host[cand], zone_totals[zones], len(np.unique(zones)))
            total = total + kube.WEIGHTS["PodTopologySpread"] * spread
        return np.where(feasible, total, 0)

    def add(self, p: PodNeeds, node: int, sign: int = 1) -> None:
        self.req_cpu[node] += sign * p.cpu
        self.req_mem[node] += sign * p.mem
        self.req_gpu[node] += sign * p.gpu
        self.nz_cpu[node] += sign * p.nz_cpu
        self.nz_mem[node] += sign * p.nz_mem
        self.npods[node] += sign
        if p.group >= 0:
            self.group_host[p.group, node] += sign

    def remove(self, p: PodNeeds, node: int) -> None:
        self.add(p, node, -1)


# -- names and objects -------------------------------------------------------------------------


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` as a DNS-1123 label: lower case, ``[a-z0-9-]``, starting and ending alphanumeric."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return out[:limit].rstrip("-") or "x"


def quantity_cpu(milli: int) -> str:
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def node_body(name: str, run: str, node_type: str, zone: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                SIM_LABEL: run,
                TYPE_LABEL: dns_label(node_type),
                HOSTNAME_LABEL: name,
                ZONE_LABEL: dns_label(zone),
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {"taints": [{"key": SIM_LABEL, "value": run, "effect": "NoSchedule"}]},
    }


def node_status(name: str, cpu_milli: int, memory: int, pods: int, gpus: int) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": quantity_cpu(cpu_milli), "memory": str(memory), "pods": str(pods)}
    if gpus:
        resources[GPU_RESOURCE] = str(gpus)
    return {
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "joulesched sim node (no kubelet)",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v0.0.0-joulesched-sim",
                "kubeProxyVersion": "",
                "bootID": "",
                "containerRuntimeVersion": "",
                "kernelVersion": "",
                "machineID": "",
                "osImage": "",
                "systemUUID": "",
            },
        }
    }


def pod_body(
    name: str,
    namespace: str,
    run: str,
    scheduler: str,
    needs: PodNeeds,
    original: str,
    group: str = "",
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if needs.cpu:
        requests["cpu"] = quantity_cpu(needs.cpu)
    if needs.mem:
        requests["memory"] = str(needs.mem)
    if needs.gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(needs.gpu)
    container: dict[str, Any] = {"name": "main", "image": PAUSE_IMAGE}
    if requests:
        container["resources"] = {"requests": requests, **({"limits": limits} if limits else {})}
    labels = {SIM_LABEL: run}
    if group:
        labels[GROUP_LABEL] = dns_label(group)
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": {POD_ANNOTATION: original}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [container],
            "nodeSelector": dict(node_selector or {SIM_LABEL: run}),
            "tolerations": [{"key": SIM_LABEL, "operator": "Equal", "value": run, "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
        },
    }


# -- talking to the apiserver ------------------------------------------------------------------


def resolve_kubeconfig(path: str | None) -> str:
    chosen = path or os.environ.get("KUBECONFIG", "")
    if not chosen:
        raise SimError("--scheduler kube: give --kubeconfig FILE (or set $KUBECONFIG)")
    first = chosen.split(os.pathsep)[0]
    if not os.path.isfile(first):
        source = "--kubeconfig" if path else "$KUBECONFIG"
        raise SimError(f"{source} {first}: no such file")
    return first


class Api:
    """The few calls the replay makes, with errors turned into one-line :class:`SimError` s."""

    def __init__(self, kubeconfig: str, request_timeout: float = 10.0) -> None:
        from kubernetes import client, config

        self.kubeconfig = kubeconfig
        cfg = client.Configuration()
        try:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        except Exception as err:  # ConfigException, yaml errors, missing cert files
            raise SimError(f"--kubeconfig {kubeconfig}: cannot use it: {err}") from err
        self.server = cfg.host
        self.timeout = request_timeout
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.version_api = client.VersionApi(self.api)

    def call(self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False, **kw: Any) -> Any:
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        kw.setdefault("_request_timeout", self.timeout)
        try:
            return fn(*args, **kw)
        except ApiException as err:
            if missing_ok and err.status == 404:
                return None
            raise SimError(
                f"{what}: the apiserver at {self.server} answered {err.status} {err.reason}: {_message(err)}"
            ) from err
        except (HTTPError, OSError) as err:
            raise SimError(
                f"{what}: cannot reach the apiserver at {self.server} ({type(err).__name__}: {_short(err)})"
            ) from err

    def raw(self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False, **kw: Any) -> Any:
        """A call whose JSON answer is parsed here (much faster than the client's models)."""
        resp = self.call(what, fn, *args, missing_ok=missing_ok, _preload_content=False, **kw)
        return None if resp is None else json.loads(resp.data)

    def close(self) -> None:
        try:
            self.api.close()
        except Exception:  # pragma: no cover - best effort
            pass


def _message(err: Any) -> str:
    try:
        return str(json.loads(err.body).get("message", "")) or str(err.body)
    except (TypeError, ValueError, AttributeError):
        return _short(err.body or err)


def _short(err: Any) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."


# -- the replay --------------------------------------------------------------------------------


@dataclass
class Placement:
    index: int
    pod: str  # the trace's pod name
    k8s_name: str
    created_at: float = math.nan  # simulated seconds
    node: int | None = None
    end: float = math.nan
    verdict: Verdict | None = None
    model_pick: int | None = None
    totals: list[int] = field(default_factory=list)
    refused: str = ""  # FailedScheduling message, when the real scheduler refused it


@dataclass
class ReplayResult:
    summary: dict[str, Any]
    placements: list[Placement]
    node_names: list[str]
    k8s_node_names: list[str]
    server: str
    server_version: str
    namespace: str
    wall_seconds: float
    simulated_seconds: float
    notes: list[str]

    def disagreements(self) -> list[dict[str, Any]]:
        out = []
        for p in self.placements:
            v = p.verdict
            if v is None or v.agree:
                continue
            out.append(
                {
                    "pod": p.pod,
                    "time": p.created_at,
                    "real_node": self.node_names[v.real] if v.real is not None else None,
                    "real_score": v.real_score,
                    "refused": p.refused or None,
                    "model_nodes": [self.node_names[n] for n in v.top],
                    "model_score": v.best,
                    "tied": v.tied,
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        placed = [p for p in self.placements if p.verdict is not None]
        same_pick = sum(1 for p in placed if p.model_pick is not None and p.model_pick == p.node)
        return {
            **self.summary,
            "model_pick_same_node": same_pick,
            "never_placed": sum(1 for p in self.placements if p.verdict is None),
            "server": self.server,
            "server_version": self.server_version,
            "namespace": self.namespace,
            "wall_seconds": self.wall_seconds,
            "simulated_seconds": self.simulated_seconds,
            "disagreement_list": self.disagreements(),
            "notes": self.notes,
        }


class KubeReplay:
    def __init__(
        self,
        cluster: ClusterSpec,
        workload: Workload,
        opts: KubeOptions,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        if opts.profile not in PROFILES:
            raise SimError(f"--scheduler-profile: unknown profile {opts.profile!r} (known: {', '.join(PROFILES)})")
        if opts.time_scale < 0:
            raise SimError(f"--time-scale: must be >= 0, got {opts.time_scale}")
        if opts.bind_timeout <= 0:
            raise SimError(f"--bind-timeout: must be > 0, got {opts.bind_timeout}")
        if not workload.pods:
            raise SimError("--scheduler kube: the workload has no pods")
        self.cluster = cluster
        self.workload = workload
        self.opts = opts
        self.progress = progress
        self.run = dns_label(opts.run_id or uuid.uuid4().hex[:8], 20)
        self.namespace = f"joulesched-sim-{self.run}"
        self.nodes = cluster.nodes()
        self.k8s_nodes = [dns_label(f"jsim-{self.run}-{n.name}", 253) for n in self.nodes]
        groups: dict[str, int] = {}
        self.group_of = [groups.setdefault(p.group, len(groups)) if p.group else -1 for p in workload.pods]
        self.groups = list(groups)
        self.needs = [needs_of(p, g) for p, g in zip(workload.pods, self.group_of, strict=True)]
        self.state = ClusterState(cluster, "most" if opts.profile == "most-allocated" else "least", len(groups))
        self.rng = np.random.default_rng(opts.seed)
        types = [cluster.node_types[n.type_index] for n in self.nodes]
        self.speed = [t.speed for t in types]
        self.gpu_speed = [t.gpus.speed for t in types]
        width = len(str(len(workload.pods)))
        self.placements = [
            Placement(i, p.name, f"p{i:0{width}d}-{dns_label(p.name, 40)}") for i, p in enumerate(workload.pods)
        ]
        self.api: Api | None = None

    # -- set-up and clean-up

    def connect(self) -> str:
        self.api = Api(resolve_kubeconfig(self.opts.kubeconfig), request_timeout=max(10.0, self.opts.bind_timeout))
        info = self.api.call("reading the server version", self.api.version_api.get_code, _request_timeout=10)
        return str(getattr(info, "git_version", "") or "")

    def setup(self) -> None:
        api = self._api()
        core = api.core
        api.call(
            f"creating namespace {self.namespace}",
            core.create_namespace,
            {"metadata": {"name": self.namespace, "labels": {SIM_LABEL: self.run}}},
        )
        try:
            core.create_namespaced_service_account(self.namespace, {"metadata": {"name": "default"}})
        except Exception:  # a controller-manager may have made it already; pod creation says if not
            pass
        for g in self.groups:  # system default spreading applies to pods a Service selects
            api.call(
                f"creating Service for group {g!r}",
                core.create_namespaced_service,
                self.namespace,
                {
                    "metadata": {"name": dns_label(f"group-{g}"), "labels": {SIM_LABEL: self.run}},
                    "spec": {"clusterIP": "None", "selector": {GROUP_LABEL: dns_label(g)}, "ports": [{"port": 80}]},
                },
            )
        for node, name in zip(self.nodes, self.k8s_nodes, strict=True):
            nt = self.cluster.node_types[node.type_index]
            api.call(f"creating node {name}", core.create_node, node_body(name, self.run, nt.name, node.zone))
            # TaintNodesByCondition admission adds node.kubernetes.io/not-ready on create; a kubelet
            # and the node lifecycle controller would clear it. Keep only the run's own taint.
            api.call(
                f"removing the not-ready taint of node {name}",
                core.patch_node,
                name,
                {"spec": {"taints": [{"key": SIM_LABEL, "value": self.run, "effect": "NoSchedule"}]}},
            )
            i = self.k8s_nodes.index(name)
            status = node_status(
                name, int(self.state.alloc_cpu[i]), int(self.state.alloc_mem[i]), nt.max_pods, nt.gpus.count
            )
            api.call(f"writing the status of node {name}", core.patch_node_status, name, status)
        self._probe()

    def _probe(self) -> None:
        """A pod only the last node can take: bound once the scheduler sees every node as Ready."""
        api = self._api()
        name = "probe"
        needs = PodNeeds(1, 0, 0, -1)
        body = pod_body(
            name,
            self.namespace,
            self.run,
            self.opts.scheduler_name,
            needs,
            "probe",
            node_selector={SIM_LABEL: self.run, HOSTNAME_LABEL: self.k8s_nodes[-1]},
        )
        api.call(f"creating pod {self.namespace}/{name}", api.core.create_namespaced_pod, self.namespace, body)
        node, refused = self._wait_bound(name, probe=True)
        if node is None:
            raise SimError(
                f"probe pod {self.namespace}/{name}: scheduler {self.opts.scheduler_name!r} refused it: {refused}"
            )
        self._delete_pod(name)

    def cleanup(self) -> None:
        if self.api is None:
            return
        api = self.api
        selector = f"{SIM_LABEL}={self.run}"
        for what, fn, args in (
            ("deleting the run's pods", api.core.delete_collection_namespaced_pod, (self.namespace,)),
            ("deleting the run's nodes", api.core.delete_collection_node, ()),
        ):
            try:
                kw: dict[str, Any] = {"label_selector": selector}
                if what.endswith("pods"):
                    kw["grace_period_seconds"] = 0
                api.call(what, fn, *args, missing_ok=True, **kw)
            except SimError:
                pass
        for g in self.groups:
            try:
                api.call(
                    "", api.core.delete_namespaced_service, dns_label(f"group-{g}"), self.namespace, missing_ok=True
                )
            except SimError:
                pass
        try:
            api.call("", api.core.delete_namespace, self.namespace, missing_ok=True)
        except SimError:
            pass
        api.close()

    def _api(self) -> Api:
        assert self.api is not None
        return self.api

    # -- pods

    def _wait_bound(self, name: str, probe: bool = False) -> tuple[int | str | None, str]:
        """Wait for ``spec.nodeName``; ``(None, message)`` when the scheduler reports it unschedulable."""
        api = self._api()
        timeout = self.opts.bind_timeout
        deadline = time.monotonic() + timeout
        next_events = time.monotonic() + (timeout if probe else 1.0)
        delay = 0.002
        while True:
            pod = api.raw(f"reading pod {self.namespace}/{name}", api.core.read_namespaced_pod, name, self.namespace)
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                return node, ""
            now = time.monotonic()
            if now >= next_events:
                message = self._failed_scheduling(name)
                if message:
                    return None, message
                next_events = now + 1.0
            if now >= deadline:
                message = self._failed_scheduling(name)
                hint = f" (last FailedScheduling: {message})" if message else ""
                raise SimError(
                    f"pod {self.namespace}/{name} was not bound within {timeout:g} s by scheduler "
                    f"{self.opts.scheduler_name!r} at {api.server}{hint}; is a kube-scheduler with that "
                    f"schedulerName running? (--scheduler-name, --bind-timeout)"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.05)

    def _failed_scheduling(self, name: str) -> str:
        api = self._api()
        events = api.raw(
            f"reading the events of pod {self.namespace}/{name}",
            api.core.list_namespaced_event,
            self.namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind=Pod,reason=FailedScheduling",
        )
        items = (events or {}).get("items") or []
        return str(items[-1].get("message", "FailedScheduling")) if items else ""

    def _delete_pod(self, name: str) -> None:
        api = self._api()
        api.raw(
            f"deleting pod {self.namespace}/{name}",
            api.core.delete_namespaced_pod,
            name,
            self.namespace,
            grace_period_seconds=0,
            missing_ok=True,
        )

    def _place(self, i: int, t: float) -> bool:
        """Create pod ``i`` if the model finds room; wait for its binding and judge it."""
        needs = self.needs[i]
        feasible = self.state.feasible(needs)
        if not feasible.any():
            return False
        totals = self.state.totals(needs, feasible)
        cand = np.flatnonzero(feasible)
        pick = int(cand[kube.select_host(totals[cand], self.rng)]) if len(cand) > 1 else int(cand[0])
        p = self.placements[i]
        pod = self.workload.pods[i]
        api = self._api()
        body = pod_body(p.k8s_name, self.namespace, self.run, self.opts.scheduler_name, needs, pod.name, pod.group)
        api.raw(f"creating pod {self.namespace}/{p.k8s_name}", api.core.create_namespaced_pod, self.namespace, body)
        node_name, refused = self._wait_bound(p.k8s_name)
        p.created_at = t
        p.model_pick = pick
        p.totals = [int(x) for x in totals]
        if node_name is None:
            p.refused = refused
            p.verdict = judge(feasible, totals, None)
            self._delete_pod(p.k8s_name)
            return True
        try:
            node = self.k8s_nodes.index(str(node_name))
        except ValueError as err:
            raise SimError(
                f"pod {self.namespace}/{p.k8s_name} was bound to {node_name}, which is not one of this run's nodes"
            ) from err
        p.node = node
        p.verdict = judge(feasible, totals, node)
        self.state.add(needs, node)
        speed = self.gpu_speed[node] if needs.gpu else self.speed[node]
        p.end = t + float(pod.duration) / speed
        self._push(p.end, FINISH, i)
        return True

    # -- the event loop

    def _push(self, t: float, kind: int, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, i))

    def _pace(self, t: float) -> None:
        if self.opts.time_scale > 0:
            wait = self.wall0 + t / self.opts.time_scale - time.monotonic()
            if wait > 0:
                time.sleep(wait)

    def replay(self) -> float:
        pods = self.workload.pods
        self.events: list[tuple[float, int, int, int]] = []
        self.seq = 0
        children: list[list[int]] = [[] for _ in pods]
        waiting = [len(p.parents) for p in pods]
        for i, p in enumerate(pods):
            for parent in p.parents:
                children[parent].append(i)
            if not p.parents:
                self._push(float(p.arrival), ARRIVE, i)
        active: list[tuple[int, float, int]] = []
        held: dict[int, float] = {}  # pod -> when it first arrived
        done = 0
        t = 0.0
        self.wall0 = time.monotonic()
        while self.events:
            t, kind, _, i = heapq.heappop(self.events)
            self._pace(t)
            if kind == FINISH:
                p = self.placements[i]
                assert p.node is not None
                self._delete_pod(p.k8s_name)
                self.state.remove(self.needs[i], p.node)
                done += 1
                for c in children[i]:
                    waiting[c] -= 1
                    if waiting[c] == 0:
                        self._push(t, ARRIVE, c)
                for h, first in held.items():  # room freed: try the held pods again, in queue order
                    heapq.heappush(active, (-pods[h].priority, first, h))
                held.clear()
                if self.progress is not None:
                    self.progress(done / len(pods))
            else:
                heapq.heappush(active, (-pods[i].priority, t, i))
            while active:
                _, first, j = heapq.heappop(active)
                if not self._place(j, t):
                    held[j] = first
                elif self.placements[j].node is None:  # refused by the real scheduler
                    done += 1
        return t

    def execute(self) -> ReplayResult:
        started = time.monotonic()
        try:
            version = self.connect()
            self.setup()
            end = self.replay()
        finally:
            self.cleanup()
        verdicts = [p.verdict for p in self.placements if p.verdict is not None]
        notes = [
            "Agreement: the real node is among the model's best-scoring feasible nodes, with the model "
            "scoring the real cluster state when the pod was created; pods whose best score several "
            "nodes share are tied (kube-scheduler picks among them at random) and counted apart.",
        ]
        if self.cluster.autoscaler.enabled:
            notes.append("The cluster's autoscaler is not replayed: every node exists throughout.")
        if len(self.nodes) >= kube.MIN_FEASIBLE_NODES_TO_FIND:
            notes.append(
                f"{len(self.nodes)} nodes: kube-scheduler may score only a sample of the feasible nodes "
                "(percentageOfNodesToScore); the model scores them all."
            )
        return ReplayResult(
            summary=summarise(verdicts),
            placements=self.placements,
            node_names=[n.name for n in self.nodes],
            k8s_node_names=self.k8s_nodes,
            server=self._api().server,
            server_version=version,
            namespace=self.namespace,
            wall_seconds=time.monotonic() - started,
            simulated_seconds=end,
            notes=notes,
        )


def replay(
    cluster: ClusterSpec,
    workload: Workload,
    opts: KubeOptions,
    progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Replay ``workload`` on a real cluster and judge every placement (see the module docstring)."""
    return KubeReplay(cluster, workload, opts, progress).execute()


# -- output ------------------------------------------------------------------------------------


def summary_table(result: ReplayResult, opts: KubeOptions, limit: int = 20) -> str:
    s = result.summary
    pct = s["agreement_percent"]
    rows = [
        ("pods placed by the real scheduler", f"{s['pods'] - s['refused_by_real_scheduler']}"),
        ("pods judged", f"{s['pods']}"),
        ("not tied", f"{s['non_tied']}"),
        ("agreements (not tied)", f"{s['agreements']}" + (f" ({pct:.2f} %)" if pct is not None else "")),
        ("tied", f"{s['tied']} (real node among the model's best: {s['tied_real_among_best']})"),
        ("only one feasible node", f"{s['single_feasible']}"),
        ("refused by the real scheduler", f"{s['refused_by_real_scheduler']}"),
        ("disagreements", f"{s['disagreements']}"),
    ]
    width = max(len(k) for k, _ in rows)
    head = (
        f"kube-scheduler {opts.scheduler_name!r} ({result.server_version or 'unknown version'}, profile "
        f"{opts.profile}) at {result.server}: {len(result.node_names)} nodes, "
        f"{result.simulated_seconds:.0f} simulated s in {result.wall_seconds:.1f} wall s"
    )
    lines = [head] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
    dis = result.disagreements()
    if dis:
        lines.append("  disagreements (pod: real node [model score] vs the model's best [score]):")
        for d in dis[:limit]:
            real = f"{d['real_node']} [{d['real_score']}]" if d["real_node"] else f"refused ({d['refused']})"
            lines.append(f"    {d['pod']}: {real} vs {', '.join(d['model_nodes'])} [{d['model_score']}]")
        if len(dis) > limit:
            lines.append(f"    … and {len(dis) - limit} more (results.json)")
    return "\n".join(lines)


def placements_csv(result: ReplayResult) -> str:
    lines = ["pod,created,end,real_node,model_best,model_score,real_score,tied,agree"]
    for p in result.placements:
        v = p.verdict
        if v is None:
            lines.append(f"{_csv(p.pod)},,,,,,,,")
            continue
        real = result.node_names[p.node] if p.node is not None else ""
        best = ";".join(result.node_names[n] for n in v.top)
        lines.append(
            f"{_csv(p.pod)},{p.created_at!r},{p.end!r},{real},{best},{v.best},"
            f"{'' if v.real_score is None else v.real_score},{int(v.tied)},{int(v.agree)}"
        )
    return "\n".join(lines) + "\n"


def _csv(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text
