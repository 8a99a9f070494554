"""Triton GEMV for decode-sized batches (M <= 16 tokens) of dense weights, with the layer's element-wise
step before it folded in.

Why: at batch 1 a decoder layer of the 8B shape is four weight streams (qkv, o, gate/up, down) and the
small kernels between them; each kernel boundary costs a few microseconds of drain and ramp even
inside a CUDA graph, and cuBLAS adds a split-K reduction kernel to the small projections. This kernel
reads the weights once in `split` programs along K per 64/128-row tile, the tile's last program to
finish adding the partial sums in split order (arrival counts, as the FP8 GEMM's fused sums), and
computes its input on the fly:

- `norm`: rms_norm(x + residual) * weight, the residual add and norm of `fused.add_rms_norm` (every
  program takes the row's sum of squares over all of K, then normalises its own K slice; the first
  tile's first split writes the new residual stream), so the norm kernel before qkv and gate/up goes;
- `silu`: silu(gate) * up from the fused gate/up output, so the activation kernel before down goes.

Both round where the unfused kernels round (`fused_kernels.py`); the norm's float32 sum runs in another
order. The product uses the tensor cores (tokens padded to a 16-wide tile) with float32 sums. Outputs
come from torch.empty and nothing synchronises, so it is safe inside CUDA graph capture.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from minedraft.engine.cuda.fp8_launch import ARRIVAL_COUNTS, multiprocessors
from minedraft.engine.cuda.paged_attention import _INTERPRET  # the interpreter's mode (and its shim)

MAX_M = 16  # tokens per launch this path takes (one token tile)
PLAIN, NORM, SILU = 0, 1, 2
NORM_CHUNK = 1024  # columns per step of the norm's sum of squares


@triton.jit
def _load_input(x_ptr, res_ptr, nw_ptr, offs_t, k, t_mask, k_mask, K, stride_x, inv,
                PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr):
    """This K slice of the GEMV's input, in the activation dtype (rounded as the unfused kernels round)."""
    mask = t_mask[:, None] & k_mask[None, :]
    rows = offs_t[:, None].to(tl.int64) * stride_x
    if PROLOGUE == 2:  # silu(gate) * up, gate and up side by side in a [M, 2K] row
        g = tl.load(x_ptr + rows + k[None, :], mask=mask, other=0.0)
        u = tl.load(x_ptr + rows + K + k[None, :], mask=mask, other=0.0)
        gf = g.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
        return (act * u.to(tl.float32)).to(g.dtype)
    x = tl.load(x_ptr + rows + k[None, :], mask=mask, other=0.0)
    if PROLOGUE == 1:
        dtype = x.dtype
        if HAS_RES:
            r = tl.load(res_ptr + offs_t[:, None].to(tl.int64) * K + k[None, :], mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        y = (x.to(tl.float32) * inv[:, None]).to(dtype).to(tl.float32)
        w = tl.load(nw_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        x = (y * w[None, :]).to(dtype)
    return x


@triton.jit(do_not_specialize=["M", "kb_per_prog"])
def _gemv_kernel(
    x_ptr, res_ptr, res_out_ptr, nw_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, count_ptr,
    M, N, stride_x, eps, kb_per_prog, K: tl.constexpr,
    PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_t = tl.arange(0, BLOCK_T)
    n_mask = offs_n < N
    t_mask = offs_t < M
    inv = tl.zeros((BLOCK_T,), tl.float32)
    if PROLOGUE == 1:  # the row's inverse RMS over all of K (and, once, the new residual stream)
        sq = tl.zeros((BLOCK_T,), tl.float32)
        writer = (pid_n == 0) & (pid_s == 0)
        for k0 in tl.static_range(0, K, NORM_BLOCK):  # unrolled: the row's loads all in flight at once
            c = k0 + tl.arange(0, NORM_BLOCK)
            mask = t_mask[:, None] & (c < K)[None, :]
            xn = tl.load(x_ptr + offs_t[:, None].to(tl.int64) * stride_x + c[None, :], mask=mask, other=0.0)
            if HAS_RES:
                r = tl.load(res_ptr + offs_t[:, None].to(tl.int64) * K + c[None, :], mask=mask, other=0.0)
                xn = (xn.to(tl.float32) + r.to(tl.float32)).to(xn.dtype)
                if writer:
                    tl.store(res_out_ptr + offs_t[:, None].to(tl.int64) * K + c[None, :], xn, mask=mask)
            h = xn.to(tl.float32)
            sq += tl.sum(h * h, 1)
        inv = tl.math.rsqrt(sq / K + eps)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
    kb_lo = pid_s * kb_per_prog
    for kb in range(kb_lo, kb_lo + kb_per_prog):
        k = kb * BLOCK_K + offs_k
        k_mask = k < K
        w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * K + k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0)
        x = _load_input(x_ptr, res_ptr, nw_ptr, offs_t, k, t_mask, k_mask, K, stride_x, inv, PROLOGUE, HAS_RES)
        if UPCAST:  # the interpreter multiplies in float32 (the same products, exactly)
            acc += tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)))
        elif w.dtype == tl.float32:  # float32 weights: full-precision products, not TF32
            acc += tl.dot(w, tl.trans(x.to(w.dtype)), input_precision="ieee")
        else:
            acc += tl.dot(w, tl.trans(x.to(w.dtype)))
    tile_mask = n_mask[:, None] & t_mask[None, :]
    if SPLIT == 1:
        _write_out(acc, bias_ptr, out_ptr, offs_n, offs_t, n_mask, tile_mask, N, HAS_BIAS)
    else:
        parts = part_ptr + offs_t[None, :] * N + offs_n[:, None]
        tl.store(parts + pid_s * M * N, acc, mask=tile_mask)
        tl.debug_barrier()
        count = count_ptr + pid_n
        arrived = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:  # the last to arrive adds every split's sums, in split order
            total = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
            for s in range(0, SPLIT):
                total += tl.load(parts + s * M * N, mask=tile_mask, other=0.0, cache_modifier=".cg")
            _write_out(total, bias_ptr, out_ptr, offs_n, offs_t, n_mask, tile_mask, N, HAS_BIAS)
            tl.store(count, 0)


