"""The operator's whole loop against kmock's KubernetesEmulator: resources, a client, the running operator.

The test talks to the emulator over HTTP (as kubectl would); kopf and the operator's own client
reach it through the login handler. Each request the operator made is checked against rbac.RULES.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import kopf

from minedraft_operator import rbac
from minedraft_operator.handlers import OperatorState, build_registry
from minedraft_operator.kube import api_path

ALL_VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}
RESOURCES: dict[str, dict[str, Any]] = {
    "minedraft.io/v1alpha1/minedraftdeployments": {"kind": "MineDraftDeployment", "subresources": {"status"}},
    "minedraft.io/v1alpha1/speculationpolicies": {"kind": "SpeculationPolicy", "subresources": {"status"}},
    "v1/pods": {"kind": "Pod", "subresources": {"status"}},
    "apps/v1/deployments": {"kind": "Deployment"},
    "v1/services": {"kind": "Service"},
    "resource.k8s.io/v1/resourceclaimtemplates": {"kind": "ResourceClaimTemplate"},
    "networking.k8s.io/v1/networkpolicies": {"kind": "NetworkPolicy"},
    "policy/v1/poddisruptionbudgets": {"kind": "PodDisruptionBudget"},
    "inference.networking.k8s.io/v1/inferencepools": {"kind": "InferencePool"},
    "monitoring.coreos.com/v1/podmonitors": {"kind": "PodMonitor"},
    "v1/secrets": {"kind": "Secret"},
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {"kind": "CustomResourceDefinition", "namespaced": False},
}


def _not_served(kmock: Any, key: str) -> None:
    """Answer 404 for a resource, as an API server without its CRD does. The emulator would serve any path,
    and stores what is POSTed even when a reaction answers instead: forget it, so a retry is a 404 again."""
    group_version, _, plural = key.rpartition("/")

    def forget(request: Any) -> None:
        name = (request.data or {}).get("metadata", {}).get("name") if request.method.upper() == "POST" else None
        if name and (key, request.namespace, name) in kmock.objects:
            del kmock.objects[key, request.namespace, name]

    path = re.compile(rf"^/apis/{re.escape(group_version)}/(namespaces/[^/]+/)?{plural}(/.*)?$")
    (kmock ** 100)[path] << 404 >> forget


def declare_resources(kmock: Any, absent: tuple[str, ...] = ()) -> None:
    """Every kind the operator touches, but those in `absent` (a cluster without their CRD)."""
    for key in absent:
        _not_served(kmock, key)
    for key, info in RESOURCES.items():
        if key in absent:
            continue
        kmock.resources[key] = kmock.ResourceInfo(kind=info["kind"], namespaced=info.get("namespaced", True),
                                                  verbs=ALL_VERBS, subresources=info.get("subresources", set()))


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = 20.0, what: str = "") -> Any:
    """Poll an async check until it returns something truthy (and not raising AssertionError)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = await check()
            if last:
                return last
        except AssertionError as err:
            last = err
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: last {last!r}")
        await asyncio.sleep(0.1)


class Cluster:
    """kubectl for the emulator: plain HTTP calls."""

    def __init__(self, server: str, session: aiohttp.ClientSession) -> None:
        self.server = server.rstrip("/")
        self.session = session
        self.writes = 0

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Content-Type": "application/merge-patch+json" if method == "PATCH" else "application/json"}
        async with self.session.request(method, self.server + path, json=body, headers=headers) as reply:
            assert reply.status < 400, f"{method} {path}: {reply.status} {await reply.text()}"
            return await reply.json()

    async def create(self, api_version: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.call("POST", api_path(api_version, plural, obj["metadata"]["namespace"]), obj)

    async def patch(self, api_version: str, plural: str, namespace: str, name: str, body: dict[str, Any],
                    subresource: str | None = None) -> dict[str, Any]:
        # A real API server gives every write a new resourceVersion; the emulator keeps whatever the
        # object carries, and kopf takes an event with the version its own last patch saw as stale.
        self.writes += 1
        body = {**body, "metadata": {**body.get("metadata", {}), "resourceVersion": f"test-{self.writes}"}}
        return await self.call("PATCH", api_path(api_version, plural, namespace, name, subresource), body)

    async def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return await self.call("GET", api_path(api_version, plural, namespace, name))

    async def list(self, api_version: str, plural: str, namespace: str) -> list[dict[str, Any]]:
        return (await self.call("GET", api_path(api_version, plural, namespace)))["items"]


@contextlib.asynccontextmanager
async def running_operator(kmock: Any, sync_seconds: float = 1.0,
                           absent: tuple[str, ...] = ()) -> AsyncIterator[Cluster]:
    """The operator as a task on the test's loop (the emulator serves from it too); `absent`: resources
    (RESOURCES keys) the cluster does not serve."""
    declare_resources(kmock, absent)
    server = str(kmock.url)
    state = OperatorState(sync_seconds=sync_seconds)
    registry = build_registry(state, login=lambda **_: kopf.ConnectionInfo(server=server, insecure=True))
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    settings.watching.reconnect_backoff = 0.2
    stop = asyncio.Event()
    task = asyncio.create_task(kopf.operator(registry=registry, settings=settings, standalone=True,
                                             clusterwide=True, stop_flag=stop))
    async with aiohttp.ClientSession() as session:
        try:
            yield Cluster(server, session)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=15)
    check_rbac(kmock)


def _verb(request: Any) -> str:
    method = request.method.upper()
    if method == "GET":
        if request.name:
            return "get"
        return "watch" if request.params.get("watch") in ("true", "1") else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]


def check_rbac(kmock: Any) -> None:
    """Every API request the operator (kopf or our client) made is allowed by the ClusterRole rules."""
    seen = 0
    for request in list(kmock):
        agent = request.headers.get("User-Agent", "")
        if request.resource is None or request.resource.plural is None:  # discovery: open to everyone
            continue
        if not agent.startswith(("kopf/", "minedraft-operator/")):
            continue
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        verb = _verb(request)
        assert rbac.allows(request.resource.group, resource, verb), f"{verb} {request.resource} not in rules.yaml"
        seen += 1
    assert seen > 0
