"""deploy/prometheus: generated files up to date, promtool's checks and unit tests, the kustomization."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from joulesched.contracts import names as n
from joulesched.impact import rules
from tests.prometheus_server import require

DIR = rules.REPOSITORY_OUTPUT
RULES = DIR / "rules.yaml"
KSM_METRICS = {"kube_pod_owner", "kube_pod_labels", "kube_replicaset_owner"}  # kube-state-metrics
PROMQL_WORDS = {
    "sum", "max", "by", "on", "group_left", "increase", "rate", "avg_over_time", "label_replace",
    "sum_over_time", "histogram_quantile", "without", "ignoring", "group_right", "min", "and", "or", "unless",
}  # fmt: skip


def series_read(expr: str) -> set[str]:
    """The metric names an expression selects (labels, strings, numbers and functions removed)."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"(?<![a-zA-Z_:])\d+(\.\d+)?(e\d+)?", " ", expr)
    words = {
        m.group()
        for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
        if not expr[m.end() :].lstrip().startswith("(")
    }
    return words - PROMQL_WORDS


def test_generated_files_are_up_to_date() -> None:
    assert rules.main(["--check"]) == 0, "run: joulesched rules"


def test_promtool_accepts_the_rules() -> None:
    promtool = require("promtool")
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 31 rules found" in done.stdout


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    promtool = require("promtool")
    done = subprocess.run([promtool, "test", "rules", "rules_test.yaml"], cwd=DIR, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_prometheusrule_carries_the_same_groups() -> None:
    rules = yaml.safe_load(RULES.read_text())
    rule = yaml.safe_load((DIR / "operator" / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == rules["groups"]


def test_rule_names_follow_level_metric_operations_and_read_only_known_metrics() -> None:
    known = {m.name for m in n.METRICS} | KSM_METRICS
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            assert re.fullmatch(r"[a-z_]+:joulesched_[a-z_]+:[a-z0-9_]+", rule["record"]), rule["record"]
            words = series_read(rule["expr"])
            for word in words:
                assert word in known, f"{rule['record']} reads {word}, which contracts/names.py does not define"
            assert ":" not in "".join(words), (
                f"{rule['record']} reads another rule (backfilling needs them independent)"
            )


def test_every_factor_gauge_is_joined_into_the_rules() -> None:
    text = RULES.read_text()
    for metric in (
        n.POD_ENERGY,
        n.NODE_DOMAIN_ENERGY,
        n.NODE_INFO,
        n.SITE_PUE,
        n.SITE_CARBON,
        n.SITE_WUE,
        n.SITE_RENEWABLE,
        n.SERVER_EMBODIED,
        n.SERVER_LIFETIME,
    ):
        assert metric.name in text
    assert "joulesched_node_power_watts" not in text and "_watts" not in text.replace("sum_rate5m", ""), (
        "never power × interval"
    )


def test_the_kustomization_renders_the_rules_and_dashboard_configmaps() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (kustomize is checked in tests/e2e too)")
    done = subprocess.run([kubectl, "kustomize", str(DIR)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    objects = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(done.stdout)}
    configmap = objects["joulesched-prometheus-rules"]
    assert configmap["kind"] == "ConfigMap" and configmap["metadata"]["namespace"] == "joulesched"
    assert configmap["data"]["joulesched-impact.rules.yaml"] == RULES.read_text()
    dashboard = objects["joulesched-grafana-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["joulesched.json"] == (DIR / "dashboard.json").read_text()
    operator = subprocess.run([kubectl, "kustomize", str(DIR / "operator")], capture_output=True, text=True)
    assert operator.returncode == 0, operator.stderr
    assert yaml.safe_load(operator.stdout)["kind"] == "PrometheusRule"


def test_rules_write_where_they_are_told(tmp_path) -> None:
    assert rules.main(["--output-dir", str(tmp_path)]) == 0
    assert (tmp_path / "rules.yaml").read_text() == RULES.read_text()
    assert rules.main(["--check", "--output-dir", str(tmp_path)]) == 0
    (tmp_path / "dashboard.json").write_text("{}")
    assert rules.main(["--check", "--output-dir", str(tmp_path)]) == 1


def test_an_installed_joulesched_needs_an_output_dir(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(rules, "REPOSITORY_OUTPUT", tmp_path / "site-packages" / "deploy" / "prometheus")
    assert rules.main([]) == 2
    assert "give --output-dir" in capsys.readouterr().err
    assert not (tmp_path / "site-packages").exists()
