"""The agreement report: the model's verdict on each real placement, the summary, the table and the CSV."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from joulesched.sim.kubereplay.options import KubeOptions


@dataclass(frozen=True)
class Verdict:
    """The model's view of one real placement."""

    top: tuple[int, ...]  # nodes with the model's best total among the feasible ones
    best: int | None  # that total (None: no feasible node)
    real: int | None  # the node the real scheduler chose (None: it refused the pod)
    real_score: int | None  # the model's total for the real node (None: refused, or not feasible)
    feasible: int  # how many nodes the model finds feasible

    @property
    def tied(self) -> bool:
        return len(self.top) > 1

    @property
    def agree(self) -> bool:
        return self.real is not None and self.real in self.top


def judge(feasible: np.ndarray, totals: np.ndarray, real: int | None) -> Verdict:
    """Compare a real placement with the model's totals over every node (``feasible``: mask)."""
    cand = np.flatnonzero(feasible)
    if len(cand) == 0:
        return Verdict((), None, real, None, 0)
    best = int(totals[cand].max())
    top = tuple(int(n) for n in cand[totals[cand] == best])
    real_score = int(totals[real]) if real is not None and feasible[real] else None
    return Verdict(top, best, real, real_score, len(cand))


def summarise(verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """Agreement counted among the pods whose best node is not tied; ties reported apart."""
    non_tied = [v for v in verdicts if not v.tied]
    tied = [v for v in verdicts if v.tied]
    agreements = sum(1 for v in non_tied if v.agree)
    return {
        "pods": len(verdicts),
        "non_tied": len(non_tied),
        "agreements": agreements,
        "agreement_percent": 100.0 * agreements / len(non_tied) if non_tied else None,
        "tied": len(tied),
        "tied_real_among_best": sum(1 for v in tied if v.agree),
        "single_feasible": sum(1 for v in verdicts if v.feasible == 1),
        "refused_by_real_scheduler": sum(1 for v in verdicts if v.real is None),
        "disagreements": sum(1 for v in verdicts if not v.agree),
    }


# -- the placements ---------------------------------------------------------------------------


@dataclass
class Placement:
    index: int
    pod: str  # the trace's pod name
    k8s_name: str
    created_at: float = math.nan  # simulated seconds
    node: int | None = None
    end: float = math.nan
    verdict: Verdict | None = None
    model_pick: int | None = None
    totals: list[int] = field(default_factory=list)
    refused: str = ""  # FailedScheduling message, when the real scheduler refused it


@dataclass
class ReplayResult:
    summary: dict[str, Any]
    placements: list[Placement]
    node_names: list[str]
    k8s_node_names: list[str]
    server: str
    server_version: str
    namespace: str
    wall_seconds: float
    simulated_seconds: float
    notes: list[str]

    def disagreements(self) -> list[dict[str, Any]]:
        out = []
        for p in self.placements:
            v = p.verdict
            if v is None or v.agree:
                continue
            out.append(
                {
                    "pod": p.pod,
                    "time": p.created_at,
                    "real_node": self.node_names[v.real] if v.real is not None else None,
                    "real_score": v.real_score,
                    "refused": p.refused or None,
                    "model_nodes": [self.node_names[n] for n in v.top],
                    "model_score": v.best,
                    "tied": v.tied,
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        placed = [p for p in self.placements if p.verdict is not None]
        same_pick = sum(1 for p in placed if p.model_pick is not None and p.model_pick == p.node)
        return {
            **self.summary,
            "model_pick_same_node": same_pick,
            "never_placed": sum(1 for p in self.placements if p.verdict is None),
            "server": self.server,
            "server_version": self.server_version,
            "namespace": self.namespace,
            "wall_seconds": self.wall_seconds,
            "simulated_seconds": self.simulated_seconds,
            "disagreement_list": self.disagreements(),
            "notes": self.notes,
        }


# -- output ------------------------------------------------------------------------------------


def summary_table(result: ReplayResult, opts: KubeOptions, limit: int = 20) -> str:
    s = result.summary
    pct = s["agreement_percent"]
    rows = [
        ("pods placed by the real scheduler", f"{s['pods'] - s['refused_by_real_scheduler']}"),
        ("pods judged", f"{s['pods']}"),
        ("not tied", f"{s['non_tied']}"),
        ("agreements (not tied)", f"{s['agreements']}" + (f" ({pct:.2f} %)" if pct is not None else "")),
        ("tied", f"{s['tied']} (real node among the model's best: {s['tied_real_among_best']})"),
        ("only one feasible node", f"{s['single_feasible']}"),
        ("refused by the real scheduler", f"{s['refused_by_real_scheduler']}"),
        ("disagreements", f"{s['disagreements']}"),
    ]
    width = max(len(k) for k, _ in rows)
    head = (
        f"kube-scheduler {opts.scheduler_name!r} ({result.server_version or 'unknown version'}, profile "
        f"{opts.profile}) at {result.server}: {len(result.node_names)} nodes, "
        f"{result.simulated_seconds:.0f} simulated s in {result.wall_seconds:.1f} wall s"
    )
    lines = [head] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
    dis = result.disagreements()
    if dis:
        lines.append("  disagreements (pod: real node [model score] vs the model's best [score]):")
        for d in dis[:limit]:
            real = f"{d['real_node']} [{d['real_score']}]" if d["real_node"] else f"refused ({d['refused']})"
            lines.append(f"    {d['pod']}: {real} vs {', '.join(d['model_nodes'])} [{d['model_score']}]")
        if len(dis) > limit:
            lines.append(f"    … and {len(dis) - limit} more (results.json)")
    return "\n".join(lines)


def placements_csv(result: ReplayResult) -> str:
    lines = ["pod,created,end,real_node,model_best,model_score,real_score,tied,agree"]
    for p in result.placements:
        v = p.verdict
        if v is None:
            lines.append(f"{_csv(p.pod)},,,,,,,,")
            continue
        real = result.node_names[p.node] if p.node is not None else ""
        best = ";".join(result.node_names[n] for n in v.top)
        lines.append(
            f"{_csv(p.pod)},{p.created_at!r},{p.end!r},{real},{best},{v.best},"
            f"{'' if v.real_score is None else v.real_score},{int(v.tied)},{int(v.agree)}"
        )
    return "\n".join(lines) + "\n"


def _csv(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text
