"""Rollout and shutdown timing of the serving pods: surge, preStop, drain, startup budget.

Kept apart from the rest of the spec because the renderer derives the pod's grace period and the
Deployment's progress deadline from these fields together (render/timing.py).
"""

from __future__ import annotations

from minedraft_operator.crds.schema import Schema, integer, obj, rule

MAX_PRESTOP_S = 60
MAX_DRAIN_S = 300
MAX_STARTUP_S = 3600


def rollout() -> Schema:
    return obj(
        "How the Deployment replaces pods on a change (a new image, new settings).",
        {
            "maxSurge": integer("Extra pods started above replicas during a rollout. 0 (the default) replaces a pod "
                                "before starting its successor, for clusters with no spare GPUs; 1 or more keeps "
                                "every replica serving while the new pods load (needs the GPUs of one more pod).",
                                minimum=0, default=0),
            "maxUnavailable": integer("Pods a rollout may take down below replicas at once.", minimum=0, default=1),
        },
        default={},
        rules=[rule("self.maxSurge > 0 || self.maxUnavailable > 0",
                    "maxSurge and maxUnavailable cannot both be 0 (the rollout could never proceed)")],
    )


def timing_fields() -> dict[str, Schema]:
    """The spec fields (name -> schema) that shutdown and rollout timing derive from."""
    return {
        "rollout": rollout(),
        "preStopSeconds": integer(
            "Seconds a stopping pod keeps serving before its batch manager starts to drain, so gateways, endpoint "
            "pickers and kube-proxy stop sending it new requests first.", minimum=0, maximum=MAX_PRESTOP_S,
            default=15),
        "drainSeconds": integer(
            "Seconds a stopping pod then keeps serving its in-flight requests before it exits. The pod's "
            "terminationGracePeriodSeconds is preStopSeconds + drainSeconds + a margin.", minimum=0,
            maximum=MAX_DRAIN_S, default=30),
        "startupSeconds": integer(
            "Longest model load before the kubelet restarts a worker (startup probes); the Deployment's "
            "progressDeadlineSeconds derives from it.", minimum=30, maximum=MAX_STARTUP_S, default=1800),
    }
