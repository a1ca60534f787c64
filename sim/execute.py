"""One report: the policies, the 100 % node-scoring variant, the sensitivity runs, attribution.

Shared by ``joulesched sim run`` and ``joulesched sim demo``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from joulesched.sim import report
from joulesched.sim.attribution import INTERVALS, METHODS, PHASES
from joulesched.sim.bound import bound_for_runs
from joulesched.sim.cluster import ClusterSpec
from joulesched.sim.model import Workload
from joulesched.sim.progress import Progress
from joulesched.sim.runner import (
    PolicyRun,
    RunOptions,
    attribution_runs,
    comparison,
    deferral_comparison,
    describe_extender,
    policy_config_dict,
    run_policies,
    targets,
)

FORMAT = "joulesched-sim-results"
VERSION = 1


def _cluster_summary(cluster: ClusterSpec) -> dict[str, Any]:
    return {
        "name": cluster.name,
        "file": cluster.source,
        "nodes": cluster.node_count,
        "start": cluster.start,
        "node_types": [
            {
                "name": t.name,
                "count": t.count,
                "site": t.site,
                "cores": t.cores,
                "memory_bytes": t.memory_bytes,
                "speed": t.speed,
                "power_curve_watts": list(t.power_curve_watts),
                "gpus": t.gpus.count,
                "source": t.source,
            }
            for t in cluster.node_types
        ],
        "sites": {
            name: {
                "pue": s.pue,
                "wue": s.wue,
                "carbon": s.carbon.name,
                "carbon_mean_g_per_kwh": s.carbon.mean(),
                "carbon_filled_hours": s.carbon.filled_hours,
                "zone": s.zone,
            }
            for name, s in cluster.sites.items()
        },
        "autoscaler": {
            "enabled": cluster.autoscaler.enabled,
            "scale_down_unneeded_seconds": cluster.autoscaler.scale_down_unneeded_seconds,
            "scale_up_delay_seconds": cluster.autoscaler.scale_up_delay_seconds,
            "expander": cluster.autoscaler.expander,
        },
    }


def _metrics(runs: Mapping[str, PolicyRun]) -> dict[str, dict[str, Any]]:
    return {name: run.metrics for name, run in runs.items()}


def target_notes(
    runs: Mapping[str, PolicyRun],
    compare: Mapping[str, Mapping[str, float]],
    goals: Mapping[str, Mapping[str, Any]],
    cluster: ClusterSpec,
) -> list[str]:
    """Why a target was missed, in numbers the report already has."""
    notes: list[str] = []
    base = runs.get("default")
    if base is None:
        return notes
    m = base.metrics
    idle_share = m["idle_energy_joules"] / m["energy_joules"] if m["energy_joules"] else 0.0
    util = m["mean_utilisation_of_powered_cores"]
    scaling = "the autoscaler is on" if cluster.autoscaler.enabled else "no autoscaler powers empty nodes off"
    energy = goals.get("energy")
    if energy is not None and not energy["met"]:
        if compare["energy"]["energy_saving_percent"] < 15.0:
            notes.append(
                f"Why: idle power is {idle_share:.0%} of `default`'s energy (powered cores {util:.0%} busy on average) and "
                f"{scaling}; placement changes only the load-dependent rest."
            )
        if compare["energy"]["makespan_change_percent"] > 5.0:
            e = runs["energy"].metrics
            notes.append(
                f"Why (makespan): pods waited {e['mean_pending_seconds']:.1f} s on average (default {m['mean_pending_seconds']:.1f} s) "
                f"and ran on nodes of different speed; {e['scale_ups']} nodes were booted for pending pods."
            )
    carbon = goals.get("carbon")
    if carbon is not None and not carbon["met"]:
        sites = {name: s.carbon.mean() for name, s in cluster.sites.items()}
        notes.append(
            f"Why (carbon): site intensities average {', '.join(f'{k} {v:.0f}' for k, v in sites.items())} gCO2e/kWh; "
            f"idle power of powered nodes in every site ({idle_share:.0%} of energy under `default`) is emitted wherever the pods go."
        )
    return notes


def execute(
    cluster: ClusterSpec,
    workload: Workload,
    opts: RunOptions,
    out: Path,
    *,
    attribution_cluster: ClusterSpec | None = None,
    attribution_workloads: Sequence[Workload] = (),
    sensitivity: bool = False,
    plots: bool = True,
    inputs: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    started = time.perf_counter()
    runs = run_policies(cluster, workload, opts, progress)
    compare = comparison(runs)
    goals = targets(compare, comparison(runs, "most-allocated"))
    pct = opts.percentage_of_nodes_to_score
    results: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "cluster": _cluster_summary(cluster),
        "workload": {
            "inputs": list(inputs),
            "traces": [t.name for t in workload.traces],
            "pods": len(workload.pods),
            "workflows": len(workload.workflows),
            "notes": workload.notes(),
        },
        "seed": opts.seed,
        "extender_weight": opts.extender_weight,
        "policy_config": policy_config_dict(opts.policy),
        "extender": describe_extender(opts),
        "percentage_of_nodes_to_score": pct,
        "percentage_label": "adaptive (0)" if pct == 0 else f"{pct} %",
        "policies": _metrics(runs),
        "comparison": compare,
        "targets": goals,
        "target_notes": target_notes(runs, compare, goals, cluster),
        "bound": bound_for_runs(cluster, workload, runs, seed=opts.seed),
        "deferral": deferral_comparison(runs),
    }
    if pct == 100 or cluster.node_count < 100:
        results["percentage_100"] = {
            "reason": (
                f"The cluster has {cluster.node_count} nodes, fewer than 100: kube-scheduler scores every feasible node with "
                "either setting, so the 100 % run is this run."
                if cluster.node_count < 100
                else "This run already scores 100 % of the nodes."
            )
        }
    else:
        runs100 = run_policies(
            cluster, workload, replace(opts, percentage_of_nodes_to_score=100, record_timeseries=False), progress
        )
        results["percentage_100"] = {
            "policies": _metrics(runs100),
            "comparison": comparison(runs100),
            "targets": targets(comparison(runs100), comparison(runs100, "most-allocated")),
        }
    results["sensitivity"] = {}
    if sensitivity and cluster.autoscaler.enabled:
        fixed = replace(cluster, autoscaler=replace(cluster.autoscaler, enabled=False))
        runs_fixed = run_policies(fixed, workload, replace(opts, record_timeseries=False), progress)
        cmp_fixed = comparison(runs_fixed)
        results["sensitivity"]["no_autoscaler"] = {
            "title": "every node powered all the time (autoscaler off)",
            "description": (
                "The same workload and policies with no node ever powered off. Placement then changes only the "
                "load-dependent part of each node's power; idle power is spent whatever the policy."
            ),
            "policies": _metrics(runs_fixed),
            "comparison": cmp_fixed,
            "targets": targets(cmp_fixed, comparison(runs_fixed, "most-allocated")),
            "bound": bound_for_runs(fixed, workload, runs_fixed, seed=opts.seed),
            "deferral": deferral_comparison(runs_fixed),
        }
    examples: dict[str, Any] = {}
    if attribution_workloads:
        ac = attribution_cluster or cluster
        progress("attribution", 0.0)
        att, examples = attribution_runs(ac, attribution_workloads, opts.seed)
        progress("attribution", 1.0)
        results["attribution"] = {
            "cluster": ac.name,
            "policy": "default",
            "intervals_seconds": list(INTERVALS),
            "phases": PHASES,
            "methods": list(METHODS),
            "workflows": att,
            "notes": [
                "counter_edges equals the truth by construction in the model: between task edges nothing changes. "
                "Its real-world error is the sensor's (RAPL covers package and DRAM, not the whole wall power).",
                "Node methods compare with the true energy of the nodes the workflow used over its window; each workflow "
                "ran alone, as in the published comparison.",
            ],
        }
    results["deadlines_missed"] = deadlines_missed(results)
    if extra:
        results.update(extra)
    results["wall_seconds"] = time.perf_counter() - started
    progress.done()
    written: list[str] = []
    if plots:
        written.append(str(report.plot_energy_carbon(out, results["policies"])))
        written.append(str(report.plot_cluster_power(out, runs)))
        written.append(str(report.plot_utilisation(out, runs)))
        if results.get("attribution"):
            written.append(str(report.plot_attribution(out, results["attribution"])))
            example = _pick_example(results["attribution"]["workflows"], examples)
            if example is not None:
                written.append(str(report.plot_scrape_example(out, example)))
    results["plots"] = [Path(p).name for p in written]
    report.write_results(out, results)
    (out / "report.md").write_text(report.markdown(results, written), encoding="utf-8")
    print(report.summary_text(results["policies"], compare))
    checked = [("", goals)] + [(f", {sens['title']}", sens["targets"]) for sens in results["sensitivity"].values() if sens.get("targets")]
    for title, each in checked:
        for name, goal in each.items():
            print(f"target {name}{title}: {goal['target']}: {'met' if goal['met'] else 'NOT met'} ({_savings(name, goal)})")
    for name, d in results["deferral"].items():
        print(
            f"deferral {name}: {d['carbon_saving_percent']:.1f} % less CO2e than {d['without']} "
            f"({d['carbon_avoided_grams']:.0f} g avoided), deadlines missed {d['deadlines_missed']}, "
            f"extra pending mean {d['extra_pending_mean_seconds'] / 3600:.2f} h, p95 {d['extra_pending_p95_seconds'] / 3600:.2f} h"
        )
    print(f"report: {out / 'report.md'}  (results.json, {len(written)} plots)", file=sys.stdout)
    return results


def deadlines_missed(results: Mapping[str, Any]) -> int:
    """Deferred units that finished after their deadline, over every run of the report."""
    runs = [results["policies"], *(s["policies"] for s in results.get("sensitivity", {}).values())]
    if "policies" in results.get("percentage_100", {}):
        runs.append(results["percentage_100"]["policies"])
    return sum(
        int(m["deferral"]["deadlines_missed"]) for policies in runs for m in policies.values() if m.get("deferral")
    )


def _savings(name: str, goal: Mapping[str, Any]) -> str:
    """A target's figures: the saving against ``default``, and against ``most-allocated`` where it ran."""
    said = f"{goal[f'{name}_saving_percent']:.1f} % less than default"
    packed = goal.get(f"{name}_saving_vs_most_allocated_percent")
    return said if packed is None else f"{said}, {packed:.1f} % less than most-allocated"


def _pick_example(workflows: Mapping[str, Mapping[str, Any]], examples: Mapping[str, Any]) -> Any:
    """The workflow where 30 s node sampling is furthest off (the most telling picture)."""
    if not workflows:
        return None
    worst = max(workflows, key=lambda n: abs(workflows[n]["methods"]["node_sum_over_time_30s"]["error_percent"]))
    return examples.get(worst)
