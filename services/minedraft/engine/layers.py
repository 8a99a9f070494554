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


def cpu_gemm_layout(weight: torch.Tensor) -> torch.Tensor:
    """The memory layout `linear` multiplies fastest, for a weight of shape [out, in].

    A float32 CPU weight under one torch thread is stored input-major (the transposed view of a
    contiguous [in, out] tensor): `F.linear` then hands MKL a plain row-major right operand, which
    its small GEMMs (1-32 rows, decode) run 10-30% faster, lm_head at one row 1.5x. With more
    threads `linear` uses oneDNN, which wants the checkpoint's row-major layout, so it is kept;
    so it is on other devices and for other dtypes. Values and shapes never change.
    """
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or torch.get_num_threads() > 1:
        return weight
    return weight.detach().t().contiguous().t()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`, with float32 CPU GEMMs under several threads in oneDNN.

    MKL runs small float32 GEMMs on one thread whatever torch's setting (two threads: 1.0x at
    16 rows, 1.1x at 80), while oneDNN's matmul splits them (1.5x at 16 rows, 1.6x at 80 on the
    tiny pair); it computes the same product, rounded in its own order (relative 1e-7).
    """
    if (x.is_cpu and x.dtype == torch.float32 and weight.is_contiguous() and torch.get_num_threads() > 1
            and torch.backends.mkldnn.is_available()):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def relayout_linear(linear_module: nn.Linear) -> None:
    """Give a linear's weight the device's preferred GEMM layout (see `cpu_gemm_layout`)."""
    if linear_module.weight.device.type == "cpu":
        linear_module.weight = nn.Parameter(cpu_gemm_layout(linear_module.weight), requires_grad=False)


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
        return linear(silu_and_mul(linear(x, self.gate_up_weight), backend), self.down_proj.weight)
