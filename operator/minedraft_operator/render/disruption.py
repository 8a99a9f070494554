"""The PodDisruptionBudget of a MineDraftDeployment's serving pods.

maxUnavailable (1 by default), not minAvailable: a budget never blocks a node drain outright (one
replica may still be evicted), yet with several replicas a drain takes them down one at a time.
It is rendered for any replica count, so scaling up needs no new object."""

from __future__ import annotations

from typing import Any

from minedraft_operator.render.names import metadata, selector
from minedraft_operator.spec import DeploymentSpec


def disruption_budget(spec: DeploymentSpec) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": metadata(spec, spec.name, "disruption-budget"),
        "spec": {"selector": {"matchLabels": selector(spec)},
                 "maxUnavailable": spec.raw["disruptionBudget"]["maxUnavailable"],
                 # A pod that never became Ready (a model still loading, a crash loop) may be evicted anyway.
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }
