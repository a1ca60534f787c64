"""policy.workflow.split_over_tasks: a run's segments split over its tasks by time × weight, by a
sweep whose memory is O(tasks + segments), never a tasks × segments table."""

from __future__ import annotations

import math
import random
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joulesched.policy.workflow import split_over_tasks


def dense_split(
    edges: list[float], joules: list[float], tasks: list[tuple[float, float, float]]
) -> tuple[list[float], float]:
    """The rule as first written: a tasks × segments table of overlap × weight (the reference)."""
    e = np.asarray(edges, dtype=np.float64)
    seg = np.asarray(joules, dtype=np.float64)
    shares = np.zeros((len(tasks), len(seg)))
    for k, (start, end, weight) in enumerate(tasks):
        if not (end > start and weight > 0 and math.isfinite(weight)):
            continue
        overlap = np.clip(np.minimum(e[1:], end) - np.maximum(e[:-1], start), 0.0, None)
        shares[k] = overlap * weight
    total = shares.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(total > 0, shares / np.where(total > 0, total, 1.0), 0.0)
    per_task = (fraction * seg).sum(axis=1)
    return per_task.tolist(), math.fsum(seg.tolist()) - math.fsum(per_task.tolist())


def test_a_segment_is_split_by_time_times_weight_and_the_rest_is_outside() -> None:
    # segments [0,2] 20 J, [2,6] 40 J, [6,8] 20 J, [8,8] 5 J (a zero-length one)
    edges, joules = [0.0, 2.0, 6.0, 8.0, 8.0], [20.0, 40.0, 20.0, 5.0]
    tasks = [(2.0, 6.0, 1.0), (2.0, 8.0, 3.0), (9.0, 12.0, 1.0), (1.0, 1.0, 2.0), (0.0, 4.0, 0.0)]
    per_task, outside = split_over_tasks(edges, joules, tasks)
    assert per_task == pytest.approx([10.0, 30.0 + 20.0, 0.0, 0.0, 0.0])
    assert outside == pytest.approx(20.0 + 5.0)


def test_weights_added_and_taken_off_leave_no_rounding_in_a_segment_no_task_runs_in() -> None:
    """0.001 + 0.7 + 0.2 - 0.2 - 0.7 - 0.001 is not 0 in floats: left in the free segment [3, 4]
    the residue made its total ~1e-17 and the prefix sum there ~1e19, and the task after it got
    430 J of its 400 J (found by comparing with the table on random runs)."""
    edges, joules = [float(i) for i in range(9)], [100.0] * 8
    tasks = [(0.0, 2.5, 0.001), (4.5, 7.5, 0.3), (0.5, 2.5, 0.7), (0.0, 1.5, 0.2)]
    per_task, outside = split_over_tasks(edges, joules, tasks)
    assert per_task == pytest.approx(dense_split(edges, joules, tasks)[0], rel=1e-12)
    assert per_task[1] == pytest.approx(400.0)  # alone in the segments [4, 8]: all of their energy
    assert outside == pytest.approx(800.0 - math.fsum(per_task))


def test_edges_that_go_back_are_refused_naming_the_edge() -> None:
    with pytest.raises(ValueError, match=r"edge 2 is 1\.0 after 3\.0"):
        split_over_tasks([0.0, 3.0, 1.0], [1.0, 1.0], [])
    with pytest.raises(ValueError, match="3 edges for 1 segments"):
        split_over_tasks([0.0, 1.0, 2.0], [1.0], [])


times = st.floats(-5.0, 25.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.sampled_from([0.0, 0.25, 1.0, 2.5, 7.0]), min_size=1, max_size=12),
    energy=st.lists(st.floats(0.0, 500.0), min_size=12, max_size=12),
    tasks=st.lists(
        st.tuples(times, times, st.sampled_from([0.0, -1.0, 0.5, 1.0, 3.7, math.inf, math.nan])), max_size=10
    ),
)
def test_the_sweep_gives_what_the_tasks_by_segments_table_gave(
    steps: list[float], energy: list[float], tasks: list[tuple[float, float, float]]
) -> None:
    edges = [0.0]
    for s in steps:
        edges.append(edges[-1] + s)  # equal edges too: a zero-length segment
    joules = energy[: len(steps)]
    got, outside = split_over_tasks(edges, joules, tasks)
    want, want_outside = dense_split(edges, joules, tasks)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert outside == pytest.approx(want_outside, rel=1e-9, abs=1e-9)
    assert math.fsum(got) + outside == pytest.approx(math.fsum(joules), rel=1e-12, abs=1e-9)


def test_random_runs_match_the_table_on_float_times() -> None:
    rng = random.Random(7)
    for _ in range(50):
        m = rng.randint(1, 40)
        edges = sorted(rng.uniform(0.0, 100.0) for _ in range(m + 1))
        joules = [rng.uniform(0.0, 1000.0) for _ in range(m)]
        tasks = []
        for _ in range(rng.randint(0, 30)):
            a, b = rng.uniform(-10.0, 110.0), rng.uniform(-10.0, 110.0)
            tasks.append((min(a, b), max(a, b), rng.choice([0.1, 1.0, 2.0, 16.0])))
        got, outside = split_over_tasks(edges, joules, tasks)
        want, want_outside = dense_split(edges, joules, tasks)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
        assert outside == pytest.approx(want_outside, rel=1e-9, abs=1e-6)


def test_a_large_run_is_split_in_memory_linear_in_tasks_plus_segments() -> None:
    """2 000 tasks over 6 000 reads (a run the agent closes under its 128 Mi limit): a tasks ×
    segments float64 table alone is 2 000 × 6 000 × 8 B = 96 MB; the sweep stays within a few
    hundred bytes per task and per segment."""
    n, m = 2000, 6000
    edges = [i * 0.5 for i in range(m + 1)]
    joules = [57.5] * m
    tasks = [(k * 1.5, k * 1.5 + 3.0 + (k % 7) * 20.0, 1.0 + k % 4) for k in range(n)]
    tracemalloc.start()
    try:
        per_task, outside = split_over_tasks(edges, joules, tasks)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(per_task) == n
    assert math.fsum(per_task) + outside == pytest.approx(57.5 * m)
    assert peak < 256 * (n + m), f"peak {peak / 2**20:.1f} MiB for {n} tasks and {m} segments"
