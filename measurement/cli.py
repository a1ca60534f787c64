"""``joulesched agent`` and ``joulesched measure``.

``joulesched agent [--config FILE] [--listen HOST:PORT] [--interval SECONDS] [--sysfs-root DIR]
[--procfs-root DIR] [--cgroup-root DIR] [--dev-root DIR] [--record FILE] [--node-name NAME]``
runs the node agent (configuration: defaults, then the file, then these flags).

``joulesched measure [--interval S] [--config FILE] [--sysfs-root DIR] ... [--intensity G_PER_KWH |
--site FILE [--site-name NAME]] [--json] [--output FILE] -- CMD ARGS`` runs CMD, reads every energy
counter at its exact start and end (and every ``--interval`` seconds in between, so that 32-bit
counters cannot wrap unseen), prints the energy per domain in kJ on stderr, and exits with CMD's
exit code (128 + N when a signal N ended it, 127 when it could not be started). Its sources, in
order: the energy counters of this machine; on a VM whose provider pushes the physical server's
energy to the NADIKI side, the provider's figures (``--server-id ID --nadiki-registrar URL
--nadiki-influx URL --nadiki-database DB``, :mod:`measurement.provider_figures`); else an
estimate from CPU time (:mod:`measurement.estimate`). Each is labelled with its method; CO2e (and
water, from a site's WUE) from ``--intensity`` or a site.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import resource
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from joulesched.contracts.cliargs import INTENSITY, number
from joulesched.contracts.runtime import LOG_FORMATS, setup_logging
from joulesched.measurement.config import MAX_INTERVAL, MIN_INTERVAL, AgentConfig, load_config
from joulesched.measurement.errors import MeasurementError
from joulesched.measurement.estimate import Estimate, estimate, read_cpuinfo
from joulesched.measurement.provider_figures import ProviderAccess, ProviderFigure
from joulesched.measurement.sources.registry import Outcome, open_sources
from joulesched.policy.errors import ConfigError
from joulesched.policy.impact import facility_joules, operational_grams, water_litres
from joulesched.policy.site import IntensityUnavailable, SiteModel

log = logging.getLogger("joulesched.agent")


def _roots_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file (see docs/agent.md)")
    parser.add_argument("--sysfs-root", metavar="DIR", help="where the host's /sys is (default /sys)")
    parser.add_argument("--procfs-root", metavar="DIR", help="where the host's /proc is (default /proc)")
    parser.add_argument("--cgroup-root", metavar="DIR", help="where the host's cgroup tree is (default /sys/fs/cgroup)")
    parser.add_argument("--dev-root", metavar="DIR", help="where the host's /dev is, for MSRs (default /dev)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    roots = {
        k: v
        for k, v in (
            ("sysfs", args.sysfs_root),
            ("procfs", args.procfs_root),
            ("cgroup", args.cgroup_root),
            ("dev", args.dev_root),
        )
        if v
    }
    if roots:
        out["roots"] = roots
    if getattr(args, "interval", None) is not None:
        out["interval_seconds"] = args.interval
    if getattr(args, "listen", None):
        out["server"] = {"listen": args.listen}
    if getattr(args, "record", None):
        out["record"] = {"file": args.record}
    if getattr(args, "node_name", None):
        out["node"] = {"name": args.node_name}
    return out


INTERVAL = number(at_least=MIN_INTERVAL, at_most=MAX_INTERVAL, unit="seconds")


def _setup_logging(level: str, log_format: str = "text") -> None:
    setup_logging(level, log_format, stream=sys.stderr)


def _load(args: argparse.Namespace) -> AgentConfig | None:
    try:
        return load_config(args.config, _overrides(args))
    except ConfigError as err:
        print(f"joulesched: {err}", file=sys.stderr)
        return None


# -- agent ----------------------------------------------------------------------------------------


def agent_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="joulesched agent", description="Run the node measurement agent.")
    _roots_flags(parser)
    parser.add_argument("--listen", metavar="HOST:PORT", help="HTTP address (default 127.0.0.1:9102)")
    parser.add_argument("--interval", type=INTERVAL, metavar="SECONDS", help="sampling interval, 0.1..60 (default 1)")
    parser.add_argument("--record", metavar="FILE", help="append every sample to FILE (JSON lines; .gz to compress)")
    parser.add_argument("--node-name", metavar="NAME", help="Kubernetes node name (default: the host name)")
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text lines, or one JSON object per line (default text)",
    )
    args = parser.parse_args(list(argv))
    _setup_logging(args.log_level, args.log_format)
    config = _load(args)
    if config is None:
        return 2

    from joulesched.measurement.agent import build_agent, build_server

    try:
        agent = build_agent(config)
    except (MeasurementError, ConfigError) as err:
        print(f"joulesched agent: {err}", file=sys.stderr)
        return 2
    try:
        server = build_server(agent)
    except (OSError, ValueError) as err:
        print(f"joulesched agent: cannot serve on {config.server.listen}: {err}", file=sys.stderr)
        return 1
    host, port = server.server_address[:2]
    log.info(
        "serving /metrics, /healthz, /v1/profile, /v1/windows, /v1/weblog on %s:%s; sampling every %g s",
        host,
        port,
        config.interval_seconds,
    )

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        agent.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_in_thread()
    # What is loaded by now lives as long as the agent: keep it out of the cyclic collector's
    # scans, which otherwise walk it every few samples (about a tenth of the agent's CPU).
    gc.freeze()
    try:
        agent.run()
    finally:
        server.shutdown()
        server.server_close()
    return 0


# -- measure --------------------------------------------------------------------------------------


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


NO_COUNTER = (
    "no readable energy counter here (RAPL needs root or a readable /sys/class/powercap); estimated from"
    " CPU time instead — run on a machine with RAPL or a joulesched agent for measured energy; on a VM, ask"
    " your provider for its server id and NADIKI read access and add --server-id ID --nadiki-registrar URL"
    " --nadiki-influx URL --nadiki-database DB"
)
ROOT_HINT = "the counters are here but readable by root only: run `sudo joulesched measure -- …` for measured energy"


def _hint(message: str) -> str:
    """A source's failure as the person running ``measure`` can act on it (not the agent's fix)."""
    if "permission denied" in message:
        return message.split(" — ")[0] + " — " + ROOT_HINT
    return message


def format_report(command: Sequence[str], code: int, result: dict[str, Any], outcomes: Sequence[Outcome]) -> str:
    """The human summary: energy per domain in kJ (or the estimate), CO2e, and the sources."""
    joules = result["joules"]
    lines = [f"joulesched measure: {shlex.join(command)} exited {code} after {result['seconds']:.3f} s"]
    if result.get("provider"):
        fig = result["provider"]
        lines.append(
            f"  PROVIDER'S FIGURES energy: {fig['joules']:.3f} J = {fig['joules'] / 3600:.6f} Wh  (no counter on this VM)"
        )
        lines.append(f"  method: {fig['method']}")
        lines.append(
            f"  server {fig['server_id']}: {fig['server_joules']:.1f} J over the run; this VM's share {fig['vm_joules']:.1f} J"
        )
    elif result.get("estimated"):
        est = result["estimate"]
        lines.append(
            f"  ESTIMATED energy: {est['joules']:.3f} J = {est['joules'] / 3600:.6f} Wh  (no energy counter was read)"
        )
        lines.append(f"  method: {est['method']}")
        lines.append(
            f"  CPU time: {est['cpu_seconds']:.3f} s (user + system, the command and the children it waited for)"
        )
    elif result["basis"]:
        lines.append(f"  {'node':<6} {joules['node'] / 1000:12.6f} kJ   (basis: {result['basis']})")
        lines += [f"  {domain:<6} {joules[domain] / 1000:12.6f} kJ" for domain in ("cpu", "dram", "gpu", "other")]
    else:
        lines.append("  no energy source: nothing was measured")
    impact = result.get("impact")
    if impact:
        label = " (estimated)" if result.get("estimated") else " (provider's figures)" if result.get("provider") else ""
        line = f"  CO2e{label}: {impact['co2e_grams']:.4g} g at {impact['intensity_g_per_kwh']:g} gCO2e/kWh"
        if impact["pue"] != 1.0:
            line += f", PUE {impact['pue']:g}"
        line += f" ({impact['from']})"
        if impact["water_litres"] is not None:
            line += f"; water{label}: {impact['water_litres']:.4g} L (WUE {impact['wue']:g} L/kWh)"
        lines.append(line)
    elif result.get("impact_problem"):
        lines.append(f"  CO2e: {result['impact_problem']}")
    if result.get("provider_problem"):
        lines.append(f"  provider's figures: {result['provider_problem']}")
    if result.get("estimated"):
        lines.append(f"  {NO_COUNTER if not result.get('provider_problem') else NO_COUNTER.split(' — ')[0]}")
    zones: dict[str, list[str]] = {}
    for key in result["zones"]:
        source, _, zone = key.partition("/")
        zones.setdefault(source, []).append(zone)
    opened = [f"{o.name} ({', '.join(zones.get(o.name, []))})" for o in outcomes if o.status == "open"]
    absent = [o.name for o in outcomes if o.status == "absent"]
    lines.append(f"  sources: {'; '.join(opened) or 'none'}" + (f"; absent: {', '.join(absent)}" if absent else ""))
    lines += [f"  {o.name}: {o.status}: {_hint(o.message)}" for o in outcomes if o.status == "failed"]
    return "\n".join(lines)


def _chosen_site(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SiteModel | None:
    """The site of ``--site FILE`` [``--site-name NAME``], read and checked before the command
    runs (a bad file or name is exit 2 then, not a lost figure after hours); None without one."""
    if args.site_name and not args.site:
        parser.error("--site-name needs --site FILE")
    if not args.site or args.intensity is not None:
        return None
    from joulesched.contracts.sitefile import load_site_file

    try:
        catalogue = load_site_file(args.site)
    except ConfigError as err:
        parser.error(f"--site {err}")
    names = sorted(catalogue.sites)
    if args.site_name:
        if args.site_name not in catalogue.sites:
            parser.error(f"--site-name {args.site_name!r}: no such site in {args.site} (sites: {', '.join(names)})")
        return catalogue.sites[args.site_name]
    if len(names) != 1:
        parser.error(f"--site {args.site} has {len(names)} sites: choose one with --site-name ({', '.join(names)})")
    return catalogue.sites[names[0]]


def _impact(
    args: argparse.Namespace, site: SiteModel | None, joules: float, t0: float, t1: float
) -> tuple[dict[str, Any] | None, str]:
    """CO2e and water of ``joules`` of IT energy from ``--intensity`` or the site; (None, why) when not given."""
    if args.intensity is not None:
        return {
            "co2e_grams": float(operational_grams(joules, args.intensity)),  # the facility's energy: PUE 1
            "intensity_g_per_kwh": args.intensity,
            "pue": 1.0,
            "wue": None,
            "water_litres": None,
            "from": "--intensity",
        }, ""
    if site is None:
        return None, "give --intensity G_PER_KWH or --site FILE for CO2e"
    try:
        intensity = site.carbon.integral(t0, t1) / (t1 - t0) if t1 > t0 else site.carbon.at(t0)
    except IntensityUnavailable as err:
        return None, f"site {site.name}: {err}"
    return {
        "co2e_grams": float(operational_grams(facility_joules(joules, site.pue), intensity)),
        "intensity_g_per_kwh": intensity,
        "pue": site.pue,
        "wue": site.wue,
        "water_litres": float(water_litres(joules, site.wue)),
        "from": f"site {site.name} in {args.site}",
    }, ""


def _busy_seconds(procfs: str) -> float | None:
    """This machine's busy CPU seconds (/proc/stat), None when it cannot be read."""
    from joulesched.measurement.errors import SourceAbsent, SourceFailed
    from joulesched.measurement.sources.procfs_stat import ProcStat

    try:
        return ProcStat(procfs).read().busy_seconds
    except (SourceAbsent, SourceFailed):
        return None


