"""`joulesched expander --apply` against the real kube-apiserver, as the shipped ServiceAccount.

deploy/expander's RBAC and ConfigMap (the placeholder) are applied for real and the command
runs with that ServiceAccount's token: it writes the ranking into the shipped ConfigMap, leaves
it alone while the priorities stay the same, patches it when the profiles change (once, and
again under ``--watch``), and what it writes passes the server-side dry run. The RBAC grants
that and no more: no create (tests/e2e/test_least_privilege_e2e.py: without the ConfigMap).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from binaries import REPO_ROOT
from cluster import ControlPlane

DEPLOY = REPO_ROOT / "deploy"
NAMESPACE = "joulesched"
SA = "joulesched-expander"
CM = "cluster-autoscaler-priority-expander"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
GOOD = [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]  # EPYC 7763, 5.28 J per unit at 64 cores
BAD = [127, 198, 226, 253, 281, 314, 354, 405, 464, 576, 619]  # Xeon 8380 (2 sockets), 9.13 J at 80 cores


@pytest.fixture(scope="module")
def expander_rbac(control_plane: ControlPlane) -> list[dict[str, Any]]:
    """deploy/namespace.yaml and the RBAC of ``kubectl kustomize deploy/expander``, applied for real."""
    cp = control_plane
    cp.kubectl("apply", "-f", str(DEPLOY / "namespace.yaml"))
    objs = [d for d in yaml.safe_load_all(cp.kubectl("kustomize", str(DEPLOY / "expander")).stdout) if d]
    rbac = [o for o in objs if o["kind"] in RBAC_KINDS]
    assert {o["kind"] for o in rbac} == RBAC_KINDS
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    return rbac


@pytest.fixture
def clean_configmap(control_plane: ControlPlane):
    """deploy/expander's ConfigMap, applied afresh (the placeholder), as the expander finds it."""
    cp = control_plane
    (cm,) = [d for d in yaml.safe_load_all(cp.kubectl("kustomize", str(DEPLOY / "expander")).stdout)
             if d and d["kind"] == "ConfigMap"]
    cp.kubectl("delete", "configmap", CM, "-n", "kube-system", "--ignore-not-found")
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(cm))
    yield
    cp.kubectl("delete", "configmap", CM, "-n", "kube-system", "--ignore-not-found")


def can_i(cp: ControlPlane, verb: str, resource: str, *extra: str) -> bool:
    r = cp.kubectl("auth", "can-i", verb, resource, *extra, f"--as=system:serviceaccount:{NAMESPACE}:{SA}", check=False)
    answer = r.stdout.strip().split(" ", 1)[0]
    assert answer in ("yes", "no"), (r.stdout, r.stderr)
    return answer == "yes"


