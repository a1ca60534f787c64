"""Errors of the impact package (hierarchy in ``impact/__init__.py``)."""

from __future__ import annotations


class ImpactError(Exception):
    """Root of every error raised by ``impact``."""


class ReportError(ImpactError):
    """A problem the user can fix (bad arguments, no data, Prometheus unreachable)."""


__all__ = ["ImpactError", "ReportError"]
