"""Triton FP8 GEMM for Hopper: y = x @ W^T with e4m3 weights, activations quantized on the fly.

Why a kernel of our own: SD equals AR only if a row's output is the same whatever the batch (M)
it is computed in. Every path here sums a row's products in one order that depends on (N, K)
alone: K is cut into `splits` chunks of whole 128-wide blocks, each chunk's blocks are summed in
order, each block's tensor-core product is promoted to fp32 and scaled before it is added, and
the chunk sums are added in order. For small M (decode) the chunks run as separate programs so
the weight stream fills the GPU, and a second kernel adds them in that same order; for large M
one program loops over its chunks. Tile sizes change with M, the order does not.

The product is computed transposed (weights on the tensor core's M side, tokens on its N side),
so a batch of one wastes a 16-wide token tile instead of a 64-row one. Block weights quantize
the activations inside the GEMM per token and 128-wide group; channel weights take activations
quantized per token by `_quant_rows_kernel` first. Outputs come from torch.empty and no host
synchronisation happens, so it is safe inside CUDA graph capture.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from minedraft.engine.cuda.paged_attention import _INTERPRET  # noqa: F401  (applies the interpreter shim)
from minedraft.engine.fp8_weights import ACT_EPS, Fp8Weight

BLOCK_K = 128  # the K block every chunk is made of (the block layout's group width)
GROUP = tl.constexpr(BLOCK_K)  # the same, as the kernels see it


@triton.jit
def _quantize(x, EPS: tl.constexpr):
    """e4m3 values and fp32 scales of x [T, G] per row (the reference's formula)."""
    scale = tl.maximum(tl.max(tl.abs(x), 1), EPS) / 448.0
    q = tl.clamp(x / scale[:, None], -448.0, 448.0).to(tl.float8e4nv)
    return q, scale


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


@triton.jit
def _fp8_gemm_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, part_ptr,
    M, N, K, stride_x, stride_ws, num_kb, kb_per_chunk,
    BLOCK_SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, GRID_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    EPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_k = tl.arange(0, GROUP)
    n_mask = offs_n < N
    t_mask = offs_t < M
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
    scale_rows = ws_ptr + (offs_n // SCALE_ROWS) * stride_ws
    tile_scale = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    if not BLOCK_SCALES:  # one scale per weight row and per token for the whole of K
        xs = tl.load(xs_ptr + offs_t, mask=t_mask, other=0.0)
        tile_scale = tl.load(scale_rows, mask=n_mask, other=0.0)[:, None] * xs[None, :]
    # One loop over this program's K blocks; at each chunk's end its sum joins the total (or, split
    # over programs, is written for _sum_chunks_kernel), so the order is the same either way.
    kb_lo = tl.program_id(2) * kb_per_chunk if GRID_SPLIT else 0
    kb_hi = tl.minimum(kb_lo + kb_per_chunk, num_kb) if GRID_SPLIT else num_kb
    total = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    acc = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    for kb in range(kb_lo, kb_hi):
        k = kb * GROUP + offs_k
        k_mask = k < K
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x_mask = t_mask[:, None] & k_mask[None, :]
        if BLOCK_SCALES:
            x = tl.load(x_ptr + offs_t[:, None] * stride_x + k[None, :], mask=x_mask, other=0.0)
            xq, xs = _quantize(x.to(tl.float32), EPS)
            ws = tl.load(scale_rows + kb, mask=n_mask, other=0.0)
            tile_scale = ws[:, None] * xs[None, :]
        else:
            xq = tl.load(x_ptr + offs_t[:, None] * K + k[None, :], mask=x_mask, other=0.0)
        acc += tl.dot(w, tl.trans(xq)) * tile_scale
        if not GRID_SPLIT:  # noqa: SIM102 - a compile-time branch around a run-time one
            if (kb + 1) % kb_per_chunk == 0:
                total += acc
                acc = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    if GRID_SPLIT:
        part = part_ptr + tl.program_id(2) * M * N + offs_t[None, :] * N + offs_n[:, None]
        tl.store(part, acc, mask=n_mask[:, None] & t_mask[None, :])
    if not GRID_SPLIT:
        if HAS_BIAS:
            total += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        out = out_ptr + offs_t[None, :] * N + offs_n[:, None]
        tl.store(out, total.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & t_mask[None, :])


@triton.jit
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


def chunk_count(n: int, k: int, multiprocessors: int) -> int:
    """How many K chunks a row's sum is cut into: a function of the shape and the device alone, the
    fewest that give a batch of one at least two programs per multiprocessor."""
    num_kb = -(-k // BLOCK_K)
    tiles = -(-n // 64)
    for d in range(1, num_kb + 1):
        if num_kb % d == 0 and tiles * d >= 2 * multiprocessors:
            return d
    return num_kb


def tile_config(m: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_T, num_warps, num_stages) for M tokens: only the speed depends on it."""
    if m <= 16:
        return 64, 16, 4, 4
    if m <= 32:
        return 64, 32, 4, 4
    if m <= 64:
        return 64, 64, 4, 4
    return 128, 128, 8, 3


def fp8_gemm(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] (bf16/fp16/fp32) times the FP8 weight, in x's dtype."""
    k, n = weight.in_features, weight.out_features
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    block = weight.scheme == "block"
    if block:
        act, act_scale, stride_x = x2, x2, x2.stride(0)  # act_scale unused
    else:
        act = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
        act_scale = torch.empty((m,), dtype=torch.float32, device=x.device)
        _quant_rows_kernel[(m,)](x2, act, act_scale, k, x2.stride(0), EPS=ACT_EPS, BLOCK=1024)
        stride_x = k
    num_kb = -(-k // BLOCK_K)
    chunks = chunk_count(n, k, _multiprocessors(x.device))
    block_n, block_t, warps, stages = tile_config(m)
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_t)
    split = chunks > 1 and tiles < _multiprocessors(x.device)
    part = torch.empty((chunks, m, n), dtype=torch.float32, device=x.device) if split else out
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_t), chunks if split else 1)
    _fp8_gemm_kernel[grid](
        act, act_scale, weight.qweight, weight.scale, bias if bias is not None else out, out, part,
        m, n, k, stride_x, weight.scale.stride(0), num_kb, num_kb // chunks,
        BLOCK_SCALES=block, SCALE_ROWS=weight.scale_rows, GRID_SPLIT=split, HAS_BIAS=bias is not None,
        EPS=ACT_EPS, BLOCK_N=block_n, BLOCK_T=block_t, num_warps=warps, num_stages=stages,
    )
    if split:
        size = 1024
        _sum_chunks_kernel[(triton.cdiv(m * n, size),)](
            part, bias if bias is not None else out, out, m * n, n, CHUNKS=chunks, HAS_BIAS=bias is not None,
            BLOCK=size,
        )
    return out.reshape(*x.shape[:-1], n)
