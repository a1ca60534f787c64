"""Impact: the ``joulesched report`` command (``report``) and the recording rules, PrometheusRule
and dashboard generator (``rules``).

Error hierarchy (``impact/errors.py``)::

    ImpactError                   root of every error raised by this package
    └── ReportError               a problem the user can fix: no data, Prometheus unreachable
        │                         (``joulesched report`` prints it and exits 1)
        └── UsageError            the command called wrong: a flag, a time, a file it names
                                  (exit 2, before any query, as argparse's own usage errors)

A site file that fails validation raises :class:`policy.errors.ConfigError`, as in every part.
"""

from joulesched.impact.errors import ImpactError, ReportError, UsageError

__all__ = ["ImpactError", "ReportError", "UsageError"]
