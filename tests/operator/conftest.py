"""Shared fixtures of the operator tests: the example custom resources and the CRDs."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from minedraft_operator.crds import deployment_crd, policy_crd

if TYPE_CHECKING:
    from tests.operator.pod_runner import LocalPod

EXAMPLES = Path(__file__).resolve().parents[2] / "operator" / "examples"
# The running pod's admin key, from a Secret its resource names (auth.adminSecretRef), as a user's would.
ADMIN_SECRET = "tiny-admin"
ADMIN_SECRET_KEY = "admin-api-key"
ADMIN_KEY = "pod-test-admin-key-7c1f"


def admin_secret(namespace: str) -> dict[str, Any]:
    """The Secret as the API stores it (base64 data)."""
    import base64

    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": ADMIN_SECRET, "namespace": namespace},
            "type": "Opaque", "data": {ADMIN_SECRET_KEY: base64.b64encode(ADMIN_KEY.encode()).decode()}}


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


def cpu_pod_resource(ports: list[int]) -> dict[str, Any]:
    """A CPU MineDraftDeployment whose seven ports are the given free ones; the target comes from a
    PVC (mapped to a local folder by the pod runner), the draft from the worker image's bundled pair."""
    from minedraft.bundled import TINY_DRAFT  # the venv's install stands in for the worker image

    mdd = load_example("mdd-cpu-tiny.yaml")
    mdd["metadata"].update(namespace="default", uid="0f0e0d0c-uid")
    spec = mdd["spec"]
    spec["target"]["model"] = {"pvc": {"claimName": "models", "path": "tiny-target"}}
    spec["images"]["bundledModelsDir"] = str(TINY_DRAFT.parent)
    spec["target"]["threads"] = spec["draft"]["threads"] = 1
    spec["target"]["captureBatch"] = 8  # no CUDA graphs on a CPU: the workers must take the flag and start alike
    spec["draft"]["blas"] = "cublaslt"  # likewise: a GPU-only setting a CPU worker accepts and leaves alone
    spec["ports"] = dict(zip(("verifier", "draft", "tensorParallel", "dataPlane", "admin"), ports, strict=False))
    spec["service"] = {"grpcPort": ports[5], "httpPort": ports[6]}
    spec["auth"] = {"adminSecretRef": {"name": ADMIN_SECRET, "key": ADMIN_SECRET_KEY}}
    return mdd


@pytest.fixture(scope="session")
def running_pod(tmp_path_factory: pytest.TempPathFactory):
    """One CPU serving pod, rendered by the operator and run as local processes (shared: it takes seconds)."""
    from tests.operator.pod_runner import free_ports, http

    mdd = cpu_pod_resource(free_ports(7))
    with local_cpu_pod(mdd, tmp_path_factory.mktemp("pod")) as pod:
        status, pod.initial_policy = http("GET", f"http://127.0.0.1:{pod.port('batch-manager', 'admin')}/admin/policy",
                                          key=ADMIN_KEY)
        assert status == 200, pod.initial_policy
        yield mdd, pod


@contextlib.contextmanager
def local_cpu_pod(mdd: dict[str, Any], root: Path) -> Iterator[LocalPod]:
    """The pod the operator renders for `mdd` (a `cpu_pod_resource`), started and Ready; stopped on exit."""
    from minedraft.bundled import TINY_TARGET
    from minedraft_operator.render import render
    from tests.operator.pod_runner import LocalPod

    deployment = next(o for o in render(mdd) if o["kind"] == "Deployment")
    # /tmp stays this machine's: mapping it would also move a checkout (and its models) that lives under /tmp.
    mounts = {"target-model": TINY_TARGET.parent, "home": root / "home"}
    mounts["home"].mkdir()
    pod = LocalPod(deployment["spec"]["template"], mounts, root / "logs",
                   secrets={ADMIN_SECRET: {ADMIN_SECRET_KEY: ADMIN_KEY}})
    pod.start()
    try:
        pod.wait_ready(timeout_s=150)
        yield pod
    finally:
        pod.stop()
