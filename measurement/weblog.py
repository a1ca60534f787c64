"""Nextflow's ``-with-weblog``: one measurement window per run, from the events Nextflow posts.

Nextflow (``nf-weblog``, ``WebLogObserver``) POSTs one JSON object per event::

    {"runName": "friendly_pesquet", "runId": "170aa09c-…", "event": "started",
     "utcTime": "2018-10-07T11:42:08Z", "metadata": {"parameters": {…}, "workflow": {…}}}

``event`` is one of ``started`` (at flow creation, with ``metadata``), ``process_submitted``,
``process_started``, ``process_completed`` (with ``trace``: the task's trace record), ``error``
(the run failed; ``trace`` of the failing task, or none) and ``completed`` (with ``metadata``;
sent after ``error`` too). ``runId`` is the session id, which ``-resume`` reuses.

Rules: ``started`` opens a window for ``runId``. A ``started`` of a run whose window is open is a
new run of that ``runId`` — a ``-resume`` after the head job died without ``error`` or
``completed`` (killed, OOM), whose task ids start again at 1: the old window is closed as
``abandoned`` at its last event, with a note, and a new one opens. Any other event of a run with
no window also opens one, so a lost ``started`` costs only the time before the first task event
(the body cap for these events is 4 MiB: ``started`` and ``completed`` carry the run's
parameters and workflow, tens of KiB for an nf-core pipeline). ``completed`` closes it; the
result stays readable at ``GET /v1/weblog/{runId}`` (the last :data:`KEEP_FINISHED` runs).
``error`` is recorded as the run's outcome but does not close it: with ``errorStrategy 'finish'``
Nextflow lets the running tasks end and posts their ``process_completed``, then ``completed``.
A run with no event for :data:`IDLE_SECONDS` (its head job died: nothing will close it) is closed
at its last event — outcome ``error`` if it posted one, else ``abandoned`` — with a note saying
so, on the next weblog request or ``POST /v1/windows``; so dead runs never hold the open-window
limit for good. Task events are counted. Without a bearer token, a run shorter than the
server's minimum window is closed but its energy is not reported (the windows API's
side-channel rule).

Per task and per process: every event of an open run reads the node's energy counters, so the
run's energy is known exactly between consecutive events. Each task's interval is its trace's
``start`` and ``complete`` (epoch milliseconds; the arrival of its ``process_started`` /
``process_completed`` when a trace lacks them, or when they fall outside the run's window — the
run's clock is not this node's), its weight its mean busy cores (``%cpu`` / 100 from the
completed trace, else ``cpus``), and :func:`policy.workflow.split_over_tasks` splits every
segment over the tasks running in it; what no task ran in is ``outside_tasks`` (the head job,
waits). A task that was only submitted (no trace ``start``, no ``process_started``) never ran:
0 s, no energy. The run's energy is the counters' difference over the window, every segment is
taken on the same zones as the whole window (those read at both its edges: a source that opened
mid-run is in neither, and a note names it), and Σ tasks + ``outside_tasks`` equals it. Tasks
past :data:`MAX_TASKS` in one run are not tracked (their energy is in the others' and outside),
and a note counts them. The rows' times are wall time, as the run's (shifted by the clock step
the agent has seen, ``measurement/clock.py``). These figures are the node's: tasks that ran on
other machines (``hostname`` of another host) are listed with ``"here": false`` and no energy.
With the Kubernetes executor a task is a pod named by the trace's ``native_id``: when that pod
ran on this node its row also carries ``pod_joules``, the agent's per-pod counter (the pod's
attributed energy since the agent first saw it, at the run's end); ``joulesched report --run
NAME --by process`` gives every task pod's own energy from every node's agent.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from joulesched.measurement.errors import TooManyWindows, UnknownWindow
from joulesched.measurement.meter import MeterRead
from joulesched.measurement.sampler import Sampler, window_energy
from joulesched.policy.energy import ZoneKey
from joulesched.policy.workflow import split_over_tasks

log = logging.getLogger(__name__)

EVENTS = ("started", "process_submitted", "process_started", "process_completed", "error", "completed")
TASK_EVENTS = ("process_submitted", "process_started", "process_completed")
KEEP_FINISHED = 64
MAX_ID = 200
MAX_READS = 20_000  # counter reads kept per run (one per event); beyond, segments get longer
MAX_TASKS = 50_000
# A run with no event for this long is closed at its last event (its head job died without error
# or completed: nothing else would close it, and its window would hold one of the sampler's open
# windows for good). Longer than any quiet spell of a live run: nf-core's longest default task
# time is process_long's 20 h × attempt, so three attempts of one task running alone; a live run
# quieter than this is closed early, at its last event, and its later events are answered closed.
IDLE_SECONDS = 72 * 3600.0


@dataclass
class _Task:
    task_id: str
    process: str
    name: str
    cpus: float | None = None
    pcpu: float | None = None  # Nextflow's %cpu: mean busy cores × 100
    start: float | None = None  # trace times (epoch s)
    complete: float | None = None
    submitted_at: float | None = None  # arrival of process_submitted (agent clock)
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
    untracked: dict[str, int] = field(default_factory=dict)  # task events of tasks past MAX_TASKS, by kind
    outcome: str = ""  # "error" once Nextflow posted error
    last_event: float = 0.0  # agent clock: for IDLE_SECONDS
    authorised: bool = False  # its last event's: the side-channel rule when it is closed by no request
    notes: list[str] = field(default_factory=list)


def _ms(value: Any) -> float | None:
    return (
        float(value) / 1000.0 if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def _on(read: MeterRead, zones: Collection[ZoneKey]) -> MeterRead:
    """``read`` over ``zones`` only."""
    return MeterRead(
        read.time,
        {k: v for k, v in read.totals.items() if k in zones},
        {k: v for k, v in read.estimated.items() if k in zones},
    )


def _summary(status: int, doc: dict[str, Any]) -> str:
    """A closed run's energy in a few words, or why it has none."""
    if status != HTTPStatus.OK:
        return str(doc.get("error", f"HTTP {status}"))
    return f"{doc['kilojoules']['node']:.3f} kJ over {doc['seconds']:.0f} s"


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
            self._expire()
            run = self._open.get(run_id)
            if event == "completed":
                if run is None:
                    if run_id in self._finished:
                        return HTTPStatus.OK, {"runId": run_id, "closed": True, "event": event}
                    return HTTPStatus.NOT_FOUND, {"error": f"no open window for run {run_id!r}"}
                return self._close(run, run.outcome or "completed", authorised)
            earlier: list[str] = []
            if run is not None and event == "started":
                earlier.append(self._abandon(run, authorised))  # a -resume of a run whose head job died
                run = None
            if run is None:
                if event != "started" and run_id in self._finished:
                    return HTTPStatus.OK, {"runId": run_id, "closed": True, "event": event}  # a late event
                try:
                    window = self.sampler.open_window(f"nextflow {run_name} {run_id}".strip(), keep=False)
                except TooManyWindows as err:
                    return HTTPStatus.TOO_MANY_REQUESTS, {"error": str(err)}
                run = _Run(run_id, run_name, window.id, opened_by=event, notes=earlier)
                self._open[run_id] = run
                self._finished.pop(run_id, None)
                status = HTTPStatus.CREATED
            else:
                status = HTTPStatus.OK
            if event in run.counts:
                run.counts[event] += 1
            if event == "error":  # the run failed; with errorStrategy 'finish' its running tasks go on
                run.outcome = "error"
            run.authorised = authorised
            self._mark(run, event, doc.get("trace"))
            return status, {"runId": run_id, "window": run.window_id, "event": event}

    def expire(self) -> None:
        """Close the runs with no event for :data:`IDLE_SECONDS` (the windows API calls this before
        it opens a window: dead runs must not hold the open-window limit)."""
        with self._lock:
            self._expire()

    def _expire(self) -> None:
        now = self.clock()
        for run in [r for r in self._open.values() if now - r.last_event >= IDLE_SECONDS]:
            quiet = f"no event for {(now - run.last_event) / 3600:.1f} h"
            if run.outcome == "error":
                why = f"{quiet} after error, and no completed: closed at its last event (did the head job die?)"
            else:
                why = f"{quiet}, and no error or completed: closed as abandoned at its last event (head job died?)"
            status, doc = self._close(run, run.outcome or "abandoned", run.authorised, at_last_event=True, note=why)
            log.warning("nextflow run %r (%r): %s — %s", run.run_name[:80], run.run_id[:80], why, _summary(status, doc))

    def _abandon(self, run: _Run, authorised: bool) -> str:
        """Close the open window of a run whose ``runId`` posts ``started`` again, at its last
        event; the note the new run carries about it."""
        why = (
            "a new started came for this runId while its window was open, with no completed "
            "(-resume after the head job died?): closed at its last event"
        )
        status, doc = self._close(run, run.outcome or "abandoned", authorised, at_last_event=True, note=why)
        log.warning("nextflow run %r (%r): %s — %s", run.run_name[:80], run.run_id[:80], why, _summary(status, doc))
        return (
            f"the earlier window of this runId (opened by {run.opened_by}, {run.counts['process_submitted']} "
            f"task(s) submitted) had no completed before this started: closed as "
            f"{run.outcome or 'abandoned'} at its last event, {_summary(status, doc)}; the time between its last "
            "event and this started is in neither run"
        )

    def _read(self) -> MeterRead:
        with self.sampler.lock:
            return self.sampler.meter.read()

    def _mark(self, run: _Run, event: str, trace: Any) -> None:
        """Read the counters at this event, and note the task's trace fields."""
        read = self._read()
        if len(run.reads) < MAX_READS:
            run.reads.append(read)
        else:  # the latest read stays the last: a run closed at its last event ends there
            run.reads[-1] = read
            run.dropped_reads += 1
        run.last_event = self.clock()
        if event not in TASK_EVENTS or not isinstance(trace, dict):
            return
        task_id = str(trace.get("task_id", ""))
        if not task_id:
            return
        if task_id not in run.tasks and len(run.tasks) >= MAX_TASKS:
            run.untracked[event] = run.untracked.get(event, 0) + 1
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
        if event == "process_submitted":
            task.submitted_at = now
        elif event == "process_started":
            task.started_at = now
        elif event == "process_completed":
            task.completed_at = now

    def _close(
        self, run: _Run, outcome: str, authorised: bool, at_last_event: bool = False, note: str = ""
    ) -> tuple[int, dict[str, Any]]:
        """Close ``run``'s window now, or ``at_last_event`` (a run that will post nothing more:
        what came after its last event is unknown, so it is in no run's figures)."""
        del self._open[run.run_id]
        try:
            window = self.sampler.window(run.window_id)
            now = self._read()
            self.sampler.close_window(run.window_id)
        except UnknownWindow:
            return HTTPStatus.NOT_FOUND, {"error": f"the window of run {run.run_id!r} is gone"}
        final = run.reads[-1] if at_last_event and run.reads else now
        age = final.time - window.start.time
        if not authorised and age < self.min_unauthenticated:
            return HTTPStatus.CONFLICT, {
                "error": f"run {run.run_id!r} lasted {age:.2f} s; without a bearer token a window must span at least "
                f"{self.min_unauthenticated:g} s, so its energy is not reported (configure server.token_file)"
            }
        # the run's energy and its tasks' from the same reads: the counters at the window's start,
        # at every event and at its end
        layout = self.sampler.meter.layout
        step = self.sampler.step()
        result = window_energy(window.start, final, layout, window.id, window.label, clock_step=step)
        result["kilojoules"] = {k: v / 1000.0 for k, v in result["joules"].items()}
        result["run"] = {
            "runId": run.run_id,
            "runName": run.run_name,
            "outcome": outcome,
            "opened_by": run.opened_by,
            "tasks": dict(run.counts),
        }
        result.update(self._per_task(run, window.start, final, layout, authorised, step))
        result["notes"] = [*run.notes, *([note] if note else []), *result["notes"]]
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
        self, run: _Run, first: MeterRead, final: MeterRead, layout: Any, authorised: bool = True, step: float = 0.0
    ) -> dict[str, Any]:
        """The run's tasks and processes from its reads; ``step``: the clock step the run's own
        times were shifted by (its rows' times are wall time as the run's are)."""
        # every segment on the zones of the whole window (read at both its edges), so that the
        # segments add up to the run's energy: a source that opened (or went) mid-run is in neither
        zones = first.totals.keys() & final.totals.keys()
        one_edge = sorted(f"{k[0]}/{k[1]}" for k in first.totals.keys() ^ final.totals.keys())
        middle = [r for r in run.reads if r is not final and first.time <= r.time <= final.time]
        lacking = sum(1 for r in middle if not zones <= r.totals.keys())
        reads = [_on(first, zones), *(_on(r, zones) for r in middle if zones <= r.totals.keys()), _on(final, zones)]
        if not authorised:  # no segment shorter than an unauthenticated window (the side-channel rule)
            spaced = [reads[0]]
            for r in reads[1:-1]:
                if r.time - spaced[-1].time >= self.min_unauthenticated and final.time - r.time >= self.min_unauthenticated:
                    spaced.append(r)
            reads = [*spaced, reads[-1]]
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
        never = 0
        for task in run.tasks.values():
            start = task.start if task.start is not None else task.started_at
            end = task.complete if task.complete is not None else task.completed_at
            if start is None:  # only submitted (queued, or the run ended first): it never ran
                never += 1
                start = end = min(hi, max(lo, task.submitted_at if task.submitted_at is not None else lo))
            elif end is not None and (end < lo or start > hi):
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
                    "start": start + step,
                    "end": end + step,
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
        if never:
            notes.append(
                f"{never} task(s) were submitted but never started (no trace start, no process_started): 0 s, no energy"
            )
        if run.untracked:
            notes.append(
                f"{max(run.untracked.values())} task(s) past the first {MAX_TASKS} of the run were not tracked "
                "(no row): their energy is in the other tasks' and outside_tasks_joules"
            )
        if run.dropped_reads:
            notes.append(
                f"{run.dropped_reads} counter reads past {MAX_READS} were not kept (each replaced the one "
                "before): their segments are longer"
            )
        if one_edge:
            notes.append(
                f"zone(s) read at only one edge of the run (a source that opened or went during it) are in "
                f"neither its energy nor its tasks': {', '.join(one_edge)}"
            )
        if lacking:
            notes.append(f"{lacking} read(s) lacked a zone read at both edges: their segments are joined")
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
            self._expire()
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


__all__ = ["EVENTS", "IDLE_SECONDS", "KEEP_FINISHED", "WeblogRuns"]
