"""Where the extender's node profiles come from: a ``file`` or the agents' metrics in ``prometheus``.

A source hands out :class:`Snapshot` objects: an immutable profile set with its numpy view,
the time it was read and whether the last refresh failed. ``snapshot()`` never raises on the
scheduling path — a stale or failing source keeps serving the last good snapshot (whose nodes
age into the neutral score) and counts the failure; the only errors that surface are those of
the first load of a ``file`` source, at start, where an operator sees them.
"""

from __future__ import annotations

import http.client
import logging
import math
import os
import re
import socket
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

import numpy as np
import orjson
from cachetools import TTLCache

from joulesched.contracts import names as m
from joulesched.contracts.documents import parse_yaml
from joulesched.extender.logsafe import escape
from joulesched.policy.errors import ConfigError
from joulesched.policy.profile import GpuProfile, NodeArrays, NodeProfile, ProfileSet, Site, linear_curve

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class Snapshot:
    profiles: ProfileSet
    arrays: NodeArrays
    loaded_at: float  # when this content was read (0: never)
    version: int  # increases with each new content
    error: str = ""  # the last refresh's failure, if it failed
    # observed mean CPU cores per pod of an owner: (namespace, kind, name) -> cores
    owner_cores: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    # nodes left out because a sample of theirs was not a number or out of range (neutral)
    invalid: frozenset[str] = frozenset()

    @property
    def ready(self) -> bool:
        return self.loaded_at > 0

    def stale_count(self, now: float, max_age: float) -> int:
        """Profiles measured longer than ``max_age`` ago (a static profile, with no time, never is)."""
        with np.errstate(invalid="ignore"):
            return int(np.count_nonzero(now - self.arrays.updated > max_age))

    @property
    def server_rows(self) -> Mapping[str, int]:
        """Profile row of each physical server id (provider mode: profiles of hosts)."""
        return {p.server_id: i for i, p in enumerate(self.profiles.nodes) if p.server_id}


EMPTY = ProfileSet(())


def empty_snapshot(error: str = "") -> Snapshot:
    return Snapshot(EMPTY, NodeArrays.build(()), 0.0, 0, error)


class ProfileSource(Protocol):
    """Where node profiles come from (a file, Prometheus).

    ``errors`` counts the reads that failed since start (the extender exports its increase as
    ``joulesched_extender_profile_source_errors_total``); a failed read keeps the last good snapshot.
    """

    name: str
    errors: int

    def snapshot(self) -> Snapshot: ...


def read_profile_file(path: str) -> ProfileSet:
    """Parse a YAML or JSON profile document (``ConfigError`` names the file and each field)."""
    from joulesched.policy.profile import parse_profiles

    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as err:
        raise ConfigError(str(file), [f"cannot read: {err.strerror or err}"]) from err
    if file.suffix == ".json":
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            raise ConfigError(str(file), [f"not valid JSON: {err}"]) from err
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(str(file), [f"not UTF-8 text: byte {raw[err.start]:#04x} at offset {err.start}"]) from err
        doc = parse_yaml(text, str(file))  # a key given twice is a problem, as in every YAML file read
    profiles = parse_profiles(doc, str(file))
    if not profiles.nodes:  # an empty file (one truncated as it is rewritten) is not a cluster of no nodes
        raise ConfigError(str(file), ["nodes: none given (a profile file names at least one node)"])
    return profiles


