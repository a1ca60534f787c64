"""``joulesched expander``: write cluster-autoscaler's priority-expander ConfigMap from efficiency.

::

    joulesched expander (--profiles FILE | --prometheus URL)
                        [--node-group-label LABEL | --group-from-name REGEX]
                        [--group-pattern TEMPLATE] [--strategy energy|carbon] [--namespace NS]
                        [--output FILE|-] [--apply [--kubeconfig FILE]] [--watch SECONDS]

Node profiles (a profile file, or the agents' metrics in Prometheus, as the extender reads them)
are grouped into node groups, each group gets one figure (``policy.efficiency``: joules, or
grams CO2e, per unit of work; the median over its profiled nodes) and the groups are ranked
into cluster-autoscaler priorities, the most efficient the highest. The ConfigMap
``cluster-autoscaler-priority-expander`` carries them in the expander's documented format:
``data.priorities`` is a YAML string mapping each priority to a list of regular expressions
matched against the autoscaler's node-group names.

A node's group is the value of its first node-group label (``--node-group-label``, default the
first of ``joulesched.io/node-group``, ``eks.amazonaws.com/nodegroup``,
``cloud.google.com/gke-nodepool``, ``kubernetes.azure.com/agentpool`` that the node carries;
read from the Kubernetes API), or a capture of its name (``--group-from-name``, no API needed).
The autoscaler's node-group name is often not the label's value (EKS: the Auto Scaling group
``eks-<nodegroup>-<uuid>``); ``--group-pattern`` is the regex written for each group, with
``{group}`` replaced by the group's name, escaped (default ``^{group}$``: whole names only, so
``epyc-7763`` never matches ``epyc-7763-2s``). A last entry ``.*`` at priority 1 keeps groups
joulesched has no profile for usable when nothing ranked fits (``--no-fallback`` drops it; the
expander then never expands an unmatched group while a matched one fits).

``--apply`` only reads and patches the ConfigMap, which the deployment ships (deploy/expander,
the chart) with :data:`PLACEHOLDER_PRIORITIES`: its RBAC grants ``get`` and ``patch`` on that one
name and no ``create`` (RBAC cannot limit ``create`` to a name, so a create grant would let it
write any ConfigMap of the autoscaler's namespace). When the ConfigMap is missing, a round fails
with :class:`ConfigMapMissing`, which says how to create it; ``--watch`` logs it and retries.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from joulesched.contracts.cliargs import number
from joulesched.contracts.net import url_problem
from joulesched.extender.errors import ExpanderError, ExtenderError
from joulesched.policy.efficiency import STRATEGIES, Efficiency, group_efficiency, priorities, profile_efficiency
from joulesched.policy.errors import ConfigError
from joulesched.policy.profile import ProfileSet

log = logging.getLogger(__name__)

CONFIGMAP_NAME = "cluster-autoscaler-priority-expander"  # fixed by cluster-autoscaler
CONFIGMAP_KEY = "priorities"
DEFAULT_NAMESPACE = "kube-system"
GROUP_LABELS = (
    "joulesched.io/node-group",
    "eks.amazonaws.com/nodegroup",
    "cloud.google.com/gke-nodepool",
    "kubernetes.azure.com/agentpool",
)
DEFAULT_PATTERN = "^{group}$"
FALLBACK_PRIORITY = 1
FALLBACK_REGEX = ".*"
MANAGED_BY = {"app.kubernetes.io/managed-by": "joulesched"}
# What deploy/expander/configmap.yaml and the chart ship before the first ranking: every group at
# the fallback priority, i.e. no preference (cluster-autoscaler uses a group that matches no
# regex only when nothing else fits, so the entry must match everything).
PLACEHOLDER_PRIORITIES = f"{FALLBACK_PRIORITY}:\n- {FALLBACK_REGEX}\n"
RE2_SPECIAL = set("\\.+*?()|[]{}^$")
# What Python's re takes and Go's RE2 (cluster-autoscaler's regexp) refuses — lookaround, atomic
# groups, named back-references, back-references, \Z, possessive quantifiers: one such regex
# makes cluster-autoscaler ignore the whole priorities map.
PYTHON_ONLY = re.compile(r"\(\?(?:[=!>(]|<[=!]|P=)|\\[1-9Z]|[*+?}]\+")


def escape(name: str) -> str:
    """``name`` as a literal in an RE2 (Go) regular expression, escaping only what must be."""
    return "".join("\\" + c if c in RE2_SPECIAL else c for c in name)


def group_regex(template: str, group: str) -> str:
    return template.replace("{group}", escape(group))


def check_template(template: str) -> None:
    if template.count("{group}") != 1:
        raise ExpanderError(f"--group-pattern {template!r}: must contain {{group}} exactly once")
    try:
        re.compile(group_regex(template, "x"))
    except re.error as err:
        raise ExpanderError(f"--group-pattern {template!r}: not a valid regular expression: {err}") from err
    found = PYTHON_ONLY.search(template)
    if found:
        raise ExpanderError(
            f"--group-pattern {template!r}: {found.group()!r} is not RE2 syntax, which cluster-autoscaler's "
            "regular expressions are (no lookaround, back-references, \\Z or possessive quantifiers)"
        )


@dataclass(frozen=True)
class Ranking:
    figures: Mapping[str, Efficiency]  # group -> figure
    members: Mapping[str, tuple[str, ...]]  # group -> its profiled nodes
    skipped: tuple[str, ...]  # one line per profiled node left out, and why
    unprofiled: tuple[str, ...]  # groups seen in the cluster without any profiled node


def rank_groups(profiles: ProfileSet, group_of: Mapping[str, str], strategy: str,
                cluster_groups: Sequence[str] = ()) -> Ranking:
    """Figures per node group; ``group_of`` maps node name -> group (nodes absent are skipped)."""
    per_group: dict[str, list[Efficiency]] = defaultdict(list)
    members: dict[str, list[str]] = defaultdict(list)
    skipped = []
    for p in profiles.nodes:
        group = group_of.get(p.name)
        if not group:
            skipped.append(f"{p.name}: no node group")
            continue
        per_group[group].append(profile_efficiency(p, strategy))
        members[group].append(p.name)
    figures = {g: group_efficiency(effs) for g, effs in per_group.items()}
    unprofiled = tuple(sorted(set(cluster_groups) - set(figures)))
    return Ranking(figures, {g: tuple(sorted(m)) for g, m in members.items()}, tuple(skipped), unprofiled)


def priorities_yaml(figures: Mapping[str, Efficiency], template: str = DEFAULT_PATTERN, fallback: bool = True) -> str:
    """The ``data.priorities`` string: ``{priority: [regex, ...]}``, highest first."""
    doc: dict[int, list[str]] = {
        prio: [group_regex(template, g) for g in groups] for prio, groups in priorities(figures).items()
    }
    if fallback:
        doc[FALLBACK_PRIORITY] = [FALLBACK_REGEX]
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def configmap(priorities_text: str, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP_NAME, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "data": {CONFIGMAP_KEY: priorities_text},
    }


# -- inputs -------------------------------------------------------------------------------------


def load_profiles(args: argparse.Namespace) -> ProfileSet:
    if args.profiles:
        from joulesched.extender.profiles import read_profile_file

        try:
            profiles = read_profile_file(args.profiles)
        except ConfigError as err:
            raise ExpanderError(str(err)) from err
        where = args.profiles
    else:
        from joulesched.extender.profiles import PrometheusSource

        snap = PrometheusSource(
            args.prometheus, cache_seconds=1.0, timeout_seconds=args.timeout, selector=args.prometheus_selector
        ).snapshot()
        if snap.error:
            raise ExpanderError(snap.error)
        profiles, where = snap.profiles, f"prometheus {args.prometheus}"
    if not profiles.nodes:
        raise ExpanderError(f"{where}: no node profiles")
    return profiles


def groups_from_names(profiles: ProfileSet, pattern: str) -> dict[str, str]:
    try:
        rx = re.compile(pattern)
    except re.error as err:
        raise ExpanderError(f"--group-from-name {pattern!r}: not a valid regular expression: {err}") from err
    out = {}
    for p in profiles.nodes:
        m = rx.search(p.name)
        if m:
            out[p.name] = m.group(1) if rx.groups else m.group(0)
    return out


def groups_from_labels(api: Any, label: str | None) -> tuple[dict[str, str], set[str]]:
    """Node name -> group from the nodes' labels, and every group seen in the cluster."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api)  # untyped use: the answers are read as plain objects
    nodes = core.list_node(_request_timeout=30).items
    candidates = (label,) if label else GROUP_LABELS
    out: dict[str, str] = {}
    for node in nodes:
        labels = node.metadata.labels or {}
        for key in candidates:
            if labels.get(key):
                out[node.metadata.name] = labels[key]
                break
    if not out:
        raise ExpanderError(
            f"no node of the cluster ({len(nodes)} nodes) has the node-group label "
            f"{' or '.join(candidates)}; name the label with --node-group-label, or use --group-from-name"
        )
    return out, set(out.values())


