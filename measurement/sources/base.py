"""The one seam between hardware and the rest of the agent.

A :class:`Source` is a name and a list of zones; a :class:`Zone` reads either an energy
counter (joules, possibly wrapping at ``max_joules``) or an instantaneous power (watts). Raw
hardware units (µJ, mW, MSR energy units) stay inside the source: every :class:`Reading`
crossing this boundary is an SI float with the time it was taken.

Capabilities are declared (``kind``, ``max_joules``, ``domain``), not discovered by exceptions.
What only some sources or zones offer is declared as a Protocol below, checked with
``isinstance`` (never ``getattr``):

* :class:`HasNotes` — ``notes``: what discovery skipped or chose and why (logged at start);
* :class:`ReportsProcessUtilisation` — ``process_utilisation()``: per process, its share of each
  GPU (NVML);
* :class:`ReportsUtilisation` — ``utilisation()``: each device's utilisation (0..1);
* :class:`ReportsPowerLimits` — ``power_limits()``: each device's enforced power limit (watts);
* :class:`HasModel` (a zone) — ``model``: the device's model name (a GPU's, for NADIKI);
* :class:`ReadsInPasses` — ``begin_pass()`` / ``end_pass()`` around one read of all its zones
  (Redfish: one GET per resource per read);
* :class:`HasMaxWatts` (a zone) — ``max_watts``: the zone's physical maximum power, where the
  device states one (RAPL's ``constraint_*_max_power_uw``); the power gauge never exceeds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

ReadingKind = Literal["counter", "power"]

# What a zone measures. ``platform`` is a whole-server reading (IPMI, Redfish, RAPL psys).
DOMAINS = ("package", "core", "uncore", "dram", "psys", "platform", "gpu")


@dataclass(frozen=True)
class Reading:
    value: float  # joules (counter) or watts (power)
    timestamp: float  # seconds, from the clock the sampler passed in, or the device's own


@runtime_checkable
class Zone(Protocol):
    @property
    def name(self) -> str:  # unique within its source, e.g. "package-0", "dram-0", "gpu-1"
        ...

    @property
    def domain(self) -> str:  # one of DOMAINS
        ...

    @property
    def kind(self) -> ReadingKind: ...

    @property
    def max_joules(self) -> float | None:  # wrap range of a counter; None if it never wraps
        ...

    @property
    def parent(self) -> str | None:  # name of the zone this one is part of (never add both)
        ...

    def read(self) -> Reading:
        """One reading; raises SourceFailed with a message that names the path and the fix."""
        ...


@runtime_checkable
class Source(Protocol):
    @property
    def name(self) -> str:  # e.g. "rapl_sysfs"
        ...

    def zones(self) -> Sequence[Zone]:
        """The zones present now (re-listed periodically: zones can be hot-plugged)."""
        ...


# -- optional capabilities ---------------------------------------------------------------------


@runtime_checkable
class HasNotes(Protocol):
    """A source that says what discovery skipped or chose, and why (the agent logs each note)."""

    @property
    def notes(self) -> Sequence[str]: ...


@runtime_checkable
class ReportsProcessUtilisation(Protocol):
    """A source that knows which processes use its devices (NVML's per-process SM use).

    With it, a device that no process touches is idle (utilisation 0), not unknown.
    """

    def process_utilisation(self) -> Mapping[int, Mapping[str, float]]:
        """``{pid: {zone name: share 0..1}}`` since the previous call; may raise (logged, skipped)."""
        ...


@runtime_checkable
class ReportsUtilisation(Protocol):
    """A source that reports each device's utilisation directly."""

    def utilisation(self) -> Mapping[str, float]:
        """``{zone name: utilisation 0..1}`` now; may raise (logged, skipped)."""
        ...


@runtime_checkable
class ReportsPowerLimits(Protocol):
    """A source whose devices have a power limit in force (a GPU's enforced limit)."""

    def power_limits(self) -> Mapping[str, float]:
        """``{zone name: watts}``, read now (an administrator can change it); may raise."""
        ...


@runtime_checkable
class HasModel(Protocol):
    """A zone that names the device model it meters (e.g. ``NVIDIA H100 80GB HBM3``)."""

    @property
    def model(self) -> str: ...


@runtime_checkable
class ReadsInPasses(Protocol):
    """A source whose zones share fetched data within one read of them all."""

    def begin_pass(self) -> None: ...

    def end_pass(self) -> None: ...


@runtime_checkable
class HasMaxWatts(Protocol):
    """A zone whose device states the most power it can draw (None or 0: not stated)."""

    @property
    def max_watts(self) -> float | None: ...


@dataclass(frozen=True)
class Roots:
    """Where the host's trees are: real paths on a node, replica trees in tests, or a host's
    trees mounted elsewhere in a container."""

    sysfs: str = "/sys"
    procfs: str = "/proc"
    cgroup: str = "/sys/fs/cgroup"
    dev: str = "/dev"


class SourceFactory(Protocol):
    """Every source module exposes ``open_source(options, roots) -> Source``.

    ``options`` is the source's own mapping from the agent config (already a dict, maybe
    empty). It raises SourceAbsent when the hardware is not there and SourceFailed when it is
    there but unusable (with a message naming the fix).

    A factory may also declare a keyword parameter ``clock`` (a ``() -> float`` callable): the
    registry then passes the sampler's clock, and the source stamps its readings with it (the
    RAPL sources do; sources with a device clock, such as a BMC's, use their own).
    """

    def __call__(self, options: dict[str, object], roots: Roots) -> Source: ...
