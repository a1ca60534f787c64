"""How well measurement methods attribute energy to tasks, checked against the model's truth.

**Ground truth.** Between two events a node's power ``P`` and the busy cores ``U`` of its
running pods are constant. At every instant the node's power is split among its running pods
in proportion to the cores each keeps busy (equally when none is busy); idle time with no
pod belongs to no pod. A pod's true energy is the integral of its share. Node energy is
``∫ P``. Both are exact (piecewise-constant integrands).

**Methods** (each gives an energy per pod, summed per workflow):

* ``counter_edges`` — what the agent does: read the node's energy counter and every pod's
  CPU time at each pod start and end on the node, and split each counter difference by the
  pods' CPU-time differences with the agent's own :func:`policy.attribution.attribute`. Exact in the model (between task edges nothing changes); its
  real-world error is the sensor's (what RAPL/IPMI covers), not the method's.
* ``cpu_share`` — one split per task over its whole life: node energy during the task ×
  the task's CPU time / all CPU time on the node during the task.
* ``pod_increase_{15,30}s`` — a per-pod energy counter scraped every 15/30 s, summed with
  ``increase(pod_energy[D])`` at the workflow's end (``D`` its duration), with Prometheus'
  extrapolation (``promql/functions.go`` ``extrapolatedRate``). A series with fewer than two
  samples in the range gives nothing.
* ``pod_sum_over_time_{15,30}s`` — the naive way: ``sum_over_time(pod_power[D]) × interval``,
  each sampled power standing for a whole interval.
* ``node_increase_{15,30}s``, ``node_sum_over_time_{15,30}s`` — the same two queries on the
  node-level counter and power of the nodes the workflow ran on, compared with the true node
  energy over the workflow's window. Only meaningful when the workflow ran alone on those
  nodes (as in the published comparison), which is how :func:`attribution_runs` runs it.

Scrape phase matters for short workflows: every sampled method is evaluated at
``PHASES`` evenly spaced phases; ``error_percent`` is the one at the seed's phase, with the
mean and worst absolute error over all phases beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from joulesched.policy.attribution import PodUsage, attribute
from joulesched.policy.energy import NodeSplit
from joulesched.sim.cluster import ClusterSpec
from joulesched.sim.engine import SimResult
from joulesched.sim.model import Workload

INTERVALS = (15.0, 30.0)
PHASES = 12
METHODS = (
    "counter_edges",
    "cpu_share",
    "pod_increase_15s",
    "pod_increase_30s",
    "pod_sum_over_time_15s",
    "pod_sum_over_time_30s",
    "node_increase_15s",
    "node_increase_30s",
    "node_sum_over_time_15s",
    "node_sum_over_time_30s",
)


@dataclass(frozen=True)
class NodeTrack:
    """One node's steps: from ``t[k]`` on, power ``p[k]``, busy cores ``u[k]``, ``n[k]`` pods."""

    t: np.ndarray
    p: np.ndarray
    u: np.ndarray
    n: np.ndarray

    @classmethod
    def of(cls, steps: Sequence[tuple[float, float, float, int]]) -> NodeTrack:
        arr = np.array(steps, dtype=float).reshape(-1, 4)
        return cls(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3])

    def _cumulative(self, rate: np.ndarray) -> np.ndarray:
        dt = np.diff(self.t)
        return np.concatenate(([0.0], np.cumsum(rate[:-1] * dt)))

    def energy_fn(self) -> np.ndarray:
        return self._cumulative(self.p)

    def cpu_fn(self) -> np.ndarray:
        return self._cumulative(self.u)

    def share_fns(self) -> tuple[np.ndarray, np.ndarray]:
        """Cumulative power per busy core (U > 0), and per pod where no pod is busy."""
        busy = self.u > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            per_core = np.where(busy, self.p / np.where(busy, self.u, 1.0), 0.0)
            per_pod = np.where(~busy & (self.n > 0), self.p / np.maximum(self.n, 1.0), 0.0)
        return self._cumulative(per_core), self._cumulative(per_pod)

    def at(self, cumulative: np.ndarray, when: np.ndarray | float) -> np.ndarray:
        value: np.ndarray = np.interp(when, self.t, cumulative)
        return value

    def step_at(self, values: np.ndarray, when: np.ndarray) -> np.ndarray:
        """The step function's value at ``when`` (the last step starting at or before it)."""
        k = np.searchsorted(self.t, when, side="right") - 1
        return values[np.clip(k, 0, len(values) - 1)]