# -- the ConfigMap in the cluster -------------------------------------------------------------


class ConfigMapMissing(ExtenderError):
    """``--apply`` found no ConfigMap to patch: the deployment ships it, the expander never creates it."""

    def __init__(self, namespace: str, name: str = CONFIGMAP_NAME) -> None:
        self.namespace, self.name = namespace, name
        placeholder = PLACEHOLDER_PRIORITIES.replace("\n", "\\n")
        super().__init__(
            f"configmap {namespace}/{name} not found: joulesched expander only updates it (its RBAC grants get "
            f"and patch on that name, no create); create it with `kubectl apply -k deploy/expander/` (the chart: "
            f"expander.enabled=true), or `kubectl -n {namespace} create configmap {name} "
            f"--from-literal={CONFIGMAP_KEY}=$'{placeholder}'`; retried every round under --watch"
        )


def apply_configmap(api: Any, cm: Mapping[str, Any]) -> str:
    """Patch the ConfigMap's ``priorities`` when it differs: ``updated``/``unchanged``.

    The ConfigMap must exist (the deployment ships it); :class:`ConfigMapMissing` otherwise. Only
    that key is written: its labels and annotations are its owner's (Helm's, with the chart).
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(api)
    name, ns = cm["metadata"]["name"], cm["metadata"]["namespace"]
    try:
        current = core.read_namespaced_config_map(name, ns, _request_timeout=30)
        # only the key written here: another (a README someone added) stays, and is no difference
        if (current.data or {}).get(CONFIGMAP_KEY) == cm["data"][CONFIGMAP_KEY]:
            return "unchanged"
        core.patch_namespaced_config_map(name, ns, {"data": cm["data"]}, _request_timeout=30)
    except ApiException as err:
        if err.status == 404:  # missing, or deleted between the read and the patch
            raise ConfigMapMissing(ns, name) from err
        raise
    return "updated"


# -- the command --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="joulesched expander",
        description="Write cluster-autoscaler's priority-expander ConfigMap from the node groups' efficiency.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--profiles", metavar="FILE", help="node profile document (YAML or JSON), as the extender's file source")
    src.add_argument("--prometheus", metavar="URL", help="read the agents' profiles from Prometheus")
    p.add_argument("--prometheus-selector", metavar="MATCHERS", default="",
                   help='label matchers for the agents\' series, as the extender\'s profiles.prometheus.selector'
                        ' (deploy/: job="joulesched-agent"; default: none, every target\'s series of those names)')
    grp = p.add_mutually_exclusive_group()
    grp.add_argument("--node-group-label", metavar="LABEL",
                     help=f"node label naming a node's group (default: the first of {', '.join(GROUP_LABELS)})")
    grp.add_argument("--group-from-name", metavar="REGEX",
                     help="take the group from the node name instead (first capture group, or the match)")
    p.add_argument("--group-pattern", metavar="TEMPLATE", default=DEFAULT_PATTERN,
                   help="regex written per group, {group} = its escaped name (default: %(default)s)")
    p.add_argument("--strategy", choices=STRATEGIES, default="energy", help="rank by energy or carbon per unit of work")
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the cluster-autoscaler's namespace (default: %(default)s)")
    p.add_argument("--no-fallback", dest="fallback", action="store_false",
                   help=f"omit the {FALLBACK_REGEX!r} entry at priority {FALLBACK_PRIORITY}")
    p.add_argument("--output", metavar="FILE", help="write the ConfigMap YAML to FILE ('-': stdout; the default without --apply)")
    p.add_argument("--apply", action="store_true",
                   help="patch the ConfigMap in the cluster (it must exist: deploy/expander and the chart ship it)")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""),
                   help="kubeconfig file (default: $KUBECONFIG, else the in-cluster service account)")
    p.add_argument("--watch", type=number(above=0, unit="seconds"), metavar="SECONDS",
                   help="keep it current: re-rank every SECONDS, write only when the priorities change")
    p.add_argument("--timeout", type=number(above=0, unit="seconds"), default=10.0, help="Prometheus query timeout in seconds")
    args = p.parse_args(list(argv))
    from joulesched.extender.profiles import SELECTOR

    if not SELECTOR.fullmatch(args.prometheus_selector):
        p.error(f'--prometheus-selector: must be PromQL label matchers, comma-separated (job="joulesched-agent"), '
                f"got {args.prometheus_selector!r}")
    if args.prometheus:
        problem = url_problem(args.prometheus, "")
        if problem:
            p.error(f"--prometheus: {problem}")
    if args.output is None and not args.apply:
        args.output = "-"
    return args


def build(args: argparse.Namespace, api: Any) -> tuple[dict[str, Any], Ranking]:
    profiles = load_profiles(args)
    if args.group_from_name:
        group_of, cluster_groups = groups_from_names(profiles, args.group_from_name), set[str]()
    else:
        if api is None:
            raise ExpanderError("node groups come from node labels, which needs --apply or --kubeconfig; "
                                "or give --group-from-name")
        group_of, cluster_groups = groups_from_labels(api, args.node_group_label)
    ranking = rank_groups(profiles, group_of, args.strategy, sorted(cluster_groups))
    if not ranking.figures:
        where = args.profiles or f"prometheus {args.prometheus}"
        how = f"--group-from-name {args.group_from_name!r}" if args.group_from_name else "the node-group labels"
        raise ExpanderError(f"{where}: no profiled node is in a node group by {how} "
                            f"(nodes: {', '.join(p.name for p in profiles.nodes[:5])}...)")
    return configmap(priorities_yaml(ranking.figures, args.group_pattern, args.fallback), args.namespace), ranking


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as ``|`` blocks: the priorities read as the expander's docs show them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _str)


def configmap_yaml(cm: Mapping[str, Any]) -> str:
    return yaml.dump(dict(cm), Dumper=_BlockDumper, sort_keys=False, default_flow_style=False)


def write_output(path: str, cm: Mapping[str, Any]) -> None:
    text = configmap_yaml(cm)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(path).write_text(text)
    except OSError as err:
        raise ExpanderError(f"--output {path}: cannot write: {err.strerror or err}") from err


def run_once(args: argparse.Namespace, api: Any, last: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    """One round; ``--output`` is written only when the data differs from ``last`` round's."""
    cm, ranking = build(args, api)
    for line in ranking.skipped:
        log.info("not ranked: %s", line)
    if ranking.unprofiled:
        log.info("groups without a profiled node (priority %d via %r): %s",
                 FALLBACK_PRIORITY, FALLBACK_REGEX, ", ".join(ranking.unprofiled))
    for group in sorted(ranking.figures, key=lambda g: ranking.figures[g]):
        e = ranking.figures[group]
        unit = "gCO2e" if args.strategy == "carbon" else "J"
        log.info("%s: %.6g %s per unit of %s work (nodes: %s)", group, e.cost, unit, "GPU" if e.gpu else "CPU",
                 ", ".join(ranking.members[group]))
    if args.output and (last is None or last != cm["data"]):
        write_output(args.output, cm)
    outcome = apply_configmap(api, cm) if args.apply else "written"
    if args.apply:
        log.info("configmap %s/%s %s", args.namespace, CONFIGMAP_NAME, outcome)
    return cm, outcome


