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
window also opens one, so a lost or refused ``started`` (its metadata above the 64 KiB body cap)
costs only the time before the first task event. ``error`` or ``completed`` closes it; the result
stays readable at ``GET /v1/weblog/{runId}`` (the last :data:`KEEP_FINISHED` runs). Task events
are counted. Without a bearer token, a run shorter than the server's minimum window is closed
but its energy is not reported (the windows API's side-channel rule).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from joulesched.measurement.errors import TooManyWindows, UnknownWindow
from joulesched.measurement.sampler import Sampler

EVENTS = ("started", "process_submitted", "process_started", "process_completed", "error", "completed")
TASK_EVENTS = ("process_submitted", "process_started", "process_completed")
KEEP_FINISHED = 64
MAX_ID = 200


@dataclass
class _Run:
    run_id: str
    run_name: str
    window_id: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TASK_EVENTS, 0))
    opened_by: str = "started"


class WeblogRuns:
    """The runs Nextflow reports on; ``handle`` answers one posted event as (HTTP status, JSON)."""

    def __init__(self, sampler: Sampler, clock: Callable[[], float], min_unauthenticated: float) -> None:
        self.sampler = sampler
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
                    window = self.sampler.open_window(f"nextflow {run_name} {run_id}".strip())
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
            return status, {"runId": run_id, "window": run.window_id, "event": event}

    def _close(self, run: _Run, event: str, authorised: bool) -> tuple[int, dict[str, Any]]:
        del self._open[run.run_id]
        try:
            age = self.clock() - self.sampler.window(run.window_id).start.time
            result = self.sampler.close_window(run.window_id)
        except UnknownWindow:
            return HTTPStatus.NOT_FOUND, {"error": f"the window of run {run.run_id!r} is gone"}
        if not authorised and age < self.min_unauthenticated:
            return HTTPStatus.CONFLICT, {
                "error": f"run {run.run_id!r} lasted {age:.2f} s; without a bearer token a window must span at least "
                f"{self.min_unauthenticated:g} s, so its energy is not reported (configure server.token_file)"
            }
        result["kilojoules"] = {k: v / 1000.0 for k, v in result["joules"].items()}
        result["run"] = {
            "runId": run.run_id,
            "runName": run.run_name,
            "outcome": "error" if event == "error" else "completed",
            "opened_by": run.opened_by,
            "tasks": dict(run.counts),
        }
        self._finished[run.run_id] = result
        while len(self._finished) > KEEP_FINISHED:
            self._finished.popitem(last=False)
        return HTTPStatus.OK, result

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
