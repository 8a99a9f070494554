"""Typed, defaulted view of a MineDraftDeployment (what the renderer reads instead of raw dicts)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from minedraft_operator.crds import deployment_crd
from minedraft_operator.defaults import apply_defaults

MODEL_ROOT = "/models"


@cache
def _spec_schema() -> dict[str, Any]:
    return deployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


@dataclass(frozen=True, slots=True)
class ModelSource:
    role: str  # "target" | "draft"
    pvc_claim: str | None
    pvc_path: str
    host_path: str | None
    bundled: str | None

    @classmethod
    def parse(cls, role: str, raw: dict[str, Any]) -> ModelSource:
        pvc = raw.get("pvc") or {}
        return cls(role, pvc.get("claimName"), pvc.get("path", "").strip("/"),
                   (raw.get("hostPath") or {}).get("path"), raw.get("bundled"))

    @property
    def volume_name(self) -> str | None:
        return None if self.bundled else f"{self.role}-model"

    @property
    def mount_path(self) -> str:
        return f"{MODEL_ROOT}/{self.role}"

    def folder(self, bundled_dir: str) -> str:
        """The model folder as the containers see it (MINEDRAFT_MODEL)."""
        if self.bundled:
            return f"{bundled_dir.rstrip('/')}/{self.bundled}"
        if self.pvc_claim and self.pvc_path:
            return f"{self.mount_path}/{self.pvc_path}"
        return self.mount_path


@dataclass(frozen=True, slots=True)
class Worker:
    """The target (verifier ranks) or the draft."""

    model: ModelSource
    dtype: str
    tp_size: int
    tuning: dict[str, int | str]  # MINEDRAFT_* name -> value, only those set
    resources: dict[str, Any]

    @classmethod
    def parse(cls, role: str, raw: dict[str, Any], cpu_only: bool) -> Worker:
        tuning = {env: raw[key] for key, env in (("numBlocks", "NUM_BLOCKS"), ("blockSize", "BLOCK_SIZE"),
                                                 ("threads", "THREADS"), ("captureBatch", "CAPTURE_BATCH"),
                                                 ("captureK", "CAPTURE_K"), ("blas", "BLAS")) if key in raw}
        return cls(ModelSource.parse(role, raw["model"]), raw.get("dtype") or ("float32" if cpu_only else "bfloat16"),
                   raw.get("tensorParallelSize", 1), tuning, raw.get("resources", {}))


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    name: str
    namespace: str
    uid: str
    raw: dict[str, Any]  # the defaulted spec, for pass-through fields
    target: Worker
    draft: Worker

    @classmethod
    def from_resource(cls, resource: dict[str, Any]) -> DeploymentSpec:
        spec = apply_defaults(_spec_schema(), resource.get("spec", {}))
        meta = resource["metadata"]
        cpu_only = spec["gpu"]["mode"] == "none"
        return cls(meta["name"], meta.get("namespace", "default"), meta.get("uid", ""), spec,
                   Worker.parse("target", spec["target"], cpu_only), Worker.parse("draft", spec["draft"], cpu_only))

    @property
    def gpu_mode(self) -> str:
        return str(self.raw["gpu"]["mode"])

    @property
    def ports(self) -> dict[str, int]:
        return dict(self.raw["ports"])

    @property
    def service(self) -> dict[str, Any]:
        return dict(self.raw["service"])

    @property
    def images(self) -> dict[str, Any]:
        return dict(self.raw["images"])

    @property
    def ready_without_draft(self) -> bool:
        """routing.readyWithoutDraft, unset = on exactly when an InferencePool routes to the replicas."""
        routing = self.raw["routing"]
        chosen = routing.get("readyWithoutDraft")
        return bool(routing["inferencePool"]["enabled"] if chosen is None else chosen)

    @property
    def draft_kind(self) -> str:
        """draft.kind: a draft model ("model") or an EAGLE head ("eagle") that reads the target's hidden states."""
        return str(self.raw["draft"].get("kind", "model"))

    @property
    def draft_stand_in(self) -> bool:
        """draft.standIn: verifier rank 0 loads the draft model too and drafts while the draft service is lost."""
        return bool(self.raw["draft"].get("standIn", False))
