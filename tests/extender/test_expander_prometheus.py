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


def test_unreachable_prometheus_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--prometheus", "http://127.0.0.1:9", "--timeout", "0.5", "--group-from-name", "^(.*)$"]) == 2
    assert "prometheus http://127.0.0.1:9" in capsys.readouterr().err
