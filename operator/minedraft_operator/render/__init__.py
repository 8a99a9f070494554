"""Reconcile as a pure function: a MineDraftDeployment in, the objects it needs out.

The chart's tests call `render` on the example resources; the operator applies its output. The
admin key Secret the operator generates is not rendered here (its value is random, made once:
see admin_secret.admin_keys), only referenced as a mounted volume.
"""

from __future__ import annotations

from typing import Any

from minedraft_operator.render.disruption import disruption_budget
from minedraft_operator.render.gpu import claim_template
from minedraft_operator.render.monitoring import MONITOR_API_VERSION, MONITOR_PLURAL, monitor_enabled, pod_monitor
from minedraft_operator.render.network import OperatorPods, network_policy
from minedraft_operator.render.pod import deployment
from minedraft_operator.render.routing import POOL_API_VERSION, POOL_PLURAL, inference_pool, pool_enabled
from minedraft_operator.render.service import headless_service, service
from minedraft_operator.spec import DeploymentSpec

# Kinds the operator owns, as (apiVersion, kind, plural): what it applies and prunes.
OWNED_KINDS = (
    ("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates"),
    ("apps/v1", "Deployment", "deployments"),
    ("v1", "Service", "services"),
    ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    ("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    (POOL_API_VERSION, "InferencePool", POOL_PLURAL),
    (MONITOR_API_VERSION, "PodMonitor", MONITOR_PLURAL),
)
# Owned kinds whose CRD a cluster may lack: a 404 skips them (reported in status) instead of failing.
OPTIONAL_KINDS = frozenset({"InferencePool", "PodMonitor"})


def render(resource: dict[str, Any], operator: OperatorPods | None = None) -> list[dict[str, Any]]:
    """Desired objects for one MineDraftDeployment, in apply order (claim template before its pods,
    the NetworkPolicy before the pods whose admin port it guards). `operator`: where the operator's
    pods run (the NetworkPolicy's allowed peers); None = the chart's defaults."""
    spec = DeploymentSpec.from_resource(resource)
    objects = []
    if spec.gpu_mode == "dra":
        objects.append(claim_template(spec))
    if spec.raw["networkPolicy"]["enabled"]:
        objects.append(network_policy(spec, operator or OperatorPods()))
    serving = deployment(spec)
    objects += [serving, service(spec), headless_service(spec)]
    if spec.raw["disruptionBudget"]["enabled"]:
        objects.append(disruption_budget(spec))
    if pool_enabled(spec):
        objects.append(inference_pool(spec, serving["spec"]["template"]["spec"]))
    if monitor_enabled(spec):
        objects.append(pod_monitor(spec))
    return objects


__all__ = ["OPTIONAL_KINDS", "OWNED_KINDS", "OperatorPods", "render"]
