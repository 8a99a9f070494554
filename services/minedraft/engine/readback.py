"""Reading a step's result back to the host without waiting for work queued after it.

`tensor.tolist()` copies on the current stream, so it also waits for every kernel queued behind the
step (a next step launched ahead). A readback instead queues the copy into pinned memory right
after the step, records an event there, and later waits for that event alone.
"""

from __future__ import annotations

import torch


class Readback:
    """A device tensor's values on the host, copied asynchronously (CUDA) or at once (CPU)."""

    def __init__(self, device_tensor: torch.Tensor) -> None:
        self.event: torch.cuda.Event | None = None
        if device_tensor.is_cuda:
            self.host = torch.empty(device_tensor.shape, dtype=device_tensor.dtype, pin_memory=True)
            self.host.copy_(device_tensor, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = device_tensor

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def tolist(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()
