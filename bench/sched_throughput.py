"""Scheduling throughput with the real kube-scheduler: what an extender costs it.

A real etcd and kube-apiserver on loopback (the e2e harness, tests/e2e/cluster.py), N Node
objects without kubelets (allocatable set, the not-ready taint removed), and bursts of pods
created while no scheduler for them runs; then a fresh kube-scheduler starts and the burst is
timed from the scheduler's own counter, ``scheduler_schedule_attempts_total{result="scheduled"}``
(counted after a successful bind), read from its /metrics every 0.2 s: pods/s is the count
gained between the first sample that shows a scheduled pod and the last, over that time.
Attempts it counted as errors (``result="error"``, e.g. an extender's bind past its
``httpTimeout``) are reported with the burst: such a pod may be bound and never counted.

Contenders, interleaved round by round, the rounds in a Williams design (A B D C, B C A D,
C D B A, D A C B for four: each first once, and right after each other once; since 2026-12-06,
before which every round ran them in the order given):

* ``alone``: kube-scheduler without an extender;
* ``const``: a constant-score extender (bench/const_extender.py: stdlib http.server, HTTP/1.1
  keep-alive, filter passes every name, prioritize scores 0), names mode;
* ``const-bind``: the constant-score extender serving the bind verb too, each binding POSTed
  to the API server at once (stdlib http.client over kept-alive TLS): the floor for an
  extender that binds, which ``names`` is (the bind verb moves the binding's API write from
  kube-scheduler into the extender);
* ``const-record``: the constant-score extender with the bind verb answered by an ``Error`` at
  once (``--bind-declines``): kube-scheduler, its entry ``ignorable``, skips the extender and
  binds with its own binder. The floor for an extender that is told where each pod goes (as the
  bind verb tells joulesched) but leaves the binding's write to kube-scheduler;
* ``names``: joulesched's extender as shipped (deploy/extender/config.yaml, gunicorn, the pod
  watch) with deploy/'s extender entry (``nodeCacheCapable: true``);
* ``const-full``: the constant-score extender with ``nodeCacheCapable: false``: it echoes the
  Node objects kube-scheduler sent without decoding them (the floor of full-Node mode);
* ``full``: joulesched's extender, ``nodeCacheCapable: false`` (full Node objects);
* ``choose``: joulesched with ``policy.filter_keeps: best`` and only deploy/'s filterVerb:
  filter keeps the one node it ranks first, kube-scheduler places the pod there without
  scoring and binds it itself (docs/extender.md, "Choosing the node");
* ``choose-bind``: the same with deploy/'s bindVerb too (no prioritize): the extender writes
  the bindings, outside kube-scheduler's client-side API rate;
* ``top-bind``: joulesched with ``policy.filter_keeps: top``, deploy/'s filterVerb and bindVerb
  (no prioritize): filter keeps every node it ranks first, all scored alike, kube-scheduler's
  own plugins (MostAllocated) choose among them, and the extender binds;
* ``record``: names mode with ``bind.write: false``: the bind verb tells the extender where each
  pod goes and answers that kube-scheduler binds it, which kube-scheduler (``ignorable``) then
  does with its own binder; compared with ``const-record``;
* ``nowait``: names mode as shipped but with ``bind.wait_seconds: 0``: no decision waits for
  the bindings of the pods answered before it (what those waits cost the scheduling cycle);
* ``watch``: names mode without the bind verb (kube-scheduler binds; the extender learns
  placements from its top choices and the pod watch only), what was shipped before the bind
  verb: the bind verb moves the binding's API write from kube-scheduler into the extender, and
  this is that cost;
* ``names-split`` and ``record-split``: ``names`` and ``record`` with deploy/'s bindVerb in an
  extender entry of its own (the same urlPrefix, no other verb): kube-scheduler gives each
  entry its own HTTP client, so the binds in flight no longer share the decisions' connections;
* any name given with ``--variant NAME:KEY=VALUE``: names mode as shipped, bind verb included,
  with those settings (``--variant threads64:bind.threads=64 --contenders const,names,threads64``).

Every contender uses deploy/'s scheduler profile (MostAllocated). Each configuration is a node
count × the API rate (``clientConnection.qps``/``burst``: kube-scheduler ignores the deprecated
``--kube-api-qps`` flag when given ``--config``; 50 is the default) × ``percentageOfNodesToScore``
(kube-scheduler's adaptive default or 100). Extender CPU per scheduled pod is the utime+stime
(/proc/<pid>/stat) of the extender's processes (gunicorn's master and workers) over the burst.
Beside it, over the same span: kube-scheduler's, kube-apiserver's and etcd's CPU a pod, the
share of the machine's CPUs busy while pods were being scheduled (/proc/stat: near 100 %, the
burst was bound by CPU), and for joulesched with the bind verb the milliseconds a pod its
decisions waited for an earlier pod's binding (``joulesched_extender_bind_wait_seconds_total``)
and the TCP connections it accepted a pod (``joulesched_extender_connections_total``).

``--extender-cpus 1`` runs the extenders on CPU 1 and everything else (etcd, kube-apiserver,
each kube-scheduler, this script) on the other CPUs, as in a cluster where the extender's
Deployment runs on a node of its own rather than beside the control plane (deploy/ gives it
no toleration for control-plane taints); ``control_plane_busy`` is then the share of those
other CPUs busy over the burst. Without it every process shares every CPU, and an extender's
CPU is taken from kube-apiserver's and kube-scheduler's.

``--outage`` measures instead what the backlog gets while extenders fail:
half the nodes at a clean site, half at a coal-grid one, and (a) two extender replicas
behind a round-robin TCP proxy (standing in for the Service: each new connection goes to the
next replica; the dead one stays in the rotation, as it does until its endpoint is removed),
one SIGKILLed mid-burst; (b) one extender SIGKILLed for 10 s and started again; (c,
``--cases rolling``) deploy/'s rolling update of its two replicas behind the proxy: for each old
replica a new one starts, turns ready (/readyz) and joins the rotation, then the old one is
terminated, and the next new one starts at once, as the Deployment controller starts it: the old
one gets SIGTERM ``--prestop-seconds`` later (deploy/'s preStop sleep, 5 s, by default), and
leaves the rotation ``--endpoint-lag-seconds`` after its termination began (1 s: the endpoint's
removal reaching kube-proxy); connections already made through the proxy stay with their
replica until it closes them, as kube-proxy's do; (d, ``--cases steady``) the same two
replicas and burst with nothing stopped, the rolling update's baseline. The share of the pods bound
while an extender was down that went to the coal-grid site is the figure, with the nodes the
burst left past their cores, and for the rolling update the extender calls kube-scheduler gave
up on (its "Skipping extender" lines for filter and bind; prioritize's, logged at V(5), through
``--vmodule=schedule_one=5``); ``--in-tree default`` drops deploy/'s MostAllocated for
kube-scheduler's default scoring, which decides where a blind pod goes.

    JOULESCHED_K8S_BIN_DIR=~/.cache/joulesched/k8s/v1.37.2/bin \\
      PYTHONPATH=. python bench/sched_throughput.py --nodes 100,1000 --rounds 2 \\
      --out bench/results/sched-throughput

Not a timed test: run it by hand and record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from cluster import ControlPlane  # noqa: E402
from e2e_extender import (  # noqa: E402
    EFFICIENT_CURVE,
    INEFFICIENT_CURVE,
    ExtenderProcess,
    deploy_extender_config,
    deploy_extender_entry,
    deploy_scheduler_for,
    node_profile,
)
from processes import ManagedProcess, _wait_until  # noqa: E402

from joulesched.contracts.net import free_port  # noqa: E402

CONTENDERS = ("alone", "const", "const-bind", "const-record", "names", "nowait", "record", "const-full", "full", "watch", "choose", "choose-bind", "top-bind", "names-split", "record-split")
# What each contender is compared with: the constant-score extender, and for one that binds
# (joulesched with deploy/'s bindVerb), the constant-score extender that binds too.
FLOORS = ("const", "const-bind")
BINDERS = ("names", "nowait", "full", "choose-bind", "top-bind", "names-split")
# With deploy/'s bindVerb in a scheduler entry of its own (each runs against the extender of
# the contender it splits: names-split against names', record-split against record's).
SPLIT = ("names-split", "record-split")
# Served by a joulesched extender of its own, with these settings (--set form) on top of --set's.
SETTINGS_OF = {
    "choose": ("policy.filter_keeps=best",),
    "choose-bind": ("policy.filter_keeps=best",),
    "top-bind": ("policy.filter_keeps=top",),
    "record": ("bind.write=false",),
    "record-split": ("bind.write=false",),
    "nowait": ("bind.wait_seconds=0",),
}
# More of them, named on the command line (--variant NAME:KEY=VALUE): names mode as shipped,
# bind verb included, with those settings.
VARIANTS: dict[str, tuple[str, ...]] = {}
CLK_TCK = os.sysconf("SC_CLK_TCK")
CORES = 64
ATTEMPTS = re.compile(r"^scheduler_schedule_attempts_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.M)


# -- the cluster ---------------------------------------------------------------------------------


def parallel(fn: Callable[[Any], Any], items: Sequence[Any], threads: int = 8) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, items))


def make_nodes(cp: ControlPlane, names: Sequence[str], labels: dict[str, str]) -> None:
    parallel(lambda n: cp.create_node(n, cpu=str(CORES), memory="256Gi", pods=110, labels=labels), names)


def delete_nodes(cp: ControlPlane, names: Sequence[str]) -> None:
    parallel(cp.delete_node, names)


def make_pods(
    cp: ControlPlane, namespace: str, scheduler: str, count: int, selector: dict[str, str], cpu: str = "100m"
) -> list[str]:
    pods = [f"{scheduler}-{i:05d}" for i in range(count)]
    parallel(
        lambda p: cp.create_pod(p, namespace, scheduler_name=scheduler, cpu=cpu, memory="64Mi", node_selector=selector),
        pods,
    )
    return pods


def delete_pods(cp: ControlPlane, namespace: str) -> None:
    cp.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    _wait_until(
        lambda: not cp.core.list_namespaced_pod(namespace, limit=1).items, 60, what=f"pods of {namespace} deleted"
    )


def scheduler_config(name: str, extenders: list[dict[str, Any]], qps: int, percentage: int | None) -> dict[str, Any]:
    config = deploy_scheduler_for(name, "")
    config["extenders"] = extenders
    if percentage is None:
        config.pop("percentageOfNodesToScore", None)
    else:
        config["percentageOfNodesToScore"] = percentage
    config["clientConnection"] = {"qps": qps, "burst": max(100, qps)}
    return config


def attempts(port: int, profile: str) -> dict[str, float]:
    """kube-scheduler's scheduling attempts for ``profile`` by result (scheduled, error,
    unschedulable), from its ``scheduler_schedule_attempts_total``."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=5) as r:
        text = r.read().decode()
    totals: dict[str, float] = {}
    for m in ATTEMPTS.finditer(text):
        labels = dict(kv.split("=", 1) for kv in m["labels"].split(","))
        if labels.get("profile") == f'"{profile}"':
            result = labels.get("result", "").strip('"')
            totals[result] = totals.get(result, 0.0) + float(m["value"])
    return totals


