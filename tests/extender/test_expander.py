"""`joulesched expander` offline: the ConfigMap it writes, in cluster-autoscaler's documented format.

cluster-autoscaler (expander/priority) reads ``data.priorities`` of the ConfigMap
``cluster-autoscaler-priority-expander`` as YAML ``map[int][]string``; each string is a Go
regexp matched *unanchored* (``FindStringIndex``) against the node-group id; the highest
matching priority wins, ties at random; groups matching nothing are not used while another
matches. ``ca_best`` below does the same, so the tests check what the autoscaler would pick.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from joulesched.cli import SUBCOMMANDS
from joulesched.cli import main as cli_main
from joulesched.extender.expander import escape, main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "extender/data/example-nodes.yaml"
BY_NAME = "^(.+)-[a-z]$"  # epyc-7763-a -> epyc-7763
EPYC_7763 = [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]
EPYC_7763_2S = [104.0, 172, 194, 216, 238, 258, 283, 305, 332, 385, 459]  # SR645, 2 × 7763 (the CSV)


def ca_best(priorities_text: str, groups: list[str]) -> list[str]:
    prios = yaml.safe_load(priorities_text)
    best, top = [], -1
    for group in groups:
        matched = [p for p, rxs in prios.items() if any(re.search(rx, group) for rx in rxs)]
        if not matched:
            continue
        if max(matched) > top:
            best, top = [group], max(matched)
        elif max(matched) == top:
            best.append(group)
    return best or groups  # nothing matched: cluster-autoscaler falls back to random


def write(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "cm.yaml"
    assert main([*args, "--output", str(out)]) == 0
    return yaml.safe_load(out.read_text())


def profiles(tmp_path: Path, nodes: list[dict[str, Any]], sites: dict[str, Any] | None = None) -> str:
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump({"sites": sites or {}, "nodes": nodes}))
    return str(path)


def node(name: str, curve: list[float], cores: float, **kw: Any) -> dict[str, Any]:
    return {"name": name, "cores": cores, "power_curve_watts": curve, **kw}


def test_is_a_joulesched_subcommand() -> None:
    assert SUBCOMMANDS["expander"][:2] == ("joulesched.extender.expander", "main")


def test_configmap_has_the_documented_format(tmp_path: Path) -> None:
    cm = write(tmp_path, "--profiles", str(EXAMPLE), "--group-from-name", BY_NAME)
    assert cm["apiVersion"] == "v1" and cm["kind"] == "ConfigMap"
    assert cm["metadata"]["name"] == "cluster-autoscaler-priority-expander"
    assert cm["metadata"]["namespace"] == "kube-system"
    assert set(cm["data"]) == {"priorities"} and isinstance(cm["data"]["priorities"], str)
    prios = yaml.safe_load(cm["data"]["priorities"])
    assert all(type(p) is int and p > 0 for p in prios)  # map[int][]string, positive
    assert all(isinstance(rxs, list) and all(isinstance(r, str) for r in rxs) for rxs in prios.values())
    for rxs in prios.values():
        for rx in rxs:
            re.compile(rx)
    # example-nodes.yaml by energy (J per unit of work): epyc-7763 5.281 (both nodes), epyc-7742
    # 5.342 (1.2 % more: its own tier), xeon-8380 9.13, xeon-8176 9.93; the H100 node is a GPU type
    assert prios == {
        50: ["^epyc-7763$"],
        40: ["^epyc-7742$"],
        30: ["^xeon-8380$"],
        20: ["^xeon-8176$"],
        10: ["^gpu-h100$"],
        1: [".*"],
    }
    # a block string, as the expander's readme shows it
    assert "priorities: |" in (tmp_path / "cm.yaml").read_text()


def test_regexes_match_whole_group_names_only(tmp_path: Path) -> None:
    src = profiles(tmp_path, [node("epyc-7763-a", EPYC_7763, 64), node("epyc-7763-2s-a", EPYC_7763_2S, 128)])
    text = write(tmp_path, "--profiles", src, "--group-from-name", BY_NAME)["data"]["priorities"]
    prios = yaml.safe_load(text)
    # the 2-socket box: 3117 W over 5.5 × 128 = 4.43 J per unit, better than the 1-socket's 5.28
    assert prios == {20: ["^epyc-7763-2s$"], 10: ["^epyc-7763$"], 1: [".*"]}
    assert not re.search(prios[10][0], "epyc-7763-2s")
    assert ca_best(text, ["epyc-7763", "epyc-7763-2s"]) == ["epyc-7763-2s"]
    assert ca_best(text, ["epyc-7763", "other-pool"]) == ["epyc-7763"]
    assert ca_best(text, ["other-pool"]) == ["other-pool"]  # through the fallback entry


def test_group_names_are_escaped(tmp_path: Path) -> None:
    assert escape("m5.large") == r"m5\.large" and escape("a+b(c)") == r"a\+b\(c\)"
    src = profiles(tmp_path, [node("m5.large-a", EPYC_7763, 2), node("m5xlarge-a", EPYC_7763_2S, 4)])
    text = write(tmp_path, "--profiles", src, "--group-from-name", BY_NAME)["data"]["priorities"]
    assert ca_best(text, ["m5xlarge"]) == ["m5xlarge"]
    assert yaml.safe_load(text)[10] == [r"^m5\.large$"]
    assert not re.search(r"^m5\.large$", "m5xlarge")


def test_group_pattern_maps_groups_to_autoscaler_node_group_ids(tmp_path: Path) -> None:
    eks = "^eks-{group}-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"  # docs/autoscaler.md
    cm = write(tmp_path, "--profiles", str(EXAMPLE), "--group-from-name", BY_NAME,
               "--group-pattern", eks, "--no-fallback", "--namespace", "autoscaler")
    text = cm["data"]["priorities"]
    assert cm["metadata"]["namespace"] == "autoscaler"
    assert ".*" not in yaml.safe_load(text).get(1, [])
    asgs = ["eks-xeon-8380-6ec2a1f0-1b2c-4d5e-8f90-0123456789ab", "eks-epyc-7763-2fc2a1f0-9d8e-4c7b-a1b2-0fedcba98765",
            "eks-epyc-7763-2s-0c0c0c0c-0000-4000-8000-000000000000"]
    assert ca_best(text, asgs) == ["eks-epyc-7763-2fc2a1f0-9d8e-4c7b-a1b2-0fedcba98765"]
    # a group whose name is another's and more: "epyc-7763" matches only its own id, not "epyc-7763-2s"'s,
    # though "2s-0c0c0c0c" is made of what a looser [0-9a-f-]+ takes but for the s
    src = profiles(tmp_path, [node("workers-a", EPYC_7763, 64), node("workers-2023-a", EPYC_7763_2S, 28)])
    text = write(tmp_path, "--profiles", src, "--group-from-name", BY_NAME, "--group-pattern", eks)["data"]["priorities"]
    ids = ["eks-workers-2ac5e1f0-3b4c-1d2e-9f8a-0123456789ab", "eks-workers-2023-7bd1c2e3-4f5a-6b7c-8d9e-0fedcba98765"]
    assert len(ca_best(text, ids)) == 1, "one best: the group's regex does not match the other's id"


def test_carbon_strategy_ranks_by_site(tmp_path: Path) -> None:
    sites = {"dirty": {"pue": 1.58, "carbon_intensity": 441}, "clean": {"pue": 1.1, "carbon_intensity": 55}}
    nodes = [node("lean-a", [p * 0.7 for p in EPYC_7763], 64, site="dirty"), node("plain-a", EPYC_7763, 64, site="clean")]
    src = profiles(tmp_path, nodes, sites)
    energy = yaml.safe_load(write(tmp_path, "--profiles", src, "--group-from-name", BY_NAME)["data"]["priorities"])
    carbon = yaml.safe_load(write(tmp_path, "--profiles", src, "--group-from-name", BY_NAME,
                                  "--strategy", "carbon")["data"]["priorities"])
    assert energy[20] == ["^lean$"] and carbon[20] == ["^plain$"]


def test_equal_groups_share_a_priority(tmp_path: Path) -> None:
    nodes = [node("a-x", EPYC_7763, 64), node("b-x", [p * 1.005 for p in EPYC_7763], 64), node("c-x", EPYC_7763_2S, 64)]
    src = profiles(tmp_path, nodes)
    prios = yaml.safe_load(write(tmp_path, "--profiles", src, "--group-from-name", "^(.)-")["data"]["priorities"])
    assert prios == {20: ["^a$", "^b$"], 10: ["^c$"], 1: [".*"]}


def test_stdout_through_the_joulesched_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["expander", "--profiles", str(EXAMPLE), "--group-from-name", BY_NAME]) == 0
    cm = yaml.safe_load(capsys.readouterr().out)
    assert cm["metadata"]["name"] == "cluster-autoscaler-priority-expander"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profiles", "/nonexistent/p.yaml", "--group-from-name", BY_NAME], "/nonexistent/p.yaml"),
        (["--profiles", "EMPTY", "--group-from-name", BY_NAME], "nodes: none given"),
        (["--profiles", "BROKEN", "--group-from-name", BY_NAME], "nodes[0].cores"),
        (["--profiles", str(EXAMPLE), "--group-from-name", "^zzz-(.*)$"], "no profiled node is in a node group"),
        (["--profiles", str(EXAMPLE), "--group-from-name", "(unclosed"], "--group-from-name '(unclosed'"),
        (["--profiles", str(EXAMPLE), "--group-from-name", BY_NAME, "--group-pattern", "^pool$"], "{group} exactly once"),
        (["--profiles", str(EXAMPLE)], "needs --apply or --kubeconfig"),
        (["--profiles", str(EXAMPLE), "--apply", "--kubeconfig", "/nonexistent/kc"], "--kubeconfig /nonexistent/kc"),
        (["--profiles", str(EXAMPLE), "--group-from-name", BY_NAME, "--output", "/nonexistent/dir/cm.yaml"],
         "--output /nonexistent/dir/cm.yaml: cannot write"),
    ],
)
def test_bad_input_exits_2_naming_what_and_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "EMPTY").write_text("nodes: []\n")
    (tmp_path / "BROKEN").write_text(yaml.safe_dump({"nodes": [{"name": "n", "cores": -1, "power_curve_watts": EPYC_7763}]}))
    args = [str(tmp_path / a) if a in ("EMPTY", "BROKEN") else a for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("joulesched expander: ") and message in err, err


def test_the_example_in_docs_is_the_commands_output(capsys: pytest.CaptureFixture[str]) -> None:
    doc = (REPO / "docs/autoscaler.md").read_text()
    first = doc.split("```yaml\n", 2)[1].split("```", 1)[0]
    assert main(["--profiles", str(EXAMPLE), "--group-from-name", BY_NAME]) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize(
    ("template", "named"),
    [(r"^eks-(?!canary){group}-", "'(?!'"), (r"^{group}\Z", r"'\\Z'"), (r"^(a)\1{group}$", r"'\\1'"), ("^a++{group}$", "'++'")],
)
def test_a_pattern_cluster_autoscalers_re2_refuses_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], template: str, named: str
) -> None:
    """Python's re takes these; RE2 does not, and cluster-autoscaler then ignores the whole map."""
    assert main(["--profiles", str(EXAMPLE), "--group-from-name", BY_NAME, "--output", str(tmp_path / "cm.yaml"),
                 "--group-pattern", template]) == 2
    err = capsys.readouterr().err
    assert f"{named} is not RE2 syntax" in err, err
    assert not (tmp_path / "cm.yaml").exists()


