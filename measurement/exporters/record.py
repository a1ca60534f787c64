"""``--record FILE``: every sample as one JSON line, for the simulator to replay.

The file is JSON lines (gzip-compressed when the name ends in ``.gz``). Each line is an object
with a ``type``; the full description is in ``docs/agent.md`` ("Recording format")::

    {"type":"header","format":"joulesched-recording","version":1,"node":"n1","interval_seconds":1.0,
     "idle_policy":"requests","cpus":64,"started":1764400000.0,"domains":["cpu","dram","gpu","other"]}
    {"type":"zone","source":"rapl_sysfs","zone":"package-0","domain":"package","kind":"counter",
     "parent":null,"max_joules":262143.328850}
    {"type":"pod","uid":"…","namespace":"default","name":"web-1","qos":"burstable",
     "owner_kind":"Deployment","owner":"web","requests_millicores":500.0}
    {"type":"sample","seq":2,"t":1764400001.0,"dt":1.0,"basis":"rapl_sysfs","node_j":95.1,
     "domains":[80.2,14.9,0.0,0.0],"busy_cpu_s":3.2,"util":0.05,"zones":{"rapl_sysfs/package-0":80.2},
     "pods":{"<uid>":[0.8,20.1,3.7,0.0,0.0]},"buckets":{"idle":[…],"system":[…]},"power":95.1}

In a sample, per-domain lists follow the header's ``domains`` order; ``pods`` maps a UID to
``[cpu_seconds, joules per domain…]`` for this interval; ``zones`` are per-zone joules of this
interval. A ``zone`` or ``pod`` line precedes the first sample that uses it (and is repeated
when a pod's name becomes known). Values are rounded to micro-units.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from joulesched.measurement.snapshot import Snapshot
from joulesched.policy.energy import NODE_DOMAINS

FORMAT = "joulesched-recording"
VERSION = 1


def _r(x: float) -> float:
    return round(x, 6)


class RecordingWriter:
    """Appends snapshots to a recording; flushes every ``flush_every`` samples."""

    def __init__(self, path: str, flush_every: int = 10) -> None:
        self.path = path
        # 0600: the samples can be finer than a second, so only root may read them back.
        file = open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
        raw: IO[bytes] = gzip.GzipFile(fileobj=file, mode="wb", compresslevel=6) if path.endswith(".gz") else file  # type: ignore[assignment]
        self._file = file
        self._out = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
        self._flush_every = max(flush_every, 1)
        self._pending = 0
        self._header = False
        self._zones: set[str] = set()
        self._pods: dict[str, tuple[str, str, str, str]] = {}

    def _line(self, obj: dict[str, Any]) -> None:
        self._out.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def write(self, snap: Snapshot) -> None:
        if not self._header:
            self._header = True
            self._line(
                {
                    "type": "header",
                    "format": FORMAT,
                    "version": VERSION,
                    "node": snap.node,
                    "interval_seconds": snap.interval_seconds,
                    "idle_policy": snap.idle_policy,
                    "cpus": snap.cpus,
                    "started": snap.wall_time,
                    "domains": list(NODE_DOMAINS),
                }
            )
        for z in snap.zones:
            key = f"{z.source}/{z.zone}"
            if key not in self._zones:
                self._zones.add(key)
                self._line(
                    {
                        "type": "zone",
                        "source": z.source,
                        "zone": z.zone,
                        "domain": z.domain,
                        "kind": z.kind,
                        "parent": z.parent,
                        "max_joules": z.max_joules,
                    }
                )
        for p in snap.pods:
            ident = (p.namespace, p.name, p.owner_kind, p.owner)
            if self._pods.get(p.uid) != ident:
                self._pods[p.uid] = ident
                self._line(
                    {
                        "type": "pod",
                        "uid": p.uid,
                        "namespace": p.namespace,
                        "name": p.name,
                        "qos": p.qos,
                        "owner_kind": p.owner_kind,
                        "owner": p.owner,
                        "requests_millicores": p.requests_millicores,
                    }
                )
        iv = snap.interval
        if iv is None:
            return
        self._line(
            {
                "type": "sample",
                "seq": snap.seq,
                "t": snap.wall_time,
                "dt": _r(iv.seconds),
                "basis": iv.basis,
                "node_j": _r(iv.node_joules),
                "domains": [_r(iv.domains.get(d, 0.0)) for d in NODE_DOMAINS],
                "busy_cpu_s": _r(iv.busy_cpu_seconds),
                "util": _r(snap.utilisation),
                "power": None if snap.node_power_watts is None else _r(snap.node_power_watts),
                "zones": {k: _r(v) for k, v in iv.zones.items()},
                "pods": {
                    uid: [_r(iv.pod_cpu_seconds.get(uid, 0.0)), *(_r(d.get(x, 0.0)) for x in NODE_DOMAINS)]
                    for uid, d in iv.pods.items()
                },
                "buckets": {b: [_r(d.get(x, 0.0)) for x in NODE_DOMAINS] for b, d in iv.buckets.items()},
            }
        )
        self._pending += 1
        if self._pending >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        self._pending = 0
        self._out.flush()

    def close(self) -> None:
        self._out.close()
        self._file.close()


@dataclass
class Recording:
    header: dict[str, Any]
    zones: dict[str, dict[str, Any]] = field(default_factory=dict)  # "source/zone" -> zone line
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> latest pod line
    samples: list[dict[str, Any]] = field(default_factory=list)


def read_lines(path: str) -> Iterator[dict[str, Any]]:
    """Every line of a recording as a dict (plain or gzip); a truncated last line is ignored."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                # the agent may have been killed mid-line: tolerate only a broken last line
                rest = f.read()
                if rest.strip():
                    raise ValueError(f"{path}:{number}: not JSON: {err}") from err
                return


def load_recording(path: str) -> Recording:
    lines = read_lines(path)
    first = next(lines, None)
    if not first or first.get("type") != "header" or first.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file (first line is not its header)")
    if first.get("version") != VERSION:
        raise ValueError(f"{path}: recording version {first.get('version')!r}, this reader knows {VERSION}")
    rec = Recording(first)
    for obj in lines:
        kind = obj.get("type")
        if kind == "zone":
            rec.zones[f"{obj['source']}/{obj['zone']}"] = obj
        elif kind == "pod":
            rec.pods[obj["uid"]] = obj
        elif kind == "sample":
            rec.samples.append(obj)
    return rec


__all__ = ["FORMAT", "VERSION", "Recording", "RecordingWriter", "load_recording", "read_lines"]
