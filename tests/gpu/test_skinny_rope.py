"""The q/k/v projection with rotary embedding and the KV write in its epilogue (engine/cuda/skinny_rope.py): the
same q and the same cache contents, bit for bit, as the same config's plain GEMM followed by the rope+store
kernel, for every form, GQA and plain heads, a bias, skipped slots; and the configs it refuses."""

from __future__ import annotations

import pytest
import torch

BLOCK_SIZE = 4


def setup(rows: int, heads: int, kv_heads: int, head_dim: int, hidden: int, dtype: torch.dtype,
          device: torch.device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    width = (heads + 2 * kv_heads) * head_dim
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    w = (torch.randn(width, hidden, generator=gen) * 0.05).to(dtype)
    bias = torch.randn(width, generator=gen).to(dtype)
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 50.0
    emb = torch.cat((angles, angles), dim=-1)
    blocks = 2 * rows // BLOCK_SIZE + 2
    cache = torch.randn(blocks, BLOCK_SIZE, kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(blocks * BLOCK_SIZE, generator=gen)[:rows]
    slots[1::3] = -1  # not stored (a padding token)
    to = dict(device=device)
    return (x.to(**to), w.to(**to), bias.to(**to), emb.cos().to(**to), emb.sin().to(**to), slots.to(**to),
            cache.to(**to))


def both_ways(x, w, b, config, cos, sin, slots, cache, heads: int, kv_heads: int, head_dim: int):  # type: ignore[no-untyped-def]
    """(q, k cache, v cache) written by the config's plain GEMM followed by the rope+store kernel, then by the fused
    kernel, each from its own copy of the caches."""
    from minedraft.engine.cuda.fused_kernels import rope_store_triton
    from minedraft.engine.cuda.skinny_gemm import skinny_linear
    from minedraft.engine.cuda.skinny_rope import skinny_qkv_rope

    rows, hidden = x.shape
    trig = (cos.view(1, rows, 1, -1), sin.view(1, rows, 1, -1))
    k_want, v_want = cache.clone(), (cache * 2).clone()
    qkv = skinny_linear(x.view(1, rows, hidden), w, b, config)
    q_want = rope_store_triton(qkv, *trig, slots, k_want, v_want, heads, kv_heads, head_dim)
    k_got, v_got = cache.clone(), (cache * 2).clone()
    q_got = skinny_qkv_rope(x.view(1, rows, hidden), w, b, config, trig, slots, (k_got, v_got), heads, kv_heads,
                            head_dim)
    return (q_want, k_want, v_want), (q_got, k_got, v_got)


def configs(rows: int, head_dim: int, dtype: torch.dtype, on_cuda: bool) -> list:
    """The smallest config of each form and row tile that fits the heads, and on CUDA the plan's shortlist."""
    from minedraft.engine.cuda.skinny_configs import configs_for
    from minedraft.engine.cuda.skinny_rope import fits_heads, rope_shortlist

    by_form: dict[str, object] = {}
    for c in sorted(configs_for(rows, dtype.itemsize), key=lambda c: (c.block_n * c.block_k, c.stages)):
        if fits_heads(c, head_dim):
            by_form.setdefault(c.form, c)
    extra = rope_shortlist(rows, head_dim, dtype.itemsize) if on_cuda else []
    return list(by_form.values()) + [c for c in extra if c not in by_form.values()]


@pytest.mark.parametrize("rows", [1, 6, 80])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 32), (2, 2, 64)], ids=["gqa", "mha"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_the_fused_projection_writes_what_the_gemm_and_rope_store_write(
    rows: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, with_bias: bool,
    kernel_device: torch.device,
) -> None:

    hidden = 96  # not a multiple of 64: the K tail is masked for most tiles
    x, w, bias, cos, sin, slots, cache = setup(rows, heads, kv_heads, head_dim, hidden, dtype, kernel_device,
                                               rows * 10 + head_dim)
    b = bias if with_bias else None
    picked = configs(rows, head_dim, dtype, kernel_device.type == "cuda")
    if rows > 64 and head_dim // 2 < 32:  # the 128-row tiles are 32 features wide or more: none fits a half-head
        assert picked == []
        return
    assert {c.form for c in picked} >= ({"fma", "dot"} if rows == 1 else {"dot"})
    for config in picked:
        want, got = both_ways(x, w, b, config, cos, sin, slots, cache, heads, kv_heads, head_dim)
        assert got[0].shape == (1, rows, heads, head_dim)
        assert all(torch.equal(g, e) for g, e in zip(got, want, strict=True)), config.name
        assert not torch.equal(got[1], cache)  # something was stored (and slot -1 rows were not: equal above)


def test_the_fused_projection_refuses_what_it_cannot_run(kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.skinny_configs import BY_NAME
    from minedraft.engine.cuda.skinny_rope import skinny_qkv_rope

    x, w, _, cos, sin, slots, cache = setup(1, 4, 2, 32, 64, torch.float32, kernel_device, 5)
    args = ((cos, sin), slots, (cache, cache.clone()), 4, 2, 32)
    with pytest.raises(ValueError, match="do not divide half"):
        skinny_qkv_rope(x, w, None, BY_NAME["dot16x32x128w4s3"], *args)  # 32-wide tiles, 16-wide half heads
    with pytest.raises(ValueError, match="fused q/k/v projection"):
        skinny_qkv_rope(x, w[:-1], None, BY_NAME["fma1x8x512w4s3"], *args)
    with pytest.raises(ValueError, match="does not run 2 rows"):
        skinny_qkv_rope(torch.cat((x, x)), w, None, BY_NAME["fma1x8x512w4s3"], *args)


@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_k_split_fused_projection_writes_what_the_split_gemm_and_rope_store_write(
    split: int, dtype: torch.dtype, kernel_device: torch.device
) -> None:
    """K split over 2 or 4 programs per tile (320 = 2.5 K tiles: a short and, at 4, an empty last share): the
    same q and cache bits as the same split config's plain GEMM followed by the rope+store kernel, and every
    arrival count back at zero."""
    import dataclasses

    from minedraft.engine.cuda.fp8_launch import ARRIVAL_COUNTS

    rows, heads, kv_heads, head_dim, hidden = 6, 4, 2, 64, 320
    x, w, bias, cos, sin, slots, cache = setup(rows, heads, kv_heads, head_dim, hidden, dtype, kernel_device, 77)
    for base in configs(rows, head_dim, dtype, False):
        config = dataclasses.replace(base, split=split, block_k=128)
        want, got = both_ways(x, w, bias, config, cos, sin, slots, cache, heads, kv_heads, head_dim)
        assert all(torch.equal(g, e) for g, e in zip(got, want, strict=True)), config.name
        assert not ARRIVAL_COUNTS.by_device[x.device][:64].any(), config.name
