"""The policy targets against bin-packing, measured on every shipped workload (a script, not a test).

    python bench/policy_targets.py                       # every scenario (see docs/sim.md for the runtime)
    python bench/policy_targets.py --quick               # a small subset of each, for a quick look
    python bench/policy_targets.py --scenarios nf-core,load
    python bench/policy_targets.py --write-openb-cluster sim/data/clusters/openb.yaml

Scenarios (docs/sim.md, "Targets against bin-packing", has the figures):

* ``nf-core``: the 11 nf-core WfFormat executions, each submitted ``--copies`` times at seeded
  random moments over 2 h (as ``joulesched sim demo`` does), on the example cluster;
* ``pegasus:<name>`` (3) and ``makeflow:<name>`` (2): each WfFormat execution submitted the same
  way, alone, on the example cluster;
* ``openb``: every ``--openb-every``-th pod of the Alibaba openb pod list on the openb cluster
  scaled by the same factor (``openb_cluster``, below);
* ``load``: synthetic independent pods (``sim generate pods``) at 30, 60 and 85 % requested load
  on the example cluster with the autoscaler off.

Every workload scenario runs the six policies with the autoscaler on and off. Targets checked
(the targets', "on every workload … with the autoscaler on and off"):

* ``energy``: energy ≤ ``most-allocated``'s and ≤ ``energy+most-allocated``'s, makespan ≤ +5 %
  of ``default``'s;
* ``carbon``: CO2e ≤ ``most-allocated``'s and ≤ ``carbon+most-allocated``'s, makespan ≤ +5 %;
* ``load``: ``energy`` reaches ≥ 90 % of the request-aware bound's saving (``sim/bound.py``).
"""

from __future__ import annotations

import argparse
import json
import math
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

from joulesched.policy.config import FILTER_KEEPS as FILTER_KEEPS_CHOICES  # noqa: E402
from joulesched.policy.config import PolicyConfig  # noqa: E402
from joulesched.sim.bound import bound_for_runs  # noqa: E402
from joulesched.sim.cluster import ClusterSpec, load_cluster, parse_cluster  # noqa: E402
from joulesched.sim.demo import EXAMPLE_CLUSTER  # noqa: E402
from joulesched.sim.model import Trace, Workload  # noqa: E402
from joulesched.sim.runner import DEFAULT_EXTENDER_WEIGHT, POLICIES, VARIANTS, RunOptions, comparison, run_policies  # noqa: E402
from joulesched.sim.traces import read_openb_nodes, read_openb_pods, read_wfformat  # noqa: E402
from joulesched.sim.traces.synthetic import independent_pods  # noqa: E402

ALL_POLICIES = POLICIES + VARIANTS
DATA = ROOT.parent / "shared" / "data"
LOADS = (0.30, 0.60, 0.85)
MAKESPAN_LIMIT_PERCENT = 5.0
BOUND_SHARE_TARGET = 0.90
WINDOW_SECONDS = 2 * 3600.0
MIB = 1024.0**2

# Host CPU curves for the openb node models: SPECpower_ssj2008 results of the example cluster,
# scaled to the node's logical CPUs (idle and dynamic watts both in proportion). Chosen by the
# generation of hardware the GPU model shipped with; CPU-only nodes get a recent 2-socket Xeon.
OPENB_HOST = {
    "": "xeon-8380-2s",
    "G2": "epyc-7763-2s",
    "G3": "epyc-7763-2s",
    "T4": "gold-6252-1s",
    "P100": "xeon-8176-1s",
    "V100M16": "xeon-8176-1s",
    "V100M32": "xeon-8380-2s",
}
# Per-GPU idle and board power (W): vendor TDPs (T4 70 W, P100 PCIe 250 W, V100 PCIe 250 W /
# SXM2 300 W); idle ≈ 10–15 % of TDP. G2 and G3 are Alibaba's own labels of unnamed models:
# taken as a 300 W and a 400 W class board.
OPENB_GPU = {
    "T4": (10.0, 70.0),
    "P100": (30.0, 250.0),
    "V100M16": (35.0, 300.0),
    "V100M32": (35.0, 300.0),
    "G2": (35.0, 300.0),
    "G3": (50.0, 400.0),
}
OPENB_SITES = ("bpat-hydro", "ciso-mixed", "miso-coal")


# -- workloads -----------------------------------------------------------------------------------


