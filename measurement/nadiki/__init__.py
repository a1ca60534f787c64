"""NADIKI provider mode: register the physical server with a registrar and push its energy.

In virtualised clusters the tenant's Kubernetes nodes are VMs that cannot read RAPL, IPMI or the
GPUs' counters; the infrastructure provider runs the agent on the physical host instead, and
this package turns its counters into the NADIKI API's time series (``../shared/nadiki``):

* :mod:`~measurement.nadiki.registrar` — ``POST /servers`` once, the id kept in a state file and
  reused (``GET``/``PUT /servers/{id}``) ever after;
* :mod:`~measurement.nadiki.inventory` — CPUs, sockets, memory, disks and GPUs for the
  registration, read from the host's trees;
* :mod:`~measurement.nadiki.pusher` — counter samples → joules per aligned window →
  :mod:`~measurement.nadiki.lineprotocol` → InfluxDB v2 write with token auth, with a backlog;
* :mod:`~measurement.nadiki.provider` — the two tied together, and the one seam with the agent:
  an iterable of ``CounterSample(timestamp, source, joules_total)``.

Error hierarchy (configuration problems raise :class:`policy.errors.ConfigError`, as the agent's
own configuration does)::

    MeasurementError              measurement's root
    └── NadikiError               provider mode
        ├── RegistrationFailed    the registrar refused, is unreachable, or answered off-spec
        └── PushFailed            a write to the time-series endpoint failed (``retry`` says
                                  whether the lines are kept)
"""

from joulesched.measurement.nadiki.config import ProviderConfig, parse_provider_config
from joulesched.measurement.nadiki.errors import NadikiError, PushFailed, RegistrationFailed
from joulesched.measurement.nadiki.model import Registration, ServerDescription, TimeSeriesConfig
from joulesched.measurement.nadiki.provider import NODE_LABEL, Provider, counter_samples, samples_from_snapshots
from joulesched.measurement.nadiki.pusher import CounterSample, Pusher

__all__ = [
    "NODE_LABEL",
    "CounterSample",
    "NadikiError",
    "Provider",
    "ProviderConfig",
    "PushFailed",
    "Pusher",
    "Registration",
    "RegistrationFailed",
    "ServerDescription",
    "TimeSeriesConfig",
    "counter_samples",
    "parse_provider_config",
    "samples_from_snapshots",
]
