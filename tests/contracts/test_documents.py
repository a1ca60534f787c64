"""Profile documents, policy documents and pod demand: parsing and every problem named."""

from __future__ import annotations

import pytest

from joulesched.policy.config import PolicyConfig, parse_policy
from joulesched.policy.demand import (
    DEFAULT_MILLI_CPU_REQUEST,
    RUNTIME_ANNOTATION,
    demand_from_pod,
    owner_of,
    parse_quantity,
)
from joulesched.policy.errors import ConfigError, PolicyError
from joulesched.policy.profile import ProfileSet, parse_profiles
from joulesched.policy.validate import Checker

CURVE = [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]


def test_profile_document_round_trips() -> None:
    doc = {
        "sites": {"north": {"pue": 1.1, "carbon_intensity": 55.0, "wue": 0.3}},
        "nodes": [
            {"name": "a", "site": "north", "cores": 64, "power_curve_watts": CURVE, "utilisation": 0.25},
            {"name": "b", "cores": 16, "idle_watts": 40, "watts_per_core": 5, "gpus": {"count": 2, "idle_watts": 30, "max_watts": 300}},
        ],
    }
    profiles = parse_profiles(doc, "nodes.yaml")
    a, b = profiles.nodes
    assert a.pue == 1.1 and a.carbon_intensity == 55.0
    assert b.power_curve_watts[-1] == pytest.approx(40 + 5 * 16)
    again = parse_profiles(profiles.to_document(), "again")
    assert again == ProfileSet(profiles.nodes, again.sites)


def test_every_problem_in_a_profile_document_is_reported_with_its_path() -> None:
    doc = {
        "nodes": [
            {"name": "a", "cores": -4, "power_curve_watts": CURVE},
            {"name": "b", "cores": 8, "power_curve_watts": [1, 2, 3]},
            {"name": "c", "cores": "8", "idle_watts": 10, "watts_per_core": 1},
            {"name": "d", "cores": 8, "power_curve_watts": CURVE, "site": "nowhere", "speed": 0},
            {"name": "a", "cores": 8, "power_curve_watts": CURVE},
            {"name": "e", "cores": 8},
            {"name": "f", "cores": 8, "power_curve_watts": list(reversed(CURVE))},
            {"name": "g", "cores": 8, "power_curve_watts": CURVE, "colour": "red"},
        ]
    }
    with pytest.raises(ConfigError) as caught:
        parse_profiles(doc, "nodes.yaml")
    text = str(caught.value)
    for expected in (
        "nodes.yaml:",
        "nodes[0].cores: must be > 0, got -4",
        "nodes[1].power_curve_watts: must have 11 entries, got 3",
        "nodes[2].cores: must be a number, got string '8'",
        "nodes[3].site: unknown site 'nowhere'",
        "nodes[3].speed: must be > 0, got 0",
        "nodes[4].name: duplicate node name 'a'",
        "nodes[5].idle_watts: is required",
        "nodes[6].power_curve_watts: must not decrease with load",
        "nodes[7].colour: unknown field",
    ):
        assert expected in text, expected


@pytest.mark.parametrize(
    ("model", "problems"),
    [
        pytest.param(
            {"power_curve_watts": CURVE[:10]},
            ["nodes[0].power_curve_watts: must have 11 entries, got 10"],
            id="a curve of 10 points",
        ),
        pytest.param(
            {"power_curve_watts": "flat"},
            ["nodes[0].power_curve_watts: must be a list of numbers, got string"],
            id="a curve that is not a list",
        ),
        pytest.param(
            {"power_curve_watts": [*CURVE[:10], "x"]},
            ["nodes[0].power_curve_watts[10]: must be a finite number, got 'x'"],
            id="a curve with a word in it",
        ),
        pytest.param(
            {"power_curve_watts": CURVE[:10], "idle_watts": 50},
            [
                "nodes[0].power_curve_watts: must have 11 entries, got 10",
                "nodes[0]: give either power_curve_watts or idle_watts + watts_per_core, not both",
            ],
            id="a wrong curve and half a linear model",
        ),
        pytest.param(
            {},
            ["nodes[0].idle_watts: is required", "nodes[0].watts_per_core: is required"],
            id="no power model at all",
        ),
        pytest.param(
            {"power_curve_watts": None, "idle_watts": 50},
            ["nodes[0].watts_per_core: is required"],
            id="a null curve and half a linear model",
        ),
    ],
)
def test_the_linear_models_keys_are_asked_for_only_without_a_curve(model: dict, problems: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_profiles({"nodes": [{"name": "a", "cores": 8, **model}]}, "nodes.yaml")
    assert caught.value.problems == problems


def test_the_example_at_the_top_of_policy_profile_is_a_valid_document_that_is_never_stale() -> None:
    # docs/configuration.md sends readers to it: copied as it is, it must serve (a fixed
    # `updated` time would make every node stale, and the extender not ready, once it is past)
    import textwrap

    import yaml

    from joulesched.policy import profile

    doc = profile.__doc__ or ""
    example = textwrap.dedent(doc[doc.index("    sites:") : doc.index("\nThe power curve")])
    profiles = parse_profiles(yaml.safe_load(example), "policy/profile.py")
    assert [n.name for n in profiles.nodes] == ["node-a"]
    assert profiles.nodes[0].updated is None  # a static profile: fresh at any time
    # the example shows every field a node may have, some commented out
    commented = {line.strip().lstrip("# ").split(":")[0] for line in example.splitlines() if line.strip().startswith("# ")}
    assert set(yaml.safe_load(example)["nodes"][0]) | commented >= set(profile.NODE_FIELDS)


def test_policy_document_defaults_and_problems() -> None:
    check = Checker("policy.yaml")
    assert parse_policy(None, check) == PolicyConfig()
    check = Checker("policy.yaml")
    parse_policy({"strategy": "cheapest", "band": 0, "neutral_score": 10, "power_cap": {"headroom": "5%"}}, check)
    assert check.problems == [
        "policy.strategy: must be one of energy, carbon, got 'cheapest'",
        "policy.band: must be > 0, got 0",
        "policy.neutral_score: must be <= 9, got 10",
        "policy.power_cap.headroom: must be a number, got string '5%'",
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", 0.5), ("2", 2.0), ("1Gi", 2.0**30), ("1e3", 1000.0), ("1.5k", 1500.0), ("100M", 1e8), (4, 4.0)],
)
def test_parse_quantity(text: object, value: float) -> None:
    assert parse_quantity(text, "x") == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "two", "1.5.2", "-1", "1Zi", True, None, [1]])