class ExtenderCounters(NamedTuple):
    """What joulesched's /metrics has counted so far (every outcome)."""

    bind_waits: float  # decisions that waited for an earlier pod's binding
    bind_wait_seconds: float  # the seconds they waited
    connections: float | None  # TCP connections accepted (None: a checkout without the counter)


def extender_counters(url: str) -> ExtenderCounters:
    """joulesched's counters from its /metrics (the scrape's own connection included)."""
    base = url.rsplit("/", 1)[0]
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        text = r.read().decode()
    waits = seconds = 0.0
    connections: float | None = None
    for line in text.splitlines():
        if line.startswith("joulesched_extender_bind_waits_total{"):
            waits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("joulesched_extender_bind_wait_seconds_total{"):
            seconds += float(line.rsplit(" ", 1)[1])
        elif line.startswith("joulesched_extender_connections_total "):
            connections = (connections or 0.0) + float(line.rsplit(" ", 1)[1])
    return ExtenderCounters(waits, seconds, connections)


# -- processes -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime+stime of ``pid`` and the processes below it now alive (gunicorn's master and workers)."""
    total = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
        except (OSError, ValueError, IndexError):
            pass
    return total / CLK_TCK


def cpu_times(cpus: set[int] | None = None) -> tuple[float, float]:
    """(busy, total) jiffies since boot of ``cpus``, or of all CPUs (/proc/stat; iowait counts as idle)."""
    busy = total = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu"):
                break
            wanted = name == "cpu" if cpus is None else name != "cpu" and int(name[3:]) in cpus
            if not wanted:
                continue
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            busy += sum(values) - values[3] - values[4]
            total += sum(values)
    return busy, total


