"""Push energy per window to the time-series endpoint the registrar handed out.

Input: :class:`CounterSample` ``(timestamp, source, joules_total)`` — a monotonic energy counter
per source (the agent's wrap-corrected totals), at whatever rate the agent samples. Output: for
every ``dataPoint`` of the registration, one line per window of ``granularitySeconds``, aligned on
multiples of it (``[k·g, (k+1)·g)``), holding the joules used in that window and stamped with the
window's start — what NADIKI's reference processor does (it pushes the energy of each interval,
stamped at the interval's first timestamp).

Exact accounting: a window's energy is the counter's difference between the window's edges; an
edge that falls between two samples is placed by linear interpolation of the counter, so the
windows add up exactly to the counter's growth. A window the agent did not see from its start (the
first one after start-up, a counter reset, a gap longer than ``max_gap_s``) is not pushed rather
than pushed short.

Which source feeds which field is a configured priority list (``fields``); a window is finalised
a few seconds after it ends and takes the value of the highest-priority source that covered it
fully, so a whole-server reading from IPMI is preferred over Redfish, and a missing IPMI window
falls back to Redfish instead of leaving a hole.

Writes go to InfluxDB v2's ``POST {endpoint}/api/v2/write?org=&bucket=&precision=`` with
``Authorization: Token …`` (dropped if a redirect leaves the endpoint's origin:
``contracts.net.open_url``). Lines wait in a bounded backlog while the endpoint is unreachable
(oldest dropped first, counted); a 400 answer (malformed lines: a bug, never accepted on retry)
drops its batch and logs the first line.
"""

from __future__ import annotations

import json
import logging
import math
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from joulesched.contracts.net import open_url
from joulesched.measurement.nadiki.errors import PushFailed
from joulesched.measurement.nadiki.lineprotocol import PRECISIONS, Point, to_timestamp
from joulesched.measurement.nadiki.model import DataPoint, TimeSeriesConfig

log = logging.getLogger(__name__)

BATCH_LINES = 5000
MAX_BACKOFF_S = 300.0


@dataclass(frozen=True)
class CounterSample:
    """One read of a source's energy counter: joules since some origin, never decreasing."""

    timestamp: float  # seconds since the epoch (the time of day)
    source: str  # e.g. ipmi_dcmi, redfish, rapl_sysfs
    joules_total: float
    # seconds of the source's time the agent could not measure so far (gaps it estimated or
    # discarded, which joules_total leaves out): when it grows, the counter missed energy
    unmeasured_seconds: float = 0.0


class WindowAccumulator:
    """A cumulative counter's samples → joules per aligned window of ``granularity`` seconds."""

    def __init__(self, granularity: int, max_gap_s: float) -> None:
        self.g = granularity
        self.max_gap_s = max_gap_s
        self.last: tuple[float, float] | None = None
        self.unmeasured = 0.0
        self.complete_from = math.inf  # windows starting before this were not seen from their start
        self.partial: dict[int, float] = {}  # window start -> joules so far

    def _restart(self, t: float, e: float) -> None:
        self.last = (t, e)
        self.partial.clear()
        self.complete_from = math.ceil(t / self.g) * self.g

    def add(self, t: float, e: float, unmeasured: float = 0.0) -> tuple[list[tuple[int, float]], str | None]:
        """Add a sample; return the windows it completed as (start, joules), and a note if it restarted."""
        missed, self.unmeasured = unmeasured - self.unmeasured, max(unmeasured, self.unmeasured)
        if self.last is None:
            self._restart(t, e)
            return [], None
        t1, e1 = self.last
        if t <= t1:
            return [], None  # duplicate or out of order: the counter's next sample covers it
        if missed > 0:
            self._restart(t, e)
            return [], f"{missed:.0f} s of the source's energy could not be measured (a gap); windows restart"
        if e < e1:
            self._restart(t, e)
            return [], f"counter went back from {e1:.3f} J to {e:.3f} J (reset); windows restart"
        if t - t1 > self.max_gap_s:
            self._restart(t, e)
            return [], f"no sample for {t - t1:.0f} s (more than max_gap_s {self.max_gap_s:g}); windows restart"
        joules = e - e1
        span = t - t1
        start = math.floor(t1 / self.g) * self.g
        while start < t:
            overlap = min(t, start + self.g) - max(t1, start)
            if overlap > 0:
                self.partial[start] = self.partial.get(start, 0.0) + joules * overlap / span
            start += self.g
        self.last = (t, e)
        done = sorted(s for s in self.partial if s + self.g <= t)
        completed = [(s, self.partial.pop(s)) for s in done]
        return [(s, j) for s, j in completed if s >= self.complete_from], None


