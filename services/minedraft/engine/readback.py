"""Reading a step's result back to the host without waiting for work queued after it.

`tensor.tolist()` copies on the current stream, so it also waits for every kernel queued behind the
step (a next step launched ahead). A readback instead queues the copy into pinned memory right
after the step, records an event there, and later waits for that event alone.
"""

from __future__ import annotations

import torch


class Readback:
    """A device tensor's values on the host, copied asynchronously (CUDA) or at once (CPU).

    `started` (a timing event recorded where the step's work began on the stream) lets `device_ms`
    say how long the GPU spent from there to this copy, whatever the host did meanwhile."""

    def __init__(self, device_tensor: torch.Tensor, started: torch.cuda.Event | None = None) -> None:
        self.event: torch.cuda.Event | None = None
        self.started = started
        if device_tensor.is_cuda:
            self.host = torch.empty(device_tensor.shape, dtype=device_tensor.dtype, pin_memory=True)
            self.host.copy_(device_tensor, non_blocking=True)
            self.event = torch.cuda.Event(enable_timing=started is not None)
            self.event.record()
        else:
            self.host = device_tensor

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def tolist(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()

    def device_ms(self) -> float:
        """GPU time from `started` to the copy (0 without a start or on the CPU); call after `tolist`."""
        return elapsed_ms(self.started, self.event)


def device_mark(device: torch.device) -> torch.cuda.Event | None:
    """A timing event recorded now on the current stream (None on the CPU)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def elapsed_ms(start: torch.cuda.Event | None, end: torch.cuda.Event | None) -> float:
    """GPU time between two completed marks (0 where either is missing: the CPU)."""
    return start.elapsed_time(end) if start is not None and end is not None else 0.0
