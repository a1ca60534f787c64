"""A pod's demand: what it asks of a node, read from a Kubernetes ``v1.Pod`` document.

The effective request follows kube-scheduler's own rule (``resource.PodRequests``): the sum
over app containers, raised to the largest init container where that is bigger (restartable
"sidecar" init containers add to both), plus ``spec.overhead``. A pod that requests no CPU is
scored as kube-scheduler scores it, with the default non-zero request of 100 millicores
(``DefaultMilliCPURequest``), so that best-effort pods still have a marginal cost.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, DecimalException
from functools import lru_cache
from typing import Any

from joulesched.policy.errors import PolicyError

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_MILLI_CPU_REQUEST = 100  # k8s.io/kubernetes/pkg/scheduler/util: DefaultMilliCPURequest
RUNTIME_ANNOTATION = "joulesched.io/expected-runtime-seconds"

_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
# No nested or overlapping quantifiers: every character has one way to match, so matching is
# linear in the length (which is capped anyway: the apiserver rejects absurd quantities).
_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
MAX_QUANTITY_CHARS = 64  # "123456789012345678.123456789012345678e-123Ki" is 44; anything longer is not a request

# Physical bounds on what one pod may ask for: past these a number is an attack or a bug, and
# a float that large (or infinite) would poison every sum and curve it enters.
MAX_CPU_CORES = 1e6
MAX_MEMORY_BYTES = float(2**50)  # 1 PiB
MAX_GPUS = 1e4
MAX_RUNTIME_SECONDS = 10 * 365 * 86400.0
_BOUNDS = {"cpu": MAX_CPU_CORES, "memory": MAX_MEMORY_BYTES, GPU_RESOURCE: MAX_GPUS}


class QuantityError(PolicyError):
    """A resource quantity is not in Kubernetes' quantity syntax, or is not physically possible."""


def short(value: Any, limit: int = 40) -> str:
    """A bounded, escaped ``repr`` of a value from a request, for error messages."""
    if isinstance(value, (Mapping, list)):
        return f"a JSON {'object' if isinstance(value, Mapping) else 'array'}"
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value)} characters)"
    return repr(value)


@lru_cache(maxsize=1024)
def _quantity_text(value: str) -> float:
    """The number a quantity string (at most ``MAX_QUANTITY_CHARS``) stands for, unchecked against bounds.

    Memoised: a cluster's pods ask for a few dozen distinct quantities ("500m", "1Gi"), each
    parsed with Decimal once instead of on every request. An error is raised, never kept, and
    says what is wrong but not where: :func:`parse_quantity` adds the field.
    """
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 1Gi)")
    number, suffix = match.groups()
    try:
        return float(Decimal(number) * _SUFFIX[suffix or ""])
    except (DecimalException, OverflowError) as err:
        raise QuantityError(f"{value!r} is out of range") from err


def parse_quantity(value: Any, where: str, maximum: float = math.inf) -> float:
    """Parse a Kubernetes resource quantity (``"500m"``, ``"2"``, ``"1Gi"``, ``"1e3"``, 4).

    The result is finite, not negative and at most ``maximum``; anything else is a
    :class:`QuantityError` naming ``where``.
    """
    if isinstance(value, bool):
        raise QuantityError(f"{where}: must be a quantity, got {value!r}")
    if isinstance(value, (int, float)):
        result = float(value)
    elif isinstance(value, str):
        if len(value) > MAX_QUANTITY_CHARS:  # before the memo, which would hash it
            raise QuantityError(f"{where}: a quantity of {len(value)} characters is not a Kubernetes quantity")
        try:
            result = _quantity_text(value)
        except QuantityError as err:
            raise QuantityError(f"{where}: {err}") from err.__cause__
    else:
        raise QuantityError(f"{where}: must be a quantity string, got {type(value).__name__}")
    if not math.isfinite(result):
        raise QuantityError(f"{where}: must be a finite quantity, got {short(value)}")
    if result < 0:
        raise QuantityError(f"{where}: must not be negative, got {short(value)}")
    if result > maximum:
        raise QuantityError(f"{where}: {short(value)} is over the physical maximum of {maximum:g}")
    return result


@dataclass(frozen=True)
class PodDemand:
    """What one pod adds to a node: CPU cores, bytes of memory, whole GPUs, expected runtime."""

    cpu_cores: float
    memory_bytes: float = 0.0
    gpus: int = 0
    runtime_seconds: float | None = None  # from the pod's annotation; None: reference runtime
    basis: str = "requests"  # requests | default | observed

    def with_observed_cpu(self, cores: float) -> PodDemand:
        """The same demand with the CPU observed for the pod's owner instead of its request."""
        return PodDemand(cores, self.memory_bytes, self.gpus, self.runtime_seconds, "observed")


def _container_requests(container: Any, where: str) -> tuple[float, float, float]:
    if not isinstance(container, Mapping):
        raise PolicyError(f"{where}: must be an object")
    resources = container.get("resources")
    resources = {} if resources is None else resources
    if not isinstance(resources, Mapping):
        raise PolicyError(f"{where}.resources: must be an object")
    requests = resources.get("requests")
    limits = resources.get("limits")
    requests = {} if requests is None else requests
    limits = {} if limits is None else limits
    if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
        raise PolicyError(f"{where}.resources: requests and limits must be objects")

    def get(name: str) -> float:
        # kube-apiserver defaults a missing request to the limit; do the same for pods that
        # reach us without defaulting (e.g. in tests and the simulator).
        if name in requests:
            return parse_quantity(requests[name], f"{where}.resources.requests[{name}]", _BOUNDS[name])
        if name in limits:
            return parse_quantity(limits[name], f"{where}.resources.limits[{name}]", _BOUNDS[name])
        return 0.0

    return get("cpu"), get("memory"), get(GPU_RESOURCE)


