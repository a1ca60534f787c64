"""``joulesched sim demo``: the shipped example end to end, in under a minute.

* **Scheduling**: every shipped nf-core workflow (real WfFormat executions) submitted
  ``COPIES`` times at seeded random moments over ``WINDOW_SECONDS``, on the example
  heterogeneous cluster (real SPECpower curves in three US grid regions, hourly 2022 carbon
  intensity, a cluster-autoscaler-like scale-down), with the four policies; then the same with
  every node always powered (sensitivity).
* **Attribution**: workflows of the three published shapes (RNASeq 25 min / 9 tasks, Quantms
  2 min / 61 tasks, Rangeland 3 min / 280 tasks, synthesised) and four real nf-core workflows,
  each alone on a small dedicated cluster, measured by every method.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from joulesched.sim.cluster import load_cluster
from joulesched.sim.model import Trace, Workload
from joulesched.sim.runner import POLICIES, VARIANTS, RunOptions
from joulesched.sim.traces import read_wfformat
from joulesched.sim.traces.synthetic import PUBLISHED_SHAPES, workflow_shape

DATA = Path(__file__).with_name("data")
EXAMPLE_CLUSTER = DATA / "clusters" / "example.yaml"
ATTRIBUTION_CLUSTER = DATA / "clusters" / "attribution.yaml"
COPIES = 4  # submissions of each workflow
WINDOW_SECONDS = 2 * 3600.0  # over which they are submitted
ATTRIBUTION_REAL = ("rnaseq-dirt02-001", "chipseq-dirt02-001", "methylseq-dirt02-001", "fetchngs-dirt02-001")


def shipped_workflows() -> list[Trace]:
    return [read_wfformat(p) for p in sorted((DATA / "workflows").glob("*.json"))]


def demo_workload(seed: int = 0, copies: int = COPIES, window: float = WINDOW_SECONDS) -> Workload:
    """Each shipped workflow ``copies`` times, submitted at uniform random times in ``window``."""
    rng = np.random.default_rng(seed)
    traces = []
    for trace in shipped_workflows():
        for k, offset in enumerate(np.sort(rng.uniform(0.0, window, size=copies))):
            traces.append(trace.shifted(float(offset), f"#{k + 1}"))
    traces.sort(key=lambda t: min(p.arrival for p in t.pods))
    return Workload.of(traces)


def attribution_workloads(seed: int = 0) -> list[Workload]:
    shapes = [workflow_shape(name, shape, seed) for name, shape in PUBLISHED_SHAPES.items()]
    real = [t for t in shipped_workflows() if t.name in ATTRIBUTION_REAL]
    return [Workload.of([t]) for t in (*shapes, *real)]


def run_demo(
    out: Path,
    seed: int = 0,
    extender_urls: Mapping[str, str] | None = None,
    extender_profiles: Mapping[str, str] | None = None,
) -> int:
    from joulesched.sim.execute import execute

    cluster = load_cluster(EXAMPLE_CLUSTER)
    workload = demo_workload(seed)
    opts = RunOptions(
        policies=POLICIES + VARIANTS,
        seed=seed,
        extender_urls=dict(extender_urls or {}),
        extender_profiles=dict(extender_profiles or {}),
        workdir=str(out / "extender"),
    )
    print(f"joulesched sim demo: {len(workload.pods):,} pods of {len(workload.workflows)} nf-core workflow runs on {cluster.node_count} nodes")
    execute(
        cluster,
        workload,
        opts,
        out,
        attribution_cluster=load_cluster(ATTRIBUTION_CLUSTER),
        attribution_workloads=attribution_workloads(seed),
        sensitivity=True,
        inputs=[str(p.relative_to(DATA.parent.parent)) if p.is_relative_to(DATA.parent.parent) else str(p) for p in sorted((DATA / "workflows").glob("*.json"))],
    )
    return 0
