"""The decode GEMV (engine/cuda/bf16_gemv.py) against the unfused torch path: the plain product, the product of
rms_norm(x + residual) with the new residual stream, and the product of silu(gate) * up, with and without K
splits (the last program's ordered sum), with a bias, at 1..16 tokens."""

from __future__ import annotations

import pytest
import torch

from minedraft.engine.fused import add_rms_norm, silu_and_mul


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    scale = want.float().abs().max().item() + 1e-6
    assert (got.float() - want.float()).abs().max().item() <= tol * scale


@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_product(kernel_device: torch.device, split: int, m: int, dtype: torch.dtype) -> None:
    from minedraft.engine.cuda.bf16_gemv import gemv

    gen = torch.Generator().manual_seed(m * 10 + split)
    n, k = 96, 512
    x = torch.randn(m, k, generator=gen).to(dtype).to(kernel_device)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype).to(kernel_device)
    b = torch.randn(n, generator=gen).to(dtype).to(kernel_device)
    out, extra = gemv(x, w, b, config=(64, 128, split, 4, 2))
    assert extra is None and out.shape == (m, n) and out.dtype == dtype
    _close(out, (x.float() @ w.float().T + b.float()), dtype)


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_prologue(kernel_device: torch.device, with_residual: bool, split: int, dtype: torch.dtype) -> None:
    from minedraft.engine.cuda.bf16_gemv import gemv

    gen = torch.Generator().manual_seed(7 + split)
    m, n, k = 2, 80, 384
    x = (torch.randn(1, m, k, generator=gen) * 3).to(dtype).to(kernel_device)
    residual = torch.randn(1, m, k, generator=gen).to(dtype).to(kernel_device) if with_residual else None
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype).to(kernel_device)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype).to(kernel_device)
    out, stream = gemv(x, w, residual=residual, norm=(norm_w, 1e-5), config=(64, 128, split, 4, 2))
    h, want_stream = add_rms_norm(x, residual, norm_w, 1e-5, "torch")
    assert stream is not None
    _close(stream, want_stream, dtype)  # the residual add (exact in float32; the interpreter rounds bf16 its own way)
    assert out.shape == (1, m, n)
    _close(out, h.float() @ w.float().T, dtype)


@pytest.mark.parametrize("split", [1, 3])
def test_silu_prologue(kernel_device: torch.device, split: int) -> None:
    from minedraft.engine.cuda.bf16_gemv import gemv

    gen = torch.Generator().manual_seed(5)
    m, n, inter = 4, 64, 384
    dtype = torch.bfloat16
    gate_up = torch.randn(m, 2 * inter, generator=gen).to(dtype).to(kernel_device)
    w = (torch.randn(n, inter, generator=gen) * inter**-0.5).to(dtype).to(kernel_device)
    out, extra = gemv(gate_up, w, silu=True, config=(64, 128, split, 4, 2))
    assert extra is None
    act = silu_and_mul(gate_up.cpu(), "torch").to(kernel_device)  # the reference's rounding of the activation
    _close(out, act.float() @ w.float().T, dtype)


def test_refuses_what_it_cannot_take(kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.bf16_gemv import MAX_M, gemv

    w = torch.zeros(64, 256, device=kernel_device)
    with pytest.raises(ValueError, match="at most"):
        gemv(torch.zeros(MAX_M + 1, 256, device=kernel_device), w)
    with pytest.raises(ValueError, match="must divide"):
        gemv(torch.zeros(1, 256, device=kernel_device), w, config=(64, 128, 3, 4, 2))


def test_plan_splits_whole_blocks() -> None:
    from minedraft.engine.cuda.bf16_gemv import plan

    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        block_n, block_k, split, _, _ = plan(n, k, 132)
        assert (k // block_k) % split == 0
        assert -(-n // block_n) * split <= 4 * 132
