"""Wrap-safe deltas, trapezoid integration and the node's total, as tables."""

from __future__ import annotations

import pytest

from joulesched.policy.energy import ZoneInfo, counter_delta, plan_layout, split_node, to_nanojoules, trapezoid

MAX = 262143.328850  # J, a typical Intel package range
CEILING = 10_000.0  # W


@pytest.mark.parametrize(
    ("prev", "cur", "max_joules", "dt", "joules", "anomaly"),
    [
        (100.0, 150.0, MAX, 1.0, 50.0, None),
        (MAX - 10.0, 40.0, MAX, 1.0, 50.0, None),
        (MAX - 10.0, 0.0, MAX, 1.0, 10.0, None),
        (0.0, 0.0, MAX, 1.0, 0.0, None),
        (5.0, 5.0, MAX, 0.0, 0.0, None),
        (50.0, 40.0, None, 1.0, None, "negative"),
        (10.0, 20_000.0, MAX, 1.0, None, "implausible"),
        (100.0, 90.0, MAX, 1.0, None, "implausible"),
        (10.0, 11.0, MAX, 0.0, None, "implausible"),
        (900.0, 100.0, 1000.0, 1.0, 200.0, None),
        (2000.0, 5.0, 999.0, 1.0, None, "negative"),
        (10.0, MAX + 1.0, MAX, 1.0, None, "garbage"),
        (10.0, -1.0, MAX, 1.0, None, "garbage"),
        (10.0, float("nan"), MAX, 1.0, None, "garbage"),
        (10.0, float("inf"), None, 1.0, None, "garbage"),
    ],
    ids=[
        "a plain increase",
        "one wrap between two reads",
        "a wrap landing on zero",
        "no energy",
        "no time and no energy",
        "a counter without a range going back (a reset)",
        "a jump no server could draw in a second",
        "going back a little reads as a whole wrap: implausible",
        "energy in zero time",
        "a small custom range wraps",
        "a previous value above the range stays negative",
        "a reading above the counter's range is garbage",
        "a negative reading is garbage",
        "a reading that is not a number is garbage",
        "an infinite reading is garbage, with a range or without",
    ],
)
def test_counter_delta(
    prev: float, cur: float, max_joules: float | None, dt: float, joules: float | None, anomaly: str | None
) -> None:
    delta = counter_delta(prev, cur, max_joules, dt, CEILING)
    assert delta.anomaly == anomaly
    if joules is None:
        assert delta.joules is None
    else:
        assert delta.joules == pytest.approx(joules)


@pytest.mark.parametrize(
    ("prev", "cur", "dt", "wrap_watts", "joules", "anomaly"),
    [
        (MAX - 50.0, 50.0, 1.0, 400.0, 100.0, None),
        (100_000.0, 1_300.0, 17.0, 320.0, None, "reset"),
        (100_000.0, 99_000.0, 31.0, 320.0, None, "reset"),
        (100_000.0, 99_000.0, 1.0, 320.0, None, "reset"),
        (100.0, 200.0, 1.0, 320.0, 100.0, None),
    ],
    ids=[
        "a wrap at the zone's own power is a wrap",
        "a reset after a gap is not taken for a wrap",
        "going back after a long stretch is a reset, not a wrap",
        "going back a little with a known power is a reset",
        "the wrap bound leaves plain increases alone",
    ],
)
def test_counter_delta_wrap_bound(
    prev: float, cur: float, dt: float, wrap_watts: float, joules: float | None, anomaly: str | None
) -> None:
    delta = counter_delta(prev, cur, MAX, dt, CEILING, wrap_watts=wrap_watts)
    assert delta.anomaly == anomaly
    assert delta.joules == (None if joules is None else pytest.approx(joules))


def test_readings_far_enough_apart_to_hold_more_than_one_wrap_are_a_gap() -> None:
    # A RAPL range of 262,144 J at up to 150 W (the meter's wrap_watts) wraps in 1,748 s: over
    # longer, how many times it wrapped is unknown, whatever the two readings say.
    rapl = 262_144.0
    assert counter_delta(200_000.0, 37_856.0, rapl, 1_000.0, 500.0, wrap_watts=150.0).joules == pytest.approx(100_000.0)
    assert counter_delta(200_000.0, 237_856.0, rapl, 3_000.0, 500.0, wrap_watts=150.0).anomaly == "gap"
    assert counter_delta(200_000.0, 37_856.0, rapl, 1_748.0, 500.0, wrap_watts=150.0).anomaly == "gap"
    assert counter_delta(200_000.0, 237_856.0, None, 3_000.0, 500.0, wrap_watts=150.0).joules == 37_856.0  # no range: no wrap


def test_wrap_delta_is_exact_to_the_microjoule() -> None:
    prev_uj, cur_uj, max_uj = 262_143_328_000, 1_234, 262_143_328_850
    delta = counter_delta(prev_uj / 1e6, cur_uj / 1e6, max_uj / 1e6, 1.0, CEILING)
    assert delta.joules is not None
    assert to_nanojoules(delta.joules) == (max_uj - prev_uj + cur_uj) * 1000


