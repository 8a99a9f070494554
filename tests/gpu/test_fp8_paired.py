"""The FP8 GEMM with the next kernel in its epilogue (engine/cuda/fp8_paired.py): gate/up gives the bits of the
FP8 GEMM followed by the silu*up kernel, and q/k/v the q and the cache contents of the FP8 GEMM followed by the
rope+store kernel, for both weight layouts, every way of cutting K (one program, chunk ends inside it, a split
with fused sums), pointer or tensor-memory loads, activations quantized inside or before, a bias and skipped
slots; and the shapes it leaves to the two kernels."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.kernel_mode import kernel_mode
from tests.gpu.test_fp8_on_cuda import fp8_weight

QUICK = kernel_mode().interpreted
ROWS = [1, 5] if QUICK else [1, 5, 16]
HIDDEN = 384  # three 128-wide K blocks: one chunk or three
BLOCK_SIZE = 4


def tiles(chunks: int) -> list:
    """Pair tiles (rows per tile of the pair) covering the kernel's paths for this chunk count."""
    from minedraft.engine.cuda.fp8_tiles import Tile

    found = [Tile(64, 16, 4, 2), Tile(64, 16, 4, 3, tma=True), Tile(64, 16, 4, 2, prequant=True)]
    if chunks > 1:
        found.append(Tile(64, 16, 4, 2, split=chunks, fused=True))
    if not QUICK:
        found += [Tile(128, 16, 4, 3, tma=True), Tile(64, 32, 4, 3, split=chunks, fused=True, tma=True)]
    return [t for t in found if chunks % t.split == 0]


@pytest.mark.parametrize("scheme", ["block", "channel"])
@pytest.mark.parametrize("chunks", [1, 3])
def test_gate_up_with_silu_gives_the_gemm_then_silu_mul_bits(scheme: str, chunks: int,
                                                             kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.fp8_gemm import fp8_gemm_with
    from minedraft.engine.cuda.fp8_paired import fp8_paired_with
    from minedraft.engine.cuda.fp8_tiles import Tile
    from minedraft.engine.cuda.fused_kernels import silu_mul_triton

    inter = 192  # not a multiple of the 64-row tile: the last tile's rows past I are masked
    weight = fp8_weight(2 * inter, HIDDEN, scheme, 128, kernel_device, seed=3)
    for rows in ROWS:
        x = (torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows)) * 2).to(torch.bfloat16)
        x = x.to(kernel_device)
        want = silu_mul_triton(fp8_gemm_with(x, weight, chunks, Tile(128, 16, 4, 2)))
        for tile in tiles(chunks):
            got = fp8_paired_with(x, weight, None, None, chunks, tile)
            assert got is not None and got.shape == (rows, inter)
            assert torch.equal(got, want), f"rows {rows}, {tile}"


def rope_inputs(rows: int, heads: int, kv_heads: int, head_dim: int, device: torch.device):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(rows + heads)
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 50.0
    emb = torch.cat((angles, angles), dim=-1)
    blocks = 2 * rows // BLOCK_SIZE + 2
    cache = torch.randn(blocks, BLOCK_SIZE, kv_heads, head_dim, generator=gen).to(torch.bfloat16)
    slots = torch.randperm(blocks * BLOCK_SIZE, generator=gen)[:rows]
    slots[1::3] = -1  # not stored (a padding token)
    bias = torch.randn((heads + 2 * kv_heads) * head_dim, generator=gen).to(torch.bfloat16)
    return emb.cos().to(device), emb.sin().to(device), slots.to(device), cache.to(device), bias.to(device)


