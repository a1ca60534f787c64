"""The simulator's plain data: the pods a trace asks for, and a workload made of traces.

Units at this boundary are SI: seconds, bytes, cores (a float; 0.5 = 500m) and whole GPUs.
A pod's ``duration`` is its runtime on a node of relative speed 1.0; on a node of speed ``s``
it runs ``duration / s``. ``cpu_request`` is what the scheduler sees, ``cpu_usage`` how many
cores the pod keeps busy while it runs (what the power model sees).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    duration: float  # seconds on a speed-1.0 node
    cpu_request: float = 0.0  # cores; 0: no request (kube-scheduler scores it as 100m)
    memory_request: float = 0.0  # bytes; 0: no request (scored as 200 MiB)
    gpu_request: int = 0
    gpu_models: tuple[str, ...] = ()  # GPU models the pod accepts (a node affinity on the GPU product label); (): any
    cpu_usage: float = 0.0  # cores busy while running
    gpu_usage: float = 0.0  # 0..1, how busy each requested GPU is
    arrival: float = 0.0  # seconds after the trace starts (independent pods and workflow roots)
    parents: tuple[int, ...] = ()  # indices, within the same trace, of pods that must finish first
    workflow: str = ""  # the workflow run this pod belongs to ("" for an independent pod)
    process: str = ""  # the workflow's process (Nextflow) or task type
    group: str = ""  # the ReplicaSet/Service its labels match ("" for a bare pod)
    priority: int = 0
    namespace: str = DEFAULT_NAMESPACE
    # Carbon-aware deferral: the pod's work (its workflow's, for a workflow) may start up to this
    # long after it is submitted and must be done by then (seconds); None: not deferrable.
    max_delay: float | None = None


@dataclass(frozen=True)
class Trace:
    """The pods of one trace file, in file order; ``parents`` index into ``pods``."""

    name: str
    source: str  # the file it came from
    kind: str  # wfformat | nextflow-trace | pod-csv | openb | synthetic
    pods: tuple[PodSpec, ...]
    notes: tuple[str, ...] = ()  # what the reader derived or assumed (shown in the report)

    @property
    def workflows(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.workflow for p in self.pods if p.workflow))

    def shifted(self, offset: float, suffix: str = "") -> Trace:
        """The same trace starting ``offset`` seconds later; ``suffix`` renames its workflows."""

        def move(p: PodSpec) -> PodSpec:
            return replace(
                p,
                arrival=p.arrival + offset,
                name=p.name + suffix,
                workflow=p.workflow + suffix if p.workflow else "",
            )

        return replace(self, name=self.name + suffix, pods=tuple(move(p) for p in self.pods))

    def deferrable(self, max_delay: float) -> Trace:
        """The same trace with every pod that sets no ``max_delay`` of its own given this one."""
        return replace(
            self, pods=tuple(p if p.max_delay is not None else replace(p, max_delay=max_delay) for p in self.pods)
        )


@dataclass(frozen=True)
class Workload:
    """Every pod of every trace, with parent links resolved to global indices."""

    pods: tuple[PodSpec, ...]
    traces: tuple[Trace, ...] = field(default=())

    @classmethod
    def of(cls, traces: Iterable[Trace]) -> Workload:
        traces = tuple(traces)
        pods: list[PodSpec] = []
        for trace in traces:
            base = len(pods)
            for p in trace.pods:
                pods.append(replace(p, parents=tuple(base + i for i in p.parents)) if p.parents else p)
        return cls(tuple(pods), traces)

    @property
    def workflows(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.workflow for p in self.pods if p.workflow))

    def notes(self) -> list[str]:
        """What the readers derived, once per source file (repeated submissions share notes)."""
        seen: set[str] = set()
        out = []
        for t in self.traces:
            if t.source in seen:
                continue
            seen.add(t.source)
            label = t.name.split("#", 1)[0]
            out += [f"{label}: {n}" for n in t.notes]
        return out


def repeat(trace: Trace, times: int, every: float) -> list[Trace]:
    """``times`` copies of a trace submitted ``every`` seconds apart (runs named ``#1``, ``#2`` …)."""
    if times <= 1:
        return [trace]
    return [trace.shifted(k * every, f"#{k + 1}") for k in range(times)]


def topological_order(pods: Sequence[PodSpec]) -> list[int] | None:
    """Indices in an order where parents come first, or ``None`` when the graph has a cycle."""
    children: list[list[int]] = [[] for _ in pods]
    waiting = [len(p.parents) for p in pods]
    for i, p in enumerate(pods):
        for parent in p.parents:
            children[parent].append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for c in children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    return order if len(order) == len(pods) else None
