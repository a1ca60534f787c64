"""Where a policy keeps nodes powered on the openb cluster: node-hours, pods and nodes by node type.

    python bench/openb_node_hours.py                      # seed 0, autoscaler on
    python bench/openb_node_hours.py --runs all:energy+most-allocated,best:energy --top 5

Each run is ``FILTER_KEEPS:POLICY`` (``policy.filter_keeps`` of the extender, and a policy of
``joulesched sim``), replayed on the scenario ``bench/policy_targets.py`` calls openb (every
10th pod of the openb pod list on the cluster scaled by the same factor). It explains the
openb rows of docs/sim.md, "Keeping the best node".
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import policy_targets as pt

from joulesched.policy.config import FILTER_KEEPS, PolicyConfig
from joulesched.sim.cluster import parse_cluster
from joulesched.sim.demo import EXAMPLE_CLUSTER
from joulesched.sim.errors import SimError
from joulesched.sim.runner import DEFAULT_EXTENDER_WEIGHT, RunOptions, check_policies, run_policies

DEFAULT_RUNS = "all:energy+most-allocated,best:energy,all:energy"


def parse_runs(text: str) -> list[tuple[str, str]]:
    runs = []
    for item in text.split(","):
        keeps, sep, policy = item.strip().partition(":")
        if not sep or keeps not in FILTER_KEEPS:
            raise SystemExit(
                f"--runs: {item!r}: give FILTER_KEEPS:POLICY, FILTER_KEEPS one of {', '.join(FILTER_KEEPS)}"
            )
        try:
            check_policies([policy])
        except SimError as e:
            raise SystemExit(f"--runs: {item!r}: {e}") from None
        runs.append((keeps, policy))
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--runs", default=DEFAULT_RUNS, help=f"comma-separated FILTER_KEEPS:POLICY (default {DEFAULT_RUNS})"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=10, help="keep every N-th openb pod and 1/N of the nodes (10)")
    ap.add_argument("--autoscaler", choices=("on", "off"), default="on")
    ap.add_argument("--top", type=int, default=6, help="node types listed per run, most node-hours first (6)")
    ap.add_argument("--data", type=Path, default=pt.DATA)
    args = ap.parse_args(argv)
    runs = parse_runs(args.runs)

    spec = parse_cluster(pt.openb_cluster(args.data, args.every), "openb (generated)", base_dir=EXAMPLE_CLUSTER.parent)
    cluster = pt.with_autoscaler(spec, args.autoscaler == "on")
    workload = pt.openb_workload(args.data, args.every)
    print(
        f"# python bench/openb_node_hours.py --runs {args.runs} --seed {args.seed} --every {args.every} --autoscaler {args.autoscaler}"
    )
    print(f"# {len(workload.pods):,} pods on {cluster.node_count} nodes")
    for keeps, policy in runs:
        opts = RunOptions(
            policies=(policy,),
            seed=args.seed,
            record_timeseries=False,
            extender_weight=DEFAULT_EXTENDER_WEIGHT,
            policy=PolicyConfig(filter_keeps=keeps),
        )
        run = run_policies(cluster, workload, opts)[policy]
        r, m = run.result, run.metrics
        ran = ~np.isnan(r.pods.start)
        pods = np.bincount(r.pods.node[ran].astype(int), minlength=len(r.nodes))
        by_type: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for i, node in enumerate(r.nodes):
            row = by_type[cluster.node_types[node.type_index].name]
            row[0] += r.on_seconds[i] / 3600
            row[1] += pods[i]
            row[2] += 1
        print(
            f"\nfilter_keeps {keeps}, {policy}: {m['energy_joules'] / 3.6e6:,.0f} kWh, {m['node_hours']:,.0f} node-hours, "
            f"{m['scale_ups']} scale-ups, mean pending {m['mean_pending_seconds']:,.0f} s"
        )
        print(f"    {'node type':40s} {'nodes':>5s} {'node-hours':>10s} {'pods':>5s}")
        for name, (hours, n_pods, n_nodes) in sorted(by_type.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"    {name:40s} {n_nodes:5.0f} {hours:10,.0f} {n_pods:5.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
