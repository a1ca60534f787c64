"""Site files and carbon-intensity series: read from disk into :mod:`policy.site` objects.

A site file (YAML) describes every site once, and the embodied emissions of the servers::

    sites:
      dc-north:
        pue: 1.10                    # facility energy / IT energy (default 1.0)
        wue: 0.30                    # litres of water per IT kWh (The Green Grid WUE; default 0)
        renewable_share: 0.4         # 0..1 (default 0)
        carbon_intensity: 55         # gCO2e/kWh, a constant ...
        carbon_series:               # ... or a time series (paths relative to this file)
          file: carbon/eia_2022_BPAT_hourly.csv
          column: avg_CI             # the intensity column (default avg_CI)
          missing: interpolate       # empty values: interpolate | previous | error
          outside: error             # times the series does not cover: error | hold | wrap
          fallback: 300              # gCO2e/kWh used when the series cannot answer (optional)
        location: {latitude: 45.6, longitude: -121.2}
        country_code: USA
        description: "..."
        nadiki:                      # the site as registered in NADIKI (optional)
          facility: {...}            # a FacilityResponse / FacilityCreate object, or
          facility_file: facility.json
          racks: [{id: RACK-..., facility_id: FACILITY-...}]   # RackResponse objects
    servers:                         # embodied emissions by server id (NADIKI id or node name)
      default: {embodied_kg: 1300, lifetime_years: 4}
      srv-gpu-1: {embodied_kg: 2500, lifetime_years: 5}

NADIKI facility fields used: ``id`` → the facility id that server and rack registrations name,
``designPue`` → ``pue``, ``location`` → ``location``, ``countryCode`` → ``country_code``,
``description``. A field given both ways (``pue`` and ``designPue``) is a problem, not a silent
override. The spec's facility and asset embodied emissions carry no unit and the spec has no
WUE or static grid factor, so those come from this file.

A series file is CSV with a ``timestamp`` column (ISO 8601, naive = UTC, or unix seconds) and
the intensity column; each value holds until the next timestamp, the last one for as long as
the step before it (an hour in an hourly file). Every problem is reported at once as a
:class:`policy.errors.ConfigError` naming the file, and for series the line and field:
``sites.north.carbon_series.file: carbon.csv: line 7: field 'avg_CI': 'n/a' is not a number``.

:class:`FileIntensity` is the file-backed carbon source: it re-reads its file when it changes
(a cron job refreshing it from a grid operator's API is the way to a live signal without the
agent talking to the internet), keeps the last good series when a re-read fails, and raises
:class:`policy.site.IntensityUnavailable` — so :class:`policy.site.WithFallback` answers —
when it has never read one.
"""

from __future__ import annotations

import csv
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from joulesched.contracts.carbon_apis import PROVIDERS, ApiSettings, Secret, open_source
from joulesched.contracts.carbon_apis.uk_grid import REGION_IDS
from joulesched.contracts.documents import parse_yaml, read_yaml
from joulesched.contracts.errors import CarbonApiError, SeriesFileError
from joulesched.contracts.net import ALLOW_PLAIN_HTTP, plain_http_problem, url_problem
from joulesched.policy.errors import ConfigError
from joulesched.policy.site import (
    OUTSIDE_POLICIES,
    CarbonIntensitySource,
    ConstantIntensity,
    IntensitySeries,
    IntensityUnavailable,
    Location,
    NoIntensity,
    ServerEmbodied,
    SiteCatalogue,
    SiteModel,
    WithFallback,
)
from joulesched.policy.validate import Checker

