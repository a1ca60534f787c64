"""The extender's decisions, independent of HTTP: filter, prioritize, explain, preempt, bind.

:class:`Extender` joins a profile source, the predicted-load ledger and the pure policy. Each
verb takes a request body (bytes) and returns a JSON-ready object; bad input raises
``WireError``/``PolicyError`` whose message names the field, which the HTTP layer turns into
a 400.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from itertools import repeat
from operator import is_
from typing import Any

import numpy as np

from joulesched.extender import wire
from joulesched.extender.errors import BindDisabled, LeftToScheduler
from joulesched.extender.logsafe import escape
from joulesched.extender.predicted import Occupancy, Placement, PredictedLoad, RowLoad, Unbound
from joulesched.extender.profiles import ProfileSource, Snapshot
from joulesched.policy.config import PolicyConfig
from joulesched.policy.demand import PodDemand, demand_from_pod, owner_of
from joulesched.policy.scoring import (
    REASON_GPU_RESERVED,
    REASON_SATURATED,
    REASON_STALE,
    REASON_UNKNOWN,
    Evaluation,
    evaluate,
    idle_power_avoidable,
)

log = logging.getLogger(__name__)

Binder = Callable[[wire.BindingArgs], None]  # raises on failure

SERVER_ID_LABEL = "joulesched.io/server-id"
# How long after a pod's filter its prioritize may be answered from the filter's evaluation:
# longer than a scheduling cycle between the two verbs, short against every time the policy
# counts in (measurement age, the ledger's settling, pods' runtimes).
CYCLE_SECONDS = 1.0


def scheduler_binds(args: wire.BindingArgs) -> None:
    """The binder of ``bind.write: false``: writes nothing, and says kube-scheduler binds.

    kube-scheduler calls an extender's bind verb before its own binder, and when an extender
    whose entry is ``ignorable`` answers with an error, it logs that answer and binds the pod
    itself (``extendersBinding``, then the DefaultBinder plugin). The bind verb then tells the
    extender where each pod went, as it does when the extender writes the binding, and the
    write stays kube-scheduler's: in Go, under its own API rate and identity.
    """
    raise LeftToScheduler(
        f"joulesched: {args.pod_namespace}/{args.pod_name} on {args.node} recorded; kube-scheduler binds it (bind.write: false)"
    )


@dataclass(frozen=True)
class Decision:
    """One evaluation, kept for the explain endpoint and the per-node metrics."""

    args: wire.ExtenderArgs
    demand: PodDemand
    snapshot: Snapshot
    rows: np.ndarray
    evaluation: Evaluation
    at: float


class Extender:
    def __init__(
        self,
        source: ProfileSource,
        policy: PolicyConfig,
        predicted: PredictedLoad,
        clock: Callable[[], float] = time.time,
        binder: Binder | None = None,
        server_id_label: str = SERVER_ID_LABEL,
        occupancy: Occupancy | None = None,
        unbound: Unbound | None = None,
        on_filter_kept: Callable[[str], None] = lambda kept: None,
    ) -> None:
        self.source = source
        self.on_filter_kept = on_filter_kept  # each filter answer that keeps a node: what it kept (best | top | all)
        self.unbound = unbound or Unbound(0.0)
        self.policy = policy
        self.predicted = predicted
        self.occupancy = occupancy
        self.clock = clock
        self.binder = binder
        self.last: Decision | None = None  # read by the metrics thread
        self.server_id_label = server_id_label
        # node name -> physical server id, replaced whole by the node watch (never mutated)
        self.node_servers: Mapping[str, str] = {}
        self._alias: tuple[int, Mapping[str, str], Mapping[str, int]] | None = None  # (version, node_servers, alias)
        # The last evaluation and what it read (see _same_cycle).
        self._cycle: tuple[tuple[object, ...], Decision] | None = None
        # The last NodeNames request's body and what was read from it (see _args).
        self._read: tuple[bytes, wire.ExtenderArgs] | None = None

    # -- the shared step ----------------------------------------------------------------------

    def decide(self, args: wire.ExtenderArgs) -> Decision:
        snap = self.source.snapshot()
        arrays = snap.arrays
        index = self._index(snap, args)
        now = self.clock()
        load, own = self.predicted.per_row_and_own(index, arrays.updated, now, wire.pod_identity(args.pod)[2])
        held = self.occupancy.per_row(index, len(arrays)) if self.occupancy is not None else None
        # Everything the evaluation reads but the pod, the nodes and the time: each is replaced,
        # never written in place, when it changes.
        inputs = (snap, index, *load, own, held)
        decision = self._same_cycle(args, inputs, now)
        if decision is None:
            decision = self._evaluate(args, snap, index, load, own, held, now)
            self._cycle = (inputs, decision)
        self.last = decision
        return decision

    def _evaluate(
        self,
        args: wire.ExtenderArgs,
        snap: Snapshot,
        index: Mapping[str, int],
        load: RowLoad,
        own: Placement | None,
        held: np.ndarray | None,
        now: float,
    ) -> Decision:
        demand = demand_from_pod(args.pod)
        if snap.owner_cores:
            owner = owner_of(args.pod)
            observed = snap.owner_cores.get(owner) if owner is not None else None
            if observed is not None and observed > 0:
                demand = demand.with_observed_cpu(observed)
        rows = np.fromiter(map(index.get, args.node_names, repeat(-1)), dtype=np.intp, count=len(args.node_names))
        if own is not None:
            # A pod asked about again (a retry, or explain after prioritize) is not its own load.
            load = load.without(index[own.node], own)
        held_until = self._held_until(held, load) if idle_power_avoidable(snap.arrays, self.policy) else None
        evaluation = evaluate(snap.arrays, rows, demand, self.policy, now, load.cores, load.gpus, held_until)
        # Kept until the next request (as ``last``): without the full Node objects, which would
        # double the memory of the next Nodes-mode request (its objects and these, at once).
        return Decision(wire.ExtenderArgs(args.pod, args.node_names, None), demand, snap, rows, evaluation, now)

    def _args(self, body: bytes) -> wire.ExtenderArgs:
        """The request's arguments, not read again from the same bytes as the last NodeNames request's.

        kube-scheduler's prioritize over the nodes its filter passed is, when every node
        passed, the filter's request again byte for byte: the same pod and the same names in
        the same order. Reading it is most of what prioritize costs in process at 5,000 names
        (docs/benchmarks.md, "Prioritize without reading its request again"). What is kept is
        a NodeNames body, at most ``wire.MAX_NODES`` names (75 KB at 5,000 names); full Nodes
        are not kept (their megabytes would stay until the next request; see _evaluate).
        """
        last = self._read
        if last is not None and last[0] == body:
            return last[1]
        args = wire.parse_extender_args(body, self.server_id_label)
        if args.nodes is None:
            self._read = (bytes(body), args)
        return args

    def _same_cycle(self, args: wire.ExtenderArgs, inputs: tuple[object, ...], now: float) -> Decision | None:
        """The last decision again, when it was for this pod and nothing it read has changed since.

        kube-scheduler asks filter, then prioritize, about each pod in one scheduling cycle,
        over one snapshot of its own: prioritize over the nodes filter passed. Answered from
        the filter's evaluation (and the filter's time), within ``CYCLE_SECONDS``, the two
        verbs see one state too, and the pod is costed once. Anything the evaluation reads
        that changed in between (a binding, new profiles, the pod's own placement) means a new
        evaluation.
        """
        kept = self._cycle
        if kept is None:
            return None
        kept_inputs, d = kept
        if not 0 <= now - d.at <= CYCLE_SECONDS or not all(map(is_, inputs, kept_inputs)):
            return None
        if args.pod != d.args.pod:
            return None
        if args.node_names == d.args.node_names:
            return d
        keep, passed = d.evaluation.passed()
        if passed is d.evaluation or args.node_names != [d.args.node_names[i] for i in keep.tolist()]:
            return None
        return replace(d, args=wire.ExtenderArgs(args.pod, args.node_names, None), rows=d.rows[keep], evaluation=passed)

    def _held_until(self, held: np.ndarray | None, load: RowLoad) -> np.ndarray | None:
        """Per profile row, until when the node's pods keep it powered (None: the profiles' own).

        From the pod watch's occupancy (``held``) when it runs; a node with predicted pods
        (placed, not yet seen by the watch) is held too, for as long as nobody knows.
        """
        if held is None:
            return None
        placed = load.pods > 0
        if placed.any():
            held = np.where(placed, np.inf, held)
        return held

    def _index(self, snap: Snapshot, args: wire.ExtenderArgs) -> Mapping[str, int]:
        """Node name -> profile row, including nodes that stand on a profiled physical server.

        In a virtualised cluster the agents run on the hosts, so profiles are per physical
        server; a Kubernetes node names its server in the ``server_id_label`` label, known from
        the node watch (NodeNames mode) or from the request's Node objects (Nodes mode).
        """
        index = snap.arrays.index
        servers = self.node_servers
        if args.nodes is not None and args.nodes.carries(self.server_id_label):
            from_request = {}
            for i, name in enumerate(args.node_names):
                server = args.nodes.label(i, self.server_id_label)
                if server is not None:
                    from_request[name] = server
            if from_request:
                servers = {**servers, **from_request}
        if not servers:
            return index
        if self._alias is not None and self._alias[0] == snap.version and self._alias[1] is servers:
            return self._alias[2]
        server_rows = snap.server_rows
        alias = dict(index)
        for node_name, server in servers.items():
            row = server_rows.get(server)
            if row is not None and node_name not in index:
                alias[node_name] = row
        if servers is self.node_servers:
            self._alias = (snap.version, servers, alias)
        return alias

    # -- verbs ----------------------------------------------------------------------------------

    def filter(self, body: bytes) -> dict[str, Any] | wire.Encoded:
        args = self._args(body)
        self.unbound.wait_for_others(wire.pod_identity(args.pod)[2], wire.scheduler_name(args.pod))
        d = self.decide(args)
        failed = d.evaluation.failed
        narrowed = d.evaluation.narrowed(self.policy)  # Evaluation.kept, knowing which it was
        passed = np.flatnonzero(~failed if narrowed is None else narrowed).tolist()
        if passed:
            self._decided(d)
        if len(passed) == 1:  # kube-scheduler places the pod there, without asking prioritize
            self._remember_choice(d, passed[0])
        elif narrowed is not None:
            # filter_keeps: top leaves prioritize out: the extender's own top choice (Evaluation.best,
            # the cheapest it kept) stands for the pod's place, as prioritize's does with all,
            # until its binding says
            self._remember_choice(d, d.evaluation.cheapest(narrowed))
        unresolvable = {
            args.node_names[i]: "joulesched: " + d.evaluation.reason(i, self.policy) for i in np.flatnonzero(failed).tolist()
        }
        result = wire.filter_result(args, passed, {}, unresolvable)
        if passed:
            self.on_filter_kept("all" if narrowed is None else self.policy.filter_keeps)
        return result

    def prioritize(self, body: bytes) -> wire.Encoded:
        args = self._args(body)
        self.unbound.wait_for_others(wire.pod_identity(args.pod)[2], wire.scheduler_name(args.pod))
        d = self.decide(args)
        scores = d.evaluation.scores
        self._decided(d)
        top = d.evaluation.best()
        if top is not None:
            self._remember_choice(d, top)
        return wire.encode_host_priority_list(args.node_names, scores)

    def explain(self, body: bytes) -> dict[str, Any]:
        args = self._args(body)
        d = self.decide(args)
        return explanation(d, self.policy, self.source.name)

    def preempt(self, body: bytes) -> dict[str, Any]:
        """Keep kube-scheduler's proposed victims, minus nodes the policy filters out."""
        pargs = wire.parse_preemption_args(body)
        names = list(pargs.victims)
        args = wire.ExtenderArgs(pargs.pod, names, None)
        d = self.decide(args)
        keep = {n: pargs.victims[n] for i, n in enumerate(names) if not d.evaluation.failed[i]}
        return wire.preemption_result(keep)

    def bind(self, body: bytes, *, send: bool = True) -> dict[str, Any]:
        """Record the placement, then create the binding (with ``send``).

        Recorded first: the next pod's filter may already be waiting on this pod (Unbound),
        and the API call takes milliseconds in which that decision would not know of it.
        Without ``send`` (kube-scheduler closed the connection before the bind had a thread:
        it gave up on it after its httpTimeout) the placement is recorded and no binding is
        sent. kube-scheduler then binds the pod to that node itself (``ignorable``) or
        schedules it again; a binding sent now would land after it had let the node go.
        """
        bargs = wire.parse_binding_args(body)
        if self.binder is None:
            raise BindDisabled("the bind verb is disabled (bind.enabled: false in the extender config)")
        uid = bargs.pod_uid
        # A bind names no demand: the pod's is its decision's, which the pod's first bind
        # consumes, else the placement the ledger has for it (the top choice the bind corrects;
        # a bind served after kube-scheduler gave up on it and decided the pod again, its
        # decision taken by the other; a pod bound on another replica's decision, seen by the
        # pod watch). Recorded with none, the pod's load would leave the ledger.
        demand = self.unbound.demand(uid)
        if demand is None and (placed := self.predicted.placement(uid)) is not None:
            demand = (placed.cores, placed.gpus)
        cores, gpus = demand if demand is not None else (0.0, 0.0)
        self.predicted.record(uid, bargs.node, cores, gpus, self.clock(), confirmed=True)
        self.unbound.bound(uid, by_bind_verb=True)
        if not send:
            return {"Error": f"binding {bargs.pod_namespace}/{bargs.pod_name} to {bargs.node}: not sent, the client had gone"}
        try:
            self.binder(bargs)
        except LeftToScheduler as err:  # recorded above: kube-scheduler (ignorable) writes the binding
            return {"Error": str(err)}
        except Exception as err:  # the API's answer goes back to kube-scheduler in Error
            # The placement stays: kube-scheduler (ignorable) binds the pod to that node itself,
            # or (not ignorable) schedules it again, and its next binding moves it (by UID).
            log.warning(
                "bind %s/%s to %s failed: %s", escape(bargs.pod_namespace), escape(bargs.pod_name), escape(bargs.node), escape(str(err))
            )
            return {"Error": f"binding {bargs.pod_namespace}/{bargs.pod_name} to {bargs.node}: {err}"}
        return {"Error": ""}

    def _decided(self, d: Decision) -> None:
        if self.binder is None:
            return  # nothing binds through here: nobody waits, nobody asks for the demand
        pod = d.args.pod
        self.unbound.decided(wire.pod_identity(pod)[2], d.demand.cpu_cores, float(d.demand.gpus), wire.scheduler_name(pod))

    def _remember_choice(self, d: Decision, position: int) -> None:
        """The node at ``position`` as where the pod goes, until its binding says (unconfirmed).

        A node without fresh measurements is not recorded: the ledger's load is what moves
        measured nodes' costs.
        """
        if d.evaluation.fresh[position]:
            uid = wire.pod_identity(d.args.pod)[2]
            self.predicted.record(
                uid, d.args.node_names[position], d.demand.cpu_cores, float(d.demand.gpus), d.at, confirmed=False
            )


