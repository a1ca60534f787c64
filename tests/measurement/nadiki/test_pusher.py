"""Windows of energy from counters, and the push to an InfluxDB v2 endpoint played on loopback."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joulesched.measurement.nadiki.model import DataPoint, TimeSeriesConfig
from joulesched.measurement.nadiki.pusher import CounterSample, Pusher, WindowAccumulator
from tests.measurement.nadiki.nadiki_support import RegistrarServer
from tests.support import Clock

T0 = 1_767_268_805.0  # 2026-01-01 12:00:05 UTC: 5 s into a 30 s window
TAGS = {"facility_id": "FACILITY-NLD-001", "rack_id": "RACK-001", "server_id": "SERVER-1", "country_code": "NLD"}
SERVER = "server_energy_consumption_joules"
CPU = "cpu_energy_consumption_joules"
FIELDS = {SERVER: ("ipmi_dcmi", "redfish"), CPU: ("rapl_sysfs",)}


def counter(watts: float, start: float = T0, joules0: float = 0.0):  # type: ignore[no-untyped-def]
    return lambda t: joules0 + watts * (t - start)


# --- windows ---------------------------------------------------------------------------------------


def test_the_first_window_seen_from_its_middle_is_not_pushed() -> None:
    acc = WindowAccumulator(30, 300)
    energy = counter(250)
    out = []
    for i in range(0, 61):
        windows, _ = acc.add(T0 + i, energy(T0 + i))
        out += windows
    # samples 12:00:05 .. 12:01:05: [12:00:00, 12:00:30) is partial, [12:00:30, 12:01:00) complete
    assert out == [(1_767_268_830, pytest.approx(7500.0))]


@pytest.mark.parametrize(
    ("samples", "expected", "note"),
    [
        (
            [(T0, 0.0), (T0 + 40, 10_000.0), (T0 + 41, 5.0), (T0 + 100, 15_000.0)],
            [(1_767_268_860, 14_995 * 30 / 59)],
            "reset",
        ),
        (
            [(T0, 0.0), (T0 + 40, 10_000.0), (T0 + 400, 100_000.0), (T0 + 460, 115_000.0)],
            [(1_767_269_220, 7500.0)],
            "no sample for 360 s",
        ),
        (
            [(T0, 0.0), (T0 + 25, 6250.0), (T0 + 25, 6250.0), (T0 + 20, 1.0), (T0 + 55, 13_750.0)],
            [(1_767_268_830, 7500.0)],
            None,
        ),
    ],
    ids=[
        "a counter reset restarts the windows: no negative window",
        "a gap longer than max_gap_s restarts them: no window guessed across it",
        "duplicate and out-of-order samples are ignored",
    ],
)
def test_restarts(samples: list[tuple[float, float]], expected: list[tuple[int, float]], note: str | None) -> None:
    acc = WindowAccumulator(30, 300)
    out, notes = [], []
    for t, e in samples:
        windows, n = acc.add(t, e)
        out += windows
        notes += [n] if n else []
    assert out == [(s, pytest.approx(j)) for s, j in expected]
    assert (note is None and not notes) or (note is not None and note in notes[0])


def test_a_system_clock_set_back_writes_no_window_twice_and_loses_no_joule() -> None:
    """Samples stamped with the time of day, the clock set back 40 s at T0 + 55 (docs/provider.md)."""
    acc = WindowAccumulator(30, 300)
    out: list[tuple[int, float]] = []
    joules = 0.0
    stamps = [T0 + i for i in range(0, 56)] + [T0 + 15 + i for i in range(1, 101)]  # 100 s more, from T0 + 16
    for t in stamps:
        out += acc.add(t, joules)[0]
        joules += 250.0  # 250 W, one sample a second, whatever the clock says
    starts = [s for s, _ in out]
    assert starts == sorted(set(starts)), "each window once"
    assert starts[0] == T0 + 25, "the first window, seen from its middle, is not pushed"
    first_part = 250.0 * 25  # T0 .. T0 + 25, in that window
    open_part = sum(acc.partial.values())  # the window the last sample is in
    assert sum(j for _, j in out) + first_part + open_part == pytest.approx(250.0 * (len(stamps) - 1), abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.floats(min_value=0.05, max_value=45.0), min_size=2, max_size=80),
    powers=st.lists(st.floats(min_value=0.0, max_value=2000.0), min_size=1, max_size=80),
    granularity=st.sampled_from([1, 10, 30, 60]),
)
def test_complete_windows_add_up_to_the_counter_between_their_edges(
    steps: list[float], powers: list[float], granularity: int
) -> None:
    """Conservation: whatever the sampling, the pushed windows sum to the counter's growth over them."""
    acc = WindowAccumulator(granularity, 1e9)
    t, e = T0, 1e6
    samples = [(t, e)]
    for i, dt in enumerate(steps):
        t, e = t + dt, e + powers[i % len(powers)] * dt
        samples.append((t, e))
    out = []
    for ts, es in samples:
        out += acc.add(ts, es)[0]
    if not out:
        return

    def at(x: float) -> float:  # the counter, linearly interpolated between samples
        for (t1, e1), (t2, e2) in itertools.pairwise(samples):
            if t1 <= x <= t2:
                return e1 + (e2 - e1) * (x - t1) / (t2 - t1)
        raise AssertionError(x)

    starts = [s for s, _ in out]
    assert starts == list(range(starts[0], starts[-1] + granularity, granularity)), "consecutive, aligned windows"
    assert starts[0] >= samples[0][0]
    assert sum(j for _, j in out) == pytest.approx(at(starts[-1] + granularity) - at(starts[0]), rel=1e-9, abs=1e-6)
    assert all(j >= 0 for _, j in out)


