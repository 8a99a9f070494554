"""The InferencePoolReady and PodMonitorReady conditions: whether the pool spec.routing asks for (and the
PodMonitor spec.podMonitor asks for) exists.

Read from the API at every sync rather than remembered from the last apply, so installing the pool's CRD
later (and the next reconcile creating the pool) clears the condition without a restart.
"""

from __future__ import annotations

from minedraft_operator.kube import ApiError, KubeApi, api_path
from minedraft_operator.render.monitoring import MONITOR_API_VERSION, MONITOR_PLURAL, monitor_enabled
from minedraft_operator.render.routing import POOL_API_VERSION, POOL_PLURAL, pool_enabled
from minedraft_operator.spec import DeploymentSpec
from minedraft_operator.status import condition

CONDITION = "InferencePoolReady"
MONITOR_CONDITION = "PodMonitorReady"


async def _owned_condition(api: KubeApi, spec: DeploymentSpec, api_version: str, plural: str, kind: str,
                           type_: str, created: str, install: str) -> dict[str, str]:
    collection = api_path(api_version, plural, spec.namespace)
    try:
        if await api.get(f"{collection}/{spec.name}") is not None:
            return condition(type_, "True", "Created", f"{kind} {spec.name} {created}")
        await api.list(collection)  # the collection answers: the CRD is installed, the object is not created yet
    except ApiError as err:
        if err.status == 404:
            return condition(type_, "False", "CRDNotInstalled",
                             f"{plural}.{api_version.split('/')[0]} is not served by this cluster: {install}")
        return condition(type_, "False", "ApiError", f"reading {kind} {spec.name}: {err}")
    return condition(type_, "False", "NotCreated", f"{kind} {spec.name} not created yet")


async def pool_condition(api: KubeApi, spec: DeploymentSpec) -> dict[str, str] | None:
    """None while no pool is asked for (the condition is left out of the status)."""
    if not pool_enabled(spec):
        return None
    return await _owned_condition(api, spec, POOL_API_VERSION, POOL_PLURAL, "InferencePool", CONDITION,
                                  "selects the serving pods", "install the Gateway API inference extension's CRDs")


async def monitor_condition(api: KubeApi, spec: DeploymentSpec) -> dict[str, str] | None:
    """None while no PodMonitor is asked for."""
    if not monitor_enabled(spec):
        return None
    return await _owned_condition(api, spec, MONITOR_API_VERSION, MONITOR_PLURAL, "PodMonitor", MONITOR_CONDITION,
                                  "scrapes the serving pods", "install the Prometheus Operator's CRDs")
