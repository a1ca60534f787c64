"""The NADIKI Server Registry API's objects (``server-api.spec.yaml``), as frozen dataclasses.

Field names are the spec's: ``rated_power`` is in kW, ``total_installed_memory`` in GB,
``StorageDevice.capacity`` in TB. :meth:`ServerDescription.to_request` builds the
``ServerCreate`` body (also the ``ServerUpdate`` body: the spec defines it as the same object),
leaving out what is not known rather than sending nulls. :func:`parse_registration` reads a
``ServerResponse`` and checks every field provider mode relies on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

COOLING_TYPES = ("direct-to-chip", "immersion", "back-door-liquid", "back-door-fan", "air")
STORAGE_TYPES = ("NVMe", "SSD", "HDD", "Other")
MEASUREMENTS = ("facility", "rack", "server")
# Fields of the server's time series, as the spec's x-supported-server-timeseries-metrics lists them.
SERVER_FIELDS = ("cpu_energy_consumption_joules", "server_energy_consumption_joules")
REQUIRED_TAGS = ("facility_id", "rack_id", "server_id", "country_code")


@dataclass(frozen=True)
class Processor:
    """A CPU, GPU or FPGA: the spec's ``CPU``/``GPU``/``FPGA`` (vendor and type required)."""

    vendor: str
    type: str
    physical_core_count: int | None = None  # CPUs only

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"vendor": self.vendor, "type": self.type}
        if self.physical_core_count is not None:
            body["physical_core_count"] = self.physical_core_count
        return body


@dataclass(frozen=True)
class StorageDevice:
    vendor: str
    capacity: float  # TB
    type: str  # NVMe | SSD | HDD | Other

    def to_json(self) -> dict[str, Any]:
        return {"vendor": self.vendor, "capacity": self.capacity, "type": self.type}


@dataclass(frozen=True)
class ServerDescription:
    """What is registered: the spec's ``ServerCreate``."""

    facility_id: str
    rack_id: str
    cooling_type: str = "air"
    rated_power: float | None = None  # kW
    total_cpu_sockets: int | None = None
    installed_cpus: tuple[Processor, ...] = ()
    number_of_psus: int | None = None
    total_installed_memory: int | None = None  # GB
    number_of_memory_units: int | None = None
    storage_devices: tuple[StorageDevice, ...] = ()
    installed_gpus: tuple[Processor, ...] = ()
    installed_fpgas: tuple[Processor, ...] = ()
    product_passport: Mapping[str, Any] | None = None
    description: str | None = None

    def to_request(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "facility_id": self.facility_id,
            "rack_id": self.rack_id,
            "cooling_type": self.cooling_type,
        }
        for key in (
            "rated_power",
            "total_cpu_sockets",
            "number_of_psus",
            "total_installed_memory",
            "number_of_memory_units",
            "description",
        ):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        for key in ("installed_cpus", "storage_devices", "installed_gpus", "installed_fpgas"):
            items = getattr(self, key)
            if items:
                body[key] = [item.to_json() for item in items]
        if self.product_passport is not None:
            body["product_passport"] = dict(self.product_passport)
        return body


@dataclass(frozen=True)
class DataPoint:
    """One series the server must push (``ServerTimeSeriesDataPoint``)."""

    measurement: str
    field: str
    granularity_seconds: int
    tags: Mapping[str, str]


@dataclass(frozen=True)
class TimeSeriesConfig:
    """Where and how to push (``ServerTimeSeriesConfig``): an InfluxDB v2 endpoint."""

    endpoint: str
    org: str
    bucket: str
    token: str = field(repr=False)
    data_points: tuple[DataPoint, ...]


@dataclass(frozen=True)
class Registration:
    """The registrar's answer (``ServerResponse``): the server id and its time-series config."""

    server_id: str
    time_series: TimeSeriesConfig
    raw: Mapping[str, Any] = field(repr=False, compare=False)


def parse_registration(document: object, where: str) -> Registration:
    """Read a ServerResponse; ValueError listing every missing or mistyped field the agent needs."""
    problems: list[str] = []

    def get(doc: Mapping[str, Any], key: str, path: str, kind: type | tuple[type, ...]) -> Any:
        value = doc.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or value == "":
            problems.append(f"{path}{key}: expected {getattr(kind, '__name__', 'value')}, got {value!r}")
            return None
        return value

    if not isinstance(document, Mapping):
        raise ValueError(f"{where}: expected a ServerResponse object, got {type(document).__name__}")
    server_id = get(document, "id", "", str)
    tsc = document.get("timeSeriesConfig")
    data_points: list[DataPoint] = []
    endpoint = org = bucket = token = None
    if not isinstance(tsc, Mapping):
        problems.append(f"timeSeriesConfig: expected an object, got {tsc!r}")
    else:
        endpoint = get(tsc, "endpoint", "timeSeriesConfig.", str)
        org = get(tsc, "org", "timeSeriesConfig.", str)
        bucket = get(tsc, "bucket", "timeSeriesConfig.", str)
        token = get(tsc, "token", "timeSeriesConfig.", str)
        points = tsc.get("dataPoints")
        if not isinstance(points, list):
            problems.append(f"timeSeriesConfig.dataPoints: expected a list, got {points!r}")
            points = []
        for i, point in enumerate(points):
            path = f"timeSeriesConfig.dataPoints[{i}]."
            if not isinstance(point, Mapping):
                problems.append(f"{path[:-1]}: expected an object, got {point!r}")
                continue
            measurement = get(point, "measurement", path, str)
            field_name = get(point, "field", path, str)
            granularity = point.get("granularitySeconds", 30)  # the spec's default
            if isinstance(granularity, bool) or not isinstance(granularity, int) or granularity <= 0:
                problems.append(f"{path}granularitySeconds: expected a positive integer, got {granularity!r}")
                granularity = None
            tags = point.get("tags")
            if not isinstance(tags, Mapping) or not all(isinstance(v, str) and v for v in tags.values()):
                problems.append(f"{path}tags: expected an object of non-empty strings, got {tags!r}")
                tags = None
            else:
                missing = [t for t in REQUIRED_TAGS if t not in tags]
                if missing:
                    problems.append(f"{path}tags: missing {', '.join(missing)}")
            if measurement and field_name and granularity and tags is not None:
                data_points.append(DataPoint(measurement, field_name, granularity, dict(tags)))
    if problems:
        raise ValueError(
            f"{where}: the registrar's answer does not follow the spec's ServerResponse: " + "; ".join(problems)
        )
    assert server_id and endpoint and org and bucket and token
    return Registration(server_id, TimeSeriesConfig(endpoint, org, bucket, token, tuple(data_points)), dict(document))


__all__ = [
    "COOLING_TYPES",
    "REQUIRED_TAGS",
    "SERVER_FIELDS",
    "STORAGE_TYPES",
    "DataPoint",
    "Processor",
    "Registration",
    "ServerDescription",
    "StorageDevice",
    "TimeSeriesConfig",
    "parse_registration",
]
