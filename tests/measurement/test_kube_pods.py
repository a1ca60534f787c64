"""Pod UID → namespace/name/owner from the API, failing soft."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from joulesched.measurement.sources.kube_pods import (
    InClusterDirectory,
    NoDirectory,
    open_directory,
    owner_of,
    pods_from_list,
)

POD_LIST = {
    "kind": "PodList",
    "items": [
        {
            "metadata": {
                "uid": "0F6B1D7E-3C2A-4B59-9E4E-0A8D7C6B5A41",
                "namespace": "shop",
                "name": "web-7d4b9c5f6-x2x9z",
                "labels": {"pod-template-hash": "7d4b9c5f6"},
                "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d4b9c5f6", "controller": True}],
            }
        },
        {
            "metadata": {
                "uid": "5d2e8c1f-7a6b-4c3d-8e9f-1a2b3c4d5e6f",
                "namespace": "science",
                "name": "nf-3f2a",
                "labels": {"nextflow.io/processName": "ALIGN"},
            }
        },
        {
            "metadata": {
                "uid": "9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d",
                "namespace": "batch",
                "name": "job-1-abc",
                "ownerReferences": [{"kind": "Job", "name": "job-1"}],
            }
        },
        {"metadata": {"namespace": "broken"}},
    ],
}


def test_pods_are_named_and_owned() -> None:
    pods = pods_from_list(POD_LIST)
    web = pods["0f6b1d7e-3c2a-4b59-9e4e-0a8d7c6b5a41"]  # UIDs are matched lower-case, as cgroup paths hold them
    assert (web.namespace, web.name, web.owner_kind, web.owner) == ("shop", "web-7d4b9c5f6-x2x9z", "Deployment", "web")
    assert owner_of(POD_LIST["items"][1]) == ("NextflowProcess", "ALIGN")
    assert owner_of(POD_LIST["items"][2]) == ("Job", "job-1")
    assert len(pods) == 3


def test_off_and_auto_outside_a_cluster_give_no_names(tmp_path: Path) -> None:
    assert isinstance(open_directory("off", "n1"), NoDirectory)
    assert isinstance(open_directory("auto", "n1", account_dir=str(tmp_path)), NoDirectory)
    assert NoDirectory().lookup("x") is None


def test_unreachable_api_fails_soft_and_logs_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "token").write_text("t0ken\n")
    directory = InClusterDirectory("n1", "127.0.0.1", "1", account_dir=str(tmp_path), timeout=0.5)
    with caplog.at_level(logging.WARNING):
        directory.refresh()
        directory.refresh()
    assert directory.lookup("0f6b1d7e-3c2a-4b59-9e4e-0a8d7c6b5a41") is None
    assert sum("pod names unavailable" in r.getMessage() for r in caplog.records) == 1
    assert "spec.nodeName%3Dn1" in directory.url


def test_a_static_pods_mirror_names_the_cgroup_of_its_kubelet_uid() -> None:
    """The API's mirror pod has a UID of its own; the cgroup carries the kubelet's, which the
    mirror's kubernetes.io/config.mirror annotation gives."""
    static = "6d7e0f4a9b8c7d6e5f4a3b2c1d0e9f8a"
    mirror = {
        "metadata": {
            "uid": "0f6b1d7e-3c2a-4b59-9e4e-0a8d7c6b5a41",
            "namespace": "kube-system",
            "name": "etcd-node-a",
            "annotations": {"kubernetes.io/config.mirror": static, "kubernetes.io/config.source": "file"},
            "ownerReferences": [{"kind": "Node", "name": "node-a", "controller": True}],
        }
    }
    pods = pods_from_list({"items": [mirror]})
    assert pods[static].name == "etcd-node-a" and pods[static].namespace == "kube-system"
