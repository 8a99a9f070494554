"""Reconcile as a pure function: a MineDraftDeployment in, the objects it needs out.

The chart's tests call `render` on the example resources; the operator applies its output.
"""

from __future__ import annotations

from typing import Any

from minedraft_operator.render.gpu import claim_template
from minedraft_operator.render.pod import deployment
from minedraft_operator.render.service import service
from minedraft_operator.spec import DeploymentSpec

# Kinds the operator owns, as (apiVersion, kind, plural): what it applies and prunes.
OWNED_KINDS = (
    ("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates"),
    ("apps/v1", "Deployment", "deployments"),
    ("v1", "Service", "services"),
)


def render(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """Desired objects for one MineDraftDeployment, in apply order (claim template before its pods)."""
    spec = DeploymentSpec.from_resource(resource)
    objects = []
    if spec.gpu_mode == "dra":
        objects.append(claim_template(spec))
    objects += [deployment(spec), service(spec)]
    return objects


__all__ = ["OWNED_KINDS", "render"]
