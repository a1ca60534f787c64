"""joulesched sim: replay recorded workloads on a modelled cluster and compare policies.

Readers (``sim/traces``, ``sim/cluster``) turn files into plain data; the engine
(``sim/engine``) replays them through a model of kube-scheduler (``sim/kube``) and the
joulesched policy (``sim/extender``: in-process through ``policy/`` or over HTTP); the
attribution module checks measurement methods against the model's ground truth; the report
module only reads finished results. ``docs/sim.md`` describes the models and their limits.

Error hierarchy::

    SimError                    root of every error raised by this package
    ├── TraceError              a trace file is malformed (file, record and field named)
    ├── ClusterError            a cluster spec, or a carbon series it names, is invalid;
    │                           ``.problems`` lists every problem with its dotted path
    └── ExtenderCallError       a running extender failed or answered nonsense over HTTP
"""

from joulesched.sim.errors import ClusterError, ExtenderCallError, SimError, TraceError

__all__ = ["ClusterError", "ExtenderCallError", "SimError", "TraceError"]
