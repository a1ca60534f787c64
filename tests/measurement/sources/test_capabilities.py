"""Optional capabilities are declared (Protocols in sources/base.py) and the real sources declare them."""

from __future__ import annotations

import time

from joulesched.measurement.sources.base import (
    HasModel,
    HasNotes,
    ReportsPowerLimits,
    ReportsProcessUtilisation,
    ReportsUtilisation,
    Source,
    Zone,
)
from joulesched.measurement.sources.ipmi_dcmi import IpmiDcmi
from joulesched.measurement.sources.ipmi_sdr import IpmiSdr
from joulesched.measurement.sources.ipmi_tools import IpmiRunner, IpmiTarget, IpmiZone
from joulesched.measurement.sources.nvml import Nvml, NvmlZone
from tests.measurement.fakes import FakeSource, gpus


def test_nvml_declares_per_process_use_and_power_limits() -> None:
    assert issubclass(Nvml, ReportsProcessUtilisation)
    assert issubclass(Nvml, ReportsPowerLimits)
    assert not issubclass(Nvml, ReportsUtilisation)
    zone = NvmlZone("gpu-0", "counter", 0, "GPU-1", "NVIDIA H100", 700.0, 700.0, None, lambda: 0.0, time.time)
    assert isinstance(zone, Zone) and isinstance(zone, HasModel)


def test_ipmi_sources_share_one_zone_class_and_have_notes() -> None:
    runner = IpmiRunner("ipmi_dcmi", IpmiTarget(tool="ipmitool", binary="/usr/bin/ipmitool", host=None))
    dcmi = IpmiDcmi(runner)
    sdr = IpmiSdr(runner, [], "configured", None)
    for source in (dcmi, sdr):
        assert isinstance(source, Source) and isinstance(source, HasNotes)
        (zone,) = source.zones()
        assert type(zone) is IpmiZone and isinstance(zone, Zone) and not isinstance(zone, HasModel)
        assert not isinstance(source, ReportsPowerLimits | ReportsProcessUtilisation | ReportsUtilisation)


def test_a_plain_source_declares_nothing_optional() -> None:
    plain = FakeSource("plain")
    assert not isinstance(plain, HasNotes | ReportsPowerLimits | ReportsProcessUtilisation | ReportsUtilisation)
    fake_gpus = gpus(time.time)
    assert isinstance(fake_gpus, ReportsProcessUtilisation) and isinstance(fake_gpus, ReportsPowerLimits)
