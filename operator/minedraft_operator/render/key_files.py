"""The batch manager's key Secrets as read-only volumes: the admin key (always) and the public API
key (`spec.auth.secretRef`, when set). A mounted Secret, unlike an env var, is updated in place
by the kubelet, and the batch manager re-reads the file (MINEDRAFT_*_API_KEY_FILE) when it changes,
so rotating a key needs no restart. The whole Secret directory is mounted (a subPath mount would
never see an update) with only the one key projected into it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minedraft_operator.render.admin_key import SecretKey, admin_key_ref
from minedraft_operator.spec import DeploymentSpec

KEYS_ROOT = "/etc/minedraft"
KEY_FILE = "key"  # the file name inside each mounted directory
PUBLIC_KEY_DEFAULT = "api-key"
READ_ONLY_MODE = 0o440  # owner root, group = the pod's fsGroup (the images' user): nobody else


@dataclass(frozen=True, slots=True)
class KeyMount:
    volume: str  # also the directory under KEYS_ROOT
    secret: SecretKey
    env: str  # the batch manager's variable naming the file

    @property
    def directory(self) -> str:
        return f"{KEYS_ROOT}/{self.volume}"

    @property
    def path(self) -> str:
        return f"{self.directory}/{KEY_FILE}"

    def pod_volume(self) -> dict[str, Any]:
        return {"name": self.volume, "secret": {"secretName": self.secret.name, "defaultMode": READ_ONLY_MODE,
                                                "items": [{"key": self.secret.key, "path": KEY_FILE}]}}

    def container_mount(self) -> dict[str, Any]:
        return {"name": self.volume, "mountPath": self.directory, "readOnly": True}

    def env_entry(self) -> dict[str, Any]:
        return {"name": self.env, "value": self.path}


def key_mounts(spec: DeploymentSpec) -> list[KeyMount]:
    """The admin key always (the user's Secret or the generated one), the public key when configured."""
    mounts = [KeyMount("admin-key", admin_key_ref(spec), "MINEDRAFT_ADMIN_API_KEY_FILE")]
    public = spec.raw.get("auth", {}).get("secretRef")
    if public:
        ref = SecretKey(public["name"], public.get("key", PUBLIC_KEY_DEFAULT), generated=False)
        mounts.append(KeyMount("api-key", ref, "MINEDRAFT_API_KEY_FILE"))
    return mounts
