"""kopf handlers, kept thin: each one finds the objects involved and calls sync.py.

Handlers live in a registry built at start-up (not at import), so tests and the CLI choose the
credentials and the sync period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from minedraft_operator.admin import AdminClient
from minedraft_operator.admin_secret import AdminKeyError
from minedraft_operator.crds import API_VERSION, GROUP, VERSION
from minedraft_operator.kube import ApiError, KubeApi, api_path
from minedraft_operator.render import OperatorPods
from minedraft_operator.render.names import INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGER
from minedraft_operator.sync import MDD_PLURAL, POLICY_PLURAL, apply_objects, sync_deployment, sync_policy_status

Login = Callable[..., kopf.ConnectionInfo | None]


@dataclass
class OperatorState:
    """Clients shared by all handlers (created on login, inside kopf's event loop)."""

    sync_seconds: float = 15.0
    operator_pods: OperatorPods = field(default_factory=OperatorPods)  # the admin port's allowed peers
    api: KubeApi | None = None
    admin: AdminClient | None = None
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    def connect(self, info: kopf.ConnectionInfo) -> None:
        old = self.api
        self.api = KubeApi(info)
        self.admin = self.admin or AdminClient()
        if old is not None:
            asyncio.get_running_loop().create_task(old.close())

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self.locks.setdefault((namespace, name), asyncio.Lock())

    async def close(self) -> None:
        for client in (self.api, self.admin):
            if client is not None:
                await client.close()


def build_registry(state: OperatorState, login: Login = kopf.login_via_client) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    def clients() -> tuple[KubeApi, AdminClient]:
        if state.api is None or state.admin is None:
            raise kopf.TemporaryError("not logged in yet", delay=2)
        return state.api, state.admin

    async def sync(mdd: dict[str, Any]) -> None:
        api, admin = clients()
        meta = mdd["metadata"]
        async with state.lock(meta["namespace"], meta["name"]):
            fresh = await api.get(api_path(API_VERSION, MDD_PLURAL, meta["namespace"], meta["name"]))
            if fresh is not None:
                await sync_deployment(api, admin, fresh)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
        settings.posting.level = logging.WARNING

    @kopf.on.login(registry=registry)
    async def authenticate(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = await asyncio.to_thread(lambda: login(**kwargs))  # may run a kubeconfig exec plugin
        if info is not None:
            state.connect(info)
        return info

    @kopf.on.cleanup(registry=registry)
    async def close(**_: Any) -> None:
        await state.close()

    @kopf.on.probe(id="apiConnected", registry=registry)
    def probe(**_: Any) -> bool:
        return state.api is not None

    @kopf.on.resume(GROUP, VERSION, MDD_PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, MDD_PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, MDD_PLURAL, registry=registry)
    async def reconcile(body: kopf.Body, patch: kopf.Patch, **_: Any) -> dict[str, Any]:
        api, _admin = clients()
        mdd = dict(body)
        try:
            applied = await apply_objects(api, mdd, state.operator_pods)
        except (ApiError, AdminKeyError) as err:
            raise kopf.TemporaryError(f"applying objects failed: {err}", delay=10) from err
        patch.status["observedGeneration"] = body["metadata"].get("generation", 1)
        await sync(mdd)
        return {"applied": applied}

    @kopf.timer(GROUP, VERSION, MDD_PLURAL, interval=state.sync_seconds, initial_delay=state.sync_seconds,
                registry=registry)
    async def resync(body: kopf.Body, **_: Any) -> None:
        """Retries failed pushes, re-pushes to restarted batch managers, refreshes acceptance and transport."""
        await sync(dict(body))

    @kopf.on.event("v1", "pods", labels={MANAGED_BY_LABEL: MANAGER}, registry=registry)
    async def pod_changed(body: kopf.Body, **_: Any) -> None:
        name = body["metadata"].get("labels", {}).get(INSTANCE_LABEL)
        if name:
            await sync({"metadata": {"namespace": body["metadata"]["namespace"], "name": name}})

    @kopf.on.event("apps", "v1", "deployments", labels={MANAGED_BY_LABEL: MANAGER}, registry=registry)
    async def deployment_changed(body: kopf.Body, **_: Any) -> None:
        """A rollout moved (the Deployment controller wrote its status): the resource's status follows."""
        name = body["metadata"].get("labels", {}).get(INSTANCE_LABEL)
        if name:
            await sync({"metadata": {"namespace": body["metadata"]["namespace"], "name": name}})

    @kopf.on.resume(GROUP, VERSION, POLICY_PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, POLICY_PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, POLICY_PLURAL, registry=registry)
    async def policy_changed(body: kopf.Body, **_: Any) -> None:
        api, _admin = clients()
        meta = body["metadata"]
        users = [m for m in await api.list(api_path(API_VERSION, MDD_PLURAL, meta["namespace"]))
                 if m.get("spec", {}).get("policyRef", {}).get("name") == meta["name"]]
        for mdd in users:
            await sync(mdd)  # also rewrites this policy's status
        if not users:
            await sync_policy_status(api, dict(body))

    return registry
