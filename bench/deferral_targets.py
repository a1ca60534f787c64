"""Carbon-aware deferral against placement alone, measured on a week of nf-core workflows (a script, not a test).

    python bench/deferral_targets.py                    # every cluster, week and autoscaler setting
    python bench/deferral_targets.py --quick            # one week, the two-site cluster, autoscaler on
    python bench/deferral_targets.py --clusters caiso+miso --weeks 2022-07-11

The workload: the 11 nf-core WfFormat executions of ``../shared/data/workflows/nextflow``, one
submission every ``--every-hours`` (2 h) through 7 days, each at a seeded random moment of its
slot, cycling through the workflows in a seeded random order; every run deferrable with a
``--deadline-hours`` (12 h) deadline (done within 12 h of its submission).

Clusters, all from the example cluster's node types (``sim/data/clusters/example.yaml``), with the
CAISO and MISO 2022 hourly series of ``../shared/data/carbon/hourly-us-2022``:

* ``caiso+miso``: the example, its BPA hydro nodes moved to the CAISO site: two sites;
* ``caiso``, ``miso``: every node at the one site (deferral alone, no choice of site).

Weeks (``--weeks``, Mondays 00:00 UTC): one per season, so the figure is not one lucky week.
Each case runs ``default``, ``most-allocated``, ``energy``, ``carbon``, each without deferral and
with deferral under the ``perfect``, ``persistence`` and ``day-ahead`` forecasts (16 runs over
one common window), with the autoscaler on and off.

Targets: ``carbon+defer:perfect`` ≥ 20 % less CO2e than ``carbon``; what the
realistic forecasts keep of that saving; 0 deadlines missed; the extra pending time (mean,
p95). Also each policy against itself without deferral, and ``carbon+defer`` against
``default`` and ``most-allocated``. ``potential`` is what the series allow: the mean, over the
week's hours, of 1 − (cleanest hour within the next 12 h ÷ this hour), on the pointwise lowest
of the cluster's sites — the saving of a one-hour job moved to the cleanest hour of its window.
CO2e is energy × the mean intensity it was drawn at, and deferral can change both: the summary
splits the saving into the energy change (workflows released in the same clean hour share the
nodes the autoscaler boots) and the change of g/kWh; with the autoscaler off, idle power is the
same for every policy and ``above idle`` is the CO2e of the rest, the work's own.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from joulesched.policy.deferral import LowestOf  # noqa: E402
from joulesched.policy.forecast import FORECASTS  # noqa: E402
from joulesched.policy.units import JOULES_PER_KWH  # noqa: E402
from joulesched.sim.cluster import ClusterSpec, parse_cluster  # noqa: E402
from joulesched.sim.demo import EXAMPLE_CLUSTER  # noqa: E402
from joulesched.sim.model import Trace, Workload  # noqa: E402
from joulesched.sim.runner import POLICIES, RunOptions, deferral_comparison, run_policies  # noqa: E402
from joulesched.sim.traces import read_wfformat  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
HOUR = 3600.0
DAY = 86400.0
WEEKS = ("2022-01-10", "2022-04-11", "2022-07-11", "2022-10-10")
CLUSTERS = ("caiso+miso", "caiso", "miso")
TARGET_PERCENT = 20.0
SERIES = {"ciso-mixed": "eia_2022_CISO_hourly.csv", "miso-coal": "eia_2022_MISO_hourly.csv"}


def cluster_doc(kind: str, week: str, data: Path) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE_CLUSTER.read_text(encoding="utf-8"))
    keep = {"caiso+miso": ("ciso-mixed", "miso-coal"), "caiso": ("ciso-mixed",), "miso": ("miso-coal",)}[kind]
    sites = {}
    for name in keep:
        site = dict(doc["sites"][name])
        site["carbon_series"] = {"file": str(data / "carbon" / "hourly-us-2022" / SERIES[name]), "column": "avg_CI"}
        sites[name] = site
    for nt in doc["node_types"]:
        if nt["site"] not in keep:
            nt["site"] = keep[0]
    doc.update(name=f"example-{kind}", start=f"{week}T00:00:00Z", sites=sites)
    return doc


def with_autoscaler(cluster: ClusterSpec, on: bool) -> ClusterSpec:
    return replace(cluster, autoscaler=replace(cluster.autoscaler, enabled=on))


def week_workload(traces: Sequence[Trace], every: float, deadline: float, seed: int, days: float = 7.0) -> Workload:
    """One submission every ``every`` seconds through ``days``, at a random moment of its slot."""
    rng = np.random.default_rng(seed)
    slots = int(days * DAY // every)
    order = rng.permutation(np.resize(np.arange(len(traces)), slots))
    moments = np.arange(slots) * every + rng.uniform(0.0, every, size=slots)
    out = []
    for k, (which, at) in enumerate(zip(order.tolist(), moments.tolist(), strict=True)):
        trace = traces[which]
        first = min(p.arrival for p in trace.pods)
        out.append(trace.shifted(at - first, f"#{k + 1}").deferrable(deadline))
    return Workload.of(out)


def potential(cluster: ClusterSpec, window: float, days: float = 7.0) -> dict[str, float]:
    """How much the (lowest-of-sites) series varies within ``window``: see the module docstring."""
    low = LowestOf(tuple(s.carbon.source for s in cluster.sites.values()))
    n = int(days * 24)
    series = low.as_series(0.0, days * DAY + window)
    hourly = series.values.reshape(-1, int(HOUR // low.resolution)).mean(axis=1)
    now = hourly[:n]
    span = max(1, int(window // HOUR))  # a one-hour job may start up to window - 1 h later
    best = np.array([hourly[k : k + span].min() for k in range(n)])
    ratio = np.max(now.reshape(-1, 24), axis=1) / np.min(now.reshape(-1, 24), axis=1)
    return {
        "mean_g_per_kwh": float(now.mean()),
        "potential_percent": float(100.0 * np.mean(1.0 - best / now)),
        "daily_max_over_min_mean": float(ratio.mean()),
    }


def idle_carbon_grams(cluster: ClusterSpec, window: float) -> float:
    """CO2e of every node's idle power over ``[0, window]``: what an always-on cluster emits
    whatever runs on it (the same for every policy), so the rest is the work's own."""
    total = 0.0
    for n in cluster.nodes():
        nt = cluster.node_types[n.type_index]
        site = cluster.sites[n.site]
        idle = nt.power_curve_watts[0] + nt.gpus.idle_watts * nt.gpus.count
        total += idle * site.pue * site.carbon.integral(0.0, window)
    return total / JOULES_PER_KWH


