"""``joulesched report``: the environmental impact of a namespace, a label selector, a controller
or a Nextflow run over a time range, from Prometheus.

::

    joulesched report --prometheus URL
        (--namespace NS | --selector SEL | --run NAME | --owner KIND/NAME)   # NS may narrow the others
        (--start T --end T | --last DURATION)   # T: ISO 8601 (UTC if naive), unix seconds, now, now-2h
        [--step 60s] [--by pod|namespace|owner|run|process|node]
        [--per hour|run|request] [--requests N | --requests-query PROMQL]
        [--format table|csv|json] [--output FILE] [--chart FILE.png]

The range is cut into steps (60 s by default: the recording rules' minute); for every step it
reads from Prometheus each pod's energy increment (``increase()`` of
``joulesched_pod_energy_joules_total`` over the step), its node's energy increment, the node's
site and server (``joulesched_node_info``), the site factors (their mean over the step) and the
server's embodied emissions, then computes every indicator with :mod:`policy.impact` — the same
formulas as ``deploy/prometheus/rules.yaml``, so with a 60 s step the report's totals equal the
sum of the recorded rules over the same range (the tests hold them equal on a real Prometheus).

Pods are chosen through kube-state-metrics: a selector (``app=web,tier!=db``,
``env in (a,b)``, ``!canary``) is matched on ``kube_pod_labels`` (its labels must be
allow-listed), a run on the ``nextflow.io/runName`` label Nextflow puts on its task pods, an
owner on ``kube_pod_owner`` (a Deployment through its ReplicaSets). A pod counts when it
matched at any time in the range.

SCI is ``(operational + embodied) / R`` with R the scope's functional units: the hours of the
range, the Nextflow runs among its pods, or a number of requests (given, or a PromQL query whose
``{range}`` is replaced by the range, e.g. ``sum(increase(http_requests_total[{range}]))``).
Each row shows its part of the scope's SCI, so the rows add up to the total.

Tenant mode (``--tenant``: a cluster of VMs, no joulesched agent on its nodes) reads the
servers' energy from the NADIKI side instead — the provider's time-series store and the
registrar — and the pods' CPU from cAdvisor and kube-state-metrics (:mod:`impact.tenant`)::

    joulesched report --tenant --prometheus URL --registrar URL --influx URL --database DB
        [--share vcpu|provider [--vm-share NODE=FRACTION ...]] [--intensity G] [--pue X]
        [scope: every namespace when none is given] (--start T --end T | --last DURATION)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from joulesched.contracts.cliargs import INTENSITY, number
from joulesched.contracts.nadiki_read import InfluxReader, RegistrarReader
from joulesched.contracts.net import plain_http_problem, url_problem
from joulesched.impact.errors import ReportError, UsageError
from joulesched.impact.output import render_chart, render_csv, render_table
from joulesched.impact.query import Prometheus, Scope, fetch, iso
from joulesched.impact.report import BY_CHOICES, Report, build_report
from joulesched.impact.tenant import TenantInputs, fetch_tenant, parse_vm_shares
from joulesched.policy import impact
from joulesched.policy import tenant as tenant_policy

# -- arguments -----------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
LAST_TIME = 253_402_300_800.0  # 10000-01-01T00:00:00Z: the first time ISO 8601's four digits cannot write


def parse_duration(text: str) -> float:
    """Seconds from ``90s``, ``5m``, ``1h30m``, ``2d`` or a plain number of seconds."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(a + b for a, b in parts) != text:
            raise UsageError(f"{text!r} is not a duration (e.g. 90s, 5m, 1h30m, 2d)") from None
        value = sum(float(a) * _UNIT[b] for a, b in parts)
    if not value > 0 or not math.isfinite(value):
        raise UsageError(f"duration {text!r} must be > 0")
    return value