def prometheus_increase(times: np.ndarray, values: np.ndarray, range_start: float, range_end: float) -> float | None:
    """``increase()`` of one counter series over ``(range_start, range_end]`` (Prometheus 3)."""
    inside = (times > range_start) & (times <= range_end)
    t, v = times[inside], values[inside]
    if len(t) < 2:
        return None
    result = float(v[-1] - v[0])
    resets = np.flatnonzero(np.diff(v) < 0)
    result += float(v[resets].sum())
    sampled = float(t[-1] - t[0])
    average = sampled / (len(t) - 1)
    to_start = float(t[0] - range_start)
    to_end = float(range_end - t[-1])
    threshold = average * 1.1
    if to_start >= threshold:
        to_start = average / 2
    if result > 0 and v[0] >= 0:
        to_zero = sampled * (float(v[0]) / result)
        to_start = min(to_start, to_zero)
    if to_end >= threshold:
        to_end = average / 2
    return result * (sampled + to_start + to_end) / sampled


def _scrapes(start: float, end: float, interval: float, phase: float) -> np.ndarray:
    """Scrape times ``phase + k·interval`` in ``(start, end]``."""
    first = np.floor((start - phase) / interval) + 1
    last = np.floor((end - phase) / interval)
    if last < first:
        return np.zeros(0)
    return phase + np.arange(first, last + 1) * interval


@dataclass
class PodTruth:
    node: np.ndarray
    start: np.ndarray
    end: np.ndarray
    usage: np.ndarray
    truth: np.ndarray  # joules
    counter_edges: np.ndarray
    cpu_share: np.ndarray


