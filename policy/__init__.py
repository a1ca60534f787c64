"""joulesched policy: the pure maths of energy-aware placement.

Everything here is a function of its arguments: no I/O, no clocks, no Flask, no Kubernetes
client, and no module-level state that changes after import. The extender, the measurement agent
and the simulator all import from here; this package imports none of them.

Error hierarchy::

    PolicyError                 root of every error raised by this package
    ├── ConfigError             a profile, site or policy document failed validation;
    │                           ``.problems`` lists every problem with its dotted path
    └── tenant.ShareError       a VM's share of its server cannot be computed (tenant mode)
"""

from joulesched.policy.errors import ConfigError, PolicyError

__all__ = ["ConfigError", "PolicyError"]
