"""A small async Kubernetes API client on aiohttp, using kopf's ConnectionInfo.

Why not the official client: its calls block, and kopf runs every handler on one asyncio loop.
kopf's own client is private API. The credentials come from kopf's login (which uses the official
`kubernetes` package to read kubeconfigs, exec plugins included, or the in-cluster service
account), so there is one source of truth for who the operator is.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import kopf

FIELD_MANAGER = "minedraft-operator"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def api_path(api_version: str, plural: str, namespace: str | None, name: str | None = None,
             subresource: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


class KubeApi:
    """The calls the operator makes besides kopf's own watching (see rbac.RULES)."""

    def __init__(self, info: kopf.ConnectionInfo, timeout_s: float = 30.0) -> None:
        self.server = info.server.rstrip("/")
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=info.as_ssl_context()),
            headers={"User-Agent": f"{FIELD_MANAGER}/0.1", **info.as_http_headers()},
            timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def close(self) -> None:
        await self.session.close()

    async def request(self, method: str, path: str, *, params: dict[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.server + path, params=params, data=data,
                                        headers={"Content-Type": content_type}) as reply:
            text = await reply.text()
            if reply.status >= 400:
                try:
                    message = json.loads(text).get("message", text)
                except (ValueError, AttributeError):
                    message = text
                raise ApiError(reply.status, str(message)[:500])
            return json.loads(text) if text else None

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        reply = await self.request("GET", path, params=params)
        return list(reply.get("items", []))

    async def apply(self, obj: dict[str, Any], plural: str) -> dict[str, Any]:
        """Server-side apply (we own every field we render); create when the server does not upsert."""
        meta = obj["metadata"]
        path = api_path(obj["apiVersion"], plural, meta.get("namespace"), meta["name"])
        try:
            return await self.request("PATCH", path, params={"fieldManager": FIELD_MANAGER, "force": "true"},
                                      body=obj, content_type="application/apply-patch+yaml")
        except ApiError as err:
            if err.status != 404:
                raise
        return await self.request("POST", api_path(obj["apiVersion"], plural, meta.get("namespace")), body=obj)

    async def create(self, obj: dict[str, Any], plural: str) -> dict[str, Any]:
        """POST; a 409 (it exists) is the caller's to handle."""
        meta = obj["metadata"]
        return dict(await self.request("POST", api_path(obj["apiVersion"], plural, meta.get("namespace")), body=obj))

    async def delete(self, path: str) -> None:
        try:
            await self.request("DELETE", path, body={"propagationPolicy": "Background"})
        except ApiError as err:
            if err.status != 404:
                raise

    async def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path + "/status", body={"status": status},
                                  content_type="application/merge-patch+json")
