"""Which BLAS library runs each half-precision projection of a CUDA graph, chosen by timing both on this GPU.

torch sends `F.linear` to cuBLAS unless `torch.backends.cuda.preferred_blas_library("cublaslt")` says
otherwise, and the two libraries' heuristics pick different kernels at some row counts: on one H200 the 8B
shape's `down` runs at 64 rows as one cuBLASLt kernel where cuBLAS launches a split-K pair (the AR step at
batch 64 4-5% faster), while at 16 rows cuBLASLt is 1-2% slower (docs/benchmarks/gpu.md). The setting is read
when a GEMM is dispatched, and a CUDA graph records what was dispatched while it was captured, so a graph
keeps the library chosen for each of its GEMMs whatever the setting is when it replays.

`--blas auto` (the default) decides per (rows, out features, in features, dtype) inside graph captures only:
the capture's first warm-up run meets each GEMM under cuBLAS and notes its shape and weights; `settle` then
times both libraries over every weight of that shape it saw (a model's layers stream from HBM in turn, as in
a real step, rather than one weight sitting in L2) and keeps cuBLASLt only where it is faster by `MARGIN`;
the second warm-up and the capture run with the choices. Eager steps keep torch's default. `cublas` and
`cublaslt` set the library for the whole process instead. Choices near a tie may differ between two
processes (their timings differ), which changes rounding, never which tokens a step's rule accepts.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

LIBRARIES = ("cublas", "cublaslt")
MODES = ("auto", *LIBRARIES)
DEFAULT = "cublas"  # torch's own choice on NVIDIA GPUs
MARGIN = 0.01  # cuBLASLt must beat cuBLAS by this fraction: noise must not flip a tie
REPEATS = 5  # timed passes per library; the fastest counts
HALF_TYPES = (torch.bfloat16, torch.float16)

Key = tuple[int, int, int, torch.dtype]  # (rows, out features, in features, dtype)
Shape = tuple[int, int, torch.dtype]
TimeFn = Callable[[str, int, Sequence[torch.Tensor]], float]  # (library, rows, weights) -> ms per GEMM
SetFn = Callable[[str], object]


def gemm_ms(library: str, rows: int, weights: Sequence[torch.Tensor]) -> float:
    """Milliseconds per `F.linear` of `rows` rows under `library`, over these weights in turn (CUDA events,
    the fastest of REPEATS passes after one untimed pass)."""
    torch.backends.cuda.preferred_blas_library(library)
    first = weights[0]
    x = torch.randn(rows, first.shape[1], device=first.device, dtype=first.dtype)
    for weight in weights:
        F.linear(x, weight)
    best = math.inf
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for weight in weights:
            F.linear(x, weight)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / len(weights))
    return best


def set_library(library: str) -> None:
    torch.backends.cuda.preferred_blas_library(library)


@dataclass
class BlasPlan:
    """The per-shape choices of one process, and the GEMMs met since the last `settle`."""

    mode: str = "auto"
    time_fn: TimeFn = gemm_ms
    set_fn: SetFn = set_library
    device_types: tuple[str, ...] = ("cuda",)
    chosen: dict[Key, str] = field(default_factory=dict)
    timings: dict[Key, dict[str, float]] = field(default_factory=dict)  # ms per GEMM, per library
    pending: set[Key] = field(default_factory=set)
    weights: dict[Shape, dict[int, torch.Tensor]] = field(default_factory=dict)  # by data pointer
    current: str = DEFAULT  # what the plan last set
    active: bool = False  # inside `choosing`

    def configure(self, mode: str) -> None:
        """The process-wide part of a mode: `cublas` and `cublaslt` set torch's library for every GEMM."""
        if mode not in MODES:
            raise ValueError(f"--blas must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self._set(DEFAULT if mode == "auto" else mode)

    @contextlib.contextmanager
    def choosing(self) -> Iterator[None]:
        """The GEMMs run inside use the chosen library per shape (mode auto only); torch's default after."""
        if self.mode != "auto" or self.active:
            yield
            return
        self.active = True
        try:
            yield
        finally:
            self.active = False
            self._set(DEFAULT)

    def apply(self, x: torch.Tensor, weight: torch.Tensor) -> None:
        """Before a GEMM inside `choosing`: set its shape's library, or note the shape for `settle`."""
        if not self.active or weight.device.type not in self.device_types or weight.dtype not in HALF_TYPES:
            return
        out_features, in_features = weight.shape
        key = (x.numel() // in_features, out_features, in_features, weight.dtype)
        library = self.chosen.get(key)
        if library is None:
            self.pending.add(key)
            self.weights.setdefault(key[1:], {}).setdefault(weight.data_ptr(), weight)
            library = DEFAULT
        self._set(library)

    def settle(self) -> None:
        """Time both libraries for every shape met since the last call and keep the faster (outside a capture)."""
        for key in sorted(self.pending, key=lambda k: (k[0], k[1], k[2])):
            rows, out_features, in_features, _ = key
            weights = list(self.weights[key[1:]].values())
            ms = {library: self.time_fn(library, rows, weights) for library in LIBRARIES}
            library = "cublaslt" if ms["cublaslt"] < ms["cublas"] * (1.0 - MARGIN) else "cublas"
            self.timings[key], self.chosen[key] = ms, library
            log.debug("%d rows x %d -> %d over %d weights: cublas %.1f us, cublaslt %.1f us: %s", rows,
                      in_features, out_features, len(weights), ms["cublas"] * 1e3, ms["cublaslt"] * 1e3, library)
        if self.pending:
            self.pending.clear()
            self.current = ""  # timing set the library itself
            self._set(DEFAULT)

    def table(self) -> list[dict[str, object]]:
        """The choices so far, for a benchmark's report: rows, shape, both timings (us), the library kept."""
        return [{"rows": k[0], "out": k[1], "in": k[2], "cublas_us": round(t["cublas"] * 1e3, 2),
                 "cublaslt_us": round(t["cublaslt"] * 1e3, 2), "library": self.chosen[k]}
                for k, t in sorted(self.timings.items(), key=lambda kv: kv[0][:3])]

    def _set(self, library: str) -> None:
        if library != self.current:
            self.set_fn(library)
            self.current = library


PLAN = BlasPlan()  # the process's plan: workers configure it from --blas (worker/process.py)


def plan() -> BlasPlan:
    return PLAN
