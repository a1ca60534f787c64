"""The published comparison of four ways to measure a Nextflow run, reproduced in the simulator.

    python bench/study_comparison.py            # the study's table beside the simulator's
    python bench/study_comparison.py --seed 3 --averaging 1,10,30

Thamm & Leser (arXiv 2505.09375v2, Tables 4 and 5) measured RNASeq, Quantms and Rangeland with a
shell-script wrapper, a Nextflow plug-in, start/stop tasks in the workflow, and Prometheus'
``node_hwmon_power_average_watt`` at 30 s scrapes. ``sim/attribution.py`` (``StudySetup``,
``study_comparison``) models each by the window it sees and the sensor it reads; the published
shapes run alone on the attribution cluster. The figures and what remains different are in
docs/sim.md ("The published comparison").
"""

from __future__ import annotations

import argparse
import dataclasses

from joulesched.sim.attribution import STUDY_PROMETHEUS_30S, StudySetup, study_rows, study_runs
from joulesched.sim.cluster import load_cluster
from joulesched.sim.demo import ATTRIBUTION_CLUSTER, attribution_workloads


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--averaging", default="1,10,30", help="the sensor's averaging intervals to show (s)")
    args = p.parse_args()
    cluster = load_cluster(ATTRIBUTION_CLUSTER)
    shapes = attribution_workloads(args.seed)[:3]
    for tau in (float(x) for x in args.averaging.split(",")):
        results = study_runs(cluster, shapes, args.seed, dataclasses.replace(StudySetup(), averaging_s=tau))
        print(f"\nsensor averaging interval {tau:g} s, scrapes every 30 s, seed {args.seed}")
        print("\n".join(study_rows(results)))
        print("\nthe study's own convention, (Prometheus − shell script) / Prometheus:")
        for name, res in results.items():
            key = next(k for k in STUDY_PROMETHEUS_30S if name.startswith(k))
            study = STUDY_PROMETHEUS_30S[key]
            mean = res["prometheus_difference_percent"]["mean"]  # type: ignore[index]
            sim = 100.0 * (1 - 1 / (1 + mean / 100.0))
            published = 100.0 * (study["prometheus"] - study["wrapper"]) / study["prometheus"]
            print(f"  {name}: study {published:+.2f} %, simulator {sim:+.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