def submitted(traces: Sequence[Trace], copies: int, seed: int, window: float = WINDOW_SECONDS) -> Workload:
    """Each trace ``copies`` times at uniform random moments in ``window`` (the demo's scheme)."""
    rng = np.random.default_rng(seed)
    out = []
    for trace in traces:
        for k, offset in enumerate(np.sort(rng.uniform(0.0, window, size=copies))):
            out.append(trace.shifted(float(offset), f"#{k + 1}"))
    out.sort(key=lambda t: min(p.arrival for p in t.pods))
    return Workload.of(out)


def openb_cluster(data: Path, every: int) -> dict[str, Any]:
    """The openb node list as a cluster spec, every node shape's count divided by ``every`` (rounded up)."""
    example = load_cluster(EXAMPLE_CLUSTER)
    ref = {nt.name: nt for nt in example.node_types}
    shapes: dict[tuple[float, float, int, str], int] = {}
    for n in read_openb_nodes(data / "pods" / "openb_node_list_all_node.csv"):
        key = (n.cpu_cores, n.memory_bytes, n.gpus, n.gpu_model)
        shapes[key] = shapes.get(key, 0) + 1
    types = []
    for k, ((cores, memory, gpus, model), count) in enumerate(sorted(shapes.items(), key=lambda kv: -kv[1])):
        host = ref[OPENB_HOST.get(model, "xeon-8380-2s")]
        factor = cores / host.cores
        entry: dict[str, Any] = {
            "name": f"{(model or 'cpu').lower()}-{int(cores)}c-{int(memory / MIB / 1024)}g-{gpus}gpu",
            "count": math.ceil(count / every),
            "site": OPENB_SITES[k % len(OPENB_SITES)],
            "cores": cores,
            "memory": f"{int(memory / MIB)}Mi",
            "power_curve_watts": [round(w * factor, 1) for w in host.power_curve_watts],
            "speed": 1.0,
            "source": f"openb node list: {count} nodes (÷{every}); host curve {host.name} × {factor:.3g}",
        }
        if gpus:
            idle, peak = OPENB_GPU.get(model, (35.0, 300.0))
            entry["gpus"] = {"count": gpus, "idle_watts": idle, "max_watts": peak, "speed": 1.0, "model": model}
        types.append(entry)
    sites = {
        "bpat-hydro": {"pue": 1.10, "wue": 0.30, "carbon_series": {"file": "../carbon/eia_2022_BPAT_hourly.csv", "column": "avg_CI"}},
        "ciso-mixed": {"pue": 1.18, "wue": 0.30, "carbon_series": {"file": "../carbon/eia_2022_CISO_hourly.csv", "column": "avg_CI"}},
        "miso-coal": {"pue": 1.58, "wue": 1.8, "carbon_series": {"file": "../carbon/eia_2022_MISO_hourly.csv", "column": "avg_CI"}},
    }
    return {
        "name": f"openb-scaled-1-in-{every}",
        "start": "2022-06-01T00:00:00Z",
        "sites": sites,
        "node_types": types,
        "autoscaler": {"enabled": True, "scale_down_unneeded_seconds": 600, "scale_up_delay_seconds": 120, "expander": "random"},
    }


def write_openb_cluster(path: Path, data: Path, every: int) -> None:
    import yaml

    doc = openb_cluster(data, every)
    header = (
        "# The Alibaba openb GPU cluster (openb_node_list_all_node.csv), every node shape's count divided by\n"
        f"# {every} (rounded up), written by bench/policy_targets.py --write-openb-cluster.\n"
        "# Host CPU curves: SPECpower results of the example cluster scaled to the node's logical CPUs;\n"
        "# GPU idle/max watts from vendor TDPs (G2, G3: unnamed models, assumed 300 W / 400 W class).\n"
        "# Speed 1.0 everywhere: the trace's runtimes were measured on these nodes. Sites: the example's three.\n"
    )
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=200), encoding="utf-8")


def openb_workload(data: Path, every: int) -> Workload:
    trace = read_openb_pods(data / "pods" / "openb_pod_list_default.csv")
    pods = trace.pods[::every]
    first = min(p.arrival for p in pods)
    return Workload.of([replace(trace, pods=tuple(replace(p, arrival=p.arrival - first) for p in pods))])


def with_autoscaler(cluster: ClusterSpec, on: bool) -> ClusterSpec:
    return replace(cluster, autoscaler=replace(cluster.autoscaler, enabled=on))


# -- runs and checks -----------------------------------------------------------------------------