@triton.jit
def _write_out(total, bias_ptr, out_ptr, offs_n, offs_t, n_mask, tile_mask, N, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + offs_t[None, :] * N + offs_n[:, None], total.to(out_ptr.dtype.element_ty), mask=tile_mask)


@functools.cache
def plan(n: int, k: int, sms: int) -> tuple[int, int, int, int, int]:
    """(block_n, block_k, split, warps, stages) for an [n, k] weight: 64-row tiles, and K split so that
    about four programs per multiprocessor stream the weight (each split whole 128-wide K blocks)."""
    block_n, block_k = 64, 128
    tiles = -(-n // block_n)
    blocks = -(-k // block_k)
    split = 1
    for candidate in range(1, blocks + 1):
        if blocks % candidate == 0 and tiles * candidate <= 4 * sms:
            split = candidate
    return block_n, block_k, split, 4, 4


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         residual: torch.Tensor | None = None, norm: tuple[torch.Tensor, float] | None = None,
         silu: bool = False, config: tuple[int, int, int, int, int] | None = None,
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [..., K] (or, with `silu`, gate/up [..., 2K]) times weight [N, K]^T, M <= MAX_M tokens.

    With `norm` (weight, eps) the product is of rms_norm(x + residual) and the new residual stream
    comes back second (x itself without a residual); otherwise the second value is None."""
    n, k = weight.shape
    width = 2 * k if silu else k
    x2 = x.reshape(-1, width)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m > MAX_M:
        raise ValueError(f"gemv takes at most {MAX_M} tokens, got {m}")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    res_out: torch.Tensor | None = None
    res_in = x2
    if norm is not None:
        if residual is None:
            res_out = x
        else:
            res_in = residual.reshape(-1, k).contiguous()
            res_out = torch.empty_like(x)
    if m == 0:
        return out.reshape(*x.shape[:-1], n), res_out
    block_n, block_k, split, warps, stages = config or plan(n, k, multiprocessors(x.device))
    if triton.cdiv(k, block_k) % split:
        raise ValueError(f"split {split} must divide the {triton.cdiv(k, block_k)} K blocks of {block_k}")
    tiles = triton.cdiv(n, block_n)
    counts = ARRIVAL_COUNTS.get(x.device, tiles) if split > 1 else None
    if split > 1 and counts is None:  # inside a capture with no counts made yet: one program per tile
        split = 1
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    prologue = NORM if norm is not None else SILU if silu else PLAIN
    _gemv_kernel[(tiles, split)](
        x2, res_in, res_out if res_out is not None and residual is not None else out,
        norm[0] if norm is not None else weight, weight, bias if bias is not None else out, out, part,
        counts if counts is not None else out,
        m, n, x2.stride(0), norm[1] if norm is not None else 0.0, triton.cdiv(k, block_k) // split, k,
        PROLOGUE=prologue, HAS_RES=residual is not None, HAS_BIAS=bias is not None, SPLIT=split,
        BLOCK_N=block_n, BLOCK_T=16, BLOCK_K=block_k, NORM_BLOCK=min(NORM_CHUNK, triton.next_power_of_2(k)),
        UPCAST=_INTERPRET,
        num_warps=warps, num_stages=stages,
    )
    return out.reshape(*x.shape[:-1], n), res_out
