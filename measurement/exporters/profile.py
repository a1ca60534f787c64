"""``GET /v1/profile``: the node's profile in the document shape of :mod:`policy.profile`.

The document is what the extender's ``file`` source reads, built with the policy's own classes
(:class:`~policy.profile.ProfileSet`), so the two cannot drift apart. The power curve is the
fitted linear model P(u) = idle + watts_per_core × cores × u turned into 11 points by
:func:`policy.profile.linear_curve`.
"""

from __future__ import annotations

from typing import Any

from joulesched.measurement.snapshot import Snapshot
from joulesched.policy.profile import GpuProfile, NodeProfile, ProfileSet, Site, linear_curve


def profile_document(snap: Snapshot) -> dict[str, Any] | None:
    """The profile document of the node, or None while the power model has no fit yet."""
    fit = snap.model("cpu")
    if fit is None:
        return None
    idle = max(fit.idle_watts, 0.0)
    per_core = max(fit.slope_watts, 0.0)
    gpus = None
    if snap.gpus is not None:
        g = snap.gpus
        gpus = GpuProfile(
            count=g.count,
            idle_watts=g.idle_watts,
            max_watts=max(g.max_watts, g.idle_watts),
            utilisation=min(max(g.utilisation, 0.0), 1.0),
        )
    node = NodeProfile(
        name=snap.node,
        cores=float(snap.cpus),
        power_curve_watts=linear_curve(idle, per_core, float(snap.cpus)),
        site=snap.site,
        speed=snap.speed,
        utilisation=min(max(snap.utilisation, 0.0), 1.0),
        measured_watts=snap.node_power_watts,
        power_cap_watts=snap.power_cap_watts,
        updated=snap.wall_time,
        gpus=gpus,
        sources=snap.sources_used,
        server_id=snap.server_id,
    )
    sites = {snap.site: Site(snap.site)} if snap.site else {}
    return ProfileSet((node,), sites).to_document()


def model_status(snap: Snapshot | None, min_samples: int) -> str:
    if snap is None:
        return "no sample yet"
    if not snap.basis:
        return "no energy source on this node"
    return f"no power model yet: it needs {min_samples} samples with CPU load spread over at least the configured cores"


__all__ = ["model_status", "profile_document"]
