"""The FP8 GEMM kernel (`engine/cuda/fp8_gemm.py`) against the torch reference path, the
independence of a row's result from the batch it is computed in (what SD == AR rests on), and
greedy SD with an FP8 target against AR with it on a CUDA device. Under Triton's interpreter the
kernel tests run small shapes on the CPU; the engine test needs CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.gpu.kernel_mode import kernel_mode

QUICK = kernel_mode().interpreted
# (M, N, K, scale rows per scale row): decode and verify shapes, a partial K block, unaligned fused rows
SHAPES = ([(1, 256, 256, 128)] if QUICK else
          [(1, 6144, 4096, 128), (16, 4096, 14336, 128), (80, 28672, 4096, 128), (300, 4096, 4096, 128),
           (3, 1376, 688, 1), (2048, 6144, 4096, 128)])
M_VALUES = [1, 2, 7, 33] if QUICK else [1, 2, 3, 8, 15, 16, 17, 31, 33, 64, 65, 100, 128, 129, 256, 300]


def fp8_weight(n: int, k: int, scheme: str, scale_rows: int, device: torch.device, seed: int = 0):
    from minedraft.bench.fp8_quantizer import quantize_weight
    from minedraft.engine.fp8_weights import Fp8Weight

    gen = torch.Generator().manual_seed(seed)
    q, scale = quantize_weight(torch.randn(n, k, generator=gen) * k**-0.5, scheme)
    weight = Fp8Weight(q, scale, scheme, 128 if scheme == "block" else 1)
    if scheme == "block" and scale_rows == 1:
        weight = Fp8Weight(q, weight.row_scales().contiguous(), scheme, 1)
    return Fp8Weight(weight.qweight.to(device), weight.scale.to(device), scheme, weight.scale_rows)


def reference(x: torch.Tensor, weight, bias: torch.Tensor | None) -> torch.Tensor:
    from minedraft.engine.fp8_linear import fake_quantize_activations

    out = fake_quantize_activations(x.cpu().float(), weight.scheme) @ weight.dequantize().cpu().T
    return out + bias.cpu().float() if bias is not None else out


@pytest.mark.parametrize("scheme", ["block", "channel"])
@pytest.mark.parametrize("m, n, k, scale_rows", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k, _ in SHAPES])
def test_kernel_matches_the_reference_path(scheme: str, m: int, n: int, k: int, scale_rows: int,
                                           kernel_device: torch.device) -> None:
    from minedraft.engine.cuda.fp8_gemm import fp8_gemm

    if QUICK:  # e.g. -125.4 becomes -64 there, where the GPU's conversion (and torch's) gives -128
        pytest.skip("Triton 3.6's interpreter rounds float32 to e4m3 wrongly where rounding carries into the exponent")
    weight = fp8_weight(n, k, scheme, scale_rows, kernel_device)
    gen = torch.Generator().manual_seed(m)
    x = (torch.randn(m, k, generator=gen) * torch.exp(torch.randn(k, generator=gen))).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16) if m % 2 else None
    got = fp8_gemm(x.to(kernel_device), weight, None if bias is None else bias.to(kernel_device))
    want = reference(x, weight, bias)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    assert float((got.cpu().float() - want).norm() / want.norm()) < 1e-2


# (N, K): a shape of the committed tile table and one it lacks (the default tiles: transposed up to 32
# tokens, the direct form above)
BATCH_SHAPES = [(192, 384)] if QUICK else [(4096, 14336), (1536, 2048)]


@pytest.mark.parametrize("scheme", ["block", "channel"])
@pytest.mark.parametrize("n, k", BATCH_SHAPES, ids=[f"{n}x{k}" for n, k in BATCH_SHAPES])
def test_a_rows_result_does_not_depend_on_the_batch(scheme: str, n: int, k: int, kernel_device: torch.device) -> None:
    """Every M (tile sizes, split-K programs or one program per tile, either form) gives each row the same bits."""
    from minedraft.engine.cuda.fp8_gemm import fp8_gemm

    weight = fp8_weight(n, k, scheme, 128, kernel_device, seed=1)
    x = torch.randn(max(M_VALUES), k, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    x = x.to(kernel_device)
    full = fp8_gemm(x, weight)
    for m in M_VALUES:
        part = fp8_gemm(x[-m:], weight)  # the last m rows: each sits at another index than in `full`
        assert torch.equal(part, full[-m:]), f"M={m}"


# (N, K, chunks) and the tiles compared with one pointer-load program per tile (split 1): every way of
# cutting the work (split programs, their sums added by the last one or by a second kernel, one chunk
# per program, tensor-memory loads, activations quantized first, dependent launches (plain under the
# interpreter), wide and narrow tiles, the direct form) at several M
VARIANT_SHAPE = (192, 512, 4) if QUICK else (4096, 14336, 8)
VARIANT_MS = [1, 3, 17] if QUICK else [1, 5, 16, 64, 300]


def variant_tiles(chunks: int) -> list:
    from minedraft.engine.cuda.fp8_tiles import Tile

    return [Tile(128, 16, 4, 4, chunks, fused=True, tma=True), Tile(256, 16, 4, 4, chunks // 2, fused=True, tma=True),
            Tile(128, 16, 4, 3, chunks), Tile(64, 16, 4, 6, 2, fused=True, tma=True, pdl=True),
            Tile(128, 16, 4, 4, 1, prequant=True, tma=True, pdl=True), Tile(64, 32, 4, 3, chunks // 2, fused=True),
            # the direct form (tokens on the MMA's M side): one program per tile (pointer and tensor-memory
            # loads), split with fused sums, split with the second kernel's sums
            Tile(128, 64, 4, 4, 1, prequant=True, direct=True), Tile(64, 128, 8, 3, 1, prequant=True, direct=True),
            Tile(128, 128, 8, 3, 1, prequant=True, tma=True, direct=True),
            Tile(128, 64, 4, 3, chunks, prequant=True, fused=True, direct=True),
            Tile(64, 128, 8, 4, chunks // 2, prequant=True, direct=True)]


@pytest.mark.parametrize("scheme", ["block", "channel"])
def test_every_tile_split_and_load_gives_the_same_bits(scheme: str, kernel_device: torch.device) -> None:
    from minedraft.engine.cuda import fp8_gemm as gemm
    from minedraft.engine.cuda import fp8_launch as launch
    from minedraft.engine.cuda.fp8_tiles import Tile

    n, k, chunks = VARIANT_SHAPE
    weight = fp8_weight(n, k, scheme, 128, kernel_device, seed=3)
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(max(VARIANT_MS), k, generator=gen) * torch.exp(torch.randn(k, generator=gen))).to(torch.bfloat16)
    x, bias = x.to(kernel_device), torch.randn(n, generator=gen).to(torch.bfloat16).to(kernel_device)
    want = gemm.fp8_gemm_with(x, weight, chunks, Tile(64, 16, 4, 3), bias)
    for tile in variant_tiles(chunks):
        for m in VARIANT_MS:
            got = gemm.fp8_gemm_with(x[-m:], weight, chunks, tile, bias)
            assert torch.equal(got, want[-m:]), f"{tile} M={m}"
    counts = launch.ARRIVAL_COUNTS.by_device[x.device]
    assert int(counts.count_nonzero()) == 0  # every launch left its tiles' counts at zero


def test_fused_sums_inside_a_cuda_graph_and_the_capture_fallback(cuda_device: torch.device,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Replays of a captured split GEMM equal eager calls, both where the counts were made before the
    capture (the fused sums) and where they were not (the second kernel adds the chunks)."""
    from minedraft.engine.cuda import fp8_gemm as gemm
    from minedraft.engine.cuda import fp8_launch as launch
    from minedraft.engine.cuda.fp8_tiles import Tile

    weight = fp8_weight(6144, 4096, "block", 128, cuda_device, seed=5)
    tile = Tile(128, 16, 4, 4, 8, fused=True, tma=True)
    x = torch.randn(4, 4096, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).to(cuda_device)
    want = gemm.fp8_gemm_with(x, weight, 8, Tile(64, 16, 4, 3))
    made_before = launch.ARRIVAL_COUNTS
    made_before.get(x.device, 1)
    for counts in (made_before, launch.ArrivalCounts()):
        monkeypatch.setattr(gemm, "ARRIVAL_COUNTS", counts)
        side = torch.cuda.Stream(cuda_device)
        side.wait_stream(torch.cuda.current_stream(cuda_device))
        with torch.cuda.stream(side):
            gemm.fp8_gemm_with(x, weight, 8, Tile(128, 16, 4, 4, 8, tma=True))  # compiled outside the capture
            if counts is made_before:
                gemm.fp8_gemm_with(x, weight, 8, tile)
        torch.cuda.current_stream(cuda_device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = gemm.fp8_gemm_with(x, weight, 8, tile)
        for _ in range(3):
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want)
        assert (x.device in counts.by_device) == (counts is made_before)


