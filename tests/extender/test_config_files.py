"""The files an extender config names: each checked when the config is loaded, named by its key,
relative to the config file; and ``joulesched extender --check``, which checks them all and stops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from joulesched.contracts.net import free_port
from joulesched.extender import cli
from joulesched.extender.config import load_config
from joulesched.policy.errors import ConfigError

ROOT = Path(__file__).parents[2]
NODES = "nodes:\n  - {name: a, cores: 8, idle_watts: 50, watts_per_core: 4}\n"


def problems_of(config: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(str(config))
    assert caught.value.where == str(config)
    return caught.value.problems


# -- profiles.file.path ------------------------------------------------------------------------------


def test_a_missing_profile_file_is_named_by_its_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("profiles: {file: {path: nope.yaml}}\n", encoding="utf-8")
    assert problems_of(config) == [f"profiles.file.path: {tmp_path / 'nope.yaml'}: cannot read: No such file or directory"]


def test_a_missing_profile_file_is_said_with_the_others_in_one_pass(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("listen: nowhere\nprofiles: {file: {path: nope.yaml}}\n", encoding="utf-8")
    assert [p.split(":")[0] for p in problems_of(config)] == ["listen", "profiles.file.path"]


def test_the_extender_refuses_a_missing_profile_file_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("profiles: {file: {path: nope.yaml}}\n", encoding="utf-8")
    assert cli.main(["--demo", "--config", str(config)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"joulesched extender: {config}: 1 problem",
        f"  profiles.file.path: {tmp_path / 'nope.yaml'}: cannot read: No such file or directory",
    ]


def test_a_profile_file_is_not_asked_for_when_the_source_is_not_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("profiles: {source: prometheus, prometheus: {url: 'http://127.0.0.1:9'}, file: {path: nope.yaml}}\n")
    assert load_config(str(config)).source == "prometheus"


# -- kubeconfig ------------------------------------------------------------------------------------


def test_a_missing_kubeconfig_is_refused_at_load_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("kubeconfig: /nope\npredicted_load: {watch_pods: true}\n", encoding="utf-8")
    assert problems_of(config) == ["kubeconfig: /nope: cannot read: No such file or directory"]


def test_a_kubeconfig_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"kubeconfig: {tmp_path}\n", encoding="utf-8")
    (problem,) = problems_of(config)
    assert problem.startswith(f"kubeconfig: {tmp_path}: cannot read: ")


def test_a_relative_kubeconfig_is_relative_to_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n", encoding="utf-8")
    (tmp_path / "etc" / "c.yaml").write_text("kubeconfig: kubeconfig\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # not the config's folder: a path relative to here would not be there
    assert load_config("etc/c.yaml").kubeconfig == str(Path("etc") / "kubeconfig")
    (tmp_path / "etc" / "c.yaml").write_text("kubeconfig: etc/kubeconfig\n", encoding="utf-8")
    assert problems_of(Path("etc/c.yaml")) == [f"kubeconfig: {Path('etc/etc/kubeconfig')}: cannot read: No such file or directory"]


def test_the_extender_stops_at_once_on_a_missing_kubeconfig(tmp_path: Path) -> None:
    # it used to start and retry "Invalid kube-config file" for ever
    config = tmp_path / "c.yaml"
    config.write_text("kubeconfig: /nope\npredicted_load: {watch_pods: true}\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "joulesched", "extender", "--config", str(config), "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"joulesched extender: {config}: 1 problem",
        "  kubeconfig: /nope: cannot read: No such file or directory",
    ]


# -- --check ---------------------------------------------------------------------------------------


def check(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.setattr(cli, "serve", lambda *a, **k: pytest.fail("--check served"))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    code = cli.main(["--check", *argv])
    out, err = capsys.readouterr()
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ  # no metrics folder made for a server it never starts
    return code, out, err


def test_check_passes_the_shipped_config_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = check(["--config", str(ROOT / "deploy" / "extender" / "config.yaml")], monkeypatch, capsys)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"joulesched extender --check: ok: {ROOT / 'deploy' / 'extender' / 'config.yaml'}; profiles from Prometheus at"
        " http://prometheus-operated.monitoring.svc:9090 (not contacted); HTTP on 0.0.0.0:8888; Kubernetes API through"
        " the in-cluster service account (not checked here); 1 worker"
    ]


def test_check_reads_and_counts_the_profile_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.yaml").write_text(NODES, encoding="utf-8")
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\n", encoding="utf-8")
    (tmp_path / "c.yaml").write_text(
        "profiles: {file: {path: nodes.yaml}}\nkubeconfig: kubeconfig\npredicted_load: {watch_pods: true}\n", encoding="utf-8"
    )
    code, out, err = check(["--config", str(tmp_path / "c.yaml"), "--workers", "2"], monkeypatch, capsys)
    assert (code, err) == (0, "")
    assert out == (
        f"joulesched extender --check: ok: {tmp_path / 'c.yaml'}; 1 node profiles from {tmp_path / 'nodes.yaml'};"
        f" HTTP on 0.0.0.0:8888; kubeconfig {tmp_path / 'kubeconfig'}; 2 workers\n"
    )


def test_check_says_when_profiles_would_be_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.yaml").write_text(NODES.replace("}", ", updated: 1764400000.0}"), encoding="utf-8")
    (tmp_path / "c.yaml").write_text("profiles: {file: {path: nodes.yaml}}\n", encoding="utf-8")
    code, out, _ = check(["--config", str(tmp_path / "c.yaml")], monkeypatch, capsys)
    assert code == 0
    assert "1 node profiles from" in out and "(1 with an `updated` time over 120 s old now: they would score neutral)" in out


def test_check_lists_every_problem_of_a_broken_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "profiles: {file: {path: nope.yaml}}\nkubeconfig: /nope\nserver: {tls: {cert_file: c.pem, key_file: k.pem}}\npolicy: {band: 0}\n",
        encoding="utf-8",
    )
    code, out, err = check(["--config", str(config)], monkeypatch, capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"joulesched extender: {config}: 5 problems",
        "  policy.band: must be > 0, got 0",
        f"  profiles.file.path: {tmp_path / 'nope.yaml'}: cannot read: No such file or directory",
        "  kubeconfig: /nope: cannot read: No such file or directory",
        f"  server.tls.cert_file: {tmp_path / 'c.pem'}: cannot read: No such file or directory",
        f"  server.tls.key_file: {tmp_path / 'k.pem'}: cannot read: No such file or directory",
    ]


def test_check_lists_the_problems_of_the_profile_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.yaml").write_text("nodes:\n  - {name: a, cores: 0, idle_watts: 50, watts_per_core: 4}\n", encoding="utf-8")
    (tmp_path / "c.yaml").write_text("profiles: {file: {path: nodes.yaml}}\n", encoding="utf-8")
    code, out, err = check(["--config", str(tmp_path / "c.yaml")], monkeypatch, capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"joulesched extender: {tmp_path / 'nodes.yaml'}: 1 problem", "  nodes[0].cores: must be > 0, got 0"]


def test_check_checks_the_flags_too(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = check(["--listen", "nowhere"], monkeypatch, capsys)
    assert (code, out) == (2, "")
    assert "listen: must be HOST:PORT" in err


def test_check_is_not_with_demo(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--check", "--demo"])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "joulesched extender: error: argument --check: not with --demo"


def test_check_as_a_user_runs_it_starts_nothing(tmp_path: Path) -> None:
    # a config that would serve on a port taken by nobody: --check returns at once, and nothing listens
    (tmp_path / "c.yaml").write_text("listen: 127.0.0.1:1\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "joulesched", "extender", "--check", "--config", str(tmp_path / "c.yaml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"joulesched extender --check: ok: {tmp_path / 'c.yaml'}; 6 node profiles from ")
    assert len(done.stdout.splitlines()) == 1 and "Booting worker" not in done.stderr and "Listening" not in done.stderr


# -- profiles.prometheus.selector ----------------------------------------------------------------------


@pytest.mark.parametrize("selector", ['job="joulesched-agent"', 'job="a",namespace=~"joulesched.*"', ' job = "a\\"b" , ', ""])
def test_a_selector_of_label_matchers_is_taken(tmp_path: Path, selector: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"profiles: {{source: prometheus, prometheus: {{url: 'http://p:9090', selector: '{selector}'}}}}\n")
    assert load_config(str(config)).prometheus_selector == selector


@pytest.mark.parametrize("selector", ["job=a", '}) or vector(1', 'job="a"} or up{', "job"])
def test_a_selector_that_is_not_label_matchers_is_named(tmp_path: Path, selector: str) -> None:
    # It goes into the queries as it is: anything but matchers would change what they ask.
    config = tmp_path / "c.yaml"
    config.write_text(f"profiles: {{source: prometheus, prometheus: {{url: 'http://p:9090', selector: '{selector}'}}}}\n")
    (problem,) = problems_of(config)
    assert problem.startswith("profiles.prometheus.selector: must be PromQL label matchers"), problem
