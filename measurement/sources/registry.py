"""Every energy source by name, opened in a configured order.

One dict maps a source name to its module; a module is imported only when its source is tried
(so an agent without a GPU never imports NVML bindings). Every module exposes
``open_source(options, roots) -> Source``. Each attempt ends as ``open``, ``absent`` (the
hardware is not there: not an error), ``failed`` (it is there but unusable: the message says
what to do) or ``skipped`` (an alternative earlier in the order already provides it); all of
them are collected into one report instead of the first failure hiding the rest.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources.base import Roots, Source

log = logging.getLogger(__name__)

SOURCES: dict[str, str] = {
    "rapl_sysfs": "joulesched.measurement.sources.rapl_sysfs",
    "rapl_msr": "joulesched.measurement.sources.rapl_msr",
    "ipmi_dcmi": "joulesched.measurement.sources.ipmi_dcmi",
    "ipmi_sdr": "joulesched.measurement.sources.ipmi_sdr",
    "redfish": "joulesched.measurement.sources.redfish",
    "nvml": "joulesched.measurement.sources.nvml",
}
# rapl_msr is opt-in (it needs CAP_SYS_RAWIO), so it is not in the default order.
DEFAULT_ORDER: tuple[str, ...] = ("rapl_sysfs", "ipmi_dcmi", "ipmi_sdr", "redfish", "nvml")
# Alternatives reading the same counters: the first one opened makes the later ones skipped.
ALTERNATIVES: tuple[frozenset[str], ...] = (
    frozenset({"rapl_sysfs", "rapl_msr"}),
    frozenset({"ipmi_dcmi", "ipmi_sdr"}),
)

Status = Literal["open", "absent", "failed", "skipped"]


@dataclass(frozen=True)
class Outcome:
    name: str
    status: Status
    message: str = ""


@dataclass
class OpenedSources:
    sources: list[Source] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    def message(self) -> str:
        """One line per source tried, e.g. ``rapl_sysfs: open (4 zones); nvml: absent (...)``."""
        parts = []
        for outcome in self.outcomes:
            text = f"{outcome.name}: {outcome.status}"
            if outcome.message:
                text += f" ({outcome.message})"
            parts.append(text)
        return "; ".join(parts) if parts else "no source configured"


def unknown_names(names: Iterable[str]) -> list[str]:
    return [n for n in names if n not in SOURCES]


def open_one(
    name: str, options: Mapping[str, object], roots: Roots, clock: Callable[[], float] | None = None
) -> Source:
    """Import the source's module and call its ``open_source``; every failure is SourceFailed.

    A module whose ``open_source`` declares a ``clock`` keyword gets the sampler's clock, so that
    its readings carry timestamps from the same clock (the simulator drives a fake one)."""
    if name not in SOURCES:
        raise SourceFailed(f"unknown source {name!r} (known: {', '.join(sorted(SOURCES))})")
    module_name = SOURCES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise SourceFailed(f"module {module_name} cannot be imported: {err}") from err
    factory = getattr(module, "open_source", None)
    if not callable(factory):
        raise SourceFailed(f"module {module_name} has no open_source(options, roots)")
    kwargs = {}
    if clock is not None:
        try:
            if "clock" in inspect.signature(factory).parameters:
                kwargs["clock"] = clock
        except (TypeError, ValueError):
            pass
    try:
        source: Source = factory(dict(options), roots, **kwargs)
    except (SourceAbsent, SourceFailed):
        raise
    except Exception as err:  # a bug or an unexpected device answer must not stop the other sources
        raise SourceFailed(f"{type(err).__name__}: {err}") from err
    return source


def option_problems(name: str, options: Mapping[str, object]) -> list[str]:
    """What is wrong with a source's options on their face (no device asked), each ``key: message``,
    from the module's ``check_options`` where it has one (Redfish: a URL with credentials in it,
    a password over plain http). The agent's config loader refuses a config that has any; every
    other option is checked when the source opens."""
    if name not in SOURCES:
        return []
    try:
        module = importlib.import_module(SOURCES[name])
    except ImportError:
        return []  # open_one reports it
    check = getattr(module, "check_options", None)
    return list(check(options)) if callable(check) else []


def open_sources(
    order: Sequence[str],
    options: Mapping[str, Mapping[str, object]],
    roots: Roots,
    clock: Callable[[], float] | None = None,
) -> OpenedSources:
    """Try every source of ``order``; collect what opened and why the others did not."""
    result = OpenedSources()
    provided: set[str] = set()
    for name in order:
        group = group_of(name)
        taken = group & provided
        if taken:
            result.outcomes.append(Outcome(name, "skipped", f"{sorted(taken)[0]} already reads these counters"))
            continue
        try:
            source = open_one(name, options.get(name, {}), roots, clock)
        except SourceAbsent as err:
            result.outcomes.append(Outcome(name, "absent", str(err)))
            continue
        except SourceFailed as err:
            result.outcomes.append(Outcome(name, "failed", str(err)))
            continue
        try:
            count = len(source.zones())
        except (SourceAbsent, SourceFailed) as err:
            result.outcomes.append(Outcome(name, "failed", f"opened but listing zones failed: {err}"))
            continue
        provided.add(name)
        result.sources.append(source)
        result.outcomes.append(Outcome(name, "open", f"{count} zone{'s' if count != 1 else ''}"))
    return result


def group_of(name: str) -> frozenset[str]:
    """The source and its alternatives (the other readers of the same counters)."""
    return next((g for g in ALTERNATIVES if name in g), frozenset({name}))


def retry_openers(
    opened: OpenedSources,
    options: Mapping[str, Mapping[str, object]],
    roots: Roots,
    clock: Callable[[], float] | None = None,
) -> list[tuple[str, Callable[[], Source], str, frozenset[str]]]:
    """For every source that failed to open (and has no alternative open): its name, a callable
    that tries to open it again, the error, and its group of alternatives. Absent sources are not
    retried: their hardware is not there."""
    provided = set(opened.names)
    out: list[tuple[str, Callable[[], Source], str, frozenset[str]]] = []
    for outcome in opened.failures():
        group = group_of(outcome.name)
        if group & provided:
            continue
        opener = functools.partial(open_one, outcome.name, options.get(outcome.name, {}), roots, clock)
        out.append((outcome.name, opener, outcome.message, group))
    return out


__all__ = [
    "ALTERNATIVES",
    "DEFAULT_ORDER",
    "SOURCES",
    "OpenedSources",
    "Outcome",
    "group_of",
    "open_one",
    "open_sources",
    "option_problems",
    "retry_openers",
]