@dataclass
class InfluxWriter:
    """Writes lines to an InfluxDB v2 endpoint with token authentication."""

    time_series: TimeSeriesConfig
    precision: str = "s"
    ca_file: str | None = None
    timeout_s: float = 10.0

    @property
    def url(self) -> str:
        query = urllib.parse.urlencode(
            {"org": self.time_series.org, "bucket": self.time_series.bucket, "precision": self.precision}
        )
        return f"{self.time_series.endpoint.rstrip('/')}/api/v2/write?{query}"

    def write(self, lines: Sequence[str]) -> None:
        body = ("\n".join(lines) + "\n").encode("utf-8")
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={
                "Authorization": f"Token {self.time_series.token}",
                "Content-Type": "text/plain; charset=utf-8",
                "Accept": "application/json",
            },
        )
        where = f"time-series endpoint {self.time_series.endpoint} (bucket {self.time_series.bucket!r})"
        context = ssl.create_default_context(cafile=self.ca_file) if self.url.startswith("https") else None
        try:
            with open_url(request, timeout=self.timeout_s, context=context) as response:
                response.read()
        except urllib.error.HTTPError as err:
            detail = _error_message(err)
            retry_after = _retry_after(err.headers.get("Retry-After"))
            if err.code in (401, 403):
                raise PushFailed(
                    f"{where}: HTTP {err.code} {detail} — the token was refused; provider mode asks the registrar "
                    "for the server's current timeSeriesConfig",
                    err.code,
                    retry=True,
                ) from err
            if err.code == 400:
                raise PushFailed(
                    f"{where}: HTTP 400 {detail} — the lines were rejected as malformed (a bug: report "
                    "it with the logged line)",
                    err.code,
                    retry=False,
                ) from err
            if err.code == 413:
                raise PushFailed(f"{where}: HTTP 413 request too large", err.code, retry=False) from err
            if err.code == 422:  # InfluxDB v2: points it will never take (past the retention, a type conflict)
                raise PushFailed(f"{where}: HTTP 422 {detail} — the lines were refused", err.code, retry=False) from err
            raise PushFailed(
                f"{where}: HTTP {err.code} {detail}", err.code, retry=True, retry_after=retry_after
            ) from err
        except ssl.SSLCertVerificationError as err:
            raise PushFailed(
                f"{where}: TLS certificate not trusted ({err.verify_message}) — set nadiki.ca_file to "
                "the CA that signed it",
                retry=True,
            ) from err
        except (OSError, urllib.error.URLError) as err:
            reason = getattr(err, "reason", None) or err
            raise PushFailed(f"{where}: {reason} — check the network path to the endpoint", retry=True) from err


def _error_message(err: urllib.error.HTTPError) -> str:
    try:
        body = err.read().decode("utf-8", "replace")
    except OSError:
        return err.reason or ""
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict) and parsed.get("message"):
            return f"{err.reason}: {parsed['message']}"
    except ValueError:
        pass
    return f"{err.reason}: {body[:200]}" if body else str(err.reason)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


@dataclass
class _Series:
    point: DataPoint
    sources: tuple[str, ...]  # priority order
    accumulators: dict[str, WindowAccumulator] = field(default_factory=dict)
    completed: dict[int, dict[str, float]] = field(default_factory=dict)  # window start -> source -> joules
    latest: float = -math.inf  # newest sample time of any of its sources
    done_before: float = -math.inf  # windows starting before this are final (pushed or skipped)