class FileSource:
    """Profiles from a YAML/JSON file, re-read when its modification time changes."""

    name = "file"

    def __init__(self, path: str, reload_seconds: float = 10.0, clock: Clock = time.time) -> None:
        self.path = path
        self.reload_seconds = reload_seconds
        self.clock = clock
        self.errors = 0
        self._lock = threading.Lock()
        self._mtime = os.stat(path).st_mtime_ns if os.path.exists(path) else -1
        profiles = read_profile_file(path)  # the first load fails loudly: an operator is watching
        self._snapshot = Snapshot(profiles, NodeArrays.build(profiles.nodes), clock(), 1)
        self._checked = clock()

    def snapshot(self) -> Snapshot:
        now = self.clock()
        if now - self._checked < self.reload_seconds:
            return self._snapshot
        with self._lock:
            if now - self._checked < self.reload_seconds:
                return self._snapshot
            self._checked = now
            try:
                mtime = os.stat(self.path).st_mtime_ns
                if mtime != self._mtime:
                    profiles = read_profile_file(self.path)
                    self._mtime = mtime
                    self._snapshot = Snapshot(profiles, NodeArrays.build(profiles.nodes), now, self._snapshot.version + 1)
                    log.info("reloaded %d node profiles from %s", len(profiles.nodes), self.path)
                elif self._snapshot.error:
                    self._snapshot = Snapshot(self._snapshot.profiles, self._snapshot.arrays, self._snapshot.loaded_at, self._snapshot.version)
            except (OSError, ConfigError) as err:
                self.errors += 1
                log.error("keeping the last good profiles: %s", err)
                old = self._snapshot
                self._snapshot = Snapshot(old.profiles, old.arrays, old.loaded_at, old.version, str(err))
        return self._snapshot


# The metrics the prometheus source reads (names from measurement.names, defined once).
_NODE_GAUGES = (
    m.NODE_CPU_CORES,
    m.NODE_CPU_UTILISATION,
    m.MODEL_IDLE,
    m.MODEL_PER_CORE,
    m.NODE_PLATFORM_POWER,
    m.NODE_SPEED,
    m.NODE_POWER_CAP,
    m.NODE_GPU_COUNT,
    m.NODE_GPU_IDLE,
    m.NODE_GPU_MAX,
    m.NODE_GPU_UTILISATION,
    m.NODE_INFO,
)
_SITE_GAUGES = (m.SITE_PUE, m.SITE_CARBON, m.SITE_WUE, m.SITE_RENEWABLE)


# Label matchers, comma-separated, as a PromQL selector holds them: `job="joulesched-agent"`,
# `namespace=~"joulesched.*",job!="x"` (RE2 patterns and escaped quotes inside the strings).
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
SELECTOR = re.compile(rf"(?:{_MATCHER}(?:,{_MATCHER})*,?)?\s*")


def profile_queries(selector: str = "") -> tuple[str, str]:
    """The two instant queries: every profile gauge, and when each node was last measured.

    ``selector`` (label matchers, ``SELECTOR``) narrows both to the agents' own series: without
    it, any scraped target that publishes series of these names is read as an agent's.
    """
    pattern = "|".join(g.name for g in (*_NODE_GAUGES, *_SITE_GAUGES, m.OWNER_CPU_CORES))
    extra = f",{selector.strip().rstrip(',')}" if selector.strip() else ""
    values = f'{{__name__=~"{pattern}"{extra}}}'
    # every sample of the agent exports the core count (the utilisation is left out while not
    # measured, the platform power while a source of its basis is not read): its time is when
    # the agent was last scraped
    measured = f"max by ({m.L_NODE}) (timestamp({m.NODE_CPU_CORES.name}{{{extra.lstrip(',')}}}))"
    return values, measured


# The physical range of each gauge the profiles are built from (inclusive). A sample outside
# it — NaN, an infinity, a negative power, a utilisation over 1, a PUE under 1 — is not used:
# its node (or every node of its site) is left out and scores neutral, never a guess.
_MAX_WATTS = 1e6
_RANGES: dict[str, tuple[float, float]] = {
    m.NODE_CPU_CORES.name: (1e-3, 1e6),
    m.NODE_CPU_UTILISATION.name: (0.0, 1.0),
    m.MODEL_IDLE.name: (0.0, _MAX_WATTS),
    m.MODEL_PER_CORE.name: (0.0, _MAX_WATTS),
    m.NODE_PLATFORM_POWER.name: (0.0, _MAX_WATTS),
    m.NODE_SPEED.name: (1e-3, 1e3),
    m.NODE_POWER_CAP.name: (1e-3, _MAX_WATTS),
    m.NODE_GPU_COUNT.name: (0.0, 1e4),
    m.NODE_GPU_IDLE.name: (0.0, _MAX_WATTS),
    m.NODE_GPU_MAX.name: (0.0, _MAX_WATTS),
    m.NODE_GPU_UTILISATION.name: (0.0, 1.0),
    m.SITE_PUE.name: (1.0, 10.0),
    m.SITE_CARBON.name: (0.0, 1e5),
    m.SITE_WUE.name: (0.0, 1e3),
    m.SITE_RENEWABLE.name: (0.0, 1.0),
    m.OWNER_CPU_CORES.name: (0.0, 1e6),
}
_SITE_NAMES = frozenset(g.name for g in _SITE_GAUGES)


