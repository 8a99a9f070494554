"""One 128-wide K block of the transposed FP8 GEMM's operands, as its kernels load them (`fp8_gemm.py`, and
`fp8_paired.py`, which loads two weight tiles per block against the same activations). Triton inlines these,
so every kernel that calls them quantizes, loads and scales a block the same way: the same bits."""

from __future__ import annotations

import triton
import triton.language as tl

from minedraft.engine.cuda.fp8_tiles import BLOCK_K

GROUP = tl.constexpr(BLOCK_K)  # the K block, as the kernels see it


@triton.jit
def _quantize(x, EPS: tl.constexpr):
    """e4m3 values and fp32 scales of x [T, G] per row (the reference's formula). The GEMM's in-kernel
    path and `_quant_groups_kernel` both call this, so their bits agree."""
    scale = tl.maximum(tl.max(tl.abs(x), 1), EPS) / 448.0
    q = tl.clamp(x / scale[:, None], -448.0, 448.0).to(tl.float8e4nv)
    return q, scale


@triton.jit
def _act_block(x_rows, x_desc, xs_ptr, offs_t, t_mask, k, k_mask, kb, row0, tok_s, stride_xs,
               QUANT_X: tl.constexpr, TMA_X: tl.constexpr, BLOCK_SCALES: tl.constexpr, EPS: tl.constexpr):
    """The tokens' e4m3 values [BLOCK_T, 128] of block kb and their fp32 scales [BLOCK_T]: bf16 rows quantized
    here (`QUANT_X`, block weights) or rows quantized before, with a scale per token and block (block weights)
    or per token (`tok_s`, channel weights). `TMA_X`: the rows come from row0 by the tensor memory accelerator,
    rows past M arriving as zeros, as the masked loads give."""
    if TMA_X:  # pipelined like the weights
        x = x_desc.load([row0, kb * GROUP])
    else:
        x = tl.load(x_rows + k[None, :], mask=t_mask[:, None] & k_mask[None, :], other=0.0)
    if QUANT_X:
        xq, xs = _quantize(x.to(tl.float32), EPS)
    else:
        xq = x
        xs = tok_s
        if BLOCK_SCALES:
            xs = tl.load(xs_ptr + offs_t * stride_xs + kb, mask=t_mask, other=0.0)
    return xq, xs


@triton.jit
def _weight_block(w_rows, w_desc, scale_rows, n_mask, k, k_mask, kb, row0, row_s,
                  TMA: tl.constexpr, BLOCK_SCALES: tl.constexpr):
    """The e4m3 weight tile [BLOCK_N, 128] of block kb (`TMA`: from row0 by the tensor memory accelerator,
    out-of-range rows and columns arriving as zeros, as the masked loads give) and its rows' fp32 scales:
    the block's (block weights) or the row's (`row_s`, channel weights)."""
    if TMA:  # a constexpr choice between two loads
        w = w_desc.load([row0, kb * GROUP])
    else:
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    ws = row_s
    if BLOCK_SCALES:
        ws = tl.load(scale_rows + kb, mask=n_mask, other=0.0)
    return w, ws
