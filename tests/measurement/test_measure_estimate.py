"""``joulesched measure`` where no energy counter can be read: the estimate from CPU time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from joulesched.measurement.cli import NO_COUNTER, ROOT_HINT, _hint, measure_main
from joulesched.measurement.estimate import (
    DEFAULT_WATTS_PER_VCPU,
    CpuInfo,
    estimate,
    load_table,
    model_key,
    rate_for,
    read_cpuinfo,
)
from tests.measurement.replica import PowercapTree, ProcTree

GOLD_6252 = "Intel(R) Xeon(R) Gold 6252 CPU @ 2.10GHz"
UNKNOWN = "Intel(R) Xeon(R) Processor @ 2.60GHz"  # what many cloud VMs show
# Burns ~0.3 s of CPU, then writes the CPU time the child itself counted.
BUSY = """
import sys, time
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
open(sys.argv[1], "w").write(repr(time.process_time()))
"""


def flags(tmp_path: Path) -> list[str]:
    return [f"--{name}-root={tmp_path / name}" for name in ("sysfs", "procfs", "cgroup", "dev")]


def replica(tmp_path: Path, model_name: str, flags_line: str = "fpu hypervisor") -> Path:
    ProcTree(tmp_path / "procfs").set_cpuinfo("GenuineIntel", 6, 85, model_name=model_name, flags=flags_line)
    return tmp_path


@pytest.mark.parametrize(
    ("name", "key"),
    [
        (GOLD_6252, "xeongold6252"),
        ("Intel Xeon Gold 6252", "xeongold6252"),
        ("AMD EPYC 7763 64-Core Processor", "epyc7763"),
        ("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", "corei78700"),
        ("13th Gen Intel(R) Core(TM) i7-1360P", "corei71360p"),
        ("11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", "corei71165g7"),
        ("6th Gen A10-8700P APU", "6thgena108700papu"),  # AMD's generation stays, as the table's key has it
        (UNKNOWN, ""),
        ("", ""),
    ],
)
def test_model_key(name: str, key: str) -> None:
    assert model_key(name) == key


def test_an_intel_core_named_with_its_generation_finds_its_tdp_row() -> None:
    """/proc/cpuinfo of a 13th-generation laptop says "13th Gen Intel(R) Core(TM) i7-1360P"; its
    row is "Intel Core i7-1360P" (28 W). The generation kept, it was "not in the table" and got
    the 3.81 W/vCPU default."""
    cpu = CpuInfo("13th Gen Intel(R) Core(TM) i7-1360P", 16, 16, False)
    e = estimate(100.0, cpu)
    assert e.rate.source == "tdp" and e.rate.watts_per_thread == pytest.approx(28.0 / 16)
    assert e.joules == pytest.approx(175.0)


def test_every_table_key_is_its_model_reduced_as_a_cpu_name_is() -> None:
    """The table's keys were made by model_key: a change to it must not lose a row (the rows
    without a model name are SPECpower's, keyed by their CPU description)."""
    rows = [r for r in load_table().values() if r.model]
    assert rows and all(model_key(r.model) == r.key for r in rows), [
        (r.key, r.model) for r in rows if model_key(r.model) != r.key
    ][:5]


def test_read_cpuinfo_from_a_replica(tmp_path: Path) -> None:
    replica(tmp_path, GOLD_6252)
    assert read_cpuinfo(tmp_path / "procfs") == CpuInfo(GOLD_6252, 4, 4, True)
    assert read_cpuinfo(tmp_path / "nowhere") == CpuInfo("", 0, 0, False)


def test_a_model_with_specpower_results_uses_them() -> None:
    row = load_table()["xeongold6252"]
    assert row.tdp_watts == 150 and row.threads_per_chip == 48 and row.specpower_watts_per_thread
    rate = rate_for(CpuInfo(GOLD_6252, 2, 2, True))
    assert rate.source == "specpower" and rate.watts_per_thread == row.specpower_watts_per_thread
    assert "SPECpower" in rate.method and GOLD_6252 in rate.method


def test_a_model_with_a_tdp_only_uses_tdp_per_thread_on_bare_metal_and_the_default_on_a_vm() -> None:
    name = "Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz"
    assert load_table()["corei78700"].specpower_watts_per_thread is None
    bare = rate_for(CpuInfo(name, 12, 12, False))
    assert bare.source == "tdp" and bare.watts_per_thread == pytest.approx(65 / 12)
    assert "TDP/threads" in bare.method and "65 W / 12 threads (/proc/cpuinfo)" in bare.method
    vm = rate_for(CpuInfo(name, 2, 2, True))
    assert vm.source == "default" and vm.watts_per_thread == DEFAULT_WATTS_PER_VCPU


def test_an_unknown_model_uses_the_documented_default() -> None:
    rate = rate_for(CpuInfo(UNKNOWN, 2, 2, True))
    assert rate.source == "default" and rate.watts_per_thread == DEFAULT_WATTS_PER_VCPU == 3.81
    assert "not in the table" in rate.method and "Cloud Carbon Footprint" in rate.method
    assert estimate(2.0, CpuInfo(UNKNOWN, 2, 2, True)).joules == pytest.approx(7.62)


