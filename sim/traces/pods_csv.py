"""Pod lists in CSV: the generic format of this simulator, and Alibaba's "openb" cluster trace.

Generic pod CSV (one pod per line; only ``arrival`` and ``duration`` are required)::

    name,arrival,duration,cpu_request,memory_request,gpu_request,cpu_usage,gpu_usage,priority,group,workflow,process,namespace,parents
    web-1,0,600,500m,1Gi,0,0.35,,,web,,,,
    train-1,12.5,3600,8,64Gi,1,7.5,0.9,,,,,,

``arrival``/``duration`` in seconds; requests as Kubernetes quantities or plain numbers
(cores, bytes); ``cpu_usage`` in cores (default: the request, or 0.1 without one);
``gpu_usage`` 0..1 per GPU (default 1 when GPUs are requested); ``group`` names the
ReplicaSet/Service the pod belongs to (default spreading applies); ``parents`` lists pod
names, separated by ``;``, that must finish first; ``gpu_model`` the GPU models a GPU pod
accepts, separated by ``|`` (a node affinity on ``nvidia.com/gpu.product``; default: any);
``max_delay`` makes the pod (or its workflow) deferrable: seconds after ``arrival`` by which its
work must be done, the simulator holding it for cleaner hours meanwhile (default: not deferrable).

Alibaba openb (``openb_pod_list_*.csv``): ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,
gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`` in seconds. A pod arrives
at ``creation_time`` and runs ``deletion_time − scheduled_time``; pods that were never
scheduled (``Pending``) are skipped. The trace has requests only: a pod is assumed to keep
``cpu_usage_fraction`` of its CPU request busy (default 1.0) and each GPU busy at
``gpu_milli/1000`` (its share of a GPU). A fractional GPU request asks for a whole GPU, as
Kubernetes has no GPU sharing without a device plugin that provides it. ``gpu_spec`` names the
GPU models a pod accepts (``V100M16|V100M32``; empty: any), kept as a node affinity on the GPU
model (``openb_pod_list_default.csv`` names none: all of its 8,152 pods leave it empty).
Nodes (``openb_node_list_*.csv``): ``sn,cpu_milli,memory_mib,gpu,model``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from joulesched.sim.errors import TraceError
from joulesched.sim.model import DEFAULT_NAMESPACE, PodSpec, Trace, topological_order
from joulesched.sim.traces.common import MIB, Fields, read_text

POD_CSV_COLUMNS = (
    "name",
    "arrival",
    "duration",
    "cpu_request",
    "memory_request",
    "gpu_request",
    "gpu_model",
    "cpu_usage",
    "gpu_usage",
    "priority",
    "group",
    "workflow",
    "process",
    "namespace",
    "parents",
    "max_delay",
)
OPENB_POD_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
DEFAULT_USAGE_WITHOUT_REQUEST = 0.1  # cores


def _rows(path: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The header and each row with its line number (the file's: blank lines counted)."""
    text = read_text(path)
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    if not header:
        raise TraceError(path, "", "", "empty file (expected a CSV header line)")
    reader.fieldnames = header
    rows = []
    for row in reader:
        lineno = reader.line_num
        if None in row or any(v is None for v in row.values()):
            raise TraceError(
                path, f"line {lineno}", "", f"has a different number of fields than the header ({len(header)})"
            )
        rows.append((lineno, row))
    return header, rows


def looks_like_openb(header: list[str]) -> bool:
    return "cpu_milli" in header and "creation_time" in header


def read_pod_csv(path: str | Path, *, name: str | None = None) -> Trace:
    path = str(path)
    header, rows = _rows(path)
    if looks_like_openb(header):
        return read_openb_pods(path, name=name)
    unknown = [h for h in header if h not in POD_CSV_COLUMNS]
    if unknown:
        raise TraceError(path, "line 1 (header)", unknown[0], f"unknown column (known: {', '.join(POD_CSV_COLUMNS)})")
    for required in ("arrival", "duration"):
        if required not in header:
            raise TraceError(path, "line 1 (header)", required, "column is required")
    run = name or Path(path).stem
    pods: list[PodSpec] = []
    names: dict[str, int] = {}
    pending_parents: list[tuple[int, Fields, list[str]]] = []
    for lineno, row in rows:
        pod_name = (row.get("name") or "").strip() or f"{run}-{lineno - 1}"
        f = Fields(path, f"line {lineno} (pod {pod_name!r})", row)
        if pod_name in names:
            raise f.fail("name", "duplicate pod name")
        cpu = f.quantity("cpu_request")
        gpus = f.quantity("gpu_request")
        if gpus != int(gpus):
            raise f.fail("gpu_request", f"must be a whole number of GPUs, got {row['gpu_request']!r}")
        usage = f.number("cpu_usage", default=cpu if cpu > 0 else DEFAULT_USAGE_WITHOUT_REQUEST)
        gpu_usage = f.number("gpu_usage", default=1.0 if gpus else 0.0)
        if gpu_usage > 1:
            raise f.fail("gpu_usage", f"must be <= 1 (a fraction of each GPU), got {row['gpu_usage']!r}")
        models = gpu_models(f.text("gpu_model"))
        if models and not gpus:
            raise f.fail("gpu_model", f"names GPU models for a pod that requests no GPU, got {row['gpu_model']!r}")
        priority = f.number("priority", default=0.0, minimum=None)
        if priority != int(priority):
            raise f.fail("priority", f"must be a whole number, got {row['priority']!r}")
        names[pod_name] = len(pods)
        parents = [p.strip() for p in f.text("parents").split(";") if p.strip()]
        if parents:
            pending_parents.append((len(pods), f, parents))
        pods.append(
            PodSpec(
                name=pod_name,
                duration=f.number("duration", required=True),
                cpu_request=cpu,
                memory_request=f.quantity("memory_request"),
                gpu_request=int(gpus),
                gpu_models=models,
                cpu_usage=usage,
                gpu_usage=gpu_usage,
                arrival=f.number("arrival", required=True),
                workflow=f.text("workflow"),
                process=f.text("process"),
                group=f.text("group"),
                priority=int(priority),
                namespace=f.text("namespace", default=DEFAULT_NAMESPACE),
                max_delay=f.number("max_delay") if f.has("max_delay") else None,
            )
        )
    for i, f, parents in pending_parents:
        resolved = []
        for parent in parents:
            if parent not in names:
                raise f.fail("parents", f"names an unknown pod {parent!r}")
            resolved.append(names[parent])
        pods[i] = replace(pods[i], parents=tuple(resolved))
    if not pods:
        raise TraceError(path, "", "", "no pods (only a header)")
    if topological_order(pods) is None:
        raise TraceError(path, "", "parents", "the pods' parent links form a cycle")
    return Trace(run, path, "pod-csv", tuple(pods), (f"pod CSV: {len(pods)} pods",))


