"""``joulesched weblog-report``: a self-contained HTML report of one Nextflow run's energy.

::

    joulesched weblog-report --agent http://127.0.0.1:9102 --run RUN_ID [--token-file F] -o run.html
    joulesched weblog-report --json run.json -o run.html          # a saved GET /v1/weblog/{runId}
        [--intensity G]                                           # gCO2e/kWh: adds CO2e columns

The report is one HTML file with no external resource (no script, font, stylesheet or image
fetched): a summary, the energy per process and per task as tables, and two inline SVG
plots — energy per process, and the tasks on a timeline. Every text from the run is escaped.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from joulesched.contracts.cliargs import INTENSITY
from joulesched.contracts.net import open_url, redact, url_problem
from joulesched.measurement.errors import MeasurementError
from joulesched.policy.impact import operational_grams
from joulesched.policy.units import JOULES_PER_KWH

PALETTE = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#332288")


def _t(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _j(joules: float | None) -> str:
    return "—" if joules is None else f"{joules:,.1f}"


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int) -> str:
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = []
    for row in rows:
        tds = "".join(
            f'<td class="n">{_e(c)}</td>' if i >= numeric_from else f"<td>{_e(c)}</td>" for i, c in enumerate(row)
        )
        body.append(f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _bars(processes: list[dict[str, Any]], colour: dict[str, str]) -> str:
    width, bar, gap, label = 720, 18, 6, 180
    shown = [p for p in processes if p["joules"] > 0]
    if not shown:
        return "<p>No task energy to plot.</p>"
    top = max(p["joules"] for p in shown)
    height = len(shown) * (bar + gap) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    parts.append("<title>Energy per process (J)</title>")
    for i, p in enumerate(shown):
        y = 10 + i * (bar + gap)
        w = (width - label - 90) * p["joules"] / top
        parts.append(f'<text x="{label - 6}" y="{y + bar - 5}" text-anchor="end">{_e(p["process"])}</text>')
        parts.append(f'<rect x="{label}" y="{y}" width="{w:.1f}" height="{bar}" fill="{colour[p["process"]]}"/>')
        parts.append(f'<text x="{label + w + 4:.1f}" y="{y + bar - 5}">{p["joules"]:,.0f} J</text>')
    parts.append("</svg>")
    return "".join(parts)


def _timeline(rows: list[dict[str, Any]], start: float, end: float, colour: dict[str, str]) -> str:
    width, lane, left = 720, 14, 10
    span = max(end - start, 1e-9)
    height = len(rows) * lane + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    parts.append("<title>Tasks over the run (x: seconds since the run started)</title>")
    scale = (width - 2 * left) / span
    for i, row in enumerate(rows):
        x = left + (row["start"] - start) * scale
        w = max(1.0, row["seconds"] * scale)
        tip = f"{row['name']}: {row['seconds']:.1f} s, {_j(row['joules'])} J"
        parts.append(
            f'<rect x="{x:.1f}" y="{10 + i * lane}" width="{w:.1f}" height="{lane - 3}" '
            f'fill="{colour[row["process"]]}"><title>{_e(tip)}</title></rect>'
        )
    for k in range(6):
        x = left + k * (width - 2 * left) / 5
        parts.append(f'<text x="{x:.1f}" y="{height - 8}" text-anchor="middle">{span * k / 5:.0f} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(result: dict[str, Any], intensity: float | None = None) -> str:
    """The report of a finished run (the JSON of ``GET /v1/weblog/{runId}``)."""
    if "task_rows" not in result or "run" not in result:
        raise ValueError("not a finished run's result (no run/task_rows): is the run still open?")
    run = result["run"]
    rows: list[dict[str, Any]] = result["task_rows"]
    processes: list[dict[str, Any]] = result["processes"]
    colour = {p["process"]: PALETTE[i % len(PALETTE)] for i, p in enumerate(processes)}
    total = float(result["joules"]["node"])

    def co2(joules: float | None) -> str:
        return "—" if joules is None or intensity is None else f"{float(operational_grams(joules, intensity)):.4g}"

    summary = [
        ("run", f"{run['runName']} ({run['runId']})"),
        ("outcome", run["outcome"]),
        ("window", f"{_t(result['start'])} – {_t(result['end'])} ({result['seconds']:.1f} s)"),
        ("node energy", f"{total:,.1f} J = {total / JOULES_PER_KWH:.6f} kWh (counter difference over the run's window)"),
        ("outside tasks", f"{_j(result['outside_tasks_joules'])} J (workflow manager, waits between tasks)"),
        ("sources", ", ".join(result.get("sources", [])) or "—"),
    ]
    if intensity is not None:
        summary.append(("CO2e", f"{co2(total)} g at {intensity:g} gCO2e/kWh"))
    co2_head = ["gCO2e"] if intensity is not None else []
    process_rows = [
        [
            p["process"],
            str(p["tasks"]),
            f"{p['seconds']:.1f}",
            _j(p["joules"]),
            f"{100 * p['joules'] / total:.1f}" if total else "—",
        ]
        + ([co2(p["joules"])] if intensity is not None else [])
        for p in processes
    ]
    task_rows = [
        [
            r["name"],
            r["process"],
            r["status"],
            r["hostname"] or "this node",
            _t(r["start"]),
            f"{r['seconds']:.1f}",
            f"{r['cores']:.2f}",
            _j(r["joules"]) if r["here"] else "not here",
            _j(r.get("pod_joules")),
        ]
        + ([co2(r["joules"])] if intensity is not None else [])
        for r in rows
    ]
    notes = "".join(f"<li>{_e(n)}</li>" for n in result.get("notes", []))
    style = (
        "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px}th{background:#eee}td.n{text-align:right}"
        "svg text{font:12px sans-serif}"
    )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>joulesched: energy of Nextflow run {_e(run['runName'])}</title>",
            f"<style>{style}</style></head><body>",
            f"<h1>Energy of Nextflow run {_e(run['runName'])}</h1>",
            _table(["", ""], [[k, v] for k, v in summary], 99),
            "<h2>Per process</h2>",
            _bars(processes, colour),
            _table(["process", "tasks", "task seconds", "joules", "% of run", *co2_head], process_rows, 1),
            "<h2>Per task</h2>",
            _timeline(rows, float(result["start"]), float(result["end"]), colour) if rows else "<p>No tasks.</p>",
            _table(
                ["task", "process", "status", "host", "start", "seconds", "cores", "joules", *co2_head], task_rows, 5
            ),
            "<h2>How these figures are made</h2>",
            "<p>The node's energy counters are read when the run starts, at every event Nextflow posts and when "
            "it ends. Each interval's energy is split over the tasks running in it, by time × the task's mean "
            "busy cores (Nextflow's %cpu); what no task ran in is 'outside tasks'. Tasks plus outside tasks "
            "equal the run's energy. 'pod joules' is the agent's own counter of a task's pod (Kubernetes "
            "executor) when the pod ran on this node.</p>",
            f"<ul>{notes}</ul>" if notes else "",
            "</body></html>",
        ]
    )


def check_agent_url(agent: str) -> None:
    """``--agent`` must be ``http(s)://host[:port][/path]``: :class:`BadInput` names the flag
    (``localhost:9102`` parses as the scheme ``localhost``, and urllib's "unknown url type" for
    it named neither the flag nor what is wanted; ``http://[::1`` gave no URL at all). Credentials
    in it are refused (``contracts.net.url_problem``) and never repeated in the message."""
    shown = redact(agent)
    try:
        parts = urllib.parse.urlsplit(agent)
        _ = parts.port  # a port that is no number, or out of range, raises here
    except ValueError as err:
        raise BadInput(
            f"--agent {shown}: not a URL ({err}); give http://HOST:PORT, e.g. http://127.0.0.1:9102"
        ) from err
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"--agent {shown}: must be http://HOST:PORT or https://HOST:PORT, e.g. http://127.0.0.1:9102")
    problem = url_problem(agent, "--token-file")
    if problem:
        raise BadInput(f"--agent {shown}: {problem}")


def fetch_result(agent: str, run_id: str, token: str | None) -> dict[str, Any]:
    url = f"{agent.rstrip('/')}/v1/weblog/{urllib.parse.quote(run_id, safe='')}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with open_url(request, timeout=10) as reply:
            result: dict[str, Any] = json.loads(reply.read())
    except urllib.error.HTTPError as err:
        raise ValueError(f"{url}: HTTP {err.code} {err.read()[:200].decode('utf-8', 'replace')}") from err
    except OSError as err:
        raise ValueError(f"{url}: {getattr(err, 'reason', err)} — is the agent running there?") from err
    if result.get("open"):
        raise ValueError(f"run {run_id} is still running: the report is made once Nextflow posts 'completed'")
    return result


class BadInput(MeasurementError):
    """A flag or file the user gave is wrong (exit 2); the message names it."""


def read_saved_result(path: str) -> dict[str, Any]:
    """A saved answer of ``GET /v1/weblog/{runId}``; :class:`BadInput` names the file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as err:
        raise BadInput(f"--json {path}: cannot read: {err.strerror or err}") from err
    try:
        result = json.loads(data)
    except ValueError as err:  # JSONDecodeError, or bytes that are no text
        raise BadInput(f"--json {path}: not valid JSON: {err}") from err
    if not isinstance(result, dict):
        raise BadInput(
            f"--json {path}: not a saved answer of GET /v1/weblog/{{runId}} (a JSON object), "
            f"got {type(result).__name__}"
        )
    return result


def _render_saved(result: dict[str, Any], path: str, intensity: float | None) -> str:
    """The report of a saved result, whose every problem names the file."""
    try:
        return render_html(result, intensity)
    except KeyError as err:
        raise BadInput(f"--json {path}: not a finished run's result: no key {err}") from err
    except (ValueError, TypeError, AttributeError, IndexError) as err:
        raise BadInput(f"--json {path}: {err}") from err


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="joulesched weblog-report", description="HTML energy report of a Nextflow run")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--agent", metavar="URL", help="the agent Nextflow posted to (-with-weblog URL's base)")
    source.add_argument("--json", metavar="FILE", help="a saved answer of GET /v1/weblog/{runId}")
    p.add_argument("--run", metavar="RUN_ID", help="the run's runId (Nextflow's session id), with --agent")
    p.add_argument("--token-file", metavar="FILE", help="the agent's bearer token, with --agent")
    p.add_argument("--intensity", type=INTENSITY, metavar="G", help="grid carbon intensity, gCO2e/kWh, >= 0")
    p.add_argument("--output", "-o", required=True, metavar="FILE.html")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.agent and not args.run:
        p.error("argument --agent: needs --run RUN_ID")
    if args.json:
        for flag, value in (("--run", args.run), ("--token-file", args.token_file)):
            if value is not None:
                p.error(f"argument {flag}: only with --agent (--json reads a saved result)")
    try:
        if args.agent:
            check_agent_url(args.agent)
            token = None
            if args.token_file:
                try:
                    with open(args.token_file, encoding="utf-8") as fh:
                        token = fh.read().strip()
                except (OSError, ValueError) as err:
                    reason = getattr(err, "strerror", None) or err
                    raise BadInput(f"--token-file {args.token_file}: cannot read: {reason}") from err
            result = fetch_result(args.agent, args.run, token)
            text = render_html(result, args.intensity)
        else:
            text = _render_saved(read_saved_result(args.json), args.json, args.intensity)
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as err:
            raise BadInput(f"--output {args.output}: cannot write: {err.strerror or err}") from err
    except BadInput as err:
        print(f"joulesched weblog-report: {err}", file=sys.stderr)
        return 2
    except (ValueError, OSError, KeyError) as err:
        print(f"joulesched weblog-report: {err}", file=sys.stderr)
        return 1
    print(f"joulesched weblog-report: wrote {args.output}")
    return 0


__all__ = ["main", "render_html"]