# --- pushing ---------------------------------------------------------------------------------------


def time_series(
    server: RegistrarServer, fields: tuple[str, ...] = (SERVER, CPU), granularity: int = 30, token: str = "token-1"
) -> TimeSeriesConfig:
    return TimeSeriesConfig(
        server.base,
        "leitmotiv",
        "nadiki servers",
        token,
        tuple(DataPoint("server", f, granularity, TAGS) for f in fields),
    )


def feed(pusher: Pusher, clock: Clock, seconds: range | int, sources: dict[str, float]) -> None:
    """One sample per second per source at constant watts (counter = watts × i at T0 + i), flushing as
    the agent's loop would."""
    for i in range(seconds + 1) if isinstance(seconds, int) else seconds:
        clock.now = T0 + i
        for source, watts in sources.items():
            pusher.add(CounterSample(clock.now, source, watts * i))
        if pusher.due():
            pusher.flush()


def test_windows_reach_the_endpoint_as_line_protocol_with_the_registrars_tags() -> None:
    with RegistrarServer() as server:
        clock = Clock(T0)
        pusher = Pusher(time_series(server), FIELDS, clock=clock)
        feed(pusher, clock, 100, {"ipmi_dcmi": 250.0, "rapl_sysfs": 120.0})
        state = server.state
        assert state.line_errors == []
        assert state.writes and all(w["precision"] == "s" for w in state.writes)
        got = sorted((p.timestamp, next(iter(p.fields)), p.fields[next(iter(p.fields))]) for p in state.lines)
        starts = [1_767_268_830, 1_767_268_860]  # samples end at 12:01:45: [12:01:30, 12:02:00) is open
        assert got == sorted(
            [(s, SERVER, pytest.approx(7500.0)) for s in starts] + [(s, CPU, pytest.approx(3600.0)) for s in starts]
        )
        assert all(p.measurement == "server" and p.tags == TAGS for p in state.lines)
        assert all(p.timestamp % 30 == 0 for p in state.lines), "stamped at the window's start"
        assert pusher.stats.lines_written == 4 and pusher.pending() == 0


@pytest.mark.parametrize("precision", ["ms", "ns"])
def test_other_precisions_scale_the_timestamps(precision: str) -> None:
    with RegistrarServer() as server:
        clock = Clock(T0)
        pusher = Pusher(time_series(server, (SERVER,)), FIELDS, precision=precision, clock=clock)
        feed(pusher, clock, 60, {"ipmi_dcmi": 100.0})
        assert server.state.line_errors == []
        assert server.state.writes[0]["precision"] == precision
        assert server.state.lines[0].timestamp == 1_767_268_830 * {"ms": 10**3, "ns": 10**9}[precision]


def test_a_window_the_preferred_source_missed_comes_from_the_next_one() -> None:
    with RegistrarServer() as server:
        clock = Clock(T0)
        pusher = Pusher(time_series(server, (SERVER,)), FIELDS, clock=clock)
        for i in range(131):
            clock.now = T0 + i
            if i <= 60:  # IPMI stops answering at 12:01:05
                pusher.add(CounterSample(clock.now, "ipmi_dcmi", 250.0 * i))
            pusher.add(CounterSample(clock.now, "redfish", 260.0 * i))
            if pusher.due():
                pusher.flush()
        by_start = {p.timestamp: p.fields[SERVER] for p in server.state.lines}
        assert by_start[1_767_268_830] == pytest.approx(7500.0), "IPMI while it answered"
        assert by_start[1_767_268_860] == pytest.approx(7800.0), "Redfish once it did not"
        assert by_start[1_767_268_890] == pytest.approx(7800.0)
        assert len(by_start) == len(server.state.lines), "one value per window, never both"


def test_an_unreachable_endpoint_keeps_the_lines_and_retries_in_order() -> None:
    with RegistrarServer() as server:
        server.state.write_failures = [(503, {"Retry-After": "10"})]
        clock = Clock(T0)
        pusher = Pusher(time_series(server, (SERVER,)), FIELDS, clock=clock)
        feed(pusher, clock, range(0, 63), {"ipmi_dcmi": 250.0})
        assert pusher.stats.writes_failed == 1
        assert server.state.lines == [] and pusher.pending() == 1, "kept for the retry 10 s later (Retry-After)"
        feed(pusher, clock, range(63, 101), {"ipmi_dcmi": 250.0})
        assert [p.timestamp for p in server.state.lines] == [1_767_268_830, 1_767_268_860]
        assert [p.fields[SERVER] for p in server.state.lines] == [pytest.approx(7500.0)] * 2


