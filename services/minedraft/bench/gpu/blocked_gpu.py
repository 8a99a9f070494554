"""GPU time of engine steps with the host out of the way: each step's work waits behind a sleeping kernel,
so by the time the GPU starts it the host has queued all of it, and the events around it time the kernels
back to back (bench/gpu/step_cells.py). A segment is late when the GPU got past its start before the host
reached its end: then it includes host gaps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minedraft.engine.drafter import Drafter


def sleep_cycles(ms: float) -> int:
    """The `torch.cuda._sleep` argument that keeps the current GPU busy for about `ms` milliseconds."""
    probe = 1 << 24
    torch.cuda._sleep(1000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(probe)
    b.record()
    b.synchronize()
    return int(probe * ms / a.elapsed_time(b))


class BlockedGpu:
    """GPU time of steps whose work waits behind a sleeping kernel (segments: step start to a readback's
    wait, a proposal's start to the step's end)."""

    def __init__(self, device: torch.device, sleep_ms: float = 10.0) -> None:
        self.on = device.type == "cuda"
        self.cycles = sleep_cycles(sleep_ms) if self.on else 0
        self.start: torch.cuda.Event | None = None
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.late = 0

    def open(self) -> None:
        if self.on and self.start is None:
            torch.cuda._sleep(self.cycles)
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()

    def close(self) -> None:
        if self.start is None:
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.late += int(self.start.query())  # the GPU got here before the host did
        self.pairs.append((self.start, end))
        self.start = None

    def take_ms(self) -> float:
        self.close()
        if self.on:
            torch.cuda.synchronize()
        total = sum(a.elapsed_time(b) for a, b in self.pairs)
        self.pairs.clear()
        return total

    def extra(self) -> list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
        def closing(fn: Callable[..., Any]) -> Callable[..., Any]:
            def wait(*args: Any) -> Any:
                self.close()
                return fn(*args)
            return wait

        def opening(fn: Callable[..., Any]) -> Callable[..., Any]:
            def propose(*args: Any, **kwargs: Any) -> Any:
                self.open()
                return fn(*args, **kwargs)
            return propose

        return [(torch.cuda.Event, "synchronize", closing), (Drafter, "propose", opening)]
