"""Where the two CPUs go a scheduled pod, contender by contender, in bench/sched_throughput.py runs.

On a machine whose CPUs the bursts keep busy, pods/s is about the CPUs over what every process
spends a pod: the extender, kube-scheduler, kube-apiserver and etcd. For each run and node
count this prints those four (medians over the rounds, ms of CPU a pod) for the floor and
each other contender, the pods/s ratio they predict (floor's total ÷ contender's total)
beside the one measured (median of the round-by-round ratios), and the ratio the contender
would reach if its extender cost what the floor's does and the rest stayed as measured: what
kube-scheduler and the control plane spend on that contender's pods apart from the extender
itself. Not a timed test.

    python bench/cpu_budget.py bench/results/sched-throughput-two-of-the-same-2026-12-06.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from typing import Any


def per_pod(bursts: Sequence[dict[str, Any]], key: str) -> float:
    return statistics.median(1000 * (b[key] or 0.0) / b["scheduled"] for b in bursts)


def budget(results: Sequence[dict[str, Any]], floor: str) -> list[str]:
    lines = [
        f"| nodes | qps | percentageOfNodesToScore | contender | extender | kube-scheduler | kube-apiserver + etcd | total ms a pod | pods/s ÷ {floor}: by CPU | measured | with {floor}'s extender CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    configs = sorted({(r["nodes"], r["qps"], str(r["percentage"])) for r in results})
    for config in configs:
        nodes, qps, percentage = config
        here = [
            r
            for r in results
            if (r["nodes"], r["qps"], str(r["percentage"])) == config
            and r["scheduled"]
            and r["extender_cpu_s"] is not None
        ]
        parts = {}
        for contender in dict.fromkeys(r["contender"] for r in here):
            mine = [r for r in here if r["contender"] == contender]
            parts[contender] = (
                per_pod(mine, "extender_cpu_s"),
                per_pod(mine, "scheduler_cpu_s"),
                per_pod(mine, "apiserver_cpu_s") + per_pod(mine, "etcd_cpu_s"),
            )
        if floor not in parts:
            continue
        floor_rates = {r["round"]: r["pods_per_s"] for r in here if r["contender"] == floor}
        floor_total = sum(parts[floor])
        for contender, (ext, sched, control) in parts.items():
            total = ext + sched + control
            row = f"| {nodes} | {qps} | {percentage} | {contender} | {ext:.2f} | {sched:.2f} | {control:.2f} | {total:.2f} |"
            if contender == floor:
                lines.append(row + " – | – | – |")
                continue
            measured = [
                r["pods_per_s"] / floor_rates[r["round"]]
                for r in here
                if r["contender"] == contender and floor_rates.get(r["round"])
            ]
            lightened = floor_total / (total - ext + parts[floor][0])
            lines.append(
                row + f" {floor_total / total:.2f} | {statistics.median(measured):.2f} | {lightened:.2f} |"
                if measured
                else row + f" {floor_total / total:.2f} | – | {lightened:.2f} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="OUT.json files of bench/sched_throughput.py")
    p.add_argument("--floor", default="const", help="the contender the others are compared with (default: const)")
    args = p.parse_args(argv)
    for path in args.runs:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
        print(f"## {path}\n# {run['command']}\n")
        print("\n".join(budget(run["results"], args.floor)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
