"""The owned Deployment's rollout status reaches the MineDraftDeployment, and the scale path an autoscaler takes
(kmock: the whole operator loop)."""

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


@pytest.mark.asyncio
async def test_the_scale_path_an_autoscaler_takes(kmock, cpu_mdd, mdd_crd) -> None:
    """What /scale does (spec.replicas patched) reaches the Deployment; 0 is reported as ScaledToZero."""
    scale = mdd_crd["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": ".status.selector"}
    mdd = with_namespace(cpu_mdd, "uid-scale")
    async with running_operator(kmock) as k:
        await k.create(*MDD, mdd)

        async def scaled_to(replicas: int) -> dict[str, Any]:
            assert (await k.get(*DEPLOYMENTS, NS, "tiny"))["spec"]["replicas"] == replicas
            obj = await k.get(*MDD, NS, "tiny")
            assert obj.get("status", {}).get("selector") == (
                "app.kubernetes.io/name=minedraft,app.kubernetes.io/instance=tiny,app.kubernetes.io/component=server")
            return obj

        await eventually(lambda: scaled_to(1), what="one replica")
        for generation, replicas in ((2, 3), (3, 0)):
            await k.patch(*MDD, NS, "tiny", {"metadata": {"generation": generation}, "spec": {"replicas": replicas}})
            await eventually(lambda r=replicas: scaled_to(r), what=f"{replicas} replicas")

        async def zero_reported() -> bool:
            assert conditions(await k.get(*MDD, NS, "tiny")).get("Ready") == ("True", "ScaledToZero")
            return True

        await eventually(zero_reported, what="ScaledToZero")
