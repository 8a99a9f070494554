"""The admin API key of a MineDraftDeployment's batch managers: which Secret holds it, and the Secret
the operator generates when the resource names none, so the admin port never runs without a key."""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

from minedraft_operator.render.names import metadata
from minedraft_operator.spec import DeploymentSpec

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


def new_key() -> str:
    """256 random bits, URL-safe (a header value without escaping)."""
    return secrets.token_urlsafe(32)


def generated_secret(spec: DeploymentSpec, value: str) -> dict[str, Any]:
    """The operator's Secret for a resource without adminSecretRef (owned by it: deleted with it).
    `data`, not `stringData`: what the API server stores and returns either way."""
    ref = admin_key_ref(spec)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata(spec, ref.name, COMPONENT),
            "type": "Opaque", "immutable": True, "data": {ref.key: base64.b64encode(value.encode()).decode()}}


def secret_keys(secret: dict[str, Any], key: str) -> tuple[str, ...]:
    """The keys in a Secret's value as the API returns it (base64 `data`), read as the batch manager
    reads its key file: one per line or comma-separated, `#` comments. Several keys = a rotation in
    progress (new first, then old): the batch managers accept each. Empty when absent or blank."""
    raw = secret.get("data", {}).get(key)
    if not raw:
        return ()
    text = base64.b64decode(raw).decode()
    return tuple(k.strip() for line in text.splitlines() if not line.lstrip().startswith("#")
                 for k in line.split(",") if k.strip())
