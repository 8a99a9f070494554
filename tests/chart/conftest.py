"""Fixtures of the chart tests: the tools, and each ci values file rendered once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.k8s_tools import CHART, CI_VALUES, CRDS_CHART, Manifest, helm_template, tool


@pytest.fixture(scope="session")
def helm() -> Path:
    return tool("helm", "HELM")


@pytest.fixture(scope="session")
def hadolint() -> Path:
    return tool("hadolint", "HADOLINT")


@pytest.fixture(scope="session")
def rendered(helm: Path) -> dict[str, list[Manifest]]:
    """ci values file name (e.g. "cpu-values.yaml") -> the chart's manifests with it; "default" -> none."""
    out = {path.name: helm_template(helm, CHART, [path]) for path in CI_VALUES}
    out["default"] = helm_template(helm, CHART)
    return out


@pytest.fixture(scope="session")
def crds(helm: Path) -> dict[str, Manifest]:
    """The minedraft-crds chart's CRDs by kind (MineDraftDeployment, SpeculationPolicy)."""
    return {crd["spec"]["names"]["kind"]: crd for crd in helm_template(helm, CRDS_CHART)}
