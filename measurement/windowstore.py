"""Open measurement windows kept on disk, so that they survive an agent restart.

With ``server.state_dir`` set, the sampler writes ``windows.json`` there whenever a window opens
or closes, and after every sample while windows are open: each window's start totals, and for
every counter zone its last raw reading and the running total it belonged to (the *anchor*). The
file is written to a temporary name, flushed to disk and renamed over the old one, so a crash
leaves the old file or the new one, never half of either.

After a restart the meter's totals start again from 0. A window is carried into the new totals
through each zone's anchor: the energy between the last reading before the restart and the first
one after it is the counter's difference (:func:`policy.energy.counter_delta`, wrap-safe and
checked against the zone's power bound over the real time between them), so a counter that kept
counting (RAPL, NVML, a BMC's EnergykWh) loses nothing. A power zone, or a counter that was reset
meanwhile, cannot be carried across the downtime: the window keeps that zone's energy up to the
last save and from the restart on, and its result names the zone and the seconds lost between
(``restarted``). Nothing is lost silently.

Times in the file are wall time (the agent's stamps plus the system clock's step since it
started, measurement/clock.py), so that the next run, on a clock started afresh, reads them in
its own terms.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from joulesched.policy.energy import ZoneKey

log = logging.getLogger(__name__)

VERSION = 1
FILE = "windows.json"


@dataclass(frozen=True)
class Anchor:
    """A counter zone's last raw reading (joules, when) and the running total (nJ) it made."""

    raw: float
    time: float
    total_nj: int  # measured + estimated, as in MeterRead.totals
    estimated_nj: int
    max_joules: float | None


@dataclass(frozen=True)
class Saved:
    """What the last run left: its open windows, counter anchors, when, and every zone's totals then."""

    windows: list[dict[str, Any]]
    anchors: dict[ZoneKey, Anchor]
    saved: float
    totals: dict[ZoneKey, int]
    estimated: dict[ZoneKey, int]


def _key(text: str) -> ZoneKey:
    source, _, zone = text.partition("/")
    return (source, zone)


def _name(key: ZoneKey) -> str:
    return f"{key[0]}/{key[1]}"


def _no_step() -> float:
    return 0.0


def shift_restarted(restarted: Mapping[str, Any], by: float) -> dict[str, Any]:
    """A window's ``restarted`` with its times (``at``, ``last_saved``) moved by ``by`` seconds."""
    return {k: v + by if k in ("at", "last_saved") and isinstance(v, int | float) else v for k, v in restarted.items()}


def _shift(window: Mapping[str, Any], by: float) -> dict[str, Any]:
    """A window record with its times moved by ``by`` seconds."""
    shifted = dict(window)
    if isinstance(shifted.get("start"), int | float):
        shifted["start"] = shifted["start"] + by
    restarted = shifted.get("restarted")
    if isinstance(restarted, dict):
        shifted["restarted"] = shift_restarted(restarted, by)
    return shifted


