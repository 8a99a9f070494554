"""Triton FP8 GEMM for Hopper: y = x @ W^T with e4m3 weights, activations quantized on the fly.

Why a kernel of our own: SD equals AR only if a row's output is the same whatever the batch (M)
it is computed in. Every path here sums a row's products in one order that depends on (N, K)
alone: K is cut into `chunks` pieces of whole 128-wide blocks (one number per shape, from the tile
table in `fp8_tiles.py`), each chunk's blocks are summed in order, each block's tensor-core product
(wgmma, e4m3 x e4m3 -> fp32, at every M: no FMA path whose rounding would differ) is promoted to
fp32 and scaled before it is added, and the chunk sums are added in order. The choices made per M
only move work around that order: tile sizes, warps, stages; `split` programs along K that each
write their chunks' sums (decode: the weight stream fills the GPU), added in order either by the
tile's last program to finish (`fused`: it counts arrivals in a per-tile counter, so no second
launch) or by `_sum_chunks_kernel`, or one program that loops over all chunks (large M); weights
and (bf16) activations through pointer loads or the tensor memory accelerator (`tma`: the same
bytes reach the same wgmma); for block weights, activations quantized inside the GEMM (small M) or once by
`_quant_groups_kernel` (large M), with the same `_quantize`, so the same bits; `pdl`, a launch
that may begin while the previous kernel finishes (programmatic dependent launch: the program
sends its first weight blocks towards L2, then waits for that kernel before touching anything
else), which moves only time.

The product is computed transposed (weights on the tensor core's M side, tokens on its N side),
so a batch of one wastes a 16-wide token tile instead of a 64-row one. Outputs come from
torch.empty and no host synchronisation happens, so it is safe inside CUDA graph capture.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from minedraft.engine.cuda.fp8_blocks import GROUP, _act_block, _quantize, _weight_block
from minedraft.engine.cuda.fp8_chunks import add_chunk_sums, arrived_last, close_chunk
from minedraft.engine.cuda.fp8_direct import launch_direct
from minedraft.engine.cuda.fp8_launch import ARRIVAL_COUNTS, has_pdl, has_tma, multiprocessors, tma_fits
from minedraft.engine.cuda.fp8_tiles import BLOCK_K, Tile, active_table, choose
from minedraft.engine.cuda.paged_attention import _INTERPRET  # noqa: F401  (applies the interpreter shim)
from minedraft.engine.cuda.pdl import chain_launch, chain_wait, chained, prefetch_weight_rows
from minedraft.engine.fp8_weights import ACT_EPS, Fp8Weight

QUANT_ROWS = 16  # tokens per program of _quant_groups_kernel
PREFETCH_BLOCKS = tl.constexpr(4)  # K blocks of weights a program sends towards L2 before it waits (PDL)


@triton.jit(do_not_specialize=["M"])
def _quant_groups_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_x, num_kb, EPS: tl.constexpr, ROWS: tl.constexpr,
                         PDL: tl.constexpr = False):
    """Block scheme, large M: each token's 128-wide groups quantized once, for every weight tile."""
    chain_wait(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    kb = tl.program_id(1)
    k = kb * GROUP + tl.arange(0, GROUP)
    mask = (rows < M)[:, None] & (k < K)[None, :]
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + k[None, :], mask=mask, other=0.0)
    q, scale = _quantize(x.to(tl.float32), EPS)
    tl.store(q_ptr + rows[:, None].to(tl.int64) * K + k[None, :], q, mask=mask)
    tl.store(s_ptr + rows * num_kb + kb, scale, mask=rows < M)


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, EPS: tl.constexpr, BLOCK: tl.constexpr,
                       PDL: tl.constexpr = False):
    chain_wait(PDL)
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
def _write_out(total, bias_ptr, out_ptr, offs_n, offs_t, n_mask, t_mask, N, HAS_BIAS: tl.constexpr):
    """A tile's finished fp32 sums, plus the bias, in the output dtype (every path ends here)."""
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    out = out_ptr + offs_t[None, :] * N + offs_n[:, None]
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & t_mask[None, :])


