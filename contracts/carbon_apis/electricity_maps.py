"""Electricity Maps API v3: a zone's grid carbon intensity, measured and forecast.

Requests of one refresh (base URL ``https://api.electricitymap.org/v3``; the header
``auth-token: <token>``, as the Carbon Aware SDK's ElectricityMaps data source sends it,
``Constants/Headers.cs``)::

    GET {url}/carbon-intensity/latest?zone=DE      the value in force now
    GET {url}/carbon-intensity/history?zone=DE     the past 24 hours      (history_hours > 0)
    GET {url}/carbon-intensity/forecast?zone=DE    the next hours         (forecast: true)

Shapes implemented (the documented examples; the SDK's ``test/Client/TestData.cs`` replays the
same)::

    latest:   {"zone": "DE", "carbonIntensity": 302, "datetime": "2019-05-21T00:00:00.000Z",
               "updatedAt": "...", "emissionFactorType": "lifecycle", "isEstimated": false,
               "estimationMethod": null, "temporalGranularity": "hourly"}
    history:  {"zone": "DE", "history": [<objects as latest>]}
    forecast: {"zone": "DE", "forecast": [{"carbonIntensity": 326, "datetime": "..."}], "updatedAt": "..."}

``carbonIntensity`` is gCO2eq/kWh (lifecycle emission factors by default), the unit of
joulesched's sites: no conversion. Each ``datetime`` starts a period of the response's
``temporalGranularity`` (hourly when absent); a ``null`` intensity is a hole, not a zero. An
answer for another zone than the one asked is refused.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from joulesched.contracts.carbon_apis.base import (
    Interval,
    LiveIntensity,
    intensity_value,
    items,
    member,
    parse_iso,
)
from joulesched.contracts.errors import CarbonApiError

DEFAULT_URL = "https://api.electricitymap.org/v3"
GRANULARITY_SECONDS = {"5_minutes": 300.0, "15_minutes": 900.0, "hourly": 3600.0}


def _point(obj: Any, where: str, step: float) -> Interval:
    start = parse_iso(member(obj, "datetime", where), f"{where}.datetime")
    return Interval(
        start, start + step, intensity_value(member(obj, "carbonIntensity", where), f"{where}.carbonIntensity")
    )


def _step(obj: Any, where: str) -> float:
    granularity = obj.get("temporalGranularity", "hourly") if isinstance(obj, dict) else "hourly"
    if granularity not in GRANULARITY_SECONDS:
        raise CarbonApiError(
            f"{where}.temporalGranularity: {granularity!r} is not one of {', '.join(GRANULARITY_SECONDS)}"
        )
    return GRANULARITY_SECONDS[granularity]


class ElectricityMaps(LiveIntensity):
    provider = "electricity_maps"
    default_url = DEFAULT_URL

    def _get(self, what: str) -> tuple[Any, str]:
        s = self.settings
        url = f"{s.url.rstrip('/')}/carbon-intensity/{what}?{urllib.parse.urlencode({'zone': s.zone})}"
        assert s.secret is not None  # the site file requires one
        doc = self.get(url, {"auth-token": s.secret.read()}, s.timeout_s)
        where = f"electricity_maps {what}"
        zone = member(doc, "zone", where)
        if zone != s.zone:
            raise CarbonApiError(f"{where}: answer for zone {zone!r}, asked for {s.zone!r}")
        return doc, where

    def fetch(self, now: float) -> list[list[Interval]]:
        latest, where = self._get("latest")
        batches = [[_point(latest, where, _step(latest, where))]]
        if self.settings.history_hours > 0:
            doc, where = self._get("history")
            cutoff = now - self.settings.history_hours * 3600.0
            points = [
                _point(p, f"{where}.history[{i}]", _step(p, where)) for i, p in enumerate(items(doc, "history", where))
            ]
            batches.append([p for p in points if p.end > cutoff])
        if self.settings.forecast:
            doc, where = self._get("forecast")
            step = _step(doc, where)
            batches.append(
                [_point(p, f"{where}.forecast[{i}]", step) for i, p in enumerate(items(doc, "forecast", where))]
            )
        return batches
