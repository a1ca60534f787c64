"""``joulesched sim``: replay workloads on a modelled cluster and compare scheduling policies.

joulesched sim run --trace FILE... --cluster FILE --out DIR [--policies default,most-allocated,energy,carbon]
                   [--seed N] [--percentage-of-nodes-to-score P] [--extender-weight W] [--policy-config FILE]
                   [--extender-url URL|auto|STRATEGY=URL ...] [--extender-profiles FILE|STRATEGY=FILE ...]
                   [--repeat N --every S] [--recording FILE...] [--attribution-cluster FILE] [--no-attribution]
                   [--sensitivity] [--deadline DURATION [--forecast perfect,persistence,day-ahead]]
joulesched sim run --scheduler kube --trace FILE... --cluster FILE --out DIR [--kubeconfig FILE]
                   [--scheduler-name NAME] [--scheduler-profile default|most-allocated] [--seed N]
                   [--time-scale S] [--bind-timeout S]
joulesched sim demo [--out DIR]
joulesched sim generate workflow --shape NAME | --tasks N --makespan S [--layers L] --out FILE.json
joulesched sim generate pods --count N --cluster-cores C [--utilisation U] --out FILE.csv
joulesched sim profiles --cluster FILE --out FILE.json
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from joulesched.contracts.cliargs import number
from joulesched.contracts.documents import read_yaml
from joulesched.policy.config import PolicyConfig, parse_policy
from joulesched.policy.errors import PolicyError
from joulesched.policy.forecast import FORECASTS
from joulesched.policy.validate import Checker
from joulesched.sim.cluster import ClusterSpec, load_cluster
from joulesched.sim.errors import SimError
from joulesched.sim.model import Trace, Workload, repeat
from joulesched.sim.runner import (
    DEFAULT_EXTENDER_WEIGHT,
    DEFER,
    POLICIES,
    VARIANTS,
    RunOptions,
    check_policies,
    split_policy,
    write_profiles,
)

DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$")
MAX_DEADLINE_SECONDS = 31 * 86400.0  # policy.deferral.MAX_DELAY_SECONDS: a month
DEFAULT_LAYERS = 5  # generate workflow --layers
DEFAULT_CORES = "1,4"  # generate workflow --cores
DEFAULT_BIND_TIMEOUT = 30.0  # run --scheduler kube --bind-timeout
SHAPE_SETS = ("tasks", "makespan", "layers", "cores")  # what generate workflow --shape sets
SEED = number(whole=True, at_least=0)  # numpy's generators take seeds of 0 or more


def parse_duration(text: str, flag: str) -> float:
    """``12h``, ``90m``, ``1d``, ``3600`` (seconds) -> seconds; anything else is a ``SimError``."""
    match = DURATION.match(text)
    if not match:
        raise SimError(f"{flag}: must be a duration such as 12h, 90m, 1d or 3600 (seconds), got {text!r}")
    seconds = float(match.group(1)) * DURATION_UNITS[match.group(2)]
    if not 0 < seconds <= MAX_DEADLINE_SECONDS or not math.isfinite(seconds):
        raise SimError(f"{flag}: must be more than 0 and at most 31 days, got {text!r}")
    return seconds


def parse_forecasts(text: str | None) -> tuple[str, ...]:
    names = [f.strip() for f in ("perfect" if text is None else text).split(",") if f.strip()]
    wrong = [f for f in names if f not in FORECASTS]
    if wrong or not names:
        raise SimError(f"--forecast: must be one or more of {', '.join(FORECASTS)}, comma-separated, got {text!r}")
    return tuple(dict.fromkeys(names))


def deferral_policies(policies: str | None, deadline: str | None, forecast: str | None) -> tuple[str, ...]:
    """The policies to run: ``NAME+defer`` becomes one run per forecast; with ``--deadline`` and no
    ``--policies``, the four policies each without and with deferral."""
    forecasts = parse_forecasts(forecast)
    if policies is None:
        names = list(POLICIES) + ([f"{p}{DEFER}" for p in POLICIES] if deadline is not None else [])
    else:
        names = [p.strip() for p in policies.split(",") if p.strip()]
    out: list[str] = []
    for name in names:
        out += [f"{name}:{f}" for f in forecasts] if name.endswith(DEFER) else [name]
    defers = any(split_policy(n)[1] is not None for n in out)
    if forecast is not None and not defers:
        raise SimError(f"--forecast: no policy defers; add --deadline, or NAME{DEFER} to --policies")
    if deadline is not None and not defers:
        raise SimError(f"--deadline: no policy in --policies defers; add NAME{DEFER} (e.g. carbon{DEFER})")
    return check_policies(out)


def check_output_folder(path: str, flag: str = "--out") -> Path:
    """Refuse, before any work and without creating anything, a folder that cannot be made or written in."""
    out = Path(path)
    if out.exists():
        if not out.is_dir():
            raise SimError(f"{flag} {path}: is a file, not a folder")
        if not os.access(out, os.W_OK | os.X_OK):
            raise SimError(f"{flag} {path}: cannot write in this folder (permission denied)")
        return out
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise SimError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SimError(f"{flag} {path}: cannot create it in {parent} (permission denied)")
    return out


def make_output_folder(path: str, flag: str = "--out") -> Path:
    out = check_output_folder(path, flag)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SimError(f"{flag} {path}: cannot create the folder: {err.strerror or err}") from err
    return out


def write_output(path: str, write: Callable[[str], None], flag: str = "--out") -> None:
    """``write(path)``, an ``OSError`` of which is a ``SimError`` naming the flag and the file."""
    try:
        write(path)
    except OSError as err:
        raise SimError(f"{flag} {path}: cannot write: {err.strerror or err}") from err


def _split_map(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    """``URL`` (every joulesched policy) or ``energy=URL carbon=URL``."""
    out: dict[str, str] = {}
    for value in values or []:
        key, sep, rest = value.partition("=")
        if sep and key in ("energy", "carbon"):
            out[key] = rest
        elif sep and "://" not in key:
            raise SimError(f"{flag} {value!r}: the part before '=' must be energy or carbon")
        else:
            out["energy"] = out["carbon"] = value
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="joulesched sim", description="Replay workloads on a modelled cluster and compare policies."
    )
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="replay traces on a cluster with several policies and write a report")
    run.add_argument(
        "--trace",
        action="extend",
        nargs="+",
        required=True,
        metavar="FILE",
        help="WfFormat .json, Nextflow trace.txt, pod CSV or openb CSV",
    )
    run.add_argument(
        "--cluster", required=True, metavar="FILE", help="cluster spec YAML (see sim/data/clusters/example.yaml)"
    )
    run.add_argument("--out", required=True, metavar="DIR", help="report folder (created)")
    run.add_argument(
        "--policies",
        default=None,
        help=f"comma-separated, from {', '.join(POLICIES + VARIANTS)} (default: the first four); "
        "with --scheduler kube: the profile",
    )
    run.add_argument("--seed", type=SEED, default=0, help="0 or more (default 0)")
    run.add_argument(
        "--percentage-of-nodes-to-score",
        type=number(whole=True, at_least=0, at_most=100),
        default=None,
        metavar="P",
        help="0 (default): kube-scheduler's adaptive value; 1..100",
    )
    run.add_argument(
        "--extender-weight",
        type=number(whole=True, at_least=1),
        default=None,
        help=f"kube-scheduler extender weight, 1 or more (default {DEFAULT_EXTENDER_WEIGHT}; deploy/ uses 5)",
    )
    run.add_argument(
        "--policy-config",
        metavar="FILE",
        help="YAML with a policy: mapping (band, neutral_score, ...; strategy is set per policy)",
    )
    run.add_argument(
        "--extender-url",
        action="append",
        metavar="URL",
        help="call a running extender over HTTP (URL, auto, or energy=URL / carbon=URL)",
    )
    run.add_argument(
        "--extender-profiles",
        action="append",
        metavar="FILE",
        help="the profile file that extender's file source reads (FILE or energy=FILE)",
    )
    run.add_argument("--repeat", type=number(whole=True, at_least=1), default=1, metavar="N", help="submit each trace N times")
    run.add_argument(
        "--every", type=number(at_least=0, unit="seconds"), default=600.0, metavar="S", help="seconds between repeats, 0 or more (default 600)"
    )
    run.add_argument(
        "--recording",
        action="extend",
        nargs="+",
        metavar="FILE",
        help="agent recordings whose measured power replaces the model",
    )
    run.add_argument(
        "--attribution-cluster", metavar="FILE", help="cluster for the attribution runs (default: --cluster)"
    )
    run.add_argument("--no-attribution", action="store_true", help="skip the attribution comparison")
    run.add_argument("--sensitivity", action="store_true", help="also run every policy with the autoscaler off")
    run.add_argument("--no-plots", action="store_true")
    run.add_argument(
        "--deadline",
        metavar="DURATION",
        help="make every workflow (and independent pod) deferrable: it must be done this long after it is "
        "submitted (12h, 90m, 1d, seconds); adds NAME+defer runs (see --forecast)",
    )
    run.add_argument(
        "--forecast",
        metavar="LIST",
        help=f"forecasts the deferring runs plan with, comma-separated from {', '.join(FORECASTS)} (default perfect)",
    )
    run.add_argument(
        "--scheduler",
        choices=("model", "kube"),
        default="model",
        help="model: the simulator's kube-scheduler model (default); kube: replay the trace against a real "
        "kube-scheduler and check the model's placements against it",
    )
    kube = run.add_argument_group("--scheduler kube")
    kube.add_argument("--kubeconfig", metavar="FILE", help="the cluster to replay on (default: $KUBECONFIG)")
    kube.add_argument(
        "--scheduler-name", default=None, metavar="NAME", help="schedulerName of the pods (default default-scheduler)"
    )
    kube.add_argument(
        "--scheduler-profile",
        choices=("default", "most-allocated"),
        default=None,
        help="the scoring that scheduler uses: default (LeastAllocated) or most-allocated "
        "(NodeResourcesFit MostAllocated); default: --policies, else default",
    )
    kube.add_argument(
        "--time-scale",
        type=number(at_least=0),
        default=None,
        metavar="S",
        help="simulated seconds per wall second (default 0: as fast as the scheduler binds)",
    )
    kube.add_argument(
        "--bind-timeout",
        type=number(above=0, unit="seconds"),
        default=None,
        metavar="S",
        help="seconds to wait for one pod to be bound (default 30)",
    )

    demo = sub.add_parser("demo", help="the shipped example end to end (under a minute)")
    demo.add_argument("--out", default="sim-demo", metavar="DIR", help="report folder (created; default: sim-demo)")
    demo.add_argument("--seed", type=SEED, default=0, help="0 or more (default 0)")
    demo.add_argument("--extender-url", action="append", metavar="URL", help="as for run (auto: start extenders)")
    demo.add_argument(
        "--extender-profiles", action="append", metavar="FILE", help="as for run: needed with a URL other than auto"
    )

    gen = sub.add_parser("generate", help="write a synthetic trace of a given shape")
    gsub = gen.add_subparsers(dest="kind", required=True)
    wf = gsub.add_parser("workflow", help="a layered workflow DAG (WfFormat JSON)")
    wf.add_argument(
        "--shape",
        help="rnaseq-shape, quantms-shape or rangeland-shape (sets the tasks, makespan, layers and cores)",
    )
    wf.add_argument("--tasks", type=number(whole=True, at_least=1), help="1 or more (without --shape)")
    wf.add_argument("--makespan", type=number(above=0, unit="seconds"), help="seconds, > 0 (about the critical path; without --shape)")
    wf.add_argument("--layers", type=number(whole=True, at_least=1), default=None, help=f"1 or more (default {DEFAULT_LAYERS}; without --shape)")
    wf.add_argument(
        "--cores", default=None, help=f"request range MIN,MAX (whole cores; default {DEFAULT_CORES}; without --shape)"
    )
    wf.add_argument("--seed", type=SEED, default=0, help="0 or more (default 0)")
    wf.add_argument("--name")
    wf.add_argument("--out", required=True)
    pods = gsub.add_parser("pods", help="independent pods with Poisson arrivals (pod CSV)")
    pods.add_argument("--count", type=number(whole=True, at_least=1), required=True, help="1 or more")
    pods.add_argument("--cluster-cores", type=number(above=0), required=True, help="> 0")
    pods.add_argument("--utilisation", type=number(above=0, at_most=1), default=0.6, help="> 0 and <= 1 (default 0.6)")
    pods.add_argument("--mean-duration", type=number(above=0, unit="seconds"), default=300.0, help="seconds, > 0 (default 300)")
    pods.add_argument("--seed", type=SEED, default=0, help="0 or more (default 0)")
    pods.add_argument("--out", required=True)

    prof = sub.add_parser("profiles", help="write a cluster as the profile document an extender reads")
    prof.add_argument("--cluster", required=True)
    prof.add_argument("--out", required=True)
    return p.parse_args(list(argv))


def load_policy(path: str | None) -> PolicyConfig:
    if path is None:
        return PolicyConfig()
    doc = read_yaml(path)
    check = Checker(path)
    root = check.mapping(doc, "")
    check.unknown_keys(root, ("policy",), "")
    cfg = parse_policy(root.get("policy"), check, "policy")
    check.raise_if_any()
    return cfg


def read_traces(paths: Sequence[str]) -> list[Trace]:
    from joulesched.sim.traces import read_trace

    return [read_trace(p) for p in paths]


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "demo":
            from joulesched.sim.demo import run_demo

            check_output_folder(args.out)
            return run_demo(
                Path(args.out),
                seed=args.seed,
                extender_urls=_split_map(args.extender_url, "--extender-url"),
                extender_profiles=_split_map(args.extender_profiles, "--extender-profiles"),
            )
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "profiles":
            cluster = load_cluster(args.cluster)
            write_output(args.out, lambda path: write_profiles(path, cluster))
            print(f"wrote {args.out}")
            return 0
    except (SimError, PolicyError) as err:
        print(f"joulesched sim: {err}", file=sys.stderr)
        return 2
    return 2  # pragma: no cover - argparse requires a command


def cmd_run(args: argparse.Namespace) -> int:
    if args.scheduler == "kube":
        return cmd_run_kube(args)
    from joulesched.sim.execute import execute

    for attr, flag in KUBE_ONLY:
        if getattr(args, attr) is not None:
            raise SimError(f"{flag}: only with --scheduler kube")
    policies = deferral_policies(args.policies, args.deadline, args.forecast)
    deadline = parse_duration(args.deadline, "--deadline") if args.deadline is not None else None
    percentage = 0 if args.percentage_of_nodes_to_score is None else args.percentage_of_nodes_to_score
    weight = DEFAULT_EXTENDER_WEIGHT if args.extender_weight is None else args.extender_weight
    check_output_folder(args.out)
    cluster = load_cluster(args.cluster)
    traces = read_traces(args.trace)
    if deadline is not None:
        traces = [t.deferrable(deadline) for t in traces]
    workload = Workload.of([copy for t in traces for copy in repeat(t, args.repeat, args.every)])
    if any(split_policy(p)[1] is not None for p in policies) and not any(
        p.max_delay is not None for p in workload.pods
    ):
        raise SimError(
            f"--policies: a {DEFER} policy needs deferrable work: give --deadline, or a max_delay column in a pod CSV"
        )
    attribution_cluster = load_cluster(args.attribution_cluster) if args.attribution_cluster else cluster
    samples = _samples(args.recording, cluster) if args.recording else ()
    opts = RunOptions(
        policies=policies,
        seed=args.seed,
        percentage_of_nodes_to_score=percentage,
        extender_weight=weight,
        policy=load_policy(args.policy_config),
        extender_urls=_split_map(args.extender_url, "--extender-url"),
        extender_profiles=_split_map(args.extender_profiles, "--extender-profiles"),
        workdir=str(Path(args.out) / "extender"),
        samples=samples,
    )
    attribution = [] if args.no_attribution else [Workload.of([t]) for t in _first_arrival_zero(traces) if t.workflows]
    results = execute(
        cluster,
        workload,
        opts,
        make_output_folder(args.out),
        attribution_cluster=attribution_cluster,
        attribution_workloads=attribution,
        sensitivity=args.sensitivity,
        plots=not args.no_plots,
        inputs=[str(p) for p in args.trace],
    )
    missed = results.get("deadlines_missed", 0)
    if missed:
        print(
            f"joulesched sim: DEADLINES MISSED: {missed} deferred units finished after their deadline "
            "(report.md, 'Carbon-aware deferral')",
            file=sys.stderr,
        )
        return 1
    return 0


# Flags of --scheduler kube alone (None unless given).
KUBE_ONLY = (
    ("kubeconfig", "--kubeconfig"),
    ("scheduler_name", "--scheduler-name"),
    ("scheduler_profile", "--scheduler-profile"),
    ("time_scale", "--time-scale"),
    ("bind_timeout", "--bind-timeout"),
)
# Flags of the model alone (None or False unless given).
KUBE_UNUSED = (
    ("percentage_of_nodes_to_score", "--percentage-of-nodes-to-score"),
    ("extender_weight", "--extender-weight"),
    ("no_attribution", "--no-attribution"),
    ("no_plots", "--no-plots"),
    ("extender_url", "--extender-url"),
    ("extender_profiles", "--extender-profiles"),
    ("recording", "--recording"),
    ("attribution_cluster", "--attribution-cluster"),
    ("policy_config", "--policy-config"),
    ("sensitivity", "--sensitivity"),
    ("deadline", "--deadline"),
    ("forecast", "--forecast"),
)


def kube_profile(policies: str | None, profile: str | None) -> str:
    """The profile the real scheduler uses: ``--scheduler-profile``, else ``--policies`` (one of two)."""
    from joulesched.sim.kubereplay import PROFILES

    named = [p.strip() for p in (policies or "").split(",") if p.strip()]
    wrong = [p for p in named if p not in PROFILES]
    if wrong:
        raise SimError(
            f"--policies {wrong[0]!r}: --scheduler kube replays on one real scheduler; "
            f"name its profile ({', '.join(PROFILES)})"
        )
    if len(named) > 1:
        raise SimError("--policies: --scheduler kube replays one profile at a time; name one (or --scheduler-profile)")
    if profile and named and named[0] != profile:
        raise SimError(f"--policies {named[0]} and --scheduler-profile {profile} disagree")
    return profile or (named[0] if named else "default")


def cmd_run_kube(args: argparse.Namespace) -> int:
    """``--scheduler kube``: replay on a real kube-scheduler and report how often the model agrees."""
    import orjson

    from joulesched.sim.kubereplay import KubeOptions, placements_csv, replay, summary_table

    for attr, flag in KUBE_UNUSED:
        value = getattr(args, attr)
        if value is not None and value is not False:
            raise SimError(f"{flag}: not used with --scheduler kube")
    time_scale = 0.0 if args.time_scale is None else args.time_scale
    bind_timeout = DEFAULT_BIND_TIMEOUT if args.bind_timeout is None else args.bind_timeout
    check_output_folder(args.out)
    opts = KubeOptions(
        kubeconfig=args.kubeconfig,
        scheduler_name="default-scheduler" if args.scheduler_name is None else args.scheduler_name,
        profile=kube_profile(args.policies, args.scheduler_profile),
        seed=args.seed,
        time_scale=time_scale,
        bind_timeout=bind_timeout,
    )
    cluster = load_cluster(args.cluster)
    traces = read_traces(args.trace)
    workload = Workload.of([copy for t in traces for copy in repeat(t, args.repeat, args.every)])
    from joulesched.sim.progress import Progress

    bar = Progress()
    try:
        result = replay(cluster, workload, opts, progress=lambda f: bar(f"kube {opts.profile}", f))
    finally:
        bar.done()
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        doc = {
            "format": "joulesched-sim-results",
            "version": 1,
            "scheduler": "kube",
            "inputs": [str(p) for p in args.trace],
            "cluster": {"name": cluster.name, "file": cluster.source, "nodes": cluster.node_count},
            "seed": args.seed,
            "kube_agreement": {
                "scheduler_name": opts.scheduler_name,
                "profile": opts.profile,
                "kubeconfig": args.kubeconfig or "$KUBECONFIG",
                **result.to_json(),
            },
        }
        (out / "results.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        (out / "placements.csv").write_text(placements_csv(result), encoding="utf-8")
    except OSError as err:
        raise SimError(f"--out {out}: cannot write: {err.strerror or err}") from err
    print(summary_table(result, opts))
    print(f"wrote {out / 'results.json'} and {out / 'placements.csv'}")
    return 0


def _first_arrival_zero(traces: Sequence[Trace]) -> list[Trace]:
    return [t.shifted(-min(p.arrival for p in t.pods)) for t in traces]


def _samples(paths: Sequence[str], cluster: ClusterSpec) -> list[tuple[float, int, float]]:
    from joulesched.sim.recording import read_recordings, replay_samples

    return replay_samples(read_recordings(paths), [n.name for n in cluster.nodes()])


def cmd_generate(args: argparse.Namespace) -> int:
    from joulesched.sim.traces.synthetic import (
        PUBLISHED_SHAPES,
        WorkflowShape,
        independent_pods,
        workflow_shape,
        write_pod_csv,
        write_wfformat,
    )

    if args.kind == "workflow":
        if args.shape is not None:
            if args.shape not in PUBLISHED_SHAPES:
                raise SimError(f"--shape: unknown shape {args.shape!r} (known: {', '.join(PUBLISHED_SHAPES)})")
            for attr in SHAPE_SETS:
                if getattr(args, attr) is not None:
                    raise SimError(f"--{attr}: not with --shape (the shape sets {', '.join(SHAPE_SETS)})")
            shape = PUBLISHED_SHAPES[args.shape]
            name = args.name or args.shape
        else:
            if args.tasks is None or args.makespan is None:
                raise SimError("generate workflow: give --shape, or --tasks and --makespan")
            layers = DEFAULT_LAYERS if args.layers is None else args.layers
            text = DEFAULT_CORES if args.cores is None else args.cores
            lo, _, hi = text.partition(",")
            try:
                cores = (int(lo), int(hi or lo))
            except ValueError as err:
                raise SimError(f"--cores: must be MIN,MAX whole cores, got {text!r}") from err
            if cores[0] < 1 or cores[1] < cores[0]:
                raise SimError(f"--cores: must be MIN,MAX whole cores with 1 <= MIN <= MAX, got {text!r}")
            shape = WorkflowShape(args.tasks, args.makespan, layers, cores)
            name = args.name or Path(args.out).stem
        trace = workflow_shape(name, shape, args.seed)
        write_output(args.out, lambda path: write_wfformat(trace, path))
    else:
        trace = independent_pods(
            args.count,
            cluster_cores=args.cluster_cores,
            utilisation=args.utilisation,
            mean_duration=args.mean_duration,
            seed=args.seed,
        )
        write_output(args.out, lambda path: write_pod_csv(trace, path))
    print(f"wrote {args.out}")
    return 0
