"""Open windows survive an agent restart through server.state_dir, or say what they lost."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from joulesched.measurement.config import AgentConfig, ServerConfig, SourcesConfig
from joulesched.measurement.errors import UnknownWindow
from joulesched.measurement.sampler import Sampler, Window
from joulesched.measurement.sources.base import Roots, Source
from joulesched.measurement.sources.registry import open_sources
from joulesched.measurement.windowstore import FILE, WindowStore
from tests.measurement.agent_server_support import Running
from tests.measurement.fakes import FakeClock, gpus, ipmi
from tests.measurement.replica import PowercapTree

ENTRY = "intel-rapl:0"


def agent(roots: Roots, clock: FakeClock, state: Path, *extra: Source) -> Sampler:
    """A fresh sampler, as a restarted agent builds it (new sources, totals from 0)."""
    order = ("rapl_sysfs", "ipmi_dcmi")
    config = AgentConfig(roots=roots, sources=SourcesConfig(order=order), server=ServerConfig(state_dir=str(state)))
    sources: list[Source] = [*open_sources(("rapl_sysfs",), {}, roots, clock).sources, *extra]
    return Sampler(config, sources, node="n1", clock=clock)


def run(s: Sampler, powercap: PowercapTree, clock: FakeClock, seconds: int, watts: float = 100.0) -> float:
    for _ in range(seconds):
        clock.tick()
        powercap.advance(ENTRY, watts)
        s.sample()
    return watts * seconds


def test_a_window_is_carried_exactly_over_a_restart(
    tmp_path: Path, roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    powercap.add(ENTRY, "package-0", energy_uj=5_000_000_000)
    first = agent(roots, clock, tmp_path / "state")
    first.sample()
    window = first.open_window("run-42")
    truth = run(first, powercap, clock, 5)
    assert not (tmp_path / "state" / (FILE + ".tmp")).exists()
    # the agent is down for 3 s; the counter keeps counting
    for _ in range(3):
        clock.tick()
        powercap.advance(ENTRY, 100.0)
        truth += 100.0
    second = agent(roots, clock, tmp_path / "state")
    second.sample()
    truth += run(second, powercap, clock, 4)
    result = second.close_window(window.id)
    assert result["label"] == "run-42" and result["start"] == window.start.time
    assert result["zones"]["rapl_sysfs/package-0"] == pytest.approx(truth, abs=1e-6)
    assert result["restarted"]["zones_lost"] == [] and result["restarted"]["seconds_lost"] == 0.0
    with pytest.raises(UnknownWindow):
        agent(roots, clock, tmp_path / "state").close_window(window.id)  # closed: gone from the file too


def test_a_counter_reset_and_a_power_zone_are_named_as_lost(
    tmp_path: Path, roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    powercap.add(ENTRY, "package-0", energy_uj=5_000_000_000)
    first = agent(roots, clock, tmp_path / "state", ipmi(clock, 250.0))
    first.sample()
    window = first.open_window()
    run(first, powercap, clock, 5)
    clock.tick(10)
    powercap.set(ENTRY, 0)  # the driver reloaded meanwhile: the counter restarted from 0
    second = agent(roots, clock, tmp_path / "state", ipmi(clock, 250.0))
    second.sample()
    after = run(second, powercap, clock, 4)
    result = second.close_window(window.id)
    lost = result["restarted"]["zones_lost"]
    assert lost == ["ipmi_dcmi/chassis", "rapl_sysfs/package-0"]
    assert result["restarted"]["seconds_lost"] == pytest.approx(10.0)  # last save to the first read after
    # their energy up to the last save and from the restart on: only the 10 s between are missing
    assert result["zones"]["rapl_sysfs/package-0"] == pytest.approx(500.0 + after, abs=1e-6)
    assert result["zones"]["ipmi_dcmi/chassis"] == pytest.approx(250.0 * (5 + 4))


def test_the_file_is_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = WindowStore(str(tmp_path))
    store.save([{"id": "a"}], {}, 1.0)
    before = (tmp_path / FILE).read_bytes()

    def crash(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    store.save([{"id": "b"}], {}, 2.0)  # logged; the old file stays whole
    assert (tmp_path / FILE).read_bytes() == before
    assert json.loads(before)["windows"] == [{"id": "a"}]


def test_an_unreadable_file_is_reported_and_set_aside(
    tmp_path: Path, roots: Roots, powercap: PowercapTree, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    powercap.add(ENTRY, "package-0")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / FILE).write_text('{"version": 1, "windows": [tru')
    s = agent(roots, clock, tmp_path / "state")
    assert "open windows of the last run are lost" in caplog.text
    assert (tmp_path / "state" / (FILE + ".unreadable")).exists()
    s.sample()
    assert s._windows == {}


def test_without_a_state_dir_an_unknown_window_says_why(running: Running) -> None:
    running.agent.step()
    status, doc, _ = running.request("DELETE", "/v1/windows/0123456789abcdef")
    assert status == 404
    assert "lost without server.state_dir" in doc["error"]


def test_the_config_field_is_documented(tmp_path: Path) -> None:
    config = replace(AgentConfig(), server=ServerConfig(state_dir=str(tmp_path)))
    assert config.validate() == []
    assert "server.state_dir" in (Path(__file__).parents[2] / "docs" / "agent.md").read_text()


def test_a_second_restart_keeps_what_the_first_one_lost(tmp_path: Path, roots: Roots, powercap: PowercapTree, clock: FakeClock) -> None:
    powercap.add(ENTRY, "package-0", energy_uj=5_000_000_000)
    first = agent(roots, clock, tmp_path / "state")
    first.sample()
    window = first.open_window("run-42")
    run(first, powercap, clock, 5)
    clock.tick(10)
    powercap.set(ENTRY, 0)  # restart 1: the counter was reset meanwhile, 10 s lost
    second = agent(roots, clock, tmp_path / "state")
    second.sample()
    run(second, powercap, clock, 5)
    third = agent(roots, clock, tmp_path / "state")  # restart 2: clean
    third.sample()
    run(third, powercap, clock, 5)
    restarted = third.close_window(window.id)["restarted"]
    assert restarted["zones_lost"] == ["rapl_sysfs/package-0"] and restarted["seconds_lost"] == pytest.approx(10.0)
    assert restarted["restarts"] == 2


def test_a_nextflow_runs_window_is_not_kept_over_a_restart(tmp_path: Path, roots: Roots, powercap: PowercapTree, clock: FakeClock) -> None:
    """docs/agent.md: a run is not kept across a restart; its window was, and nothing closed it."""
    from joulesched.measurement.weblog import WeblogRuns
    from tests.measurement.test_weblog import EVENTS

    powercap.add(ENTRY, "package-0", energy_uj=5_000_000_000)
    first = agent(roots, clock, tmp_path / "state")
    first.sample()
    assert WeblogRuns(first, clock, 1.0).handle(EVENTS[0], True)[0] == 201
    run(first, powercap, clock, 3)
    second = agent(roots, clock, tmp_path / "state")
    second.sample()
    runs = WeblogRuns(second, clock, 1.0)
    for e in EVENTS[1:-1]:
        runs.handle(e, True)
        run(second, powercap, clock, 1)
    assert runs.handle(EVENTS[-1], True)[0] == 200
    assert second._windows == {}, "the run's window of the last run is not carried over to leak"


def restarted_with_a_damaged_record(
    roots: Roots, powercap: PowercapTree, clock: FakeClock, state: Path, damage: Callable[[dict[str, Any]], None]
) -> tuple[Sampler, Window, Window, float]:
    """Windows "bad" and "good" saved, "bad"'s record damaged, the agent restarted and sampled
    twice (its first sample carries the windows, raising nothing): (agent, bad, good, joules)."""
    powercap.add(ENTRY, "package-0", energy_uj=5_000_000_000)
    first = agent(roots, clock, state)
    first.sample()
    bad, good = first.open_window("bad"), first.open_window("good")
    truth = run(first, powercap, clock, 3)
    doc = json.loads((state / FILE).read_text())
    for record in doc["windows"]:
        if record["label"] == "bad":
            damage(record)
    (state / FILE).write_text(json.dumps(doc))
    second = agent(roots, clock, state)
    truth += run(second, powercap, clock, 2)
    return second, bad, good, truth


def test_a_damaged_window_record_loses_that_window_only_and_keeps_the_file(
    tmp_path: Path, roots: Roots, powercap: PowercapTree, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    second, bad, good, truth = restarted_with_a_damaged_record(
        roots, powercap, clock, state, lambda record: record["totals"].update({"rapl_sysfs/package-0": "12.5e9"})
    )  # a number written as text
    assert second.close_window(good.id)["zones"]["rapl_sysfs/package-0"] == pytest.approx(truth, abs=1e-6)
    with pytest.raises(UnknownWindow):
        second.close_window(bad.id)
    aside = json.loads((state / (FILE + ".unreadable")).read_text())  # the file as read, damage and all
    assert [r["totals"]["rapl_sysfs/package-0"] for r in aside["windows"] if r["label"] == "bad"] == ["12.5e9"]
    said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(said) == 1 and f"window {bad.id} of the last run is lost: {state / FILE}: windows[0]: totals." in said[0]


def test_a_window_opened_while_the_last_runs_wait_to_be_carried_does_not_drop_them(
    tmp_path: Path, roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    """The last run's windows wait (up to 30 s) for a counter that answers late after a restart
    (a GPU's); a window opened meanwhile must not save the file without them (a second restart
    in that time lost them)."""
    powercap.add(ENTRY, "package-0", energy_uj=5_000_000_000)
    state = tmp_path / "state"

    def restarted(gpu_answers: bool) -> Sampler:
        config = AgentConfig(
            roots=roots, sources=SourcesConfig(order=("rapl_sysfs", "nvml")), server=ServerConfig(state_dir=str(state))
        )
        card = gpus(clock, 1)
        if not gpu_answers:
            card.zone_list[0].fail = "NVML not ready"
        return Sampler(config, [*open_sources(("rapl_sysfs",), {}, roots, clock).sources, card], node="n1", clock=clock)

    first = restarted(gpu_answers=True)
    first.sample()
    window = first.open_window("long-job")
    run(first, powercap, clock, 3)
    second = restarted(gpu_answers=False)
    run(second, powercap, clock, 2)  # the window waits for the GPU's counter
    second.open_window("another")
    third = restarted(gpu_answers=True)  # restarted again before the carry
    run(third, powercap, clock, 1)
    result = third.close_window(window.id)
    assert result["label"] == "long-job" and result["restarted"]["restarts"] == 1


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ({"totals": None}, None),  # no totals: a window with no zone of the last run, carried as such
        ({"restarted": {"restarts": "two"}}, "restarted.restarts: not a whole number"),
        ({"restarted": {"seconds_lost": [1]}}, "restarted.seconds_lost: not a number"),
        ({"restarted": {"zones_lost": 5}}, "restarted.zones_lost: not a list of zone names"),
    ],
    ids=["null-totals", "restarts-text", "seconds-lost-list", "zones-lost-number"],
)
def test_a_window_record_damaged_inside_loses_at_most_that_window(
    tmp_path: Path, roots: Roots, powercap: PowercapTree, clock: FakeClock, caplog: pytest.LogCaptureFixture,
    damage: dict[str, object], said: str | None,
) -> None:
    second, bad, good, truth = restarted_with_a_damaged_record(
        roots, powercap, clock, tmp_path / "state", lambda record: record.update(damage)
    )
    assert second.close_window(good.id)["zones"]["rapl_sysfs/package-0"] == pytest.approx(truth, abs=1e-6)
    if said is None:
        second.close_window(bad.id)
    else:
        with pytest.raises(UnknownWindow):
            second.close_window(bad.id)
        assert said in caplog.text