def _provider_access(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ProviderAccess | None:
    given = {
        "--nadiki-registrar": args.nadiki_registrar,
        "--nadiki-influx": args.nadiki_influx,
        "--nadiki-database": args.nadiki_database,
    }
    if not args.server_id:
        if any(given.values()) or args.vm_share is not None:
            parser.error("the provider's figures need --server-id ID (the physical server under this VM)")
        return None
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        parser.error(f"--server-id needs {', '.join(missing)} (your provider gives them)")
    from joulesched.contracts.net import plain_http_problem, url_problem

    for flag, secret in (("--nadiki-registrar", ""), ("--nadiki-influx", "--nadiki-user and --nadiki-password-file")):
        problem = url_problem(given[flag], secret)
        if problem is None and flag == "--nadiki-influx" and args.nadiki_password_file:
            problem = plain_http_problem(given[flag], "the InfluxDB password (--nadiki-password-file)",
                                         args.allow_plain_http, "--allow-plain-http")
        if problem:
            parser.error(f"{flag}: {problem}")
    password = ""
    if args.nadiki_password_file:
        try:
            with open(args.nadiki_password_file, encoding="utf-8") as fh:
                password = fh.read().strip()
        except OSError as err:
            parser.error(f"--nadiki-password-file {args.nadiki_password_file}: {err.strerror or err}")
    from joulesched.contracts.nadiki_read import InfluxReader, RegistrarReader

    return ProviderAccess(
        RegistrarReader(args.nadiki_registrar),
        InfluxReader(args.nadiki_influx, args.nadiki_database, args.nadiki_user, password),
        args.server_id,
        args.vm_share,
        args.threads_per_core,
        args.provider_wait,
    )


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1 :]
    else:
        own, command = argv, []
    parser = argparse.ArgumentParser(
        prog="joulesched measure",
        description="Run a command and print the energy it used, from counters read at its start and end.",
        usage="joulesched measure [options] -- CMD [ARGS...]",
    )
    _roots_flags(parser)
    parser.add_argument(
        "--interval",
        type=INTERVAL,
        default=1.0,
        metavar="S",
        help="read counters every S seconds while CMD runs (default 1)",
    )
    co2e = parser.add_mutually_exclusive_group()
    co2e.add_argument(
        "--intensity",
        type=INTENSITY,
        metavar="G_PER_KWH",
        help="grid carbon intensity in gCO2e/kWh, for the CO2e of the energy",
    )
    co2e.add_argument("--site", metavar="FILE", help="site file (PUE, WUE, carbon intensity; docs/impact.md) for CO2e")
    parser.add_argument("--site-name", metavar="NAME", help="which site of --site FILE (needed when it has several)")
    vm = parser.add_argument_group("on a VM: the provider's figures (NADIKI), when no counter is readable")
    vm.add_argument("--server-id", metavar="ID", help="the physical server under this VM (from your provider)")
    vm.add_argument("--nadiki-registrar", metavar="URL", help="the NADIKI registrar's API base")
    vm.add_argument("--nadiki-influx", metavar="URL", help="the provider's InfluxDB (1.x /query API)")
    vm.add_argument("--nadiki-database", metavar="DB", help="its database (or bucket)")
    vm.add_argument("--nadiki-user", default="", metavar="USER")
    vm.add_argument("--nadiki-password-file", metavar="FILE", help="file holding the InfluxDB password or token")
    vm.add_argument("--allow-plain-http", action="store_true",
                    help="send that password over http:// to a host that is not loopback (refused otherwise)")
    vm.add_argument("--vm-share", type=number(above=0, at_most=1), metavar="F", help="the provider's share of the server for this VM (0..1]")
    vm.add_argument("--threads-per-core", type=number(whole=True, at_least=1), default=2, metavar="N", help="the server's threads per core (2)")
    vm.add_argument(
        "--provider-wait", type=number(at_least=0, unit="seconds"), default=90.0, metavar="S", help="wait up to S s for the last window (90)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON (on stderr) instead of text")
    parser.add_argument("--output", metavar="FILE", help="also write the result as JSON to FILE")
    args = parser.parse_args(own)
    if not command:
        parser.error("give the command after --, e.g. joulesched measure -- nextflow run main.nf")
    access = _provider_access(parser, args)
    site = _chosen_site(parser, args)
    _setup_logging(args.log_level if args.log_level != "info" else "warning")
    config = _load(args)
    if config is None:
        return 2

    from joulesched.measurement.clock import SteadyClock
    from joulesched.measurement.meter import EnergyMeter
    from joulesched.measurement.sampler import window_energy

    clock = SteadyClock()  # the command's window is timed on it; its edges are reported as wall time
    opened = open_sources(config.sources.order, config.sources.options, config.roots, clock)
    meter = EnergyMeter(
        opened.sources,
        order=config.sources.order,
        clock=clock,
        max_zone_watts=config.anomaly.max_zone_watts,
        # measure has no power model to estimate with: a gap of a few reads is bridged, as before
        max_gap_seconds=config.anomaly.max_gap_seconds or max(30.0, args.interval * 3),
        rescan_seconds=float("inf"),
        server_includes_gpus=config.sources.server_includes_gpus,
    )
    start = meter.read()
    busy_before = _busy_seconds(config.roots.procfs)
    cpu_before = _cpu_seconds()
    code = 0
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    try:
        try:
            child = subprocess.Popen(command)
        except OSError as err:
            print(f"joulesched measure: cannot run {command[0]!r}: {err.strerror or err}", file=sys.stderr)
            code = 126 if isinstance(err, PermissionError) else 127
            child = None
        if child is not None:
            # Ctrl-C reaches the child through the terminal: the agent waits for it to end.
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
            running = child

            def forward(signum: int, _frame: FrameType | None) -> None:
                running.send_signal(signum)

            for sig in (signal.SIGTERM, signal.SIGHUP):
                previous[sig] = signal.signal(sig, forward)

            def keep_reading() -> None:  # intermediate reads: no counter may wrap unseen
                while not stop.wait(args.interval):
                    meter.read()

            reader = threading.Thread(target=keep_reading, name="measure-reads", daemon=True)
            reader.start()
            code = _exit_code(child.wait())
    finally:
        end = meter.read()
        cpu_seconds = _cpu_seconds() - cpu_before
        busy_after = _busy_seconds(config.roots.procfs)
        stop.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    result = window_energy(start, end, meter.layout, clock_step=clock.step())
    result.pop("id")
    result.pop("label")
    result["command"] = command
    result["exit_code"] = code
    estimated: Estimate | None = None
    figure: ProviderFigure | None = None
    if not result["basis"] and access is not None:
        from joulesched.measurement.provider_figures import ProviderFiguresUnavailable, provider_energy

        vm_busy = busy_after - busy_before if busy_before is not None and busy_after is not None else None
        cpus = read_cpuinfo(config.roots.procfs).logical_cpus or os.cpu_count() or 1
        try:
            figure = provider_energy(access, result["start"], result["end"], cpu_seconds, vm_busy, cpus)
        except ProviderFiguresUnavailable as err:
            result["provider_problem"] = f"{err}; estimated from CPU time instead"
    if figure is not None:
        result["basis"] = "provider"
        result["joules"] = {**result["joules"], "node": figure.joules}
    result["provider"] = figure.as_dict() if figure else None
    if not result["basis"]:
        estimated = estimate(cpu_seconds, read_cpuinfo(config.roots.procfs))
        result["basis"] = "estimate"
        result["joules"] = {**result["joules"], "node": estimated.joules, "cpu": estimated.joules}
    result["estimated"] = estimated is not None
    result["method"] = (
        estimated.rate.method if estimated else figure.method if figure else f"counters: {result['basis']}"
    )
    result["estimate"] = estimated.as_dict() if estimated else None
    result["cpu_seconds"] = cpu_seconds
    result["kilojoules"] = {k: v / 1000.0 for k, v in result["joules"].items()}
    impact, problem = _impact(args, site, result["joules"]["node"], result["start"], result["end"])
    result["impact"] = impact
    if problem:
        result["impact_problem"] = problem
    result["outcomes"] = {o.name: {"status": o.status, "message": o.message} for o in opened.outcomes}
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=2)
                f.write("\n")
        except OSError as err:
            print(f"joulesched measure: cannot write {args.output}: {err.strerror or err}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2), file=sys.stderr)
    else:
        print(format_report(command, code, result, opened.outcomes), file=sys.stderr)
    return code


__all__ = ["agent_main", "format_report", "measure_main"]