def test_a_configmap_with_another_key_is_left_alone_while_the_priorities_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from kubernetes import client

    from joulesched.extender import expander

    class Core:  # strategic merge, as the API server patches: the data keys merge
        def __init__(self) -> None:
            self.cm: dict[str, Any] = {"labels": {}, "data": {"README": "priorities written by joulesched"}}
            self.patches = 0

        def read_namespaced_config_map(self, name: str, ns: str, **_: Any) -> Any:
            return SimpleNamespace(metadata=SimpleNamespace(labels=dict(self.cm["labels"])), data=dict(self.cm["data"]))

        def patch_namespaced_config_map(self, name: str, ns: str, body: dict[str, Any], **_: Any) -> None:
            self.patches += 1
            assert set(body) == {"data"}, body  # its labels are its owner's (Helm's, with the chart)
            self.cm["data"].update(body["data"])

    core = Core()
    monkeypatch.setattr(client, "CoreV1Api", lambda api: core)
    cm = expander.configmap("50:\n- ^a$\n")
    assert [expander.apply_configmap(object(), cm) for _ in range(3)] == ["updated", "unchanged", "unchanged"]
    assert core.cm["data"]["README"] == "priorities written by joulesched"


def test_watch_writes_the_output_only_when_the_priorities_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from joulesched.extender import expander

    writes: list[str] = []
    monkeypatch.setattr(expander, "write_output", lambda path, cm: writes.append(cm["data"]["priorities"]))
    rounds = iter(range(3))

    def sleep(_: float) -> None:
        if next(rounds, None) is None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        main(["--profiles", str(EXAMPLE), "--group-from-name", BY_NAME, "--output", str(tmp_path / "cm.yaml"),
              "--watch", "1"], sleep=sleep)
    assert len(writes) == 1, "four rounds of the same priorities: one write"


