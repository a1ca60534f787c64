"""docs/install.md's registry overlay, rendered with the real kustomize (``kubectl kustomize``).

The overlay in "Your registry" is taken from the doc as written, so the doc and the check cannot
drift apart: every joulesched container in ``deploy/`` must take the overlay's image names and
keep its tag, and kube-scheduler's image must be left alone.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_chart import kubectl_binary

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "install.md"


def doc_overlay() -> dict[str, Any]:
    text = DOC.read_text()
    section = text.split("### Your registry", 1)
    assert len(section) == 2, 'docs/install.md has no "### Your registry" section'
    block = re.search(r"```yaml\n(.*?)```", section[1], re.S)
    assert block is not None, 'docs/install.md, "Your registry": no yaml block'
    overlay: dict[str, Any] = yaml.safe_load(block.group(1))
    assert overlay["resources"] == ["../joulesched/deploy"], overlay["resources"]
    return overlay


def containers(objs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for o in objs:
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            out.append((f"{o['kind']}/{o['metadata']['name']}/{c['name']}", c["image"]))
    return out


def render(overlay_dir: Path) -> list[dict[str, Any]]:
    r = subprocess.run([kubectl_binary(), "kustomize", str(overlay_dir)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def test_the_documented_registry_overlay_moves_every_joulesched_image(tmp_path: Path) -> None:
    overlay = doc_overlay()
    # The overlay's layout: a directory beside a checkout named joulesched.
    shutil.copytree(REPO / "deploy", tmp_path / "joulesched" / "deploy")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    before = dict(containers(render(tmp_path / "joulesched" / "deploy")))
    after = dict(containers(render(tmp_path / "overlay")))
    assert before.keys() == after.keys()
    moved = {i["name"]: i["newName"] for i in overlay["images"]}
    ours = {k: v for k, v in before.items() if v.split(":")[0] in moved}
    # the extender, the deferrer and the agent (with its init container, if any)
    assert {k.split("/")[1] for k in ours} >= {"joulesched-extender", "joulesched-deferrer", "joulesched-agent"}, ours
    for name, image in before.items():
        repo, _, tag = image.rpartition(":")
        if repo in moved:
            assert after[name] == f"{moved[repo]}:{tag}", (name, after[name])
        else:
            assert after[name] == image, (name, after[name])
    assert not any(v.startswith("ghcr.io/") for v in after.values()), after


@pytest.mark.parametrize("component", ["kube-v1.35"])
def test_the_registry_overlay_and_a_minors_component_combine(tmp_path: Path, component: str) -> None:
    overlay = doc_overlay()
    overlay["components"] = [f"../joulesched/deploy/components/{component}"]
    shutil.copytree(REPO / "deploy", tmp_path / "joulesched" / "deploy")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    images = set(dict(containers(render(tmp_path / "overlay"))).values())
    assert "registry.k8s.io/kube-scheduler:v1.35.4" in images, images
    assert not any(v.startswith("ghcr.io/") for v in images), images
