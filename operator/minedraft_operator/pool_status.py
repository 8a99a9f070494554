"""The InferencePoolReady condition: whether the pool spec.routing asks for exists.

Read from the API at every sync rather than remembered from the last apply, so installing the pool's CRD
later (and the next reconcile creating the pool) clears the condition without a restart.
"""

from __future__ import annotations

from minedraft_operator.kube import ApiError, KubeApi, api_path
from minedraft_operator.render.routing import POOL_API_VERSION, POOL_PLURAL, pool_enabled
from minedraft_operator.spec import DeploymentSpec
from minedraft_operator.status import condition

CONDITION = "InferencePoolReady"


async def pool_condition(api: KubeApi, spec: DeploymentSpec) -> dict[str, str] | None:
    """None while no pool is asked for (the condition is left out of the status)."""
    if not pool_enabled(spec):
        return None
    pools = api_path(POOL_API_VERSION, POOL_PLURAL, spec.namespace)
    try:
        if await api.get(f"{pools}/{spec.name}") is not None:
            return condition(CONDITION, "True", "Created", f"InferencePool {spec.name} selects the serving pods")
        await api.list(pools)  # the collection answers: the CRD is installed, the pool is not created yet
    except ApiError as err:
        if err.status == 404:
            return condition(CONDITION, "False", "CRDNotInstalled",
                             f"{POOL_PLURAL}.{POOL_API_VERSION.split('/')[0]} is not served by this cluster: "
                             "install the Gateway API inference extension's CRDs")
        return condition(CONDITION, "False", "ApiError", f"reading InferencePool {spec.name}: {err}")
    return condition(CONDITION, "False", "NotCreated", f"InferencePool {spec.name} not created yet")
