"""pytest fixtures for the end-to-end tests (real kube-apiserver/kube-scheduler).

Skip rule: the e2e tests are skipped ONLY when Go is absent (and no cached
binaries exist) AND the ``CI`` environment variable is not set. When ``CI`` is
set, any missing prerequisite (go, etcd, openssl, a failed build) is a test
FAILURE. Everything under tests/e2e gets the ``e2e`` marker, so
``pytest -m "not e2e"`` deselects it.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import binaries
from cluster import ControlPlane
from processes import ClusterError

E2E_DIR = Path(__file__).resolve().parent


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end test against a real kube-apiserver/kube-scheduler "
        "(needs Go to build them, etcd and openssl)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            p = Path(str(item.fspath)).resolve()
        except Exception:
            continue
        if E2E_DIR == p or E2E_DIR in p.parents:
            item.add_marker(pytest.mark.e2e)


def in_ci() -> bool:
    """CI is "set" when the variable is non-empty and not 0/false/no."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str) -> None:
    """Fail (never skip) on a missing prerequisite."""
    pytest.fail(f"e2e prerequisite missing: {what}", pytrace=False)


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    """Directory with kube-apiserver, kube-scheduler, kubectl of the pinned
    version. ``$JOULESCHED_K8S_BIN_DIR`` overrides; otherwise
    hack/build-k8s.sh (cache hit = instant, cold build = 10-25 min on 2 cores)."""
    override = os.environ.get("JOULESCHED_K8S_BIN_DIR")
    if override:
        d = Path(override)
        for b in ("kube-apiserver", "kube-scheduler", "kubectl"):
            if not os.access(d / b, os.X_OK):
                _missing(f"{d / b} (from JOULESCHED_K8S_BIN_DIR)")
        return d
    if binaries.find_go() is None:
        # The build script returns a cache hit without needing Go.
        try:
            return binaries.build_k8s()
        except ClusterError:
            if in_ci():
                _missing("go (needed to build kube-apiserver/kube-scheduler; CI is set)")
            pytest.skip("Go is not installed and CI is not set: skipping e2e tests")
    try:
        return binaries.build_k8s()
    except ClusterError as e:
        pytest.fail(f"building Kubernetes binaries failed: {e}", pytrace=False)


@pytest.fixture(scope="session")
def control_plane(k8s_bin_dir, tmp_path_factory):
    """Session-wide etcd + kube-apiserver on loopback (a cluster.ControlPlane).

    Logs/certs/kubeconfigs live in pytest's basetemp (``control-plane*/``),
    which pytest keeps for the last 3 runs -- look there after a failure.
    """
    etcd = os.environ.get("JOULESCHED_ETCD", "etcd")
    if not shutil.which(etcd):
        _missing(f"etcd binary ({etcd!r}; Debian: apt-get install etcd-server)")
    if not shutil.which("openssl"):
        _missing("openssl CLI")
    cp = ControlPlane(k8s_bin_dir, tmp_path_factory.mktemp("control-plane"), etcd_bin=etcd)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def scheduler_factory(control_plane):
    """``start(config=None, *, name=None, verbosity=2, ...) -> SchedulerProcess``.

    Thin wrapper over ControlPlane.start_scheduler; every scheduler started
    through it is stopped (by PID) at the end of the test.
    """
    started = []

    def start(config=None, **kw):
        s = control_plane.start_scheduler(config, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        control_plane.stop_scheduler(s)


@pytest.fixture
def node_factory(control_plane):
    """``make(name, **ControlPlane.create_node kwargs) -> V1Node``; the nodes
    are deleted at the end of the test (the cluster is session-wide)."""
    created = []

    def make(name, **kw):
        node = control_plane.create_node(name, **kw)
        created.append(name)
        return node

    yield make
    for n in created:
        control_plane.delete_node(n)


@pytest.fixture
def e2e_namespace(control_plane):
    """A fresh namespace (with its `default` ServiceAccount) for one test; its
    pods are force-deleted afterwards. (The namespace itself is left: without
    kube-controller-manager a deleted namespace stays Terminating forever.)"""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(name)
    yield name
    try:
        control_plane.delete_all_pods(name)
    except Exception:
        pass


@pytest.fixture
def extender_factory(tmp_path):
    """``start(profiles, config=None, *, port=None, name="extender", wait=True)
    -> e2e_extender.ExtenderProcess``: joulesched's extender (gunicorn) on
    127.0.0.1; every one started is stopped (by PID) at the end of the test.
    Its config, profile document and log are in the test's tmp_path."""
    from e2e_extender import ExtenderProcess

    started = []

    def start(profiles, config=None, **kw):
        name = kw.pop("name", "extender")
        proc = ExtenderProcess(tmp_path / f"{name}-{len(started)}", profiles, config,
                               name=name, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def fault_proxy():
    """``make(target_url=None, modes=None) -> e2e_extender.FaultProxy``; closed after the test."""
    from e2e_extender import FaultProxy

    made = []

    def make(target=None, modes=None):
        proxy = FaultProxy(target, modes)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


# The two Prometheus Operator kinds deploy/ and the chart use, as minimal CRDs: any spec is kept,
# but a spec must be there, so the objects really go through CR admission in the dry-run.
OPERATOR_CRDS = [
    ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
    ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
]


@pytest.fixture(scope="module")
def operator_crds(control_plane: ControlPlane) -> list[str]:
    names = []
    for group, kind, plural in OPERATOR_CRDS:
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                "versions": [{
                    "name": "v1", "served": True, "storage": True,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "required": ["spec"],
                        "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    }},
                }],
            },
        }
        control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(crd))
        names.append(f"crd/{plural}.{group}")
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=30s", *names)
    return names
