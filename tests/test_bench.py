"""minedraft.bench: the synthetic pair, the services running it through the injected model loader,
and the `minedraft bench` command line (the documented spellings keep working)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from minedraft.bench import commands
from minedraft.bench.client import generate_all
from minedraft.bench.fp8_quantizer import quantize_model
from minedraft.bench.gpu.pairs import SYNTHETIC_WORKERS, bench_pair
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic, load_synthetic
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.cli.main import build_parser
from minedraft.core.errors import ModelLoadError
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from tests.conftest import write_word_tokenizer

PROMPTS = [[(11 * i + 5 * j) % 400 + 3 for j in range(6 + i)] for i in range(4)]  # inside the tiny shape's vocab


def test_synthetic_spec_round_trips_and_rejects_what_it_cannot_build() -> None:
    spec = SyntheticSpec("llama3-8b", "target", 0.0269, 4)
    assert str(spec) == "synthetic:llama3-8b:target:alpha=0.0269:draft_layers=4"
    assert SyntheticSpec.parse(str(spec)) == spec
    assert SyntheticSpec.parse("synthetic:tiny:draft") == SyntheticSpec("tiny", "draft", 0.3, 2)
    assert spec.pair() == (spec, SyntheticSpec("llama3-8b", "draft", 0.0269, 4))
    for bad in ("synthetic:tiny", "synthetic:huge:target", "synthetic:tiny:judge", "synthetic:tiny:target:alpha=x",
                "synthetic:tiny:target:beta=1", "tiny:target"):
        with pytest.raises(ModelLoadError):
            SyntheticSpec.parse(bad)


def test_an_fp8_member_is_the_bf16_member_quantized_and_its_draft_stays_bf16() -> None:
    spec = SyntheticSpec("tiny", "target", 0.02, 2, 0.7, fp8="block")
    assert str(spec).endswith(":agree=0.7:fp8=block") and SyntheticSpec.parse(str(spec)) == spec
    assert spec.pair()[1].fp8 == "" and SyntheticSpec.parse("synthetic:tiny:draft:fp8=channel").pair()[0].fp8 == ""
    with pytest.raises(ModelLoadError, match="fp8 is one of block, channel"):
        SyntheticSpec.parse("synthetic:tiny:target:fp8=e5m2")
    served = load_synthetic(str(spec), "cpu", torch.float32)
    assert served.config.quantization is not None and served.config.quantization.scheme == "block"
    quantized = quantize_model(build_synthetic(replace(spec, fp8=""), "cpu", torch.float32), "block")
    plain = build_synthetic(replace(spec, fp8=""), "cpu", torch.float32)
    assert torch.equal(logits(served, PROMPTS[1]), logits(quantized, PROMPTS[1]))
    assert not torch.equal(logits(served, PROMPTS[1]), logits(plain, PROMPTS[1]))


def test_the_product_loader_knows_no_synthetic_specs() -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model("synthetic:tiny:target:alpha=0.0:draft_layers=2")


def logits(model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    runner = ModelRunner(model, 16, 16)
    return runner.forward([0], [prompt], [0], last_n=len(prompt))


@pytest.mark.parametrize("alpha, same", [(0.0, True), (0.5, False)])
def test_alpha_zero_makes_target_and_draft_one_function(alpha: float, same: bool) -> None:
    target = build_synthetic(SyntheticSpec("tiny", "target", alpha, 2), "cpu", torch.float32)
    draft = build_synthetic(SyntheticSpec("tiny", "draft", alpha, 2), "cpu", torch.float32)
    assert target.config.num_layers == 4 and draft.config.num_layers == 2
    close = torch.allclose(logits(target, PROMPTS[0]), logits(draft, PROMPTS[0]), atol=1e-4)
    assert close == same


def test_services_serve_the_synthetic_pair_through_the_injected_loader(tmp_path: Path) -> None:
    """The GPU sweep's services path, on CPU: the verifier and draft service build the synthetic pair
    (bench.synthetic_workers), and PSD's greedy output equals the synthetic target's AR output."""
    pair = bench_pair("tiny", 2, 0.05)
    assert pair.worker_module == SYNTHETIC_WORKERS
    model = load_synthetic(pair.target, "cpu", torch.float32)
    words = tmp_path / "tokenizer"  # the tiny shape's vocabulary is smaller than the bundled tokenizer's
    words.mkdir()
    write_word_tokenizer(words, model.config.vocab_size, eos_id=0)
    target = Verifier(ModelRunner(model, 256, 16))
    engine = LLMEngine(target, None, Tokenizer(words), EngineConfig(mode="ar", num_blocks=256))
    expected = [r.output_ids for r in engine.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))]
    cfg = StackConfig(target=pair.target, draft=pair.draft, worker_module=pair.worker_module,
                      tokenizer=str(words), grpc_port=free_port(), http_port=free_port(), k=3,
                      num_blocks=256, log_dir=tmp_path / "logs")
    stack = LocalStack(cfg)
    try:
        stack.start(timeout=120)
        got, _ = asyncio.run(generate_all(cfg.grpc_port, PROMPTS, 12))
    finally:
        stack.stop()
    assert got == expected


def test_documented_bench_spellings_parse_to_their_benchmarks() -> None:
    parser = build_parser()
    default = parser.parse_args(["bench", "--batch-sizes", "1,4", "--repeats", "1"])
    assert (default.batch_sizes, default.repeats, default.max_tokens) == ("1,4", 1, 64)
    psd = parser.parse_args(["bench", "psd", "--concurrency", "8"])
    alias = parser.parse_args(["bench-psd", "--concurrency", "8"])
    assert (psd.concurrency, psd.max_tokens, psd.rounds) == (alias.concurrency, alias.max_tokens, alias.rounds)
    assert (psd.concurrency, psd.max_tokens) == (8, 96)
    gpu = parser.parse_args(["bench", "gpu", "--ks", "4,6", "--tiny", "--out", "x"])
    assert (gpu.ks, gpu.ms, gpu.tiny, gpu.out) == ([4, 6], [8, 16, 32, 64], True, "x")
    overhead = parser.parse_args(["bench", "observability", "--rounds", "3"])
    assert (overhead.rounds, overhead.concurrency) == (3, 16)
    assert {"psd", "gpu", "gpu-report", "kernels", "observability"} <= set(commands.NAMED)


def test_bench_runs_ar_and_sd_on_the_bundled_pair(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    result = subprocess.run([sys.executable, "-m", "minedraft.cli.main", "bench", "--batch-sizes", "1,2",
                             "--repeats", "1", "--max-tokens", "8", "--threads", "1", "--json-out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| batch | AR tok/s | SD tok/s |" in result.stdout
    rows = json.loads(out.read_text())
    assert [r["batch"] for r in rows] == [1, 2]
    for row in rows:
        assert row["ar_tokens_per_s"] > 0 and row["sd_tokens_per_s"] > 0
        assert 0 < row["acceptance"] <= 1 and 1 <= row["mean_accepted_length"] <= 5