def policies() -> tuple[str, ...]:
    return POLICIES + tuple(f"{p}+defer:{f}" for p in POLICIES for f in FORECASTS)


def run_case(cluster: ClusterSpec, workload: Workload, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    runs = run_policies(cluster, workload, RunOptions(policies=policies(), seed=seed, record_timeseries=False))
    versus = deferral_comparison(runs)
    out: dict[str, Any] = {"policies": {}, "versus_undeferred": versus}
    for name, run in runs.items():
        m = run.metrics
        d = m["deferral"]
        out["policies"][name] = {
            "carbon_grams": m["carbon_grams"],
            "energy_joules": m["energy_joules"],
            "node_hours": m["node_hours"],
            "pods": m["pods"],
            "unscheduled": m["unscheduled"],
            "mean_pending_seconds": m["mean_pending_seconds"],
            "deferral": {k: v for k, v in d.items() if k != "missed_units"} | {"missed_units": d["missed_units"]}
            if d
            else None,
        }
    c = out["policies"]
    if not cluster.autoscaler.enabled:  # always on: idle emissions are the same for every policy
        window = next(iter(runs.values())).metrics["window_seconds"]
        idle = idle_carbon_grams(cluster, window)
        out["idle_carbon_grams"] = idle
        for p in c.values():
            p["carbon_above_idle_grams"] = p["carbon_grams"] - idle
        above = c["carbon"]["carbon_above_idle_grams"]
        out["above_idle_vs_placement_percent"] = {
            f: 100.0 * (1 - c[f"carbon+defer:{f}"]["carbon_above_idle_grams"] / above) for f in FORECASTS
        }
    base = c["carbon"]["carbon_grams"]
    perfect = c["carbon+defer:perfect"]["carbon_grams"]
    out["carbon_vs_placement_percent"] = {
        f: 100.0 * (1 - c[f"carbon+defer:{f}"]["carbon_grams"] / base) for f in FORECASTS
    }
    # CO2e = energy × the mean intensity it was drawn at: which of the two deferral changed
    per_kwh = base / c["carbon"]["energy_joules"]
    out["energy_vs_placement_percent"] = {
        f: 100.0 * (c[f"carbon+defer:{f}"]["energy_joules"] / c["carbon"]["energy_joules"] - 1) for f in FORECASTS
    }
    out["intensity_vs_placement_percent"] = {
        f: 100.0 * (1 - c[f"carbon+defer:{f}"]["carbon_grams"] / c[f"carbon+defer:{f}"]["energy_joules"] / per_kwh)
        for f in FORECASTS
    }
    gain = base - perfect
    out["kept_of_perfect"] = {
        f: (base - c[f"carbon+defer:{f}"]["carbon_grams"]) / gain if gain > 0 else None for f in FORECASTS
    }
    out["carbon_defer_vs"] = {
        ref: {f: 100.0 * (1 - c[f"carbon+defer:{f}"]["carbon_grams"] / c[ref]["carbon_grams"]) for f in FORECASTS}
        for ref in ("default", "most-allocated")
    }
    out["deadlines_missed"] = sum(p["deferral"]["deadlines_missed"] for p in c.values() if p["deferral"])
    out["target_met"] = out["carbon_vs_placement_percent"]["perfect"] >= TARGET_PERCENT and out["deadlines_missed"] == 0
    out["wall_seconds"] = time.perf_counter() - started
    return out


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)


