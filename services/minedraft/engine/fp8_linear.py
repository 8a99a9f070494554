"""The FP8 linear's arithmetic: activations quantized per token (per 128-wide group for block
weights) on the fly, then the product with the e4m3 weight.

On CUDA with Triton the GEMM kernel (`engine/cuda/fp8_gemm.py`) does both. Elsewhere the
reference path runs: the same activation quantization in torch, times the weight dequantized
once at load (`layers.gemm_weight`), in float32. Both quantize a row from that row alone, so a
request's logits never depend on the rest of the batch.
"""

from __future__ import annotations

import functools
import os

import torch
from torch.nn import functional as F

from minedraft.engine.fp8_config import BLOCK
from minedraft.engine.fp8_weights import ACT_EPS, E4M3, E4M3_MAX, Fp8Weight


def quantize_activations(x: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values [..., K], float32 scales [..., groups]): one scale per token, or per token and
    128-wide group along K for block weights."""
    k = x.shape[-1]
    width = BLOCK if scheme == "block" else k
    groups = -(-k // width)
    xf = F.pad(x.float(), (0, groups * width - k)).unflatten(-1, (groups, width))
    scale = xf.abs().amax(-1, keepdim=True).clamp(min=ACT_EPS) / E4M3_MAX
    q = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.flatten(-2)[..., :k], scale.squeeze(-1)


def fake_quantize_activations(x: torch.Tensor, scheme: str) -> torch.Tensor:
    """The float32 values the quantized activations stand for (the reference path's input)."""
    q, scale = quantize_activations(x, scheme)
    k = x.shape[-1]
    width = BLOCK if scheme == "block" else k
    return (q.float() * scale.repeat_interleave(width, -1)[..., :k])


def kernel_supported(weight: Fp8Weight) -> bool:
    """Whether the Triton kernel runs this weight here (a CUDA device of compute capability 8.9+)."""
    if weight.qweight.device.type != "cuda" or weight.in_features % 16:
        return False
    from minedraft.engine.cuda import HAS_TRITON

    return HAS_TRITON and torch.cuda.get_device_capability(weight.qweight.device) >= (8, 9)


def fp8_linear(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W^T (+ bias) in x's dtype; `weight.dense` set means the reference path."""
    if weight.dense is None:
        from minedraft.engine.cuda.fp8_gemm import fp8_gemm

        return fp8_gemm(x, weight, bias)
    xq = fake_quantize_activations(x, weight.scheme)
    b = None if bias is None else bias.float()
    if weight.dense.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(xq, weight.dense, b, "none", [], "").to(x.dtype)
    return F.linear(xq, weight.dense, b).to(x.dtype)


EPILOGUES_ENV = "MINEDRAFT_FP8_EPILOGUES"  # "0": the GEMM and the next kernel apart (the same bits; for timing)


@functools.cache
def epilogues_on() -> bool:
    return os.environ.get(EPILOGUES_ENV, "1") != "0"


def _paired_kernel_runs(weight: object) -> bool:
    """Whether `weight` is an FP8 weight the kernel runs (not the reference path) with the epilogues on."""
    return isinstance(weight, Fp8Weight) and weight.dense is None and epilogues_on()


def fp8_glu(x: torch.Tensor, weight: object) -> torch.Tensor | None:
    """silu(gate) * up of a fused FP8 gate/up weight in one kernel (`engine/cuda/fp8_paired.py`: the bits of the
    GEMM followed by the Triton silu*up kernel), where the FP8 kernel runs this weight at this batch; else None."""
    if not _paired_kernel_runs(weight):
        return None
    from minedraft.engine.cuda.fp8_paired import fp8_paired

    return fp8_paired(x, weight, None, None)


def fp8_qkv_rope(x: torch.Tensor, weight: object, bias: torch.Tensor | None, cos_sin: tuple[torch.Tensor, torch.Tensor],
                 slots: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], heads: int, kv_heads: int,
                 head_dim: int) -> torch.Tensor | None:
    """q [..., H, D] of a fused FP8 q/k/v weight, rotated, with k and v written to the cache, in one kernel (the
    bits of the GEMM followed by the Triton rope+store kernel), where the FP8 kernel runs it; else None."""
    if not _paired_kernel_runs(weight):
        return None
    from minedraft.engine.cuda.fp8_paired import Rope, fp8_paired

    return fp8_paired(x, weight, bias, Rope(cos_sin[0], cos_sin[1], slots, kv[0], kv[1], heads, kv_heads, head_dim))
