"""policy/tenant.py: the VM's share, the steps of the provider's windows, and the CPU split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from joulesched.policy import tenant


@pytest.mark.parametrize(
    ("times", "values", "edges", "expected"),
    [
        ([7, 22, 37, 52, 67], [0, 15, 30, 45, 60], [0, 60, 120], [53, 7]),
        ([0, 30], [0, 30], [0, 10, 20, 30], [10, 10, 10]),
        ([7, 22, 37], [10, 25, 5], [0, 30, 60], [15 + 5 * 8 / 15, 5 * 7 / 15]),
        ([100, 130], [0, 30], [0, 60], [0]),
        ([5], [3], [0, 60], [0]),
    ],
    ids=[
        "samples off the edges: each interval gets its time's part",
        "one interval between two samples split evenly",
        "a drop is a restart from zero",
        "samples outside the intervals count nowhere",
        "a single sample shows no growth",
    ],
)
def test_counter_increase(times: list[float], values: list[float], edges: list[float], expected: list[float]) -> None:
    assert tenant.counter_increase(times, values, edges).tolist() == pytest.approx(expected)


def test_counter_increase_adds_up_to_the_counters_growth_wherever_the_samples_fall() -> None:
    rng = np.random.default_rng(7)
    times = np.sort(rng.uniform(0, 600, 40))
    values = np.cumsum(rng.uniform(0, 5, 40))
    edges = np.arange(0, 660, 60.0)
    assert tenant.counter_increase(times.tolist(), values.tolist(), edges).sum() == pytest.approx(
        values[-1] - values[0]
    )


def test_steps_are_whole_windows_and_a_missing_window_is_a_gap() -> None:
    starts = [0, 30, 60, 120, 150]  # the window at 90 was not pushed
    joules = [1.0, 2.0, 3.0, 5.0, 6.0]
    out = tenant.step_energy(starts, joules, 30, [60, 120, 180], 60)
    assert out[0] == 3.0 and math.isnan(out[1]) and out[2] == 11.0


@pytest.mark.parametrize(
    ("step", "ends", "message"),
    [(45, [45], "whole multiple"), (60, [75], "start on multiples")],
    ids=["a step that is not a whole number of windows", "steps that cut windows"],
)
def test_steps_that_cut_windows_are_refused(step: float, ends: list[float], message: str) -> None:
    with pytest.raises(tenant.ShareError, match=message):
        tenant.step_energy([0, 30], [1.0, 1.0], 30, ends, step)


def test_the_split_conserves_the_vms_energy_and_keeps_idle_steps_and_gaps_visible() -> None:
    vm = np.array([100.0, 50.0, np.nan])
    cpu = np.array([[3.0, 0.0, 1.0], [1.0, 0.0, 1.0], [np.nan, 0.0, 1.0]])
    pods, unattributed = tenant.split_by_cpu(vm, cpu)
    assert pods[:, 0].tolist() == [75.0, 25.0, 0.0]
    assert pods[:, 1].tolist() == [0.0, 0.0, 0.0] and unattributed[1] == 50.0
    assert np.isnan(pods[:, 2]).all() and np.isnan(unattributed[2])
    assert pods[:, :2].sum() + unattributed[:2].sum() == pytest.approx(150.0)


@pytest.mark.parametrize(
    ("vcpus", "cores", "threads", "message"),
    [
        (0, 32, 2, "vCPU count must be > 0"),
        (8, 0, 2, "logical CPUs"),
        (80, 32, 2, "would exceed 1"),
    ],
    ids=["a VM without vCPUs", "a server without cores", "more vCPUs than the server has"],
)
def test_a_vcpu_share_that_cannot_be_is_refused(vcpus: float, cores: float, threads: float, message: str) -> None:
    with pytest.raises(tenant.ShareError, match=message):
        tenant.vcpu_share(vcpus, cores, threads)


def test_the_power_model_prefers_the_rated_power_above_idle() -> None:
    assert tenant.server_power_model([200.0, 150.0, 300.0], 600.0) == (150.0, 600.0)
    assert tenant.server_power_model([200.0, 150.0, 300.0], 100.0) == (150.0, 300.0)
    assert tenant.server_power_model([200.0, 150.0, 300.0], None) == (150.0, 300.0)
    assert tenant.utilisation_on_line(150.0, 600.0, 375.0) == 0.5
    with pytest.raises(tenant.ShareError, match="no window"):
        tenant.server_power_model([], 600.0)
