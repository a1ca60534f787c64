"""The replay loop: the workload event by event on a real cluster, each pod judged as it is bound
(the package docstring has the steps)."""

from __future__ import annotations

import heapq
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from joulesched.sim import kube
from joulesched.sim.cluster import ClusterSpec
from joulesched.sim.errors import SimError
from joulesched.sim.kubereplay.agreement import Placement, ReplayResult, judge, summarise
from joulesched.sim.kubereplay.apiserver import (
    GROUP_LABEL,
    HOSTNAME_LABEL,
    SIM_LABEL,
    Api,
    dns_label,
    node_body,
    node_status,
    pod_body,
    resolve_kubeconfig,
)
from joulesched.sim.kubereplay.options import PROFILES, KubeOptions
from joulesched.sim.model import Workload
from joulesched.sim.schedstate import PodNeeds, SchedulingState, needs_of

FINISH, ARRIVE = 0, 1  # at equal times a pod finishes before the next arrives (as in sim.engine)


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
        self.state = SchedulingState(cluster, "most" if opts.profile == "most-allocated" else "least", len(groups))
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
            api.call(
                f"creating service account {self.namespace}/default",
                core.create_namespaced_service_account,
                self.namespace,
                {"metadata": {"name": "default"}},
            )
        except SimError:  # a controller-manager may have made it already; pod creation says if not
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
            body = node_body(name, self.run, nt.name, node.zone, nt.gpus.model)
            api.call(f"creating node {name}", core.create_node, body)
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
        feasible = self.state.fits(needs)
        cand = np.flatnonzero(feasible)
        if len(cand) == 0:
            return False
        totals = np.zeros(self.state.n, dtype=np.int64)  # 0 on the nodes that do not fit
        totals[cand] = self.state.scores(needs, cand)
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
        self.state.bind(needs, node)
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
        for i, pod in enumerate(pods):
            for parent in pod.parents:
                children[parent].append(i)
            if not pod.parents:
                self._push(float(pod.arrival), ARRIVE, i)
        active: list[tuple[int, float, int]] = []
        held: dict[int, float] = {}  # pod -> when it first arrived
        done = 0
        t = 0.0
        self.wall0 = time.monotonic()
        while self.events:
            t, kind, _, i = heapq.heappop(self.events)
            self._pace(t)
            if kind == FINISH:
                placed = self.placements[i]
                assert placed.node is not None
                self._delete_pod(placed.k8s_name)
                self.state.unbind(self.needs[i], placed.node)
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
