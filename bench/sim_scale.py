"""Scale benchmark of the simulator (a script, not a timed test).

    python bench/sim_scale.py                      # both scenarios, every policy
    python bench/sim_scale.py --scenario 1000 --policies default,energy
    python bench/sim_scale.py --percentage-100     # also score 100 % of the nodes

Scenarios (docs/benchmarks.md, "Simulator", has the figures and the goals):

* ``1000``: 100,000 independent pods on 1,000 nodes (goal: under 60 s per policy);
* ``5000``: 10,000 pods on 5,000 nodes (goal: under 30 s per policy).

The cluster is the shipped example's seven SPECpower node types in three grid regions, each
type's count multiplied (×50 → 1,000 nodes, ×250 → 5,000), every node always on. Pods are
synthetic (``sim.traces.synthetic.independent_pods``): Poisson arrivals for about 60 %
utilisation, exponential runtimes of mean 600 s, 0.5–4 core requests. Wall time counts the
engine's replay (reading the cluster and building the workload are printed apart).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from joulesched.sim.cluster import ClusterSpec, load_cluster  # noqa: E402
from joulesched.sim.model import Workload  # noqa: E402
from joulesched.sim.runner import POLICIES, RunOptions, comparison, run_policies  # noqa: E402
from joulesched.sim.traces.synthetic import independent_pods  # noqa: E402

SCENARIOS = {"1000": (50, 100_000, 60.0), "5000": (250, 10_000, 30.0)}  # multiplier, pods, goal seconds


def scaled_cluster(multiplier: int) -> ClusterSpec:
    base = load_cluster(ROOT / "sim" / "data" / "clusters" / "example.yaml")
    return replace(
        base,
        name=f"{base.name}-x{multiplier}",
        node_types=tuple(replace(t, count=t.count * multiplier) for t in base.node_types),
        autoscaler=replace(base.autoscaler, enabled=False),
    )


def run(scenario: str, policies: tuple[str, ...], percentage: int, seed: int) -> list[dict[str, object]]:
    multiplier, pods, goal = SCENARIOS[scenario]
    t0 = time.perf_counter()
    cluster = scaled_cluster(multiplier)
    cores = sum(t.cores * t.count for t in cluster.node_types)
    workload = Workload.of([independent_pods(pods, cluster_cores=cores, utilisation=0.6, mean_duration=600.0, seed=seed)])
    setup = time.perf_counter() - t0
    rows = []
    opts = RunOptions(policies=policies, seed=seed, percentage_of_nodes_to_score=percentage, record_timeseries=False)
    runs = run_policies(cluster, workload, opts)
    cmp = comparison(runs) if "default" in runs else {}
    for name, r in runs.items():
        m = r.metrics
        rows.append(
            {
                "scenario": f"{pods:,} pods on {cluster.node_count:,} nodes",
                "policy": name,
                "percentage_of_nodes_to_score": percentage,
                "wall_seconds": round(r.result.wall_seconds, 2),
                "goal_seconds": goal,
                "within_goal": r.result.wall_seconds < goal,
                "setup_seconds": round(setup, 2),
                "pods_per_second": round(pods / r.result.wall_seconds),
                "extender_candidates_mean": m["extender_candidates_mean"],
                "energy_kwh": round(m["energy_kwh"], 1),
                "carbon_kg": round(m["carbon_kg"], 1),
                "energy_saving_percent": round(cmp[name]["energy_saving_percent"], 2) if cmp else None,
                "carbon_saving_percent": round(cmp[name]["carbon_saving_percent"], 2) if cmp else None,
                "makespan_change_percent": round(cmp[name]["makespan_change_percent"], 2) if cmp else None,
                "mean_pending_seconds": round(m["mean_pending_seconds"], 2),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--percentage-100", action="store_true", help="also run with percentageOfNodesToScore 100")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args(argv)
    policies = tuple(x.strip() for x in args.policies.split(",") if x.strip())
    scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.processor() or 'unknown CPU'}")
    rows = []
    for scenario in scenarios:
        for percentage in (0, 100) if args.percentage_100 else (0,):
            for row in run(scenario, policies, percentage, args.seed):
                rows.append(row)
                print(
                    f"{row['scenario']:<28} {row['policy']:<15} pct={row['percentage_of_nodes_to_score']:<3} "
                    f"{row['wall_seconds']:>7.2f} s (goal {row['goal_seconds']:g} s) {row['pods_per_second']:>6} pods/s "
                    f"energy {row['energy_saving_percent']}% carbon {row['carbon_saving_percent']}% "
                    f"makespan {row['makespan_change_percent']}% extender saw {row['extender_candidates_mean']}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0 if all(r["within_goal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