def main(argv: Sequence[str], sleep: Callable[[float], None] = time.sleep) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        check_template(args.group_pattern)
        api = None
        if args.apply or not args.group_from_name:
            missing = [p for p in (args.kubeconfig or "").split(os.pathsep) if p and not os.path.isfile(p)]
            if missing:  # a list of files, as $KUBECONFIG may hold (kubectl's convention)
                raise ExpanderError(f"--kubeconfig {args.kubeconfig}: no such file: {', '.join(missing)}")
            if args.apply or args.kubeconfig:
                from joulesched.extender.kube import api_client

                try:
                    api = api_client(args.kubeconfig)
                except Exception as err:  # the config loaders raise several types
                    raise ExpanderError(f"kubernetes client config ({args.kubeconfig or 'in-cluster'}): {err}") from err
        last: Mapping[str, Any] | None = None
        try:
            last = run_once(args, api)[0]["data"]
        except ConfigMapMissing as err:  # the cluster's state, not the input: a controller waits
            if args.watch is None:
                raise
            log.error("%s", err)
    except ExpanderError as err:
        print(f"joulesched expander: {err}", file=sys.stderr)
        return 2
    except ConfigMapMissing as err:
        print(f"joulesched expander: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # the API's answer (forbidden, unreachable): not an input error
        print(f"joulesched expander: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    if args.watch is None:
        return 0
    while True:  # pragma: no branch - a controller runs until stopped
        sleep(args.watch)
        try:
            last = run_once(args, api, last)[0]["data"]
        except ConfigMapMissing as err:  # said every round until someone creates it
            log.error("%s", err)
        except Exception as err:  # keep the last ConfigMap; the next round retries
            log.error("keeping the current ConfigMap: %s", err)
