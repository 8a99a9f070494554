"""The admin API key of a MineDraftDeployment's batch managers: which Secret holds it, and the Secret
the operator generates when the resource names none, so the admin port never runs without a key."""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

from minedraft_operator.render.names import metadata
from minedraft_operator.spec import DeploymentSpec

ADMIN_KEY_ENV = "MINEDRAFT_ADMIN_API_KEY"  # what the batch manager reads (server_flags.py)
GENERATED_KEY = "admin-api-key"
COMPONENT = "admin-key"


@dataclass(frozen=True, slots=True)
class SecretKey:
    name: str
    key: str
    generated: bool  # the operator's own Secret (created when missing), not one the user named


def admin_key_ref(spec: DeploymentSpec) -> SecretKey:
    ref = spec.raw.get("auth", {}).get("adminSecretRef")
    if ref:
        return SecretKey(ref["name"], ref.get("key", GENERATED_KEY), generated=False)
    return SecretKey(f"{spec.name}-admin-key", GENERATED_KEY, generated=True)


def env_entry(ref: SecretKey) -> dict[str, Any]:
    return {"name": ADMIN_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def new_key() -> str:
    """256 random bits, URL-safe (a header value without escaping)."""
    return secrets.token_urlsafe(32)


def generated_secret(spec: DeploymentSpec, value: str) -> dict[str, Any]:
    """The operator's Secret for a resource without adminSecretRef (owned by it: deleted with it).
    `data`, not `stringData`: what the API server stores and returns either way."""
    ref = admin_key_ref(spec)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata(spec, ref.name, COMPONENT),
            "type": "Opaque", "immutable": True, "data": {ref.key: base64.b64encode(value.encode()).decode()}}


def secret_value(secret: dict[str, Any], key: str) -> str | None:
    """The key's value in a Secret as the API returns it (base64 `data`), None when absent or empty."""
    raw = secret.get("data", {}).get(key)
    if not raw:
        return None
    value = base64.b64decode(raw).decode().strip()
    return value or None
