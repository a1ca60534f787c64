from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from joulesched.sim.bound import bound_for_runs, estimate, share_of_saving, timeline
from joulesched.sim.cluster import load_cluster
from joulesched.sim.demo import EXAMPLE_CLUSTER, shipped_workflows
from joulesched.sim.model import Workload
from joulesched.sim.runner import POLICIES, VARIANTS, RunOptions, run_policies
from tests.sim.support import cluster, node_type, pod, workload

LINEAR_20 = [100.0 + 20.0 * i for i in range(11)]


def two_nodes() -> object:
    # "cheap": 10 W per busy core; "dear": 20 W per busy core; both 100 W idle, 10 cores, always on
    return cluster(node_type("cheap"), node_type("dear", curve=LINEAR_20))


def test_hand_computed_two_node_bound() -> None:
    cl = two_nodes()
    wl = workload(*(pod(f"p{i}", 100.0, cpu=5.0) for i in range(3)))  # 15 busy cores for 100 s
    runs = run_policies(cl, wl, RunOptions(policies=("default",), record_timeseries=False))
    b = estimate(cl, timeline(wl, runs["default"].result))
    assert b.window_seconds == pytest.approx(100.0)
    assert b.idle_joules == pytest.approx(200.0 * 100.0)
    # the cheap node full (10 cores × 10 W), the dear one 5 cores × 20 W, for 100 s
    assert b.fluid_joules == pytest.approx(20_000.0 + (100.0 + 100.0) * 100.0)
    assert b.request_aware_joules == pytest.approx(b.fluid_joules)  # usage = request: no cap
    assert b.work_core_seconds == pytest.approx(1500.0)
    # any real placement of three 5-core pods puts 10 on one node and 5 on the other: at best this
    assert runs["default"].metrics["energy_joules"] >= b.fluid_joules - 1e-6


def test_request_cap_costs_more_than_fluid() -> None:
    cl = two_nodes()
    wl = workload(*(pod(f"p{i}", 100.0, cpu=5.0, usage=2.5) for i in range(3)))  # 7.5 busy of 15 requested
    runs = run_policies(cl, wl, RunOptions(policies=("default",), record_timeseries=False))
    b = estimate(cl, timeline(wl, runs["default"].result))
    # fluid: 7.5 cores on the cheap node; request-aware: 5 there (half its cores), 2.5 on the dear one
    assert b.fluid_joules - b.idle_joules == pytest.approx(75.0 * 100.0)
    assert b.request_aware_joules - b.idle_joules == pytest.approx((50.0 + 50.0) * 100.0)


def test_speed_counts_work_in_reference_units() -> None:
    # a speed-2 node halves the runtime: same work, the same bound whatever node the pod ran on
    cl = cluster(node_type("fast", speed=2.0))
    wl = workload(pod("p", 100.0, cpu=4.0))
    runs = run_policies(cl, wl, RunOptions(policies=("default",), record_timeseries=False))
    b = estimate(cl, timeline(wl, runs["default"].result))
    assert b.work_core_seconds == pytest.approx(400.0)
    assert b.window_seconds == pytest.approx(50.0)
    # 4 busy cores for 50 s at 10 W each: 2,000 J (a reference core costs 5 W on this node)
    assert b.fluid_joules - b.idle_joules == pytest.approx(2000.0)
    assert runs["default"].metrics["energy_joules"] == pytest.approx(b.fluid_joules)


def test_share_of_saving() -> None:
    assert share_of_saving(100.0, 90.0, 80.0) == pytest.approx(0.5)
    assert share_of_saving(100.0, 80.0, 80.0) == pytest.approx(1.0)
    assert share_of_saving(100.0, 100.0, 100.0) is None


def test_autoscaler_on_is_not_applicable() -> None:
    cl = cluster(node_type("a"), autoscaler={"enabled": True})
    wl = workload(pod("p", 10.0))
    runs = run_policies(cl, wl, RunOptions(policies=("default",), record_timeseries=False))
    assert bound_for_runs(cl, wl, runs)["applicable"] is False


def test_every_policy_uses_at_least_the_fluid_bound_on_a_real_run() -> None:
    """Real nf-core executions on the always-on example cluster: no policy beats the bound."""
    example = load_cluster(EXAMPLE_CLUSTER)
    cl = replace(example, autoscaler=replace(example.autoscaler, enabled=False))
    traces = {t.name: t for t in shipped_workflows()}
    wl = Workload.of([traces["bacass-dirt02-001"], traces["fetchngs-dirt02-001"].shifted(5.0, "#2")])
    runs = run_policies(cl, wl, RunOptions(policies=POLICIES + VARIANTS, record_timeseries=False))
    report = bound_for_runs(cl, wl, runs)
    assert report["applicable"] is True
    assert report["fluid_energy_joules"] <= report["request_aware_energy_joules"]
    assert report["fluid_energy_joules"] > report["idle_energy_joules"]
    for name, run in runs.items():
        energy = run.metrics["energy_joules"]
        own = report["policies"][name]["own_timeline"]["fluid_energy_joules"]
        assert energy >= own - 1e-6, name
        assert energy >= report["fluid_energy_joules"] - 1e-6, name
        share = report["policies"][name]["share_of_bound_saving"]["fluid"]
        assert share is None or share <= 1.0 + 1e-9, name


def test_results_and_report_carry_the_bound(tmp_path: Path) -> None:
    from joulesched.sim.execute import execute

    cl = cluster(node_type("cheap"), node_type("dear", curve=LINEAR_20), autoscaler={"enabled": True})
    wl = workload(*(pod(f"p{i}", 100.0, cpu=5.0) for i in range(3)))
    results = execute(cl, wl, RunOptions(policies=("default", "most-allocated")), tmp_path, sensitivity=True, plots=False)
    assert results["bound"]["applicable"] is False
    fixed = results["sensitivity"]["no_autoscaler"]["bound"]
    assert fixed["applicable"] is True
    assert set(fixed["policies"]) == {"default", "most-allocated"}
    assert fixed["policies"]["default"]["share_of_bound_saving"]["fluid"] == pytest.approx(0.0)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Bound (every node powered all the time (autoscaler off))" in text
    assert "share of request-aware saving %" in text
