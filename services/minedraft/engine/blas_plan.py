"""Which BLAS library runs each half-precision projection of a CUDA graph, chosen by timing both on this GPU.

torch sends `F.linear` to cuBLAS unless `torch.backends.cuda.preferred_blas_library("cublaslt")` says
otherwise, and the two libraries' heuristics pick different kernels at some row counts: on one H200 the 8B
shape's `down` runs at 64 rows as one cuBLASLt kernel where cuBLAS launches a split-K pair (the AR step at
batch 64 4-5% faster), while at 16 rows cuBLASLt is 1-2% slower (docs/benchmarks/gpu.md). The setting is read
when a GEMM is dispatched, and a CUDA graph records what was dispatched while it was captured, so a graph
keeps the library chosen for each of its GEMMs whatever the setting is when it replays.

`--blas auto` (the default) decides per (rows, out features, in features, dtype) inside graph captures only:
the capture's first warm-up run meets each GEMM under cuBLAS and notes its shape and weights; `settle` then
times each candidate over every weight of that shape it saw, in a CUDA graph as a step runs them (a model's
layers stream from HBM in turn rather than one weight sitting in L2, and the host's launch cost stays out),
and keeps the fastest where it beats cuBLAS by `MARGIN`; the second warm-up and the capture run with the
choices. Eager steps keep torch's default. `cublas` and `cublaslt` set the library for the whole process
instead. Choices near a tie may differ between two processes (their timings differ), which changes
rounding, never which tokens a step's rule accepts.

In mode auto a shape of at most 128 rows (`skinny_configs.MAX_ROWS`) also has the few-row Triton GEMM's
shortlisted configs as candidates (`engine/cuda/skinny_gemm.py`: one kernel where cuBLAS splits K into two,
narrower tiles that fill the GPU at one row, one row tile that reads the weight once up to 128 rows); a choice
`triton:<config>` makes the engine's `linear` run that kernel instead of `F.linear`. Any candidate must beat
cuBLAS by `MARGIN` to be kept.

SwiGLU's gate/up projection is planned as its own operation (`apply_glu`, op "glu"): the candidates are each
library's GEMM followed by the silu*up kernel, and the gated Triton GEMM that applies the activation in its
epilogue (one kernel instead of two, no [rows, 2 I] round trip); the timed graphs hold both kernels where a
library is timed, so the choice weighs the kernel the fused form saves. The q/k/v projection is planned
likewise with the rotary embedding and the KV write behind it (`apply_rope`, op `rope<H>x<Hkv>x<D>`: a
library's GEMM and the rope+store kernel against `engine/cuda/skinny_rope.py`'s one kernel), for models
without q/k norms. The ops and what their timed candidates run: `engine/blas_ops.py`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from minedraft.engine.blas_ops import (
    GLU_OP,
    LINEAR,
    TRITON,
    prefix,
    rope_geometry,
    rope_op,
    skinny_config,
    split_choice,
    timed_gemm,
)

log = logging.getLogger(__name__)

LIBRARIES = ("cublas", "cublaslt")
MODES = ("auto", *LIBRARIES)
DEFAULT = "cublas"  # torch's own choice on NVIDIA GPUs
MARGIN = 0.01  # cuBLASLt must beat cuBLAS by this fraction: noise must not flip a tie
REPEATS = 5  # timed passes per library; the fastest counts
HALF_TYPES = (torch.bfloat16, torch.float16)

Key = tuple[int, int, int, torch.dtype, str]  # (rows, out features, in features, dtype, op)
Shape = tuple[int, int, torch.dtype]
TimeFn = Callable[[str, int, Sequence[torch.Tensor]], float]  # (choice, rows, weights) -> ms per GEMM
SetFn = Callable[[str], object]
ExtraFn = Callable[[str, int, torch.dtype], Sequence[str]]  # (op, rows, dtype) -> choices besides the libraries


def triton_choices(op: str, rows: int, dtype: torch.dtype) -> list[str]:
    """The shortlisted configs of the few-row Triton GEMM's form for `op` at `rows` rows (none without Triton or
    past `skinny_configs.MAX_ROWS`): the plain or the gated shortlist, or for q/k/v + rope the gated tiles that
    divide half a head."""
    try:
        from minedraft.engine.cuda.skinny_configs import shortlist_for
        from minedraft.engine.cuda.skinny_rope import rope_shortlist  # needs Triton
    except ImportError:
        return []
    geometry = rope_geometry(op)
    configs = (rope_shortlist(rows, geometry[2], dtype.itemsize) if geometry is not None
               else shortlist_for(rows, dtype.itemsize, glu=op == GLU_OP))
    return [TRITON + config.name for config in configs]


def triton_linear(choice: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  glu: bool = False) -> torch.Tensor:
    """`F.linear(x, weight, bias)` through the Triton config of a `triton:<name>` choice; with `glu`, silu(gate) *
    up of a fused gate/up weight in one kernel."""
    from minedraft.engine.cuda.skinny_gemm import skinny_linear

    config = skinny_config(choice)
    if config is None:
        raise ValueError(f"{choice!r} is not a Triton choice")
    return skinny_linear(x, weight, bias, config, glu)


def qkv_rope_triton(choice: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    cos_sin: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor,
                    kv: tuple[torch.Tensor, torch.Tensor], heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """q of the fused q/k/v projection, rotated, with k and v written to the cache, in the one kernel of a
    `triton:<name>` choice of the rope op."""
    from minedraft.engine.cuda.skinny_rope import skinny_qkv_rope

    config = skinny_config(choice)
    if config is None:
        raise ValueError(f"{choice!r} is not a Triton choice")
    return skinny_qkv_rope(x, weight, bias, config, cos_sin, slot_mapping, kv, heads, kv_heads, head_dim)


def gemm_ms(choice: str, rows: int, weights: Sequence[torch.Tensor]) -> float:
    """Milliseconds per GEMM of `rows` rows under `choice` (a library, or a Triton config), over these weights
    in turn: a CUDA graph of one GEMM per weight, as a step's graph runs them (timed eagerly, the host's
    launch cost would hide a short kernel's speed), the fastest of REPEATS replays after an untimed one. An
    eager pass before the capture compiles and sets up the library's handles. `<op>:<candidate>` times that
    op's work (`engine/blas_ops.py`): the gated gate/up, or q/k/v with rotary embedding and the KV write."""
    op, candidate = split_choice(choice)
    gemm = timed_gemm(op, candidate, rows, weights[0])
    first = weights[0]
    x = torch.randn(rows, first.shape[1], device=first.device, dtype=first.dtype)
    gemm(x, first)
    torch.cuda.synchronize(first.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for weight in weights:
            gemm(x, weight)
    graph.replay()
    best = math.inf
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / len(weights))
    # Freed now, not when the garbage collector meets it: destroying a graph while another stream captures
    # (the step graph this timing is for, moments later) invalidates that capture.
    graph.reset()
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
    extra_fn: ExtraFn = triton_choices
    chosen: dict[Key, str] = field(default_factory=dict)
    timings: dict[Key, dict[str, float]] = field(default_factory=dict)  # ms per GEMM, per choice
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

    def apply(self, x: torch.Tensor, weight: torch.Tensor) -> str | None:
        """Before a GEMM inside `choosing`: set its shape's library, or note the shape for `settle`. Returns
        the `triton:<config>` choice when the shape runs the Triton GEMM instead (the caller runs it)."""
        choice = self._choice(x, weight, LINEAR)
        return choice if choice is not None and choice.startswith(TRITON) else None

    def apply_glu(self, x: torch.Tensor, weight: torch.Tensor) -> str | None:
        """As `apply`, for SwiGLU's gate/up GEMM and its activation: the choice (a library, now set, or a
        `triton:<config>` the caller runs gated); None where the plan is not in effect (eager work, another
        device or dtype), where the caller runs its usual path."""
        return self._choice(x, weight, GLU_OP)

    def apply_rope(self, x: torch.Tensor, weight: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> str | None:
        """As `apply_glu`, for the fused q/k/v projection followed by rotary embedding and the KV write (a
        `triton:<config>` choice runs them as one kernel, `engine/cuda/skinny_rope.py`)."""
        return self._choice(x, weight, rope_op(heads, kv_heads, head_dim))

    def _choice(self, x: torch.Tensor, weight: torch.Tensor, op: str) -> str | None:
        if not self.active or not isinstance(weight, torch.Tensor) or weight.device.type not in self.device_types \
                or weight.dtype not in HALF_TYPES:
            return None
        out_features, in_features = weight.shape
        key = (x.numel() // in_features, out_features, in_features, weight.dtype, op)
        choice = self.chosen.get(key)
        if choice is None:
            self.pending.add(key)
            if weight.stride(1) == 1:  # the Triton candidates read rows of the weight as they lie
                self.weights.setdefault(key[1:4], {}).setdefault(weight.data_ptr(), weight)
            choice = DEFAULT
        if choice.startswith(TRITON):
            if weight.stride(1) == 1:
                return choice
            choice = DEFAULT
        self._set(choice)
        return choice

    def settle(self) -> None:
        """Time both libraries for every shape met since the last call and keep the faster (outside a capture)."""
        for key in sorted(self.pending, key=lambda k: (k[0], k[1], k[2], k[4])):
            rows, out_features, in_features, dtype, op = key
            weights = list(self.weights.get(key[1:4], {}).values())
            if not weights:  # only strided weights of this shape: cuBLAS runs them
                self.timings[key], self.chosen[key] = {}, DEFAULT
                continue
            ms = {choice: self.time_fn(prefix(op) + choice, rows, weights)
                  for choice in (*LIBRARIES, *self.extra_fn(op, rows, dtype))}
            best = min(ms, key=ms.__getitem__)
            choice = best if ms[best] < ms[DEFAULT] * (1.0 - MARGIN) else DEFAULT
            self.timings[key], self.chosen[key] = ms, choice
            log.debug("%s %d rows x %d -> %d over %d weights: %s: %s", op, rows, in_features, out_features,
                      len(weights), ", ".join(f"{c} {t * 1e3:.1f} us" for c, t in ms.items()), choice)
        if self.pending:
            self.pending.clear()
            self.current = ""  # timing set the library itself
            self._set(DEFAULT)

    def table(self) -> list[dict[str, object]]:
        """The choices so far, for a benchmark's report: rows, shape, op, both libraries' timings and the best
        Triton config's (us, None where none ran; a gated op's include its activation), the choice kept."""
        rows = []
        for k, t in sorted(self.timings.items(), key=lambda kv: (*kv[0][:3], kv[0][4])):
            tritons = {c: ms for c, ms in t.items() if c.startswith(TRITON)}
            best = min(tritons, key=tritons.__getitem__) if tritons else None
            rows.append({"rows": k[0], "out": k[1], "in": k[2], "op": k[4],
                         **{f"{lib}_us": round(t[lib] * 1e3, 2) if lib in t else None for lib in LIBRARIES},
                         "triton_us": round(tritons[best] * 1e3, 2) if best else None,
                         "triton": best[len(TRITON):] if best else None, "library": self.chosen[k]})
        return rows

    def _set(self, library: str) -> None:
        if library != self.current:
            self.set_fn(library)
            self.current = library


PLAN = BlasPlan()  # the process's plan: workers configure it from --blas (worker/process.py)


def plan() -> BlasPlan:
    return PLAN
