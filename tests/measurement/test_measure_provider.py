"""``joulesched measure`` on a VM with no counter: the provider's figures from the NADIKI side.

The provider half is real (tests/nadiki_tenant.py: the agent's RegistrarClient and Pusher into
Debian's influxd); the VM is a replica /proc without powercap. The server draws a constant
300 W, so its energy over the command's span is exactly 300 W × the span.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from joulesched.measurement.cli import measure_main
from tests.measurement.replica import ProcTree
from tests.nadiki_tenant import BUCKET, Host, Provider, provider

FLAT = Host("FAC-1", "RACK-9", base_watts=300.0, swing_watts=0.0, rated_kw=0.5)
UNKNOWN = "Intel(R) Xeon(R) Processor @ 2.60GHz"


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    now = time.time()
    with provider(tmp_path_factory.mktemp("vm"), [FLAT], now - 120.0, now + 900.0) as p:  # windows ahead: slow runs
        yield p


def vm(tmp_path: Path) -> list[str]:
    proc = ProcTree(tmp_path / "procfs", cpus=4)
    proc.set_cpuinfo("GenuineIntel", 6, 85, model_name=UNKNOWN, flags="fpu hypervisor")
    proc.set_stat(100.0, 1000.0)
    return [f"--{name}-root={tmp_path / name}" for name in ("sysfs", "procfs", "cgroup", "dev")]


def nadiki(side: Provider, server_id: str | None = None) -> list[str]:
    (sid,) = side.servers
    return [
        *("--server-id", server_id or sid, "--nadiki-registrar", side.registrar_url),
        *("--nadiki-influx", side.influx.url, "--nadiki-database", BUCKET),
    ]


def test_a_vm_without_counters_uses_the_providers_figures(
    side: Provider, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "result.json"
    argv = [
        *vm(tmp_path),
        *nadiki(side),
        "--intensity",
        "200",
        "--output",
        str(out),
        "--",
        sys.executable,
        "-c",
        "pass",
    ]
    assert measure_main(argv) == 0
    result = json.loads(out.read_text())
    figure = result["provider"]
    span = result["end"] - result["start"]
    assert result["basis"] == "provider" and result["estimated"] is False
    assert figure["server_joules"] == pytest.approx(300.0 * span, rel=1e-9)
    assert figure["share"] == 4 / 64  # 4 vCPUs of 2 × 16 cores × 2 threads
    # the replica VM was otherwise idle (/proc/stat did not move): the command is the VM's whole part
    assert figure["cpu_fraction"] == 1.0
    assert result["joules"]["node"] == pytest.approx(300.0 * span * 4 / 64, rel=1e-9)
    assert result["impact"]["co2e_grams"] == pytest.approx(result["joules"]["node"] / 3.6e6 * 200)
    err = capfd.readouterr().err
    assert "PROVIDER'S FIGURES energy:" in err and "CO2e (provider's figures):" in err
    assert "this VM's 4 vCPUs ÷ the server's 32 cores × 2 threads" in err


def test_the_providers_per_vm_figure_replaces_the_vcpu_share(side: Provider, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    argv = [*vm(tmp_path), *nadiki(side), "--vm-share", "0.5", "--output", str(out), "--", sys.executable, "-c", "pass"]
    assert measure_main(argv) == 0
    result = json.loads(out.read_text())
    assert result["provider"]["share"] == 0.5
    assert "the provider's figure (--vm-share)" in result["method"]


def test_an_unknown_server_falls_back_to_the_estimate_and_says_why(
    side: Provider, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "result.json"
    argv = [*vm(tmp_path), *nadiki(side, "SERVER-NOWHERE"), "--output", str(out), "--", sys.executable, "-c", "pass"]
    assert measure_main(argv) == 0
    result = json.loads(out.read_text())
    assert result["estimated"] is True and result["provider"] is None
    err = capfd.readouterr().err
    assert "provider's figures: the provider's registrar does not describe server SERVER-NOWHERE" in err
    assert "estimated from CPU time instead" in err and "ESTIMATED energy:" in err


def test_the_provider_flags_need_each_other(side: Provider, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        measure_main([*vm(tmp_path), "--server-id", "S", "--", "true"])
    assert "--server-id needs --nadiki-registrar, --nadiki-influx, --nadiki-database" in capfd.readouterr().err
    with pytest.raises(SystemExit):
        measure_main([*vm(tmp_path), "--vm-share", "0.5", "--", "true"])
    assert "need --server-id ID" in capfd.readouterr().err


def test_provider_urls_with_credentials_in_them_are_refused_without_repeating_them(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    flags = ["--server-id", "S", "--nadiki-database", "db", "--nadiki-registrar", "https://registry.example/v1"]
    with pytest.raises(SystemExit):
        measure_main([*vm(tmp_path), *flags, "--nadiki-influx", "https://tenant:INFLUX-PASSWORD@influx.example", "--", "true"])
    err = capfd.readouterr().err
    assert "--nadiki-influx: must not carry credentials" in err and "use --nadiki-user and --nadiki-password-file" in err
    assert "INFLUX-PASSWORD" not in err


def test_the_influxdb_password_over_plain_http_off_loopback_needs_allow_plain_http(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    password = tmp_path / "password"
    password.write_text("INFLUX-PASSWORD\n")
    flags = ["--server-id", "S", "--nadiki-database", "db", "--nadiki-registrar", "https://registry.example/v1",
             "--nadiki-influx", "http://192.0.2.2:8086", "--nadiki-password-file", str(password)]
    with pytest.raises(SystemExit):
        measure_main([*vm(tmp_path), *flags, "--", "true"])
    err = capfd.readouterr().err
    assert "--nadiki-influx: http:// would send the InfluxDB password (--nadiki-password-file) in cleartext to 192.0.2.2" in err
    assert "--allow-plain-http" in err and "INFLUX-PASSWORD" not in err


def test_windows_not_pushed_yet_are_waited_for_then_named(side: Provider) -> None:
    from joulesched.contracts.nadiki_read import InfluxReader, RegistrarReader
    from joulesched.measurement.provider_figures import ProviderAccess, ProviderFiguresUnavailable, provider_energy

    (sid,) = side.servers
    access = ProviderAccess(RegistrarReader(side.registrar_url), InfluxReader(side.influx.url, BUCKET), sid, wait_s=20)
    clock = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    later = time.time() + 3600.0  # nothing pushed there
    with pytest.raises(ProviderFiguresUnavailable, match="has not pushed every 30-second window") as err:
        provider_energy(access, later, later + 5, 1.0, 1.0, 4, clock=lambda: clock[0], sleep=sleep)
    assert "--provider-wait" in str(err.value)
    assert sum(slept) >= 20 and all(s <= 5 for s in slept)
