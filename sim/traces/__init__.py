"""Trace readers: every format becomes a :class:`sim.model.Trace`.

:func:`read_trace` picks the reader from the file: ``.json`` is WfFormat, a tab-separated
file with a ``status`` column is a Nextflow ``trace.txt``, a CSV with ``cpu_milli`` and
``creation_time`` is an Alibaba openb pod list, any other CSV a generic pod list.
"""

from __future__ import annotations

from pathlib import Path

from joulesched.sim.errors import TraceError
from joulesched.sim.model import Trace
from joulesched.sim.traces.nextflow import read_nextflow_trace
from joulesched.sim.traces.pods_csv import read_openb_nodes, read_openb_pods, read_pod_csv
from joulesched.sim.traces.wfformat import read_wfformat

__all__ = ["read_nextflow_trace", "read_openb_nodes", "read_openb_pods", "read_pod_csv", "read_trace", "read_wfformat"]


def read_trace(path: str | Path) -> Trace:
    file = Path(path)
    if file.suffix.lower() == ".json":
        return read_wfformat(file)
    try:
        with file.open(encoding="utf-8") as fh:
            first = fh.readline()
    except OSError as err:
        raise TraceError(str(file), "", "", f"cannot read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise TraceError(str(file), "", "", f"not UTF-8 text: {err}") from err
    if "\t" in first and "status" in first.rstrip("\r\n").split("\t"):
        return read_nextflow_trace(file)
    if "," in first:
        return read_pod_csv(file)
    raise TraceError(
        str(file),
        "line 1",
        "",
        "unknown trace format: expected WfFormat .json, a Nextflow trace.txt (tab-separated) or a pod CSV",
    )