def print_case(log: Log, title: str, case: dict[str, Any], pot: dict[str, float]) -> None:
    log(f"\n## {title} ({case['wall_seconds']:.0f} s)")
    log(
        f"series (lowest of sites): mean {pot['mean_g_per_kwh']:.0f} g/kWh, daily max/min {pot['daily_max_over_min_mean']:.2f}, "
        f"potential within the deadline {pot['potential_percent']:.1f} %"
    )
    head = f"{'policy':<30} {'CO2e kg':>9} {'kWh':>8} {'vs undeferred %':>15} {'held':>7} {'extra mean h':>12} {'p95 h':>6} {'missed':>6}"
    log(head)
    log("-" * len(head))
    for name, p in case["policies"].items():
        v = case["versus_undeferred"].get(name)
        d = p["deferral"]
        log(
            f"{name:<30} {p['carbon_grams'] / 1000:>9.3f} {p['energy_joules'] / 3.6e6:>8.2f} "
            f"{(-v['carbon_saving_percent'] if v else 0.0):>+15.1f} "
            f"{(str(d['held_units']) + '/' + str(d['units'])) if d else '':>7} "
            f"{(d['extra_pending_mean_seconds'] / 3600 if d else 0):>12.2f} {(d['extra_pending_p95_seconds'] / 3600 if d else 0):>6.2f} "
            f"{(d['deadlines_missed'] if d else 0):>6}"
        )
    cv = case["carbon_vs_placement_percent"]
    kept = case["kept_of_perfect"]
    log(
        f"carbon+defer vs carbon: perfect {cv['perfect']:.1f} % less CO2e (target >= {TARGET_PERCENT:g} %: "
        f"{'met' if case['target_met'] else 'MISSED'}); persistence {cv['persistence']:.1f} % "
        f"(keeps {_share(kept['persistence'])}), day-ahead {cv['day-ahead']:.1f} % (keeps {_share(kept['day-ahead'])})"
    )
    if "above_idle_vs_placement_percent" in case:
        ai = case["above_idle_vs_placement_percent"]
        log(
            f"always on: idle power emits {case['idle_carbon_grams'] / 1000:.3f} kg whatever the policy; above it, "
            f"carbon+defer vs carbon: " + ", ".join(f"{f} {v:.1f} %" for f, v in ai.items()) + " less CO2e"
        )
    log(
        "of which energy (node-hours) "
        + ", ".join(f"{f} {v:+.1f} %" for f, v in case["energy_vs_placement_percent"].items())
        + "; mean intensity of that energy "
        + ", ".join(f"{f} {-v:+.1f} %" for f, v in case["intensity_vs_placement_percent"].items())
    )
    for ref, by in case["carbon_defer_vs"].items():
        log(f"carbon+defer vs {ref}: " + ", ".join(f"{f} {v:.1f} %" for f, v in by.items()))
    log(f"deadlines missed: {case['deadlines_missed']}")


def _above(case: dict[str, Any]) -> str:
    ai = case.get("above_idle_vs_placement_percent")
    return "–" if ai is None else f"{ai['perfect']:.1f}"


