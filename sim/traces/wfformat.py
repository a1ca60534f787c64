"""WfCommons WfFormat JSON (schema 1.4 and 1.5): a recorded workflow's task DAG and runtimes.

Schema 1.5 keeps the DAG in ``workflow.specification.tasks`` (``id``, ``parents``) and what
happened in ``workflow.execution.tasks`` (``id``, ``runtimeInSeconds``, ``avgCPU`` in %,
``memoryInBytes``, optionally ``coreCount``); 1.4 has one ``workflow.tasks`` list with both.

The instances record no start times and no Kubernetes requests. This reader derives them,
and says so in the trace's notes:

* a task is submitted when all its parents have finished (the engine does that);
* CPU request: ``coreCount`` when the trace has it, else the average CPU rounded up to whole
  cores with 10 % tolerance — ``max(1, ceil(avgCPU/100 − 0.1))`` — as Nextflow asks for whole
  ``cpus``; the pod keeps ``avgCPU/100`` cores busy while it runs;
* memory request: the peak ``memoryInBytes`` rounded up to whole MiB (none when absent);
* runtime: ``runtimeInSeconds``, at least ``MIN_TASK_SECONDS`` (the traces round to whole
  seconds, so ``0`` means "under a second", and a pod takes about that to start and stop).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from joulesched.sim.errors import TraceError
from joulesched.sim.model import PodSpec, Trace, topological_order
from joulesched.sim.traces.common import Fields, round_up_mib

MIN_TASK_SECONDS = 1.0
CPU_TOLERANCE = 0.1  # avgCPU up to 110 % of a core still asks for one core


def cpu_request_from_avg(avg_cpu_percent: float) -> float:
    return float(max(1, math.ceil(avg_cpu_percent / 100.0 - CPU_TOLERANCE)))


def read_wfformat(path: str | Path, *, name: str | None = None) -> Trace:
    path = str(path)
    try:
        doc = orjson.loads(Path(path).read_bytes())
    except OSError as err:
        raise TraceError(path, "", "", f"cannot read: {err.strerror or err}") from err
    except orjson.JSONDecodeError as err:
        raise TraceError(path, "", "", f"not valid JSON: {err}") from err
    return parse_wfformat(doc, path, name=name)


def _mapping(value: Any, path: str, record: str, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TraceError(path, record, field, f"must be a JSON object, got {type(value).__name__}")
    return value


def _list(value: Any, path: str, record: str, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise TraceError(path, record, field, f"must be a JSON array, got {type(value).__name__}")
    return value


def parse_wfformat(doc: Any, path: str, *, name: str | None = None) -> Trace:
    root = _mapping(doc, path, "", "(document)")
    if "workflow" not in root:
        raise TraceError(path, "", "workflow", "is required (is this a WfFormat instance?)")
    wf = _mapping(root["workflow"], path, "", "workflow")
    run = name or Path(path).stem
    if "specification" in wf or "execution" in wf:
        spec = _mapping(wf.get("specification"), path, "", "workflow.specification")
        execution = _mapping(wf.get("execution"), path, "", "workflow.execution")
        spec_tasks = _list(spec.get("tasks"), path, "", "workflow.specification.tasks")
        exec_tasks = _list(execution.get("tasks"), path, "", "workflow.execution.tasks")
        spec_where, exec_where = "workflow.specification.tasks", "workflow.execution.tasks"
    elif "tasks" in wf:
        spec_tasks = exec_tasks = _list(wf.get("tasks"), path, "", "workflow.tasks")
        spec_where = exec_where = "workflow.tasks"
    else:
        raise TraceError(path, "", "workflow.specification", "is required (WfFormat 1.5), or workflow.tasks (1.4)")

    # The DAG. A 1.5 task is known by its id; a 1.4 task by its name (required there; its id, when
    # given, is a short one that parents do not use: "ID0000001" for "mProject_ID0000001").
    first, second = ("id", "name") if spec_where != "workflow.tasks" else ("name", "id")
    ids: list[str] = []
    index: dict[str, int] = {}
    alias: dict[str, int] = {}  # the other field, where parents name a task by it
    task_names: list[str] = []
    for i, raw in enumerate(spec_tasks):
        record = f"{spec_where}[{i}]"
        task = _mapping(raw, path, record, "(task)")
        tid = task.get(first, task.get(second))
        other = task.get(second)
        if isinstance(other, str) and other and other != tid:
            alias.setdefault(other, i)
        if not isinstance(tid, str) or not tid:
            raise TraceError(path, record, "id", f"must be a non-empty string, got {tid!r}")
        if tid in index:
            raise TraceError(path, f"task {tid!r}", "id", "duplicate task id")
        index[tid] = i
        ids.append(tid)
        tname = task.get("name", tid)
        task_names.append(tname if isinstance(tname, str) else tid)
    parents: list[tuple[int, ...]] = []
    for i, raw in enumerate(spec_tasks):
        record = f"task {ids[i]!r}"
        plist = _list(raw.get("parents", []), path, record, "parents")
        resolved = []
        for p in plist:
            if not isinstance(p, str) or (p not in index and p not in alias):
                raise TraceError(path, record, "parents", f"names an unknown task {p!r}")
            resolved.append(index[p] if p in index else alias[p])
        parents.append(tuple(resolved))

    # What happened.
    measured: dict[str, Mapping[str, Any]] = {}
    for i, raw in enumerate(exec_tasks):
        task = _mapping(raw, path, f"{exec_where}[{i}]", "(task)")
        tid = task.get(first, task.get(second))
        if isinstance(tid, str) and tid not in index and tid in alias:
            tid = ids[alias[tid]]
        if not isinstance(tid, str) or tid not in index:
            raise TraceError(path, f"{exec_where}[{i}]", "id", f"names no task of the specification: {tid!r}")
        measured[tid] = task

    pods: list[PodSpec] = []
    derived_cpu = floored = no_memory = 0
    for i, tid in enumerate(ids):
        record = f"task {tid!r}"
        if tid not in measured:
            raise TraceError(path, record, "runtimeInSeconds", "the task has no execution record")
        f = Fields(path, record, measured[tid])
        key = (
            "runtime" if "runtime" in measured[tid] and "runtimeInSeconds" not in measured[tid] else "runtimeInSeconds"
        )
        runtime = f.number(key, required=True)
        avg_cpu = f.number("avgCPU", default=-1.0, minimum=None)
        if f.has("avgCPU") and avg_cpu < 0:
            raise f.fail("avgCPU", f"must be >= 0, got {measured[tid]['avgCPU']!r}")
        cores = f.number("coreCount", default=0.0) if f.has("coreCount") else f.number("cores", default=0.0)
        if f.has("coreCount") and cores < 1:
            raise f.fail("coreCount", f"must be >= 1, got {measured[tid]['coreCount']!r}")
        memory = f.number("memoryInBytes", default=0.0)
        if cores >= 1:
            request = float(math.ceil(cores))
            usage = avg_cpu / 100.0 if avg_cpu >= 0 else request
        elif avg_cpu >= 0:
            request = cpu_request_from_avg(avg_cpu)
            usage = avg_cpu / 100.0
            derived_cpu += 1
        else:
            request, usage = 1.0, 1.0
            derived_cpu += 1
        if runtime < MIN_TASK_SECONDS:
            floored += 1
        if memory <= 0:
            no_memory += 1
        process = task_names[i].rsplit(".", 1)[-1]
        pods.append(
            PodSpec(
                name=f"{run}/{_k8s_name(tid)}",
                duration=max(runtime, MIN_TASK_SECONDS),
                cpu_request=request,
                memory_request=round_up_mib(memory),
                cpu_usage=usage,
                parents=parents[i],
                workflow=run,
                process=process,
            )
        )
    if topological_order(pods) is None:
        raise TraceError(path, "", "parents", "the task graph has a cycle")
    notes = [
        f"WfFormat {root.get('schemaVersion', '?')}: {len(pods)} tasks; submit times derived from the DAG",
        f"{derived_cpu} CPU requests derived from avgCPU as max(1, ceil(avgCPU/100 - {CPU_TOLERANCE}))",
    ]
    if no_memory:
        notes.append(f"{no_memory} tasks without memoryInBytes: no memory request")
    if floored:
        notes.append(f"{floored} runtimes under {MIN_TASK_SECONDS:g} s raised to {MIN_TASK_SECONDS:g} s")
    return Trace(run, path, "wfformat", tuple(pods), tuple(notes))


def _k8s_name(task_id: str) -> str:
    return task_id.lower().replace("_", "-").replace(".", "-")