def parse_time(text: str, now: float) -> float:
    """Unix seconds from ISO 8601 (naive = UTC), unix seconds, ``now`` or ``now-2h``."""
    text = text.strip()
    if text == "now":
        return now
    if text.startswith("now-"):
        return now - parse_duration(text[4:])
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not (math.isfinite(seconds) and 0 <= seconds < LAST_TIME):
            hint = " (milliseconds? give unix seconds)" if math.isfinite(seconds) and seconds >= LAST_TIME else ""
            raise UsageError(f"{text!r} is not a time between 1970 and 9999 in unix seconds{hint}")
        return seconds
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{text!r} is not a time (ISO 8601 like 2022-06-01T00:00:00Z, unix seconds, now or now-2h)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


# -- the command ----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="joulesched report",
        description="Environmental impact (energy, CO2e, water, SCI) of a namespace, label selector, owner or Nextflow run, from Prometheus.",
    )
    p.add_argument(
        "--prometheus", default="http://127.0.0.1:9090", metavar="URL", help="Prometheus base URL (default %(default)s)"
    )
    scope = p.add_argument_group("scope (at least one; --namespace narrows the others)")
    scope.add_argument("--namespace", "-n", default="", metavar="NS")
    scope.add_argument(
        "--selector", "-l", default="", metavar="SEL", help="pod label selector, matched on kube_pod_labels"
    )
    scope.add_argument("--run", default="", metavar="NAME", help="Nextflow run name (pod label nextflow.io/runName)")
    scope.add_argument("--owner", default="", metavar="KIND/NAME", help="controller, e.g. Deployment/web or Job/etl")
    when = p.add_argument_group("time range")
    when.add_argument("--start", metavar="T", help="ISO 8601 (UTC if naive), unix seconds, now-2h")
    when.add_argument("--end", metavar="T", help="default: now")
    when.add_argument("--last", metavar="DURATION", help="the last DURATION up to now (instead of --start)")
    p.add_argument(
        "--step",
        default="60s",
        metavar="DURATION",
        help="interval of the integration (default 60s, the recording rules' minute)",
    )
    p.add_argument("--by", choices=BY_CHOICES, help="rows per (default: process for --run, else namespace)")
    p.add_argument("--per", choices=impact.FUNCTIONAL_UNITS, default="hour", help="SCI functional unit (default hour)")
    p.add_argument("--requests", type=number(above=0), metavar="N", help="number of requests in the range (for --per request)")
    p.add_argument(
        "--requests-query", metavar="PROMQL", help="PromQL giving the requests in the range; {range} is replaced by it"
    )
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--output", "-o", metavar="FILE", help="write the table/CSV/JSON here instead of stdout")
    p.add_argument("--chart", metavar="FILE.png", help="also draw IT power and cumulative CO2e over time")
    p.add_argument(
        "--timeout", type=number(above=0, unit="seconds"), default=30.0, metavar="SECONDS", help="per Prometheus query, > 0 (default 30)"
    )
    t = p.add_argument_group("tenant mode (VMs: energy from the NADIKI side, CPU from cAdvisor)")
    t.add_argument("--tenant", action="store_true", help="read the servers' energy from the NADIKI side")
    t.add_argument("--registrar", metavar="URL", help="NADIKI registrar API base (GET /servers/{id})")
    t.add_argument("--registrar-token-file", metavar="FILE", help="bearer token for the registrar")
    t.add_argument("--influx", metavar="URL", help="the provider's InfluxDB (1.x /query API)")
    t.add_argument("--database", metavar="DB", help="InfluxDB database (or bucket)")
    t.add_argument("--influx-user", metavar="USER")
    t.add_argument("--influx-password-file", metavar="FILE", help="file holding the InfluxDB password or token")
    t.add_argument("--allow-plain-http", action="store_true", default=None,
                   help="send the token and password over http:// to a host that is not loopback (refused otherwise)")
    t.add_argument(
        "--share",
        choices=tenant_policy.SHARE_POLICIES,
        help="a VM's share of its server: its vCPUs over the server's logical CPUs (vcpu, the default), "
        "or the provider's figure",
    )
    t.add_argument("--vm-share", action="append", metavar="NODE=FRACTION", help="the provider's figure")
    t.add_argument("--threads-per-core", type=number(whole=True, at_least=1), metavar="N", help="logical CPUs per physical core, >= 1 (2)")
    t.add_argument("--intensity", type=INTENSITY, metavar="G", help="grid carbon intensity, gCO2e/kWh, >= 0")
    t.add_argument("--pue", type=number(at_least=1), metavar="X", help="the facility's PUE, >= 1 (default 1.0)")
    t.add_argument("--wue", type=number(at_least=0, unit="litres per kWh"), metavar="L", help="water, litres per kWh, >= 0")
    return p


