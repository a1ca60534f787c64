"""A small cluster's metrics as fixed samples (OpenMetrics, for ``promtool tsdb create-blocks-from``).

Two hours from 2022-06-01T00:00:00Z, one sample every 15 s at seconds 7, 22, 37 and 52 of each
minute — off the minute, so that every one-minute window holds four samples of its own minute
and a step in a gauge never falls on a window's edge. Every counter grows at a constant rate
(hand-checkable); pod wf/p4 lives only from 00:30 to 00:51.

    node a: site north (PUE 1.5; grid 400 gCO2e/kWh until 01:00, then 100; WUE 2 L/kWh;
            renewable share 0.25), server srv-a (1971 kg over 126,144,000 s: 0.015625 g/s);
            200 W measured (cpu 160, dram 40)
    node b: site south (PUE 1.2; 50 g/kWh; WUE 0; renewable 1.0), server srv-b (no embodied
            figure); 40 W
    shop/p1  on a  120 W (cpu 100 + dram 20)  ReplicaSet web-5d (Deployment web), app=web
    shop/p3  on b   10 W cpu                   no owner, app=web tier=cache
    wf/p2    on a   50 W gpu                   Nextflow run happy_euler, NFCORE_RNASEQ_FASTQC
    wf/p4    on a   25 W cpu, 00:30–00:51      Nextflow run happy_euler, NFCORE_RNASEQ_MULTIQC
"""

from __future__ import annotations

from collections.abc import Callable

from joulesched.contracts import names as n

T0 = 1654041600.0  # 2022-06-01T00:00:00Z, a multiple of the 2 h block range
HOUR = 3600.0
FIRST, LAST = 7.0, 6000.0  # the samples' span, inside one 2 h block (retention counts blocks)


def sample_times(first: float = FIRST, last: float = LAST) -> list[float]:
    out, t = [], first
    while t <= last:
        out.append(T0 + t)
        t += 15.0
    return out


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class OpenMetrics:
    def __init__(self) -> None:
        self.families: dict[str, tuple[str, list[str]]] = {}

    def series(
        self,
        family: str,
        kind: str,
        labels: dict[str, str],
        value: Callable[[float], float],
        first: float = FIRST,
        last: float = LAST,
    ) -> None:
        name = f"{family}_total" if kind == "counter" else family
        lines = self.families.setdefault(family, (kind, []))[1]
        for t in sample_times(first, last):
            lines.append(f"{name}{_labels(labels)} {value(t)!r} {t:.3f}")

    def counter(
        self, metric: n.Metric, labels: dict[str, str], watts: float, first: float = FIRST, last: float = LAST
    ) -> None:
        assert metric.name.endswith("_total")
        family = metric.name.removesuffix("_total")
        self.series(family, "counter", labels, lambda t: watts * (t - T0 - first), first, last)

    def gauge(self, name: str, labels: dict[str, str], value: float | Callable[[float], float]) -> None:
        self.series(name, "gauge", labels, value if callable(value) else (lambda t: float(value)))

    def text(self) -> str:
        out = []
        for family, (kind, lines) in self.families.items():
            out.append(f"# TYPE {family} {kind}")
            out.extend(lines)
        out.append("# EOF")
        return "\n".join(out) + "\n"


def cluster() -> str:
    om = OpenMetrics()
    rq = {"idle_policy": "requests"}
    om.counter(n.POD_ENERGY, {"node": "a", "namespace": "shop", "pod": "p1", "domain": "cpu", **rq}, 100.0)
    om.counter(n.POD_ENERGY, {"node": "a", "namespace": "shop", "pod": "p1", "domain": "dram", **rq}, 20.0)
    om.counter(n.POD_ENERGY, {"node": "b", "namespace": "shop", "pod": "p3", "domain": "cpu", **rq}, 10.0)
    om.counter(n.POD_ENERGY, {"node": "a", "namespace": "wf", "pod": "p2", "domain": "gpu", **rq}, 50.0)
    om.counter(
        n.POD_ENERGY,
        {"node": "a", "namespace": "wf", "pod": "p4", "domain": "cpu", **rq},
        25.0,
        first=1807.0,
        last=3067.0,
    )
    om.counter(n.NODE_DOMAIN_ENERGY, {"node": "a", "domain": "cpu"}, 160.0)
    om.counter(n.NODE_DOMAIN_ENERGY, {"node": "a", "domain": "dram"}, 40.0)
    om.counter(n.NODE_DOMAIN_ENERGY, {"node": "b", "domain": "cpu"}, 40.0)
    om.gauge(n.NODE_INFO.name, {"node": "a", "site": "north", "server_id": "srv-a"}, 1.0)
    om.gauge(n.NODE_INFO.name, {"node": "b", "site": "south", "server_id": "srv-b"}, 1.0)
    om.gauge(n.SITE_PUE.name, {"site": "north"}, 1.5)
    om.gauge(n.SITE_PUE.name, {"site": "south"}, 1.2)
    om.gauge(n.SITE_CARBON.name, {"site": "north"}, lambda t: 400.0 if t < T0 + HOUR else 100.0)
    om.gauge(n.SITE_CARBON.name, {"site": "south"}, 50.0)
    om.gauge(n.SITE_WUE.name, {"site": "north"}, 2.0)
    om.gauge(n.SITE_WUE.name, {"site": "south"}, 0.0)
    om.gauge(n.SITE_RENEWABLE.name, {"site": "north"}, 0.25)
    om.gauge(n.SITE_RENEWABLE.name, {"site": "south"}, 1.0)
    om.gauge(n.SERVER_EMBODIED.name, {"server_id": "srv-a"}, 1971000.0)
    om.gauge(n.SERVER_LIFETIME.name, {"server_id": "srv-a"}, 126144000.0)
    # kube-state-metrics
    om.gauge(
        "kube_pod_owner",
        {
            "namespace": "shop",
            "pod": "p1",
            "uid": "u1",
            "owner_kind": "ReplicaSet",
            "owner_name": "web-5d",
            "owner_is_controller": "true",
        },
        1.0,
    )
    om.gauge(
        "kube_pod_owner",
        {
            "namespace": "shop",
            "pod": "p3",
            "uid": "u3",
            "owner_kind": "<none>",
            "owner_name": "<none>",
            "owner_is_controller": "<none>",
        },
        1.0,
    )
    om.gauge(
        "kube_replicaset_owner",
        {
            "namespace": "shop",
            "replicaset": "web-5d",
            "owner_kind": "Deployment",
            "owner_name": "web",
            "owner_is_controller": "true",
        },
        1.0,
    )
    om.gauge("kube_pod_labels", {"namespace": "shop", "pod": "p1", "uid": "u1", "label_app": "web"}, 1.0)
    om.gauge(
        "kube_pod_labels",
        {"namespace": "shop", "pod": "p3", "uid": "u3", "label_app": "web", "label_tier": "cache"},
        1.0,
    )
    for pod, process in (("p2", "NFCORE_RNASEQ_FASTQC"), ("p4", "NFCORE_RNASEQ_MULTIQC")):
        om.gauge(
            "kube_pod_labels",
            {
                "namespace": "wf",
                "pod": pod,
                "uid": f"u-{pod}",
                "label_nextflow_io_app": "nextflow",
                "label_nextflow_io_run_name": "happy_euler",
                "label_nextflow_io_process_name": process,
            },
            1.0,
        )
    return om.text()
