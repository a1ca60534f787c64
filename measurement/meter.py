"""Running energy totals per source and zone: the exact counters everything else differences.

:class:`EnergyMeter` reads every zone of every source when asked (by the sampler each interval,
and by the windows API and ``joulesched measure`` at a window's edges), and adds each zone's
energy since its previous reading to a 64-bit-or-wider integer total in nanojoules:

* counter zones: wrap-safe difference (:func:`measurement.energy.counter_delta`);
* power zones: trapezoid over the readings' own timestamps (:func:`measurement.energy.trapezoid`).

A delta that is negative after the wrap correction, above ``max_zone_watts × dt``, a step back
that a wrap would explain only above the zone's own plausible power (a ``reset``), or (power)
across a gap longer than ``max_gap_seconds`` is dropped, counted per (source, zone, kind) with
the seconds it covered, logged once, and the zone is re-based on the new reading. A counter
reading outside its range is ``garbage``: counted, and the last good reading kept. A failed read
leaves the zone's previous reading in place, so the next successful read catches up (counters
lose nothing). For counters, dt runs from when the previous value was first read (reads that see
no change do not move it), so how often windows read the meter never changes the limits.

Zones are re-listed every ``rescan_seconds``: a new zone starts from its first reading; a zone
that disappeared keeps its total and is marked absent.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from joulesched.measurement.errors import MeasurementError
from joulesched.measurement.snapshot import READ_SECONDS_BUCKETS, SourceSnapshot
from joulesched.measurement.sources.base import Reading, Source, Zone
from joulesched.policy.energy import Layout, ZoneInfo, ZoneKey, counter_delta, plan_layout, to_nanojoules, trapezoid

log = logging.getLogger(__name__)

Clock = Callable[[], float]


WRAP_HEADROOM = 4.0  # a wrap is believed up to this many times the zone's highest power seen
MIN_PEAK_SECONDS = 0.05  # intervals shorter than this do not teach the zone's highest power


class _ZoneState:
    __slots__ = ("info", "last", "peak_watts", "present", "total_nj", "zone")

    def __init__(self, zone: Zone, info: ZoneInfo) -> None:
        self.zone = zone
        self.info = info
        # a counter's last accepted reading that changed its value: its timestamp is when the
        # current value was first seen, the start of the interval the next step accrued over
        self.last: Reading | None = None
        self.total_nj = 0
        self.present = True
        self.peak_watts = 0.0  # the highest power of an accepted counter interval


class _SourceState:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.zones: dict[str, _ZoneState] = {}
        self.up = True
        self.error = ""
        self.buckets = [0] * (len(READ_SECONDS_BUCKETS) + 1)
        self.read_sum = 0.0
        self.read_count = 0
        self.errors_total = 0


@dataclass(frozen=True)
class MeterRead:
    time: float
    totals: dict[ZoneKey, int]  # nanojoules since the meter started


def _info(source: str, zone: Zone) -> ZoneInfo:
    return ZoneInfo(source, zone.name, zone.domain, zone.kind, zone.parent, zone.max_joules)


class EnergyMeter:
    def __init__(
        self,
        sources: Sequence[Source],
        *,
        order: Sequence[str] = (),
        clock: Clock = time.time,
        max_zone_watts: float = 10_000.0,
        max_gap_seconds: float = 30.0,
        rescan_seconds: float = 30.0,
        server_includes_gpus: bool = False,
    ) -> None:
        self.clock = clock
        self.max_zone_watts = max_zone_watts
        self.max_gap_seconds = max_gap_seconds
        self.rescan_seconds = rescan_seconds
        self.order = tuple(order) or tuple(s.name for s in sources)
        self.server_includes_gpus = server_includes_gpus
        self.lock = threading.RLock()
        self._sources = [_SourceState(s) for s in sources]
        self.anomalies: dict[tuple[str, str, str], int] = {}
        self.discarded_seconds: dict[tuple[str, str, str], float] = {}  # time whose energy is unknown
        self._last_rescan = clock()
        for state in self._sources:
            self._adopt(state, self._list(state))
        self._layout = self._plan()

    # -- zones ---------------------------------------------------------------------------------

    def _list(self, state: _SourceState) -> list[Zone] | None:
        try:
            return list(state.source.zones())
        except MeasurementError as err:
            self._fail(state, str(err))
        except Exception as err:  # a source bug must not stop the others
            self._fail(state, f"{type(err).__name__}: {err}")
        return None

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
                state.zones[zone.name] = _ZoneState(zone, _info(state.source.name, zone))
                changed = True
            else:
                existing.zone = zone
                if not existing.present:
                    existing.present = True
                    existing.last = None  # re-plugged: start from its next reading
                    changed = True
        for name, zs in state.zones.items():
            if name not in seen and zs.present:
                zs.present = False
                zs.last = None
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
        return [st.source for st in self._sources]

    def zone_states(self) -> list[tuple[ZoneInfo, int, bool]]:
        with self.lock:
            return [(zs.info, zs.total_nj, zs.present) for st in self._sources for zs in st.zones.values()]

    # -- reading -------------------------------------------------------------------------------

    def _fail(self, state: _SourceState, message: str) -> None:
        state.errors_total += 1
        if state.up or message != state.error:
            log.warning("source %s: %s", state.source.name, message)
        state.up = False
        state.error = message

    def _anomaly(self, info: ZoneInfo, kind: str, detail: str, seconds: float) -> None:
        key = (info.source, info.zone, kind)
        count = self.anomalies.get(key, 0)
        self.anomalies[key] = count + 1
        self.discarded_seconds[key] = self.discarded_seconds.get(key, 0.0) + max(seconds, 0.0)
        if count == 0:
            log.warning(
                "%s zone %s: %s energy delta dropped (%s); further ones are counted in "
                "joulesched_energy_anomalies_total only",
                info.source,
                info.zone,
                kind,
                detail,
            )

    def read(self) -> MeterRead:
        """Read every zone now; return the running totals."""
        with self.lock:
            now = self.clock()
            if now - self._last_rescan >= self.rescan_seconds:
                self._last_rescan = now
                changed = False
                for state in self._sources:
                    changed |= self._adopt(state, self._list(state))
                if changed:
                    self._layout = self._plan()
            totals: dict[ZoneKey, int] = {}
            for state in self._sources:
                self._read_source(state)
                name = state.source.name
                for zs in state.zones.values():
                    totals[(name, zs.info.zone)] = zs.total_nj
            return MeterRead(now, totals)

    def _read_source(self, state: _SourceState) -> None:
        started = time.perf_counter()
        failures: list[str] = []
        for zs in state.zones.values():
            if not zs.present:
                continue
            try:
                reading = zs.zone.read()
            except MeasurementError as err:
                failures.append(str(err))
                continue
            except Exception as err:  # a source bug must not stop the others
                failures.append(f"zone {zs.info.zone}: {type(err).__name__}: {err}")
                continue
            self._account(zs, reading)
        elapsed = time.perf_counter() - started
        state.read_sum += elapsed
        state.read_count += 1
        state.buckets[bisect_left(READ_SECONDS_BUCKETS, elapsed)] += 1
        if failures:
            self._fail(state, "; ".join(failures))
        elif not state.up:
            log.info("source %s: reading again", state.source.name)
            state.up = True
            state.error = ""

    def _account(self, zs: _ZoneState, reading: Reading) -> None:
        last = zs.last
        if last is None:
            zs.last = reading
            return
        info = zs.info
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
            delta = counter_delta(
                last.value, reading.value, info.max_joules, dt, self.max_zone_watts, wrap_watts=wrap_watts
            )
        if delta.joules is None:
            kind = delta.anomaly or "implausible"
            garbage = kind == "garbage"  # an impossible reading: keep the last good one, lose nothing
            self._anomaly(
                info,
                kind,
                f"{last.value:g} → {reading.value:g} over {dt:.3f} s",
                0.0 if garbage else dt,
            )
            if garbage:
                return
        else:
            zs.total_nj += to_nanojoules(delta.joules)
            if info.kind != "power" and dt >= MIN_PEAK_SECONDS:
                zs.peak_watts = max(zs.peak_watts, delta.joules / dt)
        zs.last = reading

    def all_up(self) -> bool:
        with self.lock:
            return all(st.up for st in self._sources)

    def source_snapshots(self) -> tuple[SourceSnapshot, ...]:
        with self.lock:
            out = []
            for st in self._sources:
                cumulative, running = [], 0
                for count in st.buckets:
                    running += count
                    cumulative.append(running)
                out.append(
                    SourceSnapshot(
                        st.source.name, st.up, st.error, tuple(cumulative), st.read_sum, st.read_count, st.errors_total
                    )
                )
            return tuple(out)


__all__ = ["EnergyMeter", "MeterRead"]
