"""Attribution methods against the model's truth, on cases worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from joulesched.policy import attribution as policy_attribution
from joulesched.sim import attribution as sim_attribution
from joulesched.sim.attribution import Attribution, NodeTrack, phases_for, prometheus_increase
from joulesched.sim.engine import Engine, EngineOptions, Profile
from joulesched.sim.runner import attribution_runs
from tests.sim.support import cluster, node_type, pod, workload

# One node, 100 W idle + 10 W per busy core. A keeps 2 cores busy from 0 to 100 s, B 3 cores
# from 50 to 150 s: 120 W, then 150 W, then 130 W, 50 s each.
TWO_PODS = workload(pod("a", 100.0, cpu=2), pod("b", 100.0, cpu=3, arrival=50.0))


def attribution(wl=TWO_PODS) -> Attribution:  # type: ignore[no-untyped-def]
    engine = Engine(cluster(node_type("lin")), wl, Profile("default"), EngineOptions(record_segments=True))
    result = engine.run()
    return Attribution(result, [p.cpu_usage for p in wl.pods])


def test_truth_splits_power_by_busy_cores_at_every_instant() -> None:
    att = attribution()
    # a: 120 W × 50 s + 150 W × 50 s × 2/5 = 9,000 J; b: 150 × 50 × 3/5 + 130 × 50 = 11,000 J
    assert att.truth == pytest.approx([9000.0, 11000.0])


def test_attributed_energy_sums_to_the_node_energy_while_pods_run() -> None:
    att = attribution()
    assert att.truth.sum() == pytest.approx(att.result.energy_joules.sum())  # no idle time here


def test_counter_differences_at_task_edges_equal_the_truth() -> None:
    att = attribution()
    assert att.counter_edges == pytest.approx(att.truth)


def test_counter_edges_is_the_agents_attribution_at_every_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read interval goes through policy.attribution.attribute: 3 intervals for TWO_PODS."""
    calls: list[tuple[float, dict[str, float]]] = []

    def recording(split, dt, busy, pods, **kw):  # type: ignore[no-untyped-def]
        calls.append((split.node_joules, {uid: u.cpu_seconds for uid, u in pods.items()}))
        return policy_attribution.attribute(split, dt, busy, pods, **kw)

    monkeypatch.setattr(sim_attribution, "attribute", recording)
    att = attribution()
    assert calls == [(120.0 * 50, {"0": 100.0}), (150.0 * 50, {"0": 100.0, "1": 150.0}), (130.0 * 50, {"1": 150.0})]
    assert att.counter_edges == pytest.approx([9000.0, 11000.0])


def test_counter_edges_shares_an_idle_interval_equally_among_the_pods_present() -> None:
    # two pods that keep no core busy: the node draws its idle 100 W, half to each
    att = attribution(workload(pod("a", 100.0, cpu=2, usage=0.0), pod("b", 100.0, cpu=1, usage=0.0, arrival=50.0)))
    assert att.counter_edges == pytest.approx(att.truth)
    assert att.counter_edges == pytest.approx([100.0 * 50 + 100.0 * 50 / 2, 100.0 * 50 / 2 + 100.0 * 50])


def test_cpu_time_share_over_a_tasks_life() -> None:
    att = attribution()
    # a: node energy over [0, 100] = 13,500 J × a's 200 CPU-s / 350 CPU-s on the node
    # b: node energy over [50, 150] = 14,000 J × 300 / 400
    assert att.cpu_share == pytest.approx([13500 * 200 / 350, 14000 * 300 / 400])


@pytest.mark.parametrize(
    ("times", "values", "start", "end", "expected"),
    [
        ([10, 20, 30], [10, 20, 30], 0, 30, 30.0),
        ([50, 60], [5, 15], 0, 60, 15.0),
        ([10, 20, 30], [10, 20, 5], 0, 30, (5 - 10 + 20) * 30 / 20),
        ([30], [3], 0, 30, None),
    ],
    ids=[
        "a counter from zero, extrapolated to the zero point",
        "a series starting mid-range: half an interval before its first sample",
        "a counter reset is added back",
        "one sample gives nothing",
    ],
)
def test_prometheus_increase_extrapolation(times: list[float], values: list[float], start: float, end: float, expected: float | None) -> None:
    result = prometheus_increase(np.array(times, float), np.array(values, float), start, end)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


def test_pod_increase_worked_example() -> None:
    att = attribution()
    # scrapes every 30 s from 0: pod a is seen at 30, 60, 90 with 3,600, 6,600 and 8,400 J.
    # increase over (0, 150]: 4,800 J over 60 s, extrapolated 30 s to the start (the zero point
    # is 45 s away) and half an interval (15 s) to the end: 4,800 × 105/60 = 8,400 J.
    times = np.array([30.0, 60.0, 90.0])
    assert att._pod_counter(0, times) == pytest.approx([3600.0, 6600.0, 8400.0])
    assert prometheus_increase(times, att._pod_counter(0, times), 0.0, 150.0) == pytest.approx(8400.0)


