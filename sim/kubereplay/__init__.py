"""Replay a trace against a real kube-scheduler and check the simulator's model against it.

``joulesched sim run --scheduler kube`` talks to a running kube-apiserver (``--kubeconfig``):

1. It creates a namespace ``joulesched-sim-<run>`` and, for every node of the cluster spec, a
   Node object ``jsim-<run>-<node>`` (capacity = allocatable = the type's cores, memory,
   ``max_pods`` and ``nvidia.com/gpu``; Ready; labelled ``joulesched.io/sim-run=<run>`` and with
   the site's ``topology.kubernetes.io/zone``; tainted ``joulesched.io/sim-run=<run>:NoSchedule``
   so that no other pod lands there). Status is written through the status subresource and the
   ``not-ready`` taint that admission adds is removed, as a kubelet and the node lifecycle
   controller would. A probe pod then checks that the scheduler named ``--scheduler-name``
   binds pods and already sees every node.
2. It replays the workload event by event, in simulated time: a pod is created when it arrives
   (or when its parents finish), the replayer waits until the scheduler has bound it and reads
   the node back, and deletes it (force, grace 0) when it finishes on that node (``duration /
   speed`` later). Nothing else happens while a pod is being scheduled, so the real scheduler
   sees exactly the cluster state that the replayer records. ``--time-scale S`` paces the
   events at S simulated seconds per wall second; by default they go as fast as binding does.
   Pods are bare (no owner), with the trace's requests, a nodeSelector and a toleration for the
   run's nodes, and ``schedulerName``. A pod with a ``group`` is selected by a headless Service
   of that group, so the system default PodTopologySpread constraints apply to it, as the
   model assumes.
3. For every pod, at the moment it is created, the engine's own scheduling state
   (:class:`sim.schedstate.SchedulingState`: :mod:`sim.kube`'s filter and scores) scores every node
   from the real state (the pods really bound so far, minus the deleted ones). The pod
   **agrees** when the real node is among the model's best-scoring feasible nodes. When the
   model's best is shared by several nodes the pod is **tied**: kube-scheduler breaks ties at
   random, so tied pods are reported apart and agreement is counted among the others.

A pod that the model finds no room for is held back by the replayer, as the simulator's
scheduling queue holds it, and created once a deletion makes room: the real scheduler never
sees an unschedulable pod (its back-off timing would make the replay depend on wall-clock
time). If the real scheduler still refuses a pod the model thought fits, that is reported as a
disagreement. The autoscaler of the cluster spec is not replayed: every node exists throughout.

Everything created is deleted at the end (the namespace may stay ``Terminating`` on a cluster
without a namespace controller).

Modules: :mod:`.options` (what the command is told), :mod:`.apiserver` (the objects created and
the apiserver calls), :mod:`.replay` (the event loop), :mod:`.agreement` (verdicts and the report).
"""

from __future__ import annotations

from joulesched.sim.kubereplay.agreement import (
    Placement,
    ReplayResult,
    Verdict,
    judge,
    placements_csv,
    summarise,
    summary_table,
)
from joulesched.sim.kubereplay.apiserver import (
    GPU_RESOURCE,
    GROUP_LABEL,
    HOSTNAME_LABEL,
    PAUSE_IMAGE,
    POD_ANNOTATION,
    SIM_LABEL,
    TYPE_LABEL,
    Api,
    dns_label,
    node_body,
    node_status,
    pod_body,
    quantity_cpu,
    resolve_kubeconfig,
)
from joulesched.sim.kubereplay.options import PROFILES, KubeOptions
from joulesched.sim.kubereplay.replay import KubeReplay, replay

__all__ = [
    "GPU_RESOURCE",
    "GROUP_LABEL",
    "HOSTNAME_LABEL",
    "PAUSE_IMAGE",
    "POD_ANNOTATION",
    "PROFILES",
    "SIM_LABEL",
    "TYPE_LABEL",
    "Api",
    "KubeOptions",
    "KubeReplay",
    "Placement",
    "ReplayResult",
    "Verdict",
    "dns_label",
    "judge",
    "node_body",
    "node_status",
    "placements_csv",
    "pod_body",
    "quantity_cpu",
    "replay",
    "resolve_kubeconfig",
    "summarise",
    "summary_table",
]
