"""Where a worker's model runs, as the batch manager compares it: GPU identity and colocation.

Two processes name their GPUs by process-local indices ("cuda:0" in both may be two GPUs, or one
GPU seen twice), so each worker reports its device with the GPU's UUID. The batch manager refuses
a draft service on the verifier's own GPU (NCCL cannot link two ranks on one device, so the pair
would decode without drafts); the verifier drafts itself instead (`--colocated-draft`).
Pure: no torch at import time (the batch manager's image has none).
"""

from __future__ import annotations

COLOCATED_VERIFIER_ROLE = "verifier+draft"  # WorkerInfo.role of a verifier that drafts on its own GPU


def device_identity(device: object) -> str:
    """"cuda:0 GPU-<uuid>" for a CUDA device (the UUID names the physical GPU), else str(device)."""
    import torch

    dev = torch.device(device)  # type: ignore[arg-type]
    if dev.type != "cuda" or not torch.cuda.is_available():
        return str(dev)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"cuda:{index} GPU-{uuid}" if uuid is not None else f"cuda:{index}"


def physical_gpu(identity: str) -> str | None:
    """The UUID part of a `device_identity` ("GPU-..."), None for a CPU or an unnamed GPU."""
    _, _, uuid = identity.partition(" ")
    return uuid if uuid.startswith("GPU-") else None


def draft_on_verifier_gpu(verifier_device: str, draft_device: str) -> bool:
    """Both workers on one physical GPU (by UUID; devices without one never collide)."""
    gpu = physical_gpu(verifier_device)
    return gpu is not None and gpu == physical_gpu(draft_device)


def same_gpu_message(verifier_device: str, draft_device: str) -> str:
    return (f"the draft service runs on the verifier's GPU ({draft_device} vs {verifier_device}): NCCL cannot link "
            "two ranks on one device, so the pair would decode without drafts. Give the draft service its own GPU, "
            "or run the verifier with --colocated-draft <draft model> (MINEDRAFT_COLOCATED_DRAFT) and no draft "
            "service (standard SD on the verifier's GPU)")
