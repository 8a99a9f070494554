"""skaffold.yaml, read structurally (no skaffold binary or docker engine here): every profile builds
the images the chart needs from Dockerfiles that exist and hands them to the chart's image values."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.k8s_tools import CHART, CRDS_CHART, ROOT, helm_template, one

SKAFFOLD = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
CHART_IMAGES = ("operator", "batchManager", "worker")
WORKER_ARTIFACT = {"cpu": "minedraft-worker-cpu", "gpu": "minedraft-worker-gpu"}
TEMPLATE_VAR = re.compile(r"^\{\{\.IMAGE_(REPO|TAG|DIGEST)_(\w+)\}\}$")


def profile(name: str) -> dict[str, Any]:
    (found,) = [p for p in SKAFFOLD["profiles"] if p["name"] == name]
    return found


def sanitized(image: str) -> str:
    """Skaffold's template name of an artifact: '/', '-' and '.' become '_'."""
    return re.sub(r"[/.-]", "_", image)


def test_schema_version_and_profiles() -> None:
    assert re.fullmatch(r"skaffold/v4beta\d+", SKAFFOLD["apiVersion"])
    assert SKAFFOLD["kind"] == "Config"
    assert [p["name"] for p in SKAFFOLD["profiles"]] == ["cpu", "gpu"]
    assert profile("cpu")["build"] == SKAFFOLD["build"] and profile("cpu")["deploy"] == SKAFFOLD["deploy"]


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_artifacts_have_their_dockerfile_and_context(name: str) -> None:
    artifacts = profile(name)["build"]["artifacts"]
    assert [a["image"] for a in artifacts] == ["minedraft-operator", "minedraft-batch-manager", WORKER_ARTIFACT[name]]
    for artifact in artifacts:
        context = ROOT / artifact["context"]
        assert context.is_dir()
        assert (context / artifact["docker"]["dockerfile"]).is_file()
        assert artifact["docker"]["dockerfile"] == f"docker/{artifact['image'].removeprefix('minedraft-')}.Dockerfile"


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_releases_deploy_the_crds_first_then_the_chart_with_built_images(name: str) -> None:
    crds, chart = profile(name)["deploy"]["helm"]["releases"]
    assert ROOT / crds["chartPath"] == CRDS_CHART and ROOT / chart["chartPath"] == CHART
    assert crds["namespace"] == chart["namespace"]
    for values in chart["valuesFiles"]:
        assert (ROOT / values).is_file()
    built = {sanitized(a["image"]) for a in profile(name)["build"]["artifacts"]}
    templates = chart["setValueTemplates"]
    assert set(templates) == {f"images.{image}.{part}" for image in CHART_IMAGES for part in ("repository", "tag",
                                                                                               "digest")}
    for key, template in templates.items():
        kind, artifact = TEMPLATE_VAR.match(template).groups()
        assert artifact in built, f"{key} comes from {artifact}, which this profile does not build"
        assert key.endswith({"REPO": ".repository", "TAG": ".tag", "DIGEST": ".digest"}[kind])
    worker = sanitized(WORKER_ARTIFACT[name])
    assert templates["images.worker.repository"] == f"{{{{.IMAGE_REPO_{worker}}}}}"


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_the_chart_accepts_what_skaffold_sets(name: str, helm: Path) -> None:
    """The value keys exist, and a built image (repository + tag + digest) reaches the example resource."""
    chart = profile(name)["deploy"]["helm"]["releases"][1]
    digest = "sha256:" + "0" * 64

    def built_value(key: str) -> str:  # what skaffold would fill in for images.<image>.<part>
        image, part = key.split(".")[1:]
        return {"repository": f"registry.local/{image}", "tag": "abc123", "digest": digest}[part]

    sets = [f"{key}={built_value(key)}" for key in chart["setValueTemplates"]]
    manifests = helm_template(helm, CHART, [ROOT / v for v in chart["valuesFiles"]], sets)
    images = one(manifests, "MineDraftDeployment")["spec"]["images"]
    assert images["worker"] == f"registry.local/worker@{digest}"
    assert images["batchManager"] == f"registry.local/batchManager@{digest}"
    operator = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == f"registry.local/operator@{digest}"


def test_custom_resource_images_are_rewritable() -> None:
    assert {"groupKind": "MineDraftDeployment.minedraft.io", "image": [".*"]} in SKAFFOLD["resourceSelector"]["allow"]
