"""Triton attention over the paged KV cache, plus the matching KV write.

One kernel serves every row shape the runner produces — prefill chunks, single-token
decodes and k+1-token verify windows — with the same output semantics as the plain-torch
reference `minedraft.engine.attention.paged_attention` for valid query tokens.

Tiling
------
Queries are [B, Q, H, D] with H = Hkv * G (GQA). A program owns one (batch row b, kv head)
pair and a tile of BLOCK_M *folded* query rows: row m of the (b, kv head) problem is query
token m // G and query head kvh * G + m % G. All G heads that share a kv head therefore sit
in the same tile and every K/V tile loaded from the cache is used G times. For decode
(Q = 1) and verify (Q = k + 1) windows this is what makes the kernel bandwidth-bound
instead of re-reading the cache once per query head: with G = 4, Q = 1 a single 16-row tile
holds the whole group. Prefill chunks simply get more M tiles (BLOCK_M = 64 folded rows).
BLOCK_M is 16 / 32 / 64 by the number of folded rows (see `_launch_config`).

Keys are visited in tiles of BLOCK_N = 64 or 128 positions (a multiple of the 16-slot page,
so one tile gathers several pages through the block table). The key range of a program is
[lo, hi) with hi = position of its last valid query + 1 (read from `starts` / `query_lens`
in memory, so the loop bound is a runtime value and the launch shapes stay static) and
lo = 0, or the first tile touching the sliding window. Softmax is the usual online
(flash) softmax in fp32 with exp2.

Grid: (M tiles = cdiv(Q * G, BLOCK_M), B * Hkv, NUM_SPLITS). When B * Hkv * M tiles is too
small to fill the GPU (small-batch decode), the key range is additionally split into
NUM_SPLITS chunks ("flash-decoding"): each split writes a normalized partial output plus its
log-sum-exp into a workspace and a second small kernel merges them. NUM_SPLITS is chosen
from static shapes only (batch, heads, block-table width, SM count), never from data.

Packed queries (a TETRIS verify, engine/ragged.py): q is [1, N, H, D], the rows' valid tokens
one after the other, row b's from q_offsets[b]; the grid is the same as for the [B, Q] layout
with Q the widest row, and only valid tokens are read and written (the output's other tokens,
a packed step's dummies, are left as they were).

Padding query tokens (j >= query_lens[b]) are written as zeros; rows with query_lens 0
read nothing. Only keys at positions < start + query_len of a row are ever loaded, so stale
or uninitialised cache slots beyond a sequence's length cannot leak in (not even as NaN).
q and the cache must share a dtype (fp32 and bf16 are tested); fp32 dots run in IEEE fp32, not tf32.

CUDA graphs: nothing here reads device data on the host (no .item(), no boolean
indexing); all launch parameters derive from tensor shapes and Python scalars, and the
only allocations are the output and the split workspace (torch.empty, graph-pool safe).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from minedraft.engine.cuda.pdl import chain_launch, chain_wait

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    block_tables_ptr,
    starts_ptr,
    query_lens_ptr,
    q_offsets_ptr,
    scale_log2,
    window,
    max_blocks,
    num_q,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_od,
    stride_bt,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PACKED: tl.constexpr,
    PDL: tl.constexpr = False,
):
    chain_wait(PDL)
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    split = tl.program_id(2)
    b = bh // NUM_KV_HEADS
    kvh = bh % NUM_KV_HEADS

    start = tl.load(starts_ptr + b).to(tl.int64)
    qlen = tl.minimum(tl.load(query_lens_ptr + b).to(tl.int64), num_q)

    # Folded rows: m -> (query token m // GROUP, query head kvh * GROUP + m % GROUP).
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = offs_m // GROUP
    head = kvh * GROUP + offs_m % GROUP
    row_in = tok < num_q  # row exists in the output buffer
    row_valid = tok < qlen  # row is a real query token
    pos = start + tok

    offs_d = tl.arange(0, HEAD_DIM)
    if PACKED:  # row b's queries are tokens q_offsets[b] .. + qlen of q [1, N, H, D]
        first = tl.load(q_offsets_ptr + b).to(tl.int64)
        q_row = q_ptr + first * stride_qt
        o_row = out_ptr + first * stride_ot
        row_out = row_valid  # the tokens past qlen are the next row's
    else:
        q_row = q_ptr + b.to(tl.int64) * stride_qb
        o_row = out_ptr + b.to(tl.int64) * stride_ob
        row_out = row_in  # padding tokens are written as zeros
    q_ptrs = (
        q_row
        + tok[:, None] * stride_qt
        + head[:, None] * stride_qh
        + offs_d[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=row_valid[:, None], other=0.0)
    if UPCAST_DOT:  # interpreter only: its tl.dot cannot multiply bf16/fp16 operands
        q = q.to(tl.float32)

    # Key range [lo, hi) of this tile: up to its last valid query's position.
    tok_first = (tile * BLOCK_M) // GROUP
    tok_last = tl.minimum(((tile + 1) * BLOCK_M - 1) // GROUP, qlen - 1)
    hi = tl.where(tok_first < qlen, start + tok_last + 1, 0)
    hi = tl.minimum(hi, max_blocks * BLOCK_SIZE)
    if USE_WINDOW:
        lo = tl.maximum(start + tok_first - window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        lo = tl.minimum(lo, hi)
    else:
        lo = hi * 0
    if NUM_SPLITS > 1:
        tiles_per_split = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), NUM_SPLITS)
        s_lo = tl.minimum(lo + split * tiles_per_split * BLOCK_N, hi)
        s_hi = tl.minimum(s_lo + tiles_per_split * BLOCK_N, hi)
    else:
        s_lo = lo
        s_hi = hi

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(s_lo, s_hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_mask = offs_n < s_hi
        blk = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        within = offs_n % BLOCK_SIZE
        k_ptrs = (
            k_cache_ptr
            + blk[:, None] * stride_kb
            + within[:, None] * stride_ks
            + kvh * stride_kh
            + offs_d[None, :] * stride_kd
        )
        k = tl.load(k_ptrs, mask=n_mask[:, None], other=0.0)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        visible = (offs_n[None, :] <= pos[:, None]) & row_valid[:, None] & n_mask[None, :]
        if USE_WINDOW:
            visible = visible & (offs_n[None, :] > pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]

        v_ptrs = (
            v_cache_ptr
            + blk[:, None] * stride_vb
            + within[:, None] * stride_vs
            + kvh * stride_vh
            + offs_d[None, :] * stride_vd
        )
        v = tl.load(v_ptrs, mask=n_mask[:, None], other=0.0)
        # Probabilities are rounded to the cache dtype before P @ V, like the reference.
        p_lo = p.to(v_cache_ptr.dtype.element_ty)
        if UPCAST_DOT:
            p_lo = p_lo.to(tl.float32)
            v = v.to(tl.float32)
        acc = tl.dot(p_lo, v, acc, input_precision=DOT_PRECISION)
        m_i = m_new

    has_keys = l_i > 0.0
    o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if NUM_SPLITS > 1:
        # Workspace rows are indexed like the output: ((split * B + b) * Q + tok) * H + head.
        num_heads = NUM_KV_HEADS * GROUP
        row = ((split * (tl.num_programs(1) // NUM_KV_HEADS) + b).to(tl.int64) * num_q + tok) * num_heads + head
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_in[:, None])
        lse = tl.where(has_keys, m_i + tl.math.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=row_in)
    else:
        o_ptrs = o_row + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_out[:, None])


@triton.jit
def _merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    query_lens_ptr,
    q_offsets_ptr,
    num_rows,
    num_q,
    num_heads,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_od,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PACKED: tl.constexpr,
    PDL: tl.constexpr = False,
):
    chain_wait(PDL)
    row = tl.program_id(0).to(tl.int64)  # (b * Q + tok) * H + head
    head = row % num_heads
    tok = (row // num_heads) % num_q
    b = row // (num_heads * num_q)
    offs_s = tl.arange(0, SPLITS_P2)
    s_mask = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, HEAD_DIM)
    lse = tl.load(part_lse_ptr + offs_s * num_rows + row, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse - m)
    denom = tl.sum(w, 0)
    parts = tl.load(
        part_out_ptr + (offs_s[:, None] * num_rows + row) * HEAD_DIM + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )
    o = tl.sum(parts * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
    if PACKED:  # only real queries have a place in the packed output
        keep = (offs_d < HEAD_DIM) & (tok < tl.load(query_lens_ptr + b))
        o_ptrs = out_ptr + (tl.load(q_offsets_ptr + b) + tok) * stride_ot + head * stride_oh + offs_d * stride_od
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=keep)
    else:
        o_ptrs = out_ptr + b * stride_ob + tok * stride_ot + head * stride_oh + offs_d * stride_od
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty))


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_kcd,
    stride_vcb,
    stride_vcs,
    stride_vch,
    stride_vcd,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_P2: tl.constexpr,
    DIM_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    chain_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    keep = slot >= 0
    slot = tl.maximum(slot, 0)
    blk = slot // BLOCK_SIZE
    within = slot % BLOCK_SIZE
    offs_h = tl.arange(0, HEADS_P2)
    offs_d = tl.arange(0, DIM_P2)
    mask = keep & (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd, mask=mask)
    kc = k_cache_ptr + blk * stride_kcb + within * stride_kcs
    vc = v_cache_ptr + blk * stride_vcb + within * stride_vcs
    kc = kc + offs_h[:, None] * stride_kch + offs_d[None, :] * stride_kcd
    vc = vc + offs_h[:, None] * stride_vch + offs_d[None, :] * stride_vcd
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


_MAX_SPLITS = 16
_SM_COUNT: dict[int, int] = {}


def _launch_config(rows: int, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for `rows` folded query rows per (b, kv head).

    Picked on an H200 (H=32, Hkv=8, D=128, bf16, context 1024-2048, CUDA-graph timing):
    decode (rows <= 16) 64-key tiles, 2 stages: ~3.7 TB/s at B=64; verify windows
    (rows <= 32, e.g. 5 tokens x 4 heads) 128-key tiles: ~3.2 TB/s at B=64; prefill 64x64
    tiles, 3 stages: ~200-240 TFLOP/s. Wider M tiles and 8 warps measured slower.
    """
    if rows <= 16:
        return 16, 64, 4, 2
    if rows <= 32:
        return 32, 128, 4, 2
    return 64, 64, 4, 3


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def _choose_splits(programs: int, max_keys: int, block_n: int, device: torch.device) -> int:
    """Static split count for the key dimension: only when the grid would underfill the GPU."""
    sms = _sm_count(device)
    if sms == 0 or programs >= sms:
        return 1
    want = triton.cdiv(2 * sms, programs)
    # At least one key tile per split at full block-table width.
    by_len = max(1, max_keys // block_n)
    return max(1, min(want, by_len, _MAX_SPLITS))


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    starts: torch.Tensor,
    query_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    *,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    q_offsets: torch.Tensor | None = None,
    width: int = 0,
) -> torch.Tensor:
    """Causal attention of q [B, Q, H, D] over the paged cache -> [B, Q, H, D].

    With `q_offsets` [B] q is packed, [1, N, H, D]: row b's query j is token q_offsets[b] + j, for
    j < query_lens[b] <= `width`, and the output is packed the same way.

    Query token j of row b sits at position starts[b] + j and is valid when
    j < query_lens[b]; it attends keys 0..pos (and only those with key_pos > pos - window
    when `sliding_window` is a positive int), read through block_tables[b, key_pos //
    block_size] from k_cache / v_cache [num_blocks, block_size, Hkv, D]. Padding tokens
    come back as zeros. `out` may be given (any strides) to write into; `num_splits`
    overrides the static key-split heuristic. No host synchronisation happens here.
    """
    packed = q_offsets is not None
    if packed:
        if q.shape[0] != 1 or width <= 0:
            raise ValueError("packed queries are [1, N, H, D] with the widest row's `width` given")
        batch, heads, dim = query_lens.shape[0], q.shape[2], q.shape[3]
    else:
        batch, width, heads, dim = q.shape
    _, block_size, kv_heads, kdim = k_cache.shape
    if kdim != dim or v_cache.shape != k_cache.shape:
        raise ValueError("k_cache/v_cache must be [num_blocks, block_size, Hkv, D] matching q's head_dim")
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q ({q.dtype}) and the KV cache ({k_cache.dtype}, {v_cache.dtype}) must share a dtype")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    if dim & (dim - 1) or dim < 16:
        raise ValueError(f"head_dim {dim} must be a power of two >= 16")
    if out is None:
        out = torch.empty_like(q)
    if batch == 0 or width == 0 or q.shape[1] == 0:
        return out
    group = heads // kv_heads
    rows = width * group
    block_m, block_n, num_warps, num_stages = _launch_config(rows, dim)
    m_tiles = triton.cdiv(rows, block_m)
    max_blocks = block_tables.shape[1]
    if num_splits is None:
        num_splits = _choose_splits(m_tiles * batch * kv_heads, max_blocks * block_size, block_n, q.device)
    num_splits = max(1, int(num_splits))
    use_window = sliding_window is not None and sliding_window > 0
    precision = "ieee" if q.dtype == torch.float32 else "tf32"

    starts = starts.to(device=q.device)
    query_lens = query_lens.to(device=q.device)
    q_offsets = query_lens if q_offsets is None else q_offsets.to(device=q.device)  # unread unless packed
    if num_splits > 1:
        part_out = torch.empty((num_splits, batch, width, heads, dim), device=q.device, dtype=torch.float32)
        part_lse = torch.empty((num_splits, batch, width, heads), device=q.device, dtype=torch.float32)
    else:
        part_out = part_lse = out  # unused

    grid = (m_tiles, batch * kv_heads, num_splits)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        part_out,
        part_lse,
        block_tables,
        starts,
        query_lens,
        q_offsets,
        scale * math.log2(math.e),
        int(sliding_window) if use_window else 0,
        max_blocks,
        width,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *out.stride(),
        block_tables.stride(0),
        NUM_KV_HEADS=kv_heads,
        GROUP=group,
        HEAD_DIM=dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        USE_WINDOW=use_window,
        DOT_PRECISION=precision,
        UPCAST_DOT=_INTERPRET and q.dtype != torch.float32,
        PACKED=packed,
        num_warps=num_warps,
        num_stages=num_stages,
        **chain_launch(q.device),
    )
    if num_splits > 1:
        num_rows = batch * width * heads
        _merge_splits_kernel[(num_rows,)](
            part_out,
            part_lse,
            out,
            query_lens,
            q_offsets,
            num_rows,
            width,
            heads,
            *out.stride(),
            NUM_SPLITS=num_splits,
            SPLITS_P2=triton.next_power_of_2(num_splits),
            HEAD_DIM=dim,
            PACKED=packed,
            num_warps=1 if dim <= 64 else 2,
            **chain_launch(q.device),
        )
    return out


def write_kv_triton(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store keys/values [..., Hkv, D] into their flat paged slots; slot -1 is skipped. No host sync."""
    kv_heads, dim = k_cache.shape[2], k_cache.shape[3]
    slots = slot_mapping.reshape(-1)
    k = k.reshape(-1, kv_heads, dim)
    v = v.reshape(-1, kv_heads, dim)
    tokens = slots.shape[0]
    if tokens == 0:
        return
    _write_kv_kernel[(tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slots,
        *k.stride(),
        *v.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        NUM_KV_HEADS=kv_heads,
        HEAD_DIM=dim,
        HEADS_P2=triton.next_power_of_2(kv_heads),
        DIM_P2=triton.next_power_of_2(dim),
        BLOCK_SIZE=k_cache.shape[1],
        num_warps=1 if kv_heads * dim <= 1024 else 4,
        **chain_launch(k.device),
    )