def _num(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), 6)


def explanation(d: Decision, policy: PolicyConfig, source: str) -> dict[str, Any]:
    """Per node: the inputs, the estimate, the score and any filter reason."""
    e = d.evaluation
    profiles = d.snapshot.profiles.nodes
    nodes = []
    for i, name in enumerate(d.args.node_names):
        row = int(d.rows[i])  # the profile decide() used: the node's own, or its server's
        p = profiles[row] if row >= 0 else None
        entry: dict[str, Any] = {"node": name, "score": int(e.scores[i])}
        if p is None:
            entry["neutral"] = REASON_UNKNOWN
        else:
            entry["inputs"] = {
                "power_curve_watts": list(p.power_curve_watts),
                "cores": p.cores,
                "utilisation_measured": p.utilisation,
                "utilisation_with_predicted": _num(e.utilisation_before[i]),
                "speed": p.speed,
                "pue": p.pue,
                "carbon_intensity_g_per_kwh": p.carbon_intensity,
                "measured_watts": p.measured_watts,
                "power_cap_watts": p.power_cap_watts,
                "measured_at": p.updated,
                "site": p.site,
                "gpus": None if p.gpus is None else {"count": p.gpus.count, "idle_watts": p.gpus.idle_watts, "max_watts": p.gpus.max_watts, "speed": p.gpus.speed},
            }
            entry["estimate"] = {
                "marginal_watts": _num(e.marginal_watts[i]),
                "runtime_seconds": _num(e.runtime_seconds[i]),
                "idle_energy_joules": _num(e.idle_energy_joules[i]),
                "energy_joules": _num(e.energy_joules[i]),
                "carbon_grams": _num(e.carbon_grams[i]),
                "cost": _num(e.cost[i]),
                "projected_node_watts": _num(e.projected_watts[i]),
            }
            if not e.fresh[i]:
                entry["neutral"] = REASON_STALE
            if e.saturated[i]:
                entry["saturated"] = REASON_SATURATED
            if e.reserved[i]:
                entry["reserved"] = REASON_GPU_RESERVED
        reason = e.reason(i, policy)
        if e.failed[i]:
            entry["filtered"] = reason
        nodes.append(entry)
    namespace, name, uid = wire.pod_identity(d.args.pod)
    return {
        "pod": {"namespace": namespace, "name": name, "uid": uid},
        "demand": {
            "cpu_cores": d.demand.cpu_cores,
            "memory_bytes": d.demand.memory_bytes,
            "gpus": d.demand.gpus,
            "runtime_seconds": d.demand.runtime_seconds or policy.reference_runtime_seconds,
            "basis": d.demand.basis,
        },
        "policy": {
            "strategy": policy.strategy,
            "band": policy.band,
            "neutral_score": policy.neutral_score,
            "max_age_seconds": policy.max_age_seconds,
            "avoid_saturation": policy.avoid_saturation,
            "idle_power": policy.idle_power,
            "score_scale": policy.score_scale,
            "reserve_gpu_nodes": policy.reserve_gpu_nodes,
        },
        "profiles": {
            "source": source,
            "loaded_at": d.snapshot.loaded_at,
            "age_seconds": round(d.at - d.snapshot.loaded_at, 3) if d.snapshot.ready else None,
            "error": d.snapshot.error,
        },
        "nodes": nodes,
    }
