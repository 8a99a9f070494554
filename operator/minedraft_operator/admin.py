"""Client of a batch manager's admin port: GET /health, GET and PUT /admin/policy.

Every call carries the deployment's admin key as `Authorization: Bearer <key>` (what the batch
manager's admin API checks, api_keys.py); the key is per deployment, so it is per call here."""

from __future__ import annotations

import json
from typing import Any

import aiohttp


class AdminError(Exception):
    """The replica could not be reached or refused the change (the message says which)."""


class AdminClient:
    def __init__(self, timeout_s: float = 30.0) -> None:
        # A PUT waits for the batch manager to drain in-flight steps, hence the generous timeout.
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def close(self) -> None:
        await self.session.close()

    async def _call(self, method: str, url: str, key: str | None, body: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else None
        try:
            async with self.session.request(method, url, json=body, headers=headers) as reply:
                text = await reply.text()
                if reply.status >= 400:
                    raise AdminError(f"{method} {url}: HTTP {reply.status}: {text[:300]}")
                return dict(json.loads(text))
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            raise AdminError(f"{method} {url}: {type(err).__name__}: {err}") from err

    async def health(self, base: str, key: str | None) -> dict[str, Any]:
        return await self._call("GET", f"{base}/health", key)

    async def get_policy(self, base: str, key: str | None) -> dict[str, Any]:
        return await self._call("GET", f"{base}/admin/policy", key)

    async def put_policy(self, base: str, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        return await self._call("PUT", f"{base}/admin/policy", key, body)
