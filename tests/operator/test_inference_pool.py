"""spec.routing.inferencePool and the headless Service: what they render, checked against the upstream CRD."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from minedraft_operator.render import OWNED_KINDS, render
from minedraft_operator.render.network import DEFAULT_OPERATOR_LABELS
from tests.operator.admission import admit

POOL_CRD = yaml.safe_load((Path(__file__).parent / "data" / "inference.networking.k8s.io_inferencepools.yaml")
                          .read_text())
# The chart's operator pods: its selector plus the release's instance label, named like a deployment.
OPERATOR_POD_LABELS = {**DEFAULT_OPERATOR_LABELS, "app.kubernetes.io/instance": "llama-70b"}


def with_pool(mdd: dict[str, Any], **picker: Any) -> dict[str, Any]:
    mdd = copy.deepcopy(mdd)
    mdd["spec"]["routing"] = {"inferencePool": {"enabled": True, **({"endpointPicker": picker} if picker else {})}}
    return mdd


def by_name(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_no_pool_by_default(gpu_mdd) -> None:
    assert "InferencePool" not in {o["kind"] for o in render(gpu_mdd)}


@pytest.mark.parametrize("example", ["gpu_mdd", "cpu_mdd"])
def test_pool_selects_the_serving_pods_on_the_http_container_port(example: str, request) -> None:
    mdd = with_pool(request.getfixturevalue(example))
    objs = by_name(render(mdd))
    name = mdd["metadata"]["name"]
    pool, deployment = objs[("InferencePool", name)], objs[("Deployment", name)]
    template = deployment["spec"]["template"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert matches(selector, template["metadata"]["labels"])
    assert not matches(selector, {**OPERATOR_POD_LABELS, "app.kubernetes.io/instance": name})
    http = [p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])
            if p["name"] == "http"]
    assert pool["spec"]["targetPorts"] == [{"number": http[0]}] and len(http) == 1
    assert pool["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service", "name": f"{name}-epp",
                                                 "port": {"number": 9002}, "failureMode": "FailOpen"}
    assert pool["metadata"]["ownerReferences"][0]["kind"] == "MineDraftDeployment"
    assert pool["metadata"]["ownerReferences"][0]["controller"] is True
    # The NetworkPolicy keeps the pool's port open to everyone (gateways, the picker's scrapes).
    open_rule = objs[("NetworkPolicy", name)]["spec"]["ingress"][1]
    assert "from" not in open_rule and http[0] in [p["port"] for p in open_rule["ports"]]


def test_picker_fields_are_copied_and_the_pool_passes_the_upstream_crd(gpu_mdd) -> None:
    mdd = with_pool(gpu_mdd, name="llm-d-router-epp", port=9102, failureMode="FailClose")
    pool = next(o for o in render(mdd) if o["kind"] == "InferencePool")
    assert pool["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "llm-d-router-epp",
                                                 "port": {"number": 9102}, "failureMode": "FailClose"}
    admitted, errors = admit(POOL_CRD, pool)
    assert errors == [] and admitted["spec"] == pool["spec"]


def test_the_upstream_crd_fixture_rejects_what_it_should(gpu_mdd) -> None:
    pool = next(o for o in render(with_pool(gpu_mdd)) if o["kind"] == "InferencePool")
    no_port = copy.deepcopy(pool)
    del no_port["spec"]["endpointPickerRef"]["port"]
    assert any("port is required" in e for e in admit(POOL_CRD, no_port)[1])
    twice = copy.deepcopy(pool)
    twice["spec"]["targetPorts"] *= 2
    assert any("unique" in e for e in admit(POOL_CRD, twice)[1])
    unknown = copy.deepcopy(pool)
    unknown["spec"]["targetPort"] = 8000
    assert admit(POOL_CRD, unknown)[1]


def test_pod_template_names_the_engine_type_for_pickers(cpu_mdd) -> None:
    deployment = next(o for o in render(cpu_mdd) if o["kind"] == "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["llm-d.ai/engine-type"] == "vllm"
    assert "llm-d.ai/engine-type" not in deployment["spec"]["selector"]["matchLabels"]  # the selector is immutable


def test_headless_service_always_rendered_like_the_main_one(gpu_mdd) -> None:
    for mdd in (gpu_mdd, with_pool(gpu_mdd)):
        objs = by_name(render(mdd))
        main, pods = objs[("Service", "llama-70b")], objs[("Service", "llama-70b-pods")]
        assert pods["spec"]["clusterIP"] == "None" and "type" not in pods["spec"]
        assert pods["spec"]["selector"] == main["spec"]["selector"] == (
            objs[("Deployment", "llama-70b")]["spec"]["selector"]["matchLabels"])
        assert pods["spec"]["ports"] == main["spec"]["ports"]
        assert [p["name"] for p in pods["spec"]["ports"]] == ["grpc", "http"]
        assert pods["metadata"]["ownerReferences"] == main["metadata"]["ownerReferences"]
        assert pods["metadata"]["labels"]["app.kubernetes.io/component"] == "pods"
        assert kubernetes_validate.validate(pods, "1.34.0", strict=True)


def test_pool_is_an_owned_kind_and_the_spec_is_admitted(gpu_mdd, mdd_crd) -> None:
    assert ("inference.networking.k8s.io/v1", "InferencePool", "inferencepools") in OWNED_KINDS
    admitted, errors = admit(mdd_crd, with_pool(gpu_mdd, name="epp"))
    assert errors == []
    assert admitted["spec"]["routing"]["inferencePool"]["endpointPicker"] == {
        "name": "epp", "port": 9002, "failureMode": "FailOpen"}
    default, errors = admit(mdd_crd, gpu_mdd)
    assert errors == [] and default["spec"]["routing"]["inferencePool"]["enabled"] is False
    bad = with_pool(gpu_mdd, failureMode="Sometimes")
    assert admit(mdd_crd, bad)[1]
