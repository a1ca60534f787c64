"""Where an extender worker's CPU goes, part by part: a ``sitecustomize`` for benchmark runs.

Put this folder first on the extender's ``PYTHONPATH`` and name an output prefix in
``JOULESCHED_CPU_PARTS``; every Python process that then imports it (the benchmark script, the
extender's gunicorn master and workers) leaves the extender alone until its first verb
request, and from then on rewrites ``PREFIX.<pid>`` every 2 s with:

* ``verb:<verb>``: the CPU of the serving thread (``time.thread_time``) inside the verb
  endpoint, per request: the request's parse, the policy, the ledger, the reply and the metrics;
* ``binder``: of that, the binding's API write; ``take``: the API connection it took (new ones
  open TLS); ``tls-context``: the TLS contexts made for new connections;
* ``cycle:<verb>:<why>``: how each decision found the last one (``hit``: answered from the
  filter's evaluation; ``inputs:N,..``: which of the evaluation's inputs had changed);
* per thread group (``ThreadPoolExecutor-``: filter and prioritize, ``bind``: the bind verb's,
  the watches, ``main``: the event loop), CPU in ms from /proc (10 ms ticks), and
  ``main-before-first-request-ms``: the event loop's CPU before the first request (start-up).

With ``JOULESCHED_CPU_PARTS_CONSTANT_POLICY=1`` too, every evaluation is answered with the first
one made for as many candidates: what the extender costs with a policy that costs nothing (a
diagnostic: its answers are wrong for every other pod).

Not part of the product and not a test: wrappers around the extender's own functions, for a
benchmark run by hand (docs/benchmarks.md, "Where the extender's CPU goes"):

    JOULESCHED_CPU_PARTS=/tmp/parts PYTHONPATH=bench/cpu_parts:. python bench/sched_throughput.py \\
      --nodes 100 --rounds 1 --qps 5000 --pct 100 --contenders names --extender-cpus 1
    cat /tmp/parts.*
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
import time
from typing import Any

PREFIX = os.environ.get("JOULESCHED_CPU_PARTS")
_parts: dict[str, tuple[int, float]] = {}
_lock = threading.Lock()
_local = threading.local()
_writer_pid = [0]


def _add(part: str, seconds: float) -> None:
    with _lock:
        n, total = _parts.get(part, (0, 0.0))
        _parts[part] = (n + 1, total + seconds)


def _ticks_ms(tid: int) -> int | None:
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return 10 * (int(fields[11]) + int(fields[12]))  # utime + stime, in 10 ms ticks


def _write_forever() -> None:
    while True:
        time.sleep(2)
        lines = []
        with _lock:
            for part, (n, total) in sorted(_parts.items()):
                lines.append(f"{part} n={n} cpu_ms={1e3 * total:.1f} per={1e6 * total / max(n, 1):.0f}us")
        groups: dict[str, int] = {}
        for thread in threading.enumerate():
            if thread is threading.main_thread() or thread.native_id is None:
                continue  # the main thread's native id is its parent's after a fork: read below
            ms = _ticks_ms(thread.native_id)
            if ms is not None:
                group = thread.name.rstrip("0123456789_")
                groups[group] = groups.get(group, 0) + ms
        groups["main"] = _ticks_ms(os.getpid()) or 0  # a process's first thread has its pid
        lines += [f"threads {group} cpu_ms={ms}" for group, ms in sorted(groups.items())]
        with open(f"{PREFIX}.{os.getpid()}", "w") as f:
            f.write("\n".join(lines) + "\n")


def _started() -> None:
    """The writer, once per process (a gunicorn worker is forked without the master's threads)."""
    if _writer_pid[0] != os.getpid():
        _writer_pid[0] = os.getpid()
        _parts["main-before-first-request-ms"] = (1, 1e-3 * (_ticks_ms(os.getpid()) or 0))
        threading.Thread(target=_write_forever, name="cpu-parts", daemon=True).start()


def _timed(owner: Any, name: str, part: str) -> None:
    real = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return real(*args, **kwargs)
        finally:
            _add(part, time.thread_time() - started)

    setattr(owner, name, timed)


def _install() -> None:
    from joulesched.extender import app, kube, service

    serve = app.VerbEndpoint.__call__

    def call(self: Any, verb: str, length: int | None, read: Any) -> Any:
        _started()
        _local.verb = verb
        started = time.thread_time()
        try:
            return serve(self, verb, length, read)
        finally:
            _add(f"verb:{verb}", time.thread_time() - started)

    app.VerbEndpoint.__call__ = call  # type: ignore[method-assign]

    same_cycle = service.Extender._same_cycle

    def cycle(self: Any, args: Any, inputs: tuple[object, ...], now: float) -> Any:
        kept = self._cycle
        found = same_cycle(self, args, inputs, now)
        if found is not None:
            why = "hit"
        elif kept is None:
            why = "none"
        elif not 0 <= now - kept[1].at <= service.CYCLE_SECONDS:
            why = "time"
        else:
            changed = [str(i) for i, (a, b) in enumerate(zip(inputs, kept[0], strict=True)) if a is not b]
            why = "inputs:" + ",".join(changed) if changed else "pod/nodes"
        _add(f"cycle:{getattr(_local, 'verb', '?')}:{why}", 0.0)
        return found

    service.Extender._same_cycle = cycle  # type: ignore[method-assign]
    if os.environ.get("JOULESCHED_CPU_PARTS_CONSTANT_POLICY"):
        evaluate = getattr(service, "evaluate")  # noqa: B009 (imported there by name)
        first: dict[int, Any] = {}

        def constant(nodes: Any, rows: Any, *args: Any, **kwargs: Any) -> Any:
            if len(rows) not in first:
                first[len(rows)] = evaluate(nodes, rows, *args, **kwargs)
            return first[len(rows)]

        setattr(service, "evaluate", constant)  # noqa: B010
    _timed(kube.Binder, "__call__", "binder")
    _timed(kube.ApiConnections, "_take", "take")
    _timed(kube.ApiConnections, "_context", "tls-context")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Installs the wrappers once ``joulesched.extender.app`` has been imported, not before: the
    extender must import prometheus-client itself, after choosing its multiprocess directory."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "joulesched.extender.app":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _install()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if PREFIX:
    sys.meta_path.insert(0, _AfterImport())
