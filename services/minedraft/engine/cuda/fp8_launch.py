"""What an FP8 GEMM launch (`fp8_gemm.py`) needs to know about its device, and the one piece of device
state it keeps: the per-tile arrival counts behind the fused chunk sums."""

from __future__ import annotations

import functools

import torch


@functools.cache
def multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the interpreter: an H100/H200's count, so CPU runs take the same paths
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def has_tma(device: torch.device) -> bool:
    """Hopper and later (the interpreter emulates the descriptor loads)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


@functools.cache
def has_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: compiled kernels on Hopper and later (the interpreter has no such launch)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def tma_fits(weight: torch.Tensor) -> bool:
    """A tensor descriptor needs a 16-byte aligned base and row stride."""
    return weight.is_contiguous() and weight.data_ptr() % 16 == 0 and weight.shape[1] % 16 == 0


class ArrivalCounts:
    """Per device, one int32 count per output tile for the fused chunk sums: zeroed once, outside any
    CUDA graph capture, and left at zero by every launch (its last program resets its tile's count).
    The FP8 GEMMs and the K-split few-row GEMMs (`skinny_split.py`) of one device run one at a time (one
    stream), so one buffer serves them all."""

    SLOTS = 1 << 16

    def __init__(self) -> None:
        self.by_device: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device, tiles: int) -> torch.Tensor | None:
        """The buffer, or None where it cannot be made now (inside a capture), so the caller falls back."""
        counts = self.by_device.get(device)
        if counts is not None and counts.numel() >= tiles:
            return counts
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counts = torch.zeros(max(tiles, self.SLOTS), dtype=torch.int32, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # zeroed before any stream uses it
        self.by_device[device] = counts
        return counts


ARRIVAL_COUNTS = ArrivalCounts()
