"""Triton FP8 GEMM for Hopper: y = x @ W^T with e4m3 weights, activations quantized on the fly.

Why a kernel of our own: SD equals AR only if a row's output is the same whatever the batch (M)
it is computed in. Every path here sums a row's products in one order that depends on (N, K)
alone: K is cut into `chunks` pieces of whole 128-wide blocks (one number per shape, from the tile
table in `fp8_tiles.py`), each chunk's blocks are summed in order, each block's tensor-core product
(wgmma, e4m3 x e4m3 -> fp32, at every M: no FMA path whose rounding would differ) is promoted to
fp32 and scaled before it is added, and the chunk sums are added in order. The choices made per M
only move work around that order: tile sizes, warps, stages; `split` programs along K that each
write their chunks' sums for `_sum_chunks_kernel` to add in order (decode: the weight stream fills
the GPU) or one program that loops over all chunks (large M); for block weights, activations
quantized inside the GEMM (small M) or once by `_quant_groups_kernel` (large M), with the same
`_quantize`, so the same bits.

The product is computed transposed (weights on the tensor core's M side, tokens on its N side),
so a batch of one wastes a 16-wide token tile instead of a 64-row one. Outputs come from
torch.empty and no host synchronisation happens, so it is safe inside CUDA graph capture.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from minedraft.engine.cuda.fp8_tiles import BLOCK_K, Tile, active_table, choose
from minedraft.engine.cuda.paged_attention import _INTERPRET  # noqa: F401  (applies the interpreter shim)
from minedraft.engine.fp8_weights import ACT_EPS, Fp8Weight

GROUP = tl.constexpr(BLOCK_K)  # the K block, as the kernels see it
QUANT_ROWS = 16  # tokens per program of _quant_groups_kernel


@triton.jit
def _quantize(x, EPS: tl.constexpr):
    """e4m3 values and fp32 scales of x [T, G] per row (the reference's formula). The GEMM's in-kernel
    path and `_quant_groups_kernel` both call this, so their bits agree."""
    scale = tl.maximum(tl.max(tl.abs(x), 1), EPS) / 448.0
    q = tl.clamp(x / scale[:, None], -448.0, 448.0).to(tl.float8e4nv)
    return q, scale


@triton.jit(do_not_specialize=["M"])
def _quant_groups_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_x, num_kb, EPS: tl.constexpr, ROWS: tl.constexpr):
    """Block scheme, large M: each token's 128-wide groups quantized once, for every weight tile."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    kb = tl.program_id(1)
    k = kb * GROUP + tl.arange(0, GROUP)
    mask = (rows < M)[:, None] & (k < K)[None, :]
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + k[None, :], mask=mask, other=0.0)
    q, scale = _quantize(x.to(tl.float32), EPS)
    tl.store(q_ptr + rows[:, None].to(tl.int64) * K + k[None, :], q, mask=mask)
    tl.store(s_ptr + rows * num_kb + kb, scale, mask=rows < M)


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, EPS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    amax = tl.zeros((BLOCK,), tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(x_ptr + row * stride_x + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, 0), EPS) / 448.0
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        x = tl.load(x_ptr + row * stride_x + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        q = tl.clamp(x / scale, -448.0, 448.0).to(tl.float8e4nv)
        tl.store(q_ptr + row * K + k0 + cols, q, mask=k0 + cols < K)


@triton.jit(do_not_specialize=["M", "num_kb", "kb_per_chunk", "kb_per_prog", "stride_xs"])
def _fp8_gemm_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, part_ptr,
    M, N, K, stride_x, stride_xs, stride_ws, num_kb, kb_per_chunk, kb_per_prog,
    BLOCK_SCALES: tl.constexpr, QUANT_X: tl.constexpr, SCALE_ROWS: tl.constexpr, GRID_SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, EPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_k = tl.arange(0, GROUP)
    n_mask = offs_n < N
    t_mask = offs_t < M
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
    x_rows = x_ptr + offs_t[:, None].to(tl.int64) * stride_x
    scale_rows = ws_ptr + (offs_n // SCALE_ROWS) * stride_ws
    # The scales stay vectors and their outer product is formed per block (a loop-carried tile of
    # them would hold a whole accumulator's worth of registers); the same product either way.
    row_s = tl.zeros((BLOCK_N,), tl.float32)
    tok_s = tl.zeros((BLOCK_T,), tl.float32)
    if not BLOCK_SCALES:  # one scale per weight row and per token for the whole of K
        tok_s = tl.load(xs_ptr + offs_t, mask=t_mask, other=0.0)
        row_s = tl.load(scale_rows, mask=n_mask, other=0.0)
    # One loop over this program's K blocks; at each chunk's end its sum joins the total (or, split
    # over programs, is written for _sum_chunks_kernel), so the order is the same either way.
    kb_lo = tl.program_id(2) * kb_per_prog if GRID_SPLIT else 0
    kb_hi = kb_lo + kb_per_prog if GRID_SPLIT else num_kb  # the splits cut num_kb exactly
    total = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    acc = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    for kb in range(kb_lo, kb_hi):
        k = kb * GROUP + offs_k
        k_mask = k < K
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x_mask = t_mask[:, None] & k_mask[None, :]
        if QUANT_X:  # block weights, bf16 activations: quantize this 128-group here
            x = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0)
            xq, xs = _quantize(x.to(tl.float32), EPS)
        else:
            xq = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0)
            xs = tok_s
        if BLOCK_SCALES:
            if not QUANT_X:
                xs = tl.load(xs_ptr + offs_t * stride_xs + kb, mask=t_mask, other=0.0)
            ws = tl.load(scale_rows + kb, mask=n_mask, other=0.0)
        else:
            ws = row_s
        acc += tl.dot(w, tl.trans(xq)) * (ws[:, None] * xs[None, :])
        if (kb + 1) % kb_per_chunk == 0:  # a chunk ends
            if GRID_SPLIT:
                part = part_ptr + (kb // kb_per_chunk) * M * N + offs_t[None, :] * N + offs_n[:, None]
                tl.store(part, acc, mask=n_mask[:, None] & t_mask[None, :])
            else:
                total += acc
            acc = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    if not GRID_SPLIT:
        if HAS_BIAS:
            total += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        out = out_ptr + offs_t[None, :] * N + offs_n[:, None]
        tl.store(out, total.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & t_mask[None, :])


@triton.jit(do_not_specialize=["MN"])
def _sum_chunks_kernel(part_ptr, bias_ptr, out_ptr, MN, N, CHUNKS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.zeros((BLOCK,), tl.float32)
    for c in tl.static_range(CHUNKS):
        total += tl.load(part_ptr + c * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the interpreter: an H100/H200's count, so CPU runs take the same paths
    return torch.cuda.get_device_properties(device).multi_processor_count


def fp8_gemm(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] (bf16/fp16/fp32) times the FP8 weight, in x's dtype, with the active tile table's choice."""
    k, n = weight.in_features, weight.out_features
    m = x.numel() // k if k else 0
    chunks, tile = choose(active_table(), weight.scheme, n, k, m, _multiprocessors(x.device))
    return fp8_gemm_with(x, weight, chunks, tile, bias)


def fp8_gemm_with(x: torch.Tensor, weight: Fp8Weight, chunks: int, tile: Tile,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_gemm with the chunk count and tile given (the tuner's entry point; `chunks` must divide K's
    block count and `tile.split` the chunks)."""
    k, n = weight.in_features, weight.out_features
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    num_kb = triton.cdiv(k, BLOCK_K)
    block = weight.scheme == "block"
    quant_x = block and not tile.prequant
    if quant_x:
        act, act_scale, stride_x, stride_xs = x2, x2, x2.stride(0), 0  # act_scale unused
    elif block:
        act = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
        act_scale = torch.empty((m, num_kb), dtype=torch.float32, device=x.device)
        _quant_groups_kernel[(triton.cdiv(m, QUANT_ROWS), num_kb)](
            x2, act, act_scale, m, k, x2.stride(0), num_kb, EPS=ACT_EPS, ROWS=QUANT_ROWS)
        stride_x, stride_xs = k, num_kb
    else:
        act = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
        act_scale = torch.empty((m,), dtype=torch.float32, device=x.device)
        _quant_rows_kernel[(m,)](x2, act, act_scale, k, x2.stride(0), EPS=ACT_EPS, BLOCK=1024)
        stride_x, stride_xs = k, 1
    kb_per_chunk = num_kb // chunks
    split = tile.split > 1
    part = torch.empty((chunks, m, n), dtype=torch.float32, device=x.device) if split else out
    grid = (triton.cdiv(n, tile.block_n), triton.cdiv(m, tile.block_t), tile.split)
    _fp8_gemm_kernel[grid](
        act, act_scale, weight.qweight, weight.scale, bias if bias is not None else out, out, part,
        m, n, k, stride_x, stride_xs, weight.scale.stride(0), num_kb, kb_per_chunk, kb_per_chunk * chunks // tile.split,
        BLOCK_SCALES=block, QUANT_X=quant_x, SCALE_ROWS=weight.scale_rows, GRID_SPLIT=split,
        HAS_BIAS=bias is not None, EPS=ACT_EPS, BLOCK_N=tile.block_n, BLOCK_T=tile.block_t,
        num_warps=tile.warps, num_stages=tile.stages,
    )
    if split:
        size = 1024
        _sum_chunks_kernel[(triton.cdiv(m * n, size),)](
            part, bias if bias is not None else out, out, m * n, n, CHUNKS=chunks, HAS_BIAS=bias is not None,
            BLOCK=size,
        )
    return out.reshape(*x.shape[:-1], n)
