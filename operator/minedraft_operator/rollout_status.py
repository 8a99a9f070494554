"""Rollout progress of a MineDraftDeployment, copied from the Deployment it owns (pure).

The Deployment controller already knows how far a rollout got and whether it stalled past its progress
deadline; the resource's status repeats that (updated / available counts, a Progressing condition) so
`kubectl get mdd` and `kubectl wait --for=condition=Progressing` answer without looking one level down.
"""

from __future__ import annotations

from typing import Any

from minedraft_operator.status import condition

CONDITION = "Progressing"


def rollout_status(deployment: dict[str, Any] | None) -> tuple[dict[str, int], dict[str, str]]:
    """(status fields, the Progressing condition) from the owned Deployment, or its absence."""
    if deployment is None:
        return ({"updatedReplicas": 0, "availableReplicas": 0},
                condition(CONDITION, "Unknown", "DeploymentNotFound", "the Deployment is not created yet"))
    status = deployment.get("status", {})
    fields = {"updatedReplicas": int(status.get("updatedReplicas", 0)),
              "availableReplicas": int(status.get("availableReplicas", 0))}
    generation = deployment["metadata"].get("generation", 1)
    if status.get("observedGeneration", 0) < generation:
        return fields, condition(CONDITION, "True", "DeploymentPending",
                                 f"the Deployment controller has not seen generation {generation} yet")
    found = next((c for c in status.get("conditions", []) if c.get("type") == CONDITION), None)
    if found is None:
        return fields, condition(CONDITION, "Unknown", "NoDeploymentCondition", "the Deployment reports no progress")
    return fields, condition(CONDITION, str(found.get("status", "Unknown")), str(found.get("reason") or "Unknown"),
                             str(found.get("message", "")))