class WindowStore:
    """``step``: the agent clock's step (measurement/clock.py), added to every time saved and
    taken off every time loaded."""

    def __init__(self, directory: str, step: Callable[[], float] = _no_step) -> None:
        self.path = Path(directory) / FILE
        self.step = step

    def save(
        self,
        windows: list[dict[str, Any]],
        anchors: Mapping[ZoneKey, Anchor],
        saved: float,
        totals: Mapping[ZoneKey, int] | None = None,
        estimated: Mapping[ZoneKey, int] | None = None,
    ) -> None:
        step = self.step()
        doc = {
            "version": VERSION,
            "saved": saved + step,
            "totals": {_name(k): v for k, v in (totals or {}).items()},  # every zone's, at the save
            "estimated": {_name(k): v for k, v in (estimated or {}).items()},
            "anchors": {
                _name(k): [a.raw, a.time + step, a.total_nj, a.estimated_nj, a.max_joules]
                for k, a in sorted(anchors.items())
            },
            "windows": [_shift(w, step) for w in windows],
        }
        data = json.dumps(doc, separators=(",", ":")).encode()
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as err:  # the windows stay open in memory; only a restart would lose them
            log.warning("cannot save open windows to %s: %s", self.path, err.strerror or err)

    def load(self) -> Saved | None:
        """The windows, anchors and save time of the last run; None when there is no file. A file
        that cannot be read is reported and set aside (its windows are lost, and said so)."""
        try:
            doc = json.loads(self.path.read_bytes())
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError(f"not a version {VERSION} windows file")
            step = self.step()
            anchors = {
                _key(k): Anchor(
                    float(v[0]), float(v[1]) - step, int(v[2]), int(v[3]), None if v[4] is None else float(v[4])
                )
                for k, v in doc["anchors"].items()
            }
            if not isinstance(doc["windows"], list):
                raise ValueError("windows: not a list")
            windows = []
            for i, w in enumerate(doc["windows"]):
                problem = _window_problem(w)
                if problem is None:
                    windows.append(_shift(w, -step))
                    continue
                # one damaged record costs that window only; the file is kept as it was
                name = w.get("id") if isinstance(w, dict) and isinstance(w.get("id"), str) else f"#{i}"
                aside = self._keep_aside()
                log.error("window %s of the last run is lost: %s: windows[%d]: %s; the file is copied to %s",
                          name, self.path, i, problem, aside)  # fmt: skip
            totals, estimated = parse_record(doc)
            return Saved(windows, anchors, float(doc["saved"]) - step, totals, estimated)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            aside = self.path.with_name(self.path.name + ".unreadable")
            log.error(
                "open windows of the last run are lost: %s is unreadable (%s); moved to %s", self.path, err, aside
            )
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return None


    def _keep_aside(self) -> Path:
        """A copy of the file as read, beside it (``.unreadable``), before the next save replaces it."""
        aside = self.path.with_name(self.path.name + ".unreadable")
        try:
            shutil.copyfile(self.path, aside)
        except OSError as err:
            log.warning("cannot copy %s to %s: %s", self.path, aside, err.strerror or err)
        return aside


def _window_problem(record: object) -> str | None:
    """What is wrong with a saved window record, as :func:`window_record` writes it (None: nothing)."""
    if not isinstance(record, dict):
        return "not a mapping"
    if not isinstance(record.get("id"), str) or not record["id"]:
        return "id: not a string"
    start = record.get("start")
    if isinstance(start, bool) or not isinstance(start, int | float) or not math.isfinite(start):
        return f"start: not a time: {start!r}"
    if not isinstance(record.get("label", ""), str):
        return "label: not a string"
    for field in ("totals", "estimated"):
        values = record.get(field) or {}
        if not isinstance(values, dict):
            return f"{field}: not a mapping"
        for zone, nj in values.items():
            if isinstance(nj, bool) or not isinstance(nj, int):
                return f"{field}.{zone}: not a whole number of nanojoules: {nj!r}"
    restarted = record.get("restarted")
    if restarted is None:
        return None
    if not isinstance(restarted, dict):
        return "restarted: not a mapping"
    for field in ("at", "last_saved", "seconds_lost"):
        value = restarted.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)):
            return f"restarted.{field}: not a number: {value!r}"
    restarts = restarted.get("restarts")
    if restarts is not None and (isinstance(restarts, bool) or not isinstance(restarts, int)):
        return f"restarted.restarts: not a whole number: {restarts!r}"
    zones = restarted.get("zones_lost")
    if zones is not None and not (isinstance(zones, list) and all(isinstance(z, str) for z in zones)):
        return f"restarted.zones_lost: not a list of zone names: {zones!r}"
    return None


def window_record(
    window_id: str,
    label: str,
    start: float,
    totals: Mapping[ZoneKey, int],
    estimated: Mapping[ZoneKey, int],
    restarted: Mapping[str, Any] | None,
) -> dict[str, Any]:
    return {
        "id": window_id,
        "label": label,
        "start": start,
        "totals": {_name(k): v for k, v in totals.items()},
        "estimated": {_name(k): v for k, v in estimated.items()},
        "restarted": dict(restarted) if restarted else None,
    }


def parse_record(record: Mapping[str, Any]) -> tuple[dict[ZoneKey, int], dict[ZoneKey, int]]:
    return (
        {_key(k): int(v) for k, v in (record.get("totals") or {}).items()},
        {_key(k): int(v) for k, v in (record.get("estimated") or {}).items()},
    )


__all__ = ["Anchor", "Saved", "WindowStore", "parse_record", "shift_restarted", "window_record"]
