"""``joulesched report --tenant`` over the whole path, with no joulesched metric anywhere:

provider: the agent's RegistrarClient registers a 2 × 16-core server and its Pusher writes the
server's windows into a real InfluxDB (tests/nadiki_tenant.py);
tenant: a real Prometheus holding only cAdvisor's ``container_cpu_usage_seconds_total`` and
kube-state-metrics' ``kube_pod_info``, ``kube_node_labels`` and ``kube_node_status_capacity``
(OpenMetrics turned into a block by ``promtool tsdb create-blocks-from openmetrics``, as in
test_report_prometheus.py).

Two VMs stand on the server: vm-a (16 vCPUs: a quarter of its 64 logical CPUs) and vm-b (32:
a half); vm-c has no server label. The expected figures are computed here from the server's
true power (the counter's integral) and the pods' true CPU rates.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joulesched.impact import cli as report_cli
from tests.impact.cluster import FIRST, LAST, OpenMetrics
from tests.nadiki_tenant import BUCKET, T0, Host, Provider, provider
from tests.prometheus_server import PrometheusServer, require

pytestmark = pytest.mark.prometheus

HOST = Host("FAC-1", "RACK-1", base_watts=300.0, swing_watts=120.0, rated_kw=0.6)
START, END = T0 + 600, T0 + 5400
STEP = 60.0
VCPUS = {"vm-a": 16.0, "vm-b": 32.0, "vm-c": 8.0}
SHARE = {"vm-a": 16 / 64, "vm-b": 32 / 64}
# (node, namespace, pod, container) -> (cores, first, last): seconds after T0 the counter runs
CONTAINERS = {
    ("vm-a", "shop", "web-1", "app"): (2.0, FIRST, LAST),
    ("vm-a", "shop", "web-1", "sidecar"): (0.5, FIRST, LAST),
    ("vm-a", "shop", "web-2", "app"): (1.0, FIRST, LAST),
    ("vm-a", "wf", "task-1", "main"): (4.0, 1807.0, 3067.0),
    ("vm-a", "kube-system", "coredns", "coredns"): (0.1, FIRST, LAST),
    ("vm-b", "batch", "job-1", "main"): (8.0, FIRST, LAST),
    ("vm-c", "other", "x", "main"): (3.0, FIRST, LAST),
}


def exposition(server_id: str) -> str:
    om = OpenMetrics()
    pod_cores: dict[tuple[str, str, str], float] = {}
    for (node, ns, pod, container), (cores, first, last) in CONTAINERS.items():
        labels = {
            "container": container,
            "cpu": "total",
            "id": f"/kubepods/burstable/pod-{pod}/{container}",
            "image": f"registry.example/{container}:1",
            "name": f"{pod}-{container}",
            "namespace": ns,
            "pod": pod,
        }
        om.series(
            "container_cpu_usage_seconds",
            "counter",
            labels,
            lambda t, c=cores, f=first: c * (t - T0 - f),
            first,
            last,
        )
        if (first, last) == (FIRST, LAST):
            pod_cores[(node, ns, pod)] = pod_cores.get((node, ns, pod), 0.0) + cores
    # the pod-level cgroups and the root cgroup, which count the same CPU again
    for (_, ns, pod), cores in pod_cores.items():
        labels = {"container": "", "cpu": "total", "id": f"/kubepods/burstable/pod-{pod}", "namespace": ns, "pod": pod}
        om.series("container_cpu_usage_seconds", "counter", labels, lambda t, c=cores: c * (t - T0 - FIRST))
    om.series(
        "container_cpu_usage_seconds", "counter", {"container": "", "cpu": "total", "id": "/"}, lambda t: 20 * (t - T0)
    )
    for node, ns, pod in sorted({k[:3] for k in CONTAINERS}):
        om.gauge(
            "kube_pod_info",
            {
                "namespace": ns,
                "pod": pod,
                "uid": f"uid-{pod}",
                "host_ip": "10.0.0.1",
                "pod_ip": "10.1.0.1",
                "node": node,
                "created_by_kind": "<none>",
                "created_by_name": "<none>",
                "priority_class": "",
                "host_network": "false",
            },
            1.0,
        )
    # kube-state-metrics' owners: shop's two pods belong to Deployment web through ReplicaSet web-5d
    for pod_name in ("web-1", "web-2"):
        owner = {"owner_kind": "ReplicaSet", "owner_name": "web-5d", "owner_is_controller": "true"}
        om.gauge("kube_pod_owner", {"namespace": "shop", "pod": pod_name, "uid": f"uid-{pod_name}", **owner}, 1.0)
    deployment = {"owner_kind": "Deployment", "owner_name": "web", "owner_is_controller": "true"}
    om.gauge("kube_replicaset_owner", {"namespace": "shop", "replicaset": "web-5d", **deployment}, 1.0)
    for node, cpus in VCPUS.items():
        om.gauge("kube_node_status_capacity", {"node": node, "resource": "cpu", "unit": "core"}, cpus)
        labels = {"node": node, "label_kubernetes_io_hostname": node}
        if node != "vm-c":
            labels["label_joulesched_io_server_id"] = server_id
        om.gauge("kube_node_labels", labels, 1.0)
    return om.text()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Provider, PrometheusServer, str]]:
    promtool = require("promtool")
    base = tmp_path_factory.mktemp("tenant")
    with provider(base, [HOST], T0 + 3.0, T0 + LAST) as side:
        (server_id,) = side.servers
        (base / "tenant.om").write_text(exposition(server_id))
        workdir = base / "prometheus"
        done = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(base / "tenant.om"), str(workdir / "data")],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        prom = PrometheusServer(workdir, [])
        try:
            yield side, prom, server_id
        finally:
            prom.stop()


def report(world: tuple[Provider, PrometheusServer, str], tmp_path: Path, *args: str) -> dict[str, Any]:
    side, prom, _ = world
    out = tmp_path / "report.json"
    code = report_cli.main(
        [
            "--tenant",
            "--prometheus",
            prom.url,
            "--registrar",
            side.registrar_url,
            "--influx",
            side.influx.url,
            "--database",
            BUCKET,
            "--start",
            str(START),
            "--end",
            str(END),
            "--format",
            "json",
            "--output",
            str(out),
            *args,
        ]
    )
    assert code == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def true_cpu(node: str, lo: float, hi: float) -> dict[str, float]:
    """CPU seconds per namespace of a node's containers in (lo, hi] (seconds after T0)."""
    out: dict[str, float] = {}
    for (n, ns, _, _), (cores, first, last) in CONTAINERS.items():
        if n == node:
            out[ns] = out.get(ns, 0.0) + cores * max(0.0, min(hi, last) - max(lo, first))
    return out


