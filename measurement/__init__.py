"""joulesched measurement: the node agent.

Only ``measurement/sources/`` touches files, sockets, NVML or IPMI; the sampler turns readings
into a frozen snapshot; the exporters (Prometheus, JSON profile, recordings) read snapshots only.

Error hierarchy::

    MeasurementError            root of every error raised by this package
    ├── SourceAbsent            the hardware or interface is not there (not a failure)
    └── SourceFailed            it is there but a read failed; the message says what to do
"""

from joulesched.measurement.errors import MeasurementError, SourceAbsent, SourceFailed

__all__ = ["MeasurementError", "SourceAbsent", "SourceFailed"]
