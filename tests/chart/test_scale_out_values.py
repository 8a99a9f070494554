"""The chart's scale-out options: an HTTPRoute to the example deployment's InferencePool, and a KEDA
ScaledObject on queue depth; both validated against upstream CRD copies kept in tests/chart/data. The HPA
alternative (autoscaling/v2, a built-in kind) is validated strictly against Kubernetes' own schema."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from minedraft_operator.render import render
from tests.chart.k8s_tools import CHART, KUBE_VERSION, Manifest, by_kind, helm_template, one, run
from tests.chart.test_example_resources import admitted
from tests.operator.admission import admit

DATA = Path(__file__).parent / "data"
CPU_VALUES = CHART / "ci" / "cpu-values.yaml"
ROUTE = ["httpRoute.enabled=true", "httpRoute.parentRefs[0].name=inference-gateway",
         "deployment.spec.routing.inferencePool.enabled=true"]
KEDA = ["autoscaling.keda.enabled=true", "deployment.spec.replicas=3"]
HPA = ["autoscaling.hpa.enabled=true", "deployment.spec.replicas=3"]


def set_args(sets: list[str]) -> list[str]:
    return [arg for item in sets for arg in ("--set", item)]


def crd(name: str) -> Manifest:
    return yaml.safe_load((DATA / name).read_text())


def test_off_by_default(rendered: dict[str, list[Manifest]]) -> None:
    for manifests in rendered.values():
        assert not by_kind(manifests, "HTTPRoute") and not by_kind(manifests, "ScaledObject")
        assert not by_kind(manifests, "HorizontalPodAutoscaler")


def test_route_sends_the_gateway_to_the_example_deployments_pool(helm: Path, crds: dict[str, Manifest]) -> None:
    manifests = helm_template(helm, CHART, [CPU_VALUES], sets=ROUTE, namespace="serving")
    route, mdd = one(manifests, "HTTPRoute"), one(manifests, "MineDraftDeployment")
    assert route["metadata"]["namespace"] == mdd["metadata"]["namespace"] == "serving"
    assert route["spec"]["parentRefs"] == [{"name": "inference-gateway"}]
    ((backend,),) = [r["backendRefs"] for r in route["spec"]["rules"]]
    pool = one(render(admitted(crds, mdd)), "InferencePool")  # what the operator makes of the example
    assert backend == {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                       "name": pool["metadata"]["name"]}
    defaulted, errors = admit(crd("gateway.networking.k8s.io_httproutes.yaml"), route)
    assert errors == [] and defaulted["spec"]["parentRefs"][0]["kind"] == "Gateway"


@pytest.mark.parametrize(("sets", "message"), [
    (ROUTE[:2], "deployment.spec.routing.inferencePool.enabled"),
    (["httpRoute.enabled=true", ROUTE[2]], "httpRoute.parentRefs"),
])
def test_route_without_its_pool_or_gateway_fails_with_a_reason(helm: Path, sets: list[str], message: str) -> None:
    result = run([helm, "template", "r", CHART, "--values", CPU_VALUES, *set_args(sets)],
                 check=False)
    assert result.returncode != 0 and message in result.stderr


def test_keda_scales_the_deployment_on_queue_depth(helm: Path, crds: dict[str, Manifest]) -> None:
    manifests = helm_template(helm, CHART, [CPU_VALUES], sets=[*KEDA, "autoscaling.keda.modelLoadSeconds=900"],
                              namespace="serving")
    scaled, mdd = one(manifests, "ScaledObject"), one(manifests, "MineDraftDeployment")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "minedraft.io/v1alpha1", "kind": "MineDraftDeployment",
                                      "name": mdd["metadata"]["name"]}
    assert "replicas" not in mdd["spec"]  # KEDA owns the count; helm upgrade must not reset it
    ((trigger),) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    query = trigger["metadata"]["query"]
    assert "vllm:num_requests_waiting" in query and 'namespace="serving"' in query
    assert f'service="{mdd["metadata"]["name"]}"' in query  # the Service the chart's ServiceMonitor scrapes
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    # Sized to model load: one replica per load time up, none removed within a load time of a busy moment.
    assert behavior["scaleUp"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 900}]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 900
    assert spec["cooldownPeriod"] == spec["initialCooldownPeriod"] == 900
    _, errors = admit(crd("keda.sh_scaledobjects.yaml"), scaled)
    assert errors == []
    admitted(crds, mdd)  # the CRD defaults replicas on create; the scale subresource moves it afterwards


def test_keda_windows_stay_within_the_hpa_limits(helm: Path) -> None:
    scaled = one(helm_template(helm, CHART, [CPU_VALUES], sets=[*KEDA, "autoscaling.keda.modelLoadSeconds=3600"]),
                 "ScaledObject")
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 3600
    assert behavior["scaleUp"]["policies"][0]["periodSeconds"] == 1800  # the HPA's maximum period
    assert admit(crd("keda.sh_scaledobjects.yaml"), scaled)[1] == []


def test_the_keda_fixture_rejects_min_above_max(helm: Path) -> None:
    scaled = one(helm_template(helm, CHART, [CPU_VALUES], sets=[*KEDA, "autoscaling.keda.minReplicas=5"]),
                 "ScaledObject")
    assert any("minReplicaCount must be less" in e for e in admit(crd("keda.sh_scaledobjects.yaml"), scaled)[1])


def test_without_keda_the_example_keeps_its_replicas(helm: Path) -> None:
    mdd = one(helm_template(helm, CHART, [CPU_VALUES], sets=["deployment.spec.replicas=3"]), "MineDraftDeployment")
    assert mdd["spec"]["replicas"] == 3


def test_lint_passes_with_both_and_rejects_bad_values(helm: Path) -> None:
    args = [helm, "lint", CHART, "--values", CPU_VALUES]
    run([*args, *set_args([*ROUTE, *KEDA])])
    run([*args, *set_args([*ROUTE, *HPA])])
    for bad in ("autoscaling.keda.modelLoadSeconds=0", "autoscaling.keda.prometheusAddress=prometheus:9090",
                "httpRoute.enabled=yes", "autoscaling.hpa.minReplicas=0", "autoscaling.hpa.modelLoadSeconds=3601"):
        result = run([*args, "--set", bad], check=False)
        assert result.returncode != 0 and "schema" in result.stdout + result.stderr, bad


def test_hpa_scales_the_deployment_on_the_pods_queue_depth(helm: Path, crds: dict[str, Manifest]) -> None:
    manifests = helm_template(helm, CHART, [CPU_VALUES], sets=[*HPA, "autoscaling.hpa.modelLoadSeconds=900"],
                              namespace="serving")
    hpa, mdd = one(manifests, "HorizontalPodAutoscaler"), one(manifests, "MineDraftDeployment")
    assert hpa["apiVersion"] == "autoscaling/v2" and not by_kind(manifests, "ScaledObject")
    kubernetes_validate.validate(hpa, KUBE_VERSION, strict=True)
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "minedraft.io/v1alpha1", "kind": "MineDraftDeployment",
                                      "name": mdd["metadata"]["name"]}
    assert hpa["metadata"]["namespace"] == "serving"
    assert "replicas" not in mdd["spec"]  # the HPA owns the count; helm upgrade must not reset it
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 4)
    assert spec["metrics"] == [{"type": "Pods", "pods": {"metric": {"name": "vllm:num_requests_waiting"},
                                                         "target": {"type": "AverageValue", "averageValue": "8"}}}]
    # The same windows as the KEDA ScaledObject's.
    keda = one(helm_template(helm, CHART, [CPU_VALUES], sets=[*KEDA, "autoscaling.keda.modelLoadSeconds=900"]),
               "ScaledObject")
    assert spec["behavior"] == keda["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 900
    admitted(crds, mdd)


def test_hpa_windows_stay_within_the_hpa_limits(helm: Path) -> None:
    hpa = one(helm_template(helm, CHART, [CPU_VALUES], sets=[*HPA, "autoscaling.hpa.modelLoadSeconds=3600"]),
              "HorizontalPodAutoscaler")
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 3600
    assert hpa["spec"]["behavior"]["scaleUp"]["policies"][0]["periodSeconds"] == 1800
    kubernetes_validate.validate(hpa, KUBE_VERSION, strict=True)


@pytest.mark.parametrize(("sets", "message"), [
    ([*HPA, "autoscaling.keda.enabled=true"], "enable one"),
    ([*HPA, "deployment.enabled=false"], "set deployment.enabled"),
])
def test_hpa_with_keda_or_without_the_deployment_fails_with_a_reason(helm: Path, sets: list[str],
                                                                     message: str) -> None:
    result = run([helm, "template", "r", CHART, "--values", CPU_VALUES, *set_args(sets)], check=False)
    assert result.returncode != 0 and message in result.stderr
