"""The Carbon Intensity API of Great Britain's electricity system operator (NESO, formerly
National Grid ESO): national or regional half-hourly intensity, estimated and forecast 48 h ahead.

No authentication. Requests of one refresh (base URL ``https://api.carbonintensity.org.uk``;
paths as documented at carbon-intensity.github.io/api-definitions, times ``YYYY-MM-DDThh:mmZ``)::

    national:  GET {url}/intensity/{from}/{to}                  the past history_hours
               GET {url}/intensity/{from}/fw48h                 now and the next 48 h
    postcode:  GET {url}/regional/intensity/{from}/{to}/postcode/{postcode}
               GET {url}/regional/intensity/{from}/fw48h/postcode/{postcode}
    region:    GET {url}/regional/intensity/{from}/{to}/regionid/{id}
               GET {url}/regional/intensity/{from}/fw48h/regionid/{id}

Shapes implemented (the documented examples; the regional one as recorded from the live API in
nmpowell/carbon-intensity-forecast-tracking and parsed by the carbonintensity-api crate)::

    national:  {"data": [{"from": "2018-01-20T12:00Z", "to": "2018-01-20T12:30Z",
                          "intensity": {"forecast": 266, "actual": 263, "index": "moderate"}}]}
    regional:  {"data": {"regionid": 3, "dnoregion": "Electricity North West",
                         "shortname": "North West England", "postcode": "RG10",
                         "data": [{"from": ..., "to": ..., "intensity": {"forecast": 266, "index": "moderate"},
                                   "generationmix": [{"fuel": "gas", "perc": 43.6}, ...]}]}}

(the current-period endpoints ``/regional/postcode/{postcode}`` wrap the region in a one-element
list; that form is read too). Values are gCO2/kWh, the unit of joulesched's sites. Nationally the
``actual`` (the estimate from metered generation) is used where given, else the ``forecast``;
regionally only the forecast exists. A ``null`` value is a hole.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from joulesched.contracts.carbon_apis.base import (
    Interval,
    LiveIntensity,
    intensity_value,
    iso_minutes,
    items,
    member,
    parse_iso,
)
from joulesched.contracts.errors import CarbonApiError

DEFAULT_URL = "https://api.carbonintensity.org.uk"
PERIOD_S = 1800.0  # the API's half-hour settlement periods
REGION_IDS = range(1, 18)  # 1 North Scotland .. 14 South East England, 15 England, 16 Scotland, 17 Wales


class UkCarbonIntensity(LiveIntensity):
    provider = "uk_carbon_intensity"
    default_url = DEFAULT_URL
    needs_secret = False

    @property
    def target(self) -> str:
        s = self.settings
        if s.postcode:
            return f"postcode {s.postcode}"
        return f"region {s.region_id}" if s.region_id else "national"

    def _path(self, window: str) -> str:
        s = self.settings
        if s.postcode:
            return f"/regional/intensity/{window}/postcode/{urllib.parse.quote(s.postcode)}"
        if s.region_id:
            return f"/regional/intensity/{window}/regionid/{s.region_id}"
        return f"/intensity/{window}"

    def _periods(self, doc: Any, where: str) -> list[Interval]:
        regional = bool(self.settings.postcode or self.settings.region_id)
        data = member(doc, "data", where)
        if regional:
            if isinstance(data, list):  # the current-period endpoints: a one-element list
                if len(data) != 1:
                    raise CarbonApiError(f"{where}.data: expected one region, got {len(data)}")
                data = data[0]
            where = f"{where}.data"
            rows = items(data, "data", where)
            region = member(data, "regionid", where)
            if self.settings.region_id and region != self.settings.region_id:
                raise CarbonApiError(
                    f"{where}.regionid: answer for region {region!r}, asked for {self.settings.region_id}"
                )
        elif isinstance(data, list):
            rows = data
        else:
            raise CarbonApiError(f"{where}.data: expected a list, got {type(data).__name__}")
        out = []
        for i, row in enumerate(rows):
            at = f"{where}.data[{i}]"
            start = parse_iso(member(row, "from", at), f"{at}.from")
            end = parse_iso(member(row, "to", at), f"{at}.to")
            if end <= start:
                raise CarbonApiError(f"{at}: 'to' does not follow 'from'")
            intensity = member(row, "intensity", at)
            forecast = intensity_value(member(intensity, "forecast", f"{at}.intensity"), f"{at}.intensity.forecast")
            actual = None if regional else intensity_value(intensity.get("actual"), f"{at}.intensity.actual")
            out.append(Interval(start, end, actual if actual is not None else forecast))
        return out

    def _get(self, window: str) -> list[Interval]:
        s = self.settings
        url = s.url.rstrip("/") + self._path(window)
        return self._periods(self.get(url, {}, s.timeout_s), f"uk_carbon_intensity {self._path(window)}")

    def fetch(self, now: float) -> list[list[Interval]]:
        s = self.settings
        batches = []
        if s.history_hours > 0:
            batches.append(self._get(f"{iso_minutes(now - s.history_hours * 3600.0)}/{iso_minutes(now)}"))
        if s.forecast:  # from the start of the current half hour, so that now is always covered
            batches.append(self._get(f"{iso_minutes(now // PERIOD_S * PERIOD_S)}/fw48h"))
        return batches
