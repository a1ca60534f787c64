"""Output of ``joulesched report``: the table, CSV and the chart (JSON is ``Report.to_json``)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

from joulesched.contracts import names as n
from joulesched.impact.query import iso
from joulesched.impact.report import GROUP_COLUMNS, Report
from joulesched.impact.tenant import IDLE_SPLIT
from joulesched.policy.impact import Totals

# -- output -------------------------------------------------------------------------------------

HEADER = ("pods", "IT kWh", "facility kWh", "op. gCO2e", "emb. gCO2e", "total gCO2e", "water L", "renew. kWh")


def _numbers(t: Totals, pods: int, report: Report) -> list[str]:
    sci = t.sci(report.units)
    return [
        str(pods),
        f"{t.it_kwh:.6f}",
        f"{t.facility_kwh:.6f}",
        f"{t.operational_grams:.4f}",
        f"{t.embodied_grams:.4f}",
        f"{t.carbon_grams:.4f}",
        f"{t.water_litres:.6f}",
        f"{t.renewable_kwh:.6f}",
        "–" if not math.isfinite(sci) else f"{sci:.4f}",
    ]


def render_table(report: Report) -> str:
    columns = GROUP_COLUMNS[report.by]
    header = [*columns, *HEADER, f"SCI g/{report.per}"]
    body = [[*group, *_numbers(t, pods, report)] for group, pods, t in report.rows]
    body.append(["TOTAL", *[""] * (len(columns) - 1), *_numbers(report.total, report.pods, report)])
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < len(columns) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    policies = ", ".join(report.idle_policies) or "unknown"
    out = [
        f"joulesched report: {report.scope.describe()}",
        f"range {iso(report.start)} .. {iso(report.end)} in {len(report.steps)} steps of {report.step:g} s; idle policy {policies}",
        f"SCI = (operational + embodied) / {report.units:g} {report.per}(s)",
        "",
        line(header),
        line(["-" * w for w in widths]),
        *[line(r) for r in body],
    ]
    notes = _notes(report)
    if notes:
        out += ["", *notes]
    return "\n".join(out) + "\n"


def _notes(report: Report) -> list[str]:
    notes = list(report.notes)
    t = report.total
    unknown = [
        f"{what} ({count})"
        for what, count in (
            ("operational CO2e", t.missing_site),
            ("facility energy", t.missing_facility),
            ("water", t.missing_water),
            ("renewable energy", t.missing_renewable),
        )
        if count
    ]
    if unknown:
        notes.append(
            "note: pod-steps with energy but a site factor unknown (a node without joulesched_node_info, a site "
            f"gauge absent) are not counted in: {', '.join(unknown)}"
        )
    if t.missing_embodied and IDLE_SPLIT in report.idle_policies:
        notes.append("note: tenant mode: embodied emissions are not computed (no server figure on the NADIKI side)")
    elif t.missing_embodied:
        notes.append(
            f"note: {t.missing_embodied} pod-steps had energy but no embodied figure (server without "
            f"{n.SERVER_EMBODIED.name}/{n.SERVER_LIFETIME.name}): their embodied CO2e is not counted"
        )
    if "bucket" in report.idle_policies:
        notes.append(
            "note: idle policy 'bucket': idle power is not in the pods' energy (see "
            f'{n.IDLE_ENERGY.name}{{bucket="idle"}}), nor the embodied emissions that follow it'
        )
    return notes


def render_csv(report: Report) -> str:
    buf = io.StringIO()
    doc = report.to_json()
    rows = [*doc["rows"], {**{c: "TOTAL" for c in GROUP_COLUMNS[report.by][:1]}, **doc["total"]}]
    writer = csv.DictWriter(buf, fieldnames=list(rows[0].keys()), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def render_chart(report: Report, path: str, top: int = 8) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [datetime.fromtimestamp(t, UTC) for t in report.steps]
    ranked = sorted(report.series, key=lambda g: -float(np.sum(report.series[g][1])))
    shown, rest = ranked[:top], ranked[top:]
    fig, (ax_power, ax_carbon) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for group in shown:
        energy, carbon = report.series[group]
        label = "/".join(group)
        ax_power.plot(times, energy / report.step, label=label)
        ax_carbon.plot(times, np.cumsum(carbon), label=label)
    if rest:
        energy = np.sum([report.series[g][0] for g in rest], axis=0)
        carbon = np.sum([report.series[g][1] for g in rest], axis=0)
        ax_power.plot(times, energy / report.step, label=f"{len(rest)} more", color="grey")
        ax_carbon.plot(times, np.cumsum(carbon), label=f"{len(rest)} more", color="grey")
    ax_power.set_ylabel("IT power (W)")
    ax_carbon.set_ylabel("cumulative CO2e (g)\noperational + embodied")
    ax_carbon.set_xlabel("time (UTC)")
    ax_power.set_title(f"joulesched report: {report.scope.describe()}")
    ax_power.legend(loc="upper left", fontsize="small")
    ax_power.grid(alpha=0.3)
    ax_carbon.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