class Attribution:
    """Per-pod truth and estimates for one run recorded with ``record_segments``."""

    def __init__(self, result: SimResult, usage: Sequence[float]) -> None:
        if not result.segments:
            raise ValueError("the run was not recorded with record_segments=True")
        self.result = result
        self.tracks = [NodeTrack.of(steps) for steps in result.segments]
        pods = result.pods
        ran = ~np.isnan(pods.start)
        self.ran = ran
        self.node = pods.node
        self.start = pods.start
        self.end = pods.end
        self.usage = np.asarray(usage, dtype=float)
        self._fns = [(tr.energy_fn(), tr.cpu_fn(), *tr.share_fns()) for tr in self.tracks]
        m = len(self.usage)
        self.truth = np.zeros(m)
        self.counter_edges = np.zeros(m)
        self.cpu_share = np.zeros(m)
        for n, tr in enumerate(self.tracks):
            idx = np.flatnonzero(ran & (self.node == n))
            if len(idx) == 0:
                continue
            energy, cpu, per_core, per_pod = self._fns[n]
            s, e, u = self.start[idx], self.end[idx], self.usage[idx]
            self.truth[idx] = u * (tr.at(per_core, e) - tr.at(per_core, s)) + (tr.at(per_pod, e) - tr.at(per_pod, s))
            self.counter_edges[idx] = self._counter_edges(tr, energy, s, e, u)
            d_energy = tr.at(energy, e) - tr.at(energy, s)
            d_cpu = tr.at(cpu, e) - tr.at(cpu, s)
            with np.errstate(divide="ignore", invalid="ignore"):
                self.cpu_share[idx] = np.where(d_cpu > 0, d_energy * u * (e - s) / d_cpu, 0.0)

    @staticmethod
    def _counter_edges(tr: NodeTrack, energy: np.ndarray, s: np.ndarray, e: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The agent's attribution (:func:`policy.attribution.attribute`) at every pod edge.

        The node's energy counter and every pod's CPU time are read at each pod start and end on
        the node; each read interval's energy ``E`` goes to :func:`attribute` with the running
        pods' CPU time ``u × dt``, equal requests and the ``requests`` idle policy. Between two
        reads the node's power is constant: while a pod is busy all of ``E`` is dynamic (idle
        power 0, as the ground truth shares the whole power by busy cores); while none is, the
        node's power is its idle power (``E / dt``), which the requests split equally among the
        pods present.
        """
        reads = np.unique(np.concatenate((s, e)))
        if len(reads) < 2:
            return np.zeros(len(s))
        d_energy = np.diff(tr.at(energy, reads)).tolist()
        dt = np.diff(reads).tolist()
        first = np.searchsorted(reads, s).tolist()  # the pod runs over read intervals first..last-1
        last = np.searchsorted(reads, e).tolist()
        usage = [float(x) for x in u]
        uids = [str(j) for j in range(len(s))]
        starting: dict[int, list[int]] = {}
        for j, k in enumerate(first):
            starting.setdefault(k, []).append(j)
        joules = [0.0] * len(s)
        running: set[int] = set()
        for k in range(len(dt)):
            running.update(starting.get(k, ()))
            running.difference_update([j for j in running if last[j] <= k])
            if not running:
                continue
            cpu = {uids[j]: PodUsage(usage[j] * dt[k], 1.0) for j in sorted(running)}
            busy = sum(c.cpu_seconds for c in cpu.values())
            split = NodeSplit("model", d_energy[k], {"cpu": d_energy[k]}, {}, None, {})
            shares = attribute(
                split,
                dt[k],
                busy,
                cpu,
                idle_watts=0.0 if busy > 0 else d_energy[k] / dt[k],
                gpu_idle_watts={},
                gpu_other_use={},
                policy="requests",
            )
            for j in running:
                joules[j] += sum(shares.pods[uids[j]].values())
        return np.array(joules)

    # -- Prometheus ---------------------------------------------------------------------------

    def _pod_counter(self, i: int, times: np.ndarray) -> np.ndarray:
        n = int(self.node[i])
        tr = self.tracks[n]
        _, _, per_core, per_pod = self._fns[n]
        s, u = self.start[i], self.usage[i]
        counter: np.ndarray = u * (tr.at(per_core, times) - tr.at(per_core, s)) + (
            tr.at(per_pod, times) - tr.at(per_pod, s)
        )
        return counter

    def _pod_power(self, i: int, times: np.ndarray) -> np.ndarray:
        tr = self.tracks[int(self.node[i])]
        p, u, n = tr.step_at(tr.p, times), tr.step_at(tr.u, times), tr.step_at(tr.n, times)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(
                u > 0, p * self.usage[i] / np.where(u > 0, u, 1.0), np.where(n > 0, p / np.maximum(n, 1.0), 0.0)
            )

    def workflow(
        self, pods: np.ndarray, phases: Sequence[float], intervals: Sequence[float] = INTERVALS
    ) -> dict[str, object]:
        """Every method for the pods of one workflow, at each phase (a fraction of the interval)."""
        pods = pods[self.ran[pods]]
        w_start = float(self.start[pods].min())
        w_end = float(self.end[pods].max())
        truth = float(self.truth[pods].sum())
        nodes = np.unique(self.node[pods]).astype(int)
        node_truth = 0.0
        for n in nodes:
            tr = self.tracks[n]
            energy = self._fns[n][0]
            node_truth += float(tr.at(energy, w_end) - tr.at(energy, w_start))
        est: dict[str, list[float]] = {m: [] for m in METHODS}
        breakdown: dict[str, list[dict[str, float]]] = {}
        for phase_fraction in phases:
            est["counter_edges"].append(float(self.counter_edges[pods].sum()))
            est["cpu_share"].append(float(self.cpu_share[pods].sum()))
            for interval in intervals:
                phase = phase_fraction * interval
                scrapes = _scrapes(w_start, w_end, interval, phase)
                tag = f"{interval:g}s"
                inc_total = sot_total = 0.0
                missed_inc = missed_sot = 0.0
                for i in pods:
                    times = scrapes[(scrapes >= self.start[i]) & (scrapes < self.end[i])]
                    if len(times) >= 2:
                        value = prometheus_increase(times, self._pod_counter(i, times), w_start, w_end)
                        inc_total += value or 0.0
                    else:
                        missed_inc += self.truth[i]
                    if len(times):
                        sot_total += float(self._pod_power(i, times).sum()) * interval
                    else:
                        missed_sot += self.truth[i]
                est[f"pod_increase_{tag}"].append(inc_total)
                est[f"pod_sum_over_time_{tag}"].append(sot_total)
                node_inc = node_sot = 0.0
                true_mean = node_truth / (w_end - w_start) if w_end > w_start else 0.0
                sampled_power = []
                for n in nodes:
                    tr = self.tracks[n]
                    energy = self._fns[n][0]
                    value = (
                        prometheus_increase(scrapes, tr.at(energy, scrapes), w_start, w_end)
                        if len(scrapes) >= 2
                        else None
                    )
                    node_inc += value or 0.0
                    watts = tr.step_at(tr.p, scrapes)
                    node_sot += float(watts.sum()) * interval
                    sampled_power.append(watts)
                est[f"node_increase_{tag}"].append(node_inc)
                est[f"node_sum_over_time_{tag}"].append(node_sot)
                total_sampled = np.sum(sampled_power, axis=0) if sampled_power and len(scrapes) else np.zeros(0)
                breakdown.setdefault(tag, []).append(
                    {
                        "samples": float(len(scrapes)),
                        "window_coverage_percent": 100.0 * (len(scrapes) * interval / (w_end - w_start) - 1.0)
                        if w_end > w_start
                        else 0.0,
                        "sampled_power_bias_percent": 100.0 * (float(total_sampled.mean()) / true_mean - 1.0)
                        if len(total_sampled) and true_mean
                        else 0.0,
                        "energy_in_tasks_unsampled_percent": 100.0 * missed_sot / truth if truth else 0.0,
                        "energy_in_tasks_under_two_samples_percent": 100.0 * missed_inc / truth if truth else 0.0,
                    }
                )
        durations = self.end[pods] - self.start[pods]
        methods: dict[str, dict[str, float]] = {}
        for m, values in est.items():
            ref = node_truth if m.startswith("node_") else truth
            errors = np.array([100.0 * (v - ref) / ref if ref else 0.0 for v in values])
            methods[m] = {
                "joules": values[0],
                "error_percent": float(errors[0]),
                "mean_abs_error_percent": float(np.abs(errors).mean()),
                "max_abs_error_percent": float(np.abs(errors).max()),
            }
        for m, per_pod in (("counter_edges", self.counter_edges), ("cpu_share", self.cpu_share)):
            t = self.truth[pods]
            ok = t > 0
            methods[m]["task_mape_percent"] = (
                float(np.mean(np.abs(per_pod[pods][ok] - t[ok]) / t[ok]) * 100.0) if ok.any() else 0.0
            )
        mean_breakdown: dict[str, dict[str, object]] = {}
        for tag, rows in breakdown.items():
            mean_breakdown[tag] = {
                "samples": float(np.mean([r["samples"] for r in rows])),
                "window_coverage_abs_percent": float(np.mean([abs(r["window_coverage_percent"]) for r in rows])),
                "sampled_power_bias_abs_percent": float(np.mean([abs(r["sampled_power_bias_percent"]) for r in rows])),
                "energy_in_tasks_unsampled_percent": float(
                    np.mean([r["energy_in_tasks_unsampled_percent"] for r in rows])
                ),
                "energy_in_tasks_under_two_samples_percent": float(
                    np.mean([r["energy_in_tasks_under_two_samples_percent"] for r in rows])
                ),
                "at_seed_phase": rows[0],
            }
        return {
            "tasks": len(pods),
            "duration_seconds": w_end - w_start,
            "median_task_seconds": float(np.median(durations)),
            "tasks_shorter_than_30s": int(np.count_nonzero(durations < 30.0)),
            "nodes": len(nodes),
            "truth_joules": truth,
            "node_truth_joules": node_truth,
            "methods": methods,
            "breakdown": mean_breakdown,
        }


def scrape_example(
    att: Attribution, pods: np.ndarray, name: str, phase_fraction: float, interval: float = 30.0
) -> dict[str, object]:
    """The summed power of the nodes a workflow used, and what 30 s scrapes of it see."""
    pods = pods[att.ran[pods]]
    w_start = float(att.start[pods].min())
    w_end = float(att.end[pods].max())
    nodes = np.unique(att.node[pods]).astype(int)
    margin = 2 * interval
    times = np.unique(np.concatenate([att.tracks[n].t for n in nodes]))
    times = times[(times >= w_start - margin) & (times <= w_end + margin)]
    times = np.unique(np.concatenate(([w_start - margin], times, [w_end + margin])))
    watts = sum(att.tracks[n].step_at(att.tracks[n].p, times) for n in nodes)
    scrapes = _scrapes(w_start, w_end, interval, phase_fraction * interval)
    sampled = sum(att.tracks[n].step_at(att.tracks[n].p, scrapes) for n in nodes) if len(scrapes) else np.zeros(0)
    return {
        "workflow": name,
        "start": w_start,
        "end": w_end,
        "t": times.tolist(),
        "watts": np.asarray(watts).tolist(),
        "scrape_t": scrapes.tolist(),
        "scrape_watts": np.asarray(sampled).tolist(),
    }


def phases_for(seed: int, count: int = PHASES) -> list[float]:
    """The seed's phase first, then ``count − 1`` more spread evenly over the interval."""
    first = float(np.random.default_rng(seed).uniform())
    return [first, *[(first + k / count) % 1.0 for k in range(1, count)]]