MISSING_POLICIES = ("interpolate", "previous", "error")
TOP_FIELDS = ("sites", "servers", "description")
SITE_FIELDS = (
    "pue",
    "wue",
    "renewable_share",
    "carbon_intensity",
    "carbon_series",
    "carbon_api",
    "location",
    "country_code",
    "description",
    "nadiki",
)
SERIES_FIELDS = ("file", "column", "missing", "outside", "fallback")
API_FIELDS = (
    "provider",
    "zone",
    "region",
    "postcode",
    "region_id",
    "url",
    "token_file",
    "token_env",
    "refresh_s",
    "timeout_s",
    "max_age_s",
    "forecast",
    "history_hours",
    "fallback",
    ALLOW_PLAIN_HTTP,
)
# Where each provider's place goes: Electricity Maps calls it a zone, WattTime a region, the UK
# API a postcode or a region id (neither: national).
API_PLACE_FIELDS = {
    "electricity_maps": ("zone",),
    "watttime": ("region",),
    "uk_carbon_intensity": ("postcode", "region_id"),
}
SECRET_WORDS = ("token", "password", "api_key", "apikey", "auth_token", "username", "secret")
SERVER_FIELDS = ("embodied_kg", "lifetime_years", "description")
NADIKI_FIELDS = ("facility", "facility_file", "racks")
# FacilityResponse properties (../shared/nadiki/facility-api.spec.yaml); the rest are accepted and unused.
NADIKI_FACILITY_FIELDS = (
    "id",
    "location",
    "countryCode",
    "designPue",
    "description",
    "embeddedGhgEmissionsFacility",
    "lifetimeFacility",
    "embeddedGhgEmissionsAssets",
    "lifetimeAssets",
    "coolingFluids",
    "maintenanceHoursGenerator",
    "installedCapacity",
    "gridPowerFeeds",
    "tierLevel",
    "whiteSpaceFloors",
    "totalSpace",
    "whiteSpace",
    "timeSeriesConfig",
    "createdAt",
    "updatedAt",
)
NADIKI_RACK_FIELDS = (
    "id",
    "facility_id",
    "total_available_power",
    "total_available_cooling_capacity",
    "number_of_pdus",
    "power_redundancy",
    "product_passport",
    "description",
    "timeSeriesConfig",
    "createdAt",
    "updatedAt",
)


# -- series files ------------------------------------------------------------------------------


