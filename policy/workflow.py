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

The split is a sweep, never a tasks × segments table: a run of thousands of tasks has thousands
of reads, and such a table (hundreds of MiB) does not fit the agent's memory limit. A task covers
whole segments between the two it starts and ends in, where its overlap is the segment's length;
so the weighted time of every segment is a difference array over those whole segments plus the
two partial ones; a task's energy is its shares of its two partial segments plus its weight × a
prefix sum, over its whole segments, of what a weight of 1 over a whole segment gets. Memory is
O(tasks + segments), time O((tasks + segments) log segments).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

_Cover = tuple[int, int, float, float] | None  # (first segment, last segment, their overlaps)


def _cover(e: Sequence[float], start: float, end: float, weight: float) -> _Cover:
    """The segments ``[start, end]`` overlaps for a positive length, and the overlap of the
    first and the last (every segment between is overlapped whole); None: none, or no weight."""
    if not (end > start and weight > 0 and math.isfinite(weight)):
        return None
    m = len(e) - 1
    first = max(bisect_right(e, start) - 1, 0)  # the first segment that ends after start
    last = min(bisect_left(e, end) - 1, m - 1)  # the last that begins before end
    if first > last:
        return None
    head = max(min(e[first + 1], end) - max(e[first], start), 0.0)
    tail = max(min(e[last + 1], end) - max(e[last], start), 0.0)
    return first, last, head, tail


def split_over_tasks(
    edges: Sequence[float], joules: Sequence[float], tasks: Sequence[tuple[float, float, float]]
) -> tuple[list[float], float]:
    """``(joules per task, outside)`` for tasks given as ``(start, end, weight)``; ``edges`` must
    not decrease (they are the times of successive reads)."""
    if len(edges) != len(joules) + 1:
        raise ValueError(f"{len(edges)} edges for {len(joules)} segments")
    e = [float(x) for x in edges]
    for i, (a, b) in enumerate(itertools.pairwise(e)):
        if not b >= a:
            raise ValueError(f"edges must not decrease: edge {i + 1} is {b!r} after {a!r}")
    seg = [float(j) for j in joules]
    m = len(seg)
    length = [b - a for a, b in itertools.pairwise(e)]
    # each segment's Σ overlap × weight: the partial first and last segments directly, the whole
    # ones between as a difference array of weight
    partial = [0.0] * m
    whole = [0.0] * (m + 1)
    covering = [0] * (m + 1)  # how many tasks cover each segment whole (a difference array too)
    for start, end, weight in tasks:
        cover = _cover(e, start, end, weight)
        if cover is None:
            continue
        first, last, head, tail = cover
        partial[first] += head * weight
        if last > first:
            partial[last] += tail * weight
            whole[first + 1] += weight
            whole[last] -= weight
            covering[first + 1] += 1
            covering[last] -= 1
    total = [0.0] * m  # each segment's Σ overlap × weight
    running, count = 0.0, 0
    for i in range(m):
        running, count = running + whole[i], count + covering[i]
        if count == 0:
            running = 0.0  # no rounding left over from weights added and taken off: a free segment is 0
        covering[i] = count
        total[i] = partial[i] + running * length[i]

    def share(i: int, weighted: float) -> float:
        """Segment i's joules for ``weighted`` overlap × weight (the fraction first: a tiny
        overlap over a tiny total is a whole share, not an overflow)."""
        return seg[i] * (weighted / total[i]) if total[i] > 0 else 0.0

    # prefix[i]: Σ over the segments before i of what a weight of 1 over them whole gets; only
    # over the segments some task covers whole (the others are in no task's sum, and a partial
    # overlap of 1e-16 s there would make the share of a whole one 1e16 times the segment)
    prefix = [0.0, *itertools.accumulate(share(i, length[i]) if covering[i] else 0.0 for i in range(m))]
    per_task: list[float] = []
    for start, end, weight in tasks:
        cover = _cover(e, start, end, weight)
        if cover is None:
            per_task.append(0.0)
            continue
        first, last, head, tail = cover
        if last == first:
            per_task.append(share(first, head * weight))
        else:
            inner = weight * (prefix[last] - prefix[first + 1])
            per_task.append(share(first, head * weight) + inner + share(last, tail * weight))
    outside = math.fsum(seg) - math.fsum(per_task)
    return per_task, outside


__all__ = ["split_over_tasks"]
