"""The few-row GEMM's inner loops and its gated activation, shared by its kernels (`skinny_gemm.py`,
`skinny_split.py`, `skinny_rope.py`): Triton inlines them, so each kernel compiles as if they were written in it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _silu_times(gate, up, dtype: tl.constexpr):
    """silu(gate) * up from float32 sums, rounded to `dtype` where the separate silu*up kernel rounds: the sums
    as the plain GEMM stores them, the activation, the product."""
    g = gate.to(dtype).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return act * up.to(dtype).to(tl.float32)


@triton.jit
def _pair_dot(
    x_ptr, w_ptr, M, K, stride_xm, stride_wn, rows_a, pair_rows, n_mask,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    SWAP_AB: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, PAIRED: tl.constexpr,
):
    """The tensor-core K loop: float32 sums of x against weight rows `rows_a` and, when PAIRED, against the rows
    `pair_rows` further on; [BLOCK_N, BLOCK_M] each when SWAP_AB, else [BLOCK_M, BLOCK_N]."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + rows_a[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    u_ptrs = w_ptrs + pair_rows * stride_wn
    if SWAP_AB:  # noqa: SIM108  (a constexpr branch: the accumulator's shape differs)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros_like(acc)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
            if PAIRED:
                u = tl.load(u_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            k_mask = (k0 + offs_k) < K
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            if PAIRED:
                u = tl.load(u_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if UPCAST_DOT:  # interpreter only: its tl.dot cannot multiply bf16/fp16 operands
            x = x.to(tl.float32)
            w = w.to(tl.float32)
            if PAIRED:
                u = u.to(tl.float32)
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION)
            if PAIRED:
                acc_b = tl.dot(u, tl.trans(x), acc_b, input_precision=DOT_PRECISION)
        else:
            acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
            if PAIRED:
                acc_b = tl.dot(x, tl.trans(u), acc_b, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        if PAIRED:
            u_ptrs += BLOCK_K
    return acc, acc_b


@triton.jit
def _pair_fma(
    x_ptr, w_ptr, K, stride_wn, rows_a, pair_rows, n_mask,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PAIRED: tl.constexpr,
):
    """The one-row K loop: element-wise products summed at the end, [BLOCK_N] float32 sums against weight rows
    `rows_a` and, when PAIRED, against the rows `pair_rows` further on."""
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_k
    w_ptrs = w_ptr + rows_a[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    u_ptrs = w_ptrs + pair_rows * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_b = tl.zeros_like(acc)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs)
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
            if PAIRED:
                u = tl.load(u_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            k_mask = (k0 + offs_k) < K
            x = tl.load(x_ptrs, mask=k_mask, other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            if PAIRED:
                u = tl.load(u_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        if PAIRED:
            acc_b += u.to(tl.float32) * x.to(tl.float32)[None, :]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        if PAIRED:
            u_ptrs += BLOCK_K
    return tl.sum(acc, 1), tl.sum(acc_b, 1)


@triton.jit
def _publish_share(share_ptr, acc, acc_b, cell, mask, b_offset, count_ptr, PAIRED: tl.constexpr):
    """A K-split program's part of the tile (`skinny_split.py`): its float32 sums go to the workspace (acc at
    `cell`, acc_b `b_offset` further on when PAIRED), then it takes the tile's arrival ticket. Every share is
    written before the count rises: a barrier, then one thread's atomic with release and acquire at GPU scope.
    Returns how many of the tile's programs had arrived before this one."""
    tl.store(share_ptr + cell, acc, mask=mask)
    if PAIRED:
        tl.store(share_ptr + cell + b_offset, acc_b, mask=mask)
    tl.debug_barrier()
    return tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")


@triton.jit
def _sum_shares(part_ptr, share_stride, total, total_b, cell, mask, b_offset, count_ptr, SPLIT: tl.constexpr,
                PAIRED: tl.constexpr):
    """The tile's last program to arrive: adds every share's sums to total (and total_b) in share order, so the
    result never depends on which program came last, and leaves the count at zero for the next launch."""
    for s in range(0, SPLIT):
        total += tl.load(part_ptr + s * share_stride + cell, mask=mask, other=0.0, cache_modifier=".cg")
        if PAIRED:
            total_b += tl.load(part_ptr + s * share_stride + cell + b_offset, mask=mask, other=0.0,
                               cache_modifier=".cg")
    tl.store(count_ptr, 0)
    return total, total_b
