"""kube-scheduler for the e2e tests: its configuration, normalised, and the running process."""

from __future__ import annotations

import copy
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from processes import ManagedProcess, _wait_until

SCHEDULER_CONFIG_API_VERSION = "kubescheduler.config.k8s.io/v1"

# --------------------------------------------------------------------------
# kube-scheduler
# --------------------------------------------------------------------------

def scheduler_config(config: str | Mapping[str, Any] | None, kubeconfig: Path,
                     leader_election: bool = False) -> dict:
    """Normalise a KubeSchedulerConfiguration (YAML text or dict).

    Fills in apiVersion/kind, ``clientConnection.kubeconfig`` (if absent) and
    forces ``leaderElection.leaderElect: false`` -- unless ``leader_election``,
    which keeps the config's own ``leaderElection`` section as it is (to run a
    manifest's config unchanged, e.g. deploy/scheduler/scheduler-config.yaml).
    """
    if config is None:
        cfg: dict = {}
    elif isinstance(config, str):
        cfg = yaml.safe_load(config) or {}
    else:
        cfg = copy.deepcopy(dict(config))
    cfg.setdefault("apiVersion", SCHEDULER_CONFIG_API_VERSION)
    cfg.setdefault("kind", "KubeSchedulerConfiguration")
    cc = cfg.setdefault("clientConnection", {}) or {}
    cfg["clientConnection"] = cc
    cc.setdefault("kubeconfig", str(kubeconfig))
    if not leader_election:
        le = cfg.setdefault("leaderElection", {}) or {}
        cfg["leaderElection"] = le
        le["leaderElect"] = False
    return cfg


class SchedulerProcess(ManagedProcess):
    """A running kube-scheduler. ``.config`` is the effective config dict."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 config: dict, config_path: Path, port: int):
        super().__init__(name, argv, log_path)
        self.config = config
        self.config_path = config_path
        self.port = port

    @property
    def scheduler_names(self) -> list[str]:
        return [p.get("schedulerName", "default-scheduler")
                for p in (self.config.get("profiles") or [{}])]

    def healthz(self, path: str = "/readyz") -> tuple[int, str]:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.port}{path}",
                                        context=ctx, timeout=2) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def wait_ready(self, timeout: float = 30) -> None:
        _wait_until(lambda: self.healthz("/readyz")[0] == 200, timeout,
                    what=f"{self.name} /readyz", proc=self, interval=0.2)
