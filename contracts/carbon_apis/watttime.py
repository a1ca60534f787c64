"""WattTime API v3: a region's marginal operating emissions rate (``co2_moer``), measured and forecast.

Requests (base URL ``https://api.watttime.org``; as WattTime's own client ``watttime/api.py``
makes them)::

    GET {url}/login                          HTTP basic auth (user:password) -> {"token": "<JWT>"}
    GET {url}/v3/historical?region=CAISO_NORTH&signal_type=co2_moer&start=...&end=...
                                             the past history_hours        (history_hours > 0)
    GET {url}/v3/forecast?region=CAISO_NORTH&signal_type=co2_moer&horizon_hours=72
                                             the next 72 hours              (forecast: true)

with ``Authorization: Bearer <token>``. The token is valid for 30 minutes: it is renewed after
25, and once at once when a request answers 401. Both data endpoints answer::

    {"data": [{"point_time": "2024-05-01T12:00:00+00:00", "value": 870.9}, ...],
     "meta": {"region": "CAISO_NORTH", "signal_type": "co2_moer", "units": "lbs_co2_per_mwh",
              "data_point_period_seconds": 300, "generated_at": "...", "model": {"date": "..."},
              "warnings": []}}

Each ``point_time`` starts a period of ``meta.data_point_period_seconds`` (300 s when absent).

**Units.** MOER values are pounds of CO2 per MWh (``meta.units`` must say
``lbs_co2_per_mwh``; any other unit is refused rather than guessed). joulesched's sites are in
g/kWh: 1 lb = 453.59237 g and 1 MWh = 1000 kWh, so g/kWh = lbs/MWh × 0.45359237 (1000 lbs/MWh
is 453.6 g/kWh). The value is a *marginal* rate (the generator that answers a change in load),
not the grid average that Electricity Maps and the UK API give; the two are not comparable and a
site should use one kind. ``/v3/signal-index`` is a 0–100 percentile, not an intensity, so it is
not used: this adapter needs a plan with ``/v3/historical`` and ``/v3/forecast`` (WattTime
previews every endpoint for the region ``CAISO_NORTH``).
"""

from __future__ import annotations

import threading
import urllib.parse
from typing import Any

from joulesched.contracts.carbon_apis.base import (
    Interval,
    LiveIntensity,
    basic_auth,
    intensity_value,
    iso_seconds,
    items,
    member,
    parse_iso,
)
from joulesched.contracts.errors import CarbonApiError

DEFAULT_URL = "https://api.watttime.org"
SIGNAL = "co2_moer"
UNITS = "lbs_co2_per_mwh"
G_PER_KWH_PER_LBS_PER_MWH = 0.45359237  # 453.59237 g per lb / 1000 kWh per MWh
TOKEN_LIFE_S = 25 * 60.0  # WattTime: valid 30 minutes
FORECAST_HOURS = 72


class WattTime(LiveIntensity):
    provider = "watttime"
    default_url = DEFAULT_URL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token = ""
        self._token_at = -float("inf")
        self._token_lock = threading.Lock()
        self.logins = 0

    def _login(self) -> str:
        s = self.settings
        assert s.secret is not None  # the site file requires one
        user, sep, password = s.secret.read().partition(":")
        if not sep or not user:
            raise CarbonApiError(f"watttime: {s.secret.origin} must hold username:password")
        doc = self.get(f"{s.url.rstrip('/')}/login", {"Authorization": basic_auth(user, password)}, s.timeout_s)
        token = member(doc, "token", "watttime login")
        if not isinstance(token, str) or not token:
            raise CarbonApiError("watttime login: field 'token' is not a non-empty string")
        self.logins += 1
        return token

    def _bearer(self, *, renew: bool = False) -> str:
        with self._token_lock:
            now = self.clock()
            if renew or not self._token or now - self._token_at > TOKEN_LIFE_S:
                self._token = self._login()
                self._token_at = now
            return self._token

    def _get(self, path: str, query: dict[str, str | int]) -> Any:
        s = self.settings
        url = f"{s.url.rstrip('/')}{path}?{urllib.parse.urlencode(query)}"
        try:
            return self.get(url, {"Authorization": f"Bearer {self._bearer()}"}, s.timeout_s)
        except CarbonApiError as err:
            if err.status != 401:
                raise
        return self.get(url, {"Authorization": f"Bearer {self._bearer(renew=True)}"}, s.timeout_s)

    def _points(self, doc: Any, where: str) -> list[Interval]:
        meta = member(doc, "meta", where)
        units = member(meta, "units", f"{where}.meta")
        if units != UNITS:
            raise CarbonApiError(f"{where}.meta.units: {units!r}, expected {UNITS!r} (no conversion is known)")
        signal = meta.get("signal_type", SIGNAL)
        if signal != SIGNAL:
            raise CarbonApiError(f"{where}.meta.signal_type: {signal!r}, asked for {SIGNAL!r}")
        region = meta.get("region", self.settings.zone)
        if region != self.settings.zone:
            raise CarbonApiError(f"{where}.meta.region: answer for {region!r}, asked for {self.settings.zone!r}")
        step = meta.get("data_point_period_seconds", 300)
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
            raise CarbonApiError(f"{where}.meta.data_point_period_seconds: expected a number > 0, got {step!r}")
        out = []
        for i, p in enumerate(items(doc, "data", where)):
            at = f"{where}.data[{i}]"
            start = parse_iso(member(p, "point_time", at), f"{at}.point_time")
            lbs_per_mwh = intensity_value(member(p, "value", at), f"{at}.value")
            g_per_kwh = None if lbs_per_mwh is None else lbs_per_mwh * G_PER_KWH_PER_LBS_PER_MWH
            out.append(Interval(start, start + float(step), g_per_kwh))
        return out

    def fetch(self, now: float) -> list[list[Interval]]:
        s = self.settings
        batches = []
        if s.history_hours > 0:
            query: dict[str, str | int] = {
                "region": s.zone,
                "signal_type": SIGNAL,
                "start": iso_seconds(now - s.history_hours * 3600.0),
                "end": iso_seconds(now),
            }
            batches.append(self._points(self._get("/v3/historical", query), "watttime historical"))
        if s.forecast:
            query = {"region": s.zone, "signal_type": SIGNAL, "horizon_hours": FORECAST_HOURS}
            batches.append(self._points(self._get("/v3/forecast", query), "watttime forecast"))
        return batches
