"""Provider-mode configuration: the ``nadiki:`` section of the agent's YAML file.

Every field, with its default (``server`` takes the spec's ``ServerCreate`` names and units)::

    nadiki:
      registrar_url: https://registry.example.com/v1   # required: the NADIKI API base
      registrar_token_file: ""          # bearer token for the registrar, if it wants one
      ca_file: ""                       # PEM CA bundle for the registrar and the time-series endpoint
      state_file: /var/lib/joulesched/nadiki-server.json
      timeout_s: 10
      precision: s                      # s | ms | us | ns: the line-protocol timestamps
      max_gap_s: 300                    # a longer silence restarts the windows
      max_backlog_lines: 20000          # lines kept while the endpoint is unreachable
      fields:                           # field -> sources in priority order
        server_energy_consumption_joules: [ipmi_dcmi, redfish, ipmi_sdr]
        cpu_energy_consumption_joules: [rapl_sysfs, rapl_msr]
      server:
        facility_id: FACILITY-NLD-001   # required
        rack_id: RACK-001               # required
        cooling_type: air               # direct-to-chip | immersion | back-door-liquid | back-door-fan | air
        discover: true                  # fill CPUs, sockets, memory, disks and GPUs from the host
        rated_power: 1.1                # kW (optional, like everything below)
        total_cpu_sockets: 2
        installed_cpus: [{vendor: Intel, type: Xeon Gold 6338, physical_core_count: 32}]
        number_of_psus: 2
        total_installed_memory: 512     # GB
        number_of_memory_units: 16
        storage_devices: [{vendor: Samsung, capacity: 3.84, type: NVMe}]   # capacity in TB
        installed_gpus: [{vendor: NVIDIA, type: H100 80GB HBM3}]
        installed_fpgas: []
        product_passport: {}
        description: ""

Problems are reported all at once with their dotted paths, as everywhere in joulesched.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from joulesched.measurement.nadiki.lineprotocol import PRECISIONS
from joulesched.measurement.nadiki.model import (
    COOLING_TYPES,
    STORAGE_TYPES,
    Processor,
    ServerDescription,
    StorageDevice,
)
from joulesched.policy.validate import Checker

DEFAULT_STATE_FILE = "/var/lib/joulesched/nadiki-server.json"
DEFAULT_FIELDS: Mapping[str, tuple[str, ...]] = {
    "server_energy_consumption_joules": ("ipmi_dcmi", "redfish", "ipmi_sdr"),
    "cpu_energy_consumption_joules": ("rapl_sysfs", "rapl_msr"),
}
TOP_KEYS = (
    "registrar_url",
    "registrar_token_file",
    "ca_file",
    "state_file",
    "timeout_s",
    "precision",
    "max_gap_s",
    "max_backlog_lines",
    "fields",
    "server",
)
SERVER_KEYS = (
    "facility_id",
    "rack_id",
    "cooling_type",
    "discover",
    "rated_power",
    "total_cpu_sockets",
    "installed_cpus",
    "number_of_psus",
    "total_installed_memory",
    "number_of_memory_units",
    "storage_devices",
    "installed_gpus",
    "installed_fpgas",
    "product_passport",
    "description",
)


@dataclass(frozen=True)
class ProviderConfig:
    registrar_url: str
    server: ServerDescription
    discover: bool = True
    registrar_token_file: str = ""
    ca_file: str = ""
    state_file: str = DEFAULT_STATE_FILE
    timeout_s: float = 10.0
    precision: str = "s"
    max_gap_s: float = 300.0
    max_backlog_lines: int = 20_000
    fields: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_FIELDS))


def _integer(
    c: Checker, doc: Mapping[str, Any], key: str, path: str, minimum: int, default: int | None = None
) -> int | None:
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        c.problem(f"{path}.{key}", f"must be an integer, got {value!r}")
        return None
    if value < minimum:
        c.problem(f"{path}.{key}", f"must be >= {minimum}, got {value}")
        return None
    return value


def _processors(c: Checker, doc: Mapping[str, Any], key: str, path: str, cores: bool) -> tuple[Processor, ...]:
    out = []
    for i, item in enumerate(c.list_of(doc, key, path)):
        where = f"{path}.{key}[{i}]"
        entry = c.mapping(item, where)
        allowed = ("vendor", "type", "physical_core_count") if cores else ("vendor", "type")
        c.unknown_keys(entry, allowed, where)
        vendor, kind = c.string(entry, "vendor", where), c.string(entry, "type", where)
        count = _integer(c, entry, "physical_core_count", where, 1) if cores else None
        if vendor and kind:
            out.append(Processor(vendor, kind, count))
    return tuple(out)


def _storage(c: Checker, doc: Mapping[str, Any], path: str) -> tuple[StorageDevice, ...]:
    out = []
    for i, item in enumerate(c.list_of(doc, "storage_devices", path)):
        where = f"{path}.storage_devices[{i}]"
        entry = c.mapping(item, where)
        c.unknown_keys(entry, ("vendor", "capacity", "type"), where)
        vendor = c.string(entry, "vendor", where)
        capacity = c.number(entry, "capacity", where, exclusive_minimum=0)
        kind = c.string(entry, "type", where, choices=STORAGE_TYPES)
        if vendor and capacity is not None and kind:
            out.append(StorageDevice(vendor, capacity, kind))
    return tuple(out)


def parse_provider_config(document: Any, where: str = "nadiki", path: str = "nadiki") -> ProviderConfig:
    """Validate the ``nadiki`` section; raise ConfigError listing every problem."""
    c = Checker(where)
    doc = c.mapping(document, path)
    c.unknown_keys(doc, TOP_KEYS, path)
    url = c.string(doc, "registrar_url", path)
    if url is not None and urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        c.problem(f"{path}.registrar_url", f"must be an http(s) URL, got {url!r}")
    token_file = c.string(doc, "registrar_token_file", path, default="") if doc.get("registrar_token_file") else ""
    ca_file = c.string(doc, "ca_file", path, default="") if doc.get("ca_file") else ""
    state_file = c.string(doc, "state_file", path, default=DEFAULT_STATE_FILE)
    timeout_s = c.number(doc, "timeout_s", path, default=10.0, exclusive_minimum=0, maximum=300)
    precision = c.string(doc, "precision", path, default="s", choices=PRECISIONS)
    max_gap_s = c.number(doc, "max_gap_s", path, default=300.0, exclusive_minimum=0)
    backlog = _integer(c, doc, "max_backlog_lines", path, 1, default=20_000)

    fields: dict[str, tuple[str, ...]] = dict(DEFAULT_FIELDS)
    if doc.get("fields") is not None:
        fields = {}
        for name, sources in c.mapping(doc.get("fields"), f"{path}.fields").items():
            where_f = f"{path}.fields.{name}"
            if not isinstance(sources, list) or not sources or not all(isinstance(s, str) and s for s in sources):
                c.problem(where_f, f"must be a non-empty list of source names, got {sources!r}")
                continue
            fields[str(name)] = tuple(sources)

    spath = f"{path}.server"
    server = c.mapping(doc.get("server"), spath)
    if doc.get("server") is None:
        c.problem(spath, "is required (facility_id, rack_id, cooling_type at least)")
    c.unknown_keys(server, SERVER_KEYS, spath)
    facility = c.string(server, "facility_id", spath) if doc.get("server") is not None else None
    rack = c.string(server, "rack_id", spath) if doc.get("server") is not None else None
    cooling = c.string(server, "cooling_type", spath, default="air", choices=COOLING_TYPES)
    discover = c.boolean(server, "discover", spath, default=True)
    rated_power = c.number(server, "rated_power", spath, default=None, exclusive_minimum=0)
    passport = server.get("product_passport")
    if passport is not None and not isinstance(passport, Mapping):
        c.problem(f"{spath}.product_passport", f"must be a mapping, got {passport!r}")
        passport = None
    description_text = c.string(server, "description", spath, default=None)
    description = ServerDescription(
        facility_id=facility or "",
        rack_id=rack or "",
        cooling_type=cooling or "air",
        rated_power=rated_power,
        total_cpu_sockets=_integer(c, server, "total_cpu_sockets", spath, 1),
        installed_cpus=_processors(c, server, "installed_cpus", spath, cores=True),
        number_of_psus=_integer(c, server, "number_of_psus", spath, 1),
        total_installed_memory=_integer(c, server, "total_installed_memory", spath, 0),
        number_of_memory_units=_integer(c, server, "number_of_memory_units", spath, 0),
        storage_devices=_storage(c, server, spath),
        installed_gpus=_processors(c, server, "installed_gpus", spath, cores=False),
        installed_fpgas=_processors(c, server, "installed_fpgas", spath, cores=False),
        product_passport=dict(passport) if isinstance(passport, Mapping) else None,
        description=description_text,
    )
    c.raise_if_any()
    return ProviderConfig(
        registrar_url=str(url),
        server=description,
        discover=discover,
        registrar_token_file=token_file or "",
        ca_file=ca_file or "",
        state_file=state_file or DEFAULT_STATE_FILE,
        timeout_s=float(timeout_s or 10.0),
        precision=precision or "s",
        max_gap_s=float(max_gap_s or 300.0),
        max_backlog_lines=backlog or 20_000,
        fields=fields,
    )


__all__ = ["DEFAULT_FIELDS", "DEFAULT_STATE_FILE", "ProviderConfig", "parse_provider_config"]
