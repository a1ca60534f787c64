"""The engine: exact energy, queueing, DAGs, autoscaling, node scoring order, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from joulesched.policy.config import PolicyConfig
from joulesched.policy.units import JOULES_PER_KWH
from joulesched.sim.engine import Engine, EngineOptions, Profile
from joulesched.sim.extender import InProcessExtender
from joulesched.sim.model import PodSpec
from joulesched.sim.runner import metrics_of
from tests.sim.support import cluster, node_type, pod, workload


def run(cl, wl, profile=None, **opts):  # type: ignore[no-untyped-def]
    engine = Engine(cl, wl, profile or Profile("default"), EngineOptions(**opts))
    return engine, engine.run()


def test_energy_is_integrated_exactly_on_a_hand_checkable_case() -> None:
    # one node: 100 W idle + 10 W per busy core; a 2-core pod runs from 50 s to 150 s
    cl = cluster(node_type("lin"), sites={"a": {"pue": 1.5, "carbon_intensity": 360.0}})
    _, r = run(cl, workload(pod("p", 100.0, cpu=2, arrival=50.0)))
    assert r.end_time == 150.0
    assert r.energy_joules.sum() == pytest.approx(100 * 150 + 20 * 100)  # 17,000 J
    assert r.facility_joules.sum() == pytest.approx(1.5 * 17000)
    assert r.carbon_grams.sum() == pytest.approx(1.5 * 17000 / JOULES_PER_KWH * 360)  # 2.55 g


def test_power_follows_the_curve_between_its_points() -> None:
    curve = [50, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180]  # steep first step
    cl = cluster(node_type("c", cores=20, curve=curve))
    _, r = run(cl, workload(pod("p", 10.0, cpu=1, usage=1.0)))  # 5 % load: half way to 10 %
    assert r.energy_joules.sum() == pytest.approx(70.0 * 10)


def test_carbon_integrates_the_hourly_series_across_an_hour_boundary(tmp_path: Path) -> None:
    series = tmp_path / "ci.csv"
    series.write_text("timestamp,avg_CI\n2022-06-01 00:00:00+00:00,100\n2022-06-01 01:00:00+00:00,300\n", encoding="utf-8")
    flat = [100.0] * 11
    cl = cluster(node_type("f", curve=flat), sites={"a": {"carbon_series": {"file": str(series)}}})
    _, r = run(cl, workload(pod("p", 1200.0, arrival=3000.0)))  # the run ends at 4200 s
    # 100 W for 3600 s at 100 g/kWh and 600 s at 300 g/kWh
    assert r.carbon_grams.sum() == pytest.approx(100 * (100 * 3600 + 300 * 600) / JOULES_PER_KWH)


def test_a_pod_that_does_not_fit_waits_and_starts_when_resources_free() -> None:
    cl = cluster(node_type("n", cores=4))
    _, r = run(cl, workload(pod("big", 100.0, cpu=4), pod("later", 10.0, cpu=2, arrival=10.0)))
    assert r.pods.start[1] == 100.0 and r.pods.created[1] == 10.0
    assert r.pods.end[1] == 110.0 and r.unscheduled == 0


def test_a_pod_that_fits_nowhere_ever_is_reported_unscheduled() -> None:
    cl = cluster(node_type("n", cores=4))
    _, r = run(cl, workload(pod("huge", 10.0, cpu=8)))
    assert r.unscheduled == 1 and np.isnan(r.pods.start[0])


def test_a_task_starts_when_its_parents_finish_and_runs_at_the_node_speed() -> None:
    cl = cluster(node_type("fast", speed=2.0))
    pods = [pod("a", 50.0), pod("b", 30.0), PodSpec("c", 40.0, 1.0, cpu_usage=1.0, parents=(0, 1))]
    _, r = run(cl, workload(*pods))
    assert list(r.pods.start) == [0.0, 0.0, 25.0]  # a takes 25 s on a speed-2 node, b 15 s
    assert r.pods.end[2] == 45.0


def test_the_same_seed_gives_the_same_run_and_ties_follow_the_seed() -> None:
    cl = cluster(node_type("same", count=8))
    wl = workload(*[pod(f"p{i}", 30.0 + i, arrival=float(i)) for i in range(40)])
    _, a = run(cl, wl, seed=7)
    _, b = run(cl, wl, seed=7)
    _, c = run(cl, wl, seed=8)
    assert np.array_equal(a.pods.node, b.pods.node) and np.array_equal(a.energy_joules, b.energy_joules)
    assert not np.array_equal(a.pods.node, c.pods.node)  # identical nodes tie: the seed decides


def test_least_allocated_spreads_and_most_allocated_packs() -> None:
    # requests in the nodes' cpu:memory ratio, so BalancedAllocation is 100 everywhere
    cl = cluster(node_type("n", count=3, cores=16))
    wl = workload(*[pod(f"p{i}", 100.0, cpu=2, memory_request=8 * 1024**3) for i in range(3)])
    _, spread = run(cl, wl)
    _, packed = run(cl, wl, Profile("most-allocated", "most"))
    assert len(set(spread.pods.node)) == 3
    assert len(set(packed.pods.node)) == 1


def test_pods_of_one_owner_are_spread_by_the_default_constraints() -> None:
    cl = cluster(node_type("n", count=2, cores=8))
    grouped = workload(*[pod(f"web-{i}", 100.0, cpu=1, group="web") for i in range(2)])
    bare = workload(*[pod(f"job-{i}", 100.0, cpu=1) for i in range(2)])
    _, g = run(cl, grouped, Profile("most-allocated", "most"))
    _, b = run(cl, bare, Profile("most-allocated", "most"))
    assert len(set(g.pods.node)) == 2  # PodTopologySpread outweighs bin-packing for a ReplicaSet
    assert len(set(b.pods.node)) == 1  # bare pods get no system spreading


def test_the_autoscaler_removes_empty_nodes_and_boots_one_for_a_pending_pod() -> None:
    cl = cluster(
        node_type("n", count=2),
        autoscaler={"enabled": True, "scale_down_unneeded_seconds": 60, "scale_up_delay_seconds": 30},
    )
    _, r = run(cl, workload(pod("late", 10.0, arrival=100.0)))
    assert r.scale_downs >= 2 and r.scale_ups == 1
    assert r.pods.start[0] == 130.0  # waited for the boot
    # both nodes idle (100 W) for 60 s; one booting and running from 100 s to 140 s, then idle 60 s
    assert r.energy_joules.sum() == pytest.approx(2 * 100 * 60 + 100 * 30 + 110 * 10 + 100 * 60)


def test_min_count_keeps_nodes_running() -> None:
    cl = cluster(node_type("n", count=3, min_count=2), autoscaler={"enabled": True, "scale_down_unneeded_seconds": 10})
    _, r = run(cl, workload(pod("p", 100.0, arrival=50.0)))
    assert r.scale_downs == 1


def test_on_a_large_cluster_the_extender_sees_only_the_nodes_kube_scheduler_found() -> None:
    cl = cluster(node_type("n", count=200))
    wl = workload(*[pod(f"p{i}", 1000.0, cpu=0.5, arrival=float(i)) for i in range(5)])

    def extender_profile() -> Profile:
        doc = _document(cl)
        return Profile("energy", "least", InProcessExtender("energy", doc, PolicyConfig()), 5)

    engine, adaptive = run(cl, wl, extender_profile())
    assert adaptive.feasible_seen == [100] * 5  # max(100, 200 × 48 %) = 100 of 200
    assert engine.next_start == 500 % 200  # the start index rotates by the nodes examined
    _, full = run(cl, wl, extender_profile(), percentage_of_nodes_to_score=100)
    assert full.feasible_seen == [200] * 5


def _document(cl):  # type: ignore[no-untyped-def]
    from joulesched.sim.cluster import profile_document

    nodes = cl.nodes()
    return profile_document(cl, nodes, [0.0] * len(nodes), [0.0] * len(nodes), {"a": 0.0})


def test_a_recorded_node_draws_the_measured_power() -> None:
    cl = cluster(node_type("lin"))
    samples = [(0.0, 0, 120.0), (10.0, 0, 150.0), (20.0, 0, float("nan"))]
    engine = Engine(cl, workload(pod("p", 40.0, cpu=2)), Profile("default"), EngineOptions())
    r = engine.run(samples)
    # 10 s at 120 W, 10 s at 150 W, then the model: 100 W + 2 busy cores × 10 W for 20 s
    assert r.energy_joules.sum() == pytest.approx(1200 + 1500 + 120 * 20)


@pytest.mark.parametrize("policy", ["default", "energy"])
def test_retrying_by_walking_the_queue_places_every_pod_as_retrying_them_all(policy: str) -> None:
    """A saturated cluster with a long pending queue: the queue walk moves back only the pods the
    freed node will take, and the replay is the same, pod for pod, as moving back every pod that
    fits and letting all but a few fail again (kube-scheduler's queueing hints without back-off)."""
    rng = np.random.default_rng(7)
    cl = cluster(node_type("small", 3, cores=8), node_type("big", 2, cores=16, curve=[80 + 12 * i for i in range(11)]))
    pods = [
        pod(f"p{i}", float(rng.integers(20, 200)), cpu=float(rng.choice([0.5, 1, 2, 3, 4])), arrival=float(rng.integers(0, 100)),
            priority=int(rng.choice([0, 0, 0, 10])))
        for i in range(400)
    ]
    wl = workload(*pods)

    def replay(walk: bool):  # type: ignore[no-untyped-def]
        profile = Profile("default")
        if policy == "energy":
            profile = Profile("energy", "least", InProcessExtender("energy", _document(cl), PolicyConfig()), 5)
        engine = Engine(cl, wl, profile, EngineOptions(seed=3))
        engine._walk_retry = walk
        return engine.run()

    walked, full = replay(True), replay(False)
    assert np.nanmax(full.pods.start - full.pods.created) > 100  # pods did wait: the queue was long
    assert np.array_equal(walked.pods.node, full.pods.node)
    assert np.array_equal(walked.pods.start, full.pods.start, equal_nan=True)
    assert walked.energy_joules.sum() == pytest.approx(full.energy_joules.sum())


def _scaled_up_type(cl, wl, seed=0):  # type: ignore[no-untyped-def]
    _, r = run(cl, wl, seed=seed)
    assert r.scale_ups == 1
    return cl.node_types[r.nodes[int(r.pods.node[0])].type_index].name


EFFICIENT = [50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150]
WASTEFUL = [150, 200, 220, 240, 260, 280, 300, 320, 340, 360, 380]


def test_the_priority_expander_boots_the_most_efficient_fitting_type() -> None:
    # the wasteful type is listed first: the expander ranks by policy.efficiency, not list order
    auto = {"enabled": True, "scale_down_unneeded_seconds": 10, "scale_up_delay_seconds": 5, "expander": "priority"}
    cl = cluster(node_type("wasteful", curve=WASTEFUL), node_type("efficient", curve=EFFICIENT), autoscaler=auto)
    assert _scaled_up_type(cl, workload(pod("late", 10.0, arrival=100.0))) == "efficient"
    # the efficient type is too small for this pod: the best type it fits wins
    cl = cluster(node_type("wasteful", cores=16, curve=WASTEFUL), node_type("efficient", cores=4, curve=EFFICIENT),
                 autoscaler=auto)
    assert _scaled_up_type(cl, workload(pod("big", 10.0, cpu=8, arrival=100.0))) == "wasteful"
    # GPU types rank below CPU types for a CPU pod; among GPU types the GPU figure decides
    gpu_cheap = {"count": 1, "idle_watts": 30, "max_watts": 300}
    gpu_dear = {"count": 1, "idle_watts": 80, "max_watts": 700}
    cl = cluster(node_type("gpu-dear", curve=EFFICIENT, gpus=gpu_dear), node_type("gpu-cheap", curve=WASTEFUL, gpus=gpu_cheap),
                 node_type("cpu", curve=WASTEFUL), autoscaler=auto)
    assert _scaled_up_type(cl, workload(pod("cpu-pod", 10.0, arrival=100.0))) == "cpu"
    assert _scaled_up_type(cl, workload(pod("gpu-pod", 10.0, arrival=100.0, gpu_request=1))) == "gpu-cheap"


def test_the_priority_expander_breaks_ties_at_random_like_cluster_autoscaler() -> None:
    auto = {"enabled": True, "scale_down_unneeded_seconds": 10, "scale_up_delay_seconds": 5, "expander": "priority"}
    same = [c * 1.005 for c in EFFICIENT]  # within 1 %: the same priority
    cl = cluster(node_type("twin-a", curve=EFFICIENT), node_type("twin-b", curve=same),
                 node_type("wasteful", curve=WASTEFUL), autoscaler=auto)
    chosen = {_scaled_up_type(cl, workload(pod("late", 10.0, arrival=100.0)), seed) for seed in range(12)}
    assert chosen == {"twin-a", "twin-b"}


def test_the_random_expander_draws_apart_from_the_schedulers_tie_breaks() -> None:
    # kube-scheduler and cluster-autoscaler are two processes: how many ties the scheduler broke
    # earlier must not change which type the autoscaler boots later. Four twins, all on at the
    # start; 0 or 6 early pods each break a four-way tie, the twins scale down, a late pod
    # makes the one scale-up.
    auto = {"enabled": True, "scale_down_unneeded_seconds": 10, "scale_up_delay_seconds": 5, "expander": "random"}
    cl = cluster(*(node_type(f"twin-{k}") for k in "abcd"), autoscaler=auto)
    late = pod("late", 10.0, arrival=1000.0)

    def booted(early: int, seed: int) -> str:
        pods = [pod(f"early-{i}", 5.0, arrival=10.0 * i) for i in range(early)]
        _, r = run(cl, workload(*pods, late), seed=seed)
        assert r.scale_ups == 1
        return cl.node_types[r.nodes[int(r.pods.node[early])].type_index].name

    quiet = [booted(0, seed) for seed in range(12)]
    assert len(set(quiet)) > 1  # the expander does draw
    assert [booted(6, seed) for seed in range(12)] == quiet


def test_a_gpu_pod_lands_only_on_the_gpu_models_it_accepts() -> None:
    import dataclasses

    from joulesched.sim.cluster import parse_cluster
    from joulesched.sim.engine import Engine, EngineOptions, Profile
    from joulesched.sim.model import PodSpec, Trace, Workload

    doc = {
        "name": "gpus",
        "sites": {"lab": {"carbon_intensity": 100}},
        "node_types": [
            {"name": "t4", "count": 2, "site": "lab", "cores": 32, "memory": "128Gi", "idle_watts": 60, "watts_per_core": 3,
             "gpus": {"count": 4, "idle_watts": 10, "max_watts": 70, "model": "T4"}},
            {"name": "v100", "count": 1, "site": "lab", "cores": 32, "memory": "128Gi", "idle_watts": 60, "watts_per_core": 3,
             "gpus": {"count": 4, "idle_watts": 35, "max_watts": 300, "model": "V100M32"}},
        ],
        "autoscaler": {"enabled": False},
    }
    cluster = parse_cluster(doc, "gpus")
    pods = tuple(
        PodSpec(name=f"p{i}", duration=100.0, cpu_request=1.0, gpu_request=1, gpu_usage=1.0, arrival=float(i),
                gpu_models=("V100M32",) if i % 2 else ())
        for i in range(6)
    )
    engine = Engine(cluster, Workload.of([Trace("t", "t", "pod-csv", pods)]), Profile("default", "least"), EngineOptions())
    result = engine.run()
    names = [n.name for n in cluster.nodes()]
    placed = [names[int(n)] for n in result.pods.node]
    for i, node in enumerate(placed):
        if i % 2:
            assert node.startswith("v100"), (i, node)
    assert any(n.startswith("t4") for n in placed[::2])  # the others may use any model
    # a pod that accepts only a model the cluster lacks is never placed
    lonely = dataclasses.replace(pods[1], name="a100-only", gpu_models=("A100",))
    engine = Engine(cluster, Workload.of([Trace("t", "t", "pod-csv", (lonely,))]), Profile("default", "least"), EngineOptions())
    assert engine.run().pods.node[0] < 0


def test_with_filter_keeping_the_best_node_every_pod_goes_where_the_extender_chose() -> None:
    # filter_keeps: best in the simulator as in the extender (Evaluation.kept): the one node
    # kept is where kube-scheduler places the pod, whatever its own plugins prefer. A core costs
    # 12.5 W on the small nodes and 12.75 W on the big one: both score 10, and with
    # filter_keeps: all LeastAllocated's preference for the big node's free cores decides the
    # tie; kept to the best, every pod goes to the cheaper small nodes. filter_keeps: top keeps
    # both, and LeastAllocated decides as with all.
    big = [100 + 81.6 * i for i in range(11)]
    cl = cluster(node_type("small", 2, cores=8, curve=EFFICIENT), node_type("big", 1, cores=64, curve=big))
    wl = workload(*[pod(f"p{i}", 500.0, cpu=1, arrival=float(i)) for i in range(8)])
    placed = {}
    for keeps in ("all", "top", "best"):
        ext = InProcessExtender("energy", _document(cl), PolicyConfig(filter_keeps=keeps))
        _, r = run(cl, wl, Profile("energy", "least", ext, 5))
        placed[keeps] = [cl.node_types[r.nodes[int(n)].type_index].name for n in r.pods.node]
    assert placed["all"] == placed["top"] == ["big"] * 8
    assert placed["best"] == ["small"] * 8


def test_a_pod_that_fits_the_freed_node_is_retried_past_one_that_needs_another_gpu_model() -> None:
    """The retry on a freed node applies NodeAffinity on the GPU model as the filter does: a pod
    asking for an A100 no longer takes the T4 node's room in the queue walk."""
    c = cluster(node_type("t4", 1, cores=4, gpus={"count": 1, "idle_watts": 10, "max_watts": 70, "model": "T4"}),
                autoscaler={"enabled": False})
    wl = workload(
        pod("busy", 100.0, cpu=4),  # fills the node until t = 100
        pod("a100-only", 50.0, cpu=4, arrival=1.0, gpu_request=1, gpu_usage=1.0, gpu_models=("A100",)),
        pod("cpu-job", 50.0, cpu=4, arrival=2.0),  # fits the node once "busy" ends
    )
    r = Engine(c, wl, Profile("default", "least"), EngineOptions()).run()
    assert r.pods.node[1] == -1 and r.pods.start[2] == 100.0
    assert r.unscheduled == 1


def test_a_retry_that_the_gpu_model_rules_out_boots_no_second_node() -> None:
    def gpu(model: str) -> dict[str, object]:
        return {"count": 1, "idle_watts": 10, "max_watts": 70, "model": model}

    c = cluster(node_type("t4", 1, cores=4, gpus=gpu("T4"), min_count=1), node_type("v100", 2, cores=4, gpus=gpu("V100")),
                autoscaler={"enabled": True, "scale_down_unneeded_seconds": 600, "scale_up_delay_seconds": 120})
    wl = workload(
        pod("busy", 750.0, cpu=4, gpu_request=1, gpu_usage=1.0, gpu_models=("T4",)),  # the T4 busy until 750
        pod("v100-only", 50.0, cpu=4, arrival=700.0, gpu_request=1, gpu_usage=1.0, gpu_models=("V100",)),
    )
    r = Engine(c, wl, Profile("default", "least"), EngineOptions()).run()
    assert r.scale_ups == 1, "one V100 booted for the one pending pod"


def test_every_pod_is_finished_or_unscheduled_those_waiting_on_one_that_never_ran_included() -> None:
    c = cluster(node_type("cpu", 1, cores=4), autoscaler={"enabled": False})
    wl = workload(
        pod("gpu-step", 10.0, cpu=1, gpu_request=1, gpu_usage=1.0),  # no GPU in the cluster
        pod("after-it", 10.0, cpu=1, parents=(0,)),  # waits for it for ever
        pod("independent", 10.0, cpu=1),
    )
    r = Engine(c, wl, Profile("default", "least"), EngineOptions()).run()
    m = metrics_of(c, wl, r)
    assert (m["pods"], m["unscheduled"]) == (1, 2)


def test_a_node_drawing_0_w_while_idle_is_still_powered() -> None:
    c = cluster(node_type("lin", 1, cores=10) | {"power_curve_watts": [10.0 * i for i in range(11)]},
                autoscaler={"enabled": False})
    wl = workload(pod("a", 10.0, cpu=1, arrival=0.0), pod("b", 10.0, cpu=1, arrival=90.0))
    r = Engine(c, wl, Profile("default", "least"), EngineOptions()).run()
    assert r.end_time == 100.0 and r.on_seconds[0] == 100.0


def test_a_deferrable_pod_with_a_parent_but_no_workflow_defers_with_it() -> None:
    from joulesched.sim.deferral import Deferring, units_of

    c = cluster(node_type("cpu", 1, cores=4), autoscaler={"enabled": False})
    wl = workload(pod("extract", 60.0, max_delay=3600.0), pod("load", 60.0, parents=(0,), max_delay=3600.0),
                  pod("alone", 60.0, max_delay=3600.0))
    assert sorted((u.pods, u.roots) for u in units_of(wl.pods, c)) == [((0, 1), (0,)), ((2,), (2,))]
    r = Engine(c, wl, Profile("default+defer", "least", defer=Deferring("perfect")), EngineOptions()).run()
    assert r.pods.end[1] > r.pods.end[0]