def test_a_kubeconfig_list_as_kubectl_takes_it_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for f in (a, b):
        f.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    main(["--profiles", str(EXAMPLE), "--apply", "--kubeconfig", f"{a}{os.pathsep}{b}"])
    assert "no such file" not in capsys.readouterr().err
    assert main(["--profiles", str(EXAMPLE), "--apply", "--kubeconfig", f"{a}{os.pathsep}{tmp_path}/gone"]) == 2
    assert f"no such file: {tmp_path}/gone" in capsys.readouterr().err


# -- the ConfigMap is shipped, never created (its RBAC has no create) ----------------------------


class _Missing:
    """CoreV1Api with no ConfigMap until ``appears`` rounds have asked, and no create method."""

    def __init__(self, appears: int = 10**9) -> None:
        self.reads, self.appears, self.patched = 0, appears, []
        self.labels: dict[str, str] = {}
        self.data = {"priorities": "1:\n- .*\n"}  # as shipped

    def read_namespaced_config_map(self, name: str, ns: str, **_: Any) -> Any:
        from types import SimpleNamespace

        from kubernetes.client.exceptions import ApiException

        self.reads += 1
        if self.reads < self.appears:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(metadata=SimpleNamespace(labels=dict(self.labels)), data=dict(self.data))

    def patch_namespaced_config_map(self, name: str, ns: str, body: dict[str, Any], **_: Any) -> None:
        assert set(body) == {"data"}, body
        self.patched.append((ns, name, body["data"]["priorities"]))
        self.data.update(body["data"])