def test_parse_quantity_rejects_garbage_naming_the_field(text: object) -> None:
    with pytest.raises(PolicyError, match=r"^Pod\.x"):
        parse_quantity(text, "Pod.x")


def test_parse_quantity_remembers_values_not_errors_or_bounds() -> None:
    # Quantity strings are parsed once and remembered; a bad one fails every time, naming the
    # field of that call, and a remembered value is still held to each call's bound.
    for where in ("Pod.a", "Pod.b"):
        with pytest.raises(PolicyError, match=rf"^{where}: 'two' is not a Kubernetes quantity"):
            parse_quantity("two", where)
    assert parse_quantity("3", "Pod.c") == 3.0
    with pytest.raises(PolicyError, match=r"^Pod\.d: '3' is over the physical maximum of 2"):
        parse_quantity("3", "Pod.d", maximum=2.0)
    assert parse_quantity(" 3", "Pod.e") == 3.0


def pod(containers: list[dict], **spec: object) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"containers": containers, **spec}}


def res(cpu: str | None = None, mem: str | None = None, gpu: str | None = None, limits: bool = False) -> dict:
    values = {k: v for k, v in (("cpu", cpu), ("memory", mem), ("nvidia.com/gpu", gpu)) if v is not None}
    return {"resources": {"limits" if limits else "requests": values}}


def test_demand_sums_containers_and_respects_init_containers_and_overhead() -> None:
    d = demand_from_pod(
        pod(
            [res("500m", "1Gi"), res("1500m", "1Gi")],
            initContainers=[res("3", "512Mi")],
            overhead={"cpu": "250m"},
        )
    )
    assert d.cpu_cores == pytest.approx(3.25)  # max(2, 3) + overhead
    assert d.memory_bytes == pytest.approx(2 * 2**30)
    assert d.basis == "requests"


def test_sidecar_init_containers_add_to_the_app_containers() -> None:
    sidecar = {**res("1"), "restartPolicy": "Always"}
    d = demand_from_pod(pod([res("2")], initContainers=[sidecar, res("2")]))
    assert d.cpu_cores == pytest.approx(3.0)


def test_limits_stand_in_for_missing_requests_and_gpus_are_counted() -> None:
    d = demand_from_pod(pod([res("4", gpu="2", limits=True)]))
    assert d.cpu_cores == 4 and d.gpus == 2


def test_best_effort_pod_gets_kube_schedulers_default_request() -> None:
    d = demand_from_pod(pod([{"name": "c"}]))
    assert d.cpu_cores == DEFAULT_MILLI_CPU_REQUEST / 1000 and d.basis == "default"


def test_runtime_annotation() -> None:
    p = pod([res("1")])
    p["metadata"]["annotations"] = {RUNTIME_ANNOTATION: "120"}
    assert demand_from_pod(p).runtime_seconds == 120.0
    p["metadata"]["annotations"] = {RUNTIME_ANNOTATION: "soon"}
    with pytest.raises(PolicyError, match=RUNTIME_ANNOTATION):
        demand_from_pod(p)


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"spec": "x"}, "Pod.spec"),
        ({"spec": {"containers": {}}}, "Pod.spec.containers"),
        ({"spec": {"containers": [1]}}, r"Pod.spec.containers\[0\]"),
        ({"spec": {"containers": [res("lots")]}}, r"Pod.spec.containers\[0\].resources.requests\[cpu\]"),
    ],
)
def test_malformed_pods_are_rejected_naming_the_field(bad: dict, where: str) -> None:
    with pytest.raises(PolicyError, match=where):
        demand_from_pod(bad)


def test_owner_is_the_controller_or_the_nextflow_process() -> None:
    p = pod([res("1")])
    p["metadata"].update(namespace="ns", ownerReferences=[{"kind": "ReplicaSet", "name": "web-5d4f", "controller": True}])
    assert owner_of(p) == ("ns", "ReplicaSet", "web-5d4f")
    task = pod([res("1")])
    task["metadata"].update(namespace="wf", labels={"nextflow.io/processName": "NFCORE_RNASEQ:FASTQC"})
    assert owner_of(task) == ("wf", "NextflowProcess", "NFCORE_RNASEQ:FASTQC")
    assert owner_of(pod([res("1")])) is None
