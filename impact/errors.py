"""Errors of the impact package (hierarchy in ``impact/__init__.py``)."""

from __future__ import annotations


class ImpactError(Exception):
    """Root of every error raised by ``impact``."""


class ReportError(ImpactError):
    """A problem the user can fix (bad arguments, no data, Prometheus unreachable): exit 1."""


class UsageError(ReportError):
    """The command was called wrong (a flag, a time, a missing flag, a file it names): exit 2,
    as argparse's own usage errors, before any query."""


__all__ = ["ImpactError", "ReportError", "UsageError"]