def test_greedy_sd_with_an_fp8_target_equals_ar_on_cuda(cuda_device: torch.device, tmp_path: Path) -> None:
    from minedraft.bench.fp8_quantizer import write_fp8_checkpoint
    from minedraft.bundled import TINY_DRAFT, TINY_TARGET
    from minedraft.core.sampling_params import SamplingParams
    from minedraft.engine.llm_engine import EngineConfig, LLMEngine

    prompts = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = ",
               "for i in range(", "with open(path) as f:\n", "try:\n    import", "@property\ndef "] * 4
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    common = {"device": str(cuda_device), "dtype": torch.bfloat16, "max_num_seqs": 32, "num_blocks": 1024}
    for scheme in ("block", "channel"):
        target = write_fp8_checkpoint(TINY_TARGET, tmp_path / scheme, scheme)
        ar = LLMEngine.from_folders(target, None, EngineConfig(mode="ar", **common)).generate(prompts, params)
        sd_engine = LLMEngine.from_folders(target, TINY_DRAFT, EngineConfig(mode="sd", k=4, **common))
        sd = sd_engine.generate(prompts, params)
        assert [r.output_ids for r in sd] == [r.output_ids for r in ar], scheme
        assert sum(r.stats.accepted for r in sd) > 0
        for host in (sd_engine.target, sd_engine.draft):
            assert host is not None and host.runner.allocator.num_free == host.runner.allocator.num_blocks
