"""The admin key a deployment's batch managers expect, read from its Secret; for a deployment without
`auth.adminSecretRef`, the operator's own Secret, created (once, random, owned by the deployment)
when missing. Reading needs `get` on secrets, creating `create`: nothing lists or watches them."""

from __future__ import annotations

from minedraft_operator.kube import ApiError, KubeApi, api_path
from minedraft_operator.render.admin_key import admin_key_ref, generated_secret, new_key, secret_keys
from minedraft_operator.spec import DeploymentSpec


class AdminKeyError(Exception):
    """The admin key cannot be read (the Secret or its key is missing, or the API refused)."""


async def admin_keys(api: KubeApi, spec: DeploymentSpec) -> tuple[str, ...]:
    """The keys in the Secret, read afresh on every call (no cache: a rotation is seen on the next sync)."""
    ref = admin_key_ref(spec)
    path = api_path("v1", "secrets", spec.namespace, ref.name)
    try:
        secret = await api.get(path)
        if secret is None and ref.generated:
            try:
                secret = await api.create(generated_secret(spec, new_key()), "secrets")
            except ApiError as err:
                if err.status != 409:  # 409: created meanwhile (another sync of the same resource)
                    raise
                secret = await api.get(path)
    except ApiError as err:
        raise AdminKeyError(f"reading Secret {ref.name!r}: {err}") from err
    if secret is None:
        raise AdminKeyError(f"Secret {ref.name!r} (auth.adminSecretRef) not found in {spec.namespace}")
    keys = secret_keys(secret, ref.key)
    if not keys:
        raise AdminKeyError(f"Secret {ref.name!r} has no non-empty key {ref.key!r}")
    return keys