def test_the_estimate_is_the_commands_cpu_time_times_the_tables_watts(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    replica(tmp_path, GOLD_6252)
    own, out = tmp_path / "own-cpu-seconds", tmp_path / "result.json"
    argv = [*flags(tmp_path), "--intensity", "400", "--output", str(out), "--", sys.executable, "-c", BUSY, str(own)]
    assert measure_main(argv) == 0
    result = json.loads(out.read_text())
    child_counted = float(own.read_text())
    watts = load_table()["xeongold6252"].specpower_watts_per_thread
    assert result["estimated"] is True and result["basis"] == "estimate"
    assert result["estimate"]["source"] == "specpower" and "Xeon(R) Gold 6252" in result["method"]
    # rusage counts what the child counted itself, plus its exit: a few milliseconds more.
    assert child_counted - 0.01 <= result["cpu_seconds"] <= child_counted + 0.1
    assert result["joules"]["node"] == pytest.approx(result["cpu_seconds"] * watts)
    assert result["estimate"]["joules"] == result["joules"]["node"]
    assert result["impact"]["co2e_grams"] == pytest.approx(result["joules"]["node"] / 3.6e6 * 400)
    err = capfd.readouterr().err
    assert "ESTIMATED energy:" in err and "method: CPU time × 4.51 W per hardware thread" in err
    assert "CO2e (estimated):" in err and "at 400 gCO2e/kWh (--intensity)" in err


def test_no_counter_prints_the_estimate_its_method_co2e_and_what_to_do(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    replica(tmp_path, UNKNOWN)
    assert measure_main([*flags(tmp_path), "--intensity", "250", "--", sys.executable, "-c", "pass"]) == 0
    err = capfd.readouterr().err
    assert "ESTIMATED energy:" in err and " J = " in err and " Wh" in err
    assert "method: CPU time × 3.81 W per vCPU, Cloud Carbon Footprint's average for an unknown CPU" in err
    assert "CPU time: " in err and "CO2e (estimated): " in err
    assert NO_COUNTER in err and "agent as root" not in err and "DaemonSet" not in err


def test_co2e_and_water_from_a_site_file(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    replica(tmp_path, UNKNOWN)
    site = tmp_path / "site.yaml"
    site.write_text("sites:\n  lab: {pue: 1.5, wue: 0.4, carbon_intensity: 100}\n")
    out = tmp_path / "r.json"
    argv = [*flags(tmp_path), "--site", str(site), "--json", "--output", str(out), "--", sys.executable, "-c", "pass"]
    assert measure_main(argv) == 0
    result = json.loads(out.read_text())
    kwh = result["joules"]["node"] / 3.6e6
    assert result["impact"]["co2e_grams"] == pytest.approx(kwh * 1.5 * 100)
    assert result["impact"]["water_litres"] == pytest.approx(kwh * 0.4)
    assert json.loads(capfd.readouterr().err)["impact"]["from"] == f"site lab in {site}"


def test_a_site_file_with_several_sites_needs_a_name(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    replica(tmp_path, UNKNOWN)
    site = tmp_path / "site.yaml"
    site.write_text("sites:\n  a: {carbon_intensity: 1}\n  b: {carbon_intensity: 2}\n")
    ran = tmp_path / "ran"
    command = ["--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    with pytest.raises(SystemExit) as exit_:
        measure_main([*flags(tmp_path), "--site", str(site), *command])
    assert exit_.value.code == 2 and "choose one with --site-name (a, b)" in capfd.readouterr().err
    assert measure_main([*flags(tmp_path), "--site", str(site), "--site-name", "b", "--", "true"]) == 0
    assert "at 2 gCO2e/kWh (site b in" in capfd.readouterr().err
    assert not ran.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--site", "{missing}"], "--site {missing}: 1 problem"),
        (["--site", "{site}", "--site-name", "c"], "--site-name 'c': no such site in {site} (sites: a)"),
        (["--site-name", "a"], "--site-name needs --site FILE"),
    ],
    ids=["no such file", "no such site", "a name without a file"],
)
def test_a_bad_site_stops_measure_before_the_command_runs(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    # The CO2e figure of a run of hours must not be lost to a typo found only at its end.
    replica(tmp_path, UNKNOWN)
    site = tmp_path / "site.yaml"
    site.write_text("sites:\n  a: {carbon_intensity: 1}\n")
    ran = tmp_path / "ran"
    where = {"site": str(site), "missing": str(tmp_path / "missing.yaml")}
    argv = [*flags(tmp_path), *(a.format(**where) for a in args), "--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    with pytest.raises(SystemExit) as exit_:
        measure_main(argv)
    assert exit_.value.code == 2
    assert message.format(**where) in capfd.readouterr().err
    assert not ran.exists()


def test_real_counters_are_not_labelled_estimated(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    PowercapTree(tmp_path / "sysfs").add("intel-rapl:0", "package-0", energy_uj=1_000_000)
    replica(tmp_path, GOLD_6252)
    out = tmp_path / "r.json"
    argv = [*flags(tmp_path), "--intensity", "400", "--output", str(out), "--", sys.executable, "-c", "pass"]
    assert measure_main(argv) == 0
    err = capfd.readouterr().err
    assert "(basis: rapl_sysfs)" in err and "estimated" not in err.lower() and NO_COUNTER not in err
    assert "CO2e: 0 g at 400 gCO2e/kWh (--intensity)" in err
    result = json.loads(out.read_text())
    assert result["estimated"] is False and result["estimate"] is None and result["method"] == "counters: rapl_sysfs"


def test_a_permission_error_tells_the_scientist_to_use_sudo() -> None:
    message = "rapl zone (/sys/class/powercap/intel-rapl:0/energy_uj): permission denied — run the agent as root"
    assert _hint(message) == f"rapl zone (/sys/class/powercap/intel-rapl:0/energy_uj): permission denied — {ROOT_HINT}"


def test_intensity_and_site_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as err:
        measure_main([*flags(tmp_path), "--intensity", "1", "--site", "x.yaml", "--", "true"])
    assert err.value.code == 2


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "lots"])
def test_intensity_must_be_a_plausible_number(tmp_path: Path, value: str) -> None:
    with pytest.raises(SystemExit):
        measure_main([*flags(tmp_path), "--intensity", value, "--", "true"])
