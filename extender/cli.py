"""``joulesched extender``: serve the scheduler extender with gunicorn.

    joulesched extender [--config FILE] [--listen HOST:PORT] [--workers N] [--log-format text|json]
    joulesched extender --demo [--config FILE]
    joulesched extender --check [--config FILE] [--listen HOST:PORT] [--workers N]

With no config it serves the shipped example node profiles. ``--demo`` starts it on a free
loopback port, sends one scripted pod through filter, prioritize and explain over HTTP (under the
config's ``prefix``), for every node of the profile file, prints the scores and stops; a config
whose ``profiles.source`` is not ``file``, or that serves TLS, is refused. ``--check`` validates
the config and the files it names, prints one line and exits (0, or 2 with the problems)
without serving or contacting anything (:func:`check_config`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from joulesched.contracts.runtime import LOG_FORMATS, setup_logging
from joulesched.policy.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="joulesched extender", description="Serve the energy-aware scheduler extender.")
    p.add_argument("--config", help="extender config YAML (default: built-in defaults and the example cluster)")
    p.add_argument("--listen", help="HOST:PORT to listen on (overrides the config; default 0.0.0.0:8888)")
    p.add_argument("--workers", type=int, help="gunicorn worker processes, 1..64 (overrides server.workers)")
    p.add_argument(
        "--demo",
        action="store_true",
        help="start on loopback, score one example pod on the nodes of the profile file, print, stop",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the config and the files it names (profile file, TLS and secret files, kubeconfig), print one"
        " line and exit: 0 when all is well, 2 with the problems; serves nothing and contacts nothing",
    )
    p.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text lines, or one JSON object per line, gunicorn's own lines too (default text)",
    )
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return _parser().parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    p = _parser()
    args = p.parse_args(list(argv))
    if args.demo and args.check:
        p.error("argument --check: not with --demo")
    if args.demo:
        for flag, value in (("--listen", args.listen), ("--workers", args.workers)):
            if value is not None:
                p.error(f"argument {flag}: not with --demo (the demo serves on a free loopback port, one worker)")
    # prometheus-client picks its multiprocess value class when first imported: the
    # directory must be in the environment before anything imports it.
    if not args.demo and not args.check and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="joulesched-metrics-")
    setup_logging("info", args.log_format)
    from joulesched.extender.config import load_config

    if args.workers is not None:
        problem = _workers_problem(args.workers)
        if problem:
            p.error(f"argument --workers: {problem}")
    try:
        config = load_config(args.config).with_listen(args.listen)
        if args.workers is not None:
            config = replace(config, server=replace(config.server, workers=args.workers))
        if args.check:
            print(f"joulesched extender --check: ok: {check_config(config, args.config)}")
            return 0
        refused = _demo_refuses(config, args.config) if args.demo else None
        if refused:
            print(f"joulesched extender: --demo: {refused}", file=sys.stderr)
            return 2
        # Fail before forking workers: a broken profile file is an operator's error to see now.
        # Only the file is read here: the master imports nothing the workers alone need (their
        # imports are not shared with it, and every process's memory counts against the pod).
        if config.source == "file":
            from joulesched.extender.profiles import read_profile_file

            profiles = read_profile_file(config.file_path)
            if args.demo:
                from joulesched.extender.demo import run_demo

                return run_demo(args.config, config.prefix, [n.name for n in profiles.nodes])
    except ConfigError as err:
        print(f"joulesched extender: {err}", file=sys.stderr)
        return 2
    serve(config, args.log_format)
    return 0


def check_config(config: Any, path: str | None) -> str:
    """What ``--check`` found, in one line; ``ConfigError`` when the profile file has problems.

    :func:`~extender.config.load_config` has already validated the config and found every file
    it names readable (profile file, TLS, tenant secrets, kubeconfig). Here the profile file of
    the ``file`` source is read and validated as the extender reads it at start. Nothing is
    contacted: not Prometheus, the registrar or InfluxDB, nor the Kubernetes API; with no
    ``kubeconfig`` the in-cluster service account is what a pod gets, not checked here.
    """
    said = [path or "the built-in defaults"]
    if config.source == "file":
        from joulesched.extender.profiles import read_profile_file

        profiles = read_profile_file(config.file_path)
        said.append(f"{len(profiles.nodes)} node profiles from {config.file_path}")
        max_age = config.policy.max_age_seconds
        stale = sum(1 for n in profiles.nodes if n.updated is not None and time.time() - n.updated > max_age)
        if stale:  # not a problem of the file: a file rewritten by a measuring job is fresh when served
            said[-1] += f" ({stale} with an `updated` time over {max_age:g} s old now: they would score neutral)"
    elif config.source == "prometheus":
        said.append(f"profiles from Prometheus at {config.prometheus_url} (not contacted)")
    else:
        said.append(f"profiles from the NADIKI registrar at {config.tenant.registrar_url} (not contacted)")
    if config.server.tls_cert_file:
        mutual = ", mutual TLS" if config.server.tls_client_ca_file else ""
        said.append(f"HTTPS{mutual} on {config.listen}")
    else:
        said.append(f"HTTP on {config.listen}")
    uses_api = config.watch_pods or config.watch_nodes or (config.bind_enabled and config.bind_write)
    if config.kubeconfig:
        said.append(f"kubeconfig {config.kubeconfig}" + ("" if uses_api else " (read by nothing this config serves)"))
    elif uses_api:
        said.append("Kubernetes API through the in-cluster service account (not checked here)")
    workers = config.server.workers
    said.append(f"{workers} worker{'s' if workers != 1 else ''}")
    return "; ".join(said)


def _workers_problem(workers: int) -> str | None:
    """What is wrong with ``--workers`` by the bounds of ``server.workers`` (docs/configuration.md)."""
    from joulesched.extender.config import ServerConfig
    from joulesched.policy.validate import limit_problems

    for problem in limit_problems(replace(ServerConfig(), workers=workers), "server"):
        where, _, what = problem.partition(": ")
        if where == "server.workers":
            return f"{what} (the bounds of server.workers)"
    return None


def _demo_refuses(config: Any, path: str | None) -> str | None:
    """Why the demo cannot drive this config: it scores the nodes of a profile file over plain HTTP."""
    if config.source != "file":
        explain = f"{config.prefix.rstrip('/')}/explain"
        return (
            f"{path}: profiles.source is {config.source}; the demo scores the nodes of a profile file "
            f"(profiles.source: file): run the extender without --demo and ask it POST {explain}"
        )
    if config.server.tls_cert_file:
        return f"{path}: server.tls.cert_file is set; the demo speaks plain HTTP: run the extender without --demo"
    return None


def serve(config: Any, log_format: str = "text") -> None:
    """Run gunicorn in this process with extender/gunicorn_conf.py and the config's overrides."""
    from gunicorn.app.base import BaseApplication

    from joulesched.extender import gunicorn_conf

    class Application(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for key in dir(gunicorn_conf):
                if key.startswith("_") or key not in self.cfg.settings:
                    continue
                self.cfg.set(key, getattr(gunicorn_conf, key))
            self.cfg.set("bind", [config.listen])
            self.cfg.set("workers", config.server.workers)
            self.cfg.set("threads", config.server.threads)
            self.cfg.set("timeout", max(1, round(config.server.timeout_seconds)))
            self.cfg.set("keepalive", max(1, round(config.server.keepalive_seconds)))
            if log_format == "json":
                self.cfg.set("logger_class", "joulesched.extender.gunicorn_conf.JsonLogger")
            if config.server.worker == "gthread":
                self.cfg.set("worker_class", "gthread")
            if config.server.tls_cert_file:
                import ssl

                self.cfg.set("certfile", config.server.tls_cert_file)
                self.cfg.set("keyfile", config.server.tls_key_file)
                if config.server.tls_client_ca_file:
                    # Optional at the handshake, so that the kubelet's probes (no certificate)
                    # reach /healthz and /readyz; the worker refuses the verbs without one.
                    self.cfg.set("ca_certs", config.server.tls_client_ca_file)
                    self.cfg.set("cert_reqs", ssl.CERT_OPTIONAL)

        def load(self) -> Any:
            from joulesched.extender.app import create_app

            return create_app(config)

    Application().run()