@pytest.mark.parametrize(
    ("p0", "t0", "p1", "t1", "joules", "anomaly"),
    [
        (100.0, 0.0, 200.0, 2.0, 300.0, None),
        (100.0, 5.0, 100.0, 5.0, 0.0, None),
        (100.0, 5.0, 100.0, 4.0, None, "negative"),
        (100.0, 0.0, -1.0, 1.0, None, "garbage"),
        (100.0, 0.0, 100.0, 60.0, None, "gap"),
        (100.0, 0.0, 50_000.0, 1.0, None, "garbage"),
        (100.0, 0.0, float("nan"), 1.0, None, "garbage"),
        (100.0, 0.0, float("inf"), 1.0, None, "garbage"),
    ],
    ids=[
        "a ramp",
        "the same reading twice",
        "time going back",
        "negative watts",
        "a gap too long to guess",
        "an impossible reading",
        "not a number",
        "infinite",
    ],
)
def test_trapezoid(p0: float, t0: float, p1: float, t1: float, joules: float | None, anomaly: str | None) -> None:
    delta = trapezoid(p0, t0, p1, t1, CEILING, 30.0)
    assert delta.anomaly == anomaly
    assert delta.joules == (None if joules is None else pytest.approx(joules))


def z(source: str, zone: str, domain: str, parent: str | None = None, kind: str = "counter") -> ZoneInfo:
    return ZoneInfo(source, zone, domain, kind, parent, None)


RAPL = [
    z("rapl_sysfs", "package-0", "package"),
    z("rapl_sysfs", "core-0", "core", "package-0"),
    z("rapl_sysfs", "dram-0", "dram"),
    z("rapl_sysfs", "package-1", "package"),
    z("rapl_sysfs", "dram-1", "dram"),
]
IPMI = [z("ipmi_dcmi", "chassis", "platform", kind="power")]
REDFISH = [z("redfish", "chassis", "platform", kind="power")]
GPUS = [z("nvml", "gpu-0", "gpu"), z("nvml", "gpu-1", "gpu")]
PSYS = [z("rapl_sysfs", "psys", "psys")]
ORDER = ("rapl_sysfs", "ipmi_dcmi", "ipmi_sdr", "redfish", "nvml")

DELTAS = {
    ("rapl_sysfs", "package-0"): 100.0,
    ("rapl_sysfs", "core-0"): 70.0,
    ("rapl_sysfs", "dram-0"): 10.0,
    ("rapl_sysfs", "package-1"): 90.0,
    ("rapl_sysfs", "dram-1"): 10.0,
    ("rapl_sysfs", "psys"): 260.0,
    ("ipmi_dcmi", "chassis"): 400.0,
    ("redfish", "chassis"): 404.0,
    ("nvml", "gpu-0"): 250.0,
    ("nvml", "gpu-1"): 50.0,
}


@pytest.mark.parametrize(
    ("zones", "includes_gpus", "basis", "node", "domains"),
    [
        (RAPL, False, "rapl_sysfs", 210.0, {"cpu": 190.0, "dram": 20.0, "gpu": 0.0, "other": 0.0}),
        (RAPL + GPUS, False, "rapl_sysfs+nvml", 510.0, {"cpu": 190.0, "dram": 20.0, "gpu": 300.0, "other": 0.0}),
        (RAPL + IPMI, False, "ipmi_dcmi", 400.0, {"cpu": 190.0, "dram": 20.0, "gpu": 0.0, "other": 190.0}),
        (
            RAPL + IPMI + GPUS,
            False,
            "ipmi_dcmi+nvml",
            700.0,
            {"cpu": 190.0, "dram": 20.0, "gpu": 300.0, "other": 190.0},
        ),
        (
            RAPL + IPMI + GPUS,
            True,
            "ipmi_dcmi",
            400.0,
            {"cpu": 190.0 * 400 / 510, "dram": 20.0 * 400 / 510, "gpu": 300.0 * 400 / 510, "other": 0.0},
        ),
        (RAPL + PSYS, False, "rapl_sysfs", 260.0, {"cpu": 190.0, "dram": 20.0, "gpu": 0.0, "other": 50.0}),
        (IPMI + REDFISH, False, "ipmi_dcmi", 400.0, {"cpu": 0.0, "dram": 0.0, "gpu": 0.0, "other": 400.0}),
        (GPUS, False, "nvml", 300.0, {"cpu": 0.0, "dram": 0.0, "gpu": 300.0, "other": 0.0}),
        ([], False, "", 0.0, {"cpu": 0.0, "dram": 0.0, "gpu": 0.0, "other": 0.0}),
    ],
    ids=[
        "RAPL alone: packages plus DRAM, the core sub-zone not added",
        "RAPL and GPUs",
        "a server reading over RAPL, RAPL still splitting cpu and dram",
        "a server reading that excludes the GPUs adds them",
        "a server reading that includes the GPUs, components scaled to fit inside it",
        "psys instead of packages plus DRAM, never both",
        "two server readings: the first in order is the basis",
        "GPUs alone",
        "nothing at all",
    ],
)
def test_split_node(
    zones: list[ZoneInfo], includes_gpus: bool, basis: str, node: float, domains: dict[str, float]
) -> None:
    layout = plan_layout(zones, ORDER, includes_gpus)
    deltas = {k: v for k, v in DELTAS.items() if k in {(x.source, x.zone) for x in zones}}
    split = split_node(layout, deltas)
    assert split.basis == basis
    assert split.node_joules == pytest.approx(node)
    assert split.domains == pytest.approx(domains)
    assert sum(split.domains.values()) == pytest.approx(split.node_joules)


def test_cross_check_inputs_are_reported() -> None:
    layout = plan_layout(RAPL + IPMI + REDFISH, ORDER, False)
    split = split_node(layout, DELTAS)
    assert split.rapl_joules == pytest.approx(210.0)
    assert split.platform_joules == {"ipmi_dcmi": 400.0, "redfish": 404.0}
    assert layout.platform_others == ("redfish",)


def test_order_decides_between_two_server_readings() -> None:
    layout = plan_layout(RAPL + IPMI + REDFISH, ("redfish", "ipmi_dcmi", "rapl_sysfs"), False)
    assert layout.basis == "redfish"
    assert split_node(layout, DELTAS).node_joules == pytest.approx(404.0)
