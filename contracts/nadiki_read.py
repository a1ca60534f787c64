"""The NADIKI side read back by a tenant: the registrar's server description and the energy the
provider pushed, keyed by the server id a Kubernetes node carries (``joulesched.io/server-id``).

* :class:`RegistrarReader` — ``GET {registrar}/servers/{id}`` (``server-api.spec.yaml``): the
  server's description (``ServerCreate``: its CPUs and cores, rated power) and the series it
  pushes (``timeSeriesConfig.dataPoints``: measurement, field, granularity, tags).
* :class:`InfluxReader` — the InfluxDB 1.x HTTP query API, ``GET {url}/query?db=&q=&epoch=ms``
  (also served by InfluxDB 2's v1 compatibility API): the provider's windows, each the joules
  of ``[t, t + granularitySeconds)`` stamped with ``t`` (``measurement.nadiki.pusher``).

The query is InfluxQL built here, with identifiers double-quoted and string literals
single-quoted and backslash-escaped (InfluxQL's rules), so a server id cannot change its
meaning. Every failure raises :class:`~contracts.errors.NadikiReadError` naming the URL, what
was asked and what to do. Credentials go to the configured origin only: a redirect elsewhere is
followed without them (``contracts.net.open_url``), and a URL with credentials in it is refused.
"""

from __future__ import annotations

import base64
import json
import math
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from joulesched.contracts.errors import NadikiReadError
from joulesched.contracts.nadiki import (
    DataPoint,
    Processor,
    ServerDescription,
    parse_registration,
)
from joulesched.contracts.net import open_url, url_problem

ENERGY_FIELD = "server_energy_consumption_joules"  # the whole server, measured via IPMI (the spec)


def influxql_identifier(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def influxql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _check_url(url: str, secret_keys: str) -> None:
    """ValueError for a URL that is not http(s) or that carries credentials (``contracts.net.url_problem``:
    the URL is shown in every error message, which must not hold a password)."""
    problem = url_problem(url, secret_keys)
    if problem:
        raise ValueError(f"URL {problem}")


def _get_json(url: str, headers: Mapping[str, str], timeout_s: float, ca_file: str | None, where: str, fix: str) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json", **headers})
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https") else None
    try:
        with open_url(request, timeout=timeout_s, context=context) as response:
            raw = response.read()
    except urllib.error.HTTPError as err:
        body = err.read()[:300].decode("utf-8", "replace")
        hint = {401: "the credentials were refused", 403: "the credentials lack read access", 404: "not found"}
        raise NadikiReadError(
            f"{where}: HTTP {err.code} {err.reason} {body.strip()} — {hint.get(err.code, fix)}".rstrip()
        ) from err
    except ssl.SSLCertVerificationError as err:
        raise NadikiReadError(
            f"{where}: TLS certificate not trusted ({err.verify_message}) — give the CA file"
        ) from err
    except (OSError, urllib.error.URLError) as err:
        reason = getattr(err, "reason", None) or err
        raise NadikiReadError(f"{where}: {reason} — {fix}") from err
    try:
        return json.loads(raw)
    except ValueError as err:
        raise NadikiReadError(f"{where}: the answer is not JSON ({raw[:80]!r})") from err


# -- the registrar ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NadikiServer:
    """A registered server as a tenant sees it."""

    server_id: str
    description: ServerDescription
    data_points: tuple[DataPoint, ...]

    def point(self, field_name: str = ENERGY_FIELD) -> DataPoint | None:
        return next((p for p in self.data_points if p.field == field_name), None)

    @property
    def physical_cores(self) -> int:
        """Σ ``physical_core_count`` of the registered CPUs (0 when the registration omits them)."""
        return sum(cpu.physical_core_count or 0 for cpu in self.description.installed_cpus)


def parse_description(document: Mapping[str, Any], where: str) -> ServerDescription:
    """The ``ServerCreate`` part of a ``ServerResponse`` (what the tenant uses of it)."""
    problems: list[str] = []
    cpus: list[Processor] = []
    for i, cpu in enumerate(document.get("installed_cpus") or []):
        if (
            not isinstance(cpu, Mapping)
            or not isinstance(cpu.get("vendor"), str)
            or not isinstance(cpu.get("type"), str)
        ):
            problems.append(f"installed_cpus[{i}]: expected an object with vendor and type, got {cpu!r}")
            continue
        cores = cpu.get("physical_core_count")
        if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores <= 0):
            problems.append(f"installed_cpus[{i}].physical_core_count: expected a positive integer, got {cores!r}")
            cores = None
        cpus.append(Processor(cpu["vendor"], cpu["type"], cores))
    rated = document.get("rated_power")
    if rated is not None and (isinstance(rated, bool) or not isinstance(rated, int | float) or not rated > 0):
        problems.append(f"rated_power: expected a positive number of kW, got {rated!r}")
        rated = None
    for key in ("facility_id", "rack_id"):
        if not isinstance(document.get(key), str) or not document.get(key):
            problems.append(f"{key}: expected a string, got {document.get(key)!r}")
    if problems:
        raise NadikiReadError(
            f"{where}: the server description does not follow the spec's ServerCreate: " + "; ".join(problems)
        )
    return ServerDescription(
        facility_id=str(document["facility_id"]),
        rack_id=str(document["rack_id"]),
        cooling_type=str(document.get("cooling_type", "air")),
        rated_power=float(rated) if rated is not None else None,
        total_cpu_sockets=document.get("total_cpu_sockets"),
        installed_cpus=tuple(cpus),
        description=document.get("description"),
    )


