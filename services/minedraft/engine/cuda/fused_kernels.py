"""Triton kernels that fuse the small element-wise steps of a decoder layer.

At batch 1 an 8B decode step is ~16 GB of weight reads spread over 32 layers; every extra
kernel between the matmuls costs a few microseconds of launch and tail latency even inside
a CUDA graph, and unfused RMSNorm / RoPE / SwiGLU are ~30 of them per layer. These three
kernels leave a layer at: add+norm, qkv matmul, rope+KV write, attention, o_proj,
add+norm, gate_up matmul, silu*up, down_proj.

Each kernel rounds to the activation dtype where the plain-torch reference
(`minedraft.engine.fused`) does, so bf16 results match it up to the order of the
RMSNorm's float32 sum. No host synchronisation; outputs come from `torch.empty`, so the
kernels are safe inside CUDA graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minedraft.engine.cuda.paged_attention import _INTERPRET  # noqa: F401  (applies the interpreter shim)
from minedraft.engine.cuda.pdl import chain_launch, chain_wait


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    chain_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RES:
        r = tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=mask)
    h = x.to(tl.float32)
    inv = tl.math.rsqrt(tl.sum(h * h, 0) / n_cols + eps)
    y = (h * inv).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * weight, x + residual); with no residual, x is the residual."""
    cols = x.shape[-1]
    x2 = x.reshape(-1, cols).contiguous()
    rows = x2.shape[0]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if residual is None:
        res_out, res_in = x, x2
    else:
        res_in = residual.reshape(-1, cols).contiguous()
        res_out = torch.empty_like(x)
    if rows:
        block = triton.next_power_of_2(cols)
        _add_rms_norm_kernel[(rows,)](
            x2, res_in, weight, out, res_out, cols, eps,
            HAS_RES=residual is not None, BLOCK=block, num_warps=8 if block >= 4096 else 4, **chain_launch(x.device),
        )
    return out, res_out


@triton.jit
def _rope_store_kernel(
    qkv_ptr, cos_ptr, sin_ptr, slot_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
    stride_row, stride_cos,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, PDL: tl.constexpr = False,
):
    chain_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)  # this program's kv head and the GROUP query heads that share it
    half: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HEAD_DIM)
    partner = tl.where(d < half, d + half, d - half)
    sign = tl.where(d < half, -1.0, 1.0)
    row = qkv_ptr + t * stride_row
    dtype = q_out_ptr.dtype.element_ty
    c = tl.load(cos_ptr + t * stride_cos + d).to(dtype).to(tl.float32)
    s = tl.load(sin_ptr + t * stride_cos + d).to(dtype).to(tl.float32)

    hq = kvh * GROUP + tl.arange(0, GROUP_P2)
    qmask = hq[:, None] < (kvh + 1) * GROUP
    q = tl.load(row + hq[:, None] * HEAD_DIM + d[None, :], mask=qmask, other=0.0).to(tl.float32)
    q_rot = tl.load(row + hq[:, None] * HEAD_DIM + partner[None, :], mask=qmask, other=0.0).to(tl.float32)
    q_rot = q_rot * sign[None, :]
    q_new = ((q * c[None, :]).to(dtype).to(tl.float32) + (q_rot * s[None, :]).to(dtype).to(tl.float32)).to(dtype)
    tl.store(q_out_ptr + t * NUM_HEADS * HEAD_DIM + hq[:, None] * HEAD_DIM + d[None, :], q_new, mask=qmask)

    slot = tl.load(slot_ptr + t).to(tl.int64)
    keep = slot >= 0
    slot = tl.maximum(slot, 0)
    blk = slot // BLOCK_SIZE
    within = slot % BLOCK_SIZE
    hk = kvh + tl.arange(0, 1)
    kmask = (hk[:, None] < NUM_KV_HEADS) & keep
    k_base = row + NUM_HEADS * HEAD_DIM
    k = tl.load(k_base + hk[:, None] * HEAD_DIM + d[None, :], mask=kmask, other=0.0).to(tl.float32)
    k_rot = tl.load(k_base + hk[:, None] * HEAD_DIM + partner[None, :], mask=kmask, other=0.0).to(tl.float32)
    k_rot = k_rot * sign[None, :]
    k_new = ((k * c[None, :]).to(dtype).to(tl.float32) + (k_rot * s[None, :]).to(dtype).to(tl.float32)).to(dtype)
    v = tl.load(k_base + (NUM_KV_HEADS + hk[:, None]) * HEAD_DIM + d[None, :], mask=kmask, other=0.0)
    kc = k_cache_ptr + blk * stride_kcb + within * stride_kcs + hk[:, None] * stride_kch + d[None, :]
    vc = v_cache_ptr + blk * stride_vcb + within * stride_vcs + hk[:, None] * stride_vch + d[None, :]
    tl.store(kc, k_new.to(k_cache_ptr.dtype.element_ty), mask=kmask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=kmask)


def rope_store_triton(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Rotate q and k of a fused qkv [B, Q, (H + 2 Hkv) D] tensor, store k and v at their
    slots (slot < 0: not stored) and return the rotated q [B, Q, H, D]. One program per token and kv
    head (its query heads with it): at batch 1 of the 8B shape, 2.0 us a layer against 2.9 us for one
    program per token (H200, the step timeline)."""
    batch, width, _ = qkv.shape
    tokens = batch * width
    flat = qkv.reshape(tokens, -1)
    if flat.stride(1) != 1:
        flat = flat.contiguous()
    q_out = torch.empty((batch, width, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    cos2 = cos.reshape(tokens, head_dim)
    sin2 = sin.reshape(tokens, head_dim)
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the KV cache's head dimension must be contiguous")
    if tokens:
        _rope_store_kernel[(tokens, num_kv_heads)](
            flat, cos2.contiguous(), sin2.contiguous(), slot_mapping.reshape(-1).contiguous(), q_out, k_cache, v_cache,
            flat.stride(0), head_dim,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=num_heads // num_kv_heads,
            GROUP_P2=triton.next_power_of_2(num_heads // num_kv_heads), HEAD_DIM=head_dim,
            BLOCK_SIZE=k_cache.shape[1], num_warps=1 if num_heads // num_kv_heads * head_dim <= 512 else 2,
            **chain_launch(qkv.device),
        )
    return q_out


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    chain_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0)
    dtype = g.dtype
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (act * u.to(tl.float32)).to(dtype), mask=mask)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for a fused [..., 2 I] gate/up tensor -> [..., I]."""
    inter = gate_up.shape[-1] // 2
    flat = gate_up.reshape(-1, 2 * inter).contiguous()
    out = torch.empty((*gate_up.shape[:-1], inter), dtype=gate_up.dtype, device=gate_up.device)
    if flat.shape[0]:
        block = 1024
        _silu_mul_kernel[(flat.shape[0], triton.cdiv(inter, block))](flat, out, inter, BLOCK=block, num_warps=4,
                                                                     **chain_launch(gate_up.device))
    return out
