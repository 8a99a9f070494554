"""The few-row Triton GEMM (engine/cuda/skinny_gemm.py) against F.linear: every config form, row counts
that fill and that pad a row tile, K that does and does not divide the K tile, a bias, bf16 and fp32, and
the refusal of row counts a config cannot run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def operands(rows: int, n: int, k: int, dtype: torch.dtype, device: torch.device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    return x.to(device), w.to(device), b.to(device)


def picks(rows: int, dtype: torch.dtype, on_cuda: bool) -> list:
    """One config per form and row tile for `rows` (the smallest tiles), and on CUDA the plan's shortlist
    besides (every config's error on the 8B shapes is in `bench/gpu/skinny_sweep.py`'s output)."""
    from minedraft.engine.cuda.skinny_configs import configs_for, shortlist_for

    by_form: dict[tuple[str, int], object] = {}
    for c in sorted(configs_for(rows, dtype.itemsize), key=lambda c: (c.block_n * c.block_k, c.stages)):
        by_form.setdefault((c.form, c.block_m), c)
    extra = shortlist_for(rows, dtype.itemsize) if on_cuda else []
    return list(by_form.values()) + [c for c in extra if c not in by_form.values()]


@pytest.mark.parametrize("rows", [1, 5, 16, 33, 80])
@pytest.mark.parametrize("k", [512, 320], ids=["even-k", "ragged-k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_config_computes_the_linear(rows: int, k: int, dtype: torch.dtype, kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.skinny_gemm import skinny_linear

    n = 72  # not a multiple of any N tile: the last tile is masked
    x, w, b = operands(rows, n, k, dtype, kernel_device, rows * 1000 + k)
    want = (x.double() @ w.double().t() + b.double()).to("cpu")
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # bf16: one rounding of the float32 sum
    configs = picks(rows, dtype, kernel_device.type == "cuda")
    assert configs and all(c.fits(rows) for c in configs)
    assert {c.form for c in configs} >= {"dot", "swap"}
    if rows == 1:
        assert {c.form for c in configs} == {"fma", "dot", "swap"}
    for config in configs:
        got = skinny_linear(x.reshape(1, rows, k), w, b, config)
        assert got.shape == (1, rows, n) and got.dtype == dtype
        err = (got.reshape(rows, n).double().cpu() - want).abs().max().item() / want.abs().max().item()
        assert err < tol, config.name
        plain = skinny_linear(x, w, None, config)
        assert torch.allclose(plain.double().cpu(), (x.double() @ w.double().t()).cpu(), rtol=tol, atol=tol * 4)


def test_a_config_refuses_rows_it_cannot_hold(kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.skinny_configs import CONFIGS, MAX_ROWS, configs_for
    from minedraft.engine.cuda.skinny_gemm import skinny_linear

    x, w, _ = operands(17, 32, 64, torch.float32, kernel_device, 7)
    small = next(c for c in CONFIGS if c.form == "dot" and c.block_m == 16)
    fma = next(c for c in CONFIGS if c.form == "fma")
    with pytest.raises(ValueError, match="does not run 17 rows"):
        skinny_linear(x, w, None, small)
    with pytest.raises(ValueError, match="does not run 2 rows"):
        skinny_linear(x[:2], w, None, fma)
    assert configs_for(0) == [] and configs_for(MAX_ROWS + 1) == []
    assert all(c.block_m == MAX_ROWS == 128 for c in configs_for(MAX_ROWS)) and configs_for(65) == configs_for(128)
    assert F.linear(x, w).shape == skinny_linear(x, w, None, configs_for(17)[0]).shape


@pytest.mark.parametrize("rows", [1, 5, 33, 80])
@pytest.mark.parametrize("k", [512, 320], ids=["even-k", "ragged-k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_gated_form_is_the_plain_gemm_then_silu_times_up_bit_for_bit(
    rows: int, k: int, dtype: torch.dtype, kernel_device: torch.device
) -> None:
    """SwiGLU's gate/up GEMM with the activation in its epilogue gives exactly the bits of the same config's plain
    GEMM followed by the separate silu*up kernel (so the plan may swap one for the other freely), and both are
    silu(gate) * up within one rounding of a float64 reference."""
    from minedraft.engine.cuda.fused_kernels import silu_mul_triton
    from minedraft.engine.cuda.skinny_configs import shortlist_for
    from minedraft.engine.cuda.skinny_gemm import skinny_linear

    inter = 40  # not a multiple of any N tile: the last gate and up tiles are masked
    x, w, _ = operands(rows, 2 * inter, k, dtype, kernel_device, rows * 77 + k)
    gate, up = (x.double() @ w.double().t()).chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up).cpu()
    configs = picks(rows, dtype, False) + (shortlist_for(rows, dtype.itemsize, glu=True)
                                           if kernel_device.type == "cuda" else [])
    for config in configs:
        got = skinny_linear(x.reshape(1, rows, k), w, None, config, glu=True)
        assert got.shape == (1, rows, inter) and got.dtype == dtype
        two_kernels = silu_mul_triton(skinny_linear(x, w, None, config))
        assert torch.equal(got.reshape(rows, inter), two_kernels), config.name
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        err = (got.reshape(rows, inter).double().cpu() - want).abs().max().item() / want.abs().max().item()
        assert err < tol, config.name


def test_the_gated_form_refuses_a_bias_or_an_odd_weight(kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.skinny_configs import configs_for
    from minedraft.engine.cuda.skinny_gemm import skinny_linear

    x, w, b = operands(1, 32, 64, torch.float32, kernel_device, 3)
    config = configs_for(1)[0]
    with pytest.raises(ValueError, match="even number of weight rows"):
        skinny_linear(x, w, b, config, glu=True)
    with pytest.raises(ValueError, match="even number of weight rows"):
        skinny_linear(x, w[:31], None, config, glu=True)


def test_every_gated_shortlisted_config_fits_its_staged_tiles() -> None:
    pytest.importorskip("triton")
    from minedraft.engine.cuda.skinny_configs import BY_NAME, GLU_SHORTLIST, SMEM, shortlist_for

    for rows, names in GLU_SHORTLIST.items():
        assert [c.name for c in shortlist_for(rows, 2, glu=True)] == list(names)  # none dropped for bf16
        assert all(BY_NAME[n].staged_bytes(2, glu=True) <= SMEM for n in names)
    # the plain shortlist's two-stage-heavy tiles would not fit gated: the gated list is not the plain one
    assert shortlist_for(16, 2, glu=True) != shortlist_for(16, 2)


@pytest.mark.parametrize("rows", [20, 33, 80])
@pytest.mark.parametrize("k", [512, 320], ids=["even-k", "ragged-k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_split_k_configs_sum_their_shares_in_one_launch(rows: int, k: int, dtype: torch.dtype,
                                                        kernel_device: torch.device) -> None:
    """K split over 2 or 4 programs per tile (ragged K leaves a short or an empty last share): the linear with a
    bias within one rounding of float64, the same bits on a second call, every arrival count back at zero, and
    the gated form bit-identical to the split plain GEMM followed by silu*up."""
    from minedraft.engine.cuda.fp8_launch import ARRIVAL_COUNTS
    from minedraft.engine.cuda.fused_kernels import silu_mul_triton
    from minedraft.engine.cuda.skinny_configs import configs_for
    from minedraft.engine.cuda.skinny_gemm import skinny_linear

    n = 72
    x, w, b = operands(rows, n, k, dtype, kernel_device, rows * 31 + k)
    want = (x.double() @ w.double().t() + b.double()).cpu()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    by_kind: dict[tuple[str, int], object] = {}
    for c in configs_for(rows, dtype.itemsize):
        if c.split > 1:
            by_kind.setdefault((c.form, c.split), c)
    if dtype == torch.float32 and rows > 32:  # no 64- or 128-row split tile fits its staged float32 tiles
        assert not by_kind
        return
    assert {split for _, split in by_kind} == {2, 4}
    for config in by_kind.values():
        got = skinny_linear(x, w, b, config)
        err = (got.double().cpu() - want).abs().max().item() / want.abs().max().item()
        assert err < tol, config.name
        assert torch.equal(skinny_linear(x, w, b, config), got), config.name
        assert not ARRIVAL_COUNTS.by_device[x.device][: -(-n // config.block_n)].any(), config.name
        gated = skinny_linear(x, w, None, config, glu=True)
        assert torch.equal(gated, silu_mul_triton(skinny_linear(x, w, None, config))), config.name


def test_the_one_row_form_refuses_a_split(kernel_device: torch.device) -> None:
    import dataclasses

    from minedraft.engine.cuda.skinny_configs import BY_NAME
    from minedraft.engine.cuda.skinny_gemm import skinny_linear

    x, w, _ = operands(1, 32, 64, torch.float32, kernel_device, 9)
    with pytest.raises(ValueError, match="does not split K"):
        skinny_linear(x, w, None, dataclasses.replace(BY_NAME["fma1x8x512w4s3"], split=2))
