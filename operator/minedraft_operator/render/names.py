"""Names, recommended labels and owner references of everything a MineDraftDeployment renders."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from minedraft_operator.crds import API_VERSION
from minedraft_operator.spec import DeploymentSpec

MANAGER = "minedraft-operator"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

# Container names: one per verifier rank, then the draft and the batch manager.
VERIFIER = "verifier"
DRAFT = "draft"
BATCH_MANAGER = "batch-manager"
SERVER = "server"  # component label of the pod: it holds all three services
GPU_CLAIM = "gpus"


def verifier_container(rank: int) -> str:
    return VERIFIER if rank == 0 else f"{VERIFIER}-tp{rank}"


def selector(spec: DeploymentSpec) -> dict[str, str]:
    """Labels that select the serving pods (stable across updates: a Deployment's selector is immutable).

    The component is part of it, so a release of the chart named like the MineDraftDeployment
    (same name and instance labels on the operator's own pods) is never selected.
    """
    return {NAME_LABEL: "minedraft", INSTANCE_LABEL: spec.name, COMPONENT_LABEL: SERVER}


def selector_string(spec: DeploymentSpec) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(spec).items())


def labels(spec: DeploymentSpec, component: str) -> dict[str, str]:
    out = {**selector(spec), COMPONENT_LABEL: component, "app.kubernetes.io/part-of": "minedraft",
           MANAGED_BY_LABEL: MANAGER}
    tag = spec.images["worker"].rpartition(":")[2]
    if "/" not in tag and tag != spec.images["worker"] and len(tag) <= 63:
        out["app.kubernetes.io/version"] = tag
    return out


def owner_reference(spec: DeploymentSpec) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "MineDraftDeployment", "name": spec.name, "uid": spec.uid,
            "controller": True, "blockOwnerDeletion": True}


def metadata(spec: DeploymentSpec, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": labels(spec, component),
            "ownerReferences": [owner_reference(spec)]}


def content_hash(value: Any) -> str:
    """Short stable hash, for objects whose spec is immutable (a change means a new name)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:8]