@pytest.mark.parametrize("status", [400, 422], ids=["malformed", "refused (InfluxDB: past the retention)"])
def test_lines_the_endpoint_rejects_are_dropped_and_counted_not_retried_for_ever(status: int) -> None:
    with RegistrarServer() as server:
        server.state.write_failures = [(status, {})]
        clock = Clock(T0)
        pusher = Pusher(time_series(server, (SERVER,)), FIELDS, clock=clock)
        feed(pusher, clock, 100, {"ipmi_dcmi": 250.0})
        assert pusher.stats.lines_dropped_rejected == 1
        assert [p.timestamp for p in server.state.lines] == [1_767_268_860], "the next window is not held back"


def test_a_refused_token_is_refreshed_once_and_the_lines_sent_with_the_new_one() -> None:
    with RegistrarServer() as server:
        server.state.token = "token-2"  # rotated by the registrar
        clock = Clock(T0)
        refreshed = []

        def refresh() -> TimeSeriesConfig:
            refreshed.append(True)
            return time_series(server, (SERVER,), token="token-2")

        pusher = Pusher(time_series(server, (SERVER,), token="token-1"), FIELDS, clock=clock, on_unauthorized=refresh)
        feed(pusher, clock, 62, {"ipmi_dcmi": 250.0})
        assert refreshed == [True]
        assert [p.timestamp for p in server.state.lines] == [1_767_268_830]


def test_a_token_rotated_during_an_outage_is_asked_for_once_the_endpoint_answers_again() -> None:
    with RegistrarServer() as server:
        server.state.write_failures = [(503, {}), (503, {})]  # down; meanwhile the token rotates
        server.state.token = "token-2"
        clock = Clock(T0)
        refreshed = []

        def refresh() -> TimeSeriesConfig:
            refreshed.append(clock.now)
            return time_series(server, (SERVER,), token="token-2")

        pusher = Pusher(time_series(server, (SERVER,), token="token-1"), FIELDS, clock=clock, on_unauthorized=refresh)
        feed(pusher, clock, 200, {"ipmi_dcmi": 250.0})
        assert len(refreshed) == 1, "asked at the first 401, after the two 503s"
        assert [p.timestamp for p in server.state.lines] == [1_767_268_830 + 30 * k for k in range(5)], "none lost"


def test_windows_queued_while_a_write_is_in_flight_are_sent_or_kept_never_dropped_unsent() -> None:
    """The backlog overflows during a write (Pusher.add from the sampling thread): the lines it
    drops are the batch's, already being sent, and the ones queued meanwhile stay queued."""
    sent: list[str] = []

    def writer(lines: list[str]) -> None:
        sent.extend(lines)
        for i in (8, 9, 10):  # the sampling thread adds three windows meanwhile
            pusher.add(CounterSample(T0 + i, "ipmi_dcmi", 100.0 * i))

    ts = TimeSeriesConfig("http://unused", "o", "b", "t", (DataPoint("server", SERVER, 1, TAGS),))
    pusher = Pusher(ts, FIELDS, writer=writer, clock=Clock(math.inf), max_backlog_lines=5)
    for i in range(8):
        pusher.add(CounterSample(T0 + i, "ipmi_dcmi", 100.0 * i))
    pusher.flush()
    stamps = [int(line.rsplit(" ", 1)[1]) for line in sent]
    assert stamps == [int(T0) + k for k in range(2, 10)], "the first batch, then the three queued during it"
    assert pusher.pending() == 0 and pusher.stats.lines_written == 8 and pusher.stats.lines_dropped_backlog == 2


def test_the_backlog_is_bounded_and_drops_the_oldest() -> None:
    written: list[str] = []
    ts = TimeSeriesConfig("http://unused", "o", "b", "t", (DataPoint("server", SERVER, 1, TAGS),))
    pusher = Pusher(ts, FIELDS, max_backlog_lines=5, writer=written.extend, clock=Clock(math.inf))
    for i in range(12):
        pusher.add(CounterSample(T0 + 0.5 + i, "ipmi_dcmi", 100.0 * i))
    assert pusher.pending() == 5
    assert pusher.stats.lines_dropped_backlog == pusher.stats.lines_queued - 5
    pusher.flush()
    assert [line.rsplit(" ", 1)[1] for line in written] == [str(int(T0) + k) for k in range(6, 11)]


def test_fields_the_registrar_does_not_ask_for_are_not_pushed_and_noted() -> None:
    ts = TimeSeriesConfig(
        "http://unused",
        "o",
        "b",
        "t",
        (DataPoint("server", SERVER, 30, TAGS), DataPoint("server", "gpu_energy_consumption_joules", 30, TAGS)),
    )
    pusher = Pusher(ts, {SERVER: ("ipmi_dcmi",), "pdu_joules": ("pdu",)}, writer=lambda lines: None)
    assert pusher.fields_pushed == [SERVER]
    assert any("'gpu_energy_consumption_joules' but no source is mapped" in n for n in pusher.notes)
    assert any("'pdu_joules' is mapped" in n for n in pusher.notes)
