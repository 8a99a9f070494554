"""The q/k/v projection with rotary embedding and the KV-cache write in its epilogue: one kernel per layer
where the few-row GEMM (`skinny_gemm.py`) and `fused_kernels.rope_store_triton` were two.

Rotation mixes each head's feature d with feature d + D/2, so a program owns BLOCK_N features of the first
half of one head and the same BLOCK_N of its second half (a pair of weight tiles D/2 rows apart, two
accumulators, as the gated GEMM pairs gate and up). BLOCK_N must divide D/2, so no tile straddles two heads
and each program's head is q, k or v as a whole: q is rotated and written to q [tokens, H, D], k rotated and
v as it is written to their cache slots (slot < 0: not written). Each value is rounded where the two
kernels round it (the projection's output, each product of the rotation, their sum), so the result is the
same bits as the same config's plain GEMM followed by `rope_store_triton`. A K-split config (`skinny_split.py`)
sums its shares in order first, in the tile's last program to arrive, which then runs the same epilogue.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minedraft.engine.cuda.paged_attention import _INTERPRET
from minedraft.engine.cuda.pdl import chain_wait_rows, gemm_chain_launch
from minedraft.engine.cuda.skinny_configs import SMEM, SkinnyConfig, shortlist_for
from minedraft.engine.cuda.skinny_gemm import token_rows
from minedraft.engine.cuda.skinny_loops import _pair_dot, _pair_fma, _publish_share, _sum_shares
from minedraft.engine.cuda.skinny_split import split_counts, split_shares


@triton.jit
def _rope_epilogue(
    a, b, offs_m, m_mask, head, within, b_ptr, cos_ptr, sin_ptr, slot_ptr, q_ptr, kc_ptr, vc_ptr, stride_cos,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    HAS_BIAS: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """a, b: [rows, BLOCK_N] float32 sums of features `within` and `within` + D/2 of `head` (of the q, k, v
    heads in that order) for the tokens `offs_m`."""
    half: tl.constexpr = HEAD_DIM // 2
    dtype = q_ptr.dtype.element_ty
    feature = head * HEAD_DIM + within
    if HAS_BIAS:
        a += tl.load(b_ptr + feature).to(tl.float32)[None, :]
        b += tl.load(b_ptr + feature + half).to(tl.float32)[None, :]
    a = a.to(dtype).to(tl.float32)  # the projection's output, as the plain GEMM stores it
    b = b.to(dtype).to(tl.float32)
    if head < NUM_HEADS + NUM_KV_HEADS:  # q or k: rotate
        trig = offs_m[:, None].to(tl.int64) * stride_cos + within[None, :]
        cos_a = tl.load(cos_ptr + trig, mask=m_mask[:, None], other=0.0).to(dtype).to(tl.float32)
        sin_a = tl.load(sin_ptr + trig, mask=m_mask[:, None], other=0.0).to(dtype).to(tl.float32)
        cos_b = tl.load(cos_ptr + trig + half, mask=m_mask[:, None], other=0.0).to(dtype).to(tl.float32)
        sin_b = tl.load(sin_ptr + trig + half, mask=m_mask[:, None], other=0.0).to(dtype).to(tl.float32)
        out_a = ((a * cos_a).to(dtype).to(tl.float32) + (-b * sin_a).to(dtype).to(tl.float32)).to(dtype)
        out_b = ((b * cos_b).to(dtype).to(tl.float32) + (a * sin_b).to(dtype).to(tl.float32)).to(dtype)
    else:
        out_a = a.to(dtype)
        out_b = b.to(dtype)
    if head < NUM_HEADS:
        q_ptrs = q_ptr + offs_m[:, None].to(tl.int64) * (NUM_HEADS * HEAD_DIM) + feature[None, :]
        tl.store(q_ptrs, out_a, mask=m_mask[:, None])
        tl.store(q_ptrs + half, out_b, mask=m_mask[:, None])
    else:
        slot = tl.load(slot_ptr + offs_m, mask=m_mask, other=-1).to(tl.int64)
        keep = m_mask & (slot >= 0)
        slot = tl.maximum(slot, 0)
        blk = slot // BLOCK_SIZE
        inside = slot % BLOCK_SIZE
        if head < NUM_HEADS + NUM_KV_HEADS:
            base = kc_ptr + blk * stride_kcb + inside * stride_kcs + (head - NUM_HEADS) * stride_kch
        else:
            base = vc_ptr + blk * stride_vcb + inside * stride_vcs + (head - NUM_HEADS - NUM_KV_HEADS) * stride_vch
        ptrs = base[:, None] + within[None, :]
        tl.store(ptrs, out_a.to(kc_ptr.dtype.element_ty), mask=keep[:, None])
        tl.store(ptrs + half, out_b.to(kc_ptr.dtype.element_ty), mask=keep[:, None])


@triton.jit
def _skinny_rope_kernel(
    x_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, slot_ptr, q_ptr, kc_ptr, vc_ptr, part_ptr, count_ptr, M, K, k_per_split,
    stride_xm, stride_wn, stride_cos, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    HAS_BIAS: tl.constexpr, FMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0, LINE: tl.constexpr = 64,
):
    half: tl.constexpr = HEAD_DIM // 2
    tiles_per_head: tl.constexpr = half // BLOCK_N
    pid = tl.program_id(0)
    head = pid // tiles_per_head
    within = (pid % tiles_per_head) * BLOCK_N + tl.arange(0, BLOCK_N)  # features of the head's first half
    rows_a = head * HEAD_DIM + within
    n_mask = within < half
    # on the dependent chain (pdl.py): both halves' first weight blocks of this program's K share, the wait
    k_first = tl.program_id(1) * k_per_split
    chain_wait_rows(w_ptr + k_first, rows_a, half, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, stride_wn, K - k_first,
                    PDL, PREFETCH, BLOCK_K, LINE, True)
    if FMA:  # one token
        a1, b1 = _pair_fma(x_ptr, w_ptr, K, stride_wn, rows_a, half, n_mask, BLOCK_N, BLOCK_K, EVEN_K, True)
        offs_m = tl.arange(0, 1)
        _rope_epilogue(a1[None, :], b1[None, :], offs_m, offs_m < M, head, within, b_ptr, cos_ptr, sin_ptr,
                       slot_ptr, q_ptr, kc_ptr, vc_ptr, stride_cos, stride_kcb, stride_kcs, stride_kch, stride_vcb,
                       stride_vcs, stride_vch, HAS_BIAS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
    else:
        if SPLIT > 1:  # this program's share of whole K tiles (skinny_split.py)
            share = tl.program_id(1)
            k_lo = share * k_per_split
            k_len = tl.minimum(k_per_split, K - k_lo)
        else:
            k_lo = 0
            k_len = K
        a, b = _pair_dot(x_ptr + k_lo, w_ptr + k_lo, M, k_len, stride_xm, stride_wn, rows_a, half, n_mask,
                         BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SWAP_AB, DOT_PRECISION, UPCAST_DOT, True)
        if SWAP_AB:  # [BLOCK_N, BLOCK_M] -> tokens by features
            a = tl.trans(a)
            b = tl.trans(b)
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        if SPLIT > 1:
            # Each share's sums go to the workspace; the tile's last program to arrive adds them in share order
            # and runs the epilogue, then resets the count (as skinny_split.py does).
            width: tl.constexpr = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
            cell = offs_m[:, None].to(tl.int64) * width + rows_a[None, :]
            arrived = _publish_share(part_ptr + share.to(tl.int64) * M * width, a, b, cell, m_mask[:, None], half,
                                     count_ptr + pid, True)
            if arrived == SPLIT - 1:
                total_a, total_b = _sum_shares(part_ptr, M * width, tl.zeros_like(a), tl.zeros_like(b), cell,
                                               m_mask[:, None], half, count_ptr + pid, SPLIT, True)
                _rope_epilogue(total_a, total_b, offs_m, m_mask, head, within, b_ptr, cos_ptr, sin_ptr, slot_ptr,
                               q_ptr, kc_ptr, vc_ptr, stride_cos, stride_kcb, stride_kcs, stride_kch, stride_vcb,
                               stride_vcs, stride_vch, HAS_BIAS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
        else:
            _rope_epilogue(a, b, offs_m, m_mask, head, within, b_ptr, cos_ptr, sin_ptr, slot_ptr, q_ptr, kc_ptr,
                           vc_ptr, stride_cos, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs,
                           stride_vch, HAS_BIAS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)


def fits_heads(config: SkinnyConfig, head_dim: int) -> bool:
    """Whether a config's feature tile divides half a head (no tile may straddle two heads)."""
    return config.block_n <= head_dim // 2 and (head_dim // 2) % config.block_n == 0


