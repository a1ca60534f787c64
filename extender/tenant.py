"""The ``tenant`` profile source: profiles of physical servers read from the NADIKI side.

On a tenant's cluster of VMs no joulesched agent can read the hardware; the provider's agent
reads the physical server and pushes its energy per window to the NADIKI time-series store
(``measurement.nadiki``). This source reads it back, with no copy into the tenant's Prometheus:

* the servers: every ``server_id`` tag value of the measurement in the store (InfluxDB 1.x
  ``SHOW TAG VALUES``: the tenant's read access decides which servers it sees);
* each server's description from the registrar (``GET /servers/{id}``): its cores and rated
  power, and the series (measurement, field, granularity) it pushes; read again once it is
  ``DESCRIPTION_SECONDS`` old (the provider's agent PUTs a changed description: a GPU added, the
  rated power corrected), and sooner, ``RETRY_DESCRIPTION_SECONDS`` after it was last asked
  for, when it gives no profile;
* its windows over ``history_seconds`` (InfluxDB ``/query``).

Each server becomes one profile named and keyed by its id (``server_id``), exactly like a
provider-mode profile, so a VM node that carries the label ``joulesched.io/server-id`` is scored
by its server (extender/service.py). The profile (policy/tenant.py, ``server_power_model``):
``cores`` = registered physical cores × ``threads_per_core``; a linear curve from the lowest
window's mean power to the rated power; ``measured_watts`` = the newest window's mean power,
``updated`` = that window's end, ``utilisation`` = where it lies on the line. A server the
registrar does not describe, without cores, or without windows in the history is left out (it
scores neutral) and named once in the log.

Like the ``prometheus`` source, ``snapshot()`` never raises and never waits after the first
load: past ``cache_seconds`` it serves the last snapshot while a background thread refreshes.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
from dataclasses import dataclass, replace
from pathlib import Path

from joulesched.contracts.errors import NadikiReadError
from joulesched.contracts.nadiki import DataPoint
from joulesched.contracts.nadiki_read import (
    ENERGY_FIELD,
    InfluxReader,
    NadikiServer,
    RegistrarReader,
    influxql_identifier,
)
from joulesched.contracts.net import ALLOW_PLAIN_HTTP, plain_http_problem, url_problem
from joulesched.extender.logsafe import escape
from joulesched.extender.profiles import Clock, Snapshot, empty_snapshot
from joulesched.policy import tenant
from joulesched.policy.errors import ConfigError
from joulesched.policy.profile import NodeArrays, NodeProfile, ProfileSet, linear_curve
from joulesched.policy.validate import Checker, setting

log = logging.getLogger(__name__)

# How long a server's registrar description is used before it is read again. The provider's
# agent PUTs /servers/{id} when the description changes (docs/provider.md), rarely: a description
# is read again every 10 minutes, one GET a server (not a setting: profiles.tenant.* is the
# documented config, docs/configuration.md). A read that fails keeps the description in use and
# is tried again RETRY_DESCRIPTION_SECONDS later.
DESCRIPTION_SECONDS = 600.0
# A description that gives no profile (no energy series, no cores, no windows: the series it
# names may have changed) is read again within the same refresh, if it was last asked for at
# least this long ago: a server that stays without a profile costs one GET a minute, not one a
# refresh.
RETRY_DESCRIPTION_SECONDS = 60.0


@dataclass(frozen=True)
class TenantConfig:
    """``profiles.tenant.*`` (docs/provider.md, "Tenant mode")."""

    registrar_url: str = setting("", "NADIKI registrar API base; required for `tenant`", shown="—")
    registrar_token_file: str = setting("", "bearer token for the registrar (if it wants one; relative to the config file)", shown="—")
    influx_url: str = setting(
        "", "the provider's InfluxDB, read through the 1.x `/query` API; required for `tenant`", shown="—"
    )
    database: str = setting(
        "", "InfluxDB database (1.x) or bucket (v1 compatibility API); required for `tenant`", shown="—"
    )
    username: str = setting("", "InfluxDB user (HTTP Basic)", shown="—")
    password_file: str = setting("", "file holding the InfluxDB password or token (relative to the config file)", shown="—")
    allow_plain_http: bool = setting(
        False,
        "send the registrar token and the InfluxDB password over plain `http://` to a host that is not loopback"
        " (refused otherwise: docs/provider.md, \"Credentials on the wire\")",
    )
    measurement: str = setting("server", "the measurement holding the servers' energy")
    threads_per_core: int = setting(2, "logical CPUs per registered physical core", minimum=1, maximum=8)
    history_seconds: float = setting(
        21600.0, "windows read for the power model (idle = lowest window)", exclusive_minimum=0
    )
    cache_seconds: float = setting(30.0, "TTL of the profiles; refreshes run in the background", minimum=0)
    timeout_seconds: float = setting(5.0, "per request; only the very first load waits", exclusive_minimum=0)


def check_tenant_config(config: TenantConfig, path: str, check: Checker) -> None:
    secrets = {"registrar_url": ("registrar_token_file", "the registrar token"), "influx_url": ("password_file", "the InfluxDB password")}
    for key in ("registrar_url", "influx_url", "database"):
        value = getattr(config, key)
        if not value:
            check.problem(f"{path}.{key}", "is required when profiles.source is tenant")
        elif key in secrets:
            secret_key, what = secrets[key]
            problem = url_problem(value, f"{path}.{secret_key}")
            if problem is None and getattr(config, secret_key):
                problem = plain_http_problem(value, f"{what} ({secret_key})", config.allow_plain_http, f"{path}.{ALLOW_PLAIN_HTTP}")
            if problem:
                check.problem(f"{path}.{key}", problem)
    for key in ("registrar_token_file", "password_file"):  # read now, before any worker starts
        value = getattr(config, key)
        problem = _secret_problem(value) if value else None
        if problem:
            check.problem(f"{path}.{key}", f"{value}: {problem}")


def _secret_problem(path: str) -> str | None:
    """Why the secret file at ``path`` gives no secret, or None when it gives one."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        return f"cannot read: {err.strerror or err}"
    except UnicodeDecodeError:
        return "not UTF-8 text"
    return None if text else "the file is empty"


