"""Device-level measurements: CUDA-event timing, the copy and matmul ceilings, kernel profiles."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def time_cuda(fn: Callable[[], object], repeats: int = 10) -> float:
    """Median seconds of fn() measured with CUDA events."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1000.0)
    return statistics.median(samples)


def ceilings() -> dict[str, float]:
    """Device-to-device copy bandwidth (read + write) and the bf16 matmul rate of GPU 0."""
    n = 1 << 31  # 2 Gi bf16 elements = 4 GiB
    x = torch.randn(n, device="cuda:0", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    copy_s = time_cuda(lambda: y.copy_(x))
    a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    mm_s = time_cuda(lambda: a @ b)
    return {"copy_GBps": 2 * n * 2 / copy_s / 1e9, "bf16_TFLOPs": 2 * 8192**3 / mm_s / 1e12}


def profile_steps(step: Callable[[], object], count: int = 10) -> str:
    """Where a decode step's time goes: top CUDA kernels and host ops over `count` steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(count):
            step()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