def expected(node: str) -> dict[str, float]:
    """Namespace joules: Σ over steps of the server's true energy × share × the namespace's CPU part."""
    out: dict[str, float] = {}
    t = START
    while t + STEP <= END + 1e-9:
        server = HOST.counter(t + STEP) - HOST.counter(t)
        cpu = true_cpu(node, t - T0, t + STEP - T0)
        total = sum(cpu.values())
        for ns, seconds in cpu.items():
            out[ns] = out.get(ns, 0.0) + SHARE[node] * server * seconds / total
        t += STEP
    return out


def test_per_namespace_energy_is_the_servers_times_the_vms_share_split_by_cpu(
    world: tuple[Provider, PrometheusServer, str], tmp_path: Path
) -> None:
    doc = report(world, tmp_path, "--intensity", "300", "--pue", "1.2")
    got = {row["namespace"]: row["it_kwh"] * 3.6e6 for row in doc["rows"]}
    want = {**expected("vm-a"), **expected("vm-b")}
    assert set(got) == set(want)  # vm-c's pod has no server: not in the report
    for ns, joules in want.items():
        print(f"namespace {ns}: {got[ns]:.1f} J, expected {joules:.1f} J ({100 * (got[ns] / joules - 1):+.4f} %)")
        assert got[ns] == pytest.approx(joules, rel=0.01), ns
    # conservation: the namespaces add up to the VMs' shares of the server's true energy
    server = HOST.counter(END) - HOST.counter(START)
    print(
        f"sum {sum(got.values()):.1f} J, 0.75 × server {0.75 * server:.1f} J ({100 * (sum(got.values()) / (0.75 * server) - 1):+.5f} %)"
    )
    assert sum(got.values()) == pytest.approx(0.75 * server, rel=1e-3)
    total = doc["total"]
    assert total["operational_gco2e"] == pytest.approx(total["it_kwh"] * 1.2 * 300, rel=1e-9)
    assert any("node vm-a is 0.25 of server" in note for note in doc["notes"])


