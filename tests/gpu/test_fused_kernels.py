"""The fused element-wise Triton kernels against `engine/fused.py`'s torch code on the same inputs:
add+RMSNorm (with and without a residual), rope + KV store from a fused qkv tensor (with a
padding slot), silu * up."""

from __future__ import annotations

import pytest
import torch

BLOCK_SIZE = 16
DTYPES = pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float().cpu(), want.float().cpu()
    return float((got - want).norm() / want.norm().clamp(min=1e-30))


@DTYPES
@pytest.mark.parametrize("rows, cols, with_res", [(1, 4096, False), (3, 4096, True), (5, 1000, True),
                                                  (2, 128, True)])
def test_add_rms_norm(dtype: torch.dtype, tol: float, rows: int, cols: int, with_res: bool,
                      kernel_device: torch.device) -> None:
    from minedraft.engine import fused
    from minedraft.engine.cuda.fused_kernels import add_rms_norm_triton

    gen = torch.Generator().manual_seed(rows * cols)
    x = torch.randn(rows, cols, generator=gen).to(dtype)
    res = torch.randn(rows, cols, generator=gen).to(dtype) if with_res else None
    w = (1 + 0.1 * torch.randn(cols, generator=gen)).to(dtype)
    ref_out, ref_res = fused.add_rms_norm(x, res, w, 1e-5, "torch")
    res_dev = None if res is None else res.to(kernel_device)
    out, new_res = add_rms_norm_triton(x.to(kernel_device), res_dev, w.to(kernel_device), 1e-5)
    assert rel(out, ref_out) < tol
    assert rel(new_res, ref_res) < tol


@DTYPES
@pytest.mark.parametrize("batch, width, heads, kvh, dim", [(1, 1, 32, 8, 128), (3, 5, 16, 4, 128), (2, 3, 7, 1, 64),
                                                           (4, 1, 4, 2, 32)])
def test_rope_store(dtype: torch.dtype, tol: float, batch: int, width: int, heads: int, kvh: int, dim: int,
                    kernel_device: torch.device) -> None:
    from minedraft.engine import fused
    from minedraft.engine.attention import AttentionMetadata
    from minedraft.engine.cuda.fused_kernels import rope_store_triton

    gen = torch.Generator().manual_seed(batch * 1000 + heads)
    blocks = 16
    qkv = torch.randn(batch, width, (heads + 2 * kvh) * dim, generator=gen).to(dtype)
    pos = torch.randint(0, 200, (batch, width), generator=gen)
    slots = torch.randperm(blocks * BLOCK_SIZE, generator=gen)[: batch * width].view(batch, width)
    slots[0, -1] = -1  # a padding token: stores nothing
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = pos.float().unsqueeze(-1) * inv
    emb = torch.cat((freqs, freqs), -1).unsqueeze(-2)
    cos, sin = emb.cos(), emb.sin()
    meta = AttentionMetadata(pos, slots, torch.zeros(batch, 1, dtype=torch.long), pos[:, 0],
                             torch.full((batch,), width), backend="torch")
    kc = torch.zeros(blocks, BLOCK_SIZE, kvh, dim, dtype=dtype)
    vc = torch.zeros(blocks, BLOCK_SIZE, kvh, dim, dtype=dtype)
    ref_q = fused.rope_and_store(qkv, (cos, sin), (kc, vc), meta, heads, kvh, dim)
    dkc, dvc = torch.zeros_like(kc, device=kernel_device), torch.zeros_like(vc, device=kernel_device)
    q = rope_store_triton(qkv.to(kernel_device), cos.to(kernel_device), sin.to(kernel_device),
                          slots.to(kernel_device), dkc, dvc, heads, kvh, dim)
    assert rel(q, ref_q) < tol
    assert rel(dkc, kc) < tol
    assert rel(dvc, vc) < tol


@DTYPES
@pytest.mark.parametrize("rows, inter", [(1, 14336), (6, 1000)])
def test_silu_mul(dtype: torch.dtype, tol: float, rows: int, inter: int, kernel_device: torch.device) -> None:
    from minedraft.engine import fused
    from minedraft.engine.cuda.fused_kernels import silu_mul_triton

    gate_up = torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(rows)).to(dtype)
    assert rel(silu_mul_triton(gate_up.to(kernel_device)), fused.silu_and_mul(gate_up, "torch")) < tol