# -- the published comparison, by the window each approach sees -------------------------------------


@dataclass(frozen=True)
class StudySetup:
    """The four approaches of Thamm & Leser, "Strategies to Measure Energy Consumption Using RAPL
    During Workflow Execution on Commodity Clusters" (arXiv 2505.09375v2), as windows and sensors.

    * **wrapper** (their shell script): RAPL read when the script starts, before the Nextflow head
      pod exists, and after it ends — the whole run. The head pod starts ``head_startup_s`` before
      the first task (an assumption: the study gives only the delays below) and ends
      ``teardown_s`` after the last one.
    * **plug-in** (a Nextflow plug-in's observer): starts once Nextflow has loaded its plug-ins,
      ``plugin_delay_s`` after the wrapper (the study's measured mean delays), ends when the flow
      completes (the last task's end): it misses the head pod's start.
    * **in-workflow tasks** (a start task and a stop task in the workflow): start
      ``task_delay_s`` after the wrapper, end when the stop task runs after the last task.
    * **Prometheus**: ``sum_over_time(node_hwmon_power_average_watt{nodes}[D] @ end) × scrape``
      with D and end the run's (the study's query guide), on a power sensor that reports the mean
      of the last completed ``averaging_s`` interval, scraped every ``scrape_s`` seconds.

    The three counter approaches read RAPL (package + DRAM); the sensor reads the whole server.
    The model's node power is the whole server's (SPECpower curves, at the wall); RAPL is taken
    as that minus a constant ``uncovered`` part of the idle power, set from the study's own idle
    measurement (the sensor read 36.5 % above RAPL over an idle hour): uncovered = 0.365 / 1.365
    of idle.
    """

    head_startup_s: float = 15.0
    teardown_s: float = 2.0
    # the study's mean measurement-start delays after the shell script (s): plug-in, task
    plugin_delay_s: tuple[tuple[str, float], ...] = (("rnaseq", 3.6), ("quantms", 9.8), ("rangeland", 9.2))
    task_delay_s: tuple[tuple[str, float], ...] = (("rnaseq", 6.2), ("quantms", 10.8), ("rangeland", 9.8))
    stop_task_s: float = 0.0  # the study: the methods differ only by when they start
    uncovered_idle_fraction: float = 0.365 / 1.365
    averaging_s: float = 1.0
    scrape_s: float = 30.0

    def delay(self, table: tuple[tuple[str, float], ...], workflow: str) -> float:
        for prefix, seconds in table:
            if workflow.startswith(prefix):
                return seconds
        raise ValueError(f"workflow {workflow!r}: the study measured rnaseq, quantms and rangeland only")


