"""Synthetic traces of a given shape, and writers that save any trace in the readers' formats.

* :func:`workflow_shape` — a layered task DAG of ``tasks`` tasks whose critical path is about
  ``makespan`` seconds (many short tasks when there are many tasks per layer);
* :func:`independent_pods` — ``n`` independent pods with Poisson arrivals at a rate that keeps a
  cluster of ``cluster_cores`` cores at about ``utilisation`` (for scale tests);
* :data:`PUBLISHED_SHAPES` — the three nf-core workflows of the published measurement
  comparison (RNASeq 25 min with 9 tasks, Quantms 2 min with 61, Rangeland 3 min with 280);
  their task graphs are not published, so these are shapes of the same size, not replicas.

Everything is deterministic for a seed. :func:`write_wfformat` and :func:`write_pod_csv` write
what :mod:`sim.traces` reads back (round trip).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from joulesched.sim.model import PodSpec, Trace
from joulesched.sim.traces.common import MIB
from joulesched.sim.traces.pods_csv import POD_CSV_COLUMNS

GIB = 1024.0**3


@dataclass(frozen=True)
class WorkflowShape:
    tasks: int
    makespan: float  # seconds, about the critical path
    layers: int
    cores: tuple[int, int]  # request range, whole cores
    usage: tuple[float, float] = (0.6, 1.0)  # busy fraction of the request
    memory_gib: tuple[float, float] = (0.5, 4.0)


PUBLISHED_SHAPES: dict[str, WorkflowShape] = {
    "rnaseq-shape": WorkflowShape(tasks=9, makespan=1500.0, layers=5, cores=(4, 8)),
    "quantms-shape": WorkflowShape(tasks=61, makespan=120.0, layers=6, cores=(1, 4)),
    "rangeland-shape": WorkflowShape(tasks=280, makespan=180.0, layers=4, cores=(1, 2)),
}


def _layer_sizes(tasks: int, layers: int) -> list[int]:
    layers = max(1, min(layers, tasks))
    if layers == 1:
        return [tasks]
    if layers == 2 or tasks < layers + 2:
        base, extra = divmod(tasks, layers)
        return [base + (1 if i < extra else 0) for i in range(layers)]
    middle = tasks - 2  # one task to start (input check) and one to finish (report)
    inner = layers - 2
    base, extra = divmod(middle, inner)
    return [1, *[base + (1 if i < extra else 0) for i in range(inner)], 1]


def workflow_shape(name: str, shape: WorkflowShape, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    sizes = _layer_sizes(shape.tasks, shape.layers)
    budget = shape.makespan / len(sizes)
    pods: list[PodSpec] = []
    previous: list[int] = []
    for layer, size in enumerate(sizes):
        current = []
        longest = int(rng.integers(size))  # one task per layer takes the whole budget
        for k in range(size):
            factor = 1.0 if k == longest else float(rng.uniform(0.3, 1.0))
            cores = int(rng.integers(shape.cores[0], shape.cores[1] + 1))
            usage = cores * float(rng.uniform(*shape.usage))
            if previous:
                count = min(len(previous), int(rng.integers(1, 3)))
                parents = tuple(sorted(int(p) for p in rng.choice(previous, size=count, replace=False)))
            else:
                parents = ()
            current.append(len(pods))
            pods.append(
                PodSpec(
                    name=f"{name}/t{len(pods):04d}",
                    duration=round(budget * factor, 3),
                    cpu_request=float(cores),
                    memory_request=round(float(rng.uniform(*shape.memory_gib)) * GIB / MIB) * MIB,
                    cpu_usage=round(usage, 4),
                    parents=parents,
                    workflow=name,
                    process=f"STEP_{layer + 1}",
                )
            )
        previous = current
    notes = (
        f"synthetic workflow: {shape.tasks} tasks in {len(sizes)} layers, critical path ≈ {shape.makespan:g} s (seed {seed})",
    )
    return Trace(name, f"synthetic:{name}", "synthetic", tuple(pods), notes)


def independent_pods(
    n: int,
    *,
    cluster_cores: float,
    utilisation: float = 0.6,
    mean_duration: float = 300.0,
    cores: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0),
    usage: tuple[float, float] = (0.5, 1.0),
    memory_gib_per_core: tuple[float, float] = (1.0, 4.0),
    seed: int = 0,
    name: str = "synthetic-pods",
) -> Trace:
    """Independent pods whose mean request × mean duration × rate fills ``utilisation`` of the cluster."""
    rng = np.random.default_rng(seed)
    request = rng.choice(np.asarray(cores, dtype=float), size=n)
    duration = rng.exponential(mean_duration, size=n) + 1.0
    rate = utilisation * cluster_cores / (float(np.mean(cores)) * (mean_duration + 1.0))
    arrival = np.cumsum(rng.exponential(1.0 / rate, size=n))
    busy = request * rng.uniform(*usage, size=n)
    memory = np.round(request * rng.uniform(*memory_gib_per_core, size=n) * GIB / MIB) * MIB
    pods = tuple(
        PodSpec(
            name=f"{name}-{i}",
            duration=float(duration[i]),
            cpu_request=float(request[i]),
            memory_request=float(memory[i]),
            cpu_usage=float(busy[i]),
            arrival=float(arrival[i]),
        )
        for i in range(n)
    )
    notes = (f"synthetic pods: {n} at {rate:.3g}/s for ≈{utilisation:.0%} of {cluster_cores:g} cores (seed {seed})",)
    return Trace(name, f"synthetic:{name}", "synthetic", pods, notes)


def write_wfformat(trace: Trace, path: str | Path) -> None:
    """Save a workflow trace as a WfFormat 1.5 instance (requests as coreCount)."""
    ids = [p.name.rsplit("/", 1)[-1] for p in trace.pods]
    children: list[list[str]] = [[] for _ in trace.pods]
    for i, p in enumerate(trace.pods):
        for parent in p.parents:
            children[parent].append(ids[i])
    doc = {
        "name": trace.name,
        "description": "Synthetic workflow written by joulesched sim",
        "schemaVersion": "1.5",
        "workflow": {
            "specification": {
                "tasks": [
                    {
                        "name": p.process or ids[i],
                        "id": ids[i],
                        "parents": [ids[j] for j in p.parents],
                        "children": children[i],
                    }
                    for i, p in enumerate(trace.pods)
                ],
                "files": [],
            },
            "execution": {
                "makespanInSeconds": 0,
                "executedAt": "1970-01-01T00:00:00+00:00",
                "tasks": [
                    {
                        "id": ids[i],
                        "runtimeInSeconds": p.duration,
                        "coreCount": max(1, round(p.cpu_request)),
                        "avgCPU": round(p.cpu_usage * 100.0, 4),
                        "memoryInBytes": int(p.memory_request),
                    }
                    for i, p in enumerate(trace.pods)
                ],
                "machines": [],
            },
        },
    }
    Path(path).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def write_pod_csv(trace: Trace, path: str | Path) -> None:
    """Save any trace as a generic pod CSV."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(POD_CSV_COLUMNS)
    for p in trace.pods:
        writer.writerow(
            [
                p.name,
                repr(p.arrival),
                repr(p.duration),
                repr(p.cpu_request),
                int(p.memory_request),
                p.gpu_request,
                "|".join(p.gpu_models),
                repr(p.cpu_usage),
                repr(p.gpu_usage),
                p.priority,
                p.group,
                p.workflow,
                p.process,
                p.namespace,
                ";".join(trace.pods[j].name for j in p.parents),
                "" if p.max_delay is None else repr(p.max_delay),
            ]
        )
    Path(path).write_text(buf.getvalue(), encoding="utf-8")
