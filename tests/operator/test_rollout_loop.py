"""The owned Deployment's rollout status reaches the MineDraftDeployment (kmock: the whole operator loop)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.emulator import eventually, running_operator
from tests.operator.test_operator_loop import MDD, NS, conditions, with_namespace

DEPLOYMENTS = ("apps/v1", "deployments")


def deployment_status(generation: int, updated: int, available: int, reason: str,
                      status: str = "True") -> dict[str, Any]:
    return {"status": {"observedGeneration": generation, "replicas": 2, "updatedReplicas": updated,
                       "availableReplicas": available,
                       "conditions": [{"type": "Progressing", "status": status, "reason": reason,
                                       "message": f"rollout: {reason}"}]}}


@pytest.mark.asyncio
async def test_deployment_status_drives_counts_and_progressing(kmock, cpu_mdd) -> None:
    mdd = with_namespace(cpu_mdd, "uid-roll")
    mdd["spec"]["replicas"] = 2
    async with running_operator(kmock, sync_seconds=60) as k:  # no timer in the way: the event must do it
        await k.create(*MDD, mdd)
        await eventually(lambda: k.get(*DEPLOYMENTS, NS, "tiny"), what="the Deployment")

        async def mdd_shows(updated: int, available: int, progressing: tuple[str, str]) -> bool:
            obj = await k.get(*MDD, NS, "tiny")
            status = obj.get("status", {})
            assert (status.get("updatedReplicas"), status.get("availableReplicas")) == (updated, available)
            assert conditions(obj).get("Progressing") == progressing
            return True

        # A rollout halfway: one pod of the new template, both available (maxSurge 1 would allow this).
        await k.patch(*DEPLOYMENTS, NS, "tiny", {"metadata": {"generation": 1},
                                                 **deployment_status(1, 1, 2, "ReplicaSetUpdated")})
        await eventually(lambda: mdd_shows(1, 2, ("True", "ReplicaSetUpdated")), what="the rollout in progress")
        # Stalled past progressDeadlineSeconds.
        await k.patch(*DEPLOYMENTS, NS, "tiny", deployment_status(1, 1, 1, "ProgressDeadlineExceeded", "False"))
        await eventually(lambda: mdd_shows(1, 1, ("False", "ProgressDeadlineExceeded")), what="a stalled rollout")
        # Done.
        await k.patch(*DEPLOYMENTS, NS, "tiny", deployment_status(1, 2, 2, "NewReplicaSetAvailable"))
        await eventually(lambda: mdd_shows(2, 2, ("True", "NewReplicaSetAvailable")), what="the rollout done")
