"""Whether KEDA sees a fleet as active: the one rule behind IsActive, StreamIsActive and the
``llm_scaler_active`` gauge (KEDA-EXTERNAL-SCALER.md §6: for an external trigger, IsActive is KEDA's
only activation signal, and with ``minReplicaCount: 0`` an inactive answer leads to zero replicas after
``cooldownPeriod``).
"""

from __future__ import annotations

from keda_llm_scaler.errors import NoFreshData
from keda_llm_scaler.metadata import INTERACTIVE, TriggerConfig
from keda_llm_scaler.policy import Composite
from keda_llm_scaler.target import Snapshot, Target

__all__ = ["activity", "target_active"]


def activity(cfg: TriggerConfig, snap: Snapshot | None, composite: Composite | None) -> bool | None:
    """The fleet's activity from its latest snapshot and its fresh composite (None: none to give).

    ``workloadClass: interactive`` (the default) is active whenever the snapshot lists a member in any
    phase (ready, starting, pending, failed_to_start), even without a composite: replicas exist, that is
    known, and an interactive path must not reach zero by idling (the next request would wait a whole
    cold start), unless it is a burst pool of a fleet. Otherwise (``batch``, a burst pool, or no member at
    all): composite > activationThreshold. None is
    "no answer" (UNAVAILABLE): missing data is never reported as inactive. Pure.
    """
    # a burst pool of a fleet is never the interactive path's last replica (its reserved pool is): it goes
    # to zero when its share does, or it would keep one replica, and its bill, for as long as it has one
    burst = cfg.pool is not None and not cfg.pool.reserved
    if cfg.workload_class == INTERACTIVE and not burst and snap is not None and snap.membership.members:
        return True
    if composite is None:
        return None
    return composite.active(cfg.activation_threshold)


def target_active(target: Target) -> bool:
    """``activity`` on the target's current state; NoFreshData (-> UNAVAILABLE) when it has no answer."""
    try:
        composite = target.current()[1]
    except NoFreshData:
        if activity(target.cfg, target.snapshot, None):  # members known: no composite needed
            return True
        raise
    return activity(target.cfg, target.snapshot, composite) is True
