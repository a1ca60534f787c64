"""What every carbon-intensity API adapter shares: one bounded HTTP GET, the secret, the step
series held between refreshes, the refresh interval and the stale rule.

An adapter (one module per provider) only says which URLs to ask and how to read their JSON into
:class:`Interval` objects (start, end, gCO2e/kWh); :class:`LiveIntensity` does the rest:

- **caching**: at most one refresh per ``refresh_s`` of the clock, whatever the number of callers
  or threads. A caller that finds a refresh under way uses the series held; only a caller with no
  series yet waits for that refresh (bounded by its deadline).
- **timeouts**: each request has a total deadline (``timeout_s``) that also bounds the connect;
  a watchdog shuts the socket down at the deadline, so a server that trickles bytes cannot hold a
  request open, whatever the per-read timeouts would allow.
- **the stale rule**: when a refresh fails, the last series keeps answering, and
  :meth:`LiveIntensity.reading` says how old it is (``age`` since the last successful fetch,
  ``stale`` while the latest refresh failed). Times past the end of the held series, up to now,
  get its last value (the value in force when the data stopped). Past ``max_age_s`` (of the
  fetch, or of the end of the data for such held times) the source raises
  :class:`IntensityUnavailable`, so the site's ``fallback`` answers — never a silent zero.
- **holes**: a time the provider gave no value for (a ``null`` intensity, a missing hour) is not
  filled: ``at`` raises there, and an ``integral`` across it raises, so the fallback answers.

Future times are answered from the provider's forecast where the adapter fetched one; beyond the
forecast horizon the source raises (the caller falls back), it does not extrapolate.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import math
import os
import threading
import time
import urllib.parse
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from joulesched.contracts.errors import CarbonApiError
from joulesched.contracts.net import Deadline, redact
from joulesched.policy.site import IntensitySeries, IntensityUnavailable

MAX_BODY_BYTES = 8 << 20  # a week of 5-minute points is well under 1 MiB
USER_AGENT = "joulesched"


# -- HTTP ----------------------------------------------------------------------------------------


def get_json(url: str, headers: Mapping[str, str], timeout_s: float) -> Any:
    """GET ``url`` and parse its JSON body, all within ``timeout_s`` seconds (connect included).

    Raises :class:`CarbonApiError` naming the URL for a transport failure, a deadline passed, a
    status other than 200 (``status`` set, the first bytes of the body quoted) or a body that is
    not JSON.
    """
    shown = redact(url)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CarbonApiError(f"{shown}: not an http:// or https:// URL")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(parts.hostname, parts.port, timeout=timeout_s)
    with Deadline(conn, timeout_s) as deadline:
        try:
            conn.connect()
            if deadline.expired:  # the deadline passed while connecting, before there was a socket to close
                raise TimeoutError("connecting took the whole deadline")
            conn.request("GET", target, headers={"Accept": "application/json", "User-Agent": USER_AGENT, **headers})
            resp = conn.getresponse()
            body = bytearray()
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise CarbonApiError(f"{shown}: answer larger than {MAX_BODY_BYTES} bytes")
            status = resp.status
            retry_after = _retry_after(resp.getheader("Retry-After"))
        except (OSError, http.client.HTTPException) as err:
            if deadline.expired:
                raise CarbonApiError(f"{shown}: no complete answer within {timeout_s:g} s") from err
            raise CarbonApiError(f"{shown}: {type(err).__name__}: {err}") from err
        finally:
            conn.close()
    if deadline.expired:
        raise CarbonApiError(f"{shown}: no complete answer within {timeout_s:g} s")
    if status != 200:
        text = bytes(body[:200]).decode("utf-8", "replace").strip()
        raise CarbonApiError(
            f"{shown}: HTTP {status}" + (f": {text}" if text else ""), status=status, retry_after=retry_after
        )
    try:
        return orjson.loads(bytes(body))
    except orjson.JSONDecodeError as err:
        raise CarbonApiError(f"{shown}: the answer is not JSON ({err})") from err


def _retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header's wait in seconds: delta-seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time()) if when.tzinfo is not None else None


def basic_auth(user: str, password: str) -> str:
    """The ``Authorization`` header value of HTTP basic authentication (RFC 7617)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


# -- reading the JSON ----------------------------------------------------------------------------


