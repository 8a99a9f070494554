"""helm lint and helm template of both charts with every ci values file, checked like an API server would."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest

from tests.chart.k8s_tools import (
    CHART,
    CI_VALUES,
    CRDS_CHART,
    KUBE_VERSION,
    Manifest,
    by_kind,
    helm_template,
    one,
    run,
)

CUSTOM_KINDS = {"MineDraftDeployment", "SpeculationPolicy"}  # checked against the CRDs in test_example_resources
RECOMMENDED_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                      "app.kubernetes.io/component", "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by",
                      "helm.sh/chart")


def test_helm_lint_strict_every_values_file(helm: Path) -> None:
    run([helm, "lint", "--strict", CRDS_CHART, "--kube-version", KUBE_VERSION])
    for values in [None, *CI_VALUES]:
        extra = ["--values", values] if values else []
        run([helm, "lint", "--strict", CHART, "--kube-version", KUBE_VERSION, *extra])


def test_lint_rejects_values_the_schema_forbids(helm: Path) -> None:
    cpu = CHART / "ci" / "cpu-values.yaml"
    for bad in ("deployment.spec.gpu.mode=mig", "operator.replicas=2", "images.worker.digest=latest",
                "deployment.spec.target.tensorParallelSize=0"):
        result = run([helm, "lint", CHART, "--values", cpu, "--set", bad], check=False)
        assert result.returncode != 0, f"helm lint accepted {bad}"
        assert "schema" in result.stdout + result.stderr


def test_every_rendered_manifest_passes_strict_kubernetes_validation(rendered: dict[str, list[Manifest]],
                                                                    crds: dict[str, Manifest]) -> None:
    manifests = [m for docs in rendered.values() for m in docs] + list(crds.values())
    checked = 0
    for manifest in manifests:
        if manifest["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        checked += 1
    assert checked >= 5 * 6  # operator SA, ClusterRole(+Binding), Deployment, test ConfigMap/Service/Pod per file


def test_recommended_labels_on_every_object(rendered: dict[str, list[Manifest]], crds: dict[str, Manifest]) -> None:
    for manifest in [*rendered["cpu-values.yaml"], *crds.values()]:
        labels = manifest["metadata"]["labels"]
        missing = [k for k in RECOMMENDED_LABELS if k not in labels]
        assert not missing, f"{manifest['kind']} {manifest['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/part-of"] == "minedraft"


def test_operator_deployment_runs_locked_down_with_health_probe(rendered: dict[str, list[Manifest]]) -> None:
    deployment = one(rendered["default"], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    assert container["image"] == "ghcr.io/minedraft/minedraft-operator:0.1.0"
    assert container["args"] == ["--all-namespaces"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    security = container["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}}
    assert pod["serviceAccountName"] == one(rendered["default"], "ServiceAccount")["metadata"]["name"]


def test_image_digest_wins_over_tag(helm: Path) -> None:
    digest = "sha256:" + "ab" * 32
    manifests = helm_template(helm, CHART, sets=[f"images.operator.digest={digest}", "images.operator.tag=x"])
    container = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/minedraft/minedraft-operator@{digest}"


def test_watch_namespaces_gives_namespaced_roles_and_flags(helm: Path) -> None:
    manifests = helm_template(helm, CHART, sets=["operator.watchNamespaces={team-a,team-b}"])
    container = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--namespace=team-a", "--namespace=team-b"]
    roles = by_kind(manifests, "Role")
    assert [r["metadata"]["namespace"] for r in roles] == ["team-a", "team-b"]
    assert [b["metadata"]["namespace"] for b in by_kind(manifests, "RoleBinding")] == ["team-a", "team-b"]
    cluster_resources = {res for rule in one(manifests, "ClusterRole")["rules"] for res in rule["resources"]}
    assert cluster_resources == {"namespaces", "customresourcedefinitions"}
    assert not {"pods", "services"} - {res for rule in roles[0]["rules"] for res in rule["resources"]}


def test_rbac_and_operator_can_be_turned_off(helm: Path) -> None:
    kinds = {m["kind"] for m in helm_template(helm, CHART, sets=["rbac.create=false"])}
    assert "ClusterRole" not in kinds and "Deployment" in kinds
    assert helm_template(helm, CHART, sets=["operator.enabled=false", "test.enabled=false"]) == []


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_ci_values_create_the_example_resources(values: Path, rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered[values.name]
    mdd = one(manifests, "MineDraftDeployment")
    policy = one(manifests, "SpeculationPolicy")
    assert mdd["spec"]["policyRef"] == {"name": policy["metadata"]["name"]}
    images = mdd["spec"]["images"]
    assert images["batchManager"] == "ghcr.io/minedraft/minedraft-batch-manager:0.1.0"
    expected_worker = "minedraft-worker-cpu" if values.name == "cpu-values.yaml" else "minedraft-worker-gpu"
    assert images["worker"] == f"ghcr.io/minedraft/{expected_worker}:0.1.0"
    assert mdd["metadata"]["namespace"] == policy["metadata"]["namespace"] == "minedraft-system"


def test_charts_refuse_clusters_older_than_1_34(helm: Path) -> None:
    for chart in (CHART, CRDS_CHART):
        result = run([helm, "template", "x", chart, "--kube-version", "1.33.5"], check=False)
        assert result.returncode != 0 and ">=1.34.0-0" in result.stderr