@triton.jit(do_not_specialize=["M", "num_kb", "kb_per_chunk", "kb_per_prog", "stride_xs"])
def _fp8_gemm_kernel(
    x_ptr, x_desc, xs_ptr, w_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, stride_x, stride_xs, stride_ws, num_kb, kb_per_chunk, kb_per_prog,
    BLOCK_SCALES: tl.constexpr, QUANT_X: tl.constexpr, SCALE_ROWS: tl.constexpr, GRID_SPLIT: tl.constexpr,
    FUSED_SUM: tl.constexpr, WHOLE_CHUNK: tl.constexpr, TMA: tl.constexpr, TMA_X: tl.constexpr, PDL: tl.constexpr,
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
    parts = part_ptr + offs_t[None, :] * N + offs_n[:, None]  # chunk c's sums: parts + c * M * N
    tile_mask = n_mask[:, None] & t_mask[None, :]
    # The scales stay vectors and their outer product is formed per block (a loop-carried tile of
    # them would hold a whole accumulator's worth of registers); the same product either way.
    row_s = tl.zeros((BLOCK_N,), tl.float32)
    tok_s = tl.zeros((BLOCK_T,), tl.float32)
    # One loop over this program's K blocks; at each chunk's end its sum joins the total (or, split
    # over programs, is written for the ordered addition), so the order is the same either way. A
    # program that covers exactly one chunk (WHOLE_CHUNK) does the same after the loop, branch-free.
    kb_lo = tl.program_id(2) * kb_per_prog if GRID_SPLIT else 0
    kb_hi = kb_lo + kb_per_prog if GRID_SPLIT else num_kb  # the splits cut num_kb exactly
    if PDL:  # on the dependent chain (pdl.py): start this program's first weight blocks towards L2 (they are
        # constant), then wait for the previous kernel's writes before reading activations or writing anything
        prefetch_weight_rows(w_ptr + kb_lo * GROUP, offs_n, N, K, (kb_hi - kb_lo) * GROUP, PREFETCH_BLOCKS, GROUP,
                             GROUP)
    chain_wait(PDL)
    if not BLOCK_SCALES:  # one scale per weight row and per token for the whole of K (the token's come from the
        # kernel before: read after the wait)
        tok_s = tl.load(xs_ptr + offs_t, mask=t_mask, other=0.0)
        row_s = tl.load(scale_rows, mask=n_mask, other=0.0)
    total = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    acc = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    for kb in range(kb_lo, kb_hi):
        k = kb * GROUP + offs_k
        k_mask = k < K
        w, ws = _weight_block(w_rows, w_desc, scale_rows, n_mask, k, k_mask, kb, pid_n * BLOCK_N, row_s,
                              TMA, BLOCK_SCALES)
        xq, xs = _act_block(x_rows, x_desc, xs_ptr, offs_t, t_mask, k, k_mask, kb, pid_t * BLOCK_T, tok_s,
                            stride_xs, QUANT_X, TMA_X, BLOCK_SCALES, EPS)
        acc += tl.dot(w, tl.trans(xq)) * (ws[:, None] * xs[None, :])
        if not WHOLE_CHUNK:  # noqa: SIM102  (a compile-time choice around a runtime test)
            if (kb + 1) % kb_per_chunk == 0:  # a chunk ends
                total = close_chunk(acc, total, parts, (kb // kb_per_chunk) * M * N, tile_mask, GRID_SPLIT)
                acc = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    if WHOLE_CHUNK:
        total = close_chunk(acc, total, parts, (kb_lo // kb_per_chunk) * M * N, tile_mask, GRID_SPLIT)
    if not GRID_SPLIT:
        _write_out(total, bias_ptr, out_ptr, offs_n, offs_t, n_mask, t_mask, N, HAS_BIAS)
    elif FUSED_SUM:  # the tile's last program to arrive adds every chunk's sums in chunk order
        count = count_ptr + pid_t * tl.num_programs(0) + pid_n
        if arrived_last(count, tl.num_programs(2)):
            total = add_chunk_sums(total, parts, tile_mask, M * N, num_kb // kb_per_chunk)
            _write_out(total, bias_ptr, out_ptr, offs_n, offs_t, n_mask, t_mask, N, HAS_BIAS)
            tl.store(count, 0)


@triton.jit(do_not_specialize=["MN"])
def _sum_chunks_kernel(part_ptr, bias_ptr, out_ptr, MN, N, CHUNKS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    chain_wait(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.zeros((BLOCK,), tl.float32)
    for c in tl.static_range(CHUNKS):
        total += tl.load(part_ptr + c * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


def fp8_gemm(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] (bf16/fp16/fp32) times the FP8 weight, in x's dtype, with the active tile table's choice."""
    k = weight.in_features
    return fp8_gemm_with(x, weight, *table_choice(weight, x.numel() // k if k else 0, x.device), bias)


def table_choice(weight: Fp8Weight, m: int, device: torch.device) -> tuple[int, Tile]:
    """(chunks, tile) of the active tile table for this weight at m tokens on this device: a tile whose weight
    does not fit a tensor descriptor there loads through pointers (the same bits)."""
    chunks, tile = choose(active_table(), weight.scheme, weight.out_features, weight.in_features, m,
                          multiprocessors(device))
    if tile.tma and not (has_tma(device) and tma_fits(weight.qweight)):
        tile = dataclasses.replace(tile, tma=False)
    return chunks, tile


def fp8_gemm_with(x: torch.Tensor, weight: Fp8Weight, chunks: int, tile: Tile,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_gemm with the chunk count and tile given (the tuner's entry point; `chunks` must divide K's
    block count and `tile.split` the chunks)."""
    k, n = weight.in_features, weight.out_features
    pdl = chained(x.device) or (tile.pdl and has_pdl(x.device))  # the tile's own, or the chain's (pdl.py)
    if tile.pdl != pdl and not tile.direct:
        tile = dataclasses.replace(tile, pdl=pdl)
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    block = weight.scheme == "block"
    quant_x = block and not tile.prequant
    if quant_x:
        act, act_scale, stride_x, stride_xs = x2, x2, x2.stride(0), 0  # act_scale unused
    else:
        act, act_scale, stride_xs = quantize_rows(x2, weight.scheme)
        stride_x = k
    split = tile.split > 1
    tiles = triton.cdiv(n, tile.block_n) * triton.cdiv(m, tile.block_t)
    counts = ARRIVAL_COUNTS.get(x.device, tiles) if split and tile.fused else None
    part = torch.empty((chunks, m, n), dtype=torch.float32, device=x.device) if split else out
    if tile.direct:
        launch_direct(act, act_scale, stride_xs, weight, bias, out, part, counts, chunks, tile)
    else:
        _launch_transposed(act, act_scale, stride_x, stride_xs, weight, bias, out, part, counts, quant_x, chunks, tile)
    if split and counts is None:
        size = 1024
        _sum_chunks_kernel[(triton.cdiv(m * n, size),)](
            part, bias if bias is not None else out, out, m * n, n, CHUNKS=chunks, HAS_BIAS=bias is not None,
            BLOCK=size, **chain_launch(x.device),
        )
    return out.reshape(*x.shape[:-1], n)


def quantize_rows(x2: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """x2 [M, K] quantized once for every weight tile: e4m3 [M, K], float32 scales per token and 128-group
    ([M, blocks], block weights) or per token ([M], channel weights), and the scales' row stride."""
    m, k = x2.shape
    act = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x2.device)
    if scheme == "block":
        num_kb = triton.cdiv(k, BLOCK_K)
        act_scale = torch.empty((m, num_kb), dtype=torch.float32, device=x2.device)
        _quant_groups_kernel[(triton.cdiv(m, QUANT_ROWS), num_kb)](
            x2, act, act_scale, m, k, x2.stride(0), num_kb, EPS=ACT_EPS, ROWS=QUANT_ROWS, **chain_launch(x2.device))
        return act, act_scale, num_kb
    act_scale = torch.empty((m,), dtype=torch.float32, device=x2.device)
    _quant_rows_kernel[(m,)](x2, act, act_scale, k, x2.stride(0), EPS=ACT_EPS, BLOCK=1024, **chain_launch(x2.device))
    return act, act_scale, 1


def _launch_transposed(act: torch.Tensor, act_scale: torch.Tensor, stride_x: int, stride_xs: int,
                       weight: Fp8Weight, bias: torch.Tensor | None, out: torch.Tensor, part: torch.Tensor,
                       counts: torch.Tensor | None, quant_x: bool, chunks: int, tile: Tile) -> None:
    """The transposed form's launch (weights on the MMA's M side) over act [M, K]: bf16 rows it quantizes
    itself (`quant_x`) or e4m3 rows quantized before."""
    m, k = act.shape
    n = weight.out_features
    num_kb = triton.cdiv(k, BLOCK_K)
    kb_per_chunk = num_kb // chunks
    split, block = tile.split > 1, weight.scheme == "block"
    grid = (triton.cdiv(n, tile.block_n), triton.cdiv(m, tile.block_t), tile.split)
    w_desc = TensorDescriptor.from_tensor(weight.qweight, [tile.block_n, BLOCK_K]) if tile.tma else weight.qweight
    tma_x = tile.tma and quant_x and act.stride(0) * act.element_size() % 16 == 0 and act.data_ptr() % 16 == 0
    x_desc = (TensorDescriptor(act, [m, k], [act.stride(0), 1], [tile.block_t, BLOCK_K]) if tma_x else act)
    _fp8_gemm_kernel[grid](
        act, x_desc, act_scale, weight.qweight, w_desc, weight.scale, bias if bias is not None else out, out, part,
        counts if counts is not None else out,
        m, n, k, stride_x, stride_xs, weight.scale.stride(0), num_kb, kb_per_chunk, kb_per_chunk * chunks // tile.split,
        BLOCK_SCALES=block, QUANT_X=quant_x, SCALE_ROWS=weight.scale_rows, GRID_SPLIT=split,
        FUSED_SUM=counts is not None, WHOLE_CHUNK=tile.split == chunks, TMA=tile.tma, TMA_X=tma_x, PDL=tile.pdl,
        HAS_BIAS=bias is not None, EPS=ACT_EPS, BLOCK_N=tile.block_n, BLOCK_T=tile.block_t,
        num_warps=tile.warps, num_stages=tile.stages, launch_pdl=tile.pdl,
    )
