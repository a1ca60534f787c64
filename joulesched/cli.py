"""``joulesched`` — one command, one subcommand per part.

Each subcommand's module is imported only when it runs, so that ``joulesched extender`` does
not import the simulator's plotting stack, nor ``joulesched agent`` the Kubernetes client.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from joulesched import __version__

# subcommand -> (module, function, one-line help). Each function takes argv and returns an exit code.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "extender": ("joulesched.extender.cli", "main", "serve the scheduler extender (filter, prioritize, bind, explain)"),
    "agent": ("joulesched.measurement.cli", "agent_main", "run the node measurement agent"),
    "measure": ("joulesched.measurement.cli", "measure_main", "run a command and print the energy it used"),
    "weblog-report": ("joulesched.measurement.weblog_report", "main", "HTML energy report of a Nextflow run (-with-weblog)"),
    "sim": ("joulesched.sim.cli", "main", "replay workloads on a modelled cluster and compare policies"),
    "report": ("joulesched.impact.cli", "main", "environmental impact of a namespace, selector or workflow run"),
    "rules": ("joulesched.impact.rules", "main", "write the Prometheus recording rules and the Grafana dashboard"),
    "expander": ("joulesched.extender.expander", "main", "write cluster-autoscaler's priority-expander ConfigMap from efficiency"),
    "deferrer": ("joulesched.extender.deferrer", "main", "hold gated pods for their cleanest hour, release by deadline"),
    "bench": ("joulesched.extender.bench", "main", "benchmark the extender against a constant-score floor"),
}


def usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = [f"usage: joulesched <command> [options]   (version {__version__})", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, _, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run 'joulesched <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] == "--version":
        print(__version__)
        return 0
    command, rest = args[0], args[1:]
    if command not in SUBCOMMANDS:
        print(f"joulesched: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, function, _ = SUBCOMMANDS[command]
    module = importlib.import_module(module_name)
    result: int = getattr(module, function)(rest)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
