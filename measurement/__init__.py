"""joulesched measurement: the node agent.

Only ``measurement/sources/`` touches files, sockets, NVML or IPMI; the sampler turns readings
into a frozen snapshot; the exporters (Prometheus, JSON profile, recordings) read snapshots only.

Error hierarchy (every class in ``measurement/errors.py`` unless named otherwise)::

    MeasurementError              root of every error raised by this package
    ├── SourceAbsent              the hardware or interface is not there (not a failure)
    ├── SourceFailed              it is there but a read failed; the message says what to do
    ├── UnknownWindow (KeyError)  no open measurement window has this id → HTTP 404
    ├── TooManyWindows (OverflowError)
    │                             the open windows are at their limit → HTTP 429
    ├── sources.redfish.HttpError a Redfish GET answered non-2xx (inside the source only: it
    │                             becomes SourceAbsent or SourceFailed before leaving it)
    ├── provider_figures.ProviderFiguresUnavailable
    │                             ``measure`` on a VM: the provider's figures cannot be had (it
    │                             estimates instead and says why)
    └── nadiki.NadikiError        NADIKI provider mode (see ``measurement/nadiki/__init__.py``)
        ├── RegistrationFailed
        └── PushFailed

Configuration problems (the agent's config, a site file) raise
:class:`policy.errors.ConfigError`, the one class for "a document failed validation" that every
part shares (it comes from :class:`policy.validate.Checker` and :func:`contracts.documents.read_yaml`).
"""

from joulesched.measurement.errors import MeasurementError, SourceAbsent, SourceFailed, TooManyWindows, UnknownWindow

__all__ = ["MeasurementError", "SourceAbsent", "SourceFailed", "TooManyWindows", "UnknownWindow"]
