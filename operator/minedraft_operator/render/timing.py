"""Shutdown and rollout timing, derived from the spec in one place so the relations always hold.

A stopping pod: the batch manager's preStop sleeps `preStopSeconds` (gateways stop routing to it), then SIGTERM
starts its drain of `drainSeconds`; the workers outlive both. The kubelet kills whatever still runs after
terminationGracePeriodSeconds, so that covers preStop + drain + a margin for the exit itself. A rollout step
can wait for an old pod to stop and a new one to load its model: the Deployment's progress deadline covers
both plus time to pull the image, so a slow but healthy model load is never reported as a failed rollout.
"""

from __future__ import annotations

from typing import Any

from minedraft_operator.spec import DeploymentSpec

EXIT_MARGIN_S = 15  # after the drain: closing streams, flushing telemetry, process exit
PULL_MARGIN_S = 600  # scheduling and pulling a multi-GB image before the startup probes start counting


def pre_stop_s(spec: DeploymentSpec) -> int:
    return int(spec.raw["preStopSeconds"])


def drain_s(spec: DeploymentSpec) -> int:
    return int(spec.raw["drainSeconds"])


def worker_drain_s(spec: DeploymentSpec) -> int:
    """The workers serve the batch manager through its preStop and its drain (they get SIGTERM at once)."""
    return pre_stop_s(spec) + drain_s(spec)


def termination_grace_s(spec: DeploymentSpec) -> int:
    return pre_stop_s(spec) + drain_s(spec) + EXIT_MARGIN_S


def progress_deadline_s(spec: DeploymentSpec) -> int:
    return termination_grace_s(spec) + int(spec.raw["startupSeconds"]) + PULL_MARGIN_S


def strategy(spec: DeploymentSpec) -> dict[str, Any]:
    rollout = spec.raw["rollout"]
    return {"type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": rollout["maxSurge"], "maxUnavailable": rollout["maxUnavailable"]}}
