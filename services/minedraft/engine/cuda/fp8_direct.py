"""The FP8 GEMM as written, x @ W^T with tokens on the tensor core's M side: the form for many tokens.

`fp8_gemm.py` computes the product transposed (weights on the MMA's M side), which suits decode: a
batch of one fills a 16-wide token tile. From about 64 tokens that form runs out of steam: its
tiles are short on the token side, so each weight block feeds a narrow MMA and the tile's three
float32 accumulators (the block's product, the chunk's sum, the total) crowd the registers. Here
a program owns [BLOCK_T tokens, BLOCK_N weight rows], the MMA is m64nBLOCK_N per warpgroup, and the
token tiles of one weight tile run next to each other (program axis 0), so a weight block is read
from memory once and served to the rest from L2.

The arithmetic is the transposed form's, operation for operation, so a row's bits do not depend on
which form or tile computed it (SD == AR rests on that): each 128-wide K block's e4m3 product
(promoted to float32) is multiplied by (weight scale * token scale) and added to the chunk's sum;
each chunk's sum is added, in chunk order, to a total that starts at zero. Activations arrive
quantized (`fp8_gemm.py` runs its quantize kernels first), through pointer loads or, both
operands, the tensor memory accelerator. With `split` programs along K, each
writes its chunks' sums and they are added in order by the tile's last program to arrive (fused)
or by `fp8_gemm._sum_chunks_kernel`, exactly as the transposed form does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from minedraft.engine.cuda.fp8_blocks import GROUP, _act_block, _weight_block
from minedraft.engine.cuda.fp8_chunks import add_chunk_sums, arrived_last, close_chunk
from minedraft.engine.cuda.fp8_tiles import BLOCK_K, Tile
from minedraft.engine.cuda.pdl import chain_launch, chain_wait
from minedraft.engine.fp8_weights import Fp8Weight


@triton.jit(do_not_specialize=["M", "num_kb", "kb_per_chunk", "kb_per_prog", "stride_xs"])
def _fp8_direct_kernel(
    x_ptr, x_desc, xs_ptr, w_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, stride_xs, stride_ws, num_kb, kb_per_chunk, kb_per_prog,
    BLOCK_SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, GRID_SPLIT: tl.constexpr, FUSED_SUM: tl.constexpr,
    WHOLE_CHUNK: tl.constexpr, TMA: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
):
    chain_wait(PDL)
    pid_t = tl.program_id(0)  # token tiles vary fastest: neighbours share a weight tile through L2
    pid_n = tl.program_id(1)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, GROUP)
    t_mask = offs_t < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_t[:, None].to(tl.int64) * K
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
    scale_rows = ws_ptr + (offs_n // SCALE_ROWS) * stride_ws
    tile_mask = t_mask[:, None] & n_mask[None, :]
    parts = part_ptr + offs_t[:, None] * N + offs_n[None, :]  # chunk c's sums: parts + c * M * N
    tok_s = tl.zeros((BLOCK_T,), tl.float32)
    row_s = tl.zeros((BLOCK_N,), tl.float32)
    if not BLOCK_SCALES:
        tok_s = tl.load(xs_ptr + offs_t, mask=t_mask, other=0.0)
        row_s = tl.load(scale_rows, mask=n_mask, other=0.0)
    kb_lo = tl.program_id(2) * kb_per_prog if GRID_SPLIT else 0
    kb_hi = kb_lo + kb_per_prog if GRID_SPLIT else num_kb
    total = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    for kb in range(kb_lo, kb_hi):
        k = kb * GROUP + offs_k
        k_mask = k < K
        xq, xs = _act_block(x_rows, x_desc, xs_ptr, offs_t, t_mask, k, k_mask, kb, pid_t * BLOCK_T, tok_s,
                            stride_xs, False, TMA, BLOCK_SCALES, 0.0)
        w, ws = _weight_block(w_rows, w_desc, scale_rows, n_mask, k, k_mask, kb, pid_n * BLOCK_N, row_s, TMA,
                              BLOCK_SCALES)
        acc += tl.dot(xq, tl.trans(w)) * (ws[None, :] * xs[:, None])
        if not WHOLE_CHUNK:  # noqa: SIM102  (a compile-time choice around a runtime test)
            if (kb + 1) % kb_per_chunk == 0:
                total = close_chunk(acc, total, parts, (kb // kb_per_chunk) * M * N, tile_mask, GRID_SPLIT)
                acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    if WHOLE_CHUNK:
        total = close_chunk(acc, total, parts, (kb_lo // kb_per_chunk) * M * N, tile_mask, GRID_SPLIT)
    if not GRID_SPLIT:
        _write_rows(total, bias_ptr, out_ptr, offs_t, offs_n, tile_mask, N, HAS_BIAS)
    elif FUSED_SUM:  # the tile's last program to arrive adds every chunk's sums in chunk order
        count = count_ptr + pid_n * tl.num_programs(0) + pid_t
        if arrived_last(count, tl.num_programs(2)):
            total = add_chunk_sums(total, parts, tile_mask, M * N, num_kb // kb_per_chunk)
            _write_rows(total, bias_ptr, out_ptr, offs_t, offs_n, tile_mask, N, HAS_BIAS)
            tl.store(count, 0)


@triton.jit
def _write_rows(total, bias_ptr, out_ptr, offs_t, offs_n, tile_mask, N, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_t[:, None] * N + offs_n[None, :], total.to(out_ptr.dtype.element_ty), mask=tile_mask)


def launch_direct(act: torch.Tensor, act_scale: torch.Tensor, stride_xs: int, weight: Fp8Weight,
                  bias: torch.Tensor | None, out: torch.Tensor, part: torch.Tensor, counts: torch.Tensor | None,
                  chunks: int, tile: Tile) -> None:
    """One launch over quantized activations act [M, K] (e4m3, contiguous) into out [M, N]; `part` holds
    the chunk sums of a split tile, `counts` the arrival counts of a fused one (None: a second kernel adds).
    With `tile.tma` both operands stream through the tensor memory accelerator (the caller checked that
    the weight fits a descriptor)."""
    m, k = act.shape
    qweight, scale = weight.qweight, weight.scale
    n = qweight.shape[0]
    num_kb = triton.cdiv(k, BLOCK_K)
    kb_per_chunk = num_kb // chunks
    grid = (triton.cdiv(m, tile.block_t), triton.cdiv(n, tile.block_n), tile.split)
    x_desc = TensorDescriptor.from_tensor(act, [tile.block_t, BLOCK_K]) if tile.tma else act
    w_desc = TensorDescriptor.from_tensor(qweight, [tile.block_n, BLOCK_K]) if tile.tma else qweight
    _fp8_direct_kernel[grid](
        act, x_desc, act_scale, qweight, w_desc, scale, bias if bias is not None else out, out, part,
        counts if counts is not None else out,
        m, n, k, stride_xs, scale.stride(0), num_kb, kb_per_chunk, kb_per_chunk * chunks // tile.split,
        BLOCK_SCALES=weight.scheme == "block", SCALE_ROWS=weight.scale_rows, GRID_SPLIT=tile.split > 1,
        FUSED_SUM=counts is not None, WHOLE_CHUNK=tile.split == chunks, TMA=tile.tma, HAS_BIAS=bias is not None,
        BLOCK_T=tile.block_t, BLOCK_N=tile.block_n, num_warps=tile.warps,
        num_stages=tile.stages, **chain_launch(act.device),
    )
