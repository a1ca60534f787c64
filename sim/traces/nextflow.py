"""Nextflow execution traces (``trace.txt``): one tab-separated line per task.

The columns depend on ``trace.fields``; the defaults are ``task_id hash native_id name status
exit submit duration realtime %cpu peak_rss peak_vmem rchar wchar``, and ``start``,
``complete``, ``cpus``, ``memory`` and ``process`` are common additions. Values are
human-readable (``1m 2s``, ``3.4s``, ``500ms``; ``1.2 GB``; ``95.3%``; ``2023-03-21
21:10:29.882``) or raw numbers with ``trace.raw = true`` (milliseconds, bytes); ``-`` means
"not known".

A trace has no task graph, so tasks replay as independent pods at their recorded submit
times (which already reflect the dependencies as they played out). Runtime is ``realtime``
(``duration`` minus queueing when ``realtime`` is absent is not known, so ``duration`` is the
fallback); the pod keeps ``%cpu/100`` cores busy; requests are the ``cpus``/``memory``
columns when present, else derived like WfFormat's (CPU rounded up from ``%cpu``, memory
from ``peak_rss``). ``CACHED`` and ``ABORTED`` tasks did not run here and are skipped.
"""

from __future__ import annotations

import csv
import math
import re
from datetime import UTC, datetime
from pathlib import Path

from joulesched.sim.errors import TraceError
from joulesched.sim.model import PodSpec, Trace
from joulesched.sim.traces.common import Fields, read_text, round_up_mib
from joulesched.sim.traces.wfformat import MIN_TASK_SECONDS, cpu_request_from_avg

SKIPPED_STATUSES = {"CACHED", "ABORTED"}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|d|h|m|s)")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|PB|EB)?$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4, "PB": 1024**5, "EB": 1024**6}
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds from a Nextflow duration (``1h 2m 3s``, ``3.4s``, ``500ms``) or raw milliseconds."""
    value = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return float(value) / 1000.0  # trace.raw: milliseconds
    parts = _DURATION_PART.findall(value)
    if not parts or _DURATION_PART.sub("", value).strip():
        raise ValueError(f"{text!r} is not a duration like '1m 2s', '3.4s' or '500ms'")
    return sum(float(n) * _SECONDS[u] for n, u in parts)


def parse_memory(text: str) -> float:
    """Bytes from a Nextflow memory value (``1.2 GB`` = 1.2 × 1024³; raw: bytes)."""
    match = _MEMORY.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a memory size like '1.2 GB' or '512 MB'")
    number, unit = match.groups()
    return float(number) * _UNITS[(unit or "B").upper()]


def parse_timestamp(text: str) -> float:
    """Unix seconds from ``2023-03-21 21:10:29.882`` (taken as UTC) or raw epoch milliseconds."""
    value = text.strip()
    if re.fullmatch(r"\d+", value):
        return int(value) / 1000.0
    for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    raise ValueError(f"{text!r} is not a timestamp like '2023-03-21 21:10:29.882'")


def parse_percent(text: str) -> float:
    value = text.strip().removesuffix("%")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{text!r} must be a percentage >= 0")
    return number


def read_nextflow_trace(path: str | Path, *, name: str | None = None) -> Trace:
    path = str(path)
    text = read_text(path)
    lines = text.splitlines()
    if not lines:
        raise TraceError(path, "", "", "empty file (expected a tab-separated header line)")
    reader = csv.DictReader(lines, delimiter="\t")
    header = reader.fieldnames or []
    for required in ("name", "status"):
        if required not in header:
            raise TraceError(path, "line 1 (header)", required, f"column is required (columns: {', '.join(header)})")
    if "realtime" not in header and "duration" not in header:
        raise TraceError(path, "line 1 (header)", "realtime", "a realtime or duration column is required")
    if "submit" not in header and "start" not in header:
        raise TraceError(path, "line 1 (header)", "submit", "a submit or start column is required")
    run = name or Path(path).stem.removesuffix(".trace").removeprefix("trace-") or "nextflow"
    rows: list[tuple[str, float, Fields, str]] = []
    skipped = 0
    for row in reader:
        lineno = reader.line_num  # the file's (a blank line is skipped, not numbered away)
        if None in row or any(v is None for v in row.values()):
            fields = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None) or [])
            raise TraceError(path, f"line {lineno}", "", f"has {fields} fields, the header has {len(header)}")
        label = row.get("name") or row.get("task_id") or "?"
        record = f"line {lineno} (task {label.strip()!r})"
        f = Fields(path, record, row)
        status = f.text("status").upper()
        if status in SKIPPED_STATUSES:
            skipped += 1
            continue
        if not status:
            raise f.fail("status", "is required")
        column = "submit" if f.has("submit") else "start"
        try:
            when = parse_timestamp(f.text(column))
        except ValueError as err:
            raise f.fail(column, str(err)) from err
        rows.append((label.strip(), when, f, status))
    if not rows:
        raise TraceError(path, "", "", "no task ran (every line is CACHED or ABORTED, or there are none)")
    t0 = min(r[1] for r in rows)
    pods: list[PodSpec] = []
    derived = 0
    for label, when, f, _status in rows:
        runtime_col = "realtime" if f.has("realtime") else "duration"
        try:
            runtime = parse_duration(f.text(runtime_col)) if f.has(runtime_col) else None
        except ValueError as err:
            raise f.fail(runtime_col, str(err)) from err
        if runtime is None:
            raise f.fail("realtime", "is required (neither realtime nor duration is known)")
        try:
            cpu_pct = parse_percent(f.text("%cpu")) if f.has("%cpu") else None
        except ValueError as err:
            raise f.fail("%cpu", str(err)) from err
        try:
            peak = parse_memory(f.text("peak_rss")) if f.has("peak_rss") else 0.0
            asked = parse_memory(f.text("memory")) if f.has("memory") else None
        except ValueError as err:
            raise f.fail("memory" if f.has("memory") else "peak_rss", str(err)) from err
        cpus = f.number("cpus", default=0.0) if f.has("cpus") else 0.0
        if f.has("cpus") and (cpus < 1 or cpus != int(cpus)):
            raise f.fail("cpus", f"must be a whole number >= 1, got {f.text('cpus')!r}")
        if cpus >= 1:
            request = cpus
        else:
            request = cpu_request_from_avg(cpu_pct) if cpu_pct is not None else 1.0
            derived += 1
        usage = cpu_pct / 100.0 if cpu_pct is not None else request
        process = f.text("process") or label.split(" (")[0].rsplit(":", 1)[-1]
        pods.append(
            PodSpec(
                name=f"{run}/{f.text('task_id') or len(pods) + 1}",
                duration=max(runtime, MIN_TASK_SECONDS),
                cpu_request=request,
                memory_request=asked if asked is not None else round_up_mib(peak),
                cpu_usage=usage,
                arrival=when - t0,
                workflow=run,
                process=process,
            )
        )
    notes = [f"Nextflow trace: {len(pods)} tasks replayed at their recorded submit times (no task graph in trace.txt)"]
    if skipped:
        notes.append(f"{skipped} CACHED/ABORTED tasks skipped")
    if derived:
        notes.append(f"{derived} CPU requests derived from %cpu (no cpus column)")
    return Trace(run, path, "nextflow-trace", tuple(pods), tuple(notes))
