"""Host-to-device copies that do not stall the GPU stream."""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Copy a CPU tensor to `device` without a stream sync.

    A copy from pageable memory makes CUDA wait for all queued work first, which serialises
    the host's step preparation with the GPU; staging through pinned memory lets it overlap.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
