"""Errors of the measurement package (hierarchy in ``measurement/__init__.py``)."""

from __future__ import annotations


class MeasurementError(Exception):
    """Root of every error raised by ``measurement``."""


class SourceAbsent(MeasurementError):
    """The source is not present on this machine (no powercap tree, no GPU, no BMC).

    Absent is not failed: node_exporter treats a missing powercap tree as "no data".
    """


class SourceFailed(MeasurementError):
    """The source is present but reading it failed; the message names the path and the fix, e.g.

    ``rapl zone "package-0" (/sys/class/powercap/intel-rapl:0/energy_uj): permission denied —
    run the agent as root or mount the powercap tree read-only into a root container``
    """


class UnknownWindow(MeasurementError, KeyError):
    """No measurement window is open with this id (never opened, or already closed)."""


class TooManyWindows(MeasurementError, OverflowError):
    """Opening one more measurement window would pass the limit of open windows (HTTP 429)."""