def test_the_shipped_configmap_is_the_placeholder_no_preference() -> None:
    from joulesched.extender import expander

    (shipped,) = [d for d in yaml.safe_load_all((REPO / "deploy/expander/configmap.yaml").read_text()) if d]
    assert shipped["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}  # the chart's twin
    assert shipped == expander.configmap(expander.PLACEHOLDER_PRIORITIES, "kube-system")
    # the expander's own fallback entry alone: every node group kept at one priority
    assert expander.PLACEHOLDER_PRIORITIES == expander.priorities_yaml({})
    groups = ["epyc-7763", "xeon-8380", "eks-gpu-h100-1234"]
    assert ca_best(shipped["data"]["priorities"], groups) == groups


def test_a_missing_configmap_is_not_created_and_the_error_says_how_to(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client

    from joulesched.extender import expander

    core = _Missing()  # no create_namespaced_config_map: calling it would raise AttributeError
    monkeypatch.setattr(client, "CoreV1Api", lambda api: core)
    with pytest.raises(expander.ConfigMapMissing) as err:
        expander.apply_configmap(object(), expander.configmap("50:\n- ^a$\n", "autoscaling"))
    text = str(err.value)
    assert "configmap autoscaling/cluster-autoscaler-priority-expander not found" in text, text
    assert "kubectl apply -k deploy/expander/" in text and "expander.enabled=true" in text, text
    assert "kubectl -n autoscaling create configmap cluster-autoscaler-priority-expander" in text, text


def test_without_the_configmap_one_run_exits_1_and_the_watch_keeps_retrying(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from kubernetes import client

    from joulesched.extender import kube

    monkeypatch.setattr(kube, "api_client", lambda kubeconfig: object())
    args = ["--profiles", str(EXAMPLE), "--group-from-name", BY_NAME, "--apply"]
    core = _Missing()
    monkeypatch.setattr(client, "CoreV1Api", lambda api: core)
    assert main(args) == 1
    assert "configmap kube-system/cluster-autoscaler-priority-expander not found" in capsys.readouterr().err

    core = _Missing(appears=4)  # created by someone between the third and the fourth round
    monkeypatch.setattr(client, "CoreV1Api", lambda api: core)
    rounds = iter(range(5))

    def sleep(_: float) -> None:
        if next(rounds, None) is None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the watch never returned: no exit while it is missing
        main([*args, "--watch", "300"], sleep=sleep)
    missing = [r for r in caplog.records if "cluster-autoscaler-priority-expander not found" in r.getMessage()]
    assert len(missing) == 3 and all(r.levelname == "ERROR" for r in missing)
    assert [(ns, name) for ns, name, _ in core.patched] == [("kube-system", "cluster-autoscaler-priority-expander")]
    assert core.patched[0][2].startswith("50:\n- ^epyc-7763$\n")
