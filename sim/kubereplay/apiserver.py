"""The objects the replay creates (nodes, their status, pods) and the few apiserver calls it makes."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

from joulesched.sim.cluster import ZONE_LABEL
from joulesched.sim.errors import SimError
from joulesched.sim.schedstate import PodNeeds

SIM_LABEL = "joulesched.io/sim-run"
GROUP_LABEL = "joulesched.io/sim-group"
TYPE_LABEL = "joulesched.io/sim-node-type"
POD_ANNOTATION = "joulesched.io/sim-pod"
GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"

# -- names and objects -------------------------------------------------------------------------


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` as a DNS-1123 label: lower case, ``[a-z0-9-]``, starting and ending alphanumeric."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return out[:limit].rstrip("-") or "x"


def quantity_cpu(milli: int) -> str:
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def node_body(name: str, run: str, node_type: str, zone: str, gpu_model: str = "") -> dict[str, Any]:
    labels = {
        SIM_LABEL: run,
        TYPE_LABEL: dns_label(node_type),
        HOSTNAME_LABEL: name,
        ZONE_LABEL: dns_label(zone),
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    if gpu_model:
        labels[GPU_PRODUCT_LABEL] = gpu_model
    return {
        "metadata": {
            "name": name,
            "labels": labels,
        },
        "spec": {"taints": [{"key": SIM_LABEL, "value": run, "effect": "NoSchedule"}]},
    }


def node_status(name: str, cpu_milli: int, memory: int, pods: int, gpus: int) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": quantity_cpu(cpu_milli), "memory": str(memory), "pods": str(pods)}
    if gpus:
        resources[GPU_RESOURCE] = str(gpus)
    return {
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "joulesched sim node (no kubelet)",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v0.0.0-joulesched-sim",
                "kubeProxyVersion": "",
                "bootID": "",
                "containerRuntimeVersion": "",
                "kernelVersion": "",
                "machineID": "",
                "osImage": "",
                "systemUUID": "",
            },
        }
    }


def pod_body(
    name: str,
    namespace: str,
    run: str,
    scheduler: str,
    needs: PodNeeds,
    original: str,
    group: str = "",
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if needs.cpu:
        requests["cpu"] = quantity_cpu(needs.cpu)
    if needs.mem:
        requests["memory"] = str(needs.mem)
    if needs.gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(needs.gpu)
    container: dict[str, Any] = {"name": "main", "image": PAUSE_IMAGE}
    if requests:
        container["resources"] = {"requests": requests, **({"limits": limits} if limits else {})}
    labels = {SIM_LABEL: run}
    if group:
        labels[GROUP_LABEL] = dns_label(group)
    spec: dict[str, Any] = {}
    if needs.gpu_models:  # as a user asks for a GPU model: the label NVIDIA's GPU feature discovery sets
        term = {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": list(needs.gpu_models)}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": {POD_ANNOTATION: original}},
        "spec": {
            **spec,
            "schedulerName": scheduler,
            "containers": [container],
            "nodeSelector": dict(node_selector or {SIM_LABEL: run}),
            "tolerations": [{"key": SIM_LABEL, "operator": "Equal", "value": run, "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
        },
    }


# -- talking to the apiserver ------------------------------------------------------------------


def resolve_kubeconfig(path: str | None) -> str:
    chosen = path or os.environ.get("KUBECONFIG", "")
    if not chosen:
        raise SimError("--scheduler kube: give --kubeconfig FILE (or set $KUBECONFIG)")
    first = chosen.split(os.pathsep)[0]
    if not os.path.isfile(first):
        source = "--kubeconfig" if path else "$KUBECONFIG"
        raise SimError(f"{source} {first}: no such file")
    return first


class Api:
    """The few calls the replay makes, with errors turned into one-line :class:`SimError` s."""

    def __init__(self, kubeconfig: str, request_timeout: float = 10.0) -> None:
        from kubernetes import client, config

        self.kubeconfig = kubeconfig
        cfg = client.Configuration()
        try:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        except Exception as err:  # ConfigException, yaml errors, missing cert files
            raise SimError(f"--kubeconfig {kubeconfig}: cannot use it: {err}") from err
        self.server = cfg.host
        self.timeout = request_timeout
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.version_api = client.VersionApi(self.api)

    def call(self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False, **kw: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kw.setdefault("_request_timeout", self.timeout)
        try:
            return fn(*args, **kw)
        except ApiException as err:
            if missing_ok and err.status == 404:
                return None
            raise SimError(
                f"{what}: the apiserver at {self.server} answered {err.status} {err.reason}: {_message(err)}"
            ) from err
        except (HTTPError, OSError) as err:
            raise SimError(
                f"{what}: cannot reach the apiserver at {self.server} ({type(err).__name__}: {_short(err)})"
            ) from err

    def raw(self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False, **kw: Any) -> Any:
        """A call whose JSON answer is parsed here (much faster than the client's models)."""
        resp = self.call(what, fn, *args, missing_ok=missing_ok, _preload_content=False, **kw)
        return None if resp is None else json.loads(resp.data)

    def close(self) -> None:
        try:
            self.api.close()
        except Exception:  # pragma: no cover - best effort
            pass


def _message(err: Any) -> str:
    try:
        return str(json.loads(err.body).get("message", "")) or str(err.body)
    except (TypeError, ValueError, AttributeError):
        return _short(err.body or err)


def _short(err: Any) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."
