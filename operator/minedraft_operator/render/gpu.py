"""GPU allocation: which devices each worker container sees, and the environment NCCL needs.

dra: one ResourceClaimTemplate asks for tensorParallelSize + 1 GPUs; every GPU container of the
pod references the claim, so each sees all of the pod's GPUs (device nodes included) and NCCL can
use peer-to-peer over NVLink between containers. Each container is then limited to its own GPU
with CUDA_VISIBLE_DEVICES under CUDA_DEVICE_ORDER=PCI_BUS_ID, so the numbering agrees across
containers: verifier rank r uses claim device r, the draft uses device tensorParallelSize; every
process addresses its GPU as cuda:0. NCCL still reaches peers that are not visible (CUDA >= 10.1).

devicePlugin: each GPU container requests one `nvidia.com/gpu`; the containers' devices are
isolated from each other, so NCCL between them uses SHM (or NET), which the status reports.

none: CPU only; no GPU requests, the data plane runs over gloo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minedraft_operator.render.names import GPU_CLAIM, content_hash, metadata, verifier_container
from minedraft_operator.spec import DeploymentSpec


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """What one worker container gets."""

    container: str
    device: str  # MINEDRAFT_DEVICE
    env: dict[str, str]  # CUDA_* and NCCL_* variables
    limits: dict[str, int]  # extended resources (devicePlugin)
    claims: list[dict[str, str]]  # resources.claims (dra)


def nccl_env(spec: DeploymentSpec) -> dict[str, str]:
    nccl = spec.raw["nccl"]
    env = {"NCCL_NVLS_ENABLE": "1" if nccl["nvlsEnable"] else "0"}
    if "p2pLevel" in nccl:
        env["NCCL_P2P_LEVEL"] = nccl["p2pLevel"]
    if "cumemEnable" in nccl:
        env["NCCL_CUMEM_ENABLE"] = "1" if nccl["cumemEnable"] else "0"
    if "debug" in nccl:
        env["NCCL_DEBUG"] = nccl["debug"]
    return env


def gpu_count(spec: DeploymentSpec) -> int:
    return 0 if spec.gpu_mode == "none" else spec.target.tp_size + 1


def layout(spec: DeploymentSpec) -> list[GpuSlot]:
    """Verifier ranks first, then the draft."""
    names = [verifier_container(r) for r in range(spec.target.tp_size)] + ["draft"]
    mode = spec.gpu_mode
    if mode == "none":
        return [GpuSlot(name, "cpu", {}, {}, []) for name in names]
    common = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **nccl_env(spec)}
    if mode == "devicePlugin":
        resource = spec.raw["gpu"]["resourceName"]
        return [GpuSlot(name, "cuda:0", dict(common), {resource: 1}, []) for name in names]
    return [GpuSlot(name, "cuda:0", {**common, "CUDA_VISIBLE_DEVICES": str(index)}, {}, [{"name": GPU_CLAIM}])
            for index, name in enumerate(names)]


def claim_template_spec(spec: DeploymentSpec) -> dict[str, Any]:
    gpu = spec.raw["gpu"]
    exactly: dict[str, Any] = {"deviceClassName": gpu["deviceClassName"], "allocationMode": "ExactCount",
                               "count": gpu_count(spec)}
    if gpu.get("deviceSelectors"):
        exactly["selectors"] = [{"cel": {"expression": e}} for e in gpu["deviceSelectors"]]
    return {"spec": {"devices": {"requests": [{"name": GPU_CLAIM, "exactly": exactly}]}}}


def claim_template_name(spec: DeploymentSpec) -> str:
    """Template specs are immutable: a changed request gets a new name (the old one is pruned)."""
    return f"{spec.name}-gpus-{content_hash(claim_template_spec(spec))}"


def claim_template(spec: DeploymentSpec) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": metadata(spec, claim_template_name(spec), "gpu-claim"), "spec": claim_template_spec(spec)}


def pod_claims(spec: DeploymentSpec) -> list[dict[str, str]]:
    if spec.gpu_mode != "dra":
        return []
    return [{"name": GPU_CLAIM, "resourceClaimTemplateName": claim_template_name(spec)}]
