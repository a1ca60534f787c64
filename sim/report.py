"""The report folder: ``results.json`` (every figure), ``report.md`` (the tables) and PNG plots.

This module only reads finished results; it changes nothing and runs no simulation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from joulesched.policy.units import JOULES_PER_KWH
from joulesched.sim.attribution import METHODS
from joulesched.sim.runner import PolicyRun

POLICY_COLOURS = {
    "default": "#7f7f7f",
    "most-allocated": "#1f77b4",
    "energy": "#2ca02c",
    "carbon": "#17becf",
    "energy+most-allocated": "#98df8a",
    "carbon+most-allocated": "#9edae5",
}


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _signed(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:+.{digits}f}"


def _delta(policy: str, value: float) -> str:
    return "baseline" if policy == "default" else _signed(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def summary_rows(
    policies: Mapping[str, Mapping[str, Any]], compare: Mapping[str, Mapping[str, float]]
) -> list[list[str]]:
    rows = []
    for name, m in policies.items():
        c = compare.get(name, {})
        rows.append(
            [
                name,
                _fmt(m["energy_kwh"], 3),
                _delta(name, -c["energy_saving_percent"]) if c else "–",
                _fmt(m["carbon_kg"], 3),
                _delta(name, -c["carbon_saving_percent"]) if c else "–",
                _fmt(m["water_litres"], 2),
                _fmt(m["makespan_seconds"], 0),
                _delta(name, c["makespan_change_percent"]) if c else "–",
                _fmt(m["mean_pending_seconds"], 2),
                str(m["pods"]),
                _fmt(m["node_hours"], 1),
            ]
        )
    return rows


SUMMARY_HEADER = [
    "policy",
    "IT energy kWh",
    "Δ %",
    "CO2e kg",
    "Δ %",
    "water L",
    "makespan s",
    "Δ %",
    "mean pending s",
    "pods",
    "node-hours",
]


def summary_text(policies: Mapping[str, Mapping[str, Any]], compare: Mapping[str, Mapping[str, float]]) -> str:
    """A plain table for the terminal."""
    rows = [SUMMARY_HEADER, *summary_rows(policies, compare)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(SUMMARY_HEADER))]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_results(out: Path, results: Mapping[str, Any]) -> Path:
    path = out / "results.json"
    path.write_bytes(
        orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    )
    return path


# -- markdown ------------------------------------------------------------------------------------


def markdown(results: Mapping[str, Any], plots: Sequence[str]) -> str:
    r = results
    cl = r["cluster"]
    lines = [
        f"# joulesched sim — {cl['name']}",
        "",
        f"{r['workload']['pods']:,} pods ({r['workload']['workflows']} workflow runs) on {cl['nodes']} nodes "
        f"in {len(cl['sites'])} sites; seed {r['seed']}; extender weight {r['extender_weight']}, band {r['policy_config']['band']:g} "
        f"({r['extender']}); percentageOfNodesToScore {r['percentage_label']}. Energy, carbon and water are integrated over "
        f"the same window for every policy ({_fmt(next(iter(r['policies'].values()))['window_seconds'] / 3600, 2)} h).",
        "",
        "## Summary",
        "",
        _table(SUMMARY_HEADER, summary_rows(r["policies"], r["comparison"])),
        "",
        "Δ % against `default`. Facility energy = IT × PUE; CO2e = facility energy × the site's hourly grid intensity, "
        "integrated; water = IT energy × WUE (WUE is per IT kWh).",
        "",
    ]
    if r.get("targets"):
        lines += target_markdown(r["targets"], "")
        lines[-1:-1] = [f"  {why}" for why in r.get("target_notes", [])]
    for sens in r.get("sensitivity", {}).values():
        if sens.get("targets"):
            lines += target_markdown(sens["targets"], f" ({sens['title']})")
    lines += deferral_markdown(r, "")
    for sens in r.get("sensitivity", {}).values():
        lines += deferral_markdown(sens, f" ({sens['title']})")
    lines += bound_markdown(r.get("bound"), "")
    for sens in r.get("sensitivity", {}).values():
        lines += bound_markdown(sens.get("bound"), f" ({sens['title']})")
    lines += ["## Per site", ""]
    site_rows = []
    for name, m in r["policies"].items():
        for site, s in m["per_site"].items():
            site_rows.append(
                [
                    name,
                    site,
                    str(s["pods"]),
                    _fmt(s["node_hours"], 1),
                    _fmt(s["energy_joules"] / JOULES_PER_KWH, 3),
                    _fmt(s["carbon_grams"] / 1000, 3),
                    _fmt(s["water_litres"], 2),
                ]
            )
    lines += [_table(["policy", "site", "pods", "node-hours", "IT kWh", "CO2e kg", "water L"], site_rows), ""]
    pct = r.get("percentage_100")
    if pct:
        lines += ["## percentageOfNodesToScore: default (adaptive) and 100 %", ""]
        if "reason" in pct:
            lines += [pct["reason"], ""]
        else:
            rows = []
            for name in r["policies"]:
                a = r["policies"][name]
                b = pct["policies"][name]
                rows.append(
                    [
                        name,
                        _fmt(a["energy_kwh"], 3),
                        _fmt(b["energy_kwh"], 3),
                        _fmt(a["carbon_kg"], 3),
                        _fmt(b["carbon_kg"], 3),
                        _fmt(a["makespan_seconds"], 0),
                        _fmt(b["makespan_seconds"], 0),
                        _fmt(a["extender_candidates_mean"], 1),
                        _fmt(b["extender_candidates_mean"], 1),
                    ]
                )
            lines += [
                _table(
                    [
                        "policy",
                        "kWh (adaptive)",
                        "kWh (100 %)",
                        "CO2e kg (adaptive)",
                        "CO2e kg (100 %)",
                        "makespan (adaptive)",
                        "makespan (100 %)",
                        "nodes the extender saw (adaptive)",
                        "(100 %)",
                    ],
                    rows,
                ),
                "",
                "With the adaptive default, kube-scheduler stops filtering once it has found max(100, (50 − nodes/125) %) "
                "feasible nodes, walking the node list from a rotating index; the extender scores only those.",
                "",
            ]
    for label, sens in r.get("sensitivity", {}).items():
        lines += [f"## Sensitivity: {sens['title']}", "", sens["description"], ""]
        lines += [_table(SUMMARY_HEADER, summary_rows(sens["policies"], sens["comparison"])), ""]
        del label
    att = r.get("attribution")
    if att and att.get("workflows"):
        lines += attribution_markdown(att)
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
        lines.append("")
    notes = r["workload"].get("notes", [])
    if notes:
        lines += ["## What the trace readers derived", ""]
        lines += [f"- {n}" for n in notes[:40]]
        if len(notes) > 40:
            lines.append(f"- … and {len(notes) - 40} more (results.json)")
        lines.append("")
    lines += [
        "## Model",
        "",
        "kube-scheduler's default scoring (NodeResourcesFit LeastAllocated or MostAllocated, BalancedAllocation, "
        "PodTopologySpread for pods with an owner group; the plugins that are constant on a plain cluster left out), "
        "extender score × weight × 10, ties broken at random from the seed. Node power follows its SPECpower curve at its "
        "CPU utilisation; energy is integrated exactly between events. docs/sim.md describes the model and its limits.",
        "",
    ]
    return "\n".join(lines)


def target_markdown(goals: dict[str, Any], title: str) -> list[str]:
    """The targets against ``default``, each with its saving against ``most-allocated`` where that ran."""
    lines = [f"## Targets{title}", ""]
    for name, t in goals.items():
        verdict = "**met**" if t["met"] else "**not met**"
        packed = t.get(f"{name}_saving_vs_most_allocated_percent")
        against = "" if packed is None else f" ({packed:.1f} % less than `most-allocated`)"
        if name == "energy":
            lines.append(
                f"- `energy`: {t['target']}: {verdict} — {t['energy_saving_percent']:.1f} % less energy than `default`{against}, "
                f"makespan {t['makespan_change_percent']:+.1f} %."
            )
        else:
            lines.append(f"- `carbon`: {t['target']}: {verdict} — {t['carbon_saving_percent']:.1f} % less CO2e than `default`{against}.")
    lines.append("")
    return lines


def deferral_markdown(r: Mapping[str, Any], label: str) -> list[str]:
    """The deferring runs: deadlines, the extra wait, and CO2e against the same policy undeferred."""
    deferring = {n: m["deferral"] for n, m in r["policies"].items() if m.get("deferral")}
    if not deferring:
        return []
    against = r.get("deferral", {})
    missed = sum(d["deadlines_missed"] for d in deferring.values())
    lines = [f"## Carbon-aware deferral{label}", ""]
    if missed:
        lines += [f"**DEADLINES MISSED: {missed}** deferred units finished after their deadline (the rule must keep this 0).", ""]
    rows = []
    for name, d in deferring.items():
        c = against.get(name)
        rows.append(
            [
                name,
                d["forecast"],
                f"{d['held_units']}/{d['units']}",
                _fmt(d["extra_pending_mean_seconds"] / 3600, 2),
                _fmt(d["extra_pending_p95_seconds"] / 3600, 2),
                str(d["deadlines_missed"]),
                _fmt(r["policies"][name]["carbon_kg"], 3),
                f"`{c['without']}`" if c else "–",
                _signed(-c["carbon_saving_percent"]) if c else "–",
                _fmt(c["carbon_avoided_grams"], 0) if c else "–",
                _signed(c["energy_change_percent"]) if c else "–",
            ]
        )
    header = [
        "policy",
        "forecast",
        "held units",
        "extra pending mean h",
        "p95 h",
        "deadlines missed",
        "CO2e kg",
        "against",
        "CO2e Δ %",
        "g avoided",
        "energy Δ %",
    ]
    lines += [
        _table(header, rows),
        "",
        "A unit is a workflow run (or an independent pod), held until `policy.deferral.decide` releases it under the "
        "forecast; extra pending = release − submission, over every deferrable unit. Δ against the same policy without "
        "deferral, over the same window.",
        "",
    ]
    return lines


def bound_markdown(bound: Mapping[str, Any] | None, label: str) -> list[str]:
    """The bound's section: both estimates and every policy's share of the possible saving."""
    if not bound:
        return []
    lines = [f"## Bound{label}", ""]
    if not bound.get("applicable"):
        return [*lines, f"Not applicable: {bound.get('reason', '')}.", ""]
    lines += [
        f"Least energy any placement could draw for this work on the always-on cluster, on the `{bound['timeline']}` run's "
        f"timeline (docs/sim.md, \"The bound\"): fluid (cheapest watts first) {_fmt(bound['fluid_energy_joules'] / JOULES_PER_KWH, 3)} kWh, "
        f"request-aware {_fmt(bound['request_aware_energy_joules'] / JOULES_PER_KWH, 3)} kWh, of which idle "
        f"{_fmt(bound['idle_energy_joules'] / JOULES_PER_KWH, 3)} kWh, over {_fmt(bound['window_seconds'] / 3600, 2)} h. "
        f"Both re-pack the work in flight at every instant; the cheapest-first oracle scheduler, which places each pod "
        f"once, draws {_fmt(bound['cheapest_first_energy_joules'] / JOULES_PER_KWH, 3)} kWh.",
        "",
    ]
    rows = []
    for name, p in bound["policies"].items():
        share = p["share_of_bound_saving"]
        rows.append(
            [
                name,
                _fmt(None if share["fluid"] is None else 100 * share["fluid"], 1),
                _fmt(None if share["request_aware"] is None else 100 * share["request_aware"], 1),
                _fmt(None if share["cheapest_first"] is None else 100 * share["cheapest_first"], 1),
                _fmt(p["own_timeline"]["fluid_energy_joules"] / JOULES_PER_KWH, 3),
            ]
        )
    lines += [
        _table(
            [
                "policy",
                "share of fluid saving %",
                "share of request-aware saving %",
                "share of cheapest-first saving %",
                "fluid bound on its own timeline kWh",
            ],
            rows,
        ),
        "",
        "Share = (E_default − E_policy) / (E_default − E_bound).",
        "",
    ]
    return lines


def attribution_markdown(att: Mapping[str, Any]) -> list[str]:
    wfs = att["workflows"]
    lines = [
        "## Attribution: how far each measurement method is from the model's truth",
        "",
        f"Each workflow ran alone on `{att['cluster']}` ({att['policy']} scheduling). Error in % of the true energy "
        f"(pod methods: the workflow's pods; node methods: the nodes it used over its window), at the seed's scrape phase; "
        f"in brackets the mean absolute error over {att['phases']} scrape phases.",
        "",
    ]
    short = {
        m: m.replace("_over_time", "_o_t").replace("counter_edges", "counter").replace("_increase", "_inc")
        for m in METHODS
    }
    header = ["workflow", "tasks", "duration s", *[short[m] for m in METHODS]]
    rows = []
    for name, w in wfs.items():
        cells = [name, str(w["tasks"]), _fmt(w["duration_seconds"], 0)]
        for m in METHODS:
            e = w["methods"][m]
            cells.append(f"{e['error_percent']:+.1f} ({e['mean_abs_error_percent']:.1f})")
        rows.append(cells)
    lines += [_table(header, rows), ""]
    lines += [
        "### Where the error comes from (30 s scrapes, mean over phases)",
        "",
        "Node `sum_over_time × 30 s` = (samples × 30 s ÷ window) × (mean sampled power ÷ true mean power): the window "
        "is covered by a whole number of scrapes, and a few samples of a power that changes with every short task are a "
        "poor mean. Pod-level queries also lose every task that no scrape sees (`sum_over_time`) or that fewer than two "
        "scrapes see (`increase`).",
        "",
    ]
    rows = []
    for name, w in wfs.items():
        b = w["breakdown"].get("30s", {})
        rows.append(
            [
                name,
                _fmt(w["median_task_seconds"], 1),
                f"{w['tasks_shorter_than_30s']}/{w['tasks']}",
                _fmt(b.get("samples"), 1),
                _fmt(b.get("window_coverage_abs_percent"), 1),
                _fmt(b.get("sampled_power_bias_abs_percent"), 1),
                _fmt(b.get("energy_in_tasks_unsampled_percent"), 1),
                _fmt(b.get("energy_in_tasks_under_two_samples_percent"), 1),
            ]
        )
    lines += [
        _table(
            [
                "workflow",
                "median task s",
                "tasks < 30 s",
                "scrapes in window",
                "window coverage %",
                "sampled power bias %",
                "energy in unsampled tasks %",
                "energy in tasks with < 2 samples %",
            ],
            rows,
        ),
        "",
    ]
    for note in att.get("notes", []):
        lines.append(f"- {note}")
    lines.append("")
    return lines


# -- plots ----------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path, tight: bool = True) -> Path:
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_energy_carbon(out: Path, policies: Mapping[str, Mapping[str, Any]]) -> Path:
    plt = _pyplot()
    names = list(policies)
    colours = [POLICY_COLOURS.get(n, "#999999") for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, label in (
        (axes[0], "energy_kwh", "IT energy (kWh)"),
        (axes[1], "carbon_kg", "CO2e (kg)"),
        (axes[2], "water_litres", "water (L)"),
    ):
        values = [policies[n][key] for n in names]
        ax.bar(names, values, color=colours)
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=20)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    return _save(plt, fig, out / "energy_carbon.png")


def plot_cluster_power(out: Path, runs: Mapping[str, PolicyRun]) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.8))
    for name, run in runs.items():
        t = np.asarray(run.result.power_times) / 3600.0
        w = np.asarray(run.result.power_watts) / 1000.0
        if len(t):
            ax.step(t, w, where="post", label=name, color=POLICY_COLOURS.get(name), linewidth=1.0)
    ax.set_xlabel("hours")
    ax.set_ylabel("cluster IT power (kW)")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("Cluster power over time")
    return _save(plt, fig, out / "cluster_power.png")


def utilisation_matrix(run: PolicyRun, bins: int = 120) -> tuple[np.ndarray, float]:
    """Time-weighted mean utilisation per node and time bin (NaN where the node was off)."""
    r = run.result
    n = len(r.nodes)
    horizon = r.end_time or 1.0
    edges = np.linspace(0.0, horizon, bins + 1)
    acc = np.zeros((n, bins))
    on = np.zeros((n, bins))
    per_node: list[list[tuple[float, float]]] = [[(0.0, 0.0)] for _ in range(n)]
    for t, node, u in r.util_log:
        per_node[node].append((t, u))
    for node, steps in enumerate(per_node):
        steps.append((horizon, steps[-1][1]))
        for (t0, u), (t1, _) in itertools.pairwise(steps):
            if t1 <= t0:
                continue
            lo = np.clip(edges[:-1], t0, t1)
            hi = np.clip(edges[1:], t0, t1)
            span = hi - lo
            if not np.isnan(u):
                acc[node] += span * u
                on[node] += span
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(on > 0, acc / on, np.nan), horizon


def plot_utilisation(out: Path, runs: Mapping[str, PolicyRun]) -> Path:
    plt = _pyplot()
    names = list(runs)
    fig, axes = plt.subplots(
        len(names),
        1,
        figsize=(10, 1.2 + 1.6 * len(names) + 0.05 * len(next(iter(runs.values())).result.nodes)),
        squeeze=False,
    )
    image = None
    for ax, name in zip(axes[:, 0], names, strict=True):
        matrix, horizon = utilisation_matrix(runs[name])
        cmap = plt.get_cmap("viridis").with_extremes(bad="#dddddd")
        image = ax.imshow(
            np.ma.masked_invalid(matrix),
            aspect="auto",
            interpolation="nearest",
            cmap=cmap,
            vmin=0,
            vmax=1,
            extent=(0, horizon / 3600, len(matrix), 0),
        )
        ax.set_title(f"{name}: CPU utilisation per node (grey: powered off)", fontsize=9)
        ax.set_ylabel("node")
    axes[-1, 0].set_xlabel("hours")
    if image is not None:
        fig.colorbar(image, ax=axes[:, 0].tolist(), shrink=0.6, label="utilisation")
    return _save(plt, fig, out / "node_utilisation.png", tight=False)  # the colorbar spans the axes


def plot_attribution(out: Path, att: Mapping[str, Any]) -> Path:
    plt = _pyplot()
    wfs = att["workflows"]
    names = list(wfs)
    x = np.arange(len(names))
    width = 0.8 / len(METHODS)
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(names) + 4), 4.2))
    cmap = plt.get_cmap("tab10")
    for k, m in enumerate(METHODS):
        values = [wfs[n]["methods"][m]["error_percent"] for n in names]
        spread = [wfs[n]["methods"][m]["max_abs_error_percent"] for n in names]
        ax.bar(x + (k - len(METHODS) / 2 + 0.5) * width, values, width, label=m, color=cmap(k % 10))
        ax.scatter(x + (k - len(METHODS) / 2 + 0.5) * width, spread, marker="_", color="black", s=12, linewidths=0.8)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("error vs model truth (%)")
    ax.set_title("Attribution error per workflow and method (bars: seed's scrape phase; dashes: worst phase, absolute)")
    ax.legend(fontsize=7, ncol=2, loc="best")
    return _save(plt, fig, out / "attribution_error.png")


def plot_scrape_example(out: Path, example: Mapping[str, Any]) -> Path:
    """One short workflow's node power with the 30 s scrapes: where sampling goes wrong."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.4))
    ax.step(example["t"], example["watts"], where="post", color="#444444", linewidth=1.0, label="node power (model)")
    ax.scatter(example["scrape_t"], example["scrape_watts"], color="#d62728", zorder=3, label="30 s scrapes")
    for t, w in zip(example["scrape_t"], example["scrape_watts"], strict=True):
        ax.hlines(w, t - 30.0, t, color="#d62728", linewidth=0.8, alpha=0.6)
    ax.axvspan(example["start"], example["end"], color="#2ca02c", alpha=0.08, label="workflow window")
    ax.set_xlabel("seconds")
    ax.set_ylabel("watts (nodes it used)")
    ax.set_title(f"{example['workflow']}: what a 30 s scrape sees (sum_over_time × 30 s counts each red segment)")
    ax.legend(fontsize=8)
    return _save(plt, fig, out / "attribution_scrapes.png")
