"""The policy's maths: curves, marginal energy and carbon, normalisation, caps, freshness."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from joulesched.policy.config import PolicyConfig
from joulesched.policy.demand import PodDemand
from joulesched.policy.profile import GpuProfile, NodeArrays, NodeProfile, linear_curve
from joulesched.policy.scoring import curve_power, evaluate, idle_power_avoidable, normalise
from joulesched.policy.units import JOULES_PER_KWH

EPYC = (56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268)  # SPECpower, HPE DL325 Gen10 Plus
XEON = (127, 198, 226, 253, 281, 314, 354, 405, 464, 576, 619)  # SPECpower, HPE DL380 Gen10 Plus


def node(name: str, curve: tuple[float, ...] = EPYC, **kw: object) -> NodeProfile:
    fields: dict[str, object] = {"cores": 64.0, "power_curve_watts": tuple(float(x) for x in curve)}
    fields.update(kw)
    return NodeProfile(name=name, **fields)  # type: ignore[arg-type]


def run(nodes: list[NodeProfile], pod: PodDemand, cfg: PolicyConfig | None = None, now: float = 1000.0, **kw: object):
    arrays = NodeArrays.build(nodes)
    rows = np.arange(len(nodes))
    return evaluate(arrays, rows, pod, cfg or PolicyConfig(), now, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("u", "watts"),
    [(0.0, 56.8), (0.1, 100.0), (0.05, 78.4), (0.95, 259.0), (1.0, 268.0), (1.5, 402.0), (-0.2, 56.8)],
    ids=["idle", "first point", "half way to 10 %", "between the last points", "full load", "oversubscribed time-shares", "clipped below"],
)
def test_curve_power_interpolates_linearly_between_published_points(u: float, watts: float) -> None:
    assert curve_power(np.array([EPYC], dtype=float), np.array([u]))[0] == pytest.approx(watts)


def test_linear_model_is_the_same_mechanism_as_a_curve() -> None:
    curve = linear_curve(100.0, 2.0, 50.0)
    assert curve[0] == 100.0 and curve[-1] == 200.0
    assert curve_power(np.array([curve]), np.array([0.37]))[0] == pytest.approx(100 + 2 * 50 * 0.37)


def test_marginal_energy_worked_example() -> None:
    # docs/policy.md: 8 cores on a 64-core EPYC 7763 at 30 % for one hour.
    ev = run([node("a", utilisation=0.30)], PodDemand(8.0), PolicyConfig(reference_runtime_seconds=3600))
    # u: 0.30 -> 0.425; P(0.30)=130, P(0.425)=143+0.25*(162-143)=147.75
    assert ev.marginal_watts[0] == pytest.approx(17.75)
    assert ev.energy_joules[0] == pytest.approx(17.75 * 3600)


def test_faster_node_runs_shorter_and_costs_less_energy() -> None:
    ev = run([node("slow", speed=1.0), node("fast", speed=2.0)], PodDemand(4.0))
    assert ev.runtime_seconds[1] == pytest.approx(ev.runtime_seconds[0] / 2)
    assert ev.energy_joules[1] == pytest.approx(ev.energy_joules[0] / 2)
    assert list(ev.scores) == [0, 10]


def test_carbon_uses_pue_and_grid_intensity() -> None:
    cfg = PolicyConfig(strategy="carbon")
    ev = run(
        [node("dirty", pue=1.58, carbon_intensity=441.0), node("clean", pue=1.1, carbon_intensity=55.0)],
        PodDemand(8.0),
        cfg,
    )
    assert ev.carbon_grams[0] == pytest.approx(ev.energy_joules[0] / JOULES_PER_KWH * 1.58 * 441)
    assert ev.carbon_grams[1] == pytest.approx(ev.energy_joules[1] / JOULES_PER_KWH * 1.1 * 55)
    assert list(ev.scores) == [0, 10]
    # the same nodes under the energy strategy are equal
    assert list(run([node("dirty"), node("clean")], PodDemand(8.0)).scores) == [10, 10]


@pytest.mark.parametrize(
    ("costs", "expected"),
    [
        ([1.0, 1.0, 1.0], [10, 10, 10]),
        ([1.0, 1.01], [10, 10]),
        ([1.0, 1.25], [10, 5]),
        ([1.0, 1.5, 3.0], [10, 0, 0]),
        ([2.0, 1.0], [0, 10]),
        ([0.0, 0.0], [10, 10]),
    ],
    ids=[
        "all nodes equal all score 10",
        "a node 1 % worse does not fall to 0",
        "half the band away scores 5",
        "a band or more away scores 0",
        "the best is wherever it is in the list",
        "all free all score 10",
    ],
)
def test_normalise_is_relative_to_the_best_not_min_max(costs: list[float], expected: list[int]) -> None:
    scores = normalise(np.array(costs), np.ones(len(costs), dtype=bool), band=0.5)
    assert scores.tolist() == expected


def test_normalise_with_a_free_best_node_stays_relative() -> None:
    scores = normalise(np.array([0.0, 1.0, 1.0]), np.ones(3, dtype=bool), band=0.5)
    assert scores[0] == 10 and scores[1] == scores[2] < 10


def test_unknown_and_stale_nodes_get_the_neutral_score_never_the_best() -> None:
    nodes = [node("fresh", updated=990.0), node("stale", updated=100.0), node("static")]
    arrays = NodeArrays.build(nodes)
    cfg = PolicyConfig(neutral_score=5, max_age_seconds=60)
    ev = evaluate(arrays, np.array([0, 1, 2, -1]), PodDemand(2.0), cfg, now=1000.0)
    assert ev.fresh.tolist() == [True, False, True, False]
    assert ev.scores.tolist() == [10, 5, 10, 5]
    assert not ev.failed.any()


def test_a_flat_zero_cost_unknown_node_cannot_win() -> None:
    # The peer bug: missing data scored as zero cost made the unknown node win.
    arrays = NodeArrays.build([node("measured", utilisation=0.5)])
    ev = evaluate(arrays, np.array([-1, 0]), PodDemand(2.0), PolicyConfig(), now=0.0)
    assert ev.scores.tolist() == [PolicyConfig().neutral_score, 10]


def test_a_node_whose_carbon_intensity_nobody_gave_scores_neutral_under_carbon() -> None:
    # A profile file's node without a site or an intensity of its own: unknown, not 0 g/kWh,
    # which would make it the cheapest node under carbon and push every node with data to 0.
    from joulesched.policy.profile import parse_profiles

    curve = [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]
    doc = {
        "sites": {"clean": {"pue": 1.1, "carbon_intensity": 55}, "no-data": {"pue": 1.2}},
        "nodes": [
            {"name": "known", "site": "clean", "cores": 64, "power_curve_watts": curve},
            {"name": "no-site", "cores": 64, "power_curve_watts": curve},
            {"name": "site-without", "site": "no-data", "cores": 64, "power_curve_watts": curve},
        ],
    }
    profiles = parse_profiles(doc, "nodes.yaml")
    arrays = NodeArrays.build(profiles.nodes)
    carbon = PolicyConfig(strategy="carbon", neutral_score=5)
    ev = evaluate(arrays, np.array([0, 1, 2]), PodDemand(4.0), carbon, 1000.0)
    assert ev.scores.tolist() == [10, 5, 5]
    assert ev.best() == 0
    assert np.isnan(ev.carbon_grams[1:]).all()
    # under energy the intensity plays no part: the same nodes score on their energy alone
    assert evaluate(arrays, np.array([0, 1, 2]), PodDemand(4.0), PolicyConfig(), 1000.0).scores.tolist() == [10, 10, 10]
    # and the document written back leaves the unknown out, as it came in
    assert parse_profiles(profiles.to_document(), "again") == profiles


def test_power_cap_fails_nodes_that_would_cross_it_with_headroom() -> None:
    cfg = PolicyConfig(power_cap_headroom=0.05)
    nodes = [
        node("roomy", measured_watts=150.0, power_cap_watts=400.0, utilisation=0.3),
        node("tight", measured_watts=240.0, power_cap_watts=260.0, utilisation=0.85),
        node("uncapped", measured_watts=240.0, utilisation=0.85),
    ]
    ev = run(nodes, PodDemand(16.0), cfg)
    assert ev.failed.tolist() == [False, True, False]
    assert ev.scores[1] == 0
    assert ev.projected_watts[1] > 260 * 0.95
    assert "power cap" in ev.reason(1, cfg)


def test_power_cap_uses_the_model_when_nothing_is_measured() -> None:
    ev = run([node("a", utilisation=1.0, power_cap_watts=250.0)], PodDemand(1.0))
    assert ev.failed[0]  # P(1.0) = 268 W > 250 × 0.95


def test_power_cap_counts_the_predicted_gpu_pods_on_a_measured_node_as_on_a_modelled_one() -> None:
    # Three GPU pods placed a moment ago that no measurement shows yet: the cap projects their
    # GPUs' power whether the node's power is measured or modelled. Before, a measured node
    # counted only their CPUs, and a burst of GPU pods passed a cap it would cross.
    cfg = PolicyConfig(power_cap_enabled=True)
    gpu_node = NodeProfile("g", 64.0, linear_curve(200.0, 3.0, 64.0), utilisation=0.0, power_cap_watts=2500.0,
                           gpus=GpuProfile(4, 60.0, 700.0, 1.0, 0.0))
    measured = NodeProfile("g", 64.0, linear_curve(200.0, 3.0, 64.0), utilisation=0.0, power_cap_watts=2500.0,
                           gpus=GpuProfile(4, 60.0, 700.0, 1.0, 0.0), measured_watts=200.0 + 4 * 60.0)
    pod = PodDemand(1.0, 0.0, 1, 3600.0)
    projected = {}
    for label, profile in (("modelled", gpu_node), ("measured", measured)):
        arrays = NodeArrays.build([profile])
        for predicted in (0.0, 3.0):
            ev = evaluate(arrays, np.array([0]), pod, cfg, 0.0, np.zeros(1), np.array([predicted]))
            projected[label, predicted] = (round(float(ev.projected_watts[0]), 6), bool(ev.failed[0]))
    assert projected["measured", 0.0] == projected["modelled", 0.0] == (pytest.approx(1083.0, abs=1), False)
    assert projected["measured", 3.0] == projected["modelled", 3.0]
    assert projected["measured", 3.0][1] is True


def test_a_saturated_node_is_the_most_expensive_place_not_a_free_one() -> None:
    nodes = [node("full", utilisation=1.0), node("other", XEON, utilisation=0.2, cores=80.0)]
    ev = run(nodes, PodDemand(8.0))
    assert ev.marginal_watts[0] == pytest.approx(8 / 64 * 268)
    assert ev.scores.tolist()[1] == 10


def test_a_node_the_pod_would_saturate_scores_zero_while_another_has_room() -> None:
    # EPYC at 95 % + 8 cores -> 107.5 %: P(1)/c = 4.19 W per core of time-shared work is below
    # this curve's 50-60 % slope (4.53 W per core), so on energy alone the busy node would win.
    nodes = [node("busy", utilisation=0.95), node("half", utilisation=0.5)]
    alone = run(nodes, PodDemand(8.0), PolicyConfig(avoid_saturation=False))
    assert alone.scores.tolist() == [10, 7]
    ev = run(nodes, PodDemand(8.0))
    assert ev.scores.tolist() == [0, 10]
    assert ev.saturated.tolist() == [True, False] and not ev.failed.any()
    # every candidate saturated: scored on cost as before, none singled out
    both = run([node("x", utilisation=0.95), node("y", utilisation=0.99)], PodDemand(8.0))
    assert not both.saturated.any() and max(both.scores) == 10


def test_predicted_load_moves_the_pod_to_the_next_node() -> None:
    nodes = [node("a", utilisation=0.3), node("b", utilisation=0.3)]
    pod = PodDemand(8.0)
    before = run(nodes, pod)
    assert before.scores.tolist() == [10, 10]
    after = run(nodes, pod, predicted_cores=np.array([16.0, 0.0]))
    assert after.utilisation_before[0] == pytest.approx(0.3 + 16 / 64)
    assert after.marginal_watts[0] != pytest.approx(before.marginal_watts[0])


def test_gpu_pod_scores_on_gpu_efficiency() -> None:
    h100 = GpuProfile(count=8, idle_watts=70.0, max_watts=700.0, speed=2.0)
    a100 = GpuProfile(count=8, idle_watts=50.0, max_watts=400.0, speed=1.0)
    nodes = [node("h100", gpus=h100), node("a100", gpus=a100), node("cpu-only")]
    ev = run(nodes, PodDemand(4.0, gpus=1))
    # H100: 630 W per GPU for T/2; A100: 350 W for T; the H100 wins on energy per work.
    assert ev.marginal_watts[0] > ev.marginal_watts[1]
    assert ev.energy_joules[0] < ev.energy_joules[1]
    assert ev.scores[0] == 10
    assert not np.isfinite(ev.cost[2]) and ev.scores[2] == 0


def test_evaluate_with_no_profiles_is_all_neutral() -> None:
    ev = evaluate(NodeArrays.build([]), np.array([-1, -1]), PodDemand(1.0), PolicyConfig(neutral_score=3), now=0.0)
    assert ev.scores.tolist() == [3, 3]


# -- idle power (docs/policy.md, "Idle power") ------------------------------------------------


def test_idle_power_worked_example() -> None:
    # docs/policy.md: the same 8-core pod for one hour on an autoscaled cluster. Node A is empty
    # (its pods left; it would be powered down), node B runs pods that end in 20 minutes.
    cfg = PolicyConfig(reference_runtime_seconds=3600, idle_power="autoscaled")
    nodes = [node("a", utilisation=0.0, held_until=0.0), node("b", XEON, cores=80.0, utilisation=0.10, held_until=2200.0)]
    ev = run(nodes, PodDemand(8.0), cfg, now=1000.0)
    # A: u 0 -> 0.125: P = 100 + 0.25 * 16 = 104 W, dP = 47.2 W; idle 56.8 W for the whole hour.
    assert ev.marginal_watts[0] == pytest.approx(47.2)
    assert ev.idle_energy_joules[0] == pytest.approx(56.8 * 3600)
    assert ev.energy_joules[0] == pytest.approx((47.2 + 56.8) * 3600)
    # B: held for 1,200 s more; the pod outlasts that by 2,400 s: 127 W of idle for 2,400 s.
    assert ev.marginal_watts[1] == pytest.approx(28.0)
    assert ev.idle_energy_joules[1] == pytest.approx(127.0 * 2400)
    assert ev.energy_joules[1] == pytest.approx(28.0 * 3600 + 127.0 * 2400)
    assert list(ev.scores) == [10, 8]


@pytest.mark.parametrize(
    ("held_until", "idle_seconds"),
    [(0.0, 3600.0), (1000.0, 3600.0), (1600.0, 3000.0), (4600.0, 0.0), (9e9, 0.0), (float("nan"), 0.0)],
    ids=[
        "an empty node pays its idle power for the whole runtime",
        "pods that end now hold it for nothing",
        "pods that end in 10 minutes leave 50 minutes to pay",
        "pods that outlast the new one leave nothing",
        "long-held nodes charge nothing",
        "an unknown end counts as held for good",
    ],
)
def test_the_pod_pays_the_idle_time_it_adds(held_until: float, idle_seconds: float) -> None:
    cfg = PolicyConfig(reference_runtime_seconds=3600, idle_power="autoscaled")
    ev = run([node("a", held_until=held_until)], PodDemand(4.0), cfg, now=1000.0)
    assert ev.idle_energy_joules[0] == pytest.approx(56.8 * idle_seconds)


def test_always_on_nodes_never_charge_idle_power() -> None:
    empty = node("a", held_until=0.0)
    assert run([empty], PodDemand(4.0), PolicyConfig(idle_power="always-on")).idle_energy_joules[0] == 0.0
    # the node's own class wins over the policy's default, both ways
    own = run([node("a", held_until=0.0, idle_power="always-on")], PodDemand(4.0), PolicyConfig(idle_power="autoscaled"))
    assert own.idle_energy_joules[0] == 0.0
    managed = run([node("a", held_until=0.0, idle_power="power-managed")], PodDemand(4.0), PolicyConfig())
    assert managed.idle_energy_joules[0] == pytest.approx(56.8 * 3600)


def test_idle_power_avoidable_says_whether_pods_holding_nodes_can_count() -> None:
    def avoidable(nodes: list[NodeProfile], cfg: PolicyConfig) -> bool:
        return idle_power_avoidable(NodeArrays.build(nodes), cfg)

    assert not avoidable([node("a"), node("b")], PolicyConfig(idle_power="always-on"))
    assert avoidable([node("a"), node("b")], PolicyConfig(idle_power="autoscaled"))
    # a node's own class wins over the policy's default, both ways
    assert avoidable([node("a"), node("b", idle_power="power-managed")], PolicyConfig(idle_power="always-on"))
    assert not avoidable([node("a", idle_power="always-on")], PolicyConfig(idle_power="autoscaled"))
    assert not avoidable([], PolicyConfig(idle_power="autoscaled"))
    # where it says no, held_until changes no figure of the evaluation
    nodes = [node("a", held_until=0.0), node("b", held_until=5000.0)]
    cfg = PolicyConfig(idle_power="always-on")
    arrays = NodeArrays.build(nodes)
    with_held = evaluate(arrays, np.array([0, 1]), PodDemand(4.0), cfg, 1000.0, held_until=np.array([0.0, np.inf]))
    without = evaluate(arrays, np.array([0, 1]), PodDemand(4.0), cfg, 1000.0)
    for f in fields(with_held):
        np.testing.assert_array_equal(getattr(with_held, f.name), getattr(without, f.name))


def test_a_sets_columns_and_facts_are_made_once_and_follow_its_copies() -> None:
    # Callers key caches on a column's identity (the ledger's per-row arrays): the same set
    # hands out the same read-only view; a copy with new columns has its own views and facts.
    arrays = NodeArrays.build([node("a", updated=5.0), node("b", idle_power="autoscaled")])
    assert arrays.updated is arrays.updated and not arrays.updated.flags.writeable
    np.testing.assert_array_equal(arrays.updated, arrays.column("updated"))
    assert arrays.idle_classes == (True, True) and not arrays.any_gpus
    live = arrays.with_columns(updated=7.0, idle_avoidable=0.0, gpu_count=np.array([0.0, 2.0]))
    assert live.updated is not arrays.updated and list(live.updated) == [7.0, 7.0]
    assert live.idle_classes == (False, False) and live.any_gpus
    assert list(arrays.updated[:1]) == [5.0] and arrays.idle_classes == (True, True)


@pytest.mark.parametrize("pod", [PodDemand(4.0), PodDemand(4.0, gpus=1)], ids=["CPU pod", "GPU pod"])
@pytest.mark.parametrize("scale", ["request", "cluster"])
def test_a_term_left_out_for_the_set_is_the_zero_it_would_compute(pod: PodDemand, scale: str) -> None:
    # A set without GPUs, or without a node whose idle power can be avoided, leaves those terms
    # out (NodeArrays.any_gpus, idle_classes). Each request's nodes in a cluster that has them
    # elsewhere must cost, bit for bit, what the same nodes cost as a set of their own, where the
    # terms are left out; and where the request holds such a node, the terms apply.
    gpu = GpuProfile(count=4, idle_watts=60.0, max_watts=700.0)
    cluster = [
        node("epyc", utilisation=0.3, measured_watts=150.0, power_cap_watts=400.0, held_until=900.0),
        node("xeon", XEON, cores=80.0, utilisation=0.6, updated=990.0),
        node("gpu", XEON, gpus=gpu, held_until=5000.0),
        node("autoscaled", idle_power="autoscaled", held_until=0.0),
    ]
    cfg = PolicyConfig(score_scale=scale)
    predicted = np.array([2.0, 0.0, 1.0, 0.0])
    for picked in ([0, 1], [1, 0], [0, 2], [3, 1], [2, 3, 0]):
        whole = evaluate(NodeArrays.build(cluster), np.array(picked), pod, cfg, 1000.0, predicted_cores=predicted, predicted_gpus=predicted)
        alone = NodeArrays.build([cluster[i] for i in picked])
        rows = np.arange(len(picked))
        own = evaluate(alone, rows, pod, cfg, 1000.0, predicted_cores=predicted[picked], predicted_gpus=predicted[picked])
        for f in fields(whole):
            if scale == "cluster" and f.name == "scores":
                continue  # relative to a best over a different set
            np.testing.assert_array_equal(getattr(whole, f.name), getattr(own, f.name), err_msg=f"{picked}: {f.name}")
        assert (own.idle_energy_joules > 0).any() == (3 in picked)
        assert (own.node_watts_before > [cluster[i].power_curve_watts[-1] for i in picked]).any() == (2 in picked)  # GPUs on


def test_a_busy_node_beats_an_empty_efficient_one_when_idle_is_avoidable() -> None:
    # The empty EPYC would be cheaper on marginal power alone; once its idle power counts, the
    # Xeon that is on anyway for its pods is the cheaper place, as bin-packing would choose.
    nodes = [node("empty-epyc", held_until=0.0), node("busy-xeon", XEON, cores=80.0, utilisation=0.85)]
    marginal_only = run(nodes, PodDemand(2.0), PolicyConfig(idle_power="always-on"))
    assert list(marginal_only.scores) == [10, 0]
    idle_aware = run(nodes, PodDemand(2.0), PolicyConfig(idle_power="autoscaled"))
    assert list(idle_aware.scores) == [0, 10]


def test_gpu_idle_power_counts_on_an_empty_gpu_node() -> None:
    gpu = GpuProfile(count=8, idle_watts=60.0, max_watts=700.0)
    ev = run([node("g", gpus=gpu, held_until=0.0)], PodDemand(1.0, gpus=1), PolicyConfig(idle_power="autoscaled"))
    assert ev.idle_energy_joules[0] == pytest.approx((56.8 + 8 * 60.0) * 3600)


# -- scores that mean the same whatever slice of the cluster a request carries -----------------


def test_scores_are_relative_to_the_cluster_wide_best() -> None:
    nodes = [node("best"), node("ten-percent-worse", speed=1 / 1.1), node("worse", speed=1 / 1.3)]
    arrays = NodeArrays.build(nodes)
    slice_without_best = np.array([1, 2])
    cfg = PolicyConfig(score_scale="cluster")
    cluster = evaluate(arrays, slice_without_best, PodDemand(4.0), cfg, now=0.0)
    assert list(cluster.scores) == [8, 4]
    request = evaluate(arrays, slice_without_best, PodDemand(4.0), PolicyConfig(score_scale="request"), now=0.0)
    assert list(request.scores) == [10, 6]
    whole = evaluate(arrays, np.array([0, 1, 2]), PodDemand(4.0), cfg, now=0.0)
    assert list(whole.scores) == [10, 8, 4]
    # the request's own rows give the same figures either way
    assert cluster.energy_joules.tolist() == pytest.approx(request.energy_joules.tolist())


def test_the_cluster_wide_best_skips_nodes_the_pod_cannot_use() -> None:
    # A stale node and a node the pod would saturate do not set the scale for the others.
    nodes = [node("stale", updated=0.0), node("full", utilisation=0.99), node("a"), node("b", speed=1 / 1.1)]
    arrays = NodeArrays.build(nodes)
    cfg = PolicyConfig(max_age_seconds=60, score_scale="cluster")
    ev = evaluate(arrays, np.array([2, 3]), PodDemand(4.0), cfg, now=1000.0)
    assert list(ev.scores) == [10, 8]


# -- GPU servers are kept for GPU work --------------------------------------------------------


def test_cpu_pods_stay_off_gpu_nodes_while_cpu_nodes_have_room() -> None:
    gpu = GpuProfile(count=8, idle_watts=60.0, max_watts=700.0)
    nodes = [node("gpu-node", gpus=gpu, utilisation=0.5), node("cpu-node", XEON, cores=80.0, utilisation=0.5)]
    ev = run(nodes, PodDemand(2.0))
    assert ev.reserved.tolist() == [True, False] and list(ev.scores) == [0, 10]
    assert not run(nodes, PodDemand(2.0), PolicyConfig(reserve_gpu_nodes=False)).reserved.any()
    # a GPU pod is not held back, and with no CPU node in the request the GPU node is scored
    assert not run(nodes, PodDemand(2.0, gpus=1)).reserved.any()
    alone = run(nodes[:1], PodDemand(2.0))
    assert not alone.reserved.any() and list(alone.scores) == [10]


def test_gpu_pods_go_where_the_work_costs_least_not_where_the_watts_are_fewest() -> None:
    # An A100 (60 -> 400 W) draws fewer watts than an H100 (70 -> 700 W) but, at a third of the
    # speed on this work, spends more energy on it: 340 W x 3,600 s against 630 W x 1,200 s.
    a100 = GpuProfile(count=8, idle_watts=60.0, max_watts=400.0, speed=1.0)
    h100 = GpuProfile(count=8, idle_watts=70.0, max_watts=700.0, speed=3.0)
    ev = run([node("a100", gpus=a100), node("h100", gpus=h100)], PodDemand(1.0, gpus=1), PolicyConfig())
    assert ev.marginal_watts[1] > ev.marginal_watts[0]
    assert ev.energy_joules[1] < ev.energy_joules[0]
    assert list(ev.scores) == [0, 10]


def random_cluster(rng: np.random.Generator, min_nodes: int, stale: float) -> tuple[list[NodeProfile], np.ndarray, PodDemand]:
    """Up to 11 nodes with power caps, GPUs and stale measurements (a share ``stale`` of them,
    at now=1000 with max_age 120), listed with unknown names in a random order; a pod of 1, 8
    or 24 cores, a GPU one time in five."""
    gpu = GpuProfile(count=4, idle_watts=50.0, max_watts=400.0)
    nodes = []
    for i in range(int(rng.integers(min_nodes, 12))):
        kw: dict[str, object] = {"utilisation": float(rng.uniform(0, 1)), "carbon_intensity": float(rng.uniform(20, 800))}
        if rng.random() < 0.4:
            kw.update(measured_watts=float(rng.uniform(100, 300)), power_cap_watts=float(rng.uniform(150, 320)))
        if rng.random() < 0.2:
            kw["gpus"] = gpu
        if rng.random() < stale:
            kw["updated"] = 0.0
        nodes.append(node(f"n{i}", EPYC if rng.random() < 0.5 else XEON, **kw))
    rows = rng.permutation(np.concatenate([np.arange(len(nodes)), np.full(int(rng.integers(0, 3)), -1)]))
    return nodes, rows, PodDemand(float(rng.choice([1.0, 8.0, 24.0])), gpus=int(rng.random() < 0.2))


@pytest.mark.parametrize("scale", ["request", "cluster"])
@pytest.mark.parametrize("seed", range(40))
def test_the_evaluation_over_the_nodes_a_filter_passed_is_the_filters_over_them(seed: int, scale: str) -> None:
    # Evaluation.passed() answers prioritize from the filter's evaluation: it must be what
    # evaluating the pod over the passed nodes alone gives, field by field. Random clusters with
    # power caps, nodes the pod saturates, GPU nodes, unknown and stale nodes.
    rng = np.random.default_rng(seed)
    nodes, rows, pod = random_cluster(rng, min_nodes=2, stale=0.2)
    arrays = NodeArrays.build(nodes)
    cfg = PolicyConfig(strategy="carbon", score_scale=scale)  # type: ignore[arg-type]
    full = evaluate(arrays, rows, pod, cfg, 1000.0)
    keep, passed = full.passed()
    assert keep.tolist() == np.flatnonzero(~full.failed).tolist()
    alone = evaluate(arrays, rows[keep], pod, cfg, 1000.0)
    for f in fields(alone):
        np.testing.assert_array_equal(getattr(passed, f.name), getattr(alone, f.name), err_msg=f.name)
    assert (passed is full) == (not full.failed.any())


def test_the_best_node_is_the_top_score_then_the_lowest_cost_among_fresh_nodes_the_cap_passes() -> None:
    # The cheapest node fails its power cap and a stale one scores neutral: neither is chosen.
    # "busy" and "quiet" both score 10 (2 cores cost 4.16 and 4.06 W: within a twentieth of
    # the band); "quiet", listed later, costs less and is the one.
    nodes = [
        node("capped", utilisation=0.9, measured_watts=255.0, power_cap_watts=265.0),
        node("stale", updated=0.0),
        node("xeon", XEON, utilisation=0.85, cores=80.0),
        node("busy", utilisation=0.29),
        node("quiet", utilisation=0.31),
    ]
    ev = run(nodes, PodDemand(2.0), PolicyConfig(max_age_seconds=120))
    assert ev.failed.tolist() == [True, False, False, False, False]
    assert ev.fresh.tolist() == [True, False, True, True, True]
    assert ev.scores[3] == ev.scores[4] == 10 and ev.cost[4] < ev.cost[3]
    assert ev.best() == 4
    assert ev.kept(PolicyConfig()).tolist() == [False, True, True, True, True]
    assert ev.kept(PolicyConfig(filter_keeps="best")).tolist() == [False, False, False, False, True]
    assert ev.kept(PolicyConfig(filter_keeps="top")).tolist() == [False, False, False, True, True]
    assert ev.narrowed(PolicyConfig()) is None
    # Nothing fresh that the cap passes: no preference, filter keeps what the cap passes.
    blind = run([node("s1", updated=0.0), node("capped", utilisation=0.9, measured_watts=255.0, power_cap_watts=265.0)],
                PodDemand(2.0), PolicyConfig(max_age_seconds=120))
    assert blind.best() is None
    assert blind.kept(PolicyConfig(filter_keeps="best")).tolist() == [True, False]
    assert blind.top() is None and blind.kept(PolicyConfig(filter_keeps="top")).tolist() == [True, False]
    assert run([], PodDemand(2.0)).best() is None
    # A GPU pod: the fresh nodes have no GPUs (infinite cost, score 0), the unknown one scores
    # neutral above them: prioritize would rank the unknown node first, so no preference.
    arrays = NodeArrays.build([node("cpu-a"), node("cpu-b")])
    gpu_pod = evaluate(arrays, np.array([0, 1, -1]), PodDemand(2.0, gpus=1), PolicyConfig(), 1000.0)
    assert gpu_pod.scores.tolist() == [0, 0, 5] and gpu_pod.best() is None
    assert gpu_pod.kept(PolicyConfig(filter_keeps="best")).tolist() == [True, True, True]
    assert gpu_pod.kept(PolicyConfig(filter_keeps="top")).tolist() == [True, True, True]


@pytest.mark.parametrize("seed", range(40))
def test_the_node_filter_keeps_is_the_one_no_other_fresh_node_outranks(seed: int) -> None:
    # filter_keeps: best over random clusters (caps, saturating pods, GPU nodes, unknown and
    # stale nodes): one node kept exactly when a fresh node passes the cap and no node without
    # fresh measurements outscores it; no candidate the cap passes outranks it on score, no
    # fresh one on (score, cost); with all it is every node the cap passes.
    nodes, rows, pod = random_cluster(np.random.default_rng(seed), min_nodes=1, stale=0.3)
    ev = evaluate(NodeArrays.build(nodes), rows, pod, PolicyConfig(strategy="carbon"), 1000.0)
    assert ev.kept(PolicyConfig()).tolist() == (~ev.failed).tolist()
    kept = ev.kept(PolicyConfig(filter_keeps="best"))
    top = ev.kept(PolicyConfig(filter_keeps="top"))
    ok = ev.fresh & ~ev.failed
    if not ok.any() or ev.scores[~ev.failed].max() > ev.scores[ok].max():
        assert kept.tolist() == top.tolist() == (~ev.failed).tolist()
        assert ev.narrowed(PolicyConfig(filter_keeps="best")) is None and ev.narrowed(PolicyConfig(filter_keeps="top")) is None
        return
    (best,) = np.flatnonzero(kept)
    assert ok[best] and ev.scores[best] == ev.scores[~ev.failed].max()
    # top: every fresh node the cap passes with that score, and only those; best is one of them
    assert top.tolist() == (ok & (ev.scores == ev.scores[best])).tolist() and top[best]
    cost = np.where(np.isnan(ev.cost), np.inf, ev.cost)
    for i in np.flatnonzero(ok):
        assert (ev.scores[i], -cost[i]) <= (ev.scores[best], -cost[best])
