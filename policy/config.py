"""The policy document: which strategy scores, and how.

::

    strategy: carbon            # energy | carbon
    band: 0.5                   # a node whose cost is 50 % above the best scores 0
    neutral_score: 5            # score of nodes without fresh measurements (0..9)
    max_age_seconds: 120        # measurements older than this are not fresh
    reference_runtime_seconds: 3600   # runtime assumed when a pod does not say
    gpu_pod_utilisation: 1.0    # how busy a GPU pod keeps each GPU it asks for
    avoid_saturation: true      # score 0 a node the pod would push past 100 % CPU while another has room
    idle_power: always-on       # nodes without their own idle_power: autoscaled | power-managed | always-on
    score_scale: cluster        # cluster: scores relative to the best node the profiles know; request: to the best sent
    reserve_gpu_nodes: true     # score 0 a GPU node for a CPU-only pod while a CPU node in the request has room
    power_cap:
      enabled: true
      headroom: 0.05            # fail a node whose power would pass cap × (1 − headroom)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from joulesched.policy.profile import IDLE_POWER_CLASSES
from joulesched.policy.validate import Checker

STRATEGIES = ("energy", "carbon")
SCORE_SCALES = ("cluster", "request")
MAX_SCORE = 10  # k8s.io/kube-scheduler/extender/v1: MaxExtenderPriority
POLICY_FIELDS = (
    "strategy",
    "band",
    "neutral_score",
    "max_age_seconds",
    "reference_runtime_seconds",
    "gpu_pod_utilisation",
    "avoid_saturation",
    "idle_power",
    "score_scale",
    "reserve_gpu_nodes",
    "power_cap",
)


@dataclass(frozen=True)
class PolicyConfig:
    strategy: str = "energy"
    band: float = 0.5
    neutral_score: int = 5
    max_age_seconds: float = 120.0
    reference_runtime_seconds: float = 3600.0
    gpu_pod_utilisation: float = 1.0
    avoid_saturation: bool = True
    idle_power: str = "always-on"
    score_scale: str = "cluster"
    reserve_gpu_nodes: bool = True
    power_cap_enabled: bool = True
    power_cap_headroom: float = 0.05


def parse_policy(doc: Any, check: Checker, path: str = "policy") -> PolicyConfig:
    """Read a policy mapping; problems go to ``check`` with their dotted paths."""
    body: Mapping[str, Any] = check.mapping(doc, path)
    check.unknown_keys(body, POLICY_FIELDS, path)
    d = PolicyConfig()
    strategy = check.string(body, "strategy", path, default=d.strategy, choices=STRATEGIES)
    band = check.number(body, "band", path, default=d.band, exclusive_minimum=0.0)
    neutral = check.number(body, "neutral_score", path, default=float(d.neutral_score), minimum=0, maximum=MAX_SCORE - 1)
    if neutral is not None and neutral != int(neutral):
        check.problem(f"{path}.neutral_score", f"must be a whole number, got {neutral:g}")
    max_age = check.number(body, "max_age_seconds", path, default=d.max_age_seconds, exclusive_minimum=0.0)
    runtime = check.number(
        body, "reference_runtime_seconds", path, default=d.reference_runtime_seconds, exclusive_minimum=0.0
    )
    gpu_util = check.number(
        body, "gpu_pod_utilisation", path, default=d.gpu_pod_utilisation, exclusive_minimum=0.0, maximum=1.0
    )
    avoid = check.boolean(body, "avoid_saturation", path, default=d.avoid_saturation)
    idle_power = check.string(body, "idle_power", path, default=d.idle_power, choices=IDLE_POWER_CLASSES)
    score_scale = check.string(body, "score_scale", path, default=d.score_scale, choices=SCORE_SCALES)
    reserve_gpu = check.boolean(body, "reserve_gpu_nodes", path, default=d.reserve_gpu_nodes)
    cap = check.mapping(body.get("power_cap"), f"{path}.power_cap")
    check.unknown_keys(cap, ("enabled", "headroom"), f"{path}.power_cap")
    cap_enabled = check.boolean(cap, "enabled", f"{path}.power_cap", default=d.power_cap_enabled)
    headroom = check.number(
        cap, "headroom", f"{path}.power_cap", default=d.power_cap_headroom, minimum=0.0, maximum=0.9
    )
    return PolicyConfig(
        strategy=strategy or d.strategy,
        band=band or d.band,
        neutral_score=int(neutral) if neutral is not None else d.neutral_score,
        max_age_seconds=max_age or d.max_age_seconds,
        reference_runtime_seconds=runtime or d.reference_runtime_seconds,
        gpu_pod_utilisation=gpu_util or d.gpu_pod_utilisation,
        avoid_saturation=avoid if avoid is not None else d.avoid_saturation,
        idle_power=idle_power or d.idle_power,
        score_scale=score_scale or d.score_scale,
        reserve_gpu_nodes=reserve_gpu if reserve_gpu is not None else d.reserve_gpu_nodes,
        power_cap_enabled=cap_enabled,
        power_cap_headroom=headroom if headroom is not None else d.power_cap_headroom,
    )
