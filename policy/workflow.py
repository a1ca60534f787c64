"""A workflow run's measured energy over its tasks, so that the parts add up to the run.

The run's energy is known exactly between counter reads at ``edges`` (the run's start, every
event Nextflow posted, its end): ``joules[i]`` over ``(edges[i], edges[i+1]]``. A task ran over
``[start, end]`` with a weight — its mean busy cores (Nextflow's ``%cpu`` / 100, else its
``cpus``). Within one segment the power is taken as constant (nothing finer was read), so a
segment's energy is split by time × weight::

    task t in segment i  =  joules[i] × overlap(t, i) × w_t / Σ_u overlap(u, i) × w_u

A segment no task overlaps (the run's head before the first task, waits between tasks) goes to
``outside`` — the workflow manager and the node's idle while no task ran. Conservation:
Σ tasks + outside = Σ joules, exactly (``outside`` is the remainder).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def split_over_tasks(
    edges: Sequence[float], joules: Sequence[float], tasks: Sequence[tuple[float, float, float]]
) -> tuple[list[float], float]:
    """``(joules per task, outside)`` for tasks given as ``(start, end, weight)``."""
    if len(edges) != len(joules) + 1:
        raise ValueError(f"{len(edges)} edges for {len(joules)} segments")
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
    outside = math.fsum(seg.tolist()) - math.fsum(per_task.tolist())
    return per_task.tolist(), outside


__all__ = ["split_over_tasks"]
