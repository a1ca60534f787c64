"""Extender configuration: defaults in code, then the YAML file, then command-line flags.

Each field is declared once below, with its default, bounds and meaning (``setting``); the
parser and the reference table in docs/configuration.md (``python -m joulesched.configdoc``)
derive from those declarations. The document nests them by key: ``profiles.{source, file.path,
file.reload_seconds, prometheus.url, ...}``, ``policy`` (policy/config.py),
``predicted_load.*``, ``bind.enabled``, ``bind.write``, ``servers.*``, ``server.*`` (gunicorn).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from joulesched.contracts.documents import read_yaml
from joulesched.contracts.net import url_problem
from joulesched.extender.profiles import SELECTOR
from joulesched.extender.tenant import TenantConfig, check_tenant_config
from joulesched.policy.config import PolicyConfig
from joulesched.policy.validate import Checker, read_settings, setting

EXAMPLE_PROFILES = "example-nodes.yaml"  # shipped in extender/data/


def example_profiles_path() -> str:
    return str(Path(__file__).with_name("data") / EXAMPLE_PROFILES)


@dataclass(frozen=True)
class ServerConfig:
    workers: int = setting(1, "gunicorn worker processes (`--workers` overrides)", minimum=1, maximum=64)
    threads: int = setting(4, "threads per worker (gthread)", minimum=1, maximum=256)
    timeout_seconds: float = setting(30.0, "gunicorn worker timeout", exclusive_minimum=0)
    keepalive_seconds: float = setting(
        120.0, "idle keep-alive; longer than Go's 90 s client idle timeout", exclusive_minimum=0
    )
    worker: str = setting(
        "buffered",
        "`buffered`: requests are read in full before a thread serves them (idle and slow clients"
        " hold no thread); `gthread`: gunicorn's own worker",
        choices=("buffered", "gthread"),
    )
    tls_cert_file: str = setting(
        "", "serve HTTPS with this PEM certificate (and `tls.key_file`); kube-scheduler: `enableHTTPS: true`", key="tls.cert_file", shown="—"
    )
    tls_key_file: str = setting("", "the certificate's PEM private key", key="tls.key_file", shown="—")
    tls_client_ca_file: str = setting(
        "",
        "mutual TLS: the verbs answer only clients with a certificate signed by this CA (kube-scheduler:"
        " `tlsConfig.certFile`/`keyFile`); /healthz, /readyz and /metrics stay open to probes",
        key="tls.client_ca_file",
        shown="—",
    )
    request_timeout_seconds: float = setting(
        10.0, "`buffered`: a request not received in full this long after its connection opened (kept alive: after its first byte) gets 408", exclusive_minimum=0
    )


@dataclass(frozen=True)
class ExtenderConfig:
    """Every field once: its default, bounds and meaning; :func:`parse_config` and the table in
    docs/configuration.md derive from these. ``listen``, ``prefix``, ``profiles.file.path`` and
    ``profiles.prometheus.url`` get a further check of their form in :func:`parse_config`."""

    listen: str = setting("0.0.0.0:8888", "address; `--listen` overrides")
    prefix: str = setting(
        "/scheduler", "the verbs are `{prefix}/filter`, `/prioritize`, `/preempt`, `/bind`, `/explain`"
    )
    max_request_bytes: int = setting(
        16 * 1024 * 1024,
        "larger bodies get HTTP 413 before they are read; 5,000 full Nodes are ~14 MiB, 5,000"
        " NodeNames ~0.1 MiB; a worker needs up to 5 x this per request in flight, at most two,"
        " and keeps the node lists of the last two full-Node requests, up to 2 x this"
        " (docs/benchmarks.md, \"Memory\")",
        kind="number",
        minimum=1024,
    )
    source: str = setting("file", "where node profiles come from", key="profiles.source", choices=("file", "prometheus", "tenant"))
    file_path: str = setting(
        doc="YAML or JSON profile document (relative to the config file)",
        key="profiles.file.path",
        factory=example_profiles_path,
        shown="the shipped example cluster",
    )
    file_reload_seconds: float = setting(
        10.0, "how often the file's modification time is checked", key="profiles.file.reload_seconds", exclusive_minimum=0
    )
    prometheus_url: str = setting(
        "", "Prometheus base URL; required for `prometheus`", key="profiles.prometheus.url", shown="—"
    )
    prometheus_selector: str = setting(
        "",
        "label matchers every profile query adds, e.g. `job=\"joulesched-agent\"`: only the agents' series are"
        " read. Empty: any scraped target that publishes series of the agents' names is read as an agent"
        " (deploy/ sets the agents' job)",
        key="profiles.prometheus.selector",
        empty_ok=True,
    )
    prometheus_cache_seconds: float = setting(
        10.0,
        "TTL of the cached profiles; refreshes run in the background",
        key="profiles.prometheus.cache_seconds",
        minimum=0,
    )
    prometheus_timeout_seconds: float = setting(
        2.0,
        "query timeout; only the very first load waits for it",
        key="profiles.prometheus.timeout_seconds",
        exclusive_minimum=0,
    )
    tenant: TenantConfig = setting(
        doc="the NADIKI side: registrar and time-series store",
        key="profiles.tenant",
        factory=TenantConfig,
    )
    policy: PolicyConfig = setting(
        doc="strategy, band, neutral score, freshness, power cap",
        factory=PolicyConfig,
        shown="see [policy.md](policy.md)",
    )
    predicted_ttl_seconds: float = setting(
        300.0, "forget a placement after this long at the latest", key="predicted_load.ttl_seconds", minimum=0
    )
    predicted_settle_seconds: float = setting(
        30.0, "a measurement this long after a placement shows the pod", key="predicted_load.settle_seconds", minimum=0
    )
    watch_pods: bool = setting(
        False,
        "watch pod bindings through the Kubernetes API (RBAC: list/watch pods)",
        key="predicted_load.watch_pods",
    )
    bind_enabled: bool = setting(
        False,
        "serve the bind verb (RBAC: create pods/binding; set `bindVerb: bind` in the scheduler config)",
        key="bind.enabled",
    )
    bind_write: bool = setting(
        True,
        "write each binding through the API server (RBAC: create pods/binding). false: record where"
        " kube-scheduler placed the pod and answer that kube-scheduler binds it, which it then does with its"
        " own binder, under its own `clientConnection.qps`, only if the extender entry is `ignorable: true`"
        " (it logs that answer for each pod; docs/extender.md, \"The bind verb: what it costs\")",
        key="bind.write",
    )
    bind_wait_seconds: float = setting(
        0.2,
        "while kube-scheduler binds through the bind verb, a filter or prioritize first waits up to this"
        " long for the bindings of the pods answered before it (each pod is waited for once); 0: no waiting,"
        " and then nothing holds kube-scheduler to the pace the API server takes the bindings at (docs/policy.md)",
        key="bind.wait_seconds",
        minimum=0,
        maximum=0.5,
    )
    bind_threads: int = setting(
        32,
        "threads per worker for the bind verb alone, beside `server.threads`; each binding in flight holds one"
        " until the API server answers, and filter and prioritize never wait behind them (`gthread`, or"
        " `bind.write: false`: not used, binds are served by `server.threads`)",
        key="bind.threads",
        minimum=1,
        maximum=1024,
    )
    server_id_label: str = setting(
        "joulesched.io/server-id",
        "virtualised clusters: the node label naming the physical server whose profile"
        " (agent on the host, provider mode) scores the node",
        key="servers.label",
    )
    watch_nodes: bool = setting(
        False,
        "watch nodes for that label (RBAC: list/watch nodes); in Nodes mode the labels come with each request",
        key="servers.watch_nodes",
    )
    kubeconfig: str = setting(
        "", "kubeconfig for the watches and the binder (relative to the config file; must be readable when set)", shown="in-cluster"
    )
    server: ServerConfig = setting(doc="gunicorn", factory=ServerConfig)

    def with_listen(self, listen: str | None) -> ExtenderConfig:
        if listen is None:
            return self
        check = Checker("--listen")
        _check_listen(listen, "listen", check)
        check.raise_if_any()
        return replace(self, listen=listen)


def _check_listen(value: str, path: str, check: Checker) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        check.problem(path, f"must be HOST:PORT with a port in 1..65535, got {value!r}")


def parse_config(doc: Any, where: str, base_dir: Path | None = None, *, profile_file: bool = False) -> ExtenderConfig:
    """Validate an extender config mapping; ``ConfigError`` lists every problem at once.

    Paths in it are taken relative to ``base_dir`` (the config file's folder). The files read
    at start — TLS, the tenant source's secrets, ``kubeconfig`` — must be readable; so must the
    profile file of the ``file`` source where ``profile_file`` is set (:func:`load_config`:
    tests that hand in their own source name none).
    """
    check = Checker(where)
    config = read_settings(ExtenderConfig, doc, check, "")
    # the forms the field specs do not say
    _check_listen(config.listen, "listen", check)
    prefix = config.prefix
    if not prefix.startswith("/") or (prefix.endswith("/") and prefix != "/"):
        check.problem("prefix", f"must start with '/' and not end with '/', got {prefix!r}")
    if base_dir is not None and not Path(config.file_path).is_absolute():
        config = replace(config, file_path=str(base_dir / config.file_path))
    if profile_file and config.source == "file":  # named here, not by the profile reader's "cannot read"
        problem = unreadable(config.file_path)
        if problem:
            check.problem("profiles.file.path", f"{config.file_path}: {problem}")
    if config.kubeconfig:
        # read by the kubernetes client in each worker, retried for ever when it fails: check it now
        if base_dir is not None and not Path(config.kubeconfig).is_absolute():
            config = replace(config, kubeconfig=str(base_dir / config.kubeconfig))
        problem = unreadable(config.kubeconfig)
        if problem:
            check.problem("kubeconfig", f"{config.kubeconfig}: {problem}")
    config = replace(config, server=_check_tls(config.server, base_dir, check))
    prom_url = config.prometheus_url
    if config.source == "prometheus" and not prom_url:
        check.problem("profiles.prometheus.url", "is required when profiles.source is prometheus")
    problem = url_problem(prom_url, "") if prom_url else None
    if problem:
        check.problem("profiles.prometheus.url", problem)
    if not SELECTOR.fullmatch(config.prometheus_selector):
        check.problem(
            "profiles.prometheus.selector",
            f'must be PromQL label matchers, comma-separated (job="joulesched-agent"), got {config.prometheus_selector!r}',
        )
    if config.source == "tenant":
        if base_dir is not None:  # secret files, as the TLS files, relative to the config's folder
            tenant = config.tenant
            token, password = (base_dir / f if f and not Path(f).is_absolute() else f for f in (tenant.registrar_token_file, tenant.password_file))
            config = replace(config, tenant=replace(tenant, registrar_token_file=str(token), password_file=str(password)))
        check_tenant_config(config.tenant, "profiles.tenant", check)
    # A decision waiting for a binding (bind.wait_seconds, 0.2 s by default) holds a thread, and
    # where binds share that decision's pool the bind needs another of it.
    waits = config.bind_enabled and config.bind_wait_seconds > 0
    if waits and config.server.worker == "gthread" and config.server.threads < 2:
        check.problem(
            "server.threads",
            "must be 2 or more with server.worker: gthread, bind.enabled and bind.wait_seconds > 0: gunicorn's"
            " worker serves binds from server.threads, and a decision waiting for a binding holds one"
            " (or set bind.wait_seconds: 0)",
        )
    elif waits and config.server.worker != "gthread" and not config.bind_write and config.server.threads < 3:
        # The buffered worker gives bind.threads only to binds that wait on the API server. Of
        # server.threads, up to half wait for a connection's next request and one may hold a
        # waiting decision: a third answers the bind it waits for at once.
        check.problem(
            "server.threads",
            "must be 3 or more with bind.write: false and bind.wait_seconds > 0: binds that write nothing are"
            " served by server.threads, where a decision waiting for a binding holds one and up to half wait for"
            " a connection's next request (or set bind.wait_seconds: 0)",
        )
    check.raise_if_any()
    return config


def _check_tls(server: ServerConfig, base_dir: Path | None, check: Checker) -> ServerConfig:
    """Both of cert and key or neither; a client CA only with them and the buffered worker."""
    files = {}
    for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        value = getattr(server, name)
        if value and base_dir is not None and not Path(value).is_absolute():
            value = str(base_dir / value)
        files[name] = value
    if bool(files["tls_cert_file"]) != bool(files["tls_key_file"]):
        check.problem("server.tls", "cert_file and key_file go together")
    if files["tls_client_ca_file"] and not files["tls_cert_file"]:
        check.problem("server.tls.client_ca_file", "needs cert_file and key_file: mutual TLS is TLS first")
    if files["tls_client_ca_file"] and server.worker != "buffered":
        check.problem("server.tls.client_ca_file", "is enforced by the buffered worker: server.worker must be buffered")
    for name, value in files.items():
        if value:  # read before gunicorn starts: its own check is a traceback from the arbiter
            problem = unreadable(value)
            if problem:
                check.problem(f"server.tls.{name.removeprefix('tls_')}", f"{value}: {problem}")
    return replace(server, **files)


def unreadable(path: str) -> str | None:
    """Why the file at ``path`` cannot be read, or None when it can."""
    try:
        with open(path, "rb"):
            return None
    except OSError as err:
        return f"cannot read: {err.strerror or err}"


def load_config(path: str | None) -> ExtenderConfig:
    """Read the config file (``None``: the defaults, serving the shipped example cluster)."""
    if path is None:
        return ExtenderConfig()
    file = Path(path)
    doc = read_yaml(file)
    return parse_config(doc, str(file), base_dir=file.parent, profile_file=True)


def mapping_or_empty(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
