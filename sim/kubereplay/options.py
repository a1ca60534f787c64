"""What ``joulesched sim run --scheduler kube`` is told: the cluster to talk to, the scheduler, the pacing."""

from __future__ import annotations

from dataclasses import dataclass

PROFILES = ("default", "most-allocated")


@dataclass(frozen=True)
class KubeOptions:
    kubeconfig: str | None = None  # None: $KUBECONFIG
    scheduler_name: str = "default-scheduler"
    profile: str = "default"  # the scoring the real scheduler uses: default | most-allocated
    seed: int = 0  # the model's tie-break (reported as its own pick)
    time_scale: float = 0.0  # simulated seconds per wall second; 0: as fast as binding allows
    bind_timeout: float = 30.0  # seconds to wait for one pod to be bound
    run_id: str = ""  # default: random