def _read_secret(path: str, what: str) -> str:
    if not path:
        return ""
    problem = _secret_problem(path)
    if problem:
        raise ConfigError(path, [f"{what}: {problem}"])
    return Path(path).read_text(encoding="utf-8").strip()


def server_profile(
    server: NadikiServer, point: DataPoint, starts: list[float], joules: list[float], threads: int
) -> NodeProfile:
    """One server's profile from its description and windows (module docstring)."""
    g = point.granularity_seconds
    watts = [j / g for j in joules]
    rated = server.description.rated_power * 1000.0 if server.description.rated_power else None
    idle, full = tenant.server_power_model(watts, rated)
    cores = float(server.physical_cores * threads)
    if cores <= 0:
        raise tenant.ShareError("the registrar's description lists no physical cores (installed_cpus)")
    return NodeProfile(
        name=server.server_id,
        cores=cores,
        power_curve_watts=linear_curve(idle, (full - idle) / cores, cores),
        measured_watts=watts[-1],
        updated=starts[-1] + g,
        utilisation=tenant.utilisation_on_line(idle, full, watts[-1]),
        sources=("nadiki",),
        server_id=server.server_id,
    )


@dataclass
class _Described:
    """A server's description as last read, when it was last asked for (read or not), and
    when it is read again whatever it gives (``clock`` time)."""

    server: NadikiServer
    asked: float
    due: float


