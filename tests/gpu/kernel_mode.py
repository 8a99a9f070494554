"""Where the GPU tests can run here: on CUDA at full size, or on the CPU under Triton's interpreter."""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

CASES_ENV = "MINEDRAFT_KERNEL_CASES"  # random paged-attention cases on top of the fixed corners
FULL_CASES = 150  # on a CUDA device (about 3 s each with compilation)
QUICK_CASES = 5  # under the interpreter (about 1.5 s each on one CPU core)


@dataclass(frozen=True)
class KernelMode:
    device: str | None  # None: the kernels cannot run on this machine
    interpreted: bool
    random_cases: int
    reason: str = ""  # why they cannot run


def interpreter_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def kernel_mode() -> KernelMode:
    """CUDA when there is a device (unless TRITON_INTERPRET=1 asks for the interpreter); else the
    interpreter on the CPU, which needs triton installed."""
    if importlib.util.find_spec("triton") is None:
        return KernelMode(None, False, 0, "triton is not installed; on a CPU, `pip install triton==3.6.0` runs "
                                          "the kernel tests under Triton's interpreter")
    interpreted = interpreter_requested() or not torch.cuda.is_available()
    if interpreted and os.environ.get("TRITON_INTERPRET") == "0":
        return KernelMode(None, True, 0, "no CUDA device, and TRITON_INTERPRET=0 forbids the interpreter")
    count = int(os.environ.get(CASES_ENV, QUICK_CASES if interpreted else FULL_CASES))
    return KernelMode("cpu" if interpreted else "cuda", interpreted, count)