def _parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def read_intensity_csv(
    path: str | Path,
    column: str = "avg_CI",
    *,
    missing: str = "interpolate",
    outside: str = "error",
    step: float | None = None,
) -> IntensitySeries:
    """Read a carbon-intensity series; :class:`SeriesFileError` lists every bad line and field.

    ``step`` (seconds): every row must follow the previous one by exactly that much (the
    simulator's hourly files); without it any increasing times are a step function.
    """
    name = str(path)
    if missing not in MISSING_POLICIES:
        raise ValueError(f"missing must be one of {', '.join(MISSING_POLICIES)}, got {missing!r}")
    try:
        with open(name, encoding="utf-8", newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError as err:
        raise SeriesFileError(name, [f"cannot read: {err.strerror or err}"]) from err
    except (UnicodeDecodeError, csv.Error) as err:
        raise SeriesFileError(name, [f"not a CSV text file: {err}"]) from err
    if not rows:
        raise SeriesFileError(name, [f"empty file (expected a header with timestamp and {column})"])
    header = [h.strip() for h in rows[0]]
    absent = [c for c in ("timestamp", column) if c not in header]
    if absent:
        raise SeriesFileError(
            name, [f"line 1: column {c!r} is required (columns: {', '.join(header)})" for c in absent]
        )
    ti, ci = header.index("timestamp"), header.index(column)
    problems: list[str] = []
    times: list[float] = []
    values: list[float] = []
    lines: list[int] = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            problems.append(f"line {lineno}: has {len(row)} fields, the header has {len(header)}")
            continue
        stamp = row[ti].strip()
        try:
            t = _parse_time(stamp)
        except ValueError:
            problems.append(f"line {lineno}: field 'timestamp': {stamp!r} is not an ISO 8601 time or unix seconds")
            continue
        if times and t <= times[-1]:
            problems.append(f"line {lineno}: field 'timestamp': {stamp} does not follow the previous row's time")
            continue
        if times and step is not None and abs(t - times[-1] - step) > 1e-6:
            problems.append(f"line {lineno}: field 'timestamp': {stamp} is not {step:g} s after the previous row")
            continue
        raw = row[ci].strip()
        if raw == "":
            value = math.nan
        else:
            try:
                value = float(raw)
            except ValueError:
                problems.append(f"line {lineno}: field {column!r}: {raw!r} is not a number")
                continue
            if not math.isfinite(value) or value < 0:
                problems.append(f"line {lineno}: field {column!r}: must be a finite number >= 0, got {raw!r}")
                continue
        times.append(t)
        values.append(value)
        lines.append(lineno)
        if len(problems) > 20:
            break
    if not problems and not values:
        problems.append("no data rows")
    if problems:
        raise SeriesFileError(name, problems)
    arr = np.array(values, dtype=np.float64)
    gaps = np.flatnonzero(np.isnan(arr))
    if len(gaps) == len(arr):
        raise SeriesFileError(name, [f"field {column!r}: every value is empty"])
    if len(gaps):
        if missing == "error":
            raise SeriesFileError(
                name,
                [
                    f"line {lines[int(g)]}: field {column!r}: empty (set missing: interpolate or previous to fill it)"
                    for g in gaps[:10]
                ],
            )
        valid = np.flatnonzero(~np.isnan(arr))
        if missing == "interpolate":
            arr[gaps] = np.interp(np.asarray(times)[gaps], np.asarray(times)[valid], arr[valid])
        else:  # previous; a gap before the first value takes the first value
            last = np.maximum.accumulate(np.where(np.isnan(arr), -1, np.arange(len(arr))))
            arr = np.where(last >= 0, arr[np.maximum(last, 0)], arr[valid[0]])
    starts = np.array(times, dtype=np.float64)
    step = float(starts[-1] - starts[-2]) if len(starts) > 1 else 3600.0
    return IntensitySeries(starts, arr, float(starts[-1] + step), outside, name, len(gaps))


class FileIntensity:
    """A carbon-intensity source backed by a series file that something else keeps fresh.

    Re-reads the file when its modification time or size changes (looked at no more than every
    ``recheck_seconds`` of ``clock``, whatever times are asked about). A failed re-read keeps the last good series and
    records the problem in :attr:`error`; with no good series yet, every question raises
    :class:`IntensityUnavailable`, so a :class:`WithFallback` around it answers.
    """

    def __init__(
        self,
        path: str | Path,
        column: str = "avg_CI",
        *,
        missing: str = "interpolate",
        outside: str = "error",
        recheck_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        series: IntensitySeries | None = None,
    ) -> None:
        """``series``: the file as just read (the site file's check reads it first), kept until
        the file changes."""
        self.path = str(path)
        self.column = column
        self.missing = missing
        self.outside = outside
        self.recheck_seconds = recheck_seconds
        self.clock = clock
        self.error = ""
        self.reads = 0
        self._series: IntensitySeries | None = series
        self._stamp: tuple[float, int] | None = None
        self._checked_at = -math.inf
        self._lock = threading.Lock()
        if series is not None:
            try:
                st = os.stat(self.path)
                self._stamp = (st.st_mtime, st.st_size)  # the first question looks whether it changed since
            except OSError:
                pass  # looked at again at the first question

    @property
    def name(self) -> str:
        return f"file {self.path}"

    def refresh(self, *, force: bool = False) -> None:
        """Re-read the file if it changed; looks at most every ``recheck_seconds`` unless forced."""
        with self._lock:
            now = self.clock()
            if not force and now - self._checked_at < self.recheck_seconds:
                return
            self._checked_at = now
            try:
                st = os.stat(self.path)
            except OSError as err:
                self.error = f"{self.path}: cannot read: {err.strerror or err}"
                return
            stamp = (st.st_mtime, st.st_size)
            if stamp == self._stamp and self._series is not None:
                return
            try:
                self._series = read_intensity_csv(self.path, self.column, missing=self.missing, outside=self.outside)
                self.error = ""
                self.reads += 1
            except SeriesFileError as err:
                self.error = str(err)
            self._stamp = stamp

    def current_series(self) -> IntensitySeries:
        """The series as last read (the file looked at first, at most every ``recheck_seconds``)."""
        self.refresh()
        series = self._series
        if series is None:
            raise IntensityUnavailable(
                f"carbon intensity file {self.path}: no series read yet ({self.error or 'not read'})"
            )
        return series

    def at(self, t: float) -> float:
        return self.current_series().at(t)

    def integral(self, a: float, b: float) -> float:
        return self.current_series().integral(a, b)


# -- site files --------------------------------------------------------------------------------


def load_site_file(path: str | Path) -> SiteCatalogue:
    """Read and validate a site file; :class:`ConfigError` lists every problem with its path."""
    file = Path(path)
    doc = read_yaml(file)
    return parse_site_document(doc, str(file), base_dir=file.parent)


def parse_site_document(doc: Any, where: str, base_dir: Path | None = None) -> SiteCatalogue:
    """Validate a site document (already parsed); series and NADIKI files resolve from ``base_dir``."""
    check = Checker(where)
    root = check.mapping(doc, "")
    check.unknown_keys(root, TOP_FIELDS, "")
    sites: dict[str, SiteModel] = {}
    for name, body in check.mapping(root.get("sites"), "sites").items():
        site = _parse_site(str(name), body, f"sites.{name}", check, base_dir)
        if site is not None:
            sites[str(name)] = site
    servers: dict[str, ServerEmbodied] = {}
    default: ServerEmbodied | None = None
    for server_id, body in check.mapping(root.get("servers"), "servers").items():
        server = _parse_server(body, f"servers.{server_id}", check)
        if server is None:
            continue
        if server_id == "default":
            default = server
        else:
            servers[str(server_id)] = server
    facilities: dict[str, str] = {}
    for name, site in sites.items():
        if site.facility_id:
            if site.facility_id in facilities:
                check.problem(
                    f"sites.{name}.nadiki.facility.id",
                    f"facility {site.facility_id!r} is already site {facilities[site.facility_id]!r}",
                )
            facilities[site.facility_id] = name
    check.raise_if_any()
    return SiteCatalogue(sites, servers, default)


def _resolve(file: str, base_dir: Path | None) -> Path:
    p = Path(file)
    return p if p.is_absolute() or base_dir is None else base_dir / p


def _parse_site(name: str, body: Any, path: str, check: Checker, base_dir: Path | None) -> SiteModel | None:
    before = len(check.problems)
    body = check.mapping(body, path)
    check.unknown_keys(body, SITE_FIELDS, path)
    nadiki = _parse_nadiki(body.get("nadiki"), f"{path}.nadiki", check, base_dir)
    facility = nadiki.get("facility", {})
    if "pue" in body and "designPue" in facility:
        check.problem(f"{path}.pue", "also given by nadiki.facility.designPue; give it once")
    pue_source, pue_path = (facility, f"{path}.nadiki.facility") if "designPue" in facility else (body, path)
    pue = check.number(pue_source, "designPue" if pue_source is facility else "pue", pue_path, default=1.0, minimum=1.0)
    wue = check.number(body, "wue", path, default=0.0, minimum=0.0)
    share = check.number(body, "renewable_share", path, default=0.0, minimum=0.0, maximum=1.0)
    description = check.string(body, "description", path, default="") or ""
    if not description and isinstance(facility.get("description"), str):
        description = facility["description"]
    location = None
    if "location" in body and "location" in facility:
        check.problem(f"{path}.location", "also given by nadiki.facility.location; give it once")
    elif "location" in body or "location" in facility:
        where = f"{path}.location" if "location" in body else f"{path}.nadiki.facility.location"
        location = _parse_location(body.get("location", facility.get("location")), where, check)
    country = check.string(body, "country_code", path, default="") or ""
    nadiki_country = check.string(facility, "countryCode", f"{path}.nadiki.facility", default="") or ""
    if country and nadiki_country and country != nadiki_country:
        check.problem(f"{path}.country_code", f"{country!r} but nadiki.facility.countryCode is {nadiki_country!r}")
    facility_id = check.string(facility, "id", f"{path}.nadiki.facility", default="") or ""
    rack_ids: list[str] = []
    for i, rack in enumerate(nadiki.get("racks", [])):
        rpath = f"{path}.nadiki.racks[{i}]"
        rack_id = check.string(rack, "id", rpath)
        rack_facility = check.string(rack, "facility_id", rpath)
        if rack_facility and facility_id and rack_facility != facility_id:
            check.problem(f"{rpath}.facility_id", f"{rack_facility!r} is not this site's facility {facility_id!r}")
        if rack_id:
            rack_ids.append(rack_id)
    carbon = _parse_carbon(body, path, check, base_dir)
    if len(check.problems) > before or carbon is None:
        return None
    assert pue is not None and wue is not None and share is not None
    return SiteModel(
        name=name,
        pue=pue,
        wue=wue,
        renewable_share=share,
        carbon=carbon,
        location=location,
        country_code=country or nadiki_country,
        facility_id=facility_id,
        rack_ids=tuple(rack_ids),
        description=description,
    )


def _parse_location(value: Any, path: str, check: Checker) -> Location | None:
    body = check.mapping(value, path)
    if not body:
        if value is not None and isinstance(value, Mapping):
            check.problem(path, "must have latitude and longitude")
        return None
    check.unknown_keys(body, ("latitude", "longitude"), path)
    lat = check.number(body, "latitude", path, minimum=-90.0, maximum=90.0)
    lon = check.number(body, "longitude", path, minimum=-180.0, maximum=180.0)
    return Location(lat, lon) if lat is not None and lon is not None else None


def _parse_carbon(
    body: Mapping[str, Any], path: str, check: Checker, base_dir: Path | None
) -> CarbonIntensitySource | None:
    given = [k for k in ("carbon_intensity", "carbon_series", "carbon_api") if k in body]
    if len(given) > 1:
        check.problem(
            path,
            f"give one of carbon_intensity, carbon_series or carbon_api (with a fallback), not {' and '.join(given)}",
        )
        return None
    if "carbon_api" in body:
        return _parse_carbon_api(body.get("carbon_api"), f"{path}.carbon_api", check, base_dir)
    if "carbon_series" not in body:
        if body.get("carbon_intensity") is None:  # not given: unknown
            return NoIntensity()
        ci = check.number(body, "carbon_intensity", path, minimum=0.0)
        return ConstantIntensity(ci) if ci is not None else None
    spath = f"{path}.carbon_series"
    series = check.mapping(body.get("carbon_series"), spath)
    if not series:
        if not isinstance(body.get("carbon_series"), Mapping):
            return None
        check.problem(spath, "must name a file")
        return None
    check.unknown_keys(series, SERIES_FIELDS, spath)
    file = check.string(series, "file", spath)
    column = check.string(series, "column", spath, default="avg_CI") or "avg_CI"
    missing = check.string(series, "missing", spath, default="interpolate", choices=MISSING_POLICIES)
    outside = check.string(series, "outside", spath, default="error", choices=OUTSIDE_POLICIES)
    fallback = check.number(series, "fallback", spath, default=None, minimum=0.0)
    if file is None or missing is None or outside is None:
        return None
    resolved = _resolve(file, base_dir)
    try:
        first = read_intensity_csv(resolved, column, missing=missing, outside=outside)
    except SeriesFileError as err:
        for problem in err.problems:
            check.problem(f"{spath}.file", f"{resolved}: {problem}")
        return None
    # read again when it changes: a cron job refreshing it from a grid operator is a live signal
    source: CarbonIntensitySource = FileIntensity(resolved, column, missing=missing, outside=outside, series=first)
    if fallback is not None:
        source = WithFallback(source, ConstantIntensity(fallback, f"fallback {fallback:g} g/kWh"))
    return source


def _parse_carbon_api(value: Any, path: str, check: Checker, base_dir: Path | None) -> CarbonIntensitySource | None:
    """A live API source (``carbon_apis``), wrapped in its ``fallback`` when one is given."""
    before = len(check.problems)
    body = check.mapping(value, path)
    if not body:
        if isinstance(value, Mapping):
            check.problem(path, "must name a provider")
        return None
    for key in body:
        if key not in API_FIELDS and str(key).lower() in SECRET_WORDS:
            check.problem(
                f"{path}.{key}",
                "secrets do not go in the site file: put it in a file (token_file) or an environment variable (token_env)"
                " (docs/carbon.md, Credentials)",
            )
    check.unknown_keys(
        {k: v for k, v in body.items() if str(k).lower() not in SECRET_WORDS or k in API_FIELDS}, API_FIELDS, path
    )
    provider = check.string(body, "provider", path, choices=PROVIDERS)
    url = check.string(body, "url", path, default="")
    url_wrong = url_problem(url, "token_file or token_env") if url else None
    if url_wrong:
        check.problem(f"{path}.url", url_wrong)
    allow_plain_http = check.boolean(body, ALLOW_PLAIN_HTTP, path, default=False)
    refresh = check.number(body, "refresh_s", path, default=900.0, exclusive_minimum=0.0)
    timeout = check.number(body, "timeout_s", path, default=10.0, exclusive_minimum=0.0, maximum=300.0)
    max_age = check.number(body, "max_age_s", path, default=7200.0, exclusive_minimum=0.0)
    history = check.number(body, "history_hours", path, default=24.0, minimum=0.0, maximum=168.0)
    forecast = check.boolean(body, "forecast", path, default=True)
    fallback = check.number(body, "fallback", path, default=None, minimum=0.0)
    if refresh is not None and max_age is not None and max_age < refresh:
        check.problem(
            f"{path}.max_age_s", f"must be >= refresh_s ({refresh:g}): the data would expire between refreshes"
        )
    if provider is None:
        return None
    places = API_PLACE_FIELDS[provider]
    for key in {f for fields in API_PLACE_FIELDS.values() for f in fields} - set(places):
        if key in body:
            check.problem(f"{path}.{key}", f"is not a field of {provider} (its place: {' or '.join(places)})")
    zone = postcode = ""
    region_id = 0
    if provider == "uk_carbon_intensity":
        postcode = check.string(body, "postcode", path, default="") or ""
        region_id = check.integer(body, "region_id", path, minimum=1, default=0) or 0
        if region_id and region_id not in REGION_IDS:
            check.problem(
                f"{path}.region_id", f"must be a DNO region {REGION_IDS[0]}..{REGION_IDS[-1]}, got {region_id}"
            )
        if postcode and region_id:
            check.problem(path, "give postcode or region_id, not both (neither: national)")
        # the API takes the outward code (the first half: RG10 of RG10 1AB), nothing else
        if postcode and not re.fullmatch(r"[A-Z]{1,2}[0-9][A-Z0-9]?", postcode.strip().upper()):
            check.problem(
                f"{path}.postcode",
                f"must be an outward postcode such as RG10 (the first half of a full one), got {postcode!r}",
            )
    else:
        zone = check.string(body, places[0], path) or ""
    if provider != "electricity_maps" and history == 0 and not forecast:  # it alone always asks for /latest
        check.problem(path, "history_hours 0 and forecast false leave nothing to fetch")
    secret = _parse_secret(body, path, check, base_dir, PROVIDERS[provider].needs_secret, provider)
    cleartext = (
        plain_http_problem(url, f"the {provider} credential ({secret.origin})", allow_plain_http)
        if url and not url_wrong and secret is not None
        else None
    )
    if cleartext:
        check.problem(f"{path}.url", cleartext)
    if len(check.problems) > before:
        return None
    assert refresh is not None and timeout is not None and max_age is not None and history is not None
    settings = ApiSettings(
        provider=provider,
        url=url or PROVIDERS[provider].default_url,
        zone=zone,
        postcode=postcode.replace(" ", "").upper(),
        region_id=region_id,
        secret=secret,
        refresh_s=refresh,
        timeout_s=timeout,
        max_age_s=max_age,
        forecast=forecast,
        history_hours=history,
    )
    source: CarbonIntensitySource = open_source(settings)
    if fallback is not None:
        source = WithFallback(source, ConstantIntensity(fallback, f"fallback {fallback:g} g/kWh"))
    return source


def _parse_secret(
    body: Mapping[str, Any], path: str, check: Checker, base_dir: Path | None, needed: bool, provider: str
) -> Secret | None:
    """The credential's origin, checked readable now (it is read again at each use: rotation)."""
    file = check.string(body, "token_file", path, default="") or ""
    env = check.string(body, "token_env", path, default="") or ""
    if not needed:
        for key in ("token_file", "token_env"):
            if key in body:
                check.problem(f"{path}.{key}", f"{provider} needs no credential")
        return None
    if file and env:
        check.problem(path, "give token_file or token_env, not both")
        return None
    if not file and not env:
        what = "username:password" if provider == "watttime" else "the API token"
        check.problem(path, f"{provider} needs a credential: token_file or token_env holding {what}")
        return None
    secret = Secret(file=str(_resolve(file, base_dir)) if file else "", env=env)
    where = f"{path}.token_file" if file else f"{path}.token_env"
    try:
        value = secret.read()
    except CarbonApiError as err:
        check.problem(where, str(err))
        return None
    if provider == "watttime" and ":" not in value:
        check.problem(where, f"{secret.origin} must hold username:password")
    return secret


def _parse_nadiki(value: Any, path: str, check: Checker, base_dir: Path | None) -> dict[str, Any]:
    """``{"facility": mapping, "racks": [mapping, ...]}`` from the ``nadiki`` section."""
    if value is None:
        return {}
    body = check.mapping(value, path)
    check.unknown_keys(body, NADIKI_FIELDS, path)
    out: dict[str, Any] = {}
    if "facility" in body and "facility_file" in body:
        check.problem(path, "give either facility or facility_file, not both")
    elif "facility_file" in body:
        file = check.string(body, "facility_file", path)
        if file is not None:
            resolved = _resolve(file, base_dir)
            try:
                raw = resolved.read_bytes()
                loaded = orjson.loads(raw) if resolved.suffix == ".json" else parse_yaml(raw.decode("utf-8"), str(resolved))
            except OSError as err:
                check.problem(f"{path}.facility_file", f"{resolved}: cannot read: {err.strerror or err}")
            except orjson.JSONDecodeError as err:
                check.problem(f"{path}.facility_file", f"{resolved}: not valid JSON: {err}")
            except UnicodeDecodeError as err:
                check.problem(f"{path}.facility_file", f"{resolved}: not UTF-8 text: byte at offset {err.start}")
            except ConfigError as err:  # not YAML, or a key given twice
                for problem in err.problems:
                    check.problem(f"{path}.facility_file", f"{resolved}: {problem}")
            else:
                out["facility"] = _facility(loaded, f"{path}.facility_file", check)
    elif "facility" in body:
        out["facility"] = _facility(body["facility"], f"{path}.facility", check)
    racks = []
    for i, rack in enumerate(check.list_of(body, "racks", path)):
        rbody = check.mapping(rack, f"{path}.racks[{i}]")
        check.unknown_keys(rbody, NADIKI_RACK_FIELDS, f"{path}.racks[{i}]")
        racks.append(rbody)
    out["racks"] = racks
    return out


def _facility(value: Any, path: str, check: Checker) -> Mapping[str, Any]:
    body = check.mapping(value, path)
    check.unknown_keys(body, NADIKI_FACILITY_FIELDS, path)
    if body and "location" not in body:
        check.problem(f"{path}.location", "is required (the NADIKI spec requires it)")
    return body


def _parse_server(body: Any, path: str, check: Checker) -> ServerEmbodied | None:
    body = check.mapping(body, path)
    check.unknown_keys(body, SERVER_FIELDS, path)
    kg = check.number(body, "embodied_kg", path, minimum=0.0)
    years = check.number(body, "lifetime_years", path, exclusive_minimum=0.0)
    if kg is None or years is None:
        return None
    return ServerEmbodied(kg, years)