# The study's Table 4 (counters, J, mean of 5 runs) and Table 5 (Prometheus at 30 s against the
# shell script of the same runs, J). Table 6 (10 s) is quoted in docs/sim.md.
STUDY_COUNTERS = {
    "rnaseq": {"wrapper": 393_906.17, "plugin": 393_151.76, "task": 392_469.08},
    "quantms": {"wrapper": 28_981.12, "plugin": 26_928.59, "task": 26_758.27},
    "rangeland": {"wrapper": 35_444.69, "plugin": 33_592.85, "task": 33_492.20},
}
STUDY_PROMETHEUS_30S = {
    "rnaseq": {"prometheus": 380_812.00, "wrapper": 395_829.96},
    "quantms": {"prometheus": 44_346.00, "wrapper": 31_015.71},
    "rangeland": {"prometheus": 54_432.00, "wrapper": 34_666.70},
}


def _integral(track: NodeTrack, energy: np.ndarray, a: float, b: float) -> float:
    """∫ P over [a, b], the power held at its first value before the track and its last after."""

    def cum(t: float) -> float:
        if t <= track.t[0]:
            return float((t - track.t[0]) * track.p[0])
        if t >= track.t[-1]:
            return float(energy[-1] + (t - track.t[-1]) * track.p[-1])
        return float(track.at(energy, t))

    return cum(b) - cum(a)


