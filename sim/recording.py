"""Agent recordings (``joulesched agent --record FILE``) as power samples the engine replays.

The agent writes JSON lines (gzip when the name ends in ``.gz``; ``docs/agent.md``, "Recording
format"): a ``header`` line naming the ``node``, then ``sample`` lines with the end time ``t``
(unix seconds), the interval ``dt`` and the node energy ``node_j`` of that interval. The
replay draws ``node_j / dt`` watts over ``(t − dt, t]`` — the measured energy, exactly — and
returns to the node's modelled power after its last sample.

Hand-written recordings may use a simpler line shape instead, one per measurement, each
holding from its time until the node's next line::

    {"t": 1764400000.0, "node": "epyc-7763-1s-000", "power_watts": 180.5, "utilisation": 0.42}

Times are made relative to the earliest time in all files (or to ``start`` when given), so a
recording lines up with a trace that starts when the recording does.
"""

from __future__ import annotations

import gzip
import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from joulesched.sim.errors import TraceError


def _lines(path: str) -> Iterable[tuple[int, Any]]:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                try:
                    yield lineno, orjson.loads(raw)
                except orjson.JSONDecodeError as err:
                    raise TraceError(path, f"line {lineno}", "", f"not valid JSON: {err}") from err
    except OSError as err:
        raise TraceError(path, "", "", f"cannot read: {err.strerror or err}") from err


def _number(doc: dict[str, Any], key: str, path: str, record: str, *, minimum: float | None = None) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(path, record, key, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise TraceError(path, record, key, f"must be >= {minimum:g}, got {value!r}")
    return float(value)


def read_recordings(paths: Sequence[str | Path]) -> list[tuple[float, str, float, float]]:
    """(start, node, end, watts) intervals from every file, in absolute unix seconds."""
    out: list[tuple[float, str, float, float]] = []
    for p in paths:
        path = str(p)
        node = ""
        simple: dict[str, list[tuple[float, float]]] = {}
        for lineno, doc in _lines(path):
            record = f"line {lineno}"
            if not isinstance(doc, dict):
                raise TraceError(path, record, "", "must be a JSON object")
            kind = doc.get("type")
            if kind == "header":
                node = doc.get("node") or ""
                if not isinstance(node, str) or not node:
                    raise TraceError(path, record, "node", "must name the node the agent ran on")
            elif kind == "sample":
                if not node:
                    raise TraceError(path, record, "type", "a sample before the header line")
                t = _number(doc, "t", path, record)
                dt = _number(doc, "dt", path, record, minimum=0.0)
                joules = _number(doc, "node_j", path, record, minimum=0.0)
                if dt > 0:
                    out.append((t - dt, node, t, joules / dt))
            elif kind is None and "power_watts" in doc:
                name = doc.get("node")
                if not isinstance(name, str) or not name:
                    raise TraceError(path, record, "node", f"must be a node name, got {name!r}")
                t = _number(doc, "t", path, record)
                watts = _number(doc, "power_watts", path, record, minimum=0.0)
                if "utilisation" in doc:
                    _number(doc, "utilisation", path, record, minimum=0.0)
                simple.setdefault(name, []).append((t, watts))
            elif kind in ("zone", "pod"):
                continue
            else:
                raise TraceError(path, record, "type", f"unknown line type {kind!r} (header, zone, pod, sample)")
        for name, points in simple.items():
            points.sort()
            for (t0, w), (t1, _) in itertools.pairwise(points):
                out.append((t0, name, t1, w))
    if not out:
        raise TraceError(", ".join(str(p) for p in paths), "", "", "no power samples")
    return out


def replay_samples(
    intervals: Sequence[tuple[float, str, float, float]], node_names: Sequence[str], start: float | None = None
) -> list[tuple[float, int, float]]:
    """Engine samples ``(t, node index, watts)``; NaN watts hands the node back to its model."""
    index = {n: i for i, n in enumerate(node_names)}
    unknown = sorted({n for _, n, _, _ in intervals if n not in index})
    if unknown:
        raise TraceError(
            "recording",
            "",
            "node",
            f"names nodes the cluster does not have: {', '.join(unknown[:5])} (cluster nodes look like {node_names[0]!r})",
        )
    t0 = min(s for s, _, _, _ in intervals) if start is None else start
    samples: list[tuple[float, int, float]] = []
    last_end: dict[int, float] = {}
    for s, name, e, watts in sorted(intervals):
        n = index[name]
        samples.append((s - t0, n, watts))
        last_end[n] = max(last_end.get(n, -math.inf), e - t0)
    for n, end in last_end.items():
        samples.append((end, n, math.nan))
    samples.sort(key=lambda x: (x[0], math.isnan(x[2]) is False))
    return samples
