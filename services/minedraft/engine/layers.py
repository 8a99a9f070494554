"""Building blocks of the Llama family: RMSNorm, rotary embeddings, SwiGLU.

The modules hold the parameters under their checkpoint names; the arithmetic lives in
`engine/fused.py`, which runs it as fused kernels on CUDA.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from minedraft.engine.config import RopeConfig
from minedraft.engine.fused import rms_norm, silu_and_mul


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


class RotaryEmbedding(nn.Module):
    """Applies rotary position embedding (half-split layout) at arbitrary positions."""

    def __init__(self, head_dim: int, rope: RopeConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inverse_frequencies(head_dim, rope), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables for a [B, Q] position tensor, shaped [B, Q, 1, head_dim]."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(-2)
        return emb.cos(), emb.sin()


def cpu_gemm_layout(weight: torch.Tensor) -> torch.Tensor:
    """On CPU, the same [out, in] matrix stored input-major (the transposed view of a contiguous
    [in, out] tensor); other devices keep the checkpoint's layout.

    `F.linear(x, w)` multiplies by `w.t()`: stored this way that is a plain row-major matrix, which
    MKL's GEMMs at decode sizes (1-80 rows) run 10-60% faster than a transposed one (lm_head at
    one row: 2.4x), with the same values and shapes everywhere else.
    """
    if weight.device.type != "cpu":
        return weight
    return weight.detach().t().contiguous().t()


def relayout_linear(linear: nn.Linear) -> None:
    """Give a linear's weight the device's preferred GEMM layout (see `cpu_gemm_layout`)."""
    if linear.weight.device.type == "cpu":
        linear.weight = nn.Parameter(cpu_gemm_layout(linear.weight), requires_grad=False)


def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for linears that share an input, so a step reads it in one matmul.

    Each linear's parameters become views into the fused tensor, so checkpoint names, state
    dicts and parameter counts are unchanged. Fuse after the model is on its device: moving
    it afterwards would copy the views apart. On CPU the fused weight is input-major
    (`cpu_gemm_layout`).
    """
    weight = cpu_gemm_layout(torch.cat([lin.weight.detach() for lin in linears]))
    has_bias = linears[0].bias is not None
    bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None  # type: ignore[union-attr]
    offset = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[offset : offset + rows], requires_grad=False)
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
        self.gate_up_weight: torch.Tensor | None = None  # set by fuse(), before the first forward

    def fuse(self) -> None:
        self.gate_up_weight, _ = fuse_linears([self.gate_proj, self.up_proj])
        relayout_linear(self.down_proj)

    def forward(self, x: torch.Tensor, backend: str = "torch") -> torch.Tensor:
        return self.down_proj(silu_and_mul(F.linear(x, self.gate_up_weight), backend))
