"""gunicorn settings for the extender (``gunicorn -c python:joulesched.extender.gunicorn_conf ...``).

``joulesched extender`` uses this module and overrides ``bind``, ``workers`` and ``threads``
from the extender config. The choices:

* ``FrontBufferedWorker`` (extender/worker.py), gunicorn's ``gthread`` that reads each request
  whole in its event loop before a thread serves it: kube-scheduler's Go client keeps one
  connection alive per extender and sends request after request on it (the ``sync`` worker
  closes every connection), and idle, slow or lying clients must not hold the threads its
  requests need (``server.worker: gthread`` is gunicorn's own, for comparison). gunicorn sets
  TCP_NODELAY on its TCP listener (inherited by accepted sockets), so no reply waits on
  Nagle's algorithm and the client's delayed ACK.
* one worker: kube-scheduler sends one request at a time; a second worker would double the
  resting memory (each holds the kubernetes client) for throughput only parallel clients get.
* ``keepalive`` 120 s: longer than Go's default idle-connection timeout (90 s), so the client
  closes idle connections, not the server mid-request.
* ``timeout`` 30 s: a worker stuck this long is restarted; a request never takes that long
  (the Prometheus source refreshes in the background).
* Request size: gunicorn has no body limit; the worker hands a request announcing more than
  ``max_request_bytes`` on unread, the app answers 413 and the connection closes.
* ``gc.freeze()`` after the app is loaded in each worker, and a young-generation threshold of
  50,000 allocations: a request with 1,000 Node objects is then not interrupted by hundreds of
  collections that scan the whole import graph (docs/benchmarks.md: p99 of 100 full Nodes from
  18–22 ms to 5 ms, of 1,000 from 101–129 ms to 41–45 ms, prioritize).
* prometheus-client multiprocess mode: the directory is emptied at start and each dead
  worker's files are marked, so /metrics on any worker reports all of them.
"""

from __future__ import annotations

import gc
import os
import shutil
from typing import Any

from gunicorn import glogging

from joulesched.contracts.runtime import JsonFormatter

bind = os.environ.get("JOULESCHED_LISTEN", "0.0.0.0:8888")
worker_class = "joulesched.extender.worker.FrontBufferedWorker"
workers = 1
threads = 4
timeout = 30
graceful_timeout = 10
keepalive = 120
limit_request_line = 8190
limit_request_fields = 100
accesslog = None
errorlog = "-"
loglevel = "info"
proc_name = "joulesched-extender"
# gunicorn >= 25.1 opens a control socket under $HOME; a read-only root filesystem has no
# room for it and the extender needs no runtime management beyond signals.
control_socket_disable = True


class JsonLogger(glogging.Logger):  # type: ignore[misc]
    """gunicorn's error log (start, workers, signals) as one JSON object per line, like the app's
    (``joulesched extender --log-format json``)."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in self.error_log.handlers:
            handler.setFormatter(JsonFormatter())


def on_starting(server: Any) -> None:
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)


def post_worker_init(worker: Any) -> None:
    # Everything loaded so far (Flask, numpy, the kubernetes client, the profiles) lives as long
    # as the worker: move it out of the cyclic collector's reach, so that a full collection
    # triggered by a large request (full Node objects) scans only what requests allocate. A
    # request allocates ~200 container objects per full Node and frees them all (no cycles on
    # the request path): collect the young generation every 50,000 allocations, not every 700,
    # so that decoding 1,000 Nodes is not interrupted by hundreds of collections.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def child_exit(server: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
