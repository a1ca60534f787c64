"""Attribution: pods plus the idle and system buckets equal the node's energy, every interval."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joulesched.policy.attribution import Attribution, PodUsage, attribute
from joulesched.policy.energy import NodeSplit


def split(cpu: float = 0.0, dram: float = 0.0, other: float = 0.0, gpus: dict[str, float] | None = None) -> NodeSplit:
    gpus = gpus or {}
    domains = {"cpu": cpu, "dram": dram, "gpu": sum(gpus.values()), "other": other}
    return NodeSplit("test", sum(domains.values()), domains, gpus, None, {})


def total(result: Attribution, domain: str) -> float:
    return sum(d.get(domain, 0.0) for d in result.pods.values()) + sum(
        b.get(domain, 0.0) for b in result.buckets.values()
    )


def assert_conserved(s: NodeSplit, result: Attribution) -> None:
    for domain, joules in s.domains.items():
        assert total(result, domain) == pytest.approx(joules, rel=1e-9, abs=1e-9), domain
    for part in [*result.pods.values(), *result.buckets.values()]:
        assert all(v >= 0 for v in part.values()), part


def test_dynamic_energy_follows_cpu_time_and_idle_follows_requests() -> None:
    s = split(cpu=150.0, dram=50.0)  # 200 J in 1 s; idle 100 W
    pods = {"a": PodUsage(3.0, requests_millicores=1000), "b": PodUsage(1.0, requests_millicores=3000)}
    result = attribute(s, 1.0, 5.0, pods, idle_watts=100.0, gpu_idle_watts={}, gpu_other_use={}, policy="requests")
    # dynamic 100 J: a 3/5, b 1/5, system 1/5; idle 100 J: a 1/4, b 3/4
    assert sum(result.pods["a"].values()) == pytest.approx(60.0 + 25.0)
    assert sum(result.pods["b"].values()) == pytest.approx(20.0 + 75.0)
    assert sum(result.buckets["system"].values()) == pytest.approx(20.0)
    assert sum(result.buckets["idle"].values()) == pytest.approx(0.0)
    assert result.pods["a"]["dram"] == pytest.approx(85.0 * 50 / 200)  # a pod's share spans the domains
    assert_conserved(s, result)


def test_bucket_policy_keeps_idle_out_of_pods() -> None:
    s = split(cpu=200.0)
    pods = {"a": PodUsage(2.0, requests_millicores=1000)}
    result = attribute(s, 1.0, 4.0, pods, idle_watts=120.0, gpu_idle_watts={}, gpu_other_use={}, policy="bucket")
    assert result.pods["a"]["cpu"] == pytest.approx(40.0)
    assert result.buckets["idle"]["cpu"] == pytest.approx(120.0)
    assert result.buckets["system"]["cpu"] == pytest.approx(40.0)
    assert_conserved(s, result)


def test_requests_policy_without_any_request_falls_back_to_the_idle_bucket() -> None:
    s = split(cpu=100.0)
    result = attribute(
        s, 1.0, 1.0, {"a": PodUsage(1.0)}, idle_watts=60.0, gpu_idle_watts={}, gpu_other_use={}, policy="requests"
    )
    assert result.buckets["idle"]["cpu"] == pytest.approx(60.0)
    assert result.pods["a"]["cpu"] == pytest.approx(40.0)


def test_cgroup_time_above_node_time_never_gives_out_more_than_exists() -> None:
    s = split(cpu=100.0)
    pods = {"a": PodUsage(3.0), "b": PodUsage(3.0)}  # 6 s of pod time, /proc/stat said 5 s
    result = attribute(s, 1.0, 5.0, pods, idle_watts=0.0, gpu_idle_watts={}, gpu_other_use={}, policy="bucket")
    assert result.pods["a"]["cpu"] == pytest.approx(50.0)
    assert result.buckets["system"]["cpu"] == pytest.approx(0.0)
    assert_conserved(s, result)


def test_idle_estimate_above_the_measured_energy_is_capped() -> None:
    s = split(cpu=30.0)
    result = attribute(
        s, 1.0, 1.0, {"a": PodUsage(1.0, 100)}, idle_watts=500.0, gpu_idle_watts={}, gpu_other_use={}, policy="bucket"
    )
    assert result.buckets["idle"]["cpu"] == pytest.approx(30.0)
    assert_conserved(s, result)


def test_gpu_energy_follows_per_process_use() -> None:
    s = split(cpu=10.0, gpus={"gpu-0": 300.0, "gpu-1": 60.0})
    pods = {"train": PodUsage(1.0, 1000, {"gpu-0": 0.6}), "infer": PodUsage(0.5, 500, {"gpu-0": 0.2})}
    result = attribute(
        s,
        1.0,
        2.0,
        pods,
        idle_watts=0.0,
        gpu_idle_watts={"gpu-0": 60.0, "gpu-1": 60.0},
        gpu_other_use={"gpu-0": 0.2},
        policy="requests",
    )
    # gpu-0: idle 60 J to its pods by use (3:1), dynamic 240 J by use over all processes (0.6:0.2:0.2)
    assert result.pods["train"]["gpu"] == pytest.approx(45.0 + 144.0)
    assert result.pods["infer"]["gpu"] == pytest.approx(15.0 + 48.0)
    # gpu-1: unused, all idle -> idle bucket; the non-pod process's share of gpu-0 -> system
    assert result.buckets["idle"]["gpu"] == pytest.approx(60.0)
    assert result.buckets["system"]["gpu"] == pytest.approx(48.0)
    assert_conserved(s, result)


def test_no_energy_at_all_gives_zeros() -> None:
    s = split()
    result = attribute(
        s, 1.0, 0.0, {"a": PodUsage(0.0)}, idle_watts=10.0, gpu_idle_watts={}, gpu_other_use={}, policy="requests"
    )
    assert_conserved(s, result)


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="idle_policy"):
        attribute(split(cpu=1.0), 1.0, 1.0, {}, idle_watts=0.0, gpu_idle_watts={}, gpu_other_use={}, policy="even")


energy = st.floats(min_value=0.0, max_value=5_000.0, allow_nan=False)
cpu_time = st.floats(min_value=0.0, max_value=64.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    cpu=energy,
    dram=energy,
    other=energy,
    gpu=st.dictionaries(st.sampled_from(["gpu-0", "gpu-1"]), energy, max_size=2),
    node_busy=cpu_time,
    pods=st.dictionaries(
        st.text("abcdef", min_size=1, max_size=4),
        st.tuples(
            cpu_time,
            st.floats(0, 8000),
            st.dictionaries(st.sampled_from(["gpu-0", "gpu-1"]), st.floats(0, 1), max_size=2),
        ),
        max_size=12,
    ),
    idle=st.floats(0, 2000),
    gpu_idle=st.floats(0, 500),
    other_use=st.floats(0, 1),
    policy=st.sampled_from(["requests", "bucket"]),
    dt=st.floats(0.1, 30),
)
def test_conservation_holds_for_any_interval(
    cpu: float,
    dram: float,
    other: float,
    gpu: dict[str, float],
    node_busy: float,
    pods: dict[str, tuple[float, float, dict[str, float]]],
    idle: float,
    gpu_idle: float,
    other_use: float,
    policy: str,
    dt: float,
) -> None:
    s = split(cpu, dram, other, gpu)
    usages = {uid: PodUsage(c, r, g) for uid, (c, r, g) in pods.items()}
    result = attribute(
        s,
        dt,
        node_busy,
        usages,
        idle_watts=idle,
        gpu_idle_watts=dict.fromkeys(gpu, gpu_idle),
        gpu_other_use=dict.fromkeys(gpu, other_use),
        policy=policy,
    )
    assert_conserved(s, result)
    assert set(result.pods) == set(usages)
