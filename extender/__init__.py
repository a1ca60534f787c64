"""joulesched extender: the HTTP service kube-scheduler calls.

``wire`` holds the protocol types, ``profiles`` the node-profile sources, ``predicted`` the
predicted-load ledger, ``service`` the decisions, ``app`` the Flask routes, ``cli`` the
gunicorn launcher; ``deferrer`` and ``admission`` are ``joulesched deferrer`` (carbon-aware
deferral through scheduling gates) and its mutating webhook.

Error hierarchy (everything that reaches a client becomes an HTTP status with a JSON body;
the classes are in ``extender/errors.py``)::

    ExtenderError                  root of every error the extender itself raises
    ├── WireError (ValueError)     a request body that is not a valid extender message → 400
    ├── BindDisabled               the bind verb is not enabled → 404
    ├── LeftToScheduler            bind.write: false: recorded, kube-scheduler binds → 200, in Error
    ├── ExpanderError              ``joulesched expander``: bad input or settings → exit 2
    ├── expander.ConfigMapMissing  ``--apply`` found no priority-expander ConfigMap to patch → exit 1 (``--watch``: logged, retried)
    ├── DeferrerError              ``joulesched deferrer``: bad input or settings → exit 2
    └── admission.ReviewError      a webhook request that is not an AdmissionReview v1 → 400

    policy.PolicyError             from the policy layer, passed through unchanged
    ├── QuantityError              a pod field the policy cannot read (a bad quantity) → 400
    └── ConfigError                a config or profile file failed validation (at start; a
                                   profile reload that fails keeps the last good profiles)

Configuration errors stay :class:`policy.errors.ConfigError`, the one class every part uses for
"a document failed validation": the extender's config is checked by the shared
:class:`policy.validate.Checker` and read by :func:`contracts.documents.read_yaml`, and the
launcher reports it the same way as the agent does.
"""

from joulesched.extender.errors import (
    BindDisabled,
    DeferrerError,
    ExpanderError,
    ExtenderError,
    LeftToScheduler,
    WireError,
)

__all__ = ["BindDisabled", "DeferrerError", "ExpanderError", "ExtenderError", "LeftToScheduler", "WireError"]
