"""Pinned host buffers for a step's small inputs, reused without allocating and without racing the GPU.

A step's metadata (starts, lengths, block tables) goes to the GPU as an asynchronous copy out of pinned
memory; the copy reads the buffer when the GPU reaches it, which with a step launched ahead can be a
whole step after the host wrote it. So a buffer is reused only once the copy out of it has run: the
ring records an event behind each copy and takes its slots in turn, waiting for a slot's event only
when the host has gone round the whole ring ahead of the GPU (then the GPU is busy anyway). Writing
goes through a numpy view, which costs a fraction of a torch indexing call per field.
"""

from __future__ import annotations

import numpy as np
import torch

RING_SLOTS = 8


class StagingRing:
    """`take(n)` hands out a pinned int64 buffer of at least n values; `sent()` marks the copies out of it
    queued on the current stream. On a device without CUDA the buffers are plain memory and never wait."""

    def __init__(self, device: torch.device, slots: int = RING_SLOTS) -> None:
        self.cuda = device.type == "cuda"
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.events: list[torch.cuda.Event | None] = [None] * slots
        self.slot = -1
        self.waits = 0  # times the host went round the ring ahead of the GPU

    def take(self, numel: int) -> tuple[torch.Tensor, np.ndarray]:
        self.slot = (self.slot + 1) % len(self.buffers)
        event = self.events[self.slot]
        if event is not None and not event.query():
            self.waits += 1
            event.synchronize()
        buf = self.buffers[self.slot]
        if buf is None or buf.numel() < numel:
            size = 1 << max(10, (numel - 1).bit_length())
            buf = torch.empty(size, dtype=torch.long, pin_memory=self.cuda)
            self.buffers[self.slot] = buf
        return buf, buf.numpy()

    def sent(self) -> None:
        if self.cuda:
            event = self.events[self.slot]
            if event is None:
                event = self.events[self.slot] = torch.cuda.Event()
            event.record()  # re-recorded each round: the slot's last copy