def study_comparison(
    att: Attribution, pods: np.ndarray, workflow: str, setup: StudySetup, phases: Sequence[float]
) -> dict[str, object]:
    """The four approaches' energies for one workflow, and their differences to the wrapper."""
    pods = pods[att.ran[pods]]
    first_task = float(att.start[pods].min())
    last_task = float(att.end[pods].max())
    head_start = first_task - setup.head_startup_s
    head_end = last_task + setup.teardown_s
    nodes = np.unique(att.node[pods]).astype(int)
    tracks = [(att.tracks[n], att._fns[n][0]) for n in nodes]
    idle = [float(tr.p.min()) for tr, _ in tracks]
    uncovered = [setup.uncovered_idle_fraction * w for w in idle]

    def rapl(a: float, b: float) -> float:
        return sum(_integral(tr, e, a, b) - c * (b - a) for (tr, e), c in zip(tracks, uncovered, strict=True))

    windows = {
        "wrapper": (head_start, head_end),
        "plugin": (head_start + setup.delay(setup.plugin_delay_s, workflow), last_task),
        "task": (head_start + setup.delay(setup.task_delay_s, workflow), last_task + setup.stop_task_s),
    }
    energies: dict[str, float] = {name: rapl(a, b) for name, (a, b) in windows.items()}
    duration, end = head_end - head_start, head_end
    tau, interval = setup.averaging_s, setup.scrape_s
    whole = sum(_integral(tr, e, head_start, head_end) for tr, e in tracks)
    prometheus = []
    coverage = []
    for fraction in phases:
        scrapes = _scrapes(end - duration, end, interval, fraction * interval)
        coverage.append(len(scrapes) * interval / duration)
        total = 0.0
        for t in scrapes:
            last = np.floor(t / tau) * tau  # the sensor's last completed averaging interval
            total += sum(_integral(tr, e, last - tau, last) for tr, e in tracks) / tau
        prometheus.append(total * interval)
    energies["prometheus"] = prometheus[0]
    ref = energies["wrapper"]
    diffs = [100.0 * (p - ref) / ref for p in prometheus]
    return {
        "nodes": len(nodes),
        "duration_seconds": duration,
        "joules": energies,
        "percent_of_wrapper": {k: 100.0 * v / ref for k, v in energies.items()},
        "prometheus_difference_percent": {
            "at_seed_phase": diffs[0],
            "mean": float(np.mean(diffs)),
            "min": float(np.min(diffs)),
            "max": float(np.max(diffs)),
        },
        "windows": {k: [a, b] for k, (a, b) in windows.items()},
        # Prometheus / wrapper = sensor coverage × window coverage × sampled-power bias
        "sensor_over_rapl": whole / ref,
        "window_coverage": {"at_seed_phase": coverage[0], "mean": float(np.mean(coverage))},
        "idle_share_percent": 100.0 * sum(w * duration for w in idle) / whole,
    }