def sample_value(sample: Mapping[str, Any]) -> float:
    """The value of one instant-query sample; NaN where it is missing or not a number."""
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan


def in_range(name: str, value: float) -> bool:
    low, high = _RANGES.get(name, (-math.inf, math.inf))
    return math.isfinite(value) and low <= value <= high


def owner_cores_from_samples(values: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """Observed CPU cores per pod of each owner, from the same query results (finite, in range)."""
    owners: dict[tuple[str, str, str], float] = {}
    for sample in values:
        labels = sample.get("metric", {})
        if labels.get("__name__") == m.OWNER_CPU_CORES.name:
            value = sample_value(sample)
            if not in_range(m.OWNER_CPU_CORES.name, value):
                continue
            key = (labels.get(m.L_NAMESPACE, ""), labels.get(m.L_OWNER_KIND, ""), labels.get(m.L_OWNER, ""))
            owners[key] = max(owners.get(key, 0.0), value)
    return owners


def profiles_from_samples(values: list[dict[str, Any]], measured: list[dict[str, Any]]) -> tuple[ProfileSet, list[str]]:
    """Build profiles from Prometheus instant-query results; nodes lacking a model are skipped.

    Returns the profiles and one line per skipped node saying what it lacked. A node with a
    sample that is not finite or out of its physical range (see ``_RANGES``), or at a site
    with one, is skipped too (``Snapshot.invalid`` names them, for the neutral-score metric).
    """
    profiles, skipped, _ = _profiles_from_samples(values, measured)
    return profiles, skipped


def _profiles_from_samples(
    values: list[dict[str, Any]], measured: list[dict[str, Any]]
) -> tuple[ProfileSet, list[str], frozenset[str]]:
    by_node: dict[str, dict[str, float]] = defaultdict(dict)
    info: dict[str, dict[str, str]] = {}
    sites: dict[str, dict[str, float]] = defaultdict(dict)
    bad_nodes: dict[str, str] = {}
    bad_sites: dict[str, str] = {}
    for sample in values:
        labels = sample.get("metric", {})
        name = labels.get("__name__", "")
        if name == m.OWNER_CPU_CORES.name:
            continue
        value = sample_value(sample)
        valid = name == m.NODE_INFO.name or in_range(name, value)
        if name in _SITE_NAMES:
            if m.L_SITE in labels:
                if not valid:
                    bad_sites.setdefault(labels[m.L_SITE], f"{name} = {value!r}")
                    continue
                sites[labels[m.L_SITE]][name] = value
            continue
        node = labels.get(m.L_NODE)
        if not node:
            continue
        if name == m.NODE_INFO.name:
            info[node] = {"site": labels.get(m.L_SITE, ""), "server_id": labels.get(m.L_SERVER_ID, "")}
            continue
        if not valid:
            bad_nodes.setdefault(node, f"{name} = {value!r}")
            continue
        device = labels.get(m.L_DEVICE)
        key = f"{name}:{device}" if device else name
        # one series a node and gauge; two (one agent scraped by two jobs, replicas not
        # deduplicated) are the same reading twice: the larger is kept, never their sum
        by_node[node][key] = max(by_node[node].get(key, value), value)
    updated: dict[str, float] = {}
    for s in measured:
        node = s.get("metric", {}).get(m.L_NODE, "")
        at = sample_value(s)
        if math.isfinite(at) and at >= 0:
            updated[node] = at
        else:
            bad_nodes.setdefault(node, f"measurement time = {at!r}")

    site_objs = {
        name: Site(
            name,
            pue=v.get(m.SITE_PUE.name, 1.0),
            # absent: the agent leaves it out while its source cannot answer (docs/carbon.md);
            # unknown, not 0 g/kWh: under strategy carbon its nodes score neutral
            carbon_intensity=v.get(m.SITE_CARBON.name, math.nan),
            wue=v.get(m.SITE_WUE.name, 0.0),
            renewable_share=v.get(m.SITE_RENEWABLE.name, 0.0),
        )
        for name, v in sites.items()
    }
    nodes: list[NodeProfile] = []
    skipped: list[str] = []
    for node in sorted(by_node.keys() | bad_nodes.keys()):
        v = by_node[node]
        site_name = info.get(node, {}).get("site", "")
        if node in bad_nodes or site_name in bad_sites:
            why = bad_nodes.get(node) or f"site {site_name}: {bad_sites[site_name]}"
            skipped.append(f"{node}: not a finite value in range: {why}")
            continue
        cores = v.get(m.NODE_CPU_CORES.name)
        idle = v.get(f"{m.MODEL_IDLE.name}:cpu")
        per_core = v.get(f"{m.MODEL_PER_CORE.name}:cpu")
        if cores is None or cores <= 0 or idle is None or per_core is None:
            skipped.append(f"{node}: no fitted power model or core count yet")
            continue
        utilisation = v.get(m.NODE_CPU_UTILISATION.name)
        if utilisation is None:  # the agent leaves it out while it has not measured it: unknown, not idle
            skipped.append(f"{node}: no CPU utilisation measured yet")
            continue
        site = site_objs.get(site_name, Site(site_name))
        gpus = None
        gpu_count = int(v.get(m.NODE_GPU_COUNT.name, 0))
        if gpu_count > 0:
            # The agent's mean of its per-GPU fits (the same GpuSummary its /v1/profile gives);
            # the per-device models (MODEL_IDLE, device gpu-N) are not summed here again.
            gpu_idle = v.get(m.NODE_GPU_IDLE.name, 0.0)
            gpu_max = max(v.get(m.NODE_GPU_MAX.name, gpu_idle), gpu_idle)
            gpus = GpuProfile(gpu_count, gpu_idle, gpu_max, 1.0, min(max(v.get(m.NODE_GPU_UTILISATION.name, 0.0), 0.0), 1.0))
        nodes.append(
            NodeProfile(
                name=node,
                cores=cores,
                power_curve_watts=linear_curve(max(idle, 0.0), max(per_core, 0.0), cores),
                site=site_name,
                speed=v.get(m.NODE_SPEED.name, 1.0) or 1.0,
                utilisation=min(max(utilisation, 0.0), 1.0),
                measured_watts=v.get(m.NODE_PLATFORM_POWER.name),
                power_cap_watts=v.get(m.NODE_POWER_CAP.name),
                updated=updated.get(node),
                gpus=gpus,
                pue=site.pue,
                carbon_intensity=site.carbon_intensity,
                server_id=info.get(node, {}).get("server_id", ""),
            )
        )
    invalid = frozenset(n for n in by_node.keys() | bad_nodes.keys() if n in bad_nodes or info.get(n, {}).get("site", "") in bad_sites)
    return ProfileSet(tuple(nodes), site_objs), skipped, invalid


class PrometheusSource:
    """Profiles from the agents' metrics in Prometheus, cached for ``cache_seconds``.

    A failing Prometheus never fails a scheduling request: the last good snapshot is served
    (its nodes turn stale, hence neutral, once older than the policy's max age) and the
    failure is counted.
    """

    name = "prometheus"

    def __init__(
        self, url: str, cache_seconds: float = 10.0, timeout_seconds: float = 2.0, clock: Clock = time.time, selector: str = ""
    ) -> None:
        self.url = url
        self.selector = selector  # label matchers for the agents' series (profile_queries)
        self.clock = clock
        self.errors = 0
        self._query = InstantQuery(url, timeout_seconds)
        self._timeout = timeout_seconds
        self._lock = threading.Lock()
        self._cache: TTLCache[str, Snapshot] = TTLCache(maxsize=1, ttl=max(cache_seconds, 1e-3), timer=clock)
        self._last = empty_snapshot()
        self._warned: set[str] = set()
        self._refreshing = threading.Event()

    def snapshot(self) -> Snapshot:
        """The cached profiles; past the TTL, the last ones while a background refresh runs.

        Only the very first call waits (at most the query timeout) for Prometheus: after that a
        slow or hung Prometheus never delays a scheduling request.
        """
        cached = self._cache.get("profiles")
        if cached is not None:
            return cached
        if not self._last.ready and self._last.version == 0 and not self._refreshing.is_set():
            with self._lock:
                if self._cache.get("profiles") is None and self._last.version == 0:
                    self._cache["profiles"] = self._refresh()
            return self._last
        if not self._refreshing.is_set():
            self._refreshing.set()
            threading.Thread(target=self._refresh_in_background, name="prometheus-refresh", daemon=True).start()
        return self._last

    def _refresh_in_background(self) -> None:
        try:
            with self._lock:
                self._cache["profiles"] = self._refresh()
        finally:
            self._refreshing.clear()

    def _refresh(self) -> Snapshot:
        values_q, measured_q = profile_queries(self.selector)
        try:
            values = self._query(values_q)
            measured = self._query(measured_q)
            profiles, skipped, invalid = _profiles_from_samples(values, measured)
            owners = owner_cores_from_samples(values)
        except Exception as err:  # none may reach the scheduler
            self.errors += 1
            log.warning("prometheus %s: keeping the last good profiles: %s", self.url, err)
            old = self._last
            # version moves on so that the first-load wait happens once only
            self._last = Snapshot(
                old.profiles, old.arrays, old.loaded_at, old.version + 1, f"prometheus {self.url}: {err}", old.owner_cores
            )
            return self._last
        for line in skipped:
            if line not in self._warned:
                self._warned.add(line)
                log.info("neutral score until measured: %s", escape(line))
        if len(self._warned) > 10_000:
            self._warned.clear()  # lines carry values: bounded, at the price of an occasional repeat
        self._last = Snapshot(
            profiles, NodeArrays.build(profiles.nodes), self.clock(), self._last.version + 1, "", owners, invalid
        )
        return self._last


MAX_ANSWER_BYTES = 256 * 1024 * 1024


class InstantQuery:
    """``GET {url}/api/v1/query``, connect to last byte within ``timeout`` seconds in total.

    A per-read socket timeout (what HTTP clients offer) never trips on a server that sends its
    headers and then one byte a second; here a timer shuts the socket down at the deadline,
    whatever phase the exchange is in (connect, TLS handshake, headers, body), so a refresh
    always ends and the next one can run. Answers over ``MAX_ANSWER_BYTES`` are refused.
    """

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.path = parts.path.rstrip("/") + "/api/v1/query"
        self.timeout = timeout
        self._tls = ssl.create_default_context() if self.https else None

    def __call__(self, promql: str) -> list[dict[str, Any]]:
        # Prometheus durations are integers with a unit: "2.0s" is a 400.
        query = urlencode({"query": promql, "timeout": f"{max(1, round(self.timeout * 1000))}ms"})
        started = time.monotonic()
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        timer = threading.Timer(max(0.0, self.timeout - (time.monotonic() - started)), expire)
        timer.daemon = True
        timer.start()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.sock = self._tls.wrap_socket(sock, server_hostname=self.host) if self._tls else sock
            conn.request("GET", f"{self.path}?{query}", headers={"Accept": "application/json"})
            reply = conn.getresponse()
            body = reply.read(MAX_ANSWER_BYTES + 1)
            if len(body) > MAX_ANSWER_BYTES:
                raise ValueError(f"answer over {MAX_ANSWER_BYTES} bytes")
        except (OSError, http.client.HTTPException) as err:
            if expired.is_set():
                raise TimeoutError(f"no complete answer within {self.timeout:g} s") from err
            raise
        finally:
            timer.cancel()
            conn.close()
            sock.close()
        if expired.is_set():  # the shutdown landed after the last byte: still not in time
            raise TimeoutError(f"no complete answer within {self.timeout:g} s")
        if reply.status != 200:
            raise ValueError(f"HTTP {reply.status}: {escape(body[:200].decode('utf-8', 'replace'))}")
        doc = orjson.loads(body)
        if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), dict):
            raise ValueError(f"not a successful query answer: {escape(body[:200].decode('utf-8', 'replace'))}")
        result = doc["data"].get("result")
        if not isinstance(result, list):
            raise ValueError("data.result is not a list")
        return [r for r in result if isinstance(r, dict)]