EXTENDER_WEIGHT = DEFAULT_EXTENDER_WEIGHT  # --extender-weight
FILTER_KEEPS = "all"  # --filter-keeps


def run_case(cluster: ClusterSpec, workload: Workload, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    opts = RunOptions(
        policies=ALL_POLICIES, seed=seed, record_timeseries=False, extender_weight=EXTENDER_WEIGHT,
        policy=PolicyConfig(filter_keeps=FILTER_KEEPS),
    )
    runs = run_policies(cluster, workload, opts)
    cmp = comparison(runs)
    bound = bound_for_runs(cluster, workload, runs, seed=seed)
    policies = {}
    for name, run in runs.items():
        m = run.metrics
        policies[name] = {
            "energy_joules": m["energy_joules"],
            "carbon_grams": m["carbon_grams"],
            "makespan_seconds": m["makespan_seconds"],
            "energy_saving_percent": cmp[name]["energy_saving_percent"],
            "carbon_saving_percent": cmp[name]["carbon_saving_percent"],
            "makespan_change_percent": cmp[name]["makespan_change_percent"],
            "node_hours": m["node_hours"],
            "pods": m["pods"],
            "unscheduled": m["unscheduled"],
        }
        if bound.get("applicable"):
            policies[name]["share_of_bound_saving"] = bound["policies"][name]["share_of_bound_saving"]
            own = bound["policies"][name]["own_timeline"]["fluid_energy_joules"]
            policies[name]["own_timeline_fluid_bound_joules"] = own
            policies[name]["above_own_fluid_bound"] = m["energy_joules"] >= own * (1 - 1e-9)
    out: dict[str, Any] = {
        "pods": len(workload.pods),
        "nodes": cluster.node_count,
        "autoscaler": cluster.autoscaler.enabled,
        "policies": policies,
        "wall_seconds": time.perf_counter() - started,
    }
    if bound.get("applicable"):
        out["bound"] = {k: v for k, v in bound.items() if k != "policies"}
    else:
        out["bound"] = bound
    out["targets"] = check_bin_packing(policies)
    return out


def check_bin_packing(p: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, metric, rival in (("energy", "energy_joules", "energy+most-allocated"), ("carbon", "carbon_grams", "carbon+most-allocated")):
        mine = p[name][metric]
        checks = {
            "vs_most_allocated": mine <= p["most-allocated"][metric] * (1 + 1e-9),
            f"vs_{rival}": mine <= p[rival][metric] * (1 + 1e-9),
            "makespan": p[name]["makespan_change_percent"] <= MAKESPAN_LIMIT_PERCENT,
        }
        out[name] = {
            "met": all(checks.values()),
            "checks": checks,
            metric: mine,
            f"most_allocated_{metric}": p["most-allocated"][metric],
            f"{rival}_{metric}": p[rival][metric],
            "makespan_change_percent": p[name]["makespan_change_percent"],
        }
    return out


def check_bound(case: dict[str, Any]) -> dict[str, Any]:
    """The bound target (share of the request-aware estimate's saving), and the same against the
    cheapest-first placement run, which no scheduler that places each pod once can beat by re-packing."""
    shares = case["policies"]["energy"].get("share_of_bound_saving", {})
    share = shares.get("request_aware")
    placed = shares.get("cheapest_first")
    return {
        "target": f"energy >= {BOUND_SHARE_TARGET:.0%} of the request-aware bound's saving",
        "share": share,
        "met": share is not None and share >= BOUND_SHARE_TARGET,
        "cheapest_first_share": placed,
        "cheapest_first_met": placed is not None and placed >= BOUND_SHARE_TARGET,
    }


# -- printing ------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def print_case(title: str, case: dict[str, Any]) -> None:
    print(f"\n## {title}: {case['pods']:,} pods on {case['nodes']} nodes, autoscaler {'on' if case['autoscaler'] else 'off'} ({case['wall_seconds']:.1f} s)")
    head = f"{'policy':<22} {'kWh':>10} {'Δ E %':>7} {'CO2e kg':>9} {'Δ C %':>7} {'makespan Δ %':>12} {'node-h':>8} {'fluid share %':>13} {'req-aware share %':>17} {'cheapest-first share %':>22}"
    print(head)
    print("-" * len(head))
    for name, m in case["policies"].items():
        s = m.get("share_of_bound_saving", {})
        print(
            f"{name:<22} {m['energy_joules'] / 3.6e6:>10.3f} {0.0 - m['energy_saving_percent'] + 0.0:>+7.1f} {m['carbon_grams'] / 1000:>9.3f} "
            f"{0.0 - m['carbon_saving_percent'] + 0.0:>+7.1f} {m['makespan_change_percent']:>+12.1f} {m['node_hours']:>8.1f} "
            f"{_pct(s.get('fluid')):>13} {_pct(s.get('request_aware')):>17} {_pct(s.get('cheapest_first')):>22}"
        )
    b = case["bound"]
    if b.get("applicable"):
        print(
            f"bound ({b['timeline']} timeline): fluid {b['fluid_energy_joules'] / 3.6e6:.3f} kWh, request-aware "
            f"{b['request_aware_energy_joules'] / 3.6e6:.3f} kWh (idle {b['idle_energy_joules'] / 3.6e6:.3f} kWh); "
            f"cheapest-first placement {b['cheapest_first_energy_joules'] / 3.6e6:.3f} kWh"
        )
        below = [n for n, m in case["policies"].items() if not m["above_own_fluid_bound"]]
        print(f"sanity: every policy's energy >= the fluid bound on its own timeline: {'yes' if not below else 'NO: ' + ', '.join(below)}")
    else:
        print(f"bound: not applicable ({b.get('reason', '')})")
    for name, t in case["targets"].items():
        metric = "energy_joules" if name == "energy" else "carbon_grams"
        rival = "energy+most-allocated" if name == "energy" else "carbon+most-allocated"
        missed = [k for k, ok in t["checks"].items() if not ok]
        print(
            f"target {name}: {'met' if t['met'] else 'MISSED (' + ', '.join(missed) + ')'} — {t[metric]:.4g} vs most-allocated "
            f"{t['most_allocated_' + metric]:.4g}, {rival} {t[rival + '_' + metric]:.4g}; makespan {t['makespan_change_percent']:+.1f} %"
        )
    if "bound_target" in case:
        bt = case["bound_target"]
        print(f"target bound: {'met' if bt['met'] else 'MISSED'} — energy reaches {_pct(bt['share'])} % of the request-aware bound's saving (goal {BOUND_SHARE_TARGET:.0%})")
        print(
            f"target bound, as placed: {'met' if bt['cheapest_first_met'] else 'MISSED'} — energy reaches "
            f"{_pct(bt['cheapest_first_share'])} % of the cheapest-first placement's saving"
        )


# -- main ----------------------------------------------------------------------------------------


def scenario_names(data: Path) -> list[str]:
    names = ["nf-core"]
    names += [f"pegasus:{p.stem}" for p in sorted((data / "workflows" / "pegasus").glob("*.json"))]
    names += [f"makeflow:{p.stem}" for p in sorted((data / "workflows" / "makeflow").glob("*.json"))]
    return [*names, "openb", "load"]


def select(all_names: list[str], wanted: str) -> list[str]:
    if not wanted:
        return all_names
    keys = [w.strip() for w in wanted.split(",") if w.strip()]
    picked = [n for n in all_names if any(n == k or n.split(":", 1)[0] == k for k in keys)]
    unknown = [k for k in keys if not any(n == k or n.split(":", 1)[0] == k for n in all_names)]
    if unknown:
        raise SystemExit(f"policy_targets: unknown scenario {unknown[0]!r} (known: {', '.join(all_names)}, pegasus, makeflow)")
    return picked


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help="the shared data folder (default ../shared/data)")
    ap.add_argument("--scenarios", default="", help="comma-separated: nf-core, pegasus[:name], makeflow[:name], openb, load")
    ap.add_argument("--quick", action="store_true", help="small subsets: 1 copy of each workflow, openb 1 pod in 40, 1,500 synthetic pods")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--copies", type=int, default=None, help="submissions of each workflow (4; quick: 1)")
    ap.add_argument("--openb-every", type=int, default=None, help="keep every N-th openb pod and 1/N of the nodes (10; quick: 40)")
    ap.add_argument("--load-pods", type=int, default=None, help="synthetic pods per load level (4,000; quick: 1,500)")
    ap.add_argument("--extender-weight", type=int, default=DEFAULT_EXTENDER_WEIGHT, help="the extender's weight in kube-scheduler (default: deploy/'s)")
    ap.add_argument("--filter-keeps", choices=FILTER_KEEPS_CHOICES, default="all", help="policy.filter_keeps of the extender (default: all, deploy/'s)")
    ap.add_argument("--out", type=Path, default=None,
                    help="where the figures go (default: bench/results/policy-targets.json for the recorded study, "
                    "every option at its default; any other run, --quick included, writes to the temporary folder, "
                    "never over the recorded figures)")
    ap.add_argument("--write-openb-cluster", type=Path, default=None, help="write the scaled openb cluster spec and exit")
    args = ap.parse_args(argv)
    if args.out is None:
        recorded = all(getattr(args, action.dest) == action.default for action in ap._actions if action.dest != "help")
        args.out = (ROOT / "bench" / "results" if recorded else Path(tempfile.gettempdir())) / "policy-targets.json"
    global EXTENDER_WEIGHT, FILTER_KEEPS
    EXTENDER_WEIGHT = args.extender_weight
    FILTER_KEEPS = args.filter_keeps
    copies = args.copies or (1 if args.quick else 4)
    every = args.openb_every or (40 if args.quick else 10)
    load_pods = args.load_pods or (1500 if args.quick else 4000)
    if args.write_openb_cluster:
        write_openb_cluster(args.write_openb_cluster, args.data, every)
        print(f"wrote {args.write_openb_cluster}")
        return 0

    started = time.perf_counter()
    example = load_cluster(EXAMPLE_CLUSTER)
    results: dict[str, Any] = {
        "format": "joulesched-policy-targets",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "argv": list(argv if argv is not None else sys.argv[1:]),
        "python": platform.python_version(),
        "seed": args.seed,
        "copies": copies,
        "openb_every": every,
        "load_pods": load_pods,
        "scenarios": {},
    }
    summary: list[tuple[str, str, bool, str]] = []
    for name in select(scenario_names(args.data), args.scenarios):
        kind, _, stem = name.partition(":")
        if kind == "load":
            for load in LOADS:
                cores = sum(nt.cores * nt.count for nt in example.node_types)
                trace = independent_pods(load_pods, cluster_cores=cores, utilisation=load, mean_duration=120.0, seed=args.seed)
                wl = Workload.of([trace])
                case = run_case(with_autoscaler(example, False), wl, args.seed)
                case["bound_target"] = check_bound(case)
                label = f"load {load:.0%} (always-on example cluster)"
                results["scenarios"][f"load-{round(load * 100)}"] = case
                print_case(label, case)
                bt = case["bound_target"]
                summary.append((label, "bound", bt["met"], _pct(bt["share"]) + " % of the request-aware estimate's saving"))
                summary.append((label, "placed", bt["cheapest_first_met"], _pct(bt["cheapest_first_share"]) + " % of the cheapest-first placement's saving"))
                for target, t in case["targets"].items():  # the bin-packing targets hold on every workload
                    summary.append((label, target, t["met"], ", ".join(k for k, ok in t["checks"].items() if not ok) or "all checks"))
            continue
        if kind == "nf-core":
            traces = [read_wfformat(p) for p in sorted((args.data / "workflows" / "nextflow").glob("*.json"))]
            wl, cluster = submitted(traces, copies, args.seed), example
        elif kind in ("pegasus", "makeflow"):
            wl, cluster = submitted([read_wfformat(args.data / "workflows" / kind / f"{stem}.json")], copies, args.seed), example
        else:  # openb
            cluster = parse_cluster(openb_cluster(args.data, every), "openb (generated)", base_dir=EXAMPLE_CLUSTER.parent)
            wl = openb_workload(args.data, every)
        for on in (True, False):
            case = run_case(with_autoscaler(cluster, on), wl, args.seed)
            label = f"{name} (autoscaler {'on' if on else 'off'})"
            results["scenarios"][f"{name}/autoscaler-{'on' if on else 'off'}"] = case
            print_case(label, case)
            for target, t in case["targets"].items():
                summary.append((label, target, t["met"], ", ".join(k for k, ok in t["checks"].items() if not ok) or "all checks"))
    results["wall_seconds"] = time.perf_counter() - started
    results["summary"] = [{"scenario": s, "target": t, "met": m, "detail": d} for s, t, m, d in summary]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print("\n## Summary")
    for s, t, m, d in summary:
        print(f"{'met   ' if m else 'MISSED'} {t:<7} {s}: {d if not m or t == 'bound' else ''}".rstrip())
    met = sum(1 for *_, m, _ in summary if m)
    print(f"{met}/{len(summary)} targets met; {results['wall_seconds']:.0f} s; figures in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
