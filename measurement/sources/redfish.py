"""Whole-server power and energy from a BMC's Redfish service (``/redfish/v1/Chassis``).

Per chassis, the first of these that the chassis links to and that carries a reading:

1. ``EnvironmentMetrics`` (Redfish 2020.4 and later): ``PowerWatts.Reading`` (watts) and
   ``EnergykWh.Reading`` (a kWh counter since the BMC's last reset; exported in joules);
2. ``Power`` (the older schema, deprecated in 2020.4 but what most BMCs still serve):
   ``PowerControl[].PowerConsumedWatts`` of the member that meters the whole chassis — members
   whose ``PhysicalContext`` names a component (CPU, memory, storage, …) are parts, not totals;
3. ``PowerSubsystem`` (2020.4 and later) without EnvironmentMetrics: the sum of
   ``PowerSupplies/*/Metrics`` ``InputPowerWatts.Reading`` (the draw from the wall).

Zones: one per chassis that has a reading, named ``chassis-<Id>``, domain ``platform``. Where
both a power reading and an energy counter exist, option ``prefer`` picks the primary zone
(``energy``, the default: the BMC's own counter loses nothing across a gap in reads and is more
exact than integrating its power, though it usually resolves 1 Wh = 3.6 kJ; ``power``: finer
per interval); the other is exposed as ``chassis-<Id>-power`` / ``chassis-<Id>-energy`` with
``parent`` set to the primary — the same quantity through another mechanism, for cross-checks,
never to be added to it (so a ``null`` power reading while the counter reads does not take the
source down). A chassis that
``Links.ContainedBy`` another metered chassis gets that chassis's zone as parent too (a blade
in an enclosure: never add both).

HTTP: one persistent connection (http.client), HTTP basic authentication with the password
from a file or an environment variable, TLS verified against the system store or ``ca_file``.
:func:`check_options` refuses, before anything is sent, a ``url`` with credentials in it and a
password over ``http://`` to a host that is not loopback unless ``allow_plain_http: true``
(the rules of ``contracts.net``); the agent applies it when it loads its config.
Readings are stamped with the midpoint of the request on the agent's clock. Within one read of
the source (:meth:`Redfish.begin_pass` … :meth:`Redfish.end_pass`, which the meter calls) each
resource is fetched once: the power and the energy zone of a chassis share one GET of its
EnvironmentMetrics.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import ssl
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from joulesched.contracts.net import ALLOW_PLAIN_HTTP, Deadline, is_loopback_host, plain_http_problem, url_problem
from joulesched.measurement.errors import MeasurementError, SourceAbsent, SourceFailed
from joulesched.measurement.sources.base import Reading, ReadingKind, Roots
from joulesched.policy.units import JOULES_PER_KWH

NAME = "redfish"

Clock = Callable[[], float]

OPTIONS = frozenset(
    {
        "url",
        "username",
        "password_file",
        "password_env",
        "ca_file",
        "tls_verify",
        "timeout_s",
        "chassis",
        "prefer",
        "clock",
        ALLOW_PLAIN_HTTP,
    }
)
SECRET_KEYS = "password_file or password_env"
# PowerControl members whose PhysicalContext says they meter the whole chassis (or none is given);
# members for a part of the server (CPU, Memory, StorageDevice, GPU, Fan, ...) are never the total.
WHOLE_CONTEXTS = frozenset({"Chassis", "SystemBoard", "Rack", "Room", "Upstream", "PowerSupplyBay"})


class HttpError(MeasurementError):
    """A Redfish GET answered with a non-2xx status (turned into SourceAbsent/SourceFailed by the source)."""

    def __init__(self, status: int, reason: str, path: str) -> None:
        super().__init__(f"HTTP {status} {reason} for {path}")
        self.status = status
        self.path = path


@dataclass
class RedfishClient:
    """GET JSON from one Redfish service over a persistent connection (thread-safe)."""

    url: str  # scheme://host[:port]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    tls_verify: bool = True
    timeout_s: float = 10.0
    _conn: http.client.HTTPConnection | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        problem = url_problem(self.url, SECRET_KEYS)
        if problem:
            raise ValueError(f"url: {problem}")
        parsed = urllib.parse.urlsplit(self.url)
        assert parsed.hostname is not None  # url_problem checked
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.origin = f"{parsed.scheme}://{host}" + (f":{self.port}" if self.port is not None else "")

    def _connect(self) -> http.client.HTTPConnection:
        if self.scheme == "http":
            return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        context = ssl.create_default_context(cafile=self.ca_file)
        if not self.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=context)

    def get(self, path: str) -> dict[str, Any]:
        """GET a resource; HttpError on a non-2xx status, OSError/ssl.SSLError on transport failures."""
        headers = {"Accept": "application/json", "OData-Version": "4.0"}
        if self.username is not None:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        with self._lock:
            for attempt in (1, 2):  # a kept-alive connection the BMC closed is retried once, fresh
                if self._conn is None:
                    self._conn = self._connect()
                # The socket's timeout bounds each read; the deadline the whole reply, so a BMC
                # that trickles it holds the reader no longer than timeout_s either.
                with Deadline(self._conn, self.timeout_s) as deadline:
                    try:
                        self._conn.request("GET", path, headers=headers)
                        response = self._conn.getresponse()
                        body = response.read()
                        break
                    except (
                        http.client.RemoteDisconnected,
                        BrokenPipeError,
                        ConnectionResetError,
                        http.client.CannotSendRequest,
                        http.client.ResponseNotReady,
                    ):
                        self.close_connection()
                        if deadline.expired:
                            raise TimeoutError(f"{path}: no whole reply within {self.timeout_s:g} s") from None
                        if attempt == 2:
                            raise
                    except BaseException:
                        self.close_connection()
                        if deadline.expired:
                            raise TimeoutError(f"{path}: no whole reply within {self.timeout_s:g} s") from None
                        raise
            if response.getheader("Connection", "").lower() == "close":
                self.close_connection()
        if not 200 <= response.status < 300:
            raise HttpError(response.status, response.reason, path)
        try:
            document = json.loads(body)
        except ValueError as err:
            raise ValueError(f"{path}: not JSON ({body[:80]!r})") from err
        if not isinstance(document, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(document).__name__}")
        return document

    def close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _link(resource: Mapping[str, Any], key: str) -> str | None:
    value = resource.get(key)
    if isinstance(value, dict) and isinstance(value.get("@odata.id"), str):
        return str(value["@odata.id"])
    return None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _reading(resource: Mapping[str, Any], key: str) -> float | None:
    """``{"Key": {"Reading": 123.4}}`` → 123.4 (None when absent or null)."""
    excerpt = resource.get(key)
    return _number(excerpt.get("Reading")) if isinstance(excerpt, dict) else None


def whole_power_control(members: Sequence[Any]) -> tuple[int, float] | None:
    """The PowerControl member that meters the whole chassis, as (index, watts)."""
    candidates: list[tuple[int, float, str | None]] = []
    for index, member in enumerate(members):
        if not isinstance(member, dict):
            continue
        watts = _number(member.get("PowerConsumedWatts"))
        if watts is None:
            continue
        context = member.get("PhysicalContext")
        candidates.append((index, watts, context if isinstance(context, str) else None))
    if not candidates:
        return None
    whole = [c for c in candidates if c[2] is None or c[2] in WHOLE_CONTEXTS]
    chosen = whole[0] if whole else candidates[0] if len(candidates) == 1 else None
    return (chosen[0], chosen[1]) if chosen else None


@dataclass(frozen=True)
class Metering:
    """How one chassis is metered: which resource to GET and how to read it."""

    mechanism: str  # EnvironmentMetrics | Power | PowerSubsystem
    path: str  # the resource read each time (PowerSubsystem: the PowerSupplies collection)
    power: bool  # a watts reading is available
    energy: bool  # an EnergykWh counter is available
    control_index: int | None = None  # Power: which PowerControl member
    supply_metrics: tuple[str, ...] = ()  # PowerSubsystem: each supply's Metrics path


@dataclass(frozen=True, slots=True)
class RedfishZone:
    name: str
    chassis: str
    mechanism: str  # e.g. "EnvironmentMetrics.PowerWatts", "Power.PowerControl[0]"
    kind: ReadingKind
    parent: str | None
    read_value: Callable[[], tuple[float, float]]
    domain: str = "platform"
    max_joules: float | None = None  # EnergykWh is not documented to wrap

    def read(self) -> Reading:
        value, timestamp = self.read_value()
        return Reading(value, timestamp)


class Redfish:
    """Chassis power and energy of one Redfish service."""

    name = NAME

    def __init__(self, client: RedfishClient, clock: Clock, prefer: str) -> None:
        self.client = client
        self.clock = clock
        self.prefer = prefer
        self.notes: list[str] = []
        self._zones: list[RedfishZone] = []
        self._pass: dict[str, dict[str, Any] | SourceFailed] | None = None  # fetched in this read
        # A source dropped without close() (re-discovery, a failed open) still closes its socket.
        self._finalizer = weakref.finalize(self, client.close_connection)

    def where(self) -> str:
        return f"{NAME} ({self.client.origin})"

    def begin_pass(self) -> None:
        """Start one read of every zone: each resource is fetched at most once until end_pass."""
        self._pass = {}

    def end_pass(self) -> None:
        self._pass = None

    def _get_once(self, path: str) -> dict[str, Any]:
        """GET within a pass: once per resource, its failure too (a BMC that does not answer
        costs one timeout per read, not one per zone)."""
        cache = self._pass
        if cache is None:
            return self.get(path)
        if path not in cache:
            try:
                cache[path] = self.get(path)
            except SourceFailed as err:
                cache[path] = err
        found = cache[path]
        if isinstance(found, SourceFailed):
            raise found
        return found

    # -- requests with errors that name the service, the cause and the fix --
    def get(self, path: str) -> dict[str, Any]:
        try:
            return self.client.get(path)
        except HttpError as err:
            if err.status == 401:
                who = f"user {self.client.username!r}" if self.client.username is not None else "no credentials"
                raise SourceFailed(
                    f"{self.where()}: GET {path}: HTTP 401 Unauthorized ({who}) — check username and password "
                    "(option password_file / password_env); a ReadOnly account suffices"
                ) from err
            if err.status == 403:
                raise SourceFailed(
                    f"{self.where()}: GET {path}: HTTP 403 Forbidden — give the account the ReadOnly role (Login privilege)"
                ) from err
            raise SourceFailed(f"{self.where()}: GET {path}: {err}") from err
        except ssl.SSLCertVerificationError as err:
            raise SourceFailed(
                f"{self.where()}: TLS certificate not trusted ({err.verify_message}) — set ca_file to the CA "
                "certificate that signed the BMC's certificate (or tls_verify: false on a trusted management network)"
            ) from err
        except (OSError, http.client.HTTPException) as err:
            cause = err.strerror if isinstance(err, OSError) and err.strerror else str(err) or type(err).__name__
            if isinstance(err, TimeoutError | socket.timeout):
                cause = f"no answer within {self.client.timeout_s:g} s"
            raise SourceFailed(
                f"{self.where()}: GET {path}: {cause} — check the url, that the BMC is up and reachable "
                "(HTTPS, usually port 443) from this host"
            ) from err
        except ValueError as err:
            raise SourceFailed(f"{self.where()}: {err} — is this a Redfish service?") from err

    # -- discovery --
    def discover(self, only: Sequence[str] | None) -> None:
        try:
            root = self.client.get("/redfish/v1/")
        except HttpError as err:
            if err.status == 404:
                raise SourceAbsent(f"{self.where()}: no Redfish service root at /redfish/v1/ (HTTP 404)") from err
            root = {}
        except (OSError, http.client.HTTPException, ValueError):
            root = {}  # let the next GET produce the classified error
        collection_path = _link(root, "Chassis") or "/redfish/v1/Chassis"
        collection = self.get(collection_path)
        members = [m["@odata.id"] for m in collection.get("Members", []) if isinstance(m, dict) and "@odata.id" in m]
        chassis_docs: dict[str, dict[str, Any]] = {}
        present: list[str] = []
        for path in members:
            document = self.get(path)
            chassis_id = str(document.get("Id") or path.rstrip("/").rsplit("/", 1)[-1])
            present.append(chassis_id)
            if only and chassis_id not in only:
                continue
            chassis_docs[path.rstrip("/")] = document
        if only:
            missing = sorted(set(only) - set(present))
            if missing:
                raise SourceFailed(
                    f"{self.where()}: chassis {', '.join(missing)} (option chassis) not found; chassis present: "
                    f"{', '.join(present) or 'none'}"
                )
        meterings: dict[str, tuple[str, Metering]] = {}
        skipped: list[str] = []
        for path, document in chassis_docs.items():
            chassis_id = str(document.get("Id") or path.rsplit("/", 1)[-1])
            metering = self._metering(document)
            if metering is None:
                links = [k for k in ("EnvironmentMetrics", "Power", "PowerSubsystem") if _link(document, k)]
                why = (
                    f"links {', '.join(links)} carry no reading"
                    if links
                    else "no Power, PowerSubsystem or EnvironmentMetrics link"
                )
                skipped.append(f"chassis {chassis_id} ({why})")
                continue
            meterings[path] = (chassis_id, metering)
        if not meterings:
            listed = "; ".join(skipped) if skipped else "no chassis"
            raise SourceAbsent(
                f"{self.where()}: no chassis offers a power reading — {listed}; read power through ipmi_dcmi or ipmi_sdr"
            )
        self.notes += [f"{self.where()}: {s} skipped" for s in skipped]
        zone_of = {path: f"chassis-{cid}" for path, (cid, _) in meterings.items()}
        zones: list[RedfishZone] = []
        for path, (chassis_id, metering) in meterings.items():
            container = _link(chassis_docs[path].get("Links", {}), "ContainedBy")
            parent = zone_of.get(container.rstrip("/")) if container else None
            zones += self._zones_for(chassis_id, metering, parent)
        self._zones = zones

    def _metering(self, chassis: Mapping[str, Any]) -> Metering | None:
        env_path = _link(chassis, "EnvironmentMetrics")
        if env_path:
            env = self.get(env_path)
            power, energy = _reading(env, "PowerWatts") is not None, _reading(env, "EnergykWh") is not None
            if power or energy:
                return Metering("EnvironmentMetrics", env_path, power, energy)
        power_path = _link(chassis, "Power")
        if power_path:
            control = whole_power_control(self.get(power_path).get("PowerControl") or [])
            if control is not None:
                return Metering("Power", power_path, True, False, control_index=control[0])
        subsystem_path = _link(chassis, "PowerSubsystem")
        if subsystem_path:
            supplies_path = _link(self.get(subsystem_path), "PowerSupplies")
            if supplies_path:
                metrics: list[str] = []
                for member in self.get(supplies_path).get("Members", []):
                    if not isinstance(member, dict) or "@odata.id" not in member:
                        continue
                    metrics_path = _link(self.get(member["@odata.id"]), "Metrics")
                    if metrics_path and _reading(self.get(metrics_path), "InputPowerWatts") is not None:
                        metrics.append(metrics_path)
                if metrics:
                    return Metering("PowerSubsystem", supplies_path, True, False, supply_metrics=tuple(metrics))
        return None

    def _zones_for(self, chassis_id: str, metering: Metering, parent: str | None) -> list[RedfishZone]:
        base = f"chassis-{chassis_id}"
        if metering.mechanism == "EnvironmentMetrics":
            kinds: list[ReadingKind] = []
            if metering.power:
                kinds.append("power")
            if metering.energy:
                kinds.append("counter")
            if len(kinds) == 2 and self.prefer == "energy":
                kinds.reverse()
            zones = []
            for i, kind in enumerate(kinds):
                key = "PowerWatts" if kind == "power" else "EnergykWh"
                name = base if i == 0 else f"{base}-{'energy' if kind == 'counter' else 'power'}"
                zones.append(
                    RedfishZone(
                        name,
                        chassis_id,
                        f"EnvironmentMetrics.{key}",
                        kind,
                        parent if i == 0 else base,
                        self._env_reader(metering.path, key, chassis_id),
                    )
                )
            return zones
        if metering.mechanism == "Power":
            index = metering.control_index or 0
            return [
                RedfishZone(
                    base,
                    chassis_id,
                    f"Power.PowerControl[{index}].PowerConsumedWatts",
                    "power",
                    parent,
                    self._power_control_reader(metering.path, index, chassis_id),
                )
            ]
        return [
            RedfishZone(
                base,
                chassis_id,
                f"PowerSubsystem: sum of {len(metering.supply_metrics)} supplies' InputPowerWatts",
                "power",
                parent,
                self._supplies_reader(metering.supply_metrics, chassis_id),
            )
        ]

    # -- readers --
    def _timed(self, fetch: Callable[[], float]) -> tuple[float, float]:
        started = self.clock()
        value = fetch()
        return value, (started + self.clock()) / 2

    def _env_reader(self, path: str, key: str, chassis_id: str) -> Callable[[], tuple[float, float]]:
        def fetch() -> float:
            value = _reading(self._get_once(path), key)
            if value is None:
                raise SourceFailed(f"{self.where()}: chassis {chassis_id}: {path} has no {key}.Reading now")
            return value * JOULES_PER_KWH if key == "EnergykWh" else value

        return lambda: self._timed(fetch)

    def _power_control_reader(self, path: str, index: int, chassis_id: str) -> Callable[[], tuple[float, float]]:
        def fetch() -> float:
            members = self.get(path).get("PowerControl") or []
            value = (
                _number(members[index].get("PowerConsumedWatts"))
                if index < len(members) and isinstance(members[index], dict)
                else None
            )
            if value is None:
                raise SourceFailed(
                    f"{self.where()}: chassis {chassis_id}: {path} PowerControl[{index}] has no PowerConsumedWatts now"
                )
            return value

        return lambda: self._timed(fetch)

    def _supplies_reader(self, paths: Sequence[str], chassis_id: str) -> Callable[[], tuple[float, float]]:
        def fetch() -> float:
            total = 0.0
            for path in paths:
                value = _reading(self.get(path), "InputPowerWatts")
                if value is None:
                    raise SourceFailed(
                        f"{self.where()}: chassis {chassis_id}: {path} has no InputPowerWatts.Reading now"
                    )
                total += value
            return total

        return lambda: self._timed(fetch)

    def zones(self) -> Sequence[RedfishZone]:
        return list(self._zones)

    def close(self) -> None:
        self._finalizer()


def _password(options: Mapping[str, object], problems: list[str]) -> str | None:
    path, env = options.get("password_file"), options.get("password_env")
    if path is not None and env is not None:
        problems.append("password_file, password_env: set one, not both")
        return None
    if isinstance(path, str) and path:
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.readline().rstrip("\r\n")
        except OSError as err:
            problems.append(
                f"password_file: cannot read {path}: {err.strerror or err} — create it (mode 0600) or fix the path"
            )
            return None
    if isinstance(env, str) and env:
        value = os.environ.get(env)
        if value is None:
            problems.append(f"password_env: environment variable {env} is not set — set it in the agent's environment")
        return value
    if path is not None or env is not None:
        problems.append("password_file / password_env: must be a non-empty string")
    return None


def check_options(options: Mapping[str, object]) -> list[str]:
    """The problems of ``url`` and ``allow_plain_http`` that need no BMC to see, as ``key: message``:
    a URL that is not http(s), one that carries credentials (they would be logged and exported in
    ``joulesched_source_error_info``), a password sent over ``http://`` to a host that is not
    loopback without ``allow_plain_http: true``. :func:`open_source` starts with them; the agent's
    config loader reports them under ``sources.options.redfish`` and refuses to start."""
    problems: list[str] = []
    allowed = options.get(ALLOW_PLAIN_HTTP, False)
    if not isinstance(allowed, bool):
        problems.append(f"{ALLOW_PLAIN_HTTP}: must be true or false, got {allowed!r}")
        allowed = False
    url = options.get("url")
    if url is None:
        return problems
    if not isinstance(url, str):
        return [*problems, f"url: must be a string, got {type(url).__name__}"]
    problem = url_problem(url, SECRET_KEYS)
    if problem is None:
        given = [key for key in ("password_file", "password_env") if options.get(key) is not None]
        if given:
            problem = plain_http_problem(url, f"the BMC password ({given[0]})", allowed)
    if problem:
        problems.append(f"url: {problem}")
    return problems


def open_source(options: dict[str, object], roots: Roots, clock: Clock | None = None) -> Redfish:
    """Open the Redfish source: discover the chassis and how each is metered.

    Options: ``url`` (required: ``https://bmc.example``), ``username`` (str; with
    ``password_file`` or ``password_env`` for HTTP basic auth), ``ca_file`` (PEM path, default the
    system store), ``tls_verify`` (bool, default True), ``timeout_s`` (10), ``chassis`` (list of
    chassis Ids to use, default all that are metered), ``prefer`` (energy|power, default energy),
    ``clock`` (callable, default time.time), ``allow_plain_http`` (bool, default False: a password
    is sent over ``http://`` only to loopback; :func:`check_options`).
    """
    if clock is not None:  # the sampler's clock (the registry passes it), over options["clock"]
        options = {**options, "clock": clock}
    problems = check_options(options)
    url_checked = not any(p.startswith("url:") for p in problems)
    unknown = sorted(set(options) - OPTIONS)
    if "password" in unknown:
        problems.append("password: not accepted in the config — set password_file or password_env")
        unknown.remove("password")
    if unknown:
        problems.append(f"unknown options {', '.join(unknown)} (known: {', '.join(sorted(OPTIONS))})")
    url = options.get("url")
    if url is None:
        raise SourceAbsent(
            f"{NAME}: no url configured — set url to the BMC's address (https://bmc.example) to use Redfish"
        )
    clock_option = options.get("clock", time.time)
    if not callable(clock_option):
        problems.append(f"clock: must be callable, got {clock_option!r}")
    username = options.get("username")
    if username is not None and not isinstance(username, str):
        problems.append(f"username: must be a string, got {username!r}")
    password = _password(options, problems)
    if password is not None and username is None:
        problems.append("username: a password is configured but no username")
    ca_file = options.get("ca_file")
    if ca_file is not None and not (isinstance(ca_file, str) and os.path.isfile(ca_file)):
        problems.append(f"ca_file: must be the path of a PEM file, got {ca_file!r}")
    tls_verify = options.get("tls_verify", True)
    if not isinstance(tls_verify, bool):
        problems.append(f"tls_verify: must be true or false, got {tls_verify!r}")
    timeout_s = options.get("timeout_s", 10.0)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0.1 <= timeout_s <= 300:
        problems.append(f"timeout_s: must be a number of seconds in [0.1, 300], got {timeout_s!r}")
        timeout_s = 10.0
    chassis = options.get("chassis")
    if chassis is not None and (
        not isinstance(chassis, list | tuple) or not chassis or not all(isinstance(c, str) and c for c in chassis)
    ):
        problems.append(f"chassis: must be a non-empty list of chassis Ids, got {chassis!r}")
    prefer = options.get("prefer", "energy")
    if prefer not in ("power", "energy"):
        problems.append(f"prefer: must be power or energy, got {prefer!r}")
    client: RedfishClient | None = None
    if isinstance(url, str) and url_checked:
        try:
            client = RedfishClient(
                url.rstrip("/"),
                username if isinstance(username, str) else None,
                password,
                ca_file if isinstance(ca_file, str) else None,
                tls_verify is not False,
                float(timeout_s),
            )
        except ValueError as err:
            problems.append(str(err))
    if problems or client is None:
        raise SourceFailed(f"{NAME}: invalid options — " + "; ".join(problems))
    source = Redfish(client, clock_option if callable(clock_option) else time.time, str(prefer))
    if not client.tls_verify and client.scheme == "https":
        source.notes.append(f"{NAME} ({client.origin}): TLS certificate not verified (tls_verify: false)")
    if client.scheme == "http" and password is not None and not is_loopback_host(client.host):
        source.notes.append(f"{NAME} ({client.origin}): the password is sent in cleartext (allow_plain_http: true)")
    try:
        source.discover(list(chassis) if isinstance(chassis, list | tuple) else None)
        for zone in source.zones():
            zone.read()
    except BaseException:
        source.close()
        raise
    return source


__all__ = [
    "JOULES_PER_KWH",
    "NAME",
    "Redfish",
    "RedfishClient",
    "RedfishZone",
    "check_options",
    "open_source",
    "whole_power_control",
]
