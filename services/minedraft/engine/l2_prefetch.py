"""Weights sent towards L2 on a side stream while a few-token step runs its latency-bound kernels.

At a handful of tokens a decode step is a chain of GEMMs that stream their weights from memory, with short
kernels between them (norms, the rotation, the attention over a short cache) during which memory sits idle.
Forking a side branch before such a kernel that asks for the next GEMM's first bytes
(`engine/cuda/l2_prefetch.py`) turns that idle time into bytes the GEMM then reads from L2. Only timing
moves: a prefetch reads, never writes, so no result changes. The branches join the main stream when the forward ends
(inside a CUDA graph's capture, as an edge to its last kernel).

Used inside CUDA-graph captures of steps of at most MAX_TOKENS tokens on Hopper, when
`MINEDRAFT_L2_PREFETCH_MB` (the bytes asked for per site) is set; else every call is a no-op.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator

import torch

ENV = "MINEDRAFT_L2_PREFETCH_MB"
MAX_TOKENS = 64  # above this the GEMMs leave no idle memory time worth filling


@functools.cache
def budget_bytes() -> int:
    """Bytes asked for per site (0: off)."""
    try:
        return max(0, int(float(os.environ.get(ENV, "0")) * (1 << 20))) // 16 * 16
    except ValueError:
        return 0


class _Window:
    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream = stream
        self.forked = False


_WINDOW: contextvars.ContextVar[_Window | None] = contextvars.ContextVar("l2_prefetch_window", default=None)
_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The device's prefetch stream where prefetching is on for it: made, and the kernel compiled by a launch
    over a few bytes, on the first call outside a capture (the engine's eager warm-up forwards run before it
    captures); None until then."""
    if budget_bytes() <= 0 or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return None
    stream = _STREAMS.get(device)
    if stream is None and not torch.cuda.is_current_stream_capturing():
        from minedraft.engine.cuda.l2_prefetch import prefetch_l2

        prefetch_l2(torch.zeros(16, dtype=torch.uint8, device=device), 16)
        stream = _STREAMS[device] = torch.cuda.Stream(device)
    return stream


@contextlib.contextmanager
def window(device: torch.device, tokens: int) -> Iterator[None]:
    """Around a forward: `ahead` calls inside it fork prefetches when prefetching is on, the forward is being
    captured into a CUDA graph and has at most MAX_TOKENS tokens; the branches join at the exit."""
    stream = _side_stream(device)
    if stream is None or tokens > MAX_TOKENS or not torch.cuda.is_current_stream_capturing():
        yield
        return
    win = _Window(stream)
    token = _WINDOW.set(win)
    try:
        yield
    finally:
        _WINDOW.reset(token)
        if win.forked:
            torch.cuda.current_stream(device).wait_stream(stream)


def ahead(weight: object) -> None:
    """Send the first budget bytes of `weight` (a tensor, or an FP8 weight's e4m3 tensor) towards L2 on the side
    stream, from this point of the main stream; a no-op outside an active window."""
    win = _WINDOW.get()
    if win is None:
        return
    tensor = getattr(weight, "qweight", weight)
    if not isinstance(tensor, torch.Tensor) or not tensor.is_contiguous():
        return
    nbytes = min(budget_bytes(), tensor.numel() * tensor.element_size() // 16 * 16)
    if nbytes <= 0:
        return
    from minedraft.engine.cuda.l2_prefetch import prefetch_l2

    win.stream.wait_stream(torch.cuda.current_stream(tensor.device))
    with torch.cuda.stream(win.stream):
        prefetch_l2(tensor, nbytes)
    win.forked = True