def study_rows(results: dict[str, dict[str, object]]) -> list[str]:
    """The study's table beside the simulator's, as Markdown lines."""
    lines = [
        "| workflow | source | wrapper J | plug-in % | task % | Prometheus 30 s % (vs wrapper) | sensor ÷ RAPL | samples × 30 s ÷ D |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, res in results.items():
        key = next(k for k in STUDY_COUNTERS if name.startswith(k))
        c, p = STUDY_COUNTERS[key], STUDY_PROMETHEUS_30S[key]
        lines.append(
            f"| {name} | study | {c['wrapper']:,.0f} | {100 * c['plugin'] / c['wrapper']:.2f} | "
            f"{100 * c['task'] / c['wrapper']:.2f} | {100 * (p['prometheus'] / p['wrapper'] - 1):+.1f} | 1.365 at idle | — |"
        )
        joules = res["joules"]
        pct = res["percent_of_wrapper"]
        prom = res["prometheus_difference_percent"]
        cover = res["window_coverage"]
        assert isinstance(joules, dict) and isinstance(pct, dict) and isinstance(prom, dict) and isinstance(cover, dict)
        lines.append(
            f"| {name} | simulator | {joules['wrapper']:,.0f} | {pct['plugin']:.2f} | {pct['task']:.2f} | "
            f"{prom['mean']:+.1f} (phases {prom['min']:+.1f} … {prom['max']:+.1f}) | {res['sensor_over_rapl']:.3f} | "
            f"{cover['mean']:.3f} |"
        )
    return lines


def study_runs(
    cluster: ClusterSpec, workloads: Sequence[Workload], seed: int = 0, setup: StudySetup | None = None
) -> dict[str, dict[str, object]]:
    """Each published shape alone on the cluster, idle for a minute first (the head pod's start
    falls before the first task), compared by :func:`study_comparison`."""
    from joulesched.sim.engine import Engine, EngineOptions, Profile

    out: dict[str, dict[str, object]] = {}
    phases = phases_for(seed)
    for wl in workloads:
        shifted = Workload.of([t.shifted(60.0) for t in wl.traces])
        engine = Engine(
            cluster,
            shifted,
            Profile("default", "least"),
            EngineOptions(seed=seed, record_timeseries=False, record_segments=True),
        )
        att = Attribution(engine.run(), [p.cpu_usage for p in shifted.pods])
        for name in shifted.workflows:
            idx = np.array([i for i, p in enumerate(shifted.pods) if p.workflow == name])
            out[name] = study_comparison(att, idx, name, setup or StudySetup(), phases)
    return out