def demand_from_pod(pod: Mapping[str, Any]) -> PodDemand:
    """Read a pod's demand from a ``v1.Pod`` document; ``PolicyError`` names a bad field."""
    spec = pod.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise PolicyError("Pod.spec: must be an object")
    containers = spec.get("containers")
    inits = spec.get("initContainers")
    containers = [] if containers is None else containers
    inits = [] if inits is None else inits
    if not isinstance(containers, list) or not isinstance(inits, list):
        raise PolicyError("Pod.spec.containers and Pod.spec.initContainers must be lists")
    cpu = mem = gpu = 0.0
    for i, c in enumerate(containers):
        c_cpu, c_mem, c_gpu = _container_requests(c, f"Pod.spec.containers[{i}]")
        cpu, mem, gpu = cpu + c_cpu, mem + c_mem, gpu + c_gpu
    # Init containers run one after another: the pod needs the largest of them, unless the
    # app containers need more. Restartable (sidecar) init containers keep running.
    side_cpu = side_mem = side_gpu = 0.0
    init_cpu = init_mem = init_gpu = 0.0
    for i, c in enumerate(inits):
        c_cpu, c_mem, c_gpu = _container_requests(c, f"Pod.spec.initContainers[{i}]")
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always":
            side_cpu, side_mem, side_gpu = side_cpu + c_cpu, side_mem + c_mem, side_gpu + c_gpu
            init_cpu, init_mem, init_gpu = max(init_cpu, side_cpu), max(init_mem, side_mem), max(init_gpu, side_gpu)
        else:
            init_cpu = max(init_cpu, side_cpu + c_cpu)
            init_mem = max(init_mem, side_mem + c_mem)
            init_gpu = max(init_gpu, side_gpu + c_gpu)
    cpu, mem, gpu = max(cpu + side_cpu, init_cpu), max(mem + side_mem, init_mem), max(gpu + side_gpu, init_gpu)
    overhead = spec.get("overhead")
    overhead = {} if overhead is None else overhead
    if not isinstance(overhead, Mapping):
        raise PolicyError("Pod.spec.overhead: must be an object")
    if "cpu" in overhead:
        cpu += parse_quantity(overhead["cpu"], "Pod.spec.overhead[cpu]", MAX_CPU_CORES)
    if "memory" in overhead:
        mem += parse_quantity(overhead["memory"], "Pod.spec.overhead[memory]", MAX_MEMORY_BYTES)
    # Each quantity is bounded; so is their sum (many containers at the maximum).
    for total, bound, name in ((cpu, MAX_CPU_CORES, "cpu"), (mem, MAX_MEMORY_BYTES, "memory"), (gpu, MAX_GPUS, GPU_RESOURCE)):
        if total > bound:
            raise QuantityError(f"Pod.spec: the pod's total {name} request ({total:g}) is over the physical maximum of {bound:g}")
    basis = "requests"
    if cpu == 0.0:
        cpu, basis = DEFAULT_MILLI_CPU_REQUEST / 1000.0, "default"
    return PodDemand(cpu, mem, round(gpu), expected_runtime(pod), basis)


NEXTFLOW_PROCESS_LABEL = "nextflow.io/processName"


def owner_of(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(namespace, kind, name) of what a pod's usage is observed under, or None.

    The controller in ``ownerReferences`` (a ReplicaSet, Job, StatefulSet...), or for a
    Nextflow task pod — which has no controller — its workflow process
    (kind ``NextflowProcess``, from the ``nextflow.io/processName`` label). The agent keys
    ``joulesched_owner_cpu_cores`` the same way.
    """
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    namespace = str(meta.get("namespace") or "")
    refs = meta.get("ownerReferences")
    if isinstance(refs, list):
        for ref in refs:
            if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") and ref.get("name"):
                return namespace, str(ref["kind"]), str(ref["name"])
    labels = meta.get("labels")
    if isinstance(labels, Mapping) and isinstance(labels.get(NEXTFLOW_PROCESS_LABEL), str):
        return namespace, "NextflowProcess", labels[NEXTFLOW_PROCESS_LABEL]
    return None


def expected_runtime(pod: Mapping[str, Any]) -> float | None:
    """The pod's ``joulesched.io/expected-runtime-seconds``, or ``None``; :class:`PolicyError` naming it if malformed."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping) or RUNTIME_ANNOTATION not in annotations:
        return None
    raw = annotations[RUNTIME_ANNOTATION]
    try:
        seconds = float(raw)
    except (TypeError, ValueError) as err:
        raise PolicyError(f"Pod annotation {RUNTIME_ANNOTATION}: must be a number of seconds, got {short(raw)}") from err
    if not 0 < seconds <= MAX_RUNTIME_SECONDS:
        raise PolicyError(
            f"Pod annotation {RUNTIME_ANNOTATION}: must be a positive number of seconds up to {MAX_RUNTIME_SECONDS:g}, got {short(raw)}"
        )
    return seconds