def expander(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "joulesched.cli", "expander", *args, "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO_ROOT)


def write_profiles(path: Path, curves: dict[str, list[float]]) -> str:
    nodes = [{"name": n, "cores": 64 if c is GOOD else 80, "power_curve_watts": c} for n, c in curves.items()]
    path.write_text(yaml.safe_dump({"nodes": nodes}))
    return str(path)


def read_cm(cp: ControlPlane) -> tuple[dict[int, list[str]], str, dict[str, str]]:
    cm = cp.core.read_namespaced_config_map(CM, "kube-system")
    return yaml.safe_load(cm.data["priorities"]), cm.metadata.resource_version, cm.metadata.labels or {}


def test_expander_rbac_is_what_the_writer_needs_and_no_more(control_plane, expander_rbac):
    cp = control_plane
    assert can_i(cp, "list", "nodes")
    assert can_i(cp, "get", f"configmaps/{CM}", "-n", "kube-system")
    assert can_i(cp, "patch", f"configmaps/{CM}", "-n", "kube-system")
    assert not can_i(cp, "create", "configmaps", "-n", "kube-system")  # the ConfigMap is shipped
    assert not can_i(cp, "get", "configmaps/extension-apiserver-authentication", "-n", "kube-system")
    assert not can_i(cp, "patch", "configmaps/kube-proxy", "-n", "kube-system")
    assert not can_i(cp, "list", "configmaps", "-n", "kube-system")
    assert not can_i(cp, "delete", f"configmaps/{CM}", "-n", "kube-system")
    assert not can_i(cp, "update", f"configmaps/{CM}", "-n", "kube-system")
    assert not can_i(cp, "create", "configmaps", "-n", "default")
    assert not can_i(cp, "patch", "nodes")
    assert not can_i(cp, "get", "secrets", "-n", "kube-system")
    assert not can_i(cp, "get", "secrets", "-A")


def test_apply_ranks_into_the_shipped_configmap_then_updates_it(control_plane, expander_rbac, node_factory, clean_configmap, tmp_path):
    cp, tag = control_plane, uuid.uuid4().hex[:6]
    fast, slow, empty = f"fast-{tag}", f"slow-{tag}", f"empty-{tag}"  # node groups
    label = "eks.amazonaws.com/nodegroup"
    node_factory(f"{fast}-1", labels={label: fast})
    node_factory(f"{fast}-2", labels={label: fast})
    node_factory(f"{slow}-1", labels={label: slow})
    node_factory(f"{empty}-1", labels={label: empty})  # in a group, but no profile
    kc = cp.service_account_kubeconfig(NAMESPACE, SA)
    profiles = tmp_path / "profiles.yaml"
    write_profiles(profiles, {f"{fast}-1": GOOD, f"{fast}-2": GOOD, f"{slow}-1": BAD, f"unlabelled-{tag}": GOOD})
    out = tmp_path / "cm.yaml"

    r = expander("--profiles", str(profiles), "--apply", "--output", str(out), kubeconfig=kc)
    assert r.returncode == 0, r.stderr
    assert f"configmap kube-system/{CM} updated" in r.stderr, r.stderr  # the placeholder, ranked
    assert f"unlabelled-{tag}: no node group" in r.stderr and empty in r.stderr, r.stderr
    prios, version, labels = read_cm(cp)
    assert prios == {20: [f"^{fast}$"], 10: [f"^{slow}$"], 1: [".*"]}
    assert labels["app.kubernetes.io/managed-by"] == "joulesched"
    assert yaml.safe_load(out.read_text())["data"]["priorities"] == cp.core.read_namespaced_config_map(
        CM, "kube-system").data["priorities"]

    # the same profiles: nothing is written
    r = expander("--profiles", str(profiles), "--apply", kubeconfig=kc)
    assert r.returncode == 0 and "unchanged" in r.stderr, r.stderr
    assert read_cm(cp)[1] == version

    # the profiles change: the ranking flips and the ConfigMap is patched
    write_profiles(profiles, {f"{fast}-1": BAD, f"{fast}-2": BAD, f"{slow}-1": GOOD})
    r = expander("--profiles", str(profiles), "--apply", "--output", str(out), kubeconfig=kc)
    assert r.returncode == 0 and f"configmap kube-system/{CM} updated" in r.stderr, r.stderr
    prios, new_version, _ = read_cm(cp)
    assert prios == {20: [f"^{slow}$"], 10: [f"^{fast}$"], 1: [".*"]}
    assert new_version != version

    # what it writes passes the apiserver's own validation and admission
    d = cp.kubectl("apply", "--dry-run=server", "-f", str(out), check=False)
    assert d.returncode == 0, d.stderr
    assert d.stdout.strip() in (f"configmap/{CM} unchanged (server dry run)", f"configmap/{CM} configured (server dry run)"), d.stdout
    assert read_cm(cp)[1] == new_version  # a dry run writes nothing

    # a label no node carries: exit 2, naming it
    r = expander("--profiles", str(profiles), "--apply", "--node-group-label", "example.com/no-such", kubeconfig=kc)
    assert r.returncode == 2 and "example.com/no-such" in r.stderr, r.stderr


def test_apply_without_rbac_fails_with_the_apiserver_answer(control_plane, expander_rbac, node_factory,
                                                           clean_configmap, tmp_path, e2e_namespace):
    cp, tag = control_plane, uuid.uuid4().hex[:6]
    node_factory(f"pool-{tag}-1", labels={"joulesched.io/node-group": f"pool-{tag}"})
    profiles = write_profiles(tmp_path / "p.yaml", {f"pool-{tag}-1": GOOD})
    kc = cp.service_account_kubeconfig(e2e_namespace, "default")  # no RBAC at all
    r = expander("--profiles", profiles, "--apply", kubeconfig=kc)
    assert r.returncode == 1 and "Forbidden" in r.stderr, r.stderr


def test_watch_patches_only_when_the_priorities_change(control_plane, expander_rbac, node_factory,
                                                      clean_configmap, tmp_path):
    cp, tag = control_plane, uuid.uuid4().hex[:6]
    a, b = f"wa-{tag}", f"wb-{tag}"
    node_factory(f"{a}-1", labels={"joulesched.io/node-group": a})
    node_factory(f"{b}-1", labels={"joulesched.io/node-group": b})
    profiles = tmp_path / "profiles.yaml"
    write_profiles(profiles, {f"{a}-1": GOOD, f"{b}-1": BAD})
    kc = cp.service_account_kubeconfig(NAMESPACE, SA)
    log = (tmp_path / "watch.log").open("w")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "joulesched.cli", "expander", "--profiles", str(profiles),
                             "--apply", "--watch", "0.5", "--kubeconfig", str(kc)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    try:
        def wait_for(expected: dict[int, list[str]]) -> str:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                assert proc.poll() is None, (tmp_path / "watch.log").read_text()
                try:
                    prios, version, _ = read_cm(cp)
                except Exception:
                    prios, version = None, ""
                if prios == expected:
                    return version
                time.sleep(0.2)
            raise AssertionError(f"ConfigMap never became {expected}:\n{(tmp_path / 'watch.log').read_text()}")

        version = wait_for({20: [f"^{a}$"], 10: [f"^{b}$"], 1: [".*"]})
        time.sleep(2.5)  # about five rounds with the same profiles
        assert read_cm(cp)[1] == version
        write_profiles(profiles, {f"{a}-1": BAD, f"{b}-1": GOOD})
        wait_for({20: [f"^{b}$"], 10: [f"^{a}$"], 1: [".*"]})
        # The ConfigMap changes when the API answers the update; the watch logs it just after:
        # wait for that line (or a few seconds) before stopping the watch and counting.
        logged = time.monotonic() + 5
        while (tmp_path / "watch.log").read_text().count(" updated") < 2 and time.monotonic() < logged:
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    text = (tmp_path / "watch.log").read_text()
    assert text.count(" updated") == 2, text  # the placeholder ranked, then the flip
    assert text.count(" unchanged") >= 3, text
