"""Client of a batch manager's admin port: GET /health, GET and PUT /admin/policy.

Every call carries the deployment's admin key as `Authorization: Bearer <key>` (what the batch
manager's admin API checks, api_keys.py); the key is per deployment, so it is per call here. The
Secret may hold several keys while one is rotated (new first, then old): a call refused with 401
is retried with the next one, since a replica's mounted Secret lags the API's by up to a minute or
two (the kubelet's sync), and the old key is what it still accepts meanwhile."""

from __future__ import annotations

import json
from collections.abc import Sequence
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

    async def _call(self, method: str, url: str, keys: Sequence[str], body: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
        """`keys` in order of preference; none = no header (a batch manager without an admin key)."""
        attempts: Sequence[str | None] = keys or [None]
        for i, key in enumerate(attempts):
            headers = {"Authorization": f"Bearer {key}"} if key else None
            try:
                async with self.session.request(method, url, json=body, headers=headers) as reply:
                    text = await reply.text()
                    if reply.status == 401 and i + 1 < len(attempts):
                        continue  # this replica has not seen the rotation yet (or already dropped this key)
                    if reply.status >= 400:
                        raise AdminError(f"{method} {url}: HTTP {reply.status}: {text[:300]}")
                    return dict(json.loads(text))
            except (aiohttp.ClientError, TimeoutError, ValueError) as err:
                raise AdminError(f"{method} {url}: {type(err).__name__}: {err}") from err
        raise AssertionError("the last attempt returns or raises")

    async def health(self, base: str, keys: Sequence[str]) -> dict[str, Any]:
        return await self._call("GET", f"{base}/health", keys)

    async def get_policy(self, base: str, keys: Sequence[str]) -> dict[str, Any]:
        return await self._call("GET", f"{base}/admin/policy", keys)

    async def put_policy(self, base: str, body: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
        return await self._call("PUT", f"{base}/admin/policy", keys, body)