@dataclass
class PushStats:
    lines_queued: int = 0
    lines_written: int = 0
    lines_dropped_backlog: int = 0
    lines_dropped_rejected: int = 0
    writes_failed: int = 0
    last_error: str = ""


class Pusher:
    """Turns counter samples into windows and lines, and writes them with a backlog."""

    def __init__(
        self,
        time_series: TimeSeriesConfig,
        fields: Mapping[str, Sequence[str]],
        *,
        precision: str = "s",
        max_gap_s: float = 300.0,
        max_backlog_lines: int = 20_000,
        writer: Callable[[Sequence[str]], None] | None = None,
        clock: Callable[[], float] = time.time,
        on_unauthorized: Callable[[], TimeSeriesConfig | None] | None = None,
        ca_file: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision: must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.precision = precision
        self.max_gap_s = max_gap_s
        self.clock = clock
        self.on_unauthorized = on_unauthorized
        self.ca_file = ca_file
        self.timeout_s = timeout_s
        self._custom_writer = writer
        self.stats = PushStats()
        self.notes: list[str] = []
        self._lock = threading.Lock()
        self._backlog: deque[str] = deque()
        self._overflowed = 0  # lines dropped from the backlog's head so far (a write in flight may hold them)
        self._max_backlog = max_backlog_lines
        self._failures = 0
        self._next_attempt = -math.inf
        self._fields = {k: tuple(v) for k, v in fields.items()}
        self._series: list[_Series] = []
        self.use(time_series)

    # -- configuration --
    def use(self, time_series: TimeSeriesConfig) -> None:
        """(Re)build the series from a registration's timeSeriesConfig (a refreshed token keeps state)."""
        with self._lock:
            self.time_series = time_series
            self._writer = (
                self._custom_writer or InfluxWriter(time_series, self.precision, self.ca_file, self.timeout_s).write
            )
            old = {(s.point.field, s.point.measurement, s.point.granularity_seconds): s for s in self._series}
            series: list[_Series] = []
            for point in time_series.data_points:
                sources = self._fields.get(point.field)
                if not sources:
                    self.notes.append(
                        f"the registrar asks for field {point.field!r} but no source is mapped to it (nadiki.fields): "
                        "not pushed"
                    )
                    continue
                kept = old.get((point.field, point.measurement, point.granularity_seconds))
                if kept is not None and kept.sources == sources:
                    kept.point = point  # new tags (e.g. the id) apply to the windows still to come
                    series.append(kept)
                else:
                    series.append(_Series(point, sources))
            requested = {p.field for p in time_series.data_points}
            for name in self._fields:
                if name not in requested:
                    self.notes.append(f"field {name!r} is mapped (nadiki.fields) but the registrar does not ask for it")
            self._series = series

    @property
    def fields_pushed(self) -> list[str]:
        return [s.point.field for s in self._series]

    # -- input --
    def add(self, sample: CounterSample) -> None:
        """Take one counter sample (thread-safe, no I/O)."""
        lines: list[Point] = []
        with self._lock:
            for series in self._series:
                if sample.source not in series.sources:
                    continue
                accumulator = series.accumulators.get(sample.source)
                if accumulator is None:
                    accumulator = series.accumulators[sample.source] = WindowAccumulator(
                        series.point.granularity_seconds, self.max_gap_s
                    )
                windows, note = accumulator.add(sample.timestamp, sample.joules_total, sample.unmeasured_seconds)
                if note:
                    log.warning("nadiki %s from %s: %s", series.point.field, sample.source, note)
                for start, joules in windows:
                    if start >= series.done_before:  # a slower source completing a window already pushed
                        series.completed.setdefault(start, {})[sample.source] = joules
                series.latest = max(series.latest, sample.timestamp)
                lines += self._finalise(series)
            for point in lines:
                self._queue(point.to_line())

    def _finalise(self, series: _Series) -> list[Point]:
        """Windows that ended more than a settling delay ago take their best source's value."""
        g = series.point.granularity_seconds
        settle = min(g, 10)
        points = []
        for start in sorted(series.completed):
            covered = series.completed[start]
            best = next((s for s in series.sources if s in covered), None)
            if series.latest < start + g + settle and best != series.sources[0]:
                break  # the preferred source may still complete this window
            del series.completed[start]
            series.done_before = start + g
            if best is None:
                continue
            points.append(
                Point(
                    series.point.measurement,
                    series.point.tags,
                    {series.point.field: covered[best]},
                    to_timestamp(start, self.precision),
                )
            )
        return points

    def _queue(self, line: str) -> None:
        self._backlog.append(line)
        self.stats.lines_queued += 1
        while len(self._backlog) > self._max_backlog:
            self._backlog.popleft()
            self._overflowed += 1
            self.stats.lines_dropped_backlog += 1
            if self.stats.lines_dropped_backlog == 1:
                log.error(
                    "nadiki: backlog full (%d lines): dropping the oldest; is the endpoint reachable?",
                    self._max_backlog,
                )

    # -- output --
    def pending(self) -> int:
        with self._lock:
            return len(self._backlog)

    def due(self) -> bool:
        return self.pending() > 0 and self.clock() >= self._next_attempt

    def _take(self, batch: list[str], overflowed: int) -> None:
        """Take a batch that was written or refused off the backlog's head: those of its lines that
        are still there (a backlog that overflowed meanwhile dropped the oldest, the batch's)."""
        gone = min(self._overflowed - overflowed, len(batch))
        for _ in range(len(batch) - gone):
            self._backlog.popleft()
        self.stats.lines_dropped_backlog -= gone  # they were not dropped: the batch held them

    def flush(self) -> int:
        """Write the backlog in batches; return the lines written. Failures are kept for a retry.
        A token refused (401/403) asks the registrar for the current timeSeriesConfig once a
        flush, and the batch is tried again with it."""
        written = 0
        asked = False
        while True:
            with self._lock:
                batch = list(self._backlog)[:BATCH_LINES]
                overflowed = self._overflowed
                writer = self._writer
            if not batch:
                return written
            try:
                writer(batch)
            except PushFailed as err:
                self.stats.writes_failed += 1
                self.stats.last_error = str(err)
                if err.status in (401, 403) and self.on_unauthorized is not None and not asked:
                    asked = True
                    refreshed = self.on_unauthorized()
                    if refreshed is not None:
                        self.use(refreshed)
                        continue
                if not err.retry:
                    with self._lock:
                        self._take(batch, overflowed)
                    self.stats.lines_dropped_rejected += len(batch)
                    log.error("nadiki: %s; dropped %d lines, the first: %s", err, len(batch), batch[0])
                    continue
                self._failures += 1
                backoff = min(MAX_BACKOFF_S, 5.0 * 2 ** (self._failures - 1))
                self._next_attempt = self.clock() + (err.retry_after if err.retry_after is not None else backoff)
                log.warning(
                    "nadiki: %s; %d lines kept, next try in %.0f s",
                    err,
                    self.pending(),
                    self._next_attempt - self.clock(),
                )
                return written
            with self._lock:
                self._take(batch, overflowed)
            written += len(batch)
            self.stats.lines_written += len(batch)
            self._failures = 0
            self._next_attempt = -math.inf

    def run(self, samples: Iterable[CounterSample], stop: threading.Event | None = None) -> None:
        """Consume samples until the iterable ends or ``stop`` is set; flush as windows complete."""
        for sample in samples:
            self.add(sample)
            if self.due():
                self.flush()
            if stop is not None and stop.is_set():
                break
        if self.pending():
            self.flush()


__all__ = ["CounterSample", "InfluxWriter", "PushStats", "Pusher", "WindowAccumulator"]
