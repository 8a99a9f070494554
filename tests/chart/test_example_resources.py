"""The chart's example custom resources: admitted by the shipped CRDs (schema and CEL), reconciled by
the operator's pure render function into objects Kubernetes 1.34 accepts, and wired to the helm test."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from minedraft_operator.render import render
from tests.chart.k8s_tools import CI_VALUES, KUBE_VERSION, Manifest, by_kind, one
from tests.operator.admission import admit

UID = "0f9d6c52-0c1e-4b7e-9a51-3f6f0c2b7d10"  # what the API server would assign


def admitted(crds: dict[str, Manifest], manifest: Manifest) -> Manifest:
    defaulted, errors = admit(crds[manifest["kind"]], manifest)
    assert errors == [], f"{manifest['kind']} {manifest['metadata']['name']} rejected: {errors}"
    defaulted = copy.deepcopy(defaulted)
    defaulted["metadata"]["uid"] = UID
    return defaulted


def operator_objects(rendered: dict[str, list[Manifest]], crds: dict[str, Manifest], values: str) -> list[Manifest]:
    return render(admitted(crds, one(rendered[values], "MineDraftDeployment")))


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_crds_admit_the_example_resources(values: Path, rendered: dict[str, list[Manifest]],
                                          crds: dict[str, Manifest]) -> None:
    for kind in ("MineDraftDeployment", "SpeculationPolicy"):
        admitted(crds, one(rendered[values.name], kind))


def test_crds_reject_a_broken_example(rendered: dict[str, list[Manifest]], crds: dict[str, Manifest]) -> None:
    mdd = copy.deepcopy(one(rendered["cpu-values.yaml"], "MineDraftDeployment"))
    mdd["spec"]["target"]["dtype"] = "bfloat16"  # CPU (gpu.mode none) needs float32: a CEL rule
    assert admit(crds["MineDraftDeployment"], mdd)[1]
    policy = copy.deepcopy(one(rendered["cpu-values.yaml"], "SpeculationPolicy"))
    policy["spec"]["k"] = {"initial": 9, "min": 1, "max": 8}
    assert admit(crds["SpeculationPolicy"], policy)[1] == [".spec.k: k must satisfy min <= initial <= max"]


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_operator_objects_pass_strict_kubernetes_validation(values: Path, rendered: dict[str, list[Manifest]],
                                                            crds: dict[str, Manifest]) -> None:
    objects = operator_objects(rendered, crds, values.name)
    kinds = [o["kind"] for o in objects]
    gpu_mode = one(rendered[values.name], "MineDraftDeployment")["spec"]["gpu"]["mode"]
    assert kinds == (["ResourceClaimTemplate"] if gpu_mode == "dra" else []) + ["NetworkPolicy", "Deployment",
                                                                               "Service", "Service",
                                                                               "PodDisruptionBudget"]
    for manifest in objects:
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)


def _containers(objects: list[Manifest]) -> dict[str, dict[str, Any]]:
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_pods_run_the_chart_images(values: Path, rendered: dict[str, list[Manifest]],
                                   crds: dict[str, Manifest]) -> None:
    images = one(rendered[values.name], "MineDraftDeployment")["spec"]["images"]
    containers = _containers(operator_objects(rendered, crds, values.name))
    assert containers.pop("batch-manager")["image"] == images["batchManager"]
    assert {c["image"] for c in containers.values()} == {images["worker"]}


def _flags(pod: Manifest) -> dict[str, str]:
    args = pod["spec"]["containers"][0]["args"]
    return dict(a.removeprefix("--").split("=", 1) for a in args if "=" in a)


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_helm_test_reaches_what_the_operator_serves(values: Path, rendered: dict[str, list[Manifest]],
                                                    crds: dict[str, Manifest]) -> None:
    manifests = rendered[values.name]
    objects = operator_objects(rendered, crds, values.name)
    (service,) = [s for s in by_kind(objects, "Service") if s["spec"].get("clusterIP") != "None"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    flags = _flags(one(manifests, "Pod"))
    assert flags["grpc"] == f"{service['metadata']['name']}:{ports['grpc']}"
    assert flags["http"] == f"http://{service['metadata']['name']}:{ports['http']}"
    # /health of every replica on its public HTTP port (the NetworkPolicy keeps the admin port to the operator).
    (replicas,) = [s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") == "None"]
    assert replicas["spec"]["selector"] == one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    manager_ports = {p["name"]: p["containerPort"] for p in _containers(objects)["batch-manager"]["ports"]}
    (port,) = replicas["spec"]["ports"]
    assert port["targetPort"] == "http" and port["port"] == manager_ports["http"]
    host = f"{replicas['metadata']['name']}.{replicas['metadata']['namespace']}.svc"
    assert flags["health"] == f"http://{host}:{manager_ports['http']}/health"
    open_to_all = [r for r in one(objects, "NetworkPolicy")["spec"]["ingress"] if "from" not in r]
    assert manager_ports["http"] in {p["port"] for r in open_to_all for p in r["ports"]}


def test_bundled_models_live_where_the_images_put_them(rendered: dict[str, list[Manifest]],
                                                       crds: dict[str, Manifest]) -> None:
    containers = _containers(operator_objects(rendered, crds, "cpu-values.yaml"))
    env = {e["name"]: e.get("value") for e in containers["verifier"]["env"]}
    assert env["MINEDRAFT_MODEL"] == "/opt/minedraft/models/tiny-target"
    manager_env = {e["name"]: e.get("value") for e in containers["batch-manager"]["env"]}
    assert manager_env["MINEDRAFT_TOKENIZER"] == "/opt/minedraft/models/tiny-target"