def parse_iso(value: Any, where: str) -> float:
    """Unix seconds of an ISO 8601 time with a zone (``Z`` or an offset); naive times are refused."""
    if not isinstance(value, str):
        raise CarbonApiError(f"{where}: expected an ISO 8601 time, got {value!r}")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise CarbonApiError(f"{where}: {value!r} is not an ISO 8601 time") from err
    if when.tzinfo is None:
        raise CarbonApiError(f"{where}: {value!r} has no time zone")
    return when.timestamp()


def iso_minutes(t: float) -> str:
    """``2024-05-01T12:30Z``: the form the UK API's paths take."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%MZ")


def iso_seconds(t: float) -> str:
    """``2024-05-01T12:30:00Z``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def member(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, Mapping):
        raise CarbonApiError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise CarbonApiError(f"{where}: field {key!r} is missing")
    return obj[key]


def items(obj: Any, key: str, where: str) -> list[Any]:
    value = member(obj, key, where)
    if not isinstance(value, list):
        raise CarbonApiError(f"{where}.{key}: expected a list, got {type(value).__name__}")
    return value


def intensity_value(value: Any, where: str) -> float | None:
    """A finite number >= 0, or ``None`` for a JSON null (a hole: the provider has no value)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CarbonApiError(f"{where}: expected a number >= 0 or null, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Interval:
    """The provider's intensity on ``[start, end)``, gCO2e/kWh (``None``: the provider has none)."""

    start: float
    end: float
    value: float | None


def build_segments(batches: Iterable[list[Interval]], label: str) -> list[IntensitySeries]:
    """Contiguous step series from the intervals of several answers, earlier batches first in
    priority (measured history before forecast for the same start). Overlaps are cut at the later
    start; a gap or a ``None`` value separates two segments (a hole, never filled)."""
    by_start: dict[float, Interval] = {}
    for batch in batches:
        for iv in batch:
            by_start.setdefault(iv.start, iv)
    ordered = sorted(by_start.values(), key=lambda iv: iv.start)
    segments: list[IntensitySeries] = []
    starts: list[float] = []
    values: list[float] = []
    end = -math.inf

    def close() -> None:
        if starts:
            segments.append(IntensitySeries(np.array(starts), np.array(values), end, "error", label))
            starts.clear()
            values.clear()

    for i, iv in enumerate(ordered):
        stop = min(iv.end, ordered[i + 1].start) if i + 1 < len(ordered) else iv.end
        if stop <= iv.start:
            continue
        if iv.value is None or (starts and iv.start > end + 1e-6):
            close()
        if iv.value is None:
            end = -math.inf
            continue
        starts.append(iv.start)
        values.append(iv.value)
        end = stop
    close()
    return segments


def trailing_null(batches: Iterable[list[Interval]]) -> float:
    """Where the provider's last period (by start; the first batch's wins, as in
    :func:`build_segments`) begins, when it came without a value; inf when it has one."""
    by_start: dict[float, Interval] = {}
    for batch in batches:
        for iv in batch:
            by_start.setdefault(iv.start, iv)
    if not by_start:
        return math.inf
    last = by_start[max(by_start)]
    return last.start if last.value is None else math.inf