def busy_share(before: tuple[float, float], after: tuple[float, float] | None) -> float | None:
    """The share of the CPU time between two :func:`cpu_times` readings that was busy."""
    if after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it now alive."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` and of the processes below it onto ``cpus``.

    Twice over: a thread started while the first pass ran may have inherited the old set.
    Threads and processes started later inherit the new one.
    """
    for _ in range(2):
        for p in descendants(pid):
            try:
                tasks = os.listdir(f"/proc/{p}/task")
            except OSError:
                continue
            for task in tasks:
                try:
                    os.sched_setaffinity(int(task), cpus)
                except OSError:
                    pass  # the thread has ended


class ConstExtender(ManagedProcess):
    def __init__(
        self, workdir: Path, cp: ControlPlane | None = None, *, declines: bool = False, identity: Identity | None = None
    ) -> None:
        """The constant-score extender; with ``cp``, serving bind against its API server too
        (as ``identity``, else with the admin certificate); with ``declines``, answering bind
        with an Error (kube-scheduler then binds)."""
        self.port = free_port()
        argv = [sys.executable, str(ROOT / "bench" / "const_extender.py"), str(self.port)]
        name = "const-extender"
        if declines:
            argv.append("--bind-declines")
            name = "const-record-extender"
        elif cp is not None:
            assert cp.pki is not None
            argv += ["--api", cp.server, "--ca", str(cp.pki.ca_crt)]
            if identity is not None and identity.token_file is not None:
                argv += ["--token", str(identity.token_file)]
            else:
                cert, key = cp._admin_cert
                argv += ["--cert", str(cert), "--key", str(key)]
            name = "const-bind-extender"
        super().__init__(name, argv, workdir / f"{name}.log")
        self.url = f"http://127.0.0.1:{self.port}/scheduler"
        _wait_until(self._up, 15, what="const extender", proc=self)

    def _up(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                return True
        except OSError:
            return False


def joulesched_extender(
    workdir: Path,
    cp: ControlPlane,
    names: Sequence[str],
    sites: Callable[[int], str],
    *,
    port: int | None = None,
    name: str = "joulesched",
    curve: Callable[[int], list[float]] = lambda i: EFFICIENT_CURVE if i % 2 else INEFFICIENT_CURVE,
    settings: Sequence[str] = (),
    identity: Identity | None = None,
) -> ExtenderProcess:
    """joulesched's extender with deploy/'s configuration and ``settings`` (``KEY=VALUE``, dotted
    keys, YAML values), reaching the API as ``identity`` (else with the admin certificate)."""
    profiles = {
        "sites": {"clean": {"pue": 1.2, "carbon_intensity": 50}, "coal": {"pue": 1.2, "carbon_intensity": 800}},
        "nodes": [node_profile(n, curve(i), CORES, site=sites(i), utilisation=0.3) for i, n in enumerate(names)],
    }
    kubeconfig = identity.kubeconfig if identity is not None else cp.kubeconfig
    config = apply_settings(deploy_extender_config(kubeconfig), settings)
    return ExtenderProcess(workdir, profiles, config, port=port, name=name, timeout=60)


@dataclass(frozen=True)
class Identity:
    """Who the extenders that write bindings are to the API server."""

    kubeconfig: Path
    token_file: Path | None  # the bearer token alone, for const-bind; None: a client certificate


def extender_identity(cp: ControlPlane, work: Path, how: str) -> Identity:
    """``admin``: the harness's admin certificate (system:masters, which API Priority and
    Fairness exempts). ``service-account``: as deploy/ runs the extender, its ServiceAccount's
    bearer token with deploy/extender/rbac.yaml's ClusterRole; its requests then fall under the
    ``service-accounts`` flow schema (``workload-low``), and kube-apiserver checks a token it
    has seen in the last 10 s from its cache instead of verifying a certificate."""
    assert cp.kubeconfig is not None
    if how == "admin":
        return Identity(cp.kubeconfig, None)
    deploy = ROOT / "deploy"
    cp.kubectl("apply", "-f", str(deploy / "namespace.yaml"))
    cp.kubectl("apply", "-n", "joulesched", "-f", str(deploy / "extender" / "serviceaccount.yaml"),
               "-f", str(deploy / "extender" / "rbac.yaml"))
    kubeconfig = cp.service_account_kubeconfig("joulesched", "joulesched-extender", duration="24h")
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    token_file = work / "extender.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    return Identity(kubeconfig, token_file)


def apply_settings(config: dict[str, Any], settings: Sequence[str]) -> dict[str, Any]:
    """``config`` with each ``KEY=VALUE`` set (dotted key, YAML value); ValueError naming a bad one."""
    for setting in settings:
        key, _, value = setting.partition("=")
        *path, last = key.split(".")
        doc = config
        for i, part in enumerate(path):
            doc = doc.setdefault(part, {})
            if not isinstance(doc, dict):
                raise ValueError(f"--set {setting!r}: {'.'.join(path[: i + 1])} is not a mapping in the extender's config")
        try:
            doc[last] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise ValueError(f"--set {setting!r}: the value is not YAML: {err}") from None
    return config


# -- one burst -----------------------------------------------------------------------------------


@dataclass
class Burst:
    nodes: int
    qps: int
    percentage: str
    contender: str
    round: int
    pods: int
    scheduled: float
    seconds: float
    pods_per_s: float
    extender_cpu_s: float | None
    extender_cpu_ms_per_pod: float | None
    scheduler_cpu_s: float
    complete: bool
    # The share of the machine's CPUs busy between the first and the last count: near 1, the
    # burst was bound by CPU; lower, by the latency of one scheduling cycle after another.
    machine_busy: float | None = None
    # joulesched with the bind verb: decisions that waited for an earlier pod's binding, and
    # the milliseconds they waited a scheduled pod (on the scheduling cycle, costing no CPU).
    bind_waits: float | None = None
    bind_wait_ms_per_pod: float | None = None
    # kube-apiserver's and etcd's CPU over the same span as the extender's
    apiserver_cpu_s: float | None = None
    etcd_cpu_s: float | None = None
    # attempts kube-scheduler counted as errors: e.g. an extender's bind past its httpTimeout,
    # after which kube-scheduler (ignorable) binds the pod itself and gets 409 when the
    # extender's binding went through; such a pod is bound but never counted as scheduled
    errors: float = 0.0
    # --extender-cpus: the share of the other CPUs (etcd's, kube-apiserver's, kube-scheduler's
    # and this script's) busy over the same span as machine_busy
    control_plane_busy: float | None = None
    # joulesched with the bind verb: the TCP connections it accepted over the burst, a few of
    # them whatever the burst (each of kube-scheduler's extender clients opens its first ones,
    # and the closing /metrics scrape is one). Each client keeps at most 2 idle connections:
    # requests in flight beyond those come on new ones.
    connections: float | None = None


def run_burst(
    cp: ControlPlane,
    contender: str,
    url: str | None,
    extender_pid: int | None,
    *,
    nodes: int,
    qps: int,
    percentage: int | None,
    pods: int,
    selector: dict[str, str],
    cap_s: float,
    rnd: int,
    control_plane_cpus: set[int] | None = None,
) -> Burst:
    name = f"b{uuid.uuid4().hex[:8]}"
    namespace = cp.create_namespace(name)
    make_pods(cp, namespace, name, pods, selector)
    entry = None
    if contender != "alone":
        entry = deploy_extender_entry(url, nodeCacheCapable=contender not in ("full", "const-full"))
        if contender in ("const", "const-full", "const-bind", "const-record"):
            entry.pop("preemptVerb", None)
        if contender in ("const", "const-full", "watch", "choose"):
            entry.pop("bindVerb", None)
        if contender in ("choose", "choose-bind", "top-bind"):
            entry.pop("prioritizeVerb", None)
    extra = ["--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"]
    cpu0 = cpu_seconds(extender_pid) if extender_pid else None
    binds = contender in (*BINDERS, *VARIANTS, "record", "record-split") and entry is not None and "bindVerb" in entry
    entries: list[dict[str, Any]] = [entry] if entry else []
    if entry is not None and contender in SPLIT:
        # The bind verb in an entry of its own: kube-scheduler gives each entry its own HTTP
        # client, so the binds in flight no longer take the decisions' connections.
        shared = ("urlPrefix", "enableHTTPS", "nodeCacheCapable", "ignorable", "httpTimeout", "bindVerb")
        entries = [{k: v for k, v in entry.items() if k != "bindVerb"}, {k: entry[k] for k in shared if k in entry}]
    waits0 = extender_counters(url) if binds and url else None
    api0, etcd0 = cpu_seconds(cp.apiserver.pid), cpu_seconds(cp.etcd.pid)
    sched = cp.start_scheduler(
        scheduler_config(name, entries, qps, percentage), name=name, verbosity=1, extra_args=extra, wait=False
    )
    try:
        first: tuple[float, float] | None = None
        last = (time.monotonic(), 0.0)
        counts: dict[str, float] = {}
        busy0 = busy1 = cpu_times()
        cp_busy0 = cp_busy1 = cpu_times(control_plane_cpus) if control_plane_cpus else None
        deadline = time.monotonic() + cap_s + 30  # + start-up
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                counts = attempts(sched.port, name)
            except OSError:
                continue  # not serving yet
            count = counts.get("scheduled", 0.0)
            now = time.monotonic()
            last = (now, count)
            busy1 = cpu_times()
            if control_plane_cpus:
                cp_busy1 = cpu_times(control_plane_cpus)
            if first is None and count > 0:
                first = (now, count)
                busy0, cp_busy0 = busy1, cp_busy1
                deadline = now + cap_s
            if count >= pods:
                break
        cpu1 = cpu_seconds(extender_pid) if extender_pid else None
        sched_cpu = cpu_seconds(sched.pid)
        waits1 = extender_counters(url) if waits0 is not None and url else None
        api1, etcd1 = cpu_seconds(cp.apiserver.pid), cpu_seconds(cp.etcd.pid)
    finally:
        cp.stop_scheduler(sched)
        delete_pods(cp, namespace)
    scheduled = last[1]
    if first is None or last[0] <= first[0]:
        rate, seconds = 0.0, 0.0
    else:
        seconds = last[0] - first[0]
        rate = (last[1] - first[1]) / seconds
    ext_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    per_pod = None if ext_cpu is None or not scheduled else 1000 * ext_cpu / scheduled
    return Burst(
        nodes,
        qps,
        "default" if percentage is None else str(percentage),
        contender,
        rnd,
        pods,
        scheduled,
        round(seconds, 2),
        round(rate, 2),
        None if ext_cpu is None else round(ext_cpu, 2),
        None if per_pod is None else round(per_pod, 2),
        round(sched_cpu, 2),
        scheduled >= pods,
        busy_share(busy0, busy1),
        None if waits0 is None or waits1 is None else waits1.bind_waits - waits0.bind_waits,
        None
        if waits0 is None or waits1 is None or not scheduled
        else round(1000 * (waits1.bind_wait_seconds - waits0.bind_wait_seconds) / scheduled, 3),
        round(api1 - api0, 2),
        round(etcd1 - etcd0, 2),
        counts.get("error", 0.0),
        None if cp_busy0 is None else busy_share(cp_busy0, cp_busy1),
        None
        if waits0 is None or waits1 is None or waits0.connections is None or waits1.connections is None
        else waits1.connections - waits0.connections,
    )


def extender_of(contender: str) -> tuple[str, str, tuple[str, ...]]:
    """(key, label, settings) of the joulesched extender of its own a contender runs against.

    Contenders of SETTINGS_OF with the same settings share one (``choose`` and ``choose-bind``:
    the same extender, another scheduler entry); each variant has one of its own, so that two
    variants of the same settings are two processes. The key is "" for the others.
    """
    if contender in VARIANTS:
        return f"variant {contender}", f"variant-{contender}", VARIANTS[contender]
    settings = SETTINGS_OF.get(contender, ())
    # filter_keeps-best, write-false, wait_seconds-0
    label = "-".join(s.rsplit(".", 1)[-1].replace("=", "-") for s in settings)
    return ("|".join(settings), label, settings) if settings else ("", "", ())


def order(contenders: Sequence[str], rnd: int) -> list[str]:
    """The contenders in the order round ``rnd`` runs them: a Williams design.

    Over k rounds (2k when k is odd) each contender runs first equally often and right after
    every other equally often, so that whatever one burst leaves behind (etcd compacting, the
    pods it deleted, Go's garbage) falls on every contender alike.
    """
    k = len(contenders)
    base, lo, hi = [0], 1, k - 1
    while len(base) < k:
        if len(base) % 2:
            base.append(lo)
            lo += 1
        else:
            base.append(hi)
            hi -= 1
    rows = [[(b + r) % k for b in base] for r in range(k)]
    if k % 2:
        rows += [row[::-1] for row in rows]
    return [contenders[i] for i in rows[rnd % len(rows)]]


def throughput(cp: ControlPlane, work: Path, args: argparse.Namespace) -> list[Burst]:
    results: list[Burst] = []
    const = ConstExtender(work)
    const_bind = ConstExtender(work, cp, identity=args.identity) if "const-bind" in args.contenders else None
    const_record = ConstExtender(work, declines=True) if "const-record" in args.contenders else None
    if args.extender_cpus:
        for proc in (const, const_bind, const_record):
            if proc is not None:
                pin(proc.pid, args.extender_cpus)
    try:
        for n in args.nodes:
            tag = uuid.uuid4().hex[:6]
            selector = {"bench": tag}
            names = [f"n{tag}-{i:05d}" for i in range(n)]
            t0 = time.monotonic()
            make_nodes(cp, names, selector)
            print(f"# {n} nodes created in {time.monotonic() - t0:.0f} s", flush=True)
            ext = joulesched_extender(
                work / f"ext-{n}", cp, names, lambda i: "clean", settings=args.set, identity=args.identity
            )
            keeping = {
                key: joulesched_extender(
                    work / f"ext-{label}-{n}", cp, names, lambda i: "clean", name=f"joulesched-{label}",
                    settings=[*args.set, *settings], identity=args.identity,
                )
                for key, label, settings in sorted({extender_of(c) for c in args.contenders} - {extender_of("names")})
            }
            if args.extender_cpus:
                for proc in (ext, *keeping.values()):
                    pin(proc.pid, args.extender_cpus)
            try:
                for qps in args.qps:
                    for pct in args.pct:
                        for rnd in range(args.rounds):
                            for contender in order(args.contenders, rnd):
                                own = keeping.get(extender_of(contender)[0])
                                url, pid = (own.url, own.pid) if own else {
                                    "alone": (None, None),
                                    "const": (const.url, const.pid),
                                    "const-bind": (const_bind.url, const_bind.pid) if const_bind else (None, None),
                                    "const-record": (const_record.url, const_record.pid) if const_record else (None, None),
                                    "const-full": (const.url, const.pid),
                                    "names": (ext.url, ext.pid),
                                    "names-split": (ext.url, ext.pid),
                                    "full": (ext.url, ext.pid),
                                    "watch": (ext.url, ext.pid),
                                }[contender]
                                b = run_burst(
                                    cp,
                                    contender,
                                    url,
                                    pid,
                                    nodes=n,
                                    qps=qps,
                                    percentage=pct,
                                    pods=args.pods,
                                    selector=selector,
                                    cap_s=args.cap,
                                    rnd=rnd,
                                    control_plane_cpus=args.control_plane_cpus,
                                )
                                results.append(b)
                                print(json.dumps(asdict(b)), flush=True)
            finally:
                ext.stop()
                for other in keeping.values():
                    other.stop()
                delete_nodes(cp, names)
    finally:
        const.stop()
        for proc in (const_bind, const_record):
            if proc is not None:
                proc.stop()
    return results


def summarise(results: list[Burst]) -> list[str]:
    lines = [
        "| nodes | kube-api qps | percentageOfNodesToScore | contender | pods/s (each round) | extender CPU ms/pod (each round) | kube-scheduler CPU ms/pod | kube-apiserver + etcd CPU ms/pod | machine busy | bind waits ms/pod | connections a pod | pods/s ÷ const (median of the rounds) | CPU ÷ const (median of the rounds) | pods/s ÷ const-bind (median of the rounds) | CPU ÷ const-bind (median of the rounds) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    configs = sorted({(b.nodes, b.qps, b.percentage) for b in results}, key=lambda c: (c[0], c[1], c[2]))
    for cfg in configs:
        group = [b for b in results if (b.nodes, b.qps, b.percentage) == cfg]
        # each floor's burst in each round: a contender's ratios are to the floor of its own round
        floors = {floor: {b.round: b for b in group if b.contender == floor} for floor in FLOORS}
        for contender in (*CONTENDERS, *VARIANTS):
            mine = [b for b in group if b.contender == contender]
            if not mine:
                continue
            rates = ", ".join(
                f"{b.pods_per_s:g}"
                + ("" if b.complete else f" ({b.scheduled:g}/{b.pods} in {b.seconds:g} s)")
                + (f" [{b.errors:g} errors]" if b.errors else "")
                for b in mine
            )
            cpus = ", ".join(
                "–" if b.extender_cpu_ms_per_pod is None else f"{b.extender_cpu_ms_per_pod:g}" for b in mine
            )
            ratios = []
            for floor in FLOORS:
                rate_ratio = cpu_ratio = "–"
                compared = contender in (*BINDERS, *VARIANTS) if floor == "const-bind" else contender not in ("alone", floor)
                pairs = [(b, floors[floor][b.round]) for b in mine if b.round in floors[floor]] if compared else []
                rate_ratios = [b.pods_per_s / f.pods_per_s for b, f in pairs if f.pods_per_s]
                cpu_ratios = [(b.extender_cpu_ms_per_pod or 0) / f.extender_cpu_ms_per_pod for b, f in pairs if f.extender_cpu_ms_per_pod]
                if rate_ratios:
                    rate_ratio = f"{statistics.median(rate_ratios):.2f}"
                if cpu_ratios:
                    cpu_ratio = f"{statistics.median(cpu_ratios):.1f}"
                ratios += [rate_ratio, cpu_ratio]
            sched = ", ".join(f"{1000 * b.scheduler_cpu_s / b.scheduled:.1f}" if b.scheduled else "–" for b in mine)
            api = ", ".join(
                f"{1000 * (b.apiserver_cpu_s or 0) / b.scheduled:.1f} + {1000 * (b.etcd_cpu_s or 0) / b.scheduled:.1f}"
                if b.scheduled and b.apiserver_cpu_s is not None
                else "–"
                for b in mine
            )
            busy = ", ".join(
                ("–" if b.machine_busy is None else f"{b.machine_busy:.0%}")
                + ("" if b.control_plane_busy is None else f" (control plane's {b.control_plane_busy:.0%})")
                for b in mine
            )
            waited = ", ".join("–" if b.bind_wait_ms_per_pod is None else f"{b.bind_wait_ms_per_pod:.2f}" for b in mine)
            opened = ", ".join("–" if b.connections is None or not b.scheduled else f"{b.connections / b.scheduled:.3f}" for b in mine)
            lines.append(
                f"| {cfg[0]} | {cfg[1]} | {cfg[2]} | {contender} | {rates} | {cpus} | {sched} | {api} | {busy} | {waited} | {opened} | "
                + " | ".join(ratios)
                + " |"
            )
    return lines


# -- outages (item 5) ----------------------------------------------------------------------------


class RoundRobinProxy:
    """A TCP proxy: each new connection goes to the next backend, as a Service's does.

    No health checks and no retries: a connection to a dead backend is closed at once, which is
    what the client sees of a Service endpoint whose pod has died and not been removed yet.

    ``sticky``: every connection goes to the same backend while it is in the rotation and takes
    connections, then to the next — deploy/'s Service (``sessionAffinity: ClientIP``: the one
    kube-scheduler has one client IP) once the dead endpoint has been removed.

    ``backends`` is replaced whole (:meth:`add`, :meth:`remove`), never changed in place: the
    accepting thread reads it without a lock.
    """

    def __init__(self, backends: Sequence[int], sticky: bool = False) -> None:
        self.backends: tuple[int, ...] = tuple(backends)
        self.sticky = sticky
        self._next = 0
        self._stuck: int | None = None  # sticky: the backend every connection goes to
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/scheduler"
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            backends = self.backends
            if self.sticky and self._stuck in backends:
                port = self._stuck
            else:
                port = backends[self._next % len(backends)]
                self._next += 1
                self._stuck = port if self.sticky else None
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=1)
            except OSError:
                self.refused += 1
                self._stuck = None
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in sel.select():
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()

    def add(self, port: int) -> None:
        self.backends = (*self.backends, port)

    def remove(self, port: int) -> None:
        self.backends = tuple(p for p in self.backends if p != port)

    def close(self) -> None:
        self.listener.close()


def bound(cp: ControlPlane, namespace: str) -> dict[str, str]:
    return {p.metadata.name: p.spec.node_name for p in cp.core.list_namespaced_pod(namespace).items if p.spec.node_name}


def kill(proc: ManagedProcess) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the extender's own session: gunicorn's master and workers
    proc.popen.wait(10)
    proc.stop()


def outage(cp: ControlPlane, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    n = 100
    tag = uuid.uuid4().hex[:6]
    selector = {"bench": tag}
    names = [f"o{tag}-{i:03d}" for i in range(n)]
    site = {nm: ("coal" if i % 2 else "clean") for i, nm in enumerate(names)}
    make_nodes(cp, names, selector)
    out = []
    try:
        for case in args.cases:
            for rnd in range(args.rounds):
                out.append(outage_case(cp, work / f"{case}-{rnd}", case, names, site, selector, args))
                print(json.dumps(out[-1]), flush=True)
    finally:
        delete_nodes(cp, names)
    return out


def outage_case(
    cp: ControlPlane,
    work: Path,
    case: str,
    names: list[str],
    site: dict[str, str],
    selector: dict[str, str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    sites = lambda i: site[names[i]]  # noqa: E731
    # One node type: where the extender sends a pod is decided by the site's carbon alone.
    same = lambda i: EFFICIENT_CURVE  # noqa: E731
    behind_proxy = case in ("replica", "rolling", "steady")
    replicas = [
        joulesched_extender(work / f"r{k}", cp, names, sites, name=f"replica{k}", curve=same)
        for k in range(2 if behind_proxy else 1)
    ]
    proxy = RoundRobinProxy([r.port for r in replicas], sticky=args.sticky) if behind_proxy else None
    url = proxy.url if proxy else replicas[0].url
    name = f"o{uuid.uuid4().hex[:8]}"
    namespace = cp.create_namespace(name)
    # 2-CPU pods: 32 fit a node, so a backlog placed without the extender spreads over many. The
    # rolling update's pods take 1: its burst must outlast two replicas' start-up and drain, so it
    # is longer (--outage-pods), and the extender's clean-site nodes still take most of it.
    pod_cpus = 1 if case in ("rolling", "steady") else 2
    pods = make_pods(cp, namespace, name, args.outage_pods, selector, cpu=str(pod_cpus))
    extra = ["--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"]
    if case in ("rolling", "steady"):
        extra.append("--vmodule=schedule_one=5")  # prioritize's failures are logged at V(5)
    config = scheduler_config(name, [deploy_extender_entry(url, ignorable=args.ignorable == "true")], 50, 100)
    if args.in_tree == "default":
        config["profiles"][0].pop("pluginConfig", None)  # kube-scheduler's LeastAllocated
    sched = cp.start_scheduler(config, name=name, verbosity=1, extra_args=extra)
    try:
        _wait_until(
            lambda: len(bound(cp, namespace)) >= len(pods) // 5, 120, interval=0.1, what="a fifth of the burst bound"
        )
        before = bound(cp, namespace)
        t_kill = time.monotonic()
        restarted_at = None
        updated_at = 0.0
        if case == "rolling":
            assert proxy is not None
            ending = []
            for k, old in enumerate(list(replicas)):
                new = joulesched_extender(work / f"new{k}", cp, names, sites, name=f"new{k}", curve=same)
                replicas.append(new)  # stopped with the rest, whatever happens
                proxy.add(new.port)  # ready: its endpoint joins the Service
                # Terminating: the kubelet runs the preStop hook, then sends SIGTERM; meanwhile the
                # endpoint leaves the Service, which kube-proxy takes up --endpoint-lag-seconds
                # later. The Deployment controller starts the next new replica at once.
                leave = threading.Timer(args.endpoint_lag_seconds, proxy.remove, (old.port,))
                leave.start()
                stop = threading.Timer(args.prestop_seconds, old.stop, kwargs={"timeout": 30})  # grace period, then SIGKILL
                stop.start()
                ending += [leave, stop]
            for timer in ending:
                timer.join()
            updated_at = time.monotonic() - t_kill
        elif case != "steady":
            kill(replicas[0])
        if case == "outage":
            time.sleep(args.outage_seconds)
            during = bound(cp, namespace)
            replicas[0] = joulesched_extender(
                work / "again", cp, names, sites, port=replicas[0].port, name="again", curve=same
            )
            restarted_at = time.monotonic() - t_kill
            during_ready = bound(cp, namespace)
        _wait_until(lambda: len(bound(cp, namespace)) >= len(pods), 300, interval=0.25, what="the burst bound")
        after = bound(cp, namespace)
    finally:
        cp.stop_scheduler(sched)
        delete_pods(cp, namespace)
        for r in replicas:
            if r.running:
                r.stop()
        if proxy:
            proxy.close()

    def coal(placed: dict[str, str]) -> tuple[int, int]:
        return len(placed), sum(1 for node in placed.values() if site[node] == "coal")

    per_node: dict[str, int] = {}
    for node in after.values():
        per_node[node] = per_node.get(node, 0) + 1
    # measured 30 % (the profiles) plus pod_cpus cores a pod, of 64
    over = sorted(
        round(0.3 + k * pod_cpus / CORES, 3) for k in per_node.values() if 0.3 + k * pod_cpus / CORES > 1 + 1e-9
    )
    result: dict[str, Any] = {
        "case": case,
        "in_tree": args.in_tree,
        "ignorable": args.ignorable,
        "pods": len(pods),
        "bound_before_kill": coal(before),
        "nodes_over_their_cores": over,
    }
    if case == "outage":
        blind = {p: nd for p, nd in during_ready.items() if p not in before}
        result["bound_while_down"] = coal(blind)
        result["bound_in_first_s"] = coal({p: nd for p, nd in during.items() if p not in before})
        result["restart_ready_after_s"] = round(restarted_at or 0, 1)
        result["bound_after_restart"] = coal({p: nd for p, nd in after.items() if p not in during_ready})
    else:
        result["bound_after_kill"] = coal({p: nd for p, nd in after.items() if p not in before})
        result["proxy_refused_connections"] = proxy.refused if proxy else 0
    if case in ("rolling", "steady"):
        log = (cp.log_dir / f"scheduler-{name}.log").read_text(errors="replace")
        result["prestop_seconds"] = args.prestop_seconds
        result["update_s"] = round(updated_at, 1)
        result["extender_calls_given_up"] = {
            "filter": log.count("Skipping extender as it returned error"),
            "prioritize": log.count("Failed to run extender's priority function"),
            "bind": log.count("Skipping extender in bind"),
        }
    return result


# -- main ----------------------------------------------------------------------------------------


def is_setting(setting: str) -> bool:
    """KEY=VALUE with KEY dotted names (bind.wait_seconds=0): what --set and --variant take."""
    key, eq, _ = setting.partition("=")
    return bool(eq) and all(key.split("."))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="100,1000", help="node counts, e.g. 100,1000,5000")
    p.add_argument("--pods", type=int, default=1000, help="pods per burst")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--qps", default="50,5000", help="kube-scheduler clientConnection.qps values")
    p.add_argument(
        "--pct", default="default,100", help="percentageOfNodesToScore values (default: kube-scheduler's adaptive)"
    )
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument(
        "--cap", type=float, default=60, help="seconds a burst may run before its rate is taken as it stands"
    )
    p.add_argument("--quick", action="store_true", help="300-pod bursts, one round, 20 s cap")
    p.add_argument("--outage", action="store_true", help="measure extender failures instead (item 5)")
    p.add_argument("--cases", default="replica,outage")
    p.add_argument("--outage-pods", type=int, default=1000)
    p.add_argument(
        "--sticky",
        action="store_true",
        help="--outage replica, rolling and steady cases: the proxy keeps every connection on one live replica"
        " (sessionAffinity: ClientIP)",
    )
    p.add_argument("--outage-seconds", type=float, default=10)
    p.add_argument(
        "--prestop-seconds",
        type=float,
        default=5.0,
        help="--outage rolling case: seconds from a replica's termination to its SIGTERM (deploy/'s preStop sleep: 5)",
    )
    p.add_argument(
        "--endpoint-lag-seconds",
        type=float,
        default=1.0,
        help="--outage rolling case: seconds from a replica's termination until new connections no longer reach it"
        " (kube-proxy's --iptables-min-sync-period is 1 s)",
    )
    p.add_argument(
        "--ignorable", choices=("true", "false"), default="true", help="--outage: the extender entry's ignorable"
    )
    p.add_argument(
        "--in-tree",
        choices=("deploy", "default"),
        default="deploy",
        help="--outage: deploy/'s scheduler profile (MostAllocated) or kube-scheduler's default (LeastAllocated)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of joulesched's extender over deploy/'s config (dotted key, YAML value), e.g. bind.wait_seconds=0",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE",
        help="another joulesched contender NAME (name it in --contenders): names mode as shipped with this setting"
        " over --set's; repeat for more settings of one variant, e.g. threads64:bind.threads=64",
    )
    p.add_argument(
        "--extender-cpus",
        metavar="LIST",
        help="run the extenders on these CPUs (e.g. 1) and etcd, kube-apiserver, kube-scheduler and this"
        " script on the others, as where the extender runs on a node of its own",
    )
    p.add_argument(
        "--extender-as",
        choices=("admin", "service-account"),
        default="admin",
        help="whose credentials the extenders bind with: the harness's admin certificate (as every run before"
        " 2026-12-07), or deploy/'s ServiceAccount token and RBAC, as deploy/ runs the extender",
    )
    p.add_argument("--out", help="write OUT.json and OUT.txt")
    args = p.parse_args(argv)
    args.control_plane_cpus = None
    if args.extender_cpus:
        mine = os.sched_getaffinity(0)
        try:
            args.extender_cpus = {int(c) for c in args.extender_cpus.split(",")}
        except ValueError:
            p.error(f"--extender-cpus {args.extender_cpus!r}: a comma-separated list of CPU numbers expected, e.g. 1")
        if not args.extender_cpus < mine:
            p.error(
                f"--extender-cpus {sorted(args.extender_cpus)}: must be some but not all of the CPUs this"
                f" script may use, {sorted(mine)}"
            )
        if args.outage:
            p.error("--extender-cpus applies to the throughput runs, not to --outage")
        args.control_plane_cpus = mine - args.extender_cpus
    if args.extender_as != "admin" and args.outage:
        p.error("--extender-as applies to the throughput runs, not to --outage")
    if args.set and args.outage:
        p.error("--set applies to the throughput runs, not to --outage")
    for setting in args.set:
        if not is_setting(setting):
            p.error(f"--set {setting!r}: KEY=VALUE expected, KEY dotted names (bind.wait_seconds=0)")
    try:
        apply_settings(deploy_extender_config("kubeconfig"), args.set)
    except ValueError as err:
        p.error(str(err))
    if args.quick:
        args.pods, args.rounds, args.cap = 300, 1, 20
    args.nodes = [int(x) for x in args.nodes.split(",")]
    args.qps = [int(x) for x in args.qps.split(",")]
    args.pct = [None if x == "default" else int(x) for x in args.pct.split(",")]
    args.contenders = [c for c in args.contenders.split(",") if c]
    args.cases = [c for c in args.cases.split(",") if c]
    if set(args.cases) - {"replica", "outage", "rolling", "steady"}:
        p.error(f"--cases {','.join(args.cases)}: choose from replica, outage, rolling, steady")
    if args.prestop_seconds < 0 or args.endpoint_lag_seconds < 0:
        p.error("--prestop-seconds and --endpoint-lag-seconds: 0 or more seconds")
    VARIANTS.clear()
    for variant in args.variant:
        name, _, setting = variant.partition(":")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) or not is_setting(setting) or name in CONTENDERS:
            p.error(
                f"--variant {variant!r}: NAME:KEY=VALUE expected, NAME of lower-case letters, digits and '-',"
                f" none of {', '.join(CONTENDERS)}"
            )
        VARIANTS[name] = (*VARIANTS.get(name, ()), setting)
    for name, settings in VARIANTS.items():
        try:
            apply_settings(deploy_extender_config("kubeconfig"), [*args.set, *settings])
        except ValueError as err:
            p.error(f"--variant {name}: {err}")
    unknown = set(args.contenders) - set(CONTENDERS) - set(VARIANTS)
    if unknown:
        p.error(f"--contenders: unknown {sorted(unknown)}; choose from {', '.join((*CONTENDERS, *VARIANTS))}")
    bin_dir = os.environ.get("JOULESCHED_K8S_BIN_DIR")
    if not bin_dir:
        p.error("set JOULESCHED_K8S_BIN_DIR to the directory holding kube-apiserver, kube-scheduler and kubectl")
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    work = Path(tempfile.mkdtemp(prefix="joulesched-sched-bench-"))
    if args.control_plane_cpus:
        os.sched_setaffinity(0, args.control_plane_cpus)  # etcd, kube-apiserver and each kube-scheduler inherit it
    cp = ControlPlane(
        Path(bin_dir),
        work / "cluster",
        apiserver_extra_args=("--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000"),
    )
    cp.start()
    try:
        args.identity = extender_identity(cp, work, args.extender_as)
        if args.outage:
            results: list[Any] = outage(cp, work, args)
            lines = [json.dumps(r) for r in results]
        else:
            bursts = throughput(cp, work, args)
            results = [asdict(b) for b in bursts]
            lines = summarise(bursts)
    finally:
        cp.stop()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    header = [
        f"# {' '.join(['bench/sched_throughput.py', *(argv if argv is not None else sys.argv[1:])])}",
        f"# started {started}; load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; at the end: {uptime}",
        f"# {os.cpu_count()} CPUs; work dir {work}"
        + (
            f"; extenders on CPUs {sorted(args.extender_cpus)}, the rest on {sorted(args.control_plane_cpus)}"
            if args.extender_cpus
            else ""
        ),
    ]
    text = "\n".join(header + lines) + "\n"
    print(text)
    if args.out:
        Path(f"{args.out}.json").write_text(
            json.dumps(
                {
                    "command": header[0][2:],
                    "started": started,
                    "load_start": load0,
                    "uptime_end": uptime,
                    "results": results,
                },
                indent=1,
            )
        )
        Path(f"{args.out}.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
