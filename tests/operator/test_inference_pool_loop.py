"""The InferencePool through the whole operator loop (kmock): created, pruned, and a cluster without its CRD."""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.emulator import eventually, running_operator
from tests.operator.test_operator_loop import MDD, NS, conditions, with_namespace

POOL = ("inference.networking.k8s.io/v1", "inferencepools")
POOL_RESOURCE = "inference.networking.k8s.io/v1/inferencepools"


def pool_on(mdd: dict[str, Any]) -> dict[str, Any]:
    mdd["spec"]["routing"] = {"inferencePool": {"enabled": True, "endpointPicker": {"name": "router-epp"}}}
    return mdd


@pytest.mark.asyncio
async def test_pool_created_then_pruned_when_switched_off(kmock, cpu_mdd) -> None:
    mdd = pool_on(with_namespace(cpu_mdd, "uid-pool"))
    async with running_operator(kmock) as k:
        await k.create(*MDD, mdd)

        async def created() -> dict[str, Any]:
            pool = await k.get(*POOL, NS, "tiny")
            assert pool["spec"]["endpointPickerRef"]["name"] == "router-epp"
            assert pool["metadata"]["ownerReferences"][0]["uid"] == "uid-pool"
            obj = await k.get(*MDD, NS, "tiny")
            assert conditions(obj).get("InferencePoolReady") == ("True", "Created")
            return pool

        pool = await eventually(created, what="the InferencePool and its condition")
        deployment = await k.get("apps/v1", "deployments", NS, "tiny")
        assert pool["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        assert (await k.get("v1", "services", NS, "tiny-pods"))["spec"]["clusterIP"] == "None"

        await k.patch(*MDD, NS, "tiny", {"metadata": {"generation": 2},
                                         "spec": {"routing": {"inferencePool": {"enabled": False}}}})

        async def pruned() -> bool:
            assert await k.list(*POOL, NS) == []
            obj = await k.get(*MDD, NS, "tiny")
            assert "InferencePoolReady" not in conditions(obj)
            assert await k.get("v1", "services", NS, "tiny-pods")  # the rest stays
            return True

        await eventually(pruned, what="the pool pruned and its condition gone")


@pytest.mark.asyncio
async def test_a_cluster_without_the_pool_crd_is_reported_and_the_rest_applies(kmock, cpu_mdd) -> None:
    mdd = pool_on(with_namespace(cpu_mdd, "uid-nocrd"))
    async with running_operator(kmock, absent=(POOL_RESOURCE,)) as k:
        await k.create(*MDD, mdd)

        async def reported() -> dict[str, Any]:
            obj = await k.get(*MDD, NS, "tiny")
            assert conditions(obj).get("InferencePoolReady") == ("False", "CRDNotInstalled")
            assert obj["status"].get("observedGeneration") == 1  # the reconcile itself succeeded
            return obj

        await eventually(reported, what="the missing CRD in the status")
        assert await k.get("apps/v1", "deployments", NS, "tiny")
        assert await k.get("v1", "services", NS, "tiny-pods")
        # Later changes still reconcile (the operator keeps running).
        await k.patch(*MDD, NS, "tiny", {"metadata": {"generation": 2}, "spec": {"replicas": 2}})

        async def scaled() -> bool:
            assert (await k.get("apps/v1", "deployments", NS, "tiny"))["spec"]["replicas"] == 2
            return True

        await eventually(scaled, what="a later change applied")
