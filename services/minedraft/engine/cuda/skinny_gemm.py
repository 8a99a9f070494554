"""Triton GEMMs for the few-row projections of decode and verify: y = x @ W^T (+ bias), one kernel per call.

At 1-128 rows a projection only streams its weight: the 8B shape's `o` (4096 x 4096) reads 33.5 MB, about
8 us at an H200's copy rate, and cuBLAS spends 12.7 us on it in two kernels (a split-K GEMM and its
reduction), `qkv` 15.4 us for an 11.9 us bound (docs/benchmarks/gpu.md). Short kernels lose most to their
ramp and tail, so these keep a single kernel and fill the GPU with narrow output tiles instead of splitting
the reduction: a program owns BLOCK_N output features for every row and walks the whole K axis in BLOCK_K
steps, so each weight byte is read once and nothing needs a second pass.

Two forms of the inner product:
- `dot`: a [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] tensor-core product per step (rows padded to BLOCK_M, at
  least 16), for any row count up to BLOCK_M.
- `swap`: the same product with the operands swapped, W [BLOCK_N, BLOCK_K] x x^T [BLOCK_K, BLOCK_M], so the
  tensor cores' tall side holds output features (64 or 128) and the few rows are the short side.
- `fma` (one row only): element-wise products accumulated in a [BLOCK_N, BLOCK_K] float32 tile and summed at
  the end, which allows tiles narrower than the tensor cores' 16 features.

Gated (`glu=True`, SwiGLU's gate/up projection): the weight is the fused [2 I, K] gate/up matrix and the
output is silu(gate) * up, [rows, I]. A program owns BLOCK_N gate features and the same BLOCK_N up features
(two weight tiles, two accumulators), so the activation is applied in the epilogue and the layer's separate
silu*up kernel and its [rows, 2 I] round trip disappear. Each gate and up value is summed exactly as the
plain kernel of the same config sums it and rounded to the activation dtype before the activation, which
rounds where `fused_kernels.silu_mul_triton` does: the gated kernel gives the same bits as that config's
plain GEMM followed by the silu*up kernel.

Which config a shape runs is the BLAS plan's choice (`engine/blas_plan.py`): it times these next to cuBLAS
and cuBLASLt over the model's own weights and keeps the fastest. Accumulation is float32 and the output is
rounded once to the activation dtype, as cuBLAS does; only the order of the sum differs. No host sync; the
output comes from `torch.empty`, so the kernel is safe inside CUDA-graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minedraft.engine.cuda.paged_attention import _INTERPRET
from minedraft.engine.cuda.pdl import chain_wait_rows, gemm_chain_launch
from minedraft.engine.cuda.skinny_configs import SkinnyConfig
from minedraft.engine.cuda.skinny_loops import _pair_dot, _pair_fma, _silu_times
from minedraft.engine.cuda.skinny_split import launch_split, split_counts


@triton.jit
def _skinny_dot_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
    GLU: tl.constexpr, PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0, LINE: tl.constexpr = 64,
):
    pid_n = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # on the dependent chain (pdl.py): this program's first weight blocks (gated: the up rows too), the wait
    chain_wait_rows(w_ptr, offs_n, N, 2 * N if GLU else N, stride_wn, K, PDL, PREFETCH, BLOCK_K, LINE, GLU)
    # gated: the up rows follow the N gate rows
    acc, acc_up = _pair_dot(x_ptr, w_ptr, M, K, stride_xm, stride_wn, offs_n, N, n_mask, BLOCK_M, BLOCK_N,
                            BLOCK_K, EVEN_K, SWAP_AB, DOT_PRECISION, UPCAST_DOT, GLU)
    if GLU:
        acc = _silu_times(acc, acc_up, y_ptr.dtype.element_ty)
    if SWAP_AB:  # acc is [BLOCK_N, BLOCK_M]: features by rows
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        y_ptrs = y_ptr + offs_m[None, :].to(tl.int64) * stride_ym + offs_n[:, None]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _skinny_fma_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    GLU: tl.constexpr, PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0, LINE: tl.constexpr = 64,
):
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    # on the dependent chain (pdl.py): this program's first weight blocks (gated: the up rows too), the wait
    chain_wait_rows(w_ptr, offs_n, N, 2 * N if GLU else N, stride_wn, K, PDL, PREFETCH, BLOCK_K, LINE, GLU)
    y, y_up = _pair_fma(x_ptr, w_ptr, K, stride_wn, offs_n, N, n_mask, BLOCK_N, BLOCK_K, EVEN_K, GLU)
    if GLU:
        y = _silu_times(y, y_up, y_ptr.dtype.element_ty)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def token_rows(x: torch.Tensor, k: int, config: SkinnyConfig) -> torch.Tensor:
    """x [..., K] as [rows, K] with contiguous rows, refused when `config` cannot run that many rows."""
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    if not config.fits(rows) or (config.form == "fma" and rows != 1):
        raise ValueError(f"config {config.name} does not run {rows} rows")
    return x2


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: SkinnyConfig, glu: bool = False
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x [..., K] of at most `config.block_m` rows, weight [N, K]; with `glu`,
    weight is a fused gate/up [2 I, K] (no bias) and the result silu(gate) * up, [..., I]."""
    n, k = weight.shape
    if weight.stride(1) != 1:
        raise ValueError("the weight's rows must be contiguous")
    if glu:
        if bias is not None or n % 2:
            raise ValueError("a gated GEMM takes an even number of weight rows (gate, then up) and no bias")
        n //= 2
    x2 = token_rows(x, k, config)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0 or n == 0:
        return y.reshape(*x.shape[:-1], n)
    config, counts = split_counts(config, x.device, triton.cdiv(n, config.block_n))
    if counts is not None:
        launch_split(x2, weight, bias, y, config, counts, glu)
        return y.reshape(*x.shape[:-1], n)
    b = bias if bias is not None else weight  # unread without a bias
    grid = (triton.cdiv(n, config.block_n),)
    even_k = k % config.block_k == 0
    chain = gemm_chain_launch(x.device, weight)
    if config.form == "fma":
        _skinny_fma_kernel[grid](
            x2, weight, b, y, n, k, weight.stride(0),
            HAS_BIAS=bias is not None, BLOCK_N=config.block_n, BLOCK_K=config.block_k, EVEN_K=even_k, GLU=glu,
            num_warps=config.warps, num_stages=config.stages, **chain,
        )
    else:
        _skinny_dot_kernel[grid](
            x2, weight, b, y, rows, n, k, x2.stride(0), weight.stride(0), y.stride(0),
            HAS_BIAS=bias is not None, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            EVEN_K=even_k, SWAP_AB=config.form == "swap",
            DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            UPCAST_DOT=_INTERPRET and x.dtype != torch.float32, GLU=glu,
            num_warps=config.warps, num_stages=config.stages, **chain,
        )
    return y.reshape(*x.shape[:-1], n)
