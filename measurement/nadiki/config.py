"""Provider-mode configuration: the ``nadiki:`` section of the agent's YAML file.

The scalar fields are declared once below with their defaults, bounds and meaning
(``setting``); the parser and the table in docs/provider.md (``python -m joulesched.configdoc``)
derive from them. ``fields`` and the ``server`` section are structured and read by their own
code; an example with every field::

    nadiki:
      registrar_url: https://registry.example.com/v1   # required: the NADIKI API base
      registrar_token_file: /run/credentials/joulesched-provider.service/registrar-token   # optional
      allow_plain_http: false           # true: tokens may go over http:// (loopback always may)
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
        installed_cpus:                 # one entry per CPU installed (tenants add up their cores)
          - {vendor: Intel, type: Xeon Gold 6338, physical_core_count: 32}
          - {vendor: Intel, type: Xeon Gold 6338, physical_core_count: 32}
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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from joulesched.contracts.net import plain_http_problem, url_problem
from joulesched.measurement.nadiki.lineprotocol import PRECISIONS
from joulesched.measurement.nadiki.model import (
    COOLING_TYPES,
    STORAGE_TYPES,
    Processor,
    ServerDescription,
    StorageDevice,
)
from joulesched.policy.validate import Checker, read_values, setting

DEFAULT_STATE_FILE = "/var/lib/joulesched/nadiki-server.json"
DEFAULT_FIELDS: Mapping[str, tuple[str, ...]] = {
    "server_energy_consumption_joules": ("ipmi_dcmi", "redfish", "ipmi_sdr"),
    "cpu_energy_consumption_joules": ("rapl_sysfs", "rapl_msr"),
}
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
    """The scalar fields are declared once with :func:`setting` (read by ``read_values``, listed
    in docs/provider.md); ``fields`` (a mapping of lists) and ``server`` (the spec's nested
    ``ServerCreate`` document, with ``discover``) are structured and read by the code below."""

    registrar_url: str = setting(doc="the API base, e.g. `https://registry.example.com/v1`", kind="string")
    server: ServerDescription = setting(
        doc="where the server is and what it is: the spec's `ServerCreate` document (below)",
        kind="custom",
        shown="— (required)",
    )
    discover: bool = True  # server.discover, read with the server section
    registrar_token_file: str = setting(
        "", "bearer token for the registrar (the spec defines no auth scheme)", empty_ok=True, shown="none"
    )
    allow_plain_http: bool = setting(
        False,
        "send the registrar token over an `http://` `registrar_url`, and the time-series token to an `http://`"
        " endpoint the registrar hands out, in cleartext; refused otherwise, except to loopback hosts",
    )
    ca_file: str = setting(
        "", "CA bundle for the registrar and the time-series endpoint", empty_ok=True, shown="system store"
    )
    state_file: str = setting(DEFAULT_STATE_FILE, "the registered id and config")
    timeout_s: float = setting(10.0, "per HTTP request", exclusive_minimum=0, maximum=300)
    precision: str = setting("s", "line-protocol timestamps", choices=PRECISIONS)
    max_gap_s: float = setting(300.0, "a longer silence of a source restarts its windows", exclusive_minimum=0)
    max_backlog_lines: int = setting(
        20_000, "lines kept while the endpoint is unreachable", kind="integer", minimum=1
    )
    fields: Mapping[str, tuple[str, ...]] = setting(
        doc="field → sources in priority order", kind="custom", factory=lambda: dict(DEFAULT_FIELDS), shown="see above"
    )


def _processors(c: Checker, doc: Mapping[str, Any], key: str, path: str, cores: bool) -> tuple[Processor, ...]:
    out = []
    for i, item in enumerate(c.list_of(doc, key, path)):
        where = f"{path}.{key}[{i}]"
        entry = c.mapping(item, where)
        allowed = ("vendor", "type", "physical_core_count") if cores else ("vendor", "type")
        c.unknown_keys(entry, allowed, where)
        vendor, kind = c.string(entry, "vendor", where), c.string(entry, "type", where)
        count = c.integer(entry, "physical_core_count", where, minimum=1) if cores else None
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
    # as before: any false value (false, 0, [], "") of the two optional files means none
    doc = {k: ("" if k in ("registrar_token_file", "ca_file") and not v else v) for k, v in doc.items()}
    values = read_values(ProviderConfig, doc, c, path)
    url = values["registrar_url"]
    problem = url_problem(url, "registrar_token_file") if url else None
    if problem is None and url and values["registrar_token_file"]:
        problem = plain_http_problem(url, "the registrar token (registrar_token_file)", values["allow_plain_http"])
    if problem:
        c.problem(f"{path}.registrar_url", problem)

    # Bespoke: ``fields`` (a mapping of source lists) and ``server`` (the spec's nested
    # ServerCreate document with lists of processors and storage devices) are structured.
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
    sockets = c.integer(server, "total_cpu_sockets", spath, minimum=1)
    cpus = _processors(c, server, "installed_cpus", spath, cores=True)
    if sockets is not None and len(cpus) > sockets:
        c.problem(
            f"{spath}.installed_cpus",
            f"lists {len(cpus)} CPUs for {sockets} sockets (total_cpu_sockets): one entry per CPU installed",
        )
    description = ServerDescription(
        facility_id=facility or "",
        rack_id=rack or "",
        cooling_type=cooling or "air",
        rated_power=rated_power,
        total_cpu_sockets=sockets,
        installed_cpus=cpus,
        number_of_psus=c.integer(server, "number_of_psus", spath, minimum=1),
        total_installed_memory=c.integer(server, "total_installed_memory", spath, minimum=0),
        number_of_memory_units=c.integer(server, "number_of_memory_units", spath, minimum=0),
        storage_devices=_storage(c, server, spath),
        installed_gpus=_processors(c, server, "installed_gpus", spath, cores=False),
        installed_fpgas=_processors(c, server, "installed_fpgas", spath, cores=False),
        product_passport=dict(passport) if isinstance(passport, Mapping) else None,
        description=description_text,
    )
    c.raise_if_any()
    return ProviderConfig(**values, server=description, discover=discover, fields=fields)


__all__ = ["DEFAULT_FIELDS", "DEFAULT_STATE_FILE", "ProviderConfig", "parse_provider_config"]