# -- the secret ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Secret:
    """A credential read from a file (a mounted Kubernetes Secret) or an environment variable at
    each use, so a rotated secret is picked up; it is never written to a log or an error."""

    file: str = ""
    env: str = ""

    @property
    def origin(self) -> str:
        return f"token file {self.file}" if self.file else f"environment variable {self.env}"

    def read(self) -> str:
        if self.file:
            try:
                value = Path(self.file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as err:
                raise CarbonApiError(f"{self.origin}: cannot read: {getattr(err, 'strerror', None) or err}") from err
        else:
            value = os.environ.get(self.env, "").strip()
        if not value:
            raise CarbonApiError(f"{self.origin}: empty")
        return value


# -- the live source -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiSettings:
    """One site's ``carbon_api`` section, validated (``contracts/sitefile.py`` reads it)."""

    provider: str
    url: str
    zone: str = ""  # Electricity Maps zone, WattTime region
    postcode: str = ""  # UK: outward postcode
    region_id: int = 0  # UK: DNO region 1..17 (0: national)
    secret: Secret | None = None
    refresh_s: float = 900.0
    timeout_s: float = 10.0
    max_age_s: float = 7200.0
    forecast: bool = True
    history_hours: float = 24.0


@dataclass(frozen=True)
class Reading:
    """What a live source answers for ``at``, and how fresh that is.

    ``age``: seconds from the last successful fetch to now (``inf`` before the first);
    ``stale``: the latest refresh failed, so the value comes from older data; ``error``: why.
    """

    value: float
    at: float
    fetched_at: float
    age: float
    stale: bool
    source: str
    error: str = ""


@dataclass
class _State:
    segments: list[IntensitySeries] = field(default_factory=list)
    null_from: float = math.inf  # the provider's last period (by start) was null from here: no value held into it
    fetched_at: float = -math.inf
    next_attempt: float = -math.inf
    fetching: bool = False
    error: str = ""
    fetches: int = 0
    failures: int = 0


class LiveIntensity:
    """A :class:`policy.site.CarbonIntensitySource` backed by a carbon-intensity API.

    Subclasses set :attr:`provider` and implement :meth:`fetch` (the requests of one refresh,
    returning batches of :class:`Interval` in priority order); ``clock`` is wall-clock unix
    seconds (the data's times are), injectable so tests drive the refresh and the stale rule.
    """

    provider = ""
    default_url = ""
    needs_secret = True

    def __init__(
        self,
        settings: ApiSettings,
        *,
        clock: Callable[[], float] = time.time,
        get: Callable[[str, Mapping[str, str], float], Any] = get_json,
        spawn: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.get = get
        self.spawn = spawn or self._thread
        self._state = _State()
        self._cond = threading.Condition()

    def _thread(self, run: Callable[[], None]) -> None:
        threading.Thread(target=run, name=f"refresh {self.name}", daemon=True).start()

    # -- what a subclass provides -------------------------------------------------------------

    @property
    def target(self) -> str:
        return self.settings.zone

    def fetch(self, now: float) -> list[list[Interval]]:
        raise NotImplementedError

    # -- the protocol -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"{self.provider} {self.target}".strip()

    def at(self, t: float) -> float:
        segments, now, error = self._answerable()
        return self._series(segments, self._locate(segments, t, now, error), now).at(t)

    def integral(self, a: float, b: float) -> float:
        if b <= a:
            return 0.0
        segments, now, error = self._answerable()
        k = self._locate(segments, a, now, error)
        if self._locate(segments, b, now, error, closing=True) != k:
            raise IntensityUnavailable(
                f"carbon intensity {self.name}: no value for part of {a:.0f}..{b:.0f} (the provider's data has a hole)"
            )
        return self._series(segments, k, now).integral(a, b)

    # -- freshness ----------------------------------------------------------------------------

    def reading(self, t: float | None = None) -> Reading:
        """The value at ``t`` (default now) with its age; raises :class:`IntensityUnavailable`."""
        when = self.clock() if t is None else float(t)
        value = self.at(when)
        with self._cond:
            st = self._state
            now = self.clock()
            return Reading(value, when, st.fetched_at, now - st.fetched_at, bool(st.error), self.name, st.error)

    def age(self) -> float:
        """Seconds since the last successful fetch (``inf`` before the first); no refresh."""
        with self._cond:
            return self.clock() - self._state.fetched_at

    @property
    def stats(self) -> tuple[int, int, str]:
        """(fetches attempted, failed, the last error) for logs and tests."""
        with self._cond:
            return self._state.fetches, self._state.failures, self._state.error

    # -- the refresh --------------------------------------------------------------------------

    def refresh(self) -> None:
        """Start a refresh if the interval has passed and none is under way.

        Every refresh but the very first runs in the background (``spawn``) and callers keep the
        held series meanwhile, or (none held: the first failed) are told at once that there is
        none, so no caller (a metrics scrape, the deferrer's loop) waits on a slow provider; only
        the very first refresh is waited for, bounded by its deadlines.
        """
        now = self.clock()
        with self._cond:
            st = self._state
            if st.fetching or now < st.next_attempt:
                if st.fetching and not st.segments and st.fetches <= 1:  # the very first, under way
                    self._cond.wait_for(lambda: not st.fetching, timeout=self._wait_bound())
                return
            st.fetching = True
            st.next_attempt = now + self.settings.refresh_s
            st.fetches += 1
            # only the very first is waited for: after it failed, a caller gets "unavailable" at
            # once (its fallback answers) rather than waiting on a provider that is down
            background = bool(st.segments) or st.fetches > 1
        if not background:
            self._fetch_and_keep(now)
            return
        try:
            self.spawn(lambda: self._fetch_and_keep(now))
        except RuntimeError as err:  # no thread to be had: try again at the next interval
            with self._cond:
                st.fetching = False
                st.failures += 1
                st.error = f"cannot start the refresh: {err}"
                self._cond.notify_all()

    def _fetch_and_keep(self, now: float) -> None:
        st = self._state
        segments: list[IntensitySeries] = []
        error = "the refresh did not finish"
        null_from = math.inf
        try:
            batches = [list(batch) for batch in self.fetch(now)]
            segments = build_segments(batches, self.name)
            null_from = trailing_null(batches)
            error = "" if segments else "the answer holds no intensity values"
        except CarbonApiError as err:
            error = str(err)
            if err.retry_after is not None:  # asked to wait (429, 503): not asked again before, within max_age_s
                with self._cond:
                    wait = min(err.retry_after, self.settings.max_age_s)
                    st.next_attempt = max(st.next_attempt, self.clock() + wait)
                error += f"; the provider asked to wait {err.retry_after:.0f} s"
        finally:
            with self._cond:
                st.fetching = False
                if segments and not error:
                    st.segments = segments
                    st.null_from = null_from
                    st.fetched_at = self.clock()
                    st.error = ""
                else:
                    st.failures += 1
                    st.error = error
                self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no refresh is under way (tests, and a clean shutdown); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._state.fetching, timeout=timeout)

    def _wait_bound(self) -> float:
        return 4 * self.settings.timeout_s + 1.0  # a refresh makes at most a few requests

    def _answerable(self) -> tuple[list[IntensitySeries], float, str]:
        self.refresh()
        with self._cond:
            st = self._state
            segments, fetched_at, error = st.segments, st.fetched_at, st.error
        now = self.clock()
        if not segments:
            raise IntensityUnavailable(
                f"carbon intensity {self.name}: no data fetched yet ({error or 'the first refresh is under way'})"
            )
        age = now - fetched_at
        if age > self.settings.max_age_s:
            raise IntensityUnavailable(
                f"carbon intensity {self.name}: last fetched {age:.0f} s ago, more than max_age_s "
                f"{self.settings.max_age_s:g} ({error or 'no refresh since'})"
            )
        return segments, now, error

    def _locate(
        self, segments: list[IntensitySeries], t: float, now: float, error: str, *, closing: bool = False
    ) -> int:
        """The index of the segment answering at ``t`` (``closing``: ``t`` ends an interval, so a
        segment's end belongs to it). Past the data's end, up to now, the last segment answers
        (:meth:`_series` holds its last value); elsewhere the source cannot answer."""
        first, last = segments[0], segments[-1]
        if t < float(first.starts[0]):
            raise IntensityUnavailable(
                f"carbon intensity {self.name}: {t:.0f} is before the data held (from {float(first.starts[0]):.0f})"
            )
        k = bisect_right([float(s.starts[0]) for s in segments], t) - 1
        if closing and k > 0 and t == float(segments[k].starts[0]):
            k -= 1
        seg = segments[k]
        if (t <= seg.end) if closing else (t < seg.end):
            return k
        if seg is not last:
            raise IntensityUnavailable(f"carbon intensity {self.name}: the provider has no value at {t:.0f} (a hole)")
        null_from = self._state.null_from
        if math.isfinite(null_from) and null_from >= last.end - 1e-6:  # its last period came null: nothing is held into it
            raise IntensityUnavailable(
                f"carbon intensity {self.name}: the provider gave no value from {null_from:.0f} (null)"
            )
        if t > now:
            why = "beyond the forecast" if self.settings.forecast else "in the future, and no forecast is fetched"
            raise IntensityUnavailable(f"carbon intensity {self.name}: {t:.0f} is {why} (data ends {last.end:.0f})")
        if now - last.end > self.settings.max_age_s:
            raise IntensityUnavailable(
                f"carbon intensity {self.name}: the data ends {now - last.end:.0f} s before now, more than "
                f"max_age_s {self.settings.max_age_s:g} ({error or 'the provider has nothing newer'})"
            )
        return k

    def _series(self, segments: list[IntensitySeries], k: int, now: float) -> IntensitySeries:
        """Segment ``k``; the last one with its last value held on to now when the data ends before."""
        seg = segments[k]
        if k != len(segments) - 1 or now < seg.end:
            return seg
        return IntensitySeries(seg.starts, seg.values, now + 1e-3, "error", seg.label)


def live_source(source: object) -> LiveIntensity | None:
    """The live API source inside ``source`` (itself, or the primary of a ``WithFallback``)."""
    if isinstance(source, LiveIntensity):
        return source
    primary = getattr(source, "primary", None)
    return primary if isinstance(primary, LiveIntensity) else None
