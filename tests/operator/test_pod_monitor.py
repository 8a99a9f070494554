"""spec.podMonitor: the PodMonitor it renders (checked against an excerpt of the upstream CRD), and through the
operator loop (kmock): created, pruned, a cluster without its CRD reported, every call covered by RBAC."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from minedraft_operator.render import OWNED_KINDS, render
from tests.operator.admission import admit
from tests.operator.emulator import eventually, running_operator
from tests.operator.test_inference_pool import OPERATOR_POD_LABELS, by_name, matches
from tests.operator.test_operator_loop import MDD, NS, conditions, with_namespace

MONITOR_CRD = yaml.safe_load((Path(__file__).parent / "data" / "monitoring.coreos.com_podmonitors.yaml").read_text())
MONITOR = ("monitoring.coreos.com/v1", "podmonitors")
MONITOR_RESOURCE = "monitoring.coreos.com/v1/podmonitors"


def monitor_on(mdd: dict[str, Any]) -> dict[str, Any]:
    mdd = copy.deepcopy(mdd)
    mdd["spec"]["podMonitor"] = {"enabled": True}
    return mdd


def test_no_pod_monitor_by_default(gpu_mdd) -> None:
    assert "PodMonitor" not in {o["kind"] for o in render(gpu_mdd)}


@pytest.mark.parametrize("example", ["gpu_mdd", "cpu_mdd"])
def test_pod_monitor_scrapes_the_serving_pods_on_http(example: str, request) -> None:
    mdd = monitor_on(request.getfixturevalue(example))
    objs = by_name(render(mdd))
    name = mdd["metadata"]["name"]
    monitor, deployment = objs[("PodMonitor", name)], objs[("Deployment", name)]
    template = deployment["spec"]["template"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert matches(selector, template["metadata"]["labels"])
    assert not matches(selector, {**OPERATOR_POD_LABELS, "app.kubernetes.io/instance": name})
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "http", "path": "/metrics"}]
    assert [p for c in template["spec"]["containers"] for p in c.get("ports", []) if p["name"] == "http"]
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert monitor["metadata"]["ownerReferences"][0]["kind"] == "MineDraftDeployment"
    assert monitor["metadata"]["ownerReferences"][0]["controller"] is True
    assert ("monitoring.coreos.com/v1", "PodMonitor", "podmonitors") in OWNED_KINDS
    _, errors = admit(MONITOR_CRD, monitor)
    assert errors == []


def test_the_monitor_fixture_rejects_a_monitor_without_selector(gpu_mdd) -> None:
    monitor = by_name(render(monitor_on(gpu_mdd)))[("PodMonitor", gpu_mdd["metadata"]["name"])]
    del monitor["spec"]["selector"]
    assert any("'selector' is a required property" in e for e in admit(MONITOR_CRD, monitor)[1])


@pytest.mark.asyncio
async def test_pod_monitor_created_then_pruned_when_switched_off(kmock, cpu_mdd) -> None:
    mdd = monitor_on(with_namespace(cpu_mdd, "uid-pmon"))
    async with running_operator(kmock) as k:
        await k.create(*MDD, mdd)

        async def created() -> dict[str, Any]:
            monitor = await k.get(*MONITOR, NS, "tiny")
            assert monitor["metadata"]["ownerReferences"][0]["uid"] == "uid-pmon"
            assert conditions(await k.get(*MDD, NS, "tiny")).get("PodMonitorReady") == ("True", "Created")
            return monitor

        await eventually(created, what="the PodMonitor and its condition")
        await k.patch(*MDD, NS, "tiny", {"metadata": {"generation": 2}, "spec": {"podMonitor": {"enabled": False}}})

        async def pruned() -> bool:
            assert await k.list(*MONITOR, NS) == []
            assert "PodMonitorReady" not in conditions(await k.get(*MDD, NS, "tiny"))
            assert await k.get("apps/v1", "deployments", NS, "tiny")
            return True

        await eventually(pruned, what="the PodMonitor pruned and its condition gone")


@pytest.mark.asyncio
async def test_a_cluster_without_the_pod_monitor_crd_is_reported_and_the_rest_applies(kmock, cpu_mdd) -> None:
    mdd = monitor_on(with_namespace(cpu_mdd, "uid-nopmon"))
    async with running_operator(kmock, absent=(MONITOR_RESOURCE,)) as k:
        await k.create(*MDD, mdd)

        async def reported() -> dict[str, Any]:
            obj = await k.get(*MDD, NS, "tiny")
            assert conditions(obj).get("PodMonitorReady") == ("False", "CRDNotInstalled")
            assert obj["status"].get("observedGeneration") == 1
            return obj

        await eventually(reported, what="the missing CRD in the status")
        assert await k.get("apps/v1", "deployments", NS, "tiny")