def rope_shortlist(rows: int, head_dim: int, element_size: int = 2) -> list[SkinnyConfig]:
    """The gated GEMM's shortlist (two weight tiles per step too) less the tiles wider than half a head."""
    return [c for c in shortlist_for(rows, element_size, glu=True)
            if fits_heads(c, head_dim) and c.staged_bytes(element_size, glu=True) <= SMEM]


def skinny_qkv_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: SkinnyConfig,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    slot_mapping: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """q of `rope_store_triton(F.linear(x, weight, bias), ...)` for x [..., hidden] of at most `config.block_m`
    tokens (cos/sin and slots one per token), with k and v written to the cache as it writes them; returns
    q [..., H, D]."""
    k_cache, v_cache = kv
    n, k = weight.shape
    if n != (num_heads + 2 * num_kv_heads) * head_dim or weight.stride(1) != 1:
        raise ValueError("the weight must be the fused q/k/v projection with contiguous rows")
    if not fits_heads(config, head_dim):
        raise ValueError(f"config {config.name}'s tiles do not divide half of a {head_dim}-wide head")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or k_cache.dtype != x.dtype:
        raise ValueError("the KV cache must share the activations' dtype, its head dimension contiguous")
    x2 = token_rows(x, k, config)
    rows = x2.shape[0]
    q = torch.empty((*x.shape[:-1], num_heads, head_dim), dtype=x.dtype, device=x.device)
    if rows == 0:
        return q
    cos = cos_sin[0].reshape(rows, head_dim).contiguous()
    sin = cos_sin[1].reshape(rows, head_dim).contiguous()
    tiles = (num_heads + 2 * num_kv_heads) * (head_dim // 2) // config.block_n
    config, counts = split_counts(config, x.device, tiles)
    per = split_shares(k, config) if config.split > 1 else k
    part = torch.empty((config.split, rows, n), dtype=torch.float32, device=x.device) if config.split > 1 else q
    _skinny_rope_kernel[(tiles, config.split)](
        x2, weight, bias if bias is not None else weight, cos, sin, slot_mapping.reshape(-1).contiguous(), q,
        k_cache, v_cache, part, counts if counts is not None else q, rows, k, per, x2.stride(0), weight.stride(0),
        head_dim, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2),
        HAS_BIAS=bias is not None, FMA=config.form == "fma", BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, SPLIT=config.split, EVEN_K=k % config.block_k == 0,
        SWAP_AB=config.form == "swap", DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST_DOT=_INTERPRET and x.dtype != torch.float32, NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1], num_warps=config.warps, num_stages=config.stages,
        **gemm_chain_launch(x.device, weight),
    )
    return q
