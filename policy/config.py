"""The policy document: which strategy scores, and how.

Each field is declared once below with its default, bounds and meaning; the parser
(:func:`parse_policy`) and the reference table in docs/configuration.md (``python -m
joulesched.configdoc``) are derived from those declarations. ``power_cap_enabled``
and ``power_cap_headroom`` are read from ``power_cap: {enabled, headroom}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from joulesched.policy.profile import IDLE_POWER_CLASSES
from joulesched.policy.validate import Checker, read_settings, setting

STRATEGIES = ("energy", "carbon")
SCORE_SCALES = ("cluster", "request")
FILTER_KEEPS = ("all", "top", "best")
MAX_SCORE = 10  # k8s.io/kube-scheduler/extender/v1: MaxExtenderPriority


@dataclass(frozen=True)
class PolicyConfig:
    strategy: str = setting("energy", "what a placement costs: energy (joules) or carbon (gCO2e)", choices=STRATEGIES)
    band: float = setting(0.5, "a node whose cost is this fraction above the best scores 0", exclusive_minimum=0.0)
    neutral_score: int = setting(5, "score of nodes without fresh measurements", minimum=0, maximum=MAX_SCORE - 1)
    max_age_seconds: float = setting(120.0, "measurements older than this are not fresh", exclusive_minimum=0.0)
    reference_runtime_seconds: float = setting(
        3600.0, "runtime assumed when a pod does not say", exclusive_minimum=0.0
    )
    gpu_pod_utilisation: float = setting(
        1.0, "how busy a GPU pod keeps each GPU it asks for", exclusive_minimum=0.0, maximum=1.0
    )
    avoid_saturation: bool = setting(
        True, "score 0 a node the pod would push past 100 % CPU while another node has room"
    )
    idle_power: str = setting(
        "always-on",
        "whether a node's idle power can be avoided, for nodes whose profile does not say (docs/policy.md, Idle power)",
        choices=IDLE_POWER_CLASSES,
    )
    score_scale: str = setting(
        "request",
        "scores relative to the best node in the request (request) or to the best the profiles know (cluster)",
        choices=SCORE_SCALES,
    )
    reserve_gpu_nodes: bool = setting(
        True, "score 0 a GPU node for a CPU-only pod while a node without GPUs in the request has room"
    )
    filter_keeps: str = setting(
        "all",
        "the nodes filter keeps: all that the power cap passes, for prioritize to score and kube-scheduler to weigh with"
        " its own plugins; top, only those prioritize would score highest, for kube-scheduler's plugins to choose"
        " among; or best, only the cheapest of those, where kube-scheduler then places the pod without scoring;"
        " top and best when a node with fresh measurements ranks first (docs/extender.md, Choosing the node)",
        choices=FILTER_KEEPS,
    )
    power_cap_enabled: bool = setting(True, "fail nodes the pod would push past their power cap", key="power_cap.enabled")
    power_cap_headroom: float = setting(
        0.05, "fail a node whose power would pass cap × (1 − headroom)", key="power_cap.headroom", minimum=0.0, maximum=0.9
    )


def parse_policy(doc: Any, check: Checker, path: str = "policy") -> PolicyConfig:
    """Read a policy mapping; problems go to ``check`` with their dotted paths."""
    return read_settings(PolicyConfig, doc, check, path)