@dataclass(frozen=True)
class RegistrarReader:
    """``GET /servers/{id}`` on a NADIKI registrar (``url`` is the API base)."""

    url: str
    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        _check_url(self.url, "the registrar token file")

    def server(self, server_id: str) -> NadikiServer:
        path = f"/servers/{urllib.parse.quote(server_id, safe='')}"
        where = f"NADIKI registrar {self.url}: GET {path}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        document = _get_json(
            self.url.rstrip("/") + path,
            headers,
            self.timeout_s,
            self.ca_file,
            where,
            "check the registrar URL and the network path; is the node's joulesched.io/server-id label right?",
        )
        try:
            registration = parse_registration(document, where)
        except ValueError as err:
            raise NadikiReadError(str(err)) from err
        if registration.server_id != server_id:
            raise NadikiReadError(f"{where}: answered server {registration.server_id!r}, not {server_id!r}")
        return NadikiServer(server_id, parse_description(document, where), registration.time_series.data_points)


# -- the time-series store ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Windows:
    """A server's pushed windows, sorted: ``starts[i]`` (unix s) held ``joules[i]`` over ``granularity`` s."""

    server_id: str
    granularity: int
    starts: tuple[float, ...]
    joules: tuple[float, ...]

    @property
    def total(self) -> float:
        return math.fsum(self.joules)


@dataclass(frozen=True)
class InfluxReader:
    """Read access to the provider's store through InfluxDB 1.x's ``/query``.

    ``username``/``password`` are sent as HTTP Basic credentials (InfluxDB 1.x; InfluxDB 2's v1
    compatibility API takes a token as the password).
    """

    url: str
    database: str
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str | None = None
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        _check_url(self.url, "the username and password file")

    def query(self, influxql: str) -> list[dict[str, Any]]:
        """The series of one statement's answer (``results[0].series``)."""
        params = urllib.parse.urlencode({"db": self.database, "q": influxql, "epoch": "ms"})
        where = f"InfluxDB {self.url} (database {self.database!r})"
        headers = {}
        if self.username or self.password:
            credentials = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            headers["Authorization"] = f"Basic {credentials}"
        answer = _get_json(
            f"{self.url.rstrip('/')}/query?{params}",
            headers,
            self.timeout_s,
            self.ca_file,
            where,
            "check the InfluxDB URL the provider gave for reading and the network path",
        )
        results = answer.get("results") if isinstance(answer, Mapping) else None
        if not isinstance(results, list) or not results or not isinstance(results[0], Mapping):
            error = answer.get("error") if isinstance(answer, Mapping) else None
            raise NadikiReadError(f"{where}: {error or f'unexpected answer {str(answer)[:120]}'}")
        result = results[0]
        if "error" in result:
            raise NadikiReadError(f"{where}: {result['error']} (query: {influxql})")
        if result.get("partial"):
            raise NadikiReadError(
                f"{where}: the answer was cut at the server's max-row-limit (partial) — ask for a shorter range"
            )
        series = result.get("series") or []
        if not isinstance(series, list):
            raise NadikiReadError(f"{where}: series is not a list")
        return series

    def windows(self, point: DataPoint, server_id: str, start: float, end: float) -> Windows:
        """The windows of ``point`` for ``server_id`` starting in ``[start, end)``."""
        influxql = (
            f"SELECT {influxql_identifier(point.field)} FROM {influxql_identifier(point.measurement)} "
            f"WHERE {influxql_identifier('server_id')} = {influxql_string(server_id)} "
            f"AND time >= {round(start * 1e9)} AND time < {round(end * 1e9)}"
        )
        by_time: dict[float, float] = {}
        where = f"InfluxDB {self.url}: {point.measurement}.{point.field} of server {server_id}"
        for series in self.query(influxql):
            columns = series.get("columns") or []
            try:
                t_col, v_col = columns.index("time"), columns.index(point.field)
            except ValueError:
                raise NadikiReadError(f"{where}: columns {columns!r} lack time or {point.field}") from None
            for row in series.get("values") or []:
                t, value = row[t_col], row[v_col]
                if value is None:
                    continue
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int | float)
                    or not math.isfinite(value)
                    or value < 0
                ):
                    raise NadikiReadError(f"{where}: window at {t} holds {value!r}, not joules")
                at = float(t) / 1000.0
                if at in by_time and by_time[at] != value:
                    raise NadikiReadError(f"{where}: two different values for the window at {at:.0f}")
                by_time[at] = float(value)
        times = sorted(by_time)
        return Windows(server_id, point.granularity_seconds, tuple(times), tuple(by_time[t] for t in times))


__all__ = [
    "ENERGY_FIELD",
    "InfluxReader",
    "NadikiServer",
    "RegistrarReader",
    "Windows",
    "influxql_identifier",
    "influxql_string",
    "parse_description",
]
