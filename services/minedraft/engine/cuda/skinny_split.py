"""The few-row GEMM with its K axis split over `config.split` programs per output tile, summed in one launch.

At 32-64 rows a projection's narrowest useful tiles leave an H100 or H200 with a few hundred programs, each
walking the whole K axis, so the short projections (`o`, `qkv`, `down` of the 8B shape) stream their weights at
72-82% of the copy rate (docs/benchmarks/gpu.md). Splitting K gives each tile `split` programs: each sums its
share of whole K tiles into a float32 workspace, and the tile's last program to arrive adds the shares in split
order, applies the epilogue (bias, or silu(gate) * up) and writes the output, then resets the tile's arrival
count for the next launch, as the FP8 GEMM's fused chunk sums do (`fp8_gemm.py`, sharing its counts,
`fp8_launch.ARRIVAL_COUNTS`). The order of the sum is fixed by the config, never by which program arrives last.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from minedraft.engine.cuda.fp8_launch import ARRIVAL_COUNTS
from minedraft.engine.cuda.paged_attention import _INTERPRET
from minedraft.engine.cuda.pdl import chain_wait_rows, gemm_chain_launch
from minedraft.engine.cuda.skinny_configs import SkinnyConfig
from minedraft.engine.cuda.skinny_loops import _pair_dot, _publish_share, _silu_times, _sum_shares


@triton.jit
def _skinny_split_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, M, N, K, k_per_split, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr, GLU: tl.constexpr, PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0,
    LINE: tl.constexpr = 64,
):
    pid_n = tl.program_id(0)
    share = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = share * k_per_split
    k_len = tl.minimum(k_per_split, K - k_lo)  # whole K tiles; the last share may be shorter or empty
    # on the dependent chain (pdl.py): this share's first weight blocks (gated: the up rows too), the wait
    chain_wait_rows(w_ptr + k_lo, offs_n, N, 2 * N if GLU else N, stride_wn, k_len, PDL, PREFETCH, BLOCK_K, LINE,
                    GLU)
    acc, acc_up = _pair_dot(x_ptr + k_lo, w_ptr + k_lo, M, k_len, stride_xm, stride_wn, offs_n, N, n_mask,
                            BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SWAP_AB, DOT_PRECISION, UPCAST_DOT, GLU)
    width = 2 * N if GLU else N  # a gated share keeps its gate sums, then its up sums
    if SWAP_AB:  # acc is [BLOCK_N, BLOCK_M]: features by rows
        cell = offs_m[None, :].to(tl.int64) * width + offs_n[:, None]
        mask = n_mask[:, None] & m_mask[None, :]
    else:
        cell = offs_m[:, None].to(tl.int64) * width + offs_n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
    arrived = _publish_share(part_ptr + share.to(tl.int64) * M * width, acc, acc_up, cell, mask, N, count_ptr + pid_n,
                             GLU)
    if arrived == SPLIT - 1:
        total, total_up = _sum_shares(part_ptr, M * width, tl.zeros_like(acc), tl.zeros_like(acc), cell, mask, N,
                                      count_ptr + pid_n, SPLIT, GLU)
        if GLU:
            total = _silu_times(total, total_up, y_ptr.dtype.element_ty)
        if SWAP_AB:
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
            y_ptrs = y_ptr + offs_m[None, :].to(tl.int64) * stride_ym + offs_n[:, None]
        else:
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mask)


def split_shares(k: int, config: SkinnyConfig) -> int:
    """K values per share: whole K tiles, as evenly as they divide."""
    tiles = triton.cdiv(k, config.block_k)
    return triton.cdiv(tiles, config.split) * config.block_k


def split_counts(config: SkinnyConfig, device: torch.device, tiles: int) -> tuple[SkinnyConfig, torch.Tensor | None]:
    """(config, its arrival counts) for a K-split config of `tiles` output tiles; a config that does not split
    comes back as it is, without counts, and so does the unsplit config where the counts cannot be made now
    (first use inside a CUDA graph capture). The one-row form has no split."""
    if config.split == 1:
        return config, None
    if config.form == "fma":
        raise ValueError(f"config {config.name}: the one-row form does not split K")
    counts = ARRIVAL_COUNTS.get(device, tiles)
    return (config, counts) if counts is not None else (dataclasses.replace(config, split=1), None)


def launch_split(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
                 config: SkinnyConfig, counts: torch.Tensor, glu: bool) -> None:
    """Run `config` (split > 1, its `counts` from `split_counts`) into y [rows, n]."""
    rows, n = y.shape
    k = weight.shape[1]
    per = split_shares(k, config)
    part = torch.empty((config.split, rows, 2 * n if glu else n), dtype=torch.float32, device=x2.device)
    _skinny_split_kernel[(triton.cdiv(n, config.block_n), config.split)](
        x2, weight, bias if bias is not None else weight, y, part, counts, rows, n, k, per, x2.stride(0),
        weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT=config.split, EVEN_K=k % config.block_k == 0,
        SWAP_AB=config.form == "swap", DOT_PRECISION="ieee" if x2.dtype == torch.float32 else "tf32",
        UPCAST_DOT=_INTERPRET and x2.dtype != torch.float32, GLU=glu,
        num_warps=config.warps, num_stages=config.stages, **gemm_chain_launch(x2.device, weight),
    )
