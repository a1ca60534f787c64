"""Running energy totals per source and zone: the exact counters everything else differences.

:class:`EnergyMeter` reads every zone of every source when asked (by the sampler each interval,
and by the windows API and ``joulesched measure`` at a window's edges), and adds each zone's
energy since its previous reading to a 64-bit-or-wider integer total in nanojoules:

* counter zones: wrap-safe difference (:func:`measurement.energy.counter_delta`);
* power zones: trapezoid over the readings' own timestamps (:func:`measurement.energy.trapezoid`).

A delta that is negative after the wrap correction, above ``max_zone_watts × dt``, a step back
that a wrap would explain only above the zone's own plausible power (a ``reset``), or (power)
across a gap longer than ``max_gap_seconds`` is dropped, counted per (source, zone, kind), logged
once, and the zone is re-based on the new reading; its interval is estimated or discarded (see
Gaps below). A counter
reading outside its range is ``garbage``: counted, and the last good reading kept. A failed read
leaves the zone's previous reading in place, so the next successful read catches up (counters
lose nothing). For counters, dt runs from when the previous value was first read (reads that see
no change do not move it), so how often windows read the meter never changes the limits.

Two ways of reading. Without :meth:`EnergyMeter.start` (the simulator, ``joulesched measure``,
tests) :meth:`~EnergyMeter.read` reads every source in the caller's thread. After it (the agent)
each source has a reader thread of its own: :meth:`~EnergyMeter.read` asks every reader for a
fresh reading and waits at most ``wait_seconds`` for the answers; a source that is slower (a BMC
that does not answer) is accounted whenever its reading arrives, with the reading's own
timestamp, and delays nothing else.

A source that fails — a read, or its opening at start (``pending``: configured but not open) — is
tried again after a capped exponential backoff with jitter (``retry_initial_seconds`` doubling to
``retry_max_seconds``, each wait drawn from half to all of it), so a BMC that is down is not
hammered and one that comes back is read within one backoff period.

Gaps. A counter loses nothing when reads fail: the next reading catches up, measured. A power
zone's readings up to ``max_gap_seconds`` apart are integrated (the trapezoid between them). An
interval the meter cannot measure — a power gap longer than that, a counter reset, a step back,
an implausible jump — is handed to the ``estimator`` (the sampler's: the zone's own power model
over the CPU time measured during the gap); what it returns is added to the zone's *estimated*
total, kept apart from the measured one (``MeterRead.estimated``; ``MeterRead.totals`` holds
both, so windows and attribution count it); without an estimate the interval stays discarded
(``discarded_seconds``). Either way it is counted in ``anomalies``.

Zones are re-listed every ``rescan_seconds``: a new zone starts from its first reading; a zone
that disappeared keeps its total and its last reading and is marked absent. When it is listed
again its next reading is differenced against that last one, as after failed reads: a counter
that kept counting loses nothing, one that came back lower is a ``reset`` (never a wrap), a
counter gone long enough to have wrapped more than once is a ``gap`` (as after failed reads), and
a power zone absent longer than ``max_gap_seconds`` is a ``gap``.

Each zone's power gauge (:meth:`EnergyMeter.zone_states`) is its total's change over the last
``power_window_seconds`` of accepted readings — never one interval's jump — capped at the zone's
``max_watts`` (its physical maximum where the source knows it, else ``max_zone_watts``) and absent
(None) while the zone has not been read for ``stale_seconds`` or since a dropped interval.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from joulesched.measurement.clock import SteadyClock
from joulesched.measurement.errors import MeasurementError
from joulesched.measurement.snapshot import READ_SECONDS_BUCKETS, SourceSnapshot
from joulesched.measurement.sources.base import HasMaxWatts, Reading, ReadsInPasses, Source, Zone
from joulesched.measurement.windowstore import Anchor
from joulesched.policy.energy import (
    Delta,
    Layout,
    ZoneInfo,
    ZoneKey,
    counter_delta,
    impossible,
    plan_layout,
    to_nanojoules,
    trapezoid,
)

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Opener = Callable[[], Source]
Estimator = Callable[[ZoneInfo, float, float], float | None]  # (zone, start, end) -> joules or None


WRAP_HEADROOM = 4.0  # a wrap is believed up to this many times the zone's highest power seen
MIN_PEAK_SECONDS = 0.05  # intervals shorter than this do not teach the zone's highest power


@dataclass(frozen=True)
class Pending:
    """A configured source that did not open: retried with backoff until it does."""

    name: str
    opener: Opener
    error: str
    group: frozenset[str] = frozenset()  # alternatives reading the same counters (one is enough)


class _ZoneState:
    __slots__ = (
        "back",
        "estimated_nj",
        "history",
        "info",
        "last",
        "last_ok",
        "max_watts",
        "peak_watts",
        "present",
        "total_nj",
        "zone",
    )

    def __init__(self, zone: Zone, info: ZoneInfo, max_watts: float) -> None:
        self.zone = zone
        self.info = info
        # a counter's last accepted reading that changed its value: its timestamp is when the
        # current value was first seen, the start of the interval the next step accrued over
        self.last: Reading | None = None
        self.last_ok = float("-inf")  # when the zone last read successfully (changed or not)
        self.total_nj = 0  # measured
        self.estimated_nj = 0  # estimated for intervals that could not be measured
        self.present = True
        self.back = False  # listed again after it was missing, not read since: a step back is a reset
        self.peak_watts = 0.0  # the highest power of an accepted counter interval
        self.max_watts = max_watts  # the gauge's cap
        self.history: deque[tuple[float, int]] = deque()  # (reading time, total) since the last gap


class _SourceState:
    def __init__(self, name: str, source: Source | None, pending: Pending | None = None) -> None:
        self.name = name
        self.source = source
        self.pending = pending
        self.retired = False  # a pending alternative made unnecessary by another that opened
        self.zones: dict[str, _ZoneState] = {}
        self.up = source is not None
        self.error = pending.error if pending is not None else ""
        self.buckets = [0] * (len(READ_SECONDS_BUCKETS) + 1)
        self.read_sum = 0.0
        self.read_count = 0
        self.errors_total = 0
        self.failures = 0  # consecutive failed attempts (reads or opens)
        self.next_try = float("-inf")  # meter clock: no attempt before this
        self.last_rescan = float("-inf")
        # reader thread (after start()): requests and completed reads, by ticket
        self.cond = threading.Condition()
        self.requested = 0
        self.done = 0
        self.thread: threading.Thread | None = None


@dataclass(frozen=True)
class MeterRead:
    time: float
    totals: dict[ZoneKey, int]  # nanojoules since the meter started, measured + estimated
    estimated: dict[ZoneKey, int] = field(default_factory=dict)  # the estimated part of totals


def _info(source: str, zone: Zone) -> ZoneInfo:
    return ZoneInfo(source, zone.name, zone.domain, zone.kind, zone.parent, zone.max_joules)


class EnergyMeter:
    def __init__(
        self,
        sources: Sequence[Source],
        *,
        order: Sequence[str] = (),
        clock: Clock | None = None,
        max_zone_watts: float = 10_000.0,
        max_gap_seconds: float = 30.0,
        rescan_seconds: float = 30.0,
        server_includes_gpus: bool = False,
        pending: Sequence[Pending] = (),
        retry_initial_seconds: float = 1.0,
        retry_max_seconds: float = 30.0,
        power_window_seconds: float = 10.0,
        stale_seconds: float = 3.0,
        rng: random.Random | None = None,
    ) -> None:
        clock = self.clock = clock or SteadyClock()
        self.max_zone_watts = max_zone_watts
        self.max_gap_seconds = max_gap_seconds
        self.rescan_seconds = rescan_seconds
        self.retry_initial_seconds = retry_initial_seconds
        self.retry_max_seconds = retry_max_seconds
        self.power_window_seconds = power_window_seconds
        self.stale_seconds = stale_seconds
        self.server_includes_gpus = server_includes_gpus
        self.lock = threading.RLock()
        self._rng = rng or random.Random()
        self._sources = [_SourceState(s.name, s) for s in sources]
        self._sources += [_SourceState(p.name, None, p) for p in pending]
        self.order = tuple(order) or tuple(s.name for s in self._sources)
        self.anomalies: dict[tuple[str, str, str], int] = {}
        self.discarded_seconds: dict[tuple[str, str, str], float] = {}  # time whose energy is unknown
        self.estimated_seconds: dict[tuple[str, str, str], float] = {}  # time whose energy is estimated
        self.estimator: Estimator | None = None
        now = clock()
        for state in self._sources:
            state.last_rescan = now
            if state.source is not None:
                self._adopt(state, self._list(state))
        self._layout = self._plan()
        self._stop = threading.Event()
        self.wait_seconds: float | None = None  # None: read in the caller's thread

    # -- zones ---------------------------------------------------------------------------------

    def _list(self, state: _SourceState) -> list[Zone] | None:
        assert state.source is not None
        try:
            return list(state.source.zones())
        except MeasurementError as err:
            self._fail(state, str(err))
        except Exception as err:  # a source bug must not stop the others
            self._fail(state, f"{type(err).__name__}: {err}")
        return None

    def _max_watts(self, zone: Zone) -> float:
        if isinstance(zone, HasMaxWatts) and zone.max_watts:
            return min(float(zone.max_watts), self.max_zone_watts)
        return self.max_zone_watts

    def _adopt(self, state: _SourceState, zones: list[Zone] | None) -> bool:
        """Take the listed zones; return True when the set of zones changed."""
        if zones is None:
            return False
        changed = False
        seen = set()
        for zone in zones:
            seen.add(zone.name)
            existing = state.zones.get(zone.name)
            if existing is None:
                state.zones[zone.name] = _ZoneState(zone, _info(state.name, zone), self._max_watts(zone))
                changed = True
            else:
                existing.zone = zone
                if not existing.present:
                    # back: its next reading is differenced against the last one before it went,
                    # as after failed reads (a counter that kept counting loses nothing; one that
                    # came back reset is a reset, a power zone gone too long a gap)
                    existing.present = True
                    existing.back = True
                    changed = True
        for name, zs in state.zones.items():
            if name not in seen and zs.present:
                zs.present = False  # its last reading stays, for when it comes back
                zs.history.clear()
                changed = True
        return changed

    def _plan(self) -> Layout:
        infos = [zs.info for st in self._sources for zs in st.zones.values() if zs.present]
        return plan_layout(infos, self.order, self.server_includes_gpus)

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def source_objects(self) -> list[Source]:
        with self.lock:
            return [st.source for st in self._sources if st.source is not None]

    def zone_states(self) -> list[tuple[ZoneInfo, int, bool, float | None, int]]:
        """Each zone's info, measured total (nJ), presence, power gauge (W; None: unknown now)
        and estimated total (nJ)."""
        with self.lock:
            now = self.clock()
            return [
                (zs.info, zs.total_nj, zs.present, self._gauge(zs, now), zs.estimated_nj)
                for st in self._sources
                for zs in st.zones.values()
            ]

    def anchors(self) -> dict[ZoneKey, Anchor]:
        """Every counter zone's last accepted raw reading with the totals it made (for carrying
        windows across a restart, measurement/windowstore.py)."""
        with self.lock:
            return {
                (st.name, zs.info.zone): Anchor(
                    zs.last.value,
                    zs.last.timestamp,
                    zs.total_nj + zs.estimated_nj,
                    zs.estimated_nj,
                    zs.info.max_joules,
                )
                for st in self._sources
                for zs in st.zones.values()
                if zs.info.kind == "counter" and zs.last is not None and zs.present
            }

    def power_readings(self) -> dict[ZoneKey, Reading]:
        """The last accepted reading of every power zone (watts, when)."""
        with self.lock:
            return {
                (st.name, zs.info.zone): zs.last
                for st in self._sources
                for zs in st.zones.values()
                if zs.info.kind == "power" and zs.last is not None and zs.present
            }

    def covered_until(self, source: str) -> float | None:
        """How far in time a source's totals reach: the oldest last accepted reading of its
        present top-level zones (a power zone's energy is integrated up to its last reading, a
        counter's up to its last change); None before any reading."""
        with self.lock:
            times = [
                zs.last.timestamp
                for st in self._sources
                if st.name == source
                for zs in st.zones.values()
                if zs.present and zs.last is not None and zs.info.parent is None
            ]
        return min(times) if times else None

    def _gauge(self, zs: _ZoneState, now: float) -> float | None:
        if not zs.present or now - zs.last_ok > self.stale_seconds or len(zs.history) < 2:
            return None
        (t0, e0), (t1, e1) = zs.history[0], zs.history[-1]
        if t1 <= t0:
            return None
        return min(max((e1 - e0) / 1e9 / (t1 - t0), 0.0), zs.max_watts)

    # -- reading -------------------------------------------------------------------------------

    def _backoff(self, state: _SourceState) -> float:
        state.failures += 1
        delay = min(self.retry_max_seconds, self.retry_initial_seconds * 2.0 ** min(state.failures - 1, 60))
        delay *= self._rng.uniform(0.5, 1.0)
        state.next_try = self.clock() + delay
        return delay

    def _fail(self, state: _SourceState, message: str) -> None:
        state.errors_total += 1
        # one warning per change of state or cause, not one per read
        if state.up or message != state.error:
            log.warning("source %s: %s", state.name, message)
        state.up = False
        state.error = message

    def _anomaly(self, info: ZoneInfo, kind: str, detail: str, seconds: float, estimated: bool = False) -> None:
        key = (info.source, info.zone, kind)
        count = self.anomalies.get(key, 0)
        self.anomalies[key] = count + 1
        into = self.estimated_seconds if estimated else self.discarded_seconds
        into[key] = into.get(key, 0.0) + max(seconds, 0.0)
        if count == 0:
            log.warning(
                "%s zone %s: %s energy delta dropped (%s), %s; further ones are counted in "
                "joulesched_energy_anomalies_total only",
                info.source,
                info.zone,
                kind,
                detail,
                "estimated from the power model" if estimated else "no estimate possible yet",
            )

    def _estimate(self, info: ZoneInfo, start: float, end: float) -> float | None:
        if self.estimator is None or end <= start:
            return None
        try:
            joules = self.estimator(info, start, end)
        except Exception:  # an estimate is a bonus: its failure loses nothing already measured
            log.exception("%s zone %s: estimating a gap failed", info.source, info.zone)
            return None
        return joules if joules is not None and joules >= 0 else None

    def read(self, wait: float | None = None) -> MeterRead:
        """Read every zone now (after :meth:`start`: ask every reader, wait at most ``wait``
        seconds, default ``wait_seconds``); return the running totals."""
        if self.wait_seconds is None:
            with self.lock:
                now = self.clock()
                for state in list(self._sources):
                    self._attempt(state)
                return self._totals(now)
        now = self.clock()
        deadline = time.monotonic() + (self.wait_seconds if wait is None else wait)
        tickets = []
        for state in list(self._sources):
            with state.cond:
                state.requested += 1
                tickets.append((state, state.requested))
                state.cond.notify_all()
        for state, ticket in tickets:
            if not state.up:  # a failing source (backing off, or hung in a read): its answer is not coming soon
                continue
            with state.cond:
                while state.done < ticket and not self._stop.is_set():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    state.cond.wait(remaining)
        with self.lock:
            return self._totals(now)

    def current(self) -> MeterRead:
        """The running totals as they stand, without reading anything."""
        with self.lock:
            return self._totals(self.clock())

    def _totals(self, now: float) -> MeterRead:
        zones = [(st.name, zs) for st in self._sources for zs in st.zones.values()]
        return MeterRead(
            now,
            {(name, zs.info.zone): zs.total_nj + zs.estimated_nj for name, zs in zones},
            {(name, zs.info.zone): zs.estimated_nj for name, zs in zones if zs.estimated_nj},
        )

    def start(self, wait_seconds: float) -> None:
        """Give every source a reader thread; :meth:`read` then waits at most ``wait_seconds``."""
        with self.lock:
            if self.wait_seconds is not None:
                return
            self.wait_seconds = wait_seconds
            for state in self._sources:
                self._start_reader(state)

    def _start_reader(self, state: _SourceState) -> None:
        state.thread = threading.Thread(target=self._reader, args=(state,), name=f"source-{state.name}", daemon=True)
        state.thread.start()

    def stop(self) -> None:
        self._stop.set()
        for state in self._sources:
            with state.cond:
                state.cond.notify_all()

    def _reader(self, state: _SourceState) -> None:
        while not self._stop.is_set() and not state.retired:
            with state.cond:
                while state.requested == state.done and not self._stop.is_set():
                    state.cond.wait()
                ticket = state.requested
            try:
                self._attempt(state)
            except Exception:  # a bug in one source must not end its reader
                log.exception("source %s: read failed", state.name)
            with state.cond:
                state.done = ticket
                state.cond.notify_all()

    def _attempt(self, state: _SourceState) -> None:
        """One read of the source (or, while it is pending, one try to open it), unless it is
        backing off after a failure."""
        if state.retired or self.clock() < state.next_try:
            return
        if state.source is None and not self._open(state):
            return
        now = self.clock()
        if now - state.last_rescan >= self.rescan_seconds:
            state.last_rescan = now
            zones = self._list(state)
            with self.lock:
                if self._adopt(state, zones):
                    self._layout = self._plan()
        self._read_source(state)

    def _open(self, state: _SourceState) -> bool:
        assert state.pending is not None
        pending = state.pending
        with self.lock:
            taken = [st.name for st in self._sources if st.source is not None and st.name in pending.group]
            if taken:
                state.retired = True
                log.info("source %s: no longer retried, %s reads these counters", state.name, taken[0])
                return False
        try:
            source = pending.opener()
            zones = list(source.zones())
        except Exception as err:  # MeasurementError, or a bug: either way retried later
            message = str(err) if isinstance(err, MeasurementError) else f"{type(err).__name__}: {err}"
            with self.lock:
                self._fail(state, message)
            delay = self._backoff(state)
            log.debug("source %s: not open, next try in %.1f s", state.name, delay)
            return False
        with self.lock:
            state.source = source
            state.failures, state.next_try = 0, float("-inf")
            state.last_rescan = self.clock()
            self._adopt(state, zones)
            self._layout = self._plan()
            state.up, state.error = True, ""
        log.info("source %s: open now (%d zone%s)", state.name, len(zones), "" if len(zones) == 1 else "s")
        return True

    def _read_source(self, state: _SourceState) -> None:
        started = time.perf_counter()
        failures: list[tuple[_ZoneState, str]] = []
        readings: list[tuple[_ZoneState, Reading]] = []
        passes = isinstance(state.source, ReadsInPasses)
        if passes:
            state.source.begin_pass()  # type: ignore[union-attr]
        try:
            for zs in list(state.zones.values()):
                if not zs.present:
                    continue
                try:
                    readings.append((zs, zs.zone.read()))
                except MeasurementError as err:
                    failures.append((zs, str(err)))
                except Exception as err:  # a source bug must not stop the others
                    failures.append((zs, f"zone {zs.info.zone}: {type(err).__name__}: {err}"))
        finally:
            if passes:
                state.source.end_pass()  # type: ignore[union-attr]
        elapsed = time.perf_counter() - started
        read_ok = {zs.info.zone for zs, _ in readings}
        # A failing zone whose parent read (a RAPL core plane, Redfish's second reading of the same
        # chassis) loses nothing the parent does not measure: the source stays up, the error shows.
        harmful = [m for zs, m in failures if zs.info.parent not in read_ok]
        message = "; ".join(m for _, m in failures)
        with self.lock:
            for zs, reading in readings:
                self._account(zs, reading)
            state.read_sum += elapsed
            state.read_count += 1
            state.buckets[bisect_left(READ_SECONDS_BUCKETS, elapsed)] += 1
            if harmful:
                self._fail(state, message)
                if not readings:  # nothing read: the source is down, back off
                    self._backoff(state)
                return
            state.failures, state.next_try = 0, float("-inf")
            if failures:
                state.errors_total += 1
                if message != state.error:
                    log.warning("source %s: %s (its parent zone still reads)", state.name, message)
            elif not state.up:
                log.info("source %s: reading again", state.name)
            state.up, state.error = True, message

    def _account(self, zs: _ZoneState, reading: Reading) -> None:
        info = zs.info
        last = zs.last
        limit = self.max_zone_watts if info.kind == "power" else info.max_joules
        if last is None and impossible(reading.value, limit):
            # (after a good reading, counter_delta and trapezoid say so, with the interval)
            self._anomaly(info, "garbage", f"first reading {reading.value:g}", 0.0, estimated=False)
            return
        if not impossible(reading.value, limit):
            zs.last_ok = max(zs.last_ok, reading.timestamp)  # a zone read only garbage is not read
        if last is None:
            zs.last = reading
            zs.history.clear()
            zs.history.append((reading.timestamp, zs.total_nj))
            return
        dt = reading.timestamp - last.timestamp
        if info.kind == "power":
            if reading.timestamp == last.timestamp:
                return  # the device has no new reading yet
            delta = trapezoid(
                last.value, last.timestamp, reading.value, reading.timestamp, self.max_zone_watts, self.max_gap_seconds
            )
        else:
            if reading.value == last.value:
                return  # no step yet (a coarse counter): the interval runs on from the last change
            # dt runs from when the previous value was first seen (over the time between the last
            # successful reads, however often windows read), so the plausibility limit depends on
            # the real elapsed time only
            wrap_watts = WRAP_HEADROOM * zs.peak_watts if zs.peak_watts > 0 else self.max_zone_watts
            if zs.back and reading.value < last.value:
                # back from a re-listing lower than it went: a device re-enumerated starts again
                # from 0 far more often than it wraps while unlisted, so never take it as a wrap
                delta = Delta(None, "reset")
            else:
                delta = counter_delta(
                    last.value, reading.value, info.max_joules, dt, self.max_zone_watts, wrap_watts=wrap_watts
                )
        zs.back = False
        if delta.joules is None:
            kind = delta.anomaly or "implausible"
            garbage = kind == "garbage"  # an impossible reading: keep the last good one, lose nothing
            estimate = None if garbage else self._estimate(info, last.timestamp, reading.timestamp)
            if estimate is not None:
                zs.estimated_nj += to_nanojoules(estimate)
            self._anomaly(
                info,
                kind,
                f"{last.value:g} → {reading.value:g} over {dt:.3f} s",
                0.0 if garbage else dt,
                estimated=estimate is not None,
            )
            if garbage:
                return
            zs.history.clear()  # the gauge restarts after a dropped interval: never across it
        else:
            zs.total_nj += to_nanojoules(delta.joules)
            if info.kind != "power" and dt >= MIN_PEAK_SECONDS:
                zs.peak_watts = max(zs.peak_watts, delta.joules / dt)
        zs.last = reading
        history = zs.history
        history.append((reading.timestamp, zs.total_nj))
        # keep the newest point at least power_window_seconds older than the latest one
        while len(history) > 2 and reading.timestamp - history[1][0] >= self.power_window_seconds:
            history.popleft()

    def all_up(self) -> bool:
        with self.lock:
            return all(st.up for st in self._sources if not st.retired)

    def basis_reading(self) -> bool:
        """Whether every source of the node total's basis is up and was read within
        ``stale_seconds`` (else the node's power is unknown now)."""
        with self.lock:
            names = set(self._layout.basis.split("+")) - {""}
            now = self.clock()
            for st in self._sources:
                if st.name in names:
                    present = [zs for zs in st.zones.values() if zs.present]
                    if not st.up or not present or all(now - zs.last_ok > self.stale_seconds for zs in present):
                        return False
            return bool(names)

    def usable(self) -> bool:
        """Whether at least one source is open and reading."""
        with self.lock:
            return any(st.up and st.source is not None for st in self._sources)

    def source_snapshots(self) -> tuple[SourceSnapshot, ...]:
        with self.lock:
            out = []
            for st in self._sources:
                if st.retired:
                    continue
                cumulative, running = [], 0
                for count in st.buckets:
                    running += count
                    cumulative.append(running)
                out.append(
                    SourceSnapshot(
                        st.name, st.up, st.error, tuple(cumulative), st.read_sum, st.read_count, st.errors_total
                    )
                )
            return tuple(out)


__all__ = ["EnergyMeter", "MeterRead", "Pending"]
