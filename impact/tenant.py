"""``joulesched report --tenant``: the report's input built from the NADIKI side and standard
exporters only, for a cluster of VMs with no joulesched agent on its nodes.

For every step ``(t − step, t]`` of the range:

1. the VM nodes and their servers: kube-state-metrics' ``kube_node_labels`` with the node label
   ``joulesched.io/server-id`` allow-listed (``label_joulesched_io_server_id``); each VM's vCPUs
   from ``kube_node_status_capacity{resource="cpu"}``;
2. the server's energy: the windows the provider pushed (InfluxDB ``/query``), the registrar's
   description for its cores (``contracts.nadiki_read``); the step's joules are the sum of its
   whole windows (:func:`policy.tenant.step_energy`: the step must be a multiple of the window);
3. the VM's energy: the server's × the VM's share (``--share vcpu``: vCPUs over the server's
   logical CPUs; ``--share provider`` with ``--vm-share NODE=FRACTION``: the provider's figure);
4. the pods' CPU seconds: the raw samples of cAdvisor's ``container_cpu_usage_seconds_total``
   (containers only: ``container!=""`` — the pod-level and root cgroups would count the same CPU
   twice; ``container!="POD"``: the pause container of dockershim's days), each counter split
   over the steps by time between its samples (:func:`policy.tenant.counter_increase`), on the
   node ``kube_pod_info`` names for the pod at each step's end;
5. the split (:func:`policy.tenant.split_by_cpu`): every pod on the VM by its CPU time, so that
   the pods add up to the VM's energy; a step in which no pod used CPU keeps its energy in the
   row ``<unattributed>``.

The result is a :class:`~impact.query.Fetched`, so the indicators (CO2e with ``--intensity``
and ``--pue``, water with ``--wue``) and the rows are the ordinary report's. Steps without the
server's energy are gaps: counted and named in the report's notes, never filled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from joulesched.contracts.errors import NadikiReadError
from joulesched.contracts.nadiki_read import ENERGY_FIELD, InfluxReader, NadikiServer, RegistrarReader
from joulesched.impact.errors import ReportError, UsageError
from joulesched.impact.query import (
    Fetched,
    FloatArray,
    Prometheus,
    Scope,
    _alternation,
    _matrix,
    _quote,
    iso,
    ksm_label,
    pod_labels,
    ranged,
    resolve_pods,
    step_ends,
)
from joulesched.policy import tenant

SERVER_LABEL = "joulesched.io/server-id"
KSM_SERVER = ksm_label(SERVER_LABEL)  # label_joulesched_io_server_id
UNATTRIBUTED = "<unattributed>"
IDLE_SPLIT = "cpu-time"  # the report's idle policy: the VM's energy, idle included, split by CPU time
CPU_SECONDS = "container_cpu_usage_seconds_total"


@dataclass(frozen=True)
class TenantInputs:
    registrar: RegistrarReader
    influx: InfluxReader
    share: str = "vcpu"  # policy.tenant.SHARE_POLICIES
    vm_shares: Mapping[str, float] = field(default_factory=dict)  # node -> the provider's figure
    threads_per_core: int = 2
    intensity: float | None = None  # gCO2e/kWh
    pue: float = 1.0
    wue: float | None = None  # L/kWh


@dataclass
class TenantFetched:
    data: Fetched
    notes: list[str]
    vm_joules: dict[str, FloatArray]  # node -> the VM's share of its server, per step
    server_joules: dict[str, FloatArray]  # server id -> joules per step
    shares: dict[str, float]  # node -> share


def _vm_nodes(prom: Prometheus, start: float, end: float) -> tuple[dict[str, str], dict[str, float]]:
    window = f"{max(1, round(end - start))}s"
    rows = prom.instant(
        f'max by (node, {KSM_SERVER}) (max_over_time(kube_node_labels{{{KSM_SERVER}!=""}}[{window}]))', end
    )
    servers: dict[str, str] = {}
    for r in rows:
        node, server = r["metric"].get("node", ""), r["metric"].get(KSM_SERVER, "")
        if node in servers and servers[node] != server:
            raise ReportError(
                f"node {node} moved from server {servers[node]} to {server} within the range: report the two parts "
                "separately"
            )
        servers[node] = server
    if not servers:
        raise ReportError(
            f"no node carries the label {SERVER_LABEL} in kube_node_labels between {iso(start)} and {iso(end)} — label "
            f"the VM nodes with their server's id and allow-list it in kube-state-metrics "
            f"(--metric-labels-allowlist=nodes=[{SERVER_LABEL}])"
        )
    cpus = prom.instant(
        f'max by (node) (max_over_time(kube_node_status_capacity{{resource="cpu", node=~{_quote(_alternation(servers))}}}[{window}]))',
        end,
    )
    vcpus = {r["metric"].get("node", ""): float(r["value"][1]) for r in cpus}
    return servers, vcpus


def _share(inputs: TenantInputs, node: str, vcpus: Mapping[str, float], server: NadikiServer) -> float:
    try:
        if inputs.share == "provider":
            if node not in inputs.vm_shares:
                raise ReportError(f"--share provider: no --vm-share {node}=FRACTION given for node {node}")
            return tenant.provider_share(inputs.vm_shares[node])
        if node not in vcpus:
            raise ReportError(
                f'node {node}: no kube_node_status_capacity{{resource="cpu"}} (kube-state-metrics) for its vCPUs'
            )
        return tenant.vcpu_share(vcpus[node], server.physical_cores, inputs.threads_per_core)
    except tenant.ShareError as err:
        raise ReportError(f"node {node} on server {server.server_id}: {err}") from err


LOOKBACK_S = 300.0  # samples this far outside the range place the intervals that cross its edges


def _cpu_seconds(
    prom: Prometheus, node_server: Mapping[str, str], steps: FloatArray, step: float, start: float, notes: list[str]
) -> dict[tuple[str, str, str], FloatArray]:
    """(node, namespace, pod) -> CPU seconds per step, from the raw samples of cAdvisor's counters.

    Each container's counter is split over the steps by :func:`policy.tenant.counter_increase`
    (not ``increase()``, which loses the part of an interval between a window's last sample and
    its edge when the next window holds a single sample — a container's last seconds); the
    pod's node in each step is the one ``kube_pod_info`` names at the step's end.
    """
    node_match = f"node=~{_quote(_alternation(node_server))}"
    info = _matrix(
        ranged(prom, f"max by (namespace, pod, node) (kube_pod_info{{{node_match}}})", steps, step),
        ("namespace", "pod", "node"),
        steps,
        step,
    )
    where: dict[tuple[str, str], list[str | None]] = {}
    for (ns, pod, node), present in info.items():
        row = where.setdefault((ns, pod), [None] * len(steps))
        for k in np.flatnonzero(np.isfinite(present)).tolist():
            if row[k] not in (None, node):
                notes.append(f"note: pod {ns}/{pod} is on two nodes at {iso(float(steps[k]))}: counted on {row[k]}")
                continue
            row[k] = node
    if not where:
        return {}
    at = float(steps[-1]) + LOOKBACK_S
    span = round(at - (start - LOOKBACK_S))
    rows = prom.instant(
        f'{CPU_SECONDS}{{container!="", container!="POD", namespace=~{_quote(_alternation(ns for ns, _ in where))}}}'
        f"[{span}s]",
        at,
    )
    edges = np.concatenate(([float(steps[0]) - step], steps))
    out: dict[tuple[str, str, str], FloatArray] = {}
    for series in rows:
        labels = series.get("metric", {})
        nodes = where.get((str(labels.get("namespace", "")), str(labels.get("pod", ""))))
        if nodes is None:
            continue
        samples = series.get("values") or []
        grown = tenant.counter_increase([float(t) for t, _ in samples], [float(v) for _, v in samples], edges)
        for k, on in enumerate(nodes):
            if on is not None and grown[k]:
                key = (on, str(labels["namespace"]), str(labels["pod"]))
                out.setdefault(key, np.zeros(len(steps)))[k] += grown[k]
    return out


def fetch_tenant(
    prom: Prometheus, inputs: TenantInputs, scope: Scope, start: float, end: float, step: float
) -> TenantFetched:
    steps = step_ends(start, end, step)
    node_server, vcpus = _vm_nodes(prom, start, end)
    notes: list[str] = []
    servers: dict[str, NadikiServer] = {}
    server_joules: dict[str, FloatArray] = {}
    for server_id in sorted(set(node_server.values())):
        try:
            server = servers[server_id] = inputs.registrar.server(server_id)
            point = server.point(ENERGY_FIELD)
            if point is None:
                raise ReportError(f"server {server_id}: the registrar lists no {ENERGY_FIELD} series")
            windows = inputs.influx.windows(point, server_id, start, float(steps[-1]))
            server_joules[server_id] = tenant.step_energy(
                windows.starts, windows.joules, windows.granularity, steps, step
            )
        except NadikiReadError as err:
            raise ReportError(str(err)) from err
        except tenant.ShareError as err:
            raise ReportError(f"server {server_id}: {err} (--step, --start)") from err
        gaps = int(np.count_nonzero(~np.isfinite(server_joules[server_id])))
        if gaps:
            notes.append(
                f"note: server {server_id}: {gaps} of {len(steps)} steps lack a window of its energy in the time-series "
                "store (not pushed by the provider): their energy is not counted"
            )
    shares = {node: _share(inputs, node, vcpus, servers[srv]) for node, srv in node_server.items()}
    vm_joules = {node: shares[node] * server_joules[srv] for node, srv in node_server.items()}

    cpu = _cpu_seconds(prom, node_server, steps, step, start, notes)
    in_scope: set[tuple[str, str]] | None = None
    runs: dict[tuple[str, str], tuple[str, str]] = {}
    owners: dict[tuple[str, str], str] = {}
    if scope.namespace or scope.selector or scope.run or scope.owner:
        in_scope, runs, owners = resolve_pods(prom, scope, start, end)
        if in_scope is None:  # a namespace alone
            in_scope = {(ns, pod) for _, ns, pod in cpu if ns == scope.namespace}
    elif cpu:  # every pod: their owners and runs, for --by owner|run|process
        runs, owners = pod_labels(prom, {(ns, pod) for _, ns, pod in cpu}, [], f"{max(1, round(end - start))}s", end)
    policy = IDLE_SPLIT
    count = len(steps)
    pods: dict[tuple[str, str, str, str], FloatArray] = {}
    for node in sorted(node_server):
        keys = sorted(k for k in cpu if k[0] == node)
        matrix = np.array([cpu[k] for k in keys]) if keys else np.zeros((0, count))
        split, unattributed = tenant.split_by_cpu(vm_joules[node], matrix)
        for key, joules in zip(keys, split, strict=True):
            if in_scope is None or (key[1], key[2]) in in_scope:
                pods[(node, key[1], key[2], policy)] = joules
        if in_scope is None and np.nansum(unattributed) > 0:
            pods[(node, UNATTRIBUTED, UNATTRIBUTED, policy)] = unattributed
    if not pods:
        raise ReportError(f"no pod of {scope.describe()} ran on a VM node with a server id")
    ones = np.ones(count)
    info = {(node, "", srv): ones for node, srv in node_server.items()}
    factors: dict[str, dict[str, FloatArray]] = {
        "pue": {"": np.full(count, inputs.pue)},
        "intensity": {"": np.full(count, inputs.intensity)} if inputs.intensity is not None else {},
        "wue": {"": np.full(count, inputs.wue if inputs.wue is not None else 0.0)},
        "renewable_share": {"": np.zeros(count)},
    }
    if inputs.intensity is None:
        notes.append("note: no --intensity: CO2e is not computed (give the grid's gCO2e/kWh)")
    data = Fetched(steps, step, pods, vm_joules, info, factors, {}, {}, owners, runs)
    for node, share in sorted(shares.items()):
        how = "vCPUs over the server's logical CPUs" if inputs.share == "vcpu" else "the provider's figure"
        notes.append(f"note: node {node} is {share:.4g} of server {node_server[node]} ({how})")
    return TenantFetched(data, notes, vm_joules, server_joules, shares)


def parse_vm_shares(values: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for value in values:
        node, sep, fraction = value.partition("=")
        try:
            share = float(fraction)
        except ValueError:
            share = math.nan
        if not sep or not node or not math.isfinite(share):
            raise UsageError(f"--vm-share {value!r}: give NODE=FRACTION, e.g. vm-a=0.25")
        out[node] = share
    return out


__all__ = ["TenantFetched", "TenantInputs", "fetch_tenant", "parse_vm_shares"]
