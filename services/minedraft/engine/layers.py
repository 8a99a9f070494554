"""Building blocks of the Llama family: RMSNorm, rotary embeddings, SwiGLU.

The modules hold the parameters under their checkpoint names; the arithmetic lives in
`engine/fused.py`, which runs it as fused kernels on CUDA.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from minedraft.engine.blas_plan import PLAN, TRITON, triton_linear
from minedraft.engine.config import RopeConfig
from minedraft.engine.fp8_linear import fp8_glu, fp8_linear, kernel_supported
from minedraft.engine.fp8_weights import Fp8Weight, fuse_fp8, is_fp8, linear_weight
from minedraft.engine.fused import rms_norm, silu_and_mul

Weight = torch.Tensor | Fp8Weight  # what `linear` multiplies by


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as the reference implementations do."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """Per-pair rotation frequencies, with Llama 3's long-context rescaling when configured."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type != "llama3":
        return inv_freq
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


ROPE_TABLE_CHUNK = 4096  # CPU cos/sin table rows are added this many positions at a time


class RotaryEmbedding(nn.Module):
    """Applies rotary position embedding (half-split layout) at arbitrary positions."""

    def __init__(self, head_dim: int, rope: RopeConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inverse_frequencies(head_dim, rope), persistent=False)
        self._table: torch.Tensor | None = None  # CPU: [positions, 2, head_dim] cos and sin
        self._table_freq: torch.Tensor | None = None  # the inv_freq the table was built from

    @staticmethod
    def _angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        freqs = positions.float().unsqueeze(-1) * inv_freq
        return torch.cat((freqs, freqs), dim=-1)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables for a [B, Q] position tensor, shaped [B, Q, 1, head_dim].

        On CPU they are rows of a table computed once (one lookup per forward instead of five
        small ops); the values are the same floats the direct computation gives.
        """
        if positions.device.type != "cpu":
            emb = self._angles(positions, self.inv_freq).unsqueeze(-2)
            return emb.cos(), emb.sin()
        needed = int(positions.max()) + 1 if positions.numel() else 1
        table = self._table
        if table is None or table.shape[0] < needed or self._table_freq is not self.inv_freq:
            rows = -(-needed // ROPE_TABLE_CHUNK) * ROPE_TABLE_CHUNK
            emb = self._angles(torch.arange(rows, device=positions.device), self.inv_freq)
            table = self._table = torch.stack((emb.cos(), emb.sin()), dim=1)
            self._table_freq = self.inv_freq
        both = table[positions]  # [B, Q, 2, head_dim]
        return both[:, :, 0:1], both[:, :, 1:2]


def gemm_weight(weight: Weight) -> Weight:
    """A linear's [out, in] weight in the form `linear` multiplies fastest.

    On CPU (float32): a copy prepacked by oneDNN into the blocked layout its GEMM kernels read, as
    vLLM's CPU backend does. Measured on the tiny pair against `F.linear` (MKL, which also runs
    small GEMMs on one thread whatever torch's setting): 1 thread 1.3x at 16 rows and 1.2x at 80,
    2 threads 1.5x at 16 rows; equal at one row. The checkpoint-named parameters keep the dense
    weights (the copy costs their memory once more). Elsewhere: the weight itself.
    Pack once the weights are final and on their device. An FP8 weight stays FP8 where the GEMM
    kernel runs it; elsewhere it gains its dequantized float32 copy, prepacked likewise.
    """
    if isinstance(weight, Fp8Weight):
        if not kernel_supported(weight):
            weight.dense = gemm_weight(weight.dequantize())
        return weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`, or oneDNN's GEMM for a weight prepacked by `gemm_weight` (same product, rounded
    in its own order: relative differences around 1e-7), or the FP8 product (`engine/fp8_linear.py`)."""
    if isinstance(weight, Fp8Weight):
        return fp8_linear(x, weight, bias)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    blas = PLAN
    if blas.active:  # inside a CUDA graph's warm-up or capture (engine/blas_plan.py)
        choice = blas.apply(x, weight)
        if choice is not None:
            return triton_linear(choice, x, weight, bias)
    return F.linear(x, weight, bias)


def fuse_linears(linears: list[nn.Linear]) -> tuple[Weight, torch.Tensor | None]:
    """One weight (and bias) for linears that share an input, so a step reads it in one matmul.

    Each linear's parameters become views into the fused tensor, so checkpoint names, state
    dicts and parameter counts are unchanged. Fuse after the model is on its device: moving
    it afterwards would copy the views apart. Returns the fused weight (dense, or FP8 with its
    scales when the linears are quantized: `fp8_weights.fuse_fp8`) and bias.
    """
    quantized = any(is_fp8(lin) for lin in linears)
    weight: Weight = fuse_fp8(linears) if quantized else torch.cat([lin.weight.detach() for lin in linears])
    has_bias = linears[0].bias is not None
    bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None  # type: ignore[union-attr]
    offset = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        if not quantized:  # fuse_fp8 made the FP8 views itself
            lin.weight = nn.Parameter(weight[offset : offset + rows], requires_grad=False)  # type: ignore[index]
        if bias is not None:
            lin.bias = nn.Parameter(bias[offset : offset + rows], requires_grad=False)
        offset += rows
    return weight, bias


class SwiGLU(nn.Module):
    """Gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up_weight: Weight | None = None  # set by fuse(), before the first forward (`gemm_weight`)
        self.down_weight: Weight | None = None

    def fuse(self) -> None:
        self.gate_up_weight = gemm_weight(fuse_linears([self.gate_proj, self.up_proj])[0])
        self.down_weight = gemm_weight(linear_weight(self.down_proj))

    def forward(self, x: torch.Tensor, backend: str = "torch") -> torch.Tensor:
        """Inside a CUDA graph's capture (`--blas auto`) the plan may run gate/up and the activation as one
        gated Triton GEMM (`engine/blas_plan.py`), and an FP8 gate/up at a few tokens does the same
        (`engine/cuda/fp8_paired.py`); the same bits as the two kernels they replace."""
        assert self.gate_up_weight is not None and self.down_weight is not None, "fuse() first"
        choice = PLAN.apply_glu(x, self.gate_up_weight) if backend == "triton" and PLAN.active else None
        if choice is None:
            act = fp8_glu(x, self.gate_up_weight) if backend == "triton" else None  # FP8: one kernel, the same bits
            if act is None:
                act = silu_and_mul(linear(x, self.gate_up_weight), backend)
        elif choice.startswith(TRITON):
            act = triton_linear(choice, x, self.gate_up_weight, None, glu=True)
        else:  # the plan set this library for the GEMM
            act = silu_and_mul(F.linear(x, self.gate_up_weight), backend)  # type: ignore[arg-type]
        return linear(act, self.down_weight)
