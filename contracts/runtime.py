"""What every long-running joulesched process states about itself: its build and its log lines.

* :class:`BuildInfoCollector` exports ``joulesched_build_info`` (constant 1; labels version,
  revision, python_version), the convention of Prometheus' own ``prometheus_build_info``, so
  that a dashboard or alert can tell which release runs where. The revision is the git commit
  the image was built from: ``JOULESCHED_REVISION`` in the environment, which the Containerfile
  sets from its ``REVISION`` build argument; ``unknown`` when nothing recorded it.
* :func:`setup_logging` configures the root logger for ``--log-format text`` (one readable line)
  or ``--log-format json`` (one JSON object per line with ``ts``, ``level``, ``logger``, ``msg``,
  and ``exc`` for a traceback), which log collectors parse without a regular expression.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from typing import IO, Any

from joulesched.contracts import names

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REVISION_ENV = "JOULESCHED_REVISION"


def version() -> str:
    """The installed distribution's version (the one pyproject.toml states)."""
    try:
        return metadata.version("joulesched")
    except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        from joulesched import __version__

        return __version__


def build_labels() -> dict[str, str]:
    return {
        "version": version(),
        "revision": os.environ.get(REVISION_ENV, "").strip() or "unknown",
        "python_version": platform.python_version(),
    }


class BuildInfoCollector:
    """``joulesched_build_info 1`` with the build's labels, read once when created.

    A prometheus-client collector by shape (``collect``/``describe``), importing the library only
    when scraped: ``joulesched extender`` must set PROMETHEUS_MULTIPROC_DIR before anything
    imports prometheus_client, and it imports this module first for ``--log-format``.
    """

    def __init__(self) -> None:
        self.labels = build_labels()

    def describe(self) -> list[Any]:
        return list(self.collect())

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(names.BUILD_INFO.name, names.BUILD_INFO.help, labels=list(names.BUILD_INFO.labels))
        family.add_metric([self.labels[label] for label in names.BUILD_INFO.labels], 1)
        yield family


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (RFC 3339, UTC, milliseconds), level, logger, msg[, exc]."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        millis = int((record.created - seconds) * 1000)
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")


def setup_logging(level: str, log_format: str = "text", stream: IO[str] | None = None) -> logging.Handler | None:
    """The root logger: ``level`` (debug, info, warning, error), one handler on ``stream`` (stderr).

    Like :func:`logging.basicConfig`, it leaves logging alone when the program that runs us has
    configured it already (handlers on the root logger that are not ours: an embedding program,
    a test runner); a handler of ours from an earlier call is replaced. Returns the handler
    installed, or ``None``.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _OURS, False):
            root.removeHandler(old)
    if root.handlers:
        return None
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(log_format))
    setattr(handler, _OURS, True)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    return handler


_OURS = "_joulesched_handler"


__all__ = [
    "LOG_FORMATS",
    "REVISION_ENV",
    "BuildInfoCollector",
    "JsonFormatter",
    "build_labels",
    "formatter",
    "setup_logging",
    "version",
]
