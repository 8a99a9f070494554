"""The decoder layer's element-wise steps, fused on CUDA and plain torch elsewhere.

The model calls these three functions; with the "triton" attention backend they run the
kernels in `engine/cuda/fused_kernels.py`, otherwise the torch code below, which is the
reference the kernels are checked against (`tests/gpu/test_fused_kernels.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from minedraft.engine.attention import AttentionMetadata, write_kv


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm computed in float32, rounded back before the weight, as HF does."""
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == dtype:  # nothing to round: torch's fused kernel, same floats
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add a sublayer's output into the residual stream and normalise the sum.

    Returns (normed, new residual); a missing residual means x starts the stream.
    """
    if backend == "triton":
        from minedraft.engine.cuda.fused_kernels import add_rms_norm_triton

        return add_rms_norm_triton(x, residual, weight, eps)
    stream = x if residual is None else residual + x
    return rms_norm(stream, weight, eps), stream


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the half-split layout; cos/sin broadcast over heads."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos.to(x.dtype)) + (rotated * sin.to(x.dtype))


def rope_and_store(
    qkv: torch.Tensor,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    kv: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    qk_norm: tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Split a fused qkv projection, (norm and) rotate q and k, store k and v in the paged
    cache; returns q. Models with q/k norms (Qwen3) take the torch path on every backend."""
    cos, sin = cos_sin
    if meta.backend == "triton" and qk_norm is None:
        from minedraft.engine.cuda.fused_kernels import rope_store_triton

        return rope_store_triton(qkv, cos, sin, meta.slot_mapping, kv[0], kv[1], num_heads, num_kv_heads, head_dim)
    batch, width, _ = qkv.shape
    q_width = num_heads * head_dim
    v = qkv[..., q_width + num_kv_heads * head_dim :].reshape(batch, width, num_kv_heads, head_dim)
    if qk_norm is None:  # q and k side by side in the projection: one rotation for both (fewer small ops)
        qk = rotate(qkv[..., : q_width + num_kv_heads * head_dim].view(batch, width, -1, head_dim), cos, sin)
        q, k = qk[:, :, :num_heads], qk[:, :, num_heads:]
    else:
        q = qk_norm[0](qkv[..., :q_width].reshape(batch, width, num_heads, head_dim))
        k = qk_norm[1](qkv[..., q_width : q_width + num_kv_heads * head_dim].reshape(batch, width, num_kv_heads,
                                                                                   head_dim))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    write_kv(kv[0], kv[1], k, v, meta)
    return q


def silu_and_mul(gate_up: torch.Tensor, backend: str) -> torch.Tensor:
    """SwiGLU's activation on a fused [..., 2 I] gate/up projection."""
    if backend == "triton":
        from minedraft.engine.cuda.fused_kernels import silu_mul_triton

        return silu_mul_triton(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