def _share(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help="the shared data folder (default ../shared/data)")
    ap.add_argument("--clusters", default=",".join(CLUSTERS), help=f"comma-separated from {', '.join(CLUSTERS)}")
    ap.add_argument("--weeks", default=",".join(WEEKS), help="Mondays (YYYY-MM-DD) the weeks start on")
    ap.add_argument("--autoscaler", choices=("on", "off", "both"), default="both")
    ap.add_argument("--every-hours", type=float, default=2.0, help="one workflow submission per slot this long (2)")
    ap.add_argument("--deadline-hours", type=float, default=12.0, help="done within this long of submission (12)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="caiso+miso, the July week, autoscaler on")
    ap.add_argument("--out", type=Path, default=None,
                    help="where the figures go (default: bench/results/deferral-targets.json for the recorded study, "
                    "every option at its default; any other run, --quick included, writes to the temporary folder, "
                    "never over the recorded figures)")
    args = ap.parse_args(argv)
    if args.out is None:
        recorded = all(getattr(args, action.dest) == action.default for action in ap._actions if action.dest != "help")
        args.out = (ROOT / "bench" / "results" if recorded else Path(tempfile.gettempdir())) / "deferral-targets.json"
    if args.quick:
        args.weeks, args.autoscaler = "2022-07-11", "on"
        args.clusters = "caiso+miso" if args.clusters == ",".join(CLUSTERS) else args.clusters
    clusters = [c.strip() for c in args.clusters.split(",") if c.strip()]
    wrong = [c for c in clusters if c not in CLUSTERS]
    if wrong:
        raise SystemExit(f"deferral_targets: unknown cluster {wrong[0]!r} (known: {', '.join(CLUSTERS)})")
    weeks = [w.strip() for w in args.weeks.split(",") if w.strip()]
    settings = {"on": (True,), "off": (False,), "both": (True, False)}[args.autoscaler]
    traces = [read_wfformat(p) for p in sorted((args.data / "workflows" / "nextflow").glob("*.json"))]
    workload = week_workload(traces, args.every_hours * HOUR, args.deadline_hours * HOUR, args.seed)
    log = Log()
    started = time.perf_counter()
    results: dict[str, Any] = {
        "format": "joulesched-deferral-targets",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "argv": list(argv if argv is not None else sys.argv[1:]),
        "python": platform.python_version(),
        "seed": args.seed,
        "workload": {
            "traces": [t.name for t in traces],
            "submissions": len(workload.workflows),
            "pods": len(workload.pods),
            "every_hours": args.every_hours,
            "deadline_hours": args.deadline_hours,
        },
        "cases": {},
    }
    log(
        f"{len(workload.workflows)} workflow runs ({len(workload.pods):,} pods) of {len(traces)} nf-core traces, one per "
        f"{args.every_hours:g} h through 7 days, deadline {args.deadline_hours:g} h"
    )
    summary = []
    for kind in clusters:
        for week in weeks:
            base = parse_cluster(
                cluster_doc(kind, week, args.data), f"{kind} {week} (generated)", base_dir=EXAMPLE_CLUSTER.parent
            )
            pot = potential(base, args.deadline_hours * HOUR)
            for on in settings:
                cluster = with_autoscaler(base, on)
                case = run_case(cluster, workload, args.seed)
                case["potential"] = pot
                key = f"{kind}/{week}/autoscaler-{'on' if on else 'off'}"
                results["cases"][key] = case
                print_case(log, key, case, pot)
                summary.append((key, case))
    results["wall_seconds"] = time.perf_counter() - started
    log("\n## Summary: carbon+defer against carbon (placement only)")
    log(
        f"{'case':<42} {'perfect %':>9} {'persist. %':>10} {'day-ahead %':>11} {'kept P/DA':>11} {'energy %':>8} "
        f"{'g/kWh %':>7} {'above idle %':>12} {'potential %':>11} {'missed':>6} {'extra mean/p95 h':>16}"
    )
    for key, case in summary:
        cv, kept = case["carbon_vs_placement_percent"], case["kept_of_perfect"]
        d = case["policies"]["carbon+defer:perfect"]["deferral"]
        log(
            f"{key:<42} {cv['perfect']:>9.1f} {cv['persistence']:>10.1f} {cv['day-ahead']:>11.1f} "
            f"{_share(kept['persistence']) + '/' + _share(kept['day-ahead']):>11} "
            f"{case['energy_vs_placement_percent']['perfect']:>+8.1f} {-case['intensity_vs_placement_percent']['perfect']:>+7.1f} "
            f"{_above(case):>12} {case['potential']['potential_percent']:>11.1f} "
            f"{case['deadlines_missed']:>6} {d['extra_pending_mean_seconds'] / 3600:>7.2f}/{d['extra_pending_p95_seconds'] / 3600:.2f}"
        )
    missed = sum(c["deadlines_missed"] for _, c in summary)
    met = sum(1 for _, c in summary if c["target_met"])
    log(
        f"target (>= {TARGET_PERCENT:g} % with a perfect forecast, 0 deadlines missed): met in {met}/{len(summary)} cases; deadlines missed in all: {missed}"
    )
    log(f"{results['wall_seconds']:.0f} s; figures in {args.out}")
    results["deadlines_missed"] = missed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    args.out.with_suffix(".txt").write_text("\n".join(log.lines) + "\n", encoding="utf-8")
    if missed:
        print(f"deferral_targets: DEADLINES MISSED: {missed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
