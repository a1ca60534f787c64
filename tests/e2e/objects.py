"""API objects of the e2e cluster: namespaces, fake Ready nodes, pause pods, and waiting for
pods to be bound or to fail scheduling (mixed into :class:`cluster.ControlPlane`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from processes import _wait_until

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
NOT_READY_TAINT_KEY = "node.kubernetes.io/not-ready"
GPU_RESOURCE = "nvidia.com/gpu"

class ApiObjects:
    """Object helpers over ``self.core`` (a ``kubernetes.client.CoreV1Api``)."""

    core: Any

    def ensure_service_account(self, namespace: str, name: str = "default") -> None:
        from kubernetes.client.rest import ApiException
        try:
            self.core.create_namespaced_service_account(
                namespace, {"metadata": {"name": name}})
        except ApiException as e:
            if e.status != 409:
                raise

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        """Create a namespace (with its `default` ServiceAccount). Idempotent."""
        from kubernetes.client.rest import ApiException
        try:
            self.core.create_namespace({"metadata": {"name": name,
                                                     "labels": dict(labels or {})}})
        except ApiException as e:
            if e.status != 409:
                raise
        self.ensure_service_account(name)
        return name

    def create_node(self, name: str, *, cpu: str | int = "4", memory: str = "8Gi",
                    pods: int = 110, gpus: int | None = None,
                    labels: Mapping[str, str] | None = None,
                    annotations: Mapping[str, str] | None = None,
                    taints: Sequence[Mapping[str, Any]] = (),
                    extra_resources: Mapping[str, str] | None = None,
                    allocatable: Mapping[str, str] | None = None,
                    ready: bool = True):
        """Create a Node that the scheduler considers usable.

        capacity = cpu/memory/pods (+ ``nvidia.com/gpu`` if ``gpus``, +
        ``extra_resources``); allocatable = capacity unless overridden per
        resource by ``allocatable``. The ``node.kubernetes.io/not-ready``
        taint that the apiserver's admission adds on create is removed (the
        spec's taints become exactly ``taints``) and the Ready condition is set
        through the status subresource. Returns the V1Node.
        """
        capacity = {"cpu": str(cpu), "memory": str(memory), "pods": str(pods),
                    "ephemeral-storage": "100Gi"}
        if gpus is not None:
            capacity[GPU_RESOURCE] = str(gpus)
        capacity.update({k: str(v) for k, v in (extra_resources or {}).items()})
        alloc = dict(capacity)
        alloc.update({k: str(v) for k, v in (allocatable or {}).items()})
        base_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64"}
        base_labels.update(labels or {})
        self.core.create_node({"metadata": {"name": name, "labels": base_labels,
                                            "annotations": dict(annotations or {})},
                               "spec": {"taints": [dict(t) for t in taints]}})
        # TaintNodesByCondition admission adds not-ready:NoSchedule on create.
        self.core.patch_node(name, {"spec": {"taints": [dict(t) for t in taints] or None}})
        return self.set_node_status(name, capacity=capacity, allocatable=alloc, ready=ready)

    def set_node_status(self, name: str, *, capacity: Mapping[str, str] | None = None,
                        allocatable: Mapping[str, str] | None = None, ready: bool = True):
        """Patch a node's status (capacity/allocatable/Ready condition)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status: dict[str, Any] = {
            "conditions": [{
                "type": "Ready", "status": "True" if ready else "False",
                "reason": "KubeletReady" if ready else "KubeletNotReady",
                "message": "joulesched e2e fake node",
                "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                         "kubeletVersion": "v0.0.0-e2e", "kubeProxyVersion": "",
                         "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "",
                         "machineID": "", "osImage": "", "systemUUID": ""},
            "addresses": [{"type": "Hostname", "address": name},
                          {"type": "InternalIP", "address": "127.0.0.1"}],
        }
        if capacity is not None:
            status["capacity"] = dict(capacity)
        if allocatable is not None:
            status["allocatable"] = dict(allocatable)
        return self.core.patch_node_status(name, {"status": status})

    def delete_node(self, name: str) -> None:
        from kubernetes.client.rest import ApiException
        try:
            self.core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise

    def create_pod(self, name: str, namespace: str = "default", *,
                   scheduler_name: str | None = None, cpu: str | None = None,
                   memory: str | None = None, gpus: int | None = None,
                   limits: Mapping[str, str] | None = None,
                   extra_requests: Mapping[str, str] | None = None,
                   labels: Mapping[str, str] | None = None,
                   annotations: Mapping[str, str] | None = None,
                   node_selector: Mapping[str, str] | None = None,
                   tolerations: Sequence[Mapping[str, Any]] = (),
                   priority_class_name: str | None = None,
                   spec_overrides: Mapping[str, Any] | None = None):
        """Create a single-container (pause image) pod. Returns the V1Pod.

        Requests: ``cpu``/``memory``/``gpus`` (nvidia.com/gpu, also set as a
        limit, as extended resources require) + ``extra_requests``.
        ``spec_overrides`` is shallow-merged into the pod spec.
        """
        requests: dict[str, str] = {}
        lim: dict[str, str] = dict(limits or {})
        if cpu is not None:
            requests["cpu"] = str(cpu)
        if memory is not None:
            requests["memory"] = str(memory)
        if gpus is not None:
            requests[GPU_RESOURCE] = str(gpus)
            lim[GPU_RESOURCE] = str(gpus)
        requests.update({k: str(v) for k, v in (extra_requests or {}).items()})
        container: dict[str, Any] = {"name": "main", "image": PAUSE_IMAGE}
        if requests or lim:
            container["resources"] = {}
            if requests:
                container["resources"]["requests"] = requests
            if lim:
                container["resources"]["limits"] = lim
        spec: dict[str, Any] = {"containers": [container],
                                "terminationGracePeriodSeconds": 0,
                                "automountServiceAccountToken": False}
        if scheduler_name:
            spec["schedulerName"] = scheduler_name
        if node_selector:
            spec["nodeSelector"] = dict(node_selector)
        if tolerations:
            spec["tolerations"] = [dict(t) for t in tolerations]
        if priority_class_name:
            spec["priorityClassName"] = priority_class_name
        spec.update(spec_overrides or {})
        body = {"metadata": {"name": name, "namespace": namespace,
                             "labels": dict(labels or {}),
                             "annotations": dict(annotations or {})},
                "spec": spec}
        return self.core.create_namespaced_pod(namespace, body)

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Force-delete (grace 0: there is no kubelet to confirm)."""
        from kubernetes.client.rest import ApiException
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete_all_pods(self, namespace: str) -> None:
        for p in self.core.list_namespaced_pod(namespace).items:
            self.delete_pod(p.metadata.name, namespace)

    def pod_node(self, name: str, namespace: str = "default") -> str | None:
        return self.core.read_namespaced_pod(name, namespace).spec.node_name

    def wait_for_pod_scheduled(self, name: str, namespace: str = "default",
                               timeout: float = 30) -> str:
        """Wait until the pod is bound; returns ``spec.nodeName``."""
        return _wait_until(lambda: self.pod_node(name, namespace), timeout,
                           what=f"pod {namespace}/{name} to be bound")

    def pod_events(self, name: str, namespace: str = "default",
                   reason: str | None = None) -> list:
        """core/v1 Events whose involvedObject is this pod (oldest first)."""
        sel = f"involvedObject.name={name},involvedObject.kind=Pod"
        if reason:
            sel += f",reason={reason}"
        evs = self.core.list_namespaced_event(namespace, field_selector=sel).items
        return sorted(evs, key=lambda e: (e.last_timestamp or e.event_time
                                          or e.metadata.creation_timestamp))

    def wait_for_failed_scheduling(self, name: str, namespace: str = "default",
                                   timeout: float = 30):
        """Wait for a ``FailedScheduling`` event on the pod; returns the V1Event
        (its ``.message`` explains why, e.g. ``0/3 nodes are available: ...``)."""
        return _wait_until(
            lambda: (self.pod_events(name, namespace, "FailedScheduling") or [None])[-1],
            timeout, what=f"FailedScheduling event for pod {namespace}/{name}", interval=0.2)

    def wait_for_pod_outcome(self, name: str, namespace: str = "default",
                             timeout: float = 30) -> tuple[str | None, Any]:
        """Wait until the pod is bound or has a FailedScheduling event.

        Returns ``(node_name, None)`` or ``(None, event)``.
        """
        def probe():
            node = self.pod_node(name, namespace)
            if node:
                return (node, None)
            evs = self.pod_events(name, namespace, "FailedScheduling")
            return (None, evs[-1]) if evs else None
        return _wait_until(probe, timeout, what=f"pod {namespace}/{name} outcome",
                           interval=0.2)
