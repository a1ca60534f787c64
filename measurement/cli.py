"""``joulesched agent`` and ``joulesched measure``.

``joulesched agent [--config FILE] [--listen HOST:PORT] [--interval SECONDS] [--sysfs-root DIR]
[--procfs-root DIR] [--cgroup-root DIR] [--dev-root DIR] [--record FILE] [--node-name NAME]``
runs the node agent (configuration: defaults, then the file, then these flags).

``joulesched measure [--interval S] [--config FILE] [--sysfs-root DIR] ... [--json] [--output FILE]
-- CMD ARGS`` runs CMD, reads every energy counter at its exact start and end (and every
``--interval`` seconds in between, so that 32-bit counters cannot wrap unseen), prints the energy
per domain in kJ on stderr, and exits with CMD's exit code (128 + N when a signal N ended it, 127
when it could not be started).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from joulesched.measurement.config import MAX_INTERVAL, MIN_INTERVAL, AgentConfig, load_config
from joulesched.measurement.errors import MeasurementError
from joulesched.measurement.sources.registry import Outcome, open_sources
from joulesched.policy.errors import ConfigError

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


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from err
    if not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise argparse.ArgumentTypeError(f"must be between {MIN_INTERVAL:g} and {MAX_INTERVAL:g} seconds, got {text}")
    return value


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


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
    parser.add_argument("--interval", type=_interval, metavar="SECONDS", help="sampling interval, 0.1..60 (default 1)")
    parser.add_argument("--record", metavar="FILE", help="append every sample to FILE (JSON lines; .gz to compress)")
    parser.add_argument("--node-name", metavar="NAME", help="Kubernetes node name (default: the host name)")
    args = parser.parse_args(list(argv))
    _setup_logging(args.log_level)
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
        "serving /metrics, /healthz, /v1/profile, /v1/windows on %s:%s; sampling every %g s",
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


def format_report(command: Sequence[str], code: int, result: dict[str, Any], outcomes: Sequence[Outcome]) -> str:
    """The human summary: energy per domain in kJ, and which sources it stands on."""
    joules = result["joules"]
    lines = [f"joulesched measure: {shlex.join(command)} exited {code} after {result['seconds']:.3f} s"]
    if result["basis"]:
        lines.append(f"  {'node':<6} {joules['node'] / 1000:12.6f} kJ   (basis: {result['basis']})")
        lines += [f"  {domain:<6} {joules[domain] / 1000:12.6f} kJ" for domain in ("cpu", "dram", "gpu", "other")]
    else:
        lines.append("  no energy source: nothing was measured")
    zones: dict[str, list[str]] = {}
    for key in result["zones"]:
        source, _, zone = key.partition("/")
        zones.setdefault(source, []).append(zone)
    opened = [f"{o.name} ({', '.join(zones.get(o.name, []))})" for o in outcomes if o.status == "open"]
    absent = [o.name for o in outcomes if o.status == "absent"]
    lines.append(f"  sources: {'; '.join(opened) or 'none'}" + (f"; absent: {', '.join(absent)}" if absent else ""))
    lines += [f"  {o.name}: {o.status}: {o.message}" for o in outcomes if o.status == "failed"]
    return "\n".join(lines)


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
        type=_interval,
        default=1.0,
        metavar="S",
        help="read counters every S seconds while CMD runs (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON (on stderr) instead of text")
    parser.add_argument("--output", metavar="FILE", help="also write the result as JSON to FILE")
    args = parser.parse_args(own)
    if not command:
        parser.error("give the command after --, e.g. joulesched measure -- nextflow run main.nf")
    _setup_logging(args.log_level if args.log_level != "info" else "warning")
    config = _load(args)
    if config is None:
        return 2

    from joulesched.measurement.meter import EnergyMeter
    from joulesched.measurement.sampler import window_energy

    opened = open_sources(config.sources.order, config.sources.options, config.roots)
    meter = EnergyMeter(
        opened.sources,
        order=config.sources.order,
        max_zone_watts=config.anomaly.max_zone_watts,
        max_gap_seconds=max(config.anomaly.max_gap_seconds, args.interval * 3),
        rescan_seconds=float("inf"),
        server_includes_gpus=config.sources.server_includes_gpus,
    )
    start = meter.read()
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
        stop.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    result = window_energy(start, end, meter.layout)
    result.pop("id")
    result.pop("label")
    result["command"] = command
    result["exit_code"] = code
    result["kilojoules"] = {k: v / 1000.0 for k, v in result["joules"].items()}
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