# The flags of tenant mode (None unless given): Prometheus mode reads the servers' energy and the
# site factors (PUE, WUE, intensity) from Prometheus, so there they would be ignored.
TENANT_ONLY = (
    ("registrar", "--registrar"),
    ("registrar_token_file", "--registrar-token-file"),
    ("influx", "--influx"),
    ("database", "--database"),
    ("influx_user", "--influx-user"),
    ("influx_password_file", "--influx-password-file"),
    ("allow_plain_http", "--allow-plain-http"),
    ("share", "--share"),
    ("vm_share", "--vm-share"),
    ("threads_per_core", "--threads-per-core"),
    ("intensity", "--intensity"),
    ("pue", "--pue"),
    ("wue", "--wue"),
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments, with every flag checked that can be checked without Prometheus (exit 2)."""
    p = _parser()
    args = p.parse_args(list(argv))
    if not args.tenant:
        for attr, flag in TENANT_ONLY:
            if getattr(args, attr) is not None:
                p.error(f"argument {flag}: only with --tenant (Prometheus mode reads the site factors from Prometheus)")
    return args


def _read_file(path: str | None, what: str) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as err:
        raise UsageError(f"{what} {path}: {err.strerror or err}") from err


def tenant_inputs(args: argparse.Namespace) -> TenantInputs:
    missing = [
        flag
        for flag, value in (("--registrar", args.registrar), ("--influx", args.influx), ("--database", args.database))
        if not value
    ]
    if missing:
        raise UsageError(f"--tenant needs {', '.join(missing)}")
    for flag, value, secret, what, given in (
        ("--registrar", args.registrar, "--registrar-token-file", "the registrar token", args.registrar_token_file),
        ("--influx", args.influx, "--influx-password-file", "the InfluxDB password", args.influx_password_file),
    ):
        problem = url_problem(value, secret) or (
            plain_http_problem(value, f"{what} ({secret})", bool(args.allow_plain_http), "--allow-plain-http")
            if given else None
        )
        if problem:
            raise UsageError(f"{flag}: {problem}")
    share = args.share or "vcpu"
    if args.vm_share and share != "provider":
        raise UsageError("--vm-share is the provider's figure: give it with --share provider")
    return TenantInputs(
        RegistrarReader(args.registrar, _read_file(args.registrar_token_file, "--registrar-token-file") or None),
        InfluxReader(
            args.influx,
            args.database,
            args.influx_user or "",
            _read_file(args.influx_password_file, "--influx-password-file"),
        ),
        share,
        parse_vm_shares(args.vm_share or []),
        2 if args.threads_per_core is None else args.threads_per_core,
        args.intensity,
        1.0 if args.pue is None else args.pue,
        args.wue,
    )


def _requests(answer: object, query: str) -> float:
    """The requests a ``--requests-query`` answered: the sum of a vector's samples, or a scalar."""
    if isinstance(answer, list) and len(answer) == 2 and not isinstance(answer[0], dict):
        answer = [{"value": answer}]  # a scalar (or a string): [time, "value"]
    if not isinstance(answer, list) or not answer:
        raise ReportError(f"--requests-query {query!r} returned no series: is the metric there in the range?")
    try:
        return sum(float(row["value"][1]) for row in answer)
    except (KeyError, IndexError, TypeError, ValueError):
        raise ReportError(f"--requests-query {query!r} did not return an instant vector or a scalar") from None


def run(args: argparse.Namespace, prom: Prometheus, now: float) -> Report:
    problem = url_problem(args.prometheus, "")
    if problem:
        raise UsageError(f"--prometheus: {problem}")
    scope = Scope(args.namespace, args.selector, args.run, args.owner)
    if not (scope.namespace or scope.selector or scope.run or scope.owner) and not args.tenant:
        raise UsageError("give a scope: --namespace, --selector, --run or --owner")
    step = parse_duration(args.step)
    if step != round(step):
        raise UsageError(f"--step {args.step}: must be a whole number of seconds")
    end = parse_time(args.end, now) if args.end else now
    if args.last and args.start:
        raise UsageError("give either --start or --last, not both")
    if args.last:
        start = end - parse_duration(args.last)
    elif args.start:
        start = parse_time(args.start, now)
    else:
        raise UsageError("give the range: --start (and --end) or --last")
    if end <= start:
        raise UsageError(f"--end ({iso(end)}) must be after --start ({iso(start)})")
    if args.per == "request":
        if args.requests is not None and args.requests_query:
            raise UsageError("give either --requests or --requests-query, not both")
        if args.requests is None and not args.requests_query:
            raise UsageError("--per request needs --requests N or --requests-query PROMQL")
    by = args.by or ("process" if scope.run else "namespace")
    notes: list[str] = []
    if args.tenant:
        inputs = tenant_inputs(args)
        aligned = math.ceil(start / step) * step  # the servers' windows are aligned on multiples of the step
        if aligned != start:
            notes.append(f"note: the range starts at {iso(aligned)}, the first multiple of the step")
            start = aligned
        fetched = fetch_tenant(prom, inputs, scope, start, end, step)
        data = fetched.data
        notes += fetched.notes
    else:
        data = fetch(prom, scope, start, end, step)
    seconds = float(data.steps[-1] - start)
    if args.per == "request":
        if args.requests_query:
            query = args.requests_query.replace("{range}", f"{round(seconds)}s")
            requests = _requests(prom.instant(query, float(data.steps[-1])), query)
        else:
            requests = args.requests
        if not (math.isfinite(requests) and requests > 0):
            raise ReportError(f"--per request: the requests in the range must be a number > 0, got {requests:g}")
        units = impact.functional_units("request", requests=requests)
    elif args.per == "run":
        in_scope = {(k[1], k[2]) for k in data.pods}
        runs = {(pod[0], run) for pod, (run, _) in data.runs.items() if pod in in_scope}  # a run is its namespace's
        if not runs:
            raise ReportError(
                "--per run: no Nextflow runs among these pods (kube_pod_labels has no nextflow.io/runName for them)"
            )
        units = impact.functional_units("run", runs=len(runs))
    else:
        units = impact.functional_units("hour", seconds=seconds)
    return build_report(data, scope, start, by, args.per, units, tuple(notes))


def main(argv: Sequence[str] | None = None, *, now: Callable[[], float] = time.time) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        report = run(args, Prometheus(args.prometheus, args.timeout), now())
        if args.format == "json":
            text = json.dumps(report.to_json(), indent=2) + "\n"
        elif args.format == "csv":
            text = render_csv(report)
        else:
            text = render_table(report)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            sys.stdout.write(text)
        if args.chart:
            render_chart(report, args.chart)
    except UsageError as err:
        print(f"joulesched report: {err}", file=sys.stderr)
        return 2
    except ReportError as err:
        print(f"joulesched report: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"joulesched report: cannot write {err.filename}: {err.strerror}", file=sys.stderr)
        return 1
    return 0