def test_the_namespaces_add_up_exactly_to_the_pushed_windows(
    world: tuple[Provider, PrometheusServer, str], tmp_path: Path
) -> None:
    side, _, server_id = world
    doc = report(world, tmp_path)
    rows = doc["rows"]
    answer = side.influx.query(
        f"SELECT sum(server_energy_consumption_joules) FROM server WHERE server_id = '{server_id}' "
        f"AND time >= {int(START)}s AND time < {int(END)}s",
        BUCKET,
    )
    pushed = answer["results"][0]["series"][0]["values"][0][1]
    assert math.fsum(r["it_kwh"] for r in rows) * 3.6e6 == pytest.approx(0.75 * pushed, rel=1e-9)
    assert "no --intensity" in " ".join(doc["notes"])


def test_a_namespace_scope_keeps_the_other_pods_in_the_split(
    world: tuple[Provider, PrometheusServer, str], tmp_path: Path
) -> None:
    doc = report(world, tmp_path, "--namespace", "wf", "--by", "pod")
    (row,) = doc["rows"]
    assert row["pod"] == "task-1"
    assert row["it_kwh"] * 3.6e6 == pytest.approx(expected("vm-a")["wf"], rel=0.01)


def test_the_providers_per_vm_figure_replaces_the_vcpu_share(
    world: tuple[Provider, PrometheusServer, str], tmp_path: Path
) -> None:
    doc = report(world, tmp_path, "--share", "provider", "--vm-share", "vm-a=0.1", "--vm-share", "vm-b=0.3")
    server = HOST.counter(END) - HOST.counter(START)
    assert sum(r["it_kwh"] for r in doc["rows"]) * 3.6e6 == pytest.approx(0.4 * server, rel=1e-3)


@pytest.mark.parametrize(
    ("args", "message", "status"),
    [
        (["--share", "provider", "--vm-share", "vm-a=0.1"], "no --vm-share vm-b=FRACTION", 1),
        (["--vm-share", "vm-a=0.1"], "--vm-share is the provider's figure", 2),  # a usage error, before any query
        (["--step", "45s"], "must be a whole multiple of the server's window (30 s)", 1),
    ],
    ids=["a VM without the provider's figure", "a figure without --share provider", "a step off the windows"],
)
def test_what_cannot_be_computed_is_refused_with_the_reason(
    world: tuple[Provider, PrometheusServer, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
    status: int,
) -> None:
    side, prom, _ = world
    code = report_cli.main(
        [
            *("--tenant", "--prometheus", prom.url, "--registrar", side.registrar_url, "--influx", side.influx.url),
            *("--database", BUCKET, "--start", str(START), "--end", str(END), *args),
        ]
    )
    assert code == status
    assert message in capsys.readouterr().err


def test_steps_without_the_servers_windows_are_gaps_named_in_the_notes(
    world: tuple[Provider, PrometheusServer, str], tmp_path: Path
) -> None:
    """The provider's first whole window starts at T0 + 30 s: the steps up to T0 + 60 s lack one."""
    side, prom, server_id = world
    out = tmp_path / "gaps.json"
    args = ["--tenant", "--prometheus", prom.url, "--registrar", side.registrar_url, "--influx", side.influx.url]
    args += ["--database", BUCKET, "--start", str(T0 - 300), "--end", str(T0 + 600), "--format", "json", "-o", str(out)]
    assert report_cli.main(args) == 0
    doc = json.loads(out.read_text())
    assert f"note: server {server_id}: 6 of 15 steps lack a window of its energy" in " ".join(doc["notes"])
    server = HOST.counter(T0 + 600) - HOST.counter(T0 + 60)
    assert sum(r["it_kwh"] for r in doc["rows"]) * 3.6e6 == pytest.approx(0.75 * server, rel=1e-3)


def test_rows_per_workload_follow_kube_state_metrics_owners(
    world: tuple[Provider, PrometheusServer, str], tmp_path: Path
) -> None:
    every = report(world, tmp_path, "--by", "owner")
    rows = {(r["namespace"], r["owner"]): r["it_kwh"] * 3.6e6 for r in every["rows"]}
    assert rows[("shop", "ReplicaSet/web-5d")] == pytest.approx(expected("vm-a")["shop"], rel=0.01)
    assert ("wf", "<none>") in rows  # a pod without a controller keeps its own row
    scoped = report(world, tmp_path, "--owner", "Deployment/web", "--by", "owner")
    (row,) = scoped["rows"]
    assert row["owner"] == "ReplicaSet/web-5d" and row["pods"] == 2
    assert row["it_kwh"] * 3.6e6 == pytest.approx(rows[("shop", "ReplicaSet/web-5d")], rel=1e-9)
