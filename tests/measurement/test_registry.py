"""The source registry: lazy imports, a configured order, every outcome collected."""

from __future__ import annotations

import sys
import types

import pytest

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources import registry
from joulesched.measurement.sources.base import Roots
from tests.measurement.replica import PowercapTree


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, factory: object) -> None:
    module = types.ModuleType(f"fake_{name}")
    module.open_source = factory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, f"fake_{name}", module)
    monkeypatch.setitem(registry.SOURCES, name, f"fake_{name}")


def test_the_names_other_modules_implement_are_registered() -> None:
    assert registry.SOURCES == {
        "rapl_sysfs": "joulesched.measurement.sources.rapl_sysfs",
        "rapl_msr": "joulesched.measurement.sources.rapl_msr",
        "ipmi_dcmi": "joulesched.measurement.sources.ipmi_dcmi",
        "ipmi_sdr": "joulesched.measurement.sources.ipmi_sdr",
        "redfish": "joulesched.measurement.sources.redfish",
        "nvml": "joulesched.measurement.sources.nvml",
    }


def test_every_outcome_is_collected_in_one_message(
    monkeypatch: pytest.MonkeyPatch, powercap: PowercapTree, roots: Roots
) -> None:
    powercap.server(sockets=1)

    def absent(options: dict[str, object], roots: Roots) -> None:
        raise SourceAbsent("no BMC")

    def failed(options: dict[str, object], roots: Roots) -> None:
        raise SourceFailed("BMC refused the password — check credentials_file")

    def buggy(options: dict[str, object], roots: Roots) -> None:
        raise ZeroDivisionError("oops")

    fake_module(monkeypatch, "ipmi_dcmi", absent)
    fake_module(monkeypatch, "redfish", failed)
    fake_module(monkeypatch, "nvml", buggy)
    opened = registry.open_sources(("rapl_sysfs", "rapl_msr", "ipmi_dcmi", "redfish", "nvml"), {}, roots)
    assert opened.names == ["rapl_sysfs"]
    statuses = {o.name: o.status for o in opened.outcomes}
    assert statuses == {
        "rapl_sysfs": "open",
        "rapl_msr": "skipped",
        "ipmi_dcmi": "absent",
        "redfish": "failed",
        "nvml": "failed",
    }
    message = opened.message()
    for part in (
        "rapl_sysfs: open (3 zones)",
        "rapl_msr: skipped (rapl_sysfs already reads these counters)",
        "ipmi_dcmi: absent (no BMC)",
        "check credentials_file",
        "ZeroDivisionError: oops",
    ):
        assert part in message
    assert [o.name for o in opened.failures()] == ["redfish", "nvml"]


def test_the_later_alternative_is_tried_when_the_first_is_absent(monkeypatch: pytest.MonkeyPatch, roots: Roots) -> None:
    class Empty:
        name = "ipmi_sdr"

        def zones(self) -> list[object]:
            return []

    def absent(options: dict[str, object], roots: Roots) -> None:
        raise SourceAbsent("DCMI power reading deactivated")

    fake_module(monkeypatch, "ipmi_dcmi", absent)
    fake_module(monkeypatch, "ipmi_sdr", lambda options, roots: Empty())
    opened = registry.open_sources(("ipmi_dcmi", "ipmi_sdr"), {}, roots)
    assert opened.names == ["ipmi_sdr"]


def test_options_and_clock_are_passed(monkeypatch: pytest.MonkeyPatch, roots: Roots) -> None:
    seen: dict[str, object] = {}

    class Src:
        name = "redfish"

        def zones(self) -> list[object]:
            return []

    def factory(options: dict[str, object], roots: Roots, clock: object = None) -> Src:
        seen.update(options=options, clock=clock)
        return Src()

    fake_module(monkeypatch, "redfish", factory)
    clock = lambda: 1.0  # noqa: E731
    registry.open_sources(("redfish",), {"redfish": {"url": "https://bmc"}}, roots, clock)
    assert seen == {"options": {"url": "https://bmc"}, "clock": clock}


def test_a_module_that_cannot_be_imported_is_a_failure(monkeypatch: pytest.MonkeyPatch, roots: Roots) -> None:
    monkeypatch.setitem(registry.SOURCES, "nvml", "joulesched.measurement.sources.no_such_module")
    opened = registry.open_sources(("nvml",), {}, roots)
    assert opened.outcomes[0].status == "failed"
    assert "cannot be imported" in opened.outcomes[0].message


def test_unknown_name() -> None:
    with pytest.raises(SourceFailed, match="unknown source 'tapeworm'"):
        registry.open_one("tapeworm", {}, Roots())
