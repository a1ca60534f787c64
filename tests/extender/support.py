from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from joulesched.extender.app import create_app
from joulesched.extender.config import ExtenderConfig, parse_config
from joulesched.extender.metrics import ExtenderMetrics
from tests.support import Clock

CURVE = [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]
XEON = [127, 198, 226, 253, 281, 314, 354, 405, 464, 576, 619]

PROFILES: dict[str, Any] = {
    "sites": {"clean": {"pue": 1.1, "carbon_intensity": 55}, "dirty": {"pue": 1.5, "carbon_intensity": 440}},
    "nodes": [
        {"name": "efficient", "site": "clean", "cores": 64, "power_curve_watts": CURVE, "utilisation": 0.3},
        {"name": "hungry", "site": "dirty", "cores": 80, "power_curve_watts": XEON, "utilisation": 0.3},
        {
            "name": "capped",
            "site": "clean",
            "cores": 64,
            "power_curve_watts": CURVE,
            "utilisation": 0.9,
            "measured_watts": 255,
            "power_cap_watts": 265,
        },
    ],
}


def make_pod(cpu: str = "4", uid: str = "uid-1", name: str = "p1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
    }


def make_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "64", "memory": "128Gi", "pods": "110"}},
    }


@pytest.fixture
def profiles_file(tmp_path: Path) -> Path:
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(PROFILES))
    return path


@pytest.fixture
def make_app(profiles_file: Path) -> Callable[..., tuple[Flask, ExtenderMetrics]]:
    def build(extra: dict[str, Any] | None = None, clock: Clock | None = None) -> tuple[Flask, ExtenderMetrics]:
        doc = {"profiles": {"file": {"path": str(profiles_file)}}, **(extra or {})}
        config: ExtenderConfig = parse_config(doc, "test")
        metrics = ExtenderMetrics(CollectorRegistry())
        app = create_app(config, metrics=metrics, clock=clock or Clock(), background=False)
        return app, metrics

    return build


@pytest.fixture
def client(make_app: Callable[..., tuple[Flask, ExtenderMetrics]]) -> FlaskClient:
    app, _ = make_app()
    return app.test_client()


def post(client: FlaskClient, verb: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    reply = client.post(f"/scheduler/{verb}", data=data, content_type="application/json")
    return reply.status_code, orjson.loads(reply.data) if reply.data else None
