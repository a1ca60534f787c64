"""Pod UID → namespace, name and owner, from the Kubernetes API; optional and fail-soft.

The agent names pods by UID (that is all a cgroup path holds) and asks the API server for the
pods scheduled on its node (``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>``) every
``refresh_seconds``. Two ways to reach it:

* ``in-cluster``: the service-account token and CA that Kubernetes mounts into the pod, with the
  standard library's HTTPS client. This is the DaemonSet's path and keeps the agent small (the
  ``kubernetes`` client package alone adds ~25 MB of resident memory).
* ``kubeconfig``: the ``kubernetes`` client with a kubeconfig file (for an agent run by hand).

When the API cannot be reached, every lookup returns None and the agent labels the pod by its
UID (namespace ""); the error is logged once per distinct message.

Owners: the controller reference, with a ReplicaSet folded into its Deployment when the name
carries the pod-template-hash; a Nextflow task pod (label ``nextflow.io/processName``) is owned by
its workflow process.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from joulesched.contracts.net import open_url

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # a mirror pod's: the static pod's UID, its cgroup's


@dataclass(frozen=True, slots=True)
class PodMeta:
    uid: str
    namespace: str
    name: str
    owner_kind: str = ""
    owner: str = ""


class PodDirectory(Protocol):
    def lookup(self, uid: str) -> PodMeta | None: ...

    def refresh(self) -> None: ...


class NoDirectory:
    """No API: every pod is known by its UID only."""

    def lookup(self, uid: str) -> PodMeta | None:
        return None

    def refresh(self) -> None:
        return None


def owner_of(item: Mapping[str, Any]) -> tuple[str, str]:
    meta = item.get("metadata") or {}
    labels = meta.get("labels") or {}
    process = labels.get("nextflow.io/processName")
    if isinstance(process, str) and process:
        return "NextflowProcess", process
    refs = meta.get("ownerReferences") or meta.get("owner_references") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if not ref:
        return "", ""
    kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
    template_hash = labels.get("pod-template-hash")
    if kind == "ReplicaSet" and isinstance(template_hash, str) and name.endswith("-" + template_hash):
        return "Deployment", name[: -len(template_hash) - 1]
    return kind, name


def pods_from_list(doc: Mapping[str, Any]) -> dict[str, PodMeta]:
    """Parse a PodList (as JSON from the API) into uid → PodMeta."""
    out: dict[str, PodMeta] = {}
    for item in doc.get("items") or []:
        meta = item.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            continue
        kind, owner = owner_of(item)
        out[uid.lower()] = PodMeta(uid.lower(), str(meta.get("namespace", "")), str(meta.get("name", "")), kind, owner)
        annotations = meta.get("annotations") or {}
        mirror = annotations.get(MIRROR_ANNOTATION) if isinstance(annotations, Mapping) else None
        if isinstance(mirror, str) and mirror:  # a static pod's mirror: its cgroup carries the kubelet's UID
            out[mirror.lower()] = PodMeta(
                mirror.lower(), str(meta.get("namespace", "")), str(meta.get("name", "")), kind, owner
            )
    return out


class _Cached:
    def __init__(self) -> None:
        self._pods: dict[str, PodMeta] = {}
        self._last_error = ""
        self._lock = threading.Lock()

    def lookup(self, uid: str) -> PodMeta | None:
        return self._pods.get(uid)

    def _store(self, pods: dict[str, PodMeta]) -> None:
        self._pods = pods  # replaced whole: readers see the old or the new dict, never half
        self._last_error = ""

    def _fail(self, message: str) -> None:
        if message != self._last_error:
            log.warning("pod names unavailable, labelling pods by UID: %s", message)
            self._last_error = message


class InClusterDirectory(_Cached):
    def __init__(
        self, node: str, host: str, port: str, account_dir: str = SERVICE_ACCOUNT, timeout: float = 5.0
    ) -> None:
        super().__init__()
        self.node = node
        self.account_dir = account_dir
        self.timeout = timeout
        selector = urllib.parse.quote(f"spec.nodeName={node}", safe="")
        self.url = f"https://{host}:{port}/api/v1/pods?fieldSelector={selector}"

    def refresh(self) -> None:
        try:
            with open(os.path.join(self.account_dir, "token"), encoding="ascii") as f:
                token = f.read().strip()
            context = ssl.create_default_context(cafile=os.path.join(self.account_dir, "ca.crt"))
            request = urllib.request.Request(self.url, headers={"Authorization": f"Bearer {token}"})
            with open_url(request, timeout=self.timeout, context=context) as response:
                doc = json.load(response)
        except (OSError, ValueError, ssl.SSLError) as err:
            self._fail(f"{self.url}: {err}")
            return
        self._store(pods_from_list(doc))


class KubeconfigDirectory(_Cached):
    def __init__(self, node: str, kubeconfig: str) -> None:
        super().__init__()
        self.node = node
        self.kubeconfig = kubeconfig
        self._api: Any = None

    def refresh(self) -> None:
        try:
            if self._api is None:
                from kubernetes import client, config  # optional, imported only in this mode

                config.load_kube_config(config_file=self.kubeconfig)
                self._api = client.CoreV1Api()
            result = self._api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}", _request_timeout=5
            )
            doc = self._api.api_client.sanitize_for_serialization(result)
        except Exception as err:  # the client raises many types (config, HTTP, urllib3): all mean "no names"
            self._fail(f"kubeconfig {self.kubeconfig}: {type(err).__name__}: {err}")
            return
        self._store(pods_from_list(doc))


def open_directory(mode: str, node: str, kubeconfig: str = "", account_dir: str = SERVICE_ACCOUNT) -> PodDirectory:
    """``auto`` (in-cluster when a service account is mounted, else none), ``in-cluster``,
    ``kubeconfig`` or ``off``."""
    if mode == "off":
        return NoDirectory()
    if mode == "kubeconfig":
        return KubeconfigDirectory(node, kubeconfig)
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")  # set by the kubelet in every pod
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    mounted = os.path.isfile(os.path.join(account_dir, "token"))
    if mode == "in-cluster" or (mode == "auto" and host and mounted):
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return InClusterDirectory(node, host or "kubernetes.default.svc", port, account_dir)
    return NoDirectory()


__all__ = [
    "InClusterDirectory",
    "KubeconfigDirectory",
    "NoDirectory",
    "PodDirectory",
    "PodMeta",
    "open_directory",
    "owner_of",
    "pods_from_list",
]