@pytest.mark.parametrize("scheme", ["block", "channel"])
@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_qkv_with_rope_writes_what_the_gemm_and_rope_store_write(scheme: str, chunks: int, with_bias: bool,
                                                                 kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.fp8_gemm import fp8_gemm_with
    from minedraft.engine.cuda.fp8_paired import Rope, fp8_paired_with
    from minedraft.engine.cuda.fp8_tiles import Tile
    from minedraft.engine.cuda.fused_kernels import rope_store_triton

    heads, kv_heads, head_dim = 2, 1, 128
    weight = fp8_weight((heads + 2 * kv_heads) * head_dim, HIDDEN, scheme, 128, kernel_device, seed=4)
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
        x = x.to(kernel_device)
        cos, sin, slots, cache, bias = rope_inputs(rows, heads, kv_heads, head_dim, kernel_device)
        b = bias if with_bias else None
        k_want, v_want = cache.clone(), (cache * 2).clone()
        qkv = fp8_gemm_with(x, weight, chunks, Tile(128, 16, 4, 2), b).view(1, rows, -1)
        q_want = rope_store_triton(qkv, cos.view(1, rows, 1, -1), sin.view(1, rows, 1, -1), slots, k_want, v_want,
                                   heads, kv_heads, head_dim)
        for tile in [t for t in tiles(chunks) if (head_dim // 2) % t.block_n == 0]:  # whole tiles per half head
            k_got, v_got = cache.clone(), (cache * 2).clone()
            rope = Rope(cos, sin, slots, k_got, v_got, heads, kv_heads, head_dim)
            q_got = fp8_paired_with(x.view(1, rows, HIDDEN), weight, b, rope, chunks, tile)
            assert q_got is not None and q_got.shape == (1, rows, heads, head_dim)
            assert torch.equal(q_got, q_want), f"q, rows {rows}, {tile}"
            assert torch.equal(k_got, k_want) and torch.equal(v_got, v_want), f"cache, rows {rows}, {tile}"


def test_shapes_it_leaves_to_the_two_kernels(kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.fp8_paired import Rope, fp8_paired_with
    from minedraft.engine.cuda.fp8_tiles import Tile

    weight = fp8_weight(4 * 128, HIDDEN, "block", 128, kernel_device)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16).to(kernel_device)
    cos, sin, slots, cache, _ = rope_inputs(2, 2, 1, 128, kernel_device)
    rope = Rope(cos, sin, slots, cache, cache.clone(), 2, 1, 128)
    assert fp8_paired_with(x, weight, None, None, 1, Tile(128, 64, 4, 2, prequant=True, direct=True)) is None
    assert fp8_paired_with(x, weight, None, None, 1, Tile(32, 16, 4, 2)) is None  # under the MMA's 64 rows
    assert fp8_paired_with(x, weight, None, rope, 1, Tile(128, 16, 4, 2)) is None  # wider than half a head
    assert fp8_paired_with(x, weight, torch.zeros(512, dtype=torch.bfloat16, device=kernel_device), None, 1,
                           Tile(64, 16, 4, 2)) is None  # gate/up takes no bias
    wrong = Rope(cos, sin, slots, cache, cache.clone(), 3, 1, 128)  # the weight is not (3 + 2) heads wide
    assert fp8_paired_with(x, weight, None, wrong, 1, Tile(64, 16, 4, 2)) is None


def test_an_fp8_engine_gives_the_same_tokens_with_the_epilogues_on_and_off(
        cuda_device: torch.device, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Greedy AR on a model whose heads are 128 wide (so both epilogues run, wired into the layers), in FP8 with
    either weight layout: the tokens with the paired kernel equal those with the GEMM and the next kernel apart."""
    from dataclasses import replace

    from minedraft.bench import synthetic_pair
    from minedraft.bench.fp8_quantizer import quantize_model
    from minedraft.core.sampling_params import SamplingParams
    from minedraft.core.tokenizer import Tokenizer
    from minedraft.engine import fp8_linear
    from minedraft.engine.cuda import fp8_paired
    from minedraft.engine.llm_engine import EngineConfig, LLMEngine
    from minedraft.engine.runner import ModelRunner
    from minedraft.engine.verifier import Verifier
    from tests.conftest import write_word_tokenizer

    shape = replace(synthetic_pair.SHAPES["small"], hidden_size=512, intermediate_size=1024, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=128)
    monkeypatch.setitem(synthetic_pair.SHAPES, "paired-test", shape)
    write_word_tokenizer(tmp_path, shape.vocab_size, eos_id=0)
    ran: list[bool] = []
    real = fp8_paired.fp8_paired_with

    def counted(x, weight, bias, rope, chunks, tile):  # type: ignore[no-untyped-def]
        out = real(x, weight, bias, rope, chunks, tile)
        ran.append(out is not None and rope is not None)
        return out

    monkeypatch.setattr(fp8_paired, "fp8_paired_with", counted)
    prompts = [[5, 17, 300, 9], [44, 2, 2, 901, 13, 7], [600]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    for scheme in ("block", "channel"):
        tokens = {}
        for on in (True, False):
            monkeypatch.setattr(fp8_linear, "epilogues_on", lambda on=on: on)
            spec = synthetic_pair.SyntheticSpec("paired-test", "target")
            model = quantize_model(synthetic_pair.build_synthetic(spec, cuda_device, torch.bfloat16), scheme)
            engine = LLMEngine(Verifier(ModelRunner(model, 256, 16, cuda_device)), None, Tokenizer(tmp_path),
                               EngineConfig(mode="ar", device=str(cuda_device), num_blocks=256))
            tokens[on] = [r.output_ids for r in engine.generate(prompts, params)]
        assert tokens[True] == tokens[False], scheme
        assert any(ran), "the q/k/v epilogue never ran"
        ran.clear()


def test_the_committed_table_pairs_the_8b_decode_shapes_and_leaves_the_direct_buckets(
        kernel_device: torch.device) -> None:
    """Which batches take the paired kernel on the 8B shape: every transposed bucket (decode, short verifies)
    of gate/up and q/k/v, with tiles no narrower than the tensor cores' 64 rows and no wider than half a head
    for q/k/v; none of the direct form's buckets."""
    from minedraft.engine.cuda.fp8_paired import MIN_HALF, paired_tile
    from minedraft.engine.cuda.fp8_tiles import active_table, choose
    from minedraft.engine.fp8_weights import Fp8Weight

    table = active_table()
    for n, half_limit in ((28672, 256), (6144, 64)):  # gate/up; q/k/v of 128-wide heads
        q = torch.empty((n, 4096), dtype=torch.float8_e4m3fn, device="meta")
        weight = Fp8Weight(q, torch.empty((n // 128, 32), device="meta"), "block", 128)
        paired_any = False
        for m in (1, 4, 8, 16, 32, 64, 128, 448):
            _, plain = choose(table, "block", n, 4096, m, 132)
            picked = paired_tile(weight, m, kernel_device, half_limit)
            assert (picked is None) == plain.direct, f"n={n} m={m}"
            if picked is not None:
                paired_any = True
                assert MIN_HALF <= picked[1].block_n <= half_limit and not picked[1].pdl
        assert paired_any
