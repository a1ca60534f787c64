"""The images deploy/ runs, built from the Containerfile with podman, as an operator runs them.

``hack/build-image.sh --offline`` builds both targets on a base made with mmdebstrap (no image
is pulled). The extender image then runs as a container would in the cluster — non-root, a
read-only root filesystem, its config and profiles mounted read-only — and answers the
prioritize request kube-scheduler v1.37.2 sent in the e2e tests (``tests/e2e/testdata``); the
agent image carries ipmitool and FreeIPMI.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from joulesched.contracts.net import free_port
from tests.images import RUN, built_images, podman

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "e2e" / "testdata" / "extender_prioritize_args_nodecachecapable_true.json"
EFFICIENT = [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]
HUNGRY = [127, 198, 226, 253, 281, 314, 354, 405, 464, 576, 619]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    return built_images()[0]


def test_the_images_run_as_the_unprivileged_user(images: dict[str, str]) -> None:
    for image in images.values():
        done = podman("run", "--rm", *RUN, "--entrypoint", "id", image)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[0] == "uid=65532(65532)", done.stdout
        inspect = podman("image", "inspect", "--format", "{{.Config.User}} {{.Size}}", image)
        user, size = inspect.stdout.split()
        assert user == "65532:65532"
        print(f"{image}: {int(size) / 1e6:.0f} MB")
    tools = podman("run", "--rm", *RUN, "--entrypoint", "sh", images["agent"], "-c", "ipmitool -V && ipmi-dcmi --version")
    assert tools.returncode == 0 and "ipmitool version" in tools.stdout and "ipmi-dcmi" in tools.stdout, tools


def test_the_extender_image_answers_kube_scheduler(images: dict[str, str], tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    a, b = golden["NodeNames"]
    profiles = {
        "sites": {"dc": {"pue": 1.2, "carbon_intensity": 300}},
        "nodes": [
            {"name": a, "site": "dc", "cores": 64, "power_curve_watts": EFFICIENT, "utilisation": 0.3},
            {"name": b, "site": "dc", "cores": 64, "power_curve_watts": HUNGRY, "utilisation": 0.3},
        ],
    }
    shipped = yaml.safe_load((ROOT / "deploy" / "extender" / "config.yaml").read_text())
    shipped["profiles"] = {"source": "file", "file": {"path": "/etc/joulesched/nodes.yaml"}}
    shipped.setdefault("predicted_load", {})["watch_pods"] = False
    port = free_port()
    shipped["listen"] = f"127.0.0.1:{port}"
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    (config_dir / "config.yaml").write_text(yaml.safe_dump(shipped))
    (config_dir / "nodes.yaml").write_text(yaml.safe_dump(profiles))
    config_dir.chmod(0o755)
    for f in config_dir.iterdir():
        f.chmod(0o644)
    name = f"joulesched-image-test-{port}"
    started = podman(
        "run", "-d", "--name", name, *RUN, "--network", "host", "--read-only",
        "--tmpfs", "/tmp:rw,size=64m", "-v", f"{config_dir}:/etc/joulesched:ro", images["extender"],
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        url = f"http://127.0.0.1:{port}/scheduler/prioritize"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                logs = podman("logs", name)
                pytest.fail(f"the extender container never became ready:\n{logs.stdout}\n{logs.stderr}")
            time.sleep(0.5)
        request = urllib.request.Request(
            url, data=json.dumps(golden).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert reply.status == 200
            scores = {h["Host"]: h["Score"] for h in json.loads(reply.read())}
        assert scores == {a: 10, b: 0}, scores
        who = podman("exec", name, "id", "-u")
        assert who.stdout.strip() == "65532"
    finally:
        podman("rm", "-f", name)
    assert name not in podman("ps", "-a", "--format", "{{.Names}}").stdout
