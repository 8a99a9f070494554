"""Shared fixtures of the operator tests: the example custom resources and the CRDs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from minedraft_operator.crds import deployment_crd, policy_crd

EXAMPLES = Path(__file__).resolve().parents[2] / "operator" / "examples"


def load_example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


@pytest.fixture
def gpu_mdd() -> dict[str, Any]:
    return copy.deepcopy(load_example("mdd-h200-dra.yaml"))


@pytest.fixture
def cpu_mdd() -> dict[str, Any]:
    return copy.deepcopy(load_example("mdd-cpu-tiny.yaml"))


@pytest.fixture
def policy() -> dict[str, Any]:
    return copy.deepcopy(load_example("speculationpolicy.yaml"))


@pytest.fixture(scope="session")
def mdd_crd() -> dict[str, Any]:
    return deployment_crd()


@pytest.fixture(scope="session")
def specpol_crd() -> dict[str, Any]:
    return policy_crd()
