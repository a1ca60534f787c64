"""joulesched extender: the HTTP service kube-scheduler calls.

``wire`` holds the protocol types, ``profiles`` the node-profile sources, ``predicted`` the
predicted-load ledger, ``service`` the decisions, ``app`` the Flask routes, ``cli`` the
gunicorn launcher.

Error hierarchy (everything that reaches a client becomes an HTTP status with a JSON body)::

    wire.WireError (ValueError)    a request body that is not a valid extender message → 400
    policy.PolicyError             a pod field the policy cannot read (e.g. a bad quantity) → 400
    └── policy.ConfigError         a config or profile file failed validation (at start)
    service.BindDisabled           the bind verb is not enabled → 404
"""