def read_openb_pods(path: str | Path, *, name: str | None = None, cpu_usage_fraction: float = 1.0) -> Trace:
    path = str(path)
    header, rows = _rows(path)
    for column in OPENB_POD_COLUMNS:
        if column not in header:
            raise TraceError(
                path,
                "line 1 (header)",
                column,
                f"column is required for an openb pod list (columns: {', '.join(header)})",
            )
    run = name or Path(path).stem
    pods: list[PodSpec] = []
    skipped = 0
    for lineno, row in rows:
        pod_name = (row.get("name") or "").strip() or f"line-{lineno}"
        f = Fields(path, f"line {lineno} (pod {pod_name!r})", row)
        created = f.number("creation_time", required=True)
        if not f.has("scheduled_time"):
            skipped += 1  # never scheduled in the recorded cluster
            continue
        scheduled = f.number("scheduled_time")
        deleted = f.number("deletion_time", required=True)
        if deleted < scheduled:
            raise f.fail("deletion_time", f"is before scheduled_time ({scheduled:g}), got {deleted:g}")
        if scheduled < created:
            raise f.fail("scheduled_time", f"is before creation_time ({created:g}), got {scheduled:g}")
        cpu = f.number("cpu_milli", required=True) / 1000.0
        gpus = f.integer("num_gpu")
        gpu_milli = f.number("gpu_milli", default=0.0)
        if gpu_milli > 1000:
            raise f.fail("gpu_milli", f"must be <= 1000 (a share of one GPU), got {row['gpu_milli']!r}")
        pods.append(
            PodSpec(
                name=pod_name,
                duration=deleted - scheduled,
                cpu_request=cpu,
                memory_request=f.number("memory_mib", required=True) * MIB,
                gpu_request=gpus,
                gpu_models=gpu_models(f.text("gpu_spec")) if gpus else (),
                cpu_usage=cpu * cpu_usage_fraction,
                gpu_usage=gpu_milli / 1000.0 if gpus else 0.0,
                arrival=created,
                priority=1 if f.text("qos").upper() == "LS" else 0,
            )
        )
    if not pods:
        raise TraceError(path, "", "", "no pod was ever scheduled in this trace")
    notes = [
        f"openb: {len(pods)} pods; CPU usage assumed {cpu_usage_fraction:g} × request (the trace has requests only)",
    ]
    if skipped:
        notes.append(f"{skipped} never-scheduled (Pending) pods skipped")
    return Trace(run, path, "openb", tuple(pods), tuple(notes))


def gpu_models(spec: str) -> tuple[str, ...]:
    """The GPU models a pod accepts: openb's ``gpu_spec`` (``V100M16|V100M32``; empty: any)."""
    return tuple(dict.fromkeys(m.strip() for m in spec.split("|") if m.strip()))


@dataclass(frozen=True)
class OpenbNode:
    name: str
    cpu_cores: float
    memory_bytes: float
    gpus: int
    gpu_model: str


def read_openb_nodes(path: str | Path) -> list[OpenbNode]:
    path = str(path)
    header, rows = _rows(path)
    for column in OPENB_NODE_COLUMNS:
        if column not in header:
            raise TraceError(path, "line 1 (header)", column, "column is required for an openb node list")
    nodes = []
    for lineno, row in rows:
        node_name = (row.get("sn") or "").strip()
        f = Fields(path, f"line {lineno} (node {node_name!r})", row)
        if not node_name:
            raise f.fail("sn", "is required")
        cpu = f.number("cpu_milli", required=True)
        if cpu <= 0:
            raise f.fail("cpu_milli", f"must be > 0, got {row['cpu_milli']!r}")
        nodes.append(
            OpenbNode(
                node_name, cpu / 1000.0, f.number("memory_mib", required=True) * MIB, f.integer("gpu"), f.text("model")
            )
        )
    return nodes
