"""Nextflow's ``-with-weblog``: one measurement window per run, from the events Nextflow posts.

Nextflow (``nf-weblog``, ``WebLogObserver``) POSTs one JSON object per event::

    {"runName": "friendly_pesquet", "runId": "170aa09c-…", "event": "started",
     "utcTime": "2018-10-07T11:42:08Z", "metadata": {"parameters": {…}, "workflow": {…}}}

``event`` is one of ``started`` (at flow creation, with ``metadata``), ``process_submitted``,
``process_started``, ``process_completed`` (with ``trace``: the task's trace record), ``error``
(the run failed; ``trace`` of the failing task, or none) and ``completed`` (with ``metadata``;
sent after ``error`` too). ``runId`` is the session id, which ``-resume`` reuses.

Rules: ``started`` opens a window for ``runId`` (a second ``started`` of an open run keeps the
window; one of a finished run — ``-resume`` — opens a new one). Any other event of a run with no
window also opens one, so a lost ``started`` costs only the time before the first task event
(the body cap for these events is 4 MiB: ``started`` and ``completed`` carry the run's
parameters and workflow, tens of KiB for an nf-core pipeline). ``error`` or ``completed`` closes it; the result
stays readable at ``GET /v1/weblog/{runId}`` (the last :data:`KEEP_FINISHED` runs). Task events
are counted. Without a bearer token, a run shorter than the server's minimum window is closed
but its energy is not reported (the windows API's side-channel rule).

Per task and per process: every event of an open run reads the node's energy counters, so the
run's energy is known exactly between consecutive events. Each task's interval is its trace's
``start`` and ``complete`` (epoch milliseconds; the arrival of its ``process_started`` /
``process_completed`` when a trace lacks them, or when they fall outside the run's window — the
run's clock is not this node's), its weight its mean busy cores (``%cpu`` / 100 from the
completed trace, else ``cpus``), and :func:`policy.workflow.split_over_tasks` splits every
segment over the tasks running in it; what no task ran in is ``outside_tasks`` (the head job,
waits). The run's energy is the counters' difference over the window, and Σ tasks +
``outside_tasks`` equals it. These figures are the node's: tasks that ran on other machines
(``hostname`` of another host) are listed with ``"here": false`` and no energy. With the
Kubernetes executor a task is a pod named by the trace's ``native_id``: when that pod ran on this
node its row also carries ``pod_joules``, the agent's per-pod counter (the pod's attributed
energy since the agent first saw it, at the run's end); ``joulesched report --run NAME --by
process`` gives every task pod's own energy from every node's agent.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from joulesched.measurement.errors import TooManyWindows, UnknownWindow
from joulesched.measurement.meter import MeterRead
from joulesched.measurement.sampler import Sampler, window_energy
from joulesched.policy.workflow import split_over_tasks

EVENTS = ("started", "process_submitted", "process_started", "process_completed", "error", "completed")
TASK_EVENTS = ("process_submitted", "process_started", "process_completed")
KEEP_FINISHED = 64
MAX_ID = 200
MAX_READS = 20_000  # counter reads kept per run (one per event); beyond, segments get longer
MAX_TASKS = 50_000


@dataclass
class _Task:
    task_id: str
    process: str
    name: str
    cpus: float | None = None
    pcpu: float | None = None  # Nextflow's %cpu: mean busy cores × 100
    start: float | None = None  # trace times (epoch s)
    complete: float | None = None
    started_at: float | None = None  # arrival of process_started / process_completed (agent clock)
    completed_at: float | None = None
    hostname: str = ""
    native_id: str = ""
    status: str = ""
    exit: Any = None


@dataclass
class _Run:
    run_id: str
    run_name: str
    window_id: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TASK_EVENTS, 0))
    opened_by: str = "started"
    reads: list[MeterRead] = field(default_factory=list)  # after the window's start read
    tasks: dict[str, _Task] = field(default_factory=dict)
    dropped_reads: int = 0


def _ms(value: Any) -> float | None:
    return (
        float(value) / 1000.0 if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


class WeblogRuns:
    """The runs Nextflow reports on; ``handle`` answers one posted event as (HTTP status, JSON)."""

    def __init__(
        self, sampler: Sampler, clock: Callable[[], float], min_unauthenticated: float, hostnames: tuple[str, ...] = ()
    ) -> None:
        self.sampler = sampler
        self.hostnames = {h for h in (sampler.node, *hostnames) if h}  # a task "ran here" when its host is one
        self.clock = clock
        self.min_unauthenticated = min_unauthenticated
        self._lock = threading.Lock()
        self._open: dict[str, _Run] = {}
        self._finished: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def handle(self, doc: dict[str, Any], authorised: bool) -> tuple[int, dict[str, Any]]:
        event, run_id, run_name = doc.get("event"), doc.get("runId"), doc.get("runName", "")
        if event not in EVENTS:
            return HTTPStatus.BAD_REQUEST, {"error": f"event must be one of {', '.join(EVENTS)}, got {event!r}"}
        if not isinstance(run_id, str) or not 0 < len(run_id) <= MAX_ID:
            return HTTPStatus.BAD_REQUEST, {"error": f"runId must be a string of 1 to {MAX_ID} characters"}
        if not isinstance(run_name, str) or len(run_name) > MAX_ID:
            return HTTPStatus.BAD_REQUEST, {"error": f"runName must be a string of at most {MAX_ID} characters"}
        with self._lock:
            run = self._open.get(run_id)
            if event in ("error", "completed"):
                if run is None:
                    if run_id in self._finished:
                        return HTTPStatus.OK, {"runId": run_id, "closed": True, "event": event}
                    return HTTPStatus.NOT_FOUND, {"error": f"no open window for run {run_id!r}"}
                return self._close(run, event, authorised)
            if run is None:
                if event != "started" and run_id in self._finished:
                    return HTTPStatus.OK, {"runId": run_id, "closed": True, "event": event}  # a late task event
                try:
                    window = self.sampler.open_window(f"nextflow {run_name} {run_id}".strip(), keep=False)
                except TooManyWindows as err:
                    return HTTPStatus.TOO_MANY_REQUESTS, {"error": str(err)}
                run = _Run(run_id, run_name, window.id, opened_by=event)
                self._open[run_id] = run
                self._finished.pop(run_id, None)
                status = HTTPStatus.CREATED
            else:
                status = HTTPStatus.OK
            if event in run.counts:
                run.counts[event] += 1
            self._mark(run, event, doc.get("trace"))
            return status, {"runId": run_id, "window": run.window_id, "event": event}

    def _read(self) -> MeterRead:
        with self.sampler.lock:
            return self.sampler.meter.read()

    def _mark(self, run: _Run, event: str, trace: Any) -> None:
        """Read the counters at this event, and note the task's trace fields."""
        if len(run.reads) < MAX_READS:
            run.reads.append(self._read())
        else:
            run.dropped_reads += 1
        if event not in TASK_EVENTS or not isinstance(trace, dict):
            return
        task_id = str(trace.get("task_id", ""))
        if not task_id or (task_id not in run.tasks and len(run.tasks) >= MAX_TASKS):
            return
        task = run.tasks.setdefault(task_id, _Task(task_id, str(trace.get("process", "")), str(trace.get("name", ""))))
        now = run.reads[-1].time if run.reads else self.clock()
        task.cpus = _number(trace.get("cpus")) or task.cpus
        task.pcpu = _number(trace.get("%cpu")) if trace.get("%cpu") is not None else task.pcpu
        # the trace's times of day, on the agent's clock (taken back by the step it has seen)
        step = self.sampler.step()
        start, complete = _ms(trace.get("start")), _ms(trace.get("complete"))
        task.start = start - step if start is not None else task.start
        task.complete = complete - step if complete is not None else task.complete
        task.hostname = str(trace.get("hostname") or task.hostname or "")
        task.native_id = str(trace.get("native_id") if trace.get("native_id") is not None else task.native_id)
        task.status = str(trace.get("status") or task.status)
        task.exit = trace.get("exit", task.exit)
        if event == "process_started":
            task.started_at = now
        elif event == "process_completed":
            task.completed_at = now

    def _close(self, run: _Run, event: str, authorised: bool) -> tuple[int, dict[str, Any]]:
        del self._open[run.run_id]
        try:
            window = self.sampler.window(run.window_id)
            final = self._read()
            self.sampler.close_window(run.window_id)
        except UnknownWindow:
            return HTTPStatus.NOT_FOUND, {"error": f"the window of run {run.run_id!r} is gone"}
        age = final.time - window.start.time
        if not authorised and age < self.min_unauthenticated:
            return HTTPStatus.CONFLICT, {
                "error": f"run {run.run_id!r} lasted {age:.2f} s; without a bearer token a window must span at least "
                f"{self.min_unauthenticated:g} s, so its energy is not reported (configure server.token_file)"
            }
        # the run's energy and its tasks' from the same reads: the counters at the window's start,
        # at every event and now
        layout = self.sampler.meter.layout
        result = window_energy(window.start, final, layout, window.id, window.label, clock_step=self.sampler.step())
        result["kilojoules"] = {k: v / 1000.0 for k, v in result["joules"].items()}
        result["run"] = {
            "runId": run.run_id,
            "runName": run.run_name,
            "outcome": "error" if event == "error" else "completed",
            "opened_by": run.opened_by,
            "tasks": dict(run.counts),
        }
        result.update(self._per_task(run, window.start, final, layout, authorised))
        self._finished[run.run_id] = result
        while len(self._finished) > KEEP_FINISHED:
            self._finished.popitem(last=False)
        return HTTPStatus.OK, result

    def _pod_energy(self) -> dict[str, tuple[str, float]]:
        """Pod name (and UID) -> (namespace/name, joules since the agent first saw it), from the latest sample."""
        snapshot = self.sampler.latest
        out: dict[str, tuple[str, float]] = {}
        for pod in snapshot.pods if snapshot is not None else ():
            entry = (
                f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name,
                sum(pod.energy_joules_total.values()),
            )
            out[pod.name] = entry
            out.setdefault(pod.uid, entry)
        return out

    def _per_task(
        self, run: _Run, first: MeterRead, final: MeterRead, layout: Any, authorised: bool = True
    ) -> dict[str, Any]:
        reads = [first, *(r for r in run.reads if first.time <= r.time <= final.time), final]
        if not authorised:  # no segment shorter than an unauthenticated window (the side-channel rule)
            spaced = [first]
            for r in reads[1:-1]:
                if r.time - spaced[-1].time >= self.min_unauthenticated and final.time - r.time >= self.min_unauthenticated:
                    spaced.append(r)
            reads = [*spaced, final]
        edges = [r.time for r in reads]
        joules = [window_energy(a, b, layout)["joules"]["node"] for a, b in itertools.pairwise(reads)]
        lo, hi = edges[0], edges[-1]
        # Kubernetes executor: a task is a pod (its native_id the pod's name); when it ran on this
        # node the agent's own per-pod counter is the task's energy, however the node was shared
        pods = self._pod_energy()
        rows: list[dict[str, Any]] = []
        spans: list[tuple[float, float, float]] = []
        measured: list[int] = []
        skewed = 0
        for task in run.tasks.values():
            start = task.start if task.start is not None else task.started_at
            end = task.complete if task.complete is not None else task.completed_at
            if start is not None and end is not None and (end < lo or start > hi):
                skewed += 1  # the trace's clock is not ours: fall back to when the events came
                start, end = task.started_at, task.completed_at
            start = max(lo, start if start is not None else lo)
            end = min(hi, end if end is not None else hi)
            weight = task.pcpu / 100.0 if task.pcpu else (task.cpus or 1.0)
            here = not task.hostname or task.hostname in self.hostnames or task.native_id in pods
            rows.append(
                {
                    "task_id": task.task_id,
                    "process": task.process,
                    "name": task.name,
                    "status": task.status,
                    "exit": task.exit,
                    "hostname": task.hostname,
                    "native_id": task.native_id,
                    "start": start,
                    "end": end,
                    "seconds": max(0.0, end - start),
                    "cores": weight,
                    "here": here,
                    "joules": None,
                }
            )
            if here:
                measured.append(len(rows) - 1)
                spans.append((start, end, weight))
        per_task, outside = split_over_tasks(edges, joules, spans)
        for row, value in zip((rows[i] for i in measured), per_task, strict=True):
            row["joules"] = value
        for row in rows:
            pod = pods.get(row["native_id"])
            row["pod_joules"] = pod[1] if pod else None
            row["pod"] = pod[0] if pod else None
        processes: dict[str, dict[str, Any]] = {}
        for row in rows:
            p = processes.setdefault(
                row["process"], {"process": row["process"], "tasks": 0, "joules": 0.0, "seconds": 0.0}
            )
            p["tasks"] += 1
            p["seconds"] += row["seconds"]
            if row["joules"] is not None:
                p["joules"] += row["joules"]
        notes = []
        if skewed:
            notes.append(f"{skewed} task(s) had trace times outside the run's window: placed by their events instead")
        if run.dropped_reads:
            notes.append(f"{run.dropped_reads} events past {MAX_READS} read no counters: their segments are longer")
        elsewhere = len(rows) - len(measured)
        if elsewhere:
            notes.append(f"{elsewhere} task(s) ran on another host: their energy is not on this node's counters")
        return {
            "task_rows": sorted(rows, key=lambda r: (r["start"], r["task_id"])),
            "processes": sorted(processes.values(), key=lambda p: -p["joules"]),
            "outside_tasks_joules": outside,
            "segments": len(joules),
            "notes": notes,
        }

    def result(self, run_id: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if run_id in self._finished:
                return HTTPStatus.OK, self._finished[run_id]
            run = self._open.get(run_id)
            if run is not None:
                return HTTPStatus.OK, {
                    "runId": run_id,
                    "window": run.window_id,
                    "open": True,
                    "tasks": dict(run.counts),
                }
        return HTTPStatus.NOT_FOUND, {"error": f"no run {run_id!r} (the last {KEEP_FINISHED} finished runs are kept)"}


__all__ = ["EVENTS", "KEEP_FINISHED", "WeblogRuns"]
