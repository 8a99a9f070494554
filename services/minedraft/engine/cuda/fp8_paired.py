"""The FP8 GEMM with its next kernel in the epilogue, for decode: gate/up with silu(gate) * up, and q/k/v with
the rotary embedding and the KV-cache write. At a few tokens each of those kernels costs a launch and a ramp
for almost no work; here they disappear.

Both need two output features of a token at once (gate d and up d; feature d of a head and d + D/2), so a
program owns two weight tiles `pair_rows` apart (I for gate/up, D/2 for a head) and keeps an accumulator for
each, against the same activations (the transposed form of `fp8_gemm.py`: weights on the MMA's M side). Each
tile is summed exactly as that kernel sums it: the same 128-wide blocks (`fp8_blocks.py`), the same chunk
count for the fused weight's shape, the same fused chunk sums when split along K, so the epilogue starts from
the bits that kernel writes and rounds where the kernel it replaces rounds (`skinny_loops._silu_times`,
`skinny_rope._rope_epilogue`): the result is the same bits as the plain GEMM followed by that kernel, at
every batch, and a row's bits still do not depend on the batch (SD == AR). Used where the tile table gives a
transposed tile; larger batches (the direct form) run the two kernels.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from minedraft.engine.cuda.fp8_blocks import GROUP, _act_block, _weight_block
from minedraft.engine.cuda.fp8_chunks import add_chunk_sums, arrived_last, close_chunk
from minedraft.engine.cuda.fp8_gemm import quantize_rows, table_choice
from minedraft.engine.cuda.fp8_launch import ARRIVAL_COUNTS
from minedraft.engine.cuda.fp8_tiles import BLOCK_K, Tile
from minedraft.engine.cuda.paged_attention import _INTERPRET  # noqa: F401  (applies the interpreter shim)
from minedraft.engine.cuda.pdl import chain_launch, chain_wait
from minedraft.engine.cuda.skinny_loops import _silu_times
from minedraft.engine.cuda.skinny_rope import _rope_epilogue
from minedraft.engine.fp8_weights import ACT_EPS, Fp8Weight

MIN_HALF = 64  # weight rows per tile of the pair: the tensor cores' 64-row side, as every transposed tile has


@triton.jit
def _pair_epilogue(
    total_a, total_b, offs_t, t_mask, rows_a, n_mask, head, within, bias_ptr, out_ptr, cos_ptr, sin_ptr, slot_ptr,
    kc_ptr, vc_ptr, stride_cos, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, width,
    ROPE: tl.constexpr, HAS_BIAS: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    a = tl.trans(total_a)  # [tokens, features], as the few-row GEMM's epilogues take them
    b = tl.trans(total_b)
    if ROPE:
        _rope_epilogue(a, b, offs_t, t_mask, head, within, bias_ptr, cos_ptr, sin_ptr, slot_ptr, out_ptr, kc_ptr,
                       vc_ptr, stride_cos, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                       HAS_BIAS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
    else:
        y = _silu_times(a, b, out_ptr.dtype.element_ty)
        out = out_ptr + offs_t[:, None].to(tl.int64) * width + rows_a[None, :]
        tl.store(out, y.to(out_ptr.dtype.element_ty), mask=t_mask[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["M", "num_kb", "kb_per_chunk", "kb_per_prog", "stride_xs"])
def _fp8_paired_kernel(
    x_ptr, xs_ptr, w_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, part_ptr, count_ptr, cos_ptr, sin_ptr, slot_ptr,
    kc_ptr, vc_ptr, stride_cos, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    M, N, K, stride_x, stride_xs, stride_ws, num_kb, kb_per_chunk, kb_per_prog, pair_rows,
    BLOCK_SCALES: tl.constexpr, QUANT_X: tl.constexpr, SCALE_ROWS: tl.constexpr, GRID_SPLIT: tl.constexpr,
    WHOLE_CHUNK: tl.constexpr, TMA: tl.constexpr, HAS_BIAS: tl.constexpr, EPS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, ROPE: tl.constexpr, NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, PDL: tl.constexpr = False,
):
    chain_wait(PDL)
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    head = 0
    if ROPE:  # BLOCK_N divides D/2: a program owns a slice of one head's first half and the same of its second
        per_head: tl.constexpr = HEAD_DIM // 2 // BLOCK_N
        head = pid_n // per_head
        row0 = head * HEAD_DIM + (pid_n % per_head) * BLOCK_N
    else:  # gate rows [row0, row0 + BLOCK_N) of I = pair_rows, and the same up rows
        row0 = pid_n * BLOCK_N
    within = row0 - head * HEAD_DIM + tl.arange(0, BLOCK_N)
    rows_a = row0 + tl.arange(0, BLOCK_N)
    rows_b = rows_a + pair_rows
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_k = tl.arange(0, GROUP)
    n_mask = rows_a < pair_rows if not ROPE else rows_a < N
    t_mask = offs_t < M
    x_rows = x_ptr + offs_t[:, None].to(tl.int64) * stride_x
    w_rows_a = w_ptr + rows_a[:, None].to(tl.int64) * K
    w_rows_b = w_ptr + rows_b[:, None].to(tl.int64) * K
    scale_a = ws_ptr + (rows_a // SCALE_ROWS) * stride_ws
    scale_b = ws_ptr + (rows_b // SCALE_ROWS) * stride_ws
    parts_a = part_ptr + offs_t[None, :] * N + rows_a[:, None]  # chunk c's sums at + c * M * N, as fp8_gemm's
    parts_b = part_ptr + offs_t[None, :] * N + rows_b[:, None]
    tile_mask = n_mask[:, None] & t_mask[None, :]
    row_sa = tl.zeros((BLOCK_N,), tl.float32)
    row_sb = tl.zeros((BLOCK_N,), tl.float32)
    tok_s = tl.zeros((BLOCK_T,), tl.float32)
    if not BLOCK_SCALES:
        tok_s = tl.load(xs_ptr + offs_t, mask=t_mask, other=0.0)
        row_sa = tl.load(scale_a, mask=n_mask, other=0.0)
        row_sb = tl.load(scale_b, mask=n_mask, other=0.0)
    kb_lo = tl.program_id(2) * kb_per_prog if GRID_SPLIT else 0
    kb_hi = kb_lo + kb_per_prog if GRID_SPLIT else num_kb
    total_a = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    total_b = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    acc_a = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    acc_b = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    for kb in range(kb_lo, kb_hi):
        k = kb * GROUP + offs_k
        k_mask = k < K
        xq, xs = _act_block(x_rows, x_rows, xs_ptr, offs_t, t_mask, k, k_mask, kb, 0, tok_s, stride_xs,
                            QUANT_X, False, BLOCK_SCALES, EPS)
        w_a, ws_a = _weight_block(w_rows_a, w_desc, scale_a, n_mask, k, k_mask, kb, row0, row_sa, TMA, BLOCK_SCALES)
        w_b, ws_b = _weight_block(w_rows_b, w_desc, scale_b, n_mask, k, k_mask, kb, row0 + pair_rows, row_sb, TMA,
                                  BLOCK_SCALES)
        acc_a += tl.dot(w_a, tl.trans(xq)) * (ws_a[:, None] * xs[None, :])
        acc_b += tl.dot(w_b, tl.trans(xq)) * (ws_b[:, None] * xs[None, :])
        if not WHOLE_CHUNK:  # noqa: SIM102  (a compile-time choice around a runtime test)
            if (kb + 1) % kb_per_chunk == 0:
                offset = (kb // kb_per_chunk) * M * N
                total_a = close_chunk(acc_a, total_a, parts_a, offset, tile_mask, GRID_SPLIT)
                total_b = close_chunk(acc_b, total_b, parts_b, offset, tile_mask, GRID_SPLIT)
                acc_a = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
                acc_b = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    if WHOLE_CHUNK:
        offset = (kb_lo // kb_per_chunk) * M * N
        total_a = close_chunk(acc_a, total_a, parts_a, offset, tile_mask, GRID_SPLIT)
        total_b = close_chunk(acc_b, total_b, parts_b, offset, tile_mask, GRID_SPLIT)
    if not GRID_SPLIT:
        _pair_epilogue(total_a, total_b, offs_t, t_mask, rows_a, n_mask, head, within, bias_ptr, out_ptr, cos_ptr,
                       sin_ptr, slot_ptr, kc_ptr, vc_ptr, stride_cos, stride_kcb, stride_kcs, stride_kch, stride_vcb,
                       stride_vcs, stride_vch, pair_rows, ROPE, HAS_BIAS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM,
                       BLOCK_SIZE)
    else:  # the tile's last program adds every chunk's sums of both tiles in chunk order, then the epilogue
        count = count_ptr + pid_t * tl.num_programs(0) + pid_n
        if arrived_last(count, tl.num_programs(2)):
            chunks = num_kb // kb_per_chunk
            total_a = add_chunk_sums(total_a, parts_a, tile_mask, M * N, chunks)
            total_b = add_chunk_sums(total_b, parts_b, tile_mask, M * N, chunks)
            _pair_epilogue(total_a, total_b, offs_t, t_mask, rows_a, n_mask, head, within, bias_ptr, out_ptr,
                           cos_ptr, sin_ptr, slot_ptr, kc_ptr, vc_ptr, stride_cos, stride_kcb, stride_kcs, stride_kch,
                           stride_vcb, stride_vcs, stride_vch, pair_rows, ROPE, HAS_BIAS, NUM_HEADS, NUM_KV_HEADS,
                           HEAD_DIM, BLOCK_SIZE)
            tl.store(count, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Rope:
    """What the q/k/v epilogue needs: cos and sin per token [rows, D], the cache slot per token (< 0: not
    written), the paged caches [blocks, block size, KV heads, D] and the head counts."""

    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int


def paired_tile(weight: Fp8Weight, m: int, device: torch.device, half_limit: int) -> tuple[int, Tile] | None:
    """(chunks, tile) for the pair at m tokens: the table's transposed tile for the fused weight's shape, each
    half of it one of the pair's tiles (64 rows at least, at most `half_limit`); None where the table gives the
    direct form or no pair tile fits (fp8_paired_with also refuses a head half that the tile does not divide)."""
    chunks, tile = table_choice(weight, m, device)
    half = min(max(tile.block_n // 2, MIN_HALF), half_limit)
    if tile.direct or half < MIN_HALF:
        return None
    return chunks, dataclasses.replace(tile, block_n=half, pdl=False)


def fp8_paired(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None, rope: Rope | None) -> torch.Tensor | None:
    """silu(gate) * up [..., I] of a fused gate/up weight (rope None), or q [..., H, D] of a fused q/k/v weight
    with k and v written to the cache, with the tile table's choice; None where this kernel does not run the
    shape (the caller runs the GEMM and the next kernel: the same bits)."""
    m = x.numel() // weight.in_features if weight.in_features else 0
    half_limit = 256 if rope is None else rope.head_dim // 2  # a head's half must hold whole tiles
    picked = paired_tile(weight, m, x.device, half_limit) if m else None
    return None if picked is None else fp8_paired_with(x, weight, bias, rope, *picked)


def fp8_paired_with(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None, rope: Rope | None, chunks: int,
                    tile: Tile) -> torch.Tensor | None:
    """fp8_paired with the chunk count and the pair's tile given (`tile.block_n` rows per tile of the pair)."""
    k, n = weight.in_features, weight.out_features
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if rope is None:
        pair_rows = n // 2
        if n % 2 or bias is not None:
            return None
        tiles = triton.cdiv(pair_rows, tile.block_n)
    else:
        pair_rows = rope.head_dim // 2
        if n != (rope.heads + 2 * rope.kv_heads) * rope.head_dim or rope.k_cache.dtype != x.dtype \
                or rope.k_cache.stride(3) != 1 or rope.v_cache.stride(3) != 1 or pair_rows % tile.block_n:
            return None
        tiles = n // 2 // tile.block_n
    if m == 0 or tile.direct or tile.block_n < MIN_HALF:
        return None
    split = tile.split > 1
    counts = ARRIVAL_COUNTS.get(x.device, tiles * triton.cdiv(m, tile.block_t)) if split else None
    if split and counts is None:
        return None  # inside a capture before any split launch made the counts: the two kernels
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    num_kb = triton.cdiv(k, BLOCK_K)
    block = weight.scheme == "block"
    act, act_scale, stride_xs = x2, x2, 0
    if not block or tile.prequant:
        act, act_scale, stride_xs = quantize_rows(x2, weight.scheme)
    part = torch.empty((chunks, m, n), dtype=torch.float32, device=x.device) if split else x2
    if rope is None:
        out = torch.empty((*x.shape[:-1], pair_rows), dtype=x.dtype, device=x.device)
        cos = sin = slots = k_cache = v_cache = out
        cache_strides = (0,) * 6
        stride_cos, heads, kv_heads, head_dim, block_size = 0, 1, 1, 2, 1
    else:
        out = torch.empty((*x.shape[:-1], rope.heads, rope.head_dim), dtype=x.dtype, device=x.device)
        cos, sin = rope.cos.reshape(m, -1).contiguous(), rope.sin.reshape(m, -1).contiguous()
        slots, k_cache, v_cache = rope.slots.reshape(-1).contiguous(), rope.k_cache, rope.v_cache
        cache_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
        stride_cos, heads, kv_heads, head_dim = cos.stride(0), rope.heads, rope.kv_heads, rope.head_dim
        block_size = k_cache.shape[1]
    w_desc = TensorDescriptor.from_tensor(weight.qweight, [tile.block_n, BLOCK_K]) if tile.tma else weight.qweight
    _fp8_paired_kernel[(tiles, triton.cdiv(m, tile.block_t), tile.split)](
        act, act_scale, weight.qweight, w_desc, weight.scale, bias if bias is not None else out, out, part,
        counts if counts is not None else out, cos, sin, slots, k_cache, v_cache, stride_cos, *cache_strides,
        m, n, k, act.stride(0), stride_xs, weight.scale.stride(0), num_kb, num_kb // chunks,
        num_kb // tile.split, pair_rows,
        BLOCK_SCALES=block, QUANT_X=block and not tile.prequant, SCALE_ROWS=weight.scale_rows, GRID_SPLIT=split,
        WHOLE_CHUNK=tile.split == chunks, TMA=tile.tma, HAS_BIAS=bias is not None, EPS=ACT_EPS,
        BLOCK_N=tile.block_n, BLOCK_T=tile.block_t, ROPE=rope is not None, NUM_HEADS=heads, NUM_KV_HEADS=kv_heads,
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, num_warps=tile.warps,
        num_stages=tile.stages, **chain_launch(x.device),
    )
    return out