class TenantSource:
    """Profiles of physical servers from the NADIKI registrar and time-series store."""

    name = "tenant"

    def __init__(self, config: TenantConfig, clock: Clock = time.time) -> None:
        self.config = config
        self.clock = clock
        self.errors = 0
        self.registrar = RegistrarReader(
            config.registrar_url,
            _read_secret(config.registrar_token_file, "profiles.tenant.registrar_token_file") or None,
            timeout_s=config.timeout_seconds,
        )
        self._password = _read_secret(config.password_file, "profiles.tenant.password_file")
        self._servers: dict[str, _Described] = {}  # read again after DESCRIPTION_SECONDS (module docstring)
        self._lock = threading.Lock()
        self._last = empty_snapshot()
        self._expires = -1.0
        self._refreshing = threading.Event()
        self._warned: set[str] = set()

        self.reader = InfluxReader(
            config.influx_url,
            config.database,
            config.username,
            self._password,
            timeout_s=config.timeout_seconds,
        )

    def snapshot(self) -> Snapshot:
        if self.clock() < self._expires:
            return self._last
        if self._last.version == 0:
            with self._lock:
                if self._last.version == 0:
                    self._refresh()
            return self._last
        last = self._last  # what this call serves, whatever the refresh it starts does meanwhile
        if not self._refreshing.is_set():
            self._refreshing.set()
            threading.Thread(target=self._background, name="tenant-refresh", daemon=True).start()
        return last

    def _background(self) -> None:
        try:
            with self._lock:
                self._refresh()
        finally:
            self._refreshing.clear()

    def _server_ids(self, reader: InfluxReader) -> list[str]:
        series = reader.query(
            f'SHOW TAG VALUES FROM {influxql_identifier(self.config.measurement)} WITH KEY = "server_id"'
        )
        ids = {str(row[1]) for s in series for row in s.get("values") or [] if len(row) > 1}
        return sorted(ids)

    def _refresh(self) -> None:
        now = self.clock()
        self._expires = now + self.config.cache_seconds
        try:
            profiles, skipped = self.read(now)
        except (NadikiReadError, OSError) as err:
            old = self._last
            self._last = replace(old, version=old.version + 1, error=str(err))
            self.errors += 1  # after the snapshot that says why: a reader of the count finds it
            log.warning("tenant source: keeping the last good profiles: %s", err)
            return
        for line in skipped:
            if line not in self._warned:
                self._warned.add(line)
                log.info("neutral score: %s", escape(line))
        nodes = tuple(profiles)
        self._last = Snapshot(ProfileSet(nodes), NodeArrays.build(nodes), now, self._last.version + 1)

    def read(self, now: float) -> tuple[list[NodeProfile], list[str]]:
        """Every server's profile, and one line per server left out saying why.

        A description is read from the registrar when none is held, once it is due
        (``DESCRIPTION_SECONDS``), or when the one held gives no profile and was asked for at
        least ``RETRY_DESCRIPTION_SECONDS`` ago; the profile is then made again from the new
        one. A read of a held description that fails keeps it, and tries again
        ``RETRY_DESCRIPTION_SECONDS`` later; when the registrar did not answer at all (down,
        unreachable, timed out), the other held descriptions are not read in that refresh
        either: a registrar that is down costs a refresh one timeout, not one a server.
        """
        reader = self.reader
        profiles: list[NodeProfile] = []
        skipped: list[str] = []
        unreachable = False  # the registrar did not answer a read of a held description
        listed = self._server_ids(reader)
        for gone in self._servers.keys() - set(listed):  # no longer in the store: forgotten
            del self._servers[gone]
        for server_id in listed:
            held = self._servers.get(server_id)
            if held is None:
                try:
                    server = self.registrar.server(server_id)
                except NadikiReadError as err:
                    skipped.append(f"server {server_id}: {err}")
                    continue
                held = self._servers[server_id] = _Described(server, now, now + DESCRIPTION_SECONDS)
                fresh = True
            else:
                fresh = False
                if now >= held.due and not unreachable:
                    fresh, unreachable = self._describe_again(held, server_id, now)
                elif now >= held.due:
                    held.due = now + RETRY_DESCRIPTION_SECONDS  # the registrar is unreachable: next time
            profile, why = self._profile(reader, held.server, now)
            if profile is None and not fresh and not unreachable and now - held.asked >= RETRY_DESCRIPTION_SECONDS:
                before = held.server
                read_again, unreachable = self._describe_again(held, server_id, now)
                if read_again and held.server != before:
                    profile, why = self._profile(reader, held.server, now)
            if profile is None:
                skipped.append(f"server {server_id}: {why}")
            else:
                profiles.append(profile)
        return profiles, skipped

    def _describe_again(self, held: _Described, server_id: str, now: float) -> tuple[bool, bool]:
        """Read a held description again: (whether it was read, it may be the same; whether the
        registrar did not answer)."""
        held.asked = now
        try:
            server = self.registrar.server(server_id)
        except NadikiReadError as err:
            held.due = now + RETRY_DESCRIPTION_SECONDS
            log.warning(
                "tenant source: server %s: keeping the description read before: cannot read it again: %s",
                escape(server_id),
                escape(str(err)),
            )
            cause = err.__cause__
            return False, isinstance(cause, OSError) and not isinstance(cause, urllib.error.HTTPError)
        if server != held.server:
            log.info("tenant source: server %s: the registrar's description has changed", escape(server_id))
        held.server, held.due = server, now + DESCRIPTION_SECONDS
        return True, False

    def _profile(self, reader: InfluxReader, server: NadikiServer, now: float) -> tuple[NodeProfile | None, str]:
        """The server's profile from its description and windows, or None and why not."""
        point = server.point(ENERGY_FIELD)
        if point is None:
            return None, f"the registrar lists no {ENERGY_FIELD} series for it"
        try:
            windows = reader.windows(point, server.server_id, now - self.config.history_seconds, now)
        except NadikiReadError as err:  # this server's series only: the others are read on
            return None, str(err)
        if not windows.starts:
            return None, f"no energy window in the last {self.config.history_seconds:g} s"
        try:
            return server_profile(server, point, list(windows.starts), list(windows.joules), self.config.threads_per_core), ""
        except tenant.ShareError as err:
            return None, str(err)


__all__ = ["TenantConfig", "TenantSource", "check_tenant_config", "server_profile"]