def test_tasks_shorter_than_the_scrape_interval_vanish_from_pod_queries() -> None:
    short = workload(*[pod(f"s{i}", 5.0, cpu=1, arrival=7.0 * i, workflow="w") for i in range(12)])
    att = attribution(short)
    result = att.workflow(np.arange(12), [0.5])
    pod_increase = result["methods"]["pod_increase_30s"]  # type: ignore[index]
    assert pod_increase["joules"] == 0.0 and pod_increase["error_percent"] == -100.0
    assert result["methods"]["counter_edges"]["error_percent"] == pytest.approx(0.0, abs=1e-9)  # type: ignore[index]


def test_node_methods_are_exact_for_constant_power() -> None:
    track = NodeTrack.of([(0.0, 200.0, 1.0, 1), (300.0, 200.0, 1.0, 1)])
    energy = track.energy_fn()
    scrapes = np.arange(15.0, 301.0, 30.0)
    assert prometheus_increase(scrapes, track.at(energy, scrapes), 0.0, 300.0) == pytest.approx(60000.0)
    assert track.step_at(track.p, scrapes).sum() * 30.0 == pytest.approx(60000.0)


def test_attribution_runs_each_workflow_alone_and_reports_every_method() -> None:
    wl = workload(*[pod(f"s{i}", 40.0, cpu=1, arrival=10.0 * i, workflow="w") for i in range(6)])
    results, examples = attribution_runs(cluster(node_type("lin", count=2)), [wl], seed=1)
    w = results["w"]
    assert w["tasks"] == 6 and set(w["methods"]) >= {"counter_edges", "cpu_share", "pod_increase_30s", "node_sum_over_time_15s"}
    assert w["methods"]["counter_edges"]["error_percent"] == pytest.approx(0.0, abs=1e-9)
    assert examples["w"]["scrape_t"]


def test_the_seed_phase_comes_first_and_phases_spread() -> None:
    phases = phases_for(3, 4)
    assert phases == phases_for(3, 4) and len(set(phases)) == 4 and all(0 <= p < 1 for p in phases)


# --- the published comparison (Thamm & Leser) by the window each approach sees ------------------------


def study_case(duration: float = 120.0, cores: float = 0.0):  # type: ignore[no-untyped-def]
    """One 100 W-idle node; one task from 60 s for ``duration`` s keeping ``cores`` busy."""
    wl = workload(pod("t", duration, cpu=max(cores, 1.0), usage=cores, arrival=60.0, workflow="quantms-shape"))
    return attribution(wl), np.arange(1)


def test_the_counter_approaches_see_the_windows_of_the_study() -> None:
    att, pods = study_case(cores=0.0)  # an idle task: the node draws 100 W throughout
    setup = sim_attribution.StudySetup()
    out = sim_attribution.study_comparison(att, pods, "quantms-shape", setup, [0.0])
    rapl = 100.0 * (1 - setup.uncovered_idle_fraction)  # 100 W at the wall, 73.3 W seen by RAPL
    wrapper = rapl * (setup.head_startup_s + 120.0 + setup.teardown_s)
    assert out["joules"]["wrapper"] == pytest.approx(wrapper)
    assert out["joules"]["plugin"] == pytest.approx(rapl * (setup.head_startup_s - 9.8 + 120.0))
    assert out["joules"]["task"] == pytest.approx(rapl * (setup.head_startup_s - 10.8 + 120.0))
    assert out["sensor_over_rapl"] == pytest.approx(1.365)


@pytest.mark.parametrize(
    ("phase", "samples"),
    [(0.0, 4), (0.6, 5)],
    ids=["scrapes that fit four times in the window", "a phase that puts a fifth scrape in it"],
)
def test_prometheus_is_the_studys_query_on_a_whole_server_sensor(phase: float, samples: int) -> None:
    """sum_over_time(power[D] @ end) × 30 s: the number of scrapes in (end − D, end] × 30 s × the wall power."""
    att, pods = study_case(duration=113.0)  # D = 15 + 113 + 2 = 130 s: (45, 175]
    out = sim_attribution.study_comparison(att, pods, "quantms-shape", sim_attribution.StudySetup(), [phase])
    assert out["duration_seconds"] == pytest.approx(130.0)
    assert out["joules"]["prometheus"] == pytest.approx(samples * 30.0 * 100.0)


def test_the_three_counter_approaches_are_ordered_as_in_the_study_on_the_published_shapes() -> None:
    from joulesched.sim.cluster import load_cluster
    from joulesched.sim.demo import ATTRIBUTION_CLUSTER, attribution_workloads

    results = sim_attribution.study_runs(load_cluster(ATTRIBUTION_CLUSTER), attribution_workloads(0)[:3], seed=0)
    assert set(results) == {"rnaseq-shape", "quantms-shape", "rangeland-shape"}
    for name, res in results.items():
        j = res["joules"]
        assert j["wrapper"] > j["plugin"] > j["task"], name  # shell script ⊃ plug-in ⊃ start/stop tasks
        assert res["prometheus_difference_percent"]["mean"] > 0, name  # the whole-server sensor over-reports
