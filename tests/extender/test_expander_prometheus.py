"""`joulesched expander --prometheus`: profiles from the agents' metrics in a real Prometheus."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from joulesched.contracts import names as m
from joulesched.extender.expander import main
from tests.extender.test_prometheus_source import AGENTS
from tests.prometheus_server import ExpositionServer, PrometheusServer, prometheus_scraping

pytestmark = pytest.mark.prometheus


@pytest.fixture
def prom(tmp_path: Path) -> Iterator[tuple[PrometheusServer, ExpositionServer]]:
    yield from prometheus_scraping(tmp_path, AGENTS)


def test_ranks_the_groups_prometheus_reports(tmp_path: Path, prom: tuple[PrometheusServer, ExpositionServer]) -> None:
    server, _ = prom
    server.wait_for(m.MODEL_PER_CORE.name, 2)
    server.wait_for(m.SITE_CARBON.name, 2)
    out = tmp_path / "cm.yaml"
    # green: 60 W + 3 W per busy core, grey: 120 W + 6 W ("half" has no model yet: not ranked)
    assert main(["--prometheus", server.url, "--group-from-name", "^(.*)$", "--output", str(out)]) == 0
    prios = yaml.safe_load(yaml.safe_load(out.read_text())["data"]["priorities"])
    assert prios == {20: ["^green$"], 10: ["^grey$"], 1: [".*"]}
    # deploy/'s selector reads the agents' job (the test Prometheus's, as deploy/agent's) ...
    argv = ["--prometheus", server.url, "--group-from-name", "^(.*)$", "--output", str(out)]
    assert main([*argv, "--prometheus-selector", 'job="joulesched-agent"']) == 0
    assert yaml.safe_load(yaml.safe_load(out.read_text())["data"]["priorities"]) == prios
    # ... and nothing of another job's
    assert main([*argv, "--prometheus-selector", 'job="tenant-app"']) == 2


@pytest.mark.parametrize(("argv", "said"), [
    (["--prometheus-selector", "job=a"], "--prometheus-selector: must be PromQL label matchers"),
    (["--prometheus-selector", '"}) or vector(1'], "--prometheus-selector: must be PromQL label matchers"),
])
def test_a_selector_that_is_not_label_matchers_is_refused(capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--prometheus", "http://127.0.0.1:9", "--group-from-name", "^(.*)$", *argv])
    assert done.value.code == 2 and said in capsys.readouterr().err


def test_unreachable_prometheus_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--prometheus", "http://127.0.0.1:9", "--timeout", "0.5", "--group-from-name", "^(.*)$"]) == 2
    assert "prometheus http://127.0.0.1:9" in capsys.readouterr().err
